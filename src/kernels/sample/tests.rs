//! The device sampler against the host sampler: kept sets on fresh random rows and settings,
//! draws against [`Sampler::distribution`] (the distribution `Sampler::sample` itself draws
//! from), and seeds. The GPU tests are `#[ignore]`d (no GPU on the build machines).

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::generate::{Sampler, SamplerConfig};
use crate::kernels::testing::{rng, uniform};

/// A sequence's sampler, its history and the row's logits.
struct Case {
    cfg: SamplerConfig,
    prompt_len: usize,
    history: Vec<u32>,
    logits: Vec<f32>,
}

impl Case {
    fn sampler(&self) -> Sampler {
        Sampler::new(self.cfg.clone()).with_prompt_len(self.prompt_len)
    }

    /// The device op's row for this case, with `seed`.
    fn row(&self, seed: u64) -> RowSampling {
        let mut s = self.sampler();
        let penalties = s.penalties(&self.history, self.logits.len()).to_vec();
        RowSampling { filter: self.cfg.filter(), seed, penalties }
    }

    fn distribution(&self) -> Vec<(u32, f64)> {
        self.sampler().distribution(&mut self.logits.clone(), &self.history)
    }
}

/// A random setting: any mix of temperature (sometimes greedy), top-k (sometimes ≥ n), top-p
/// (sometimes 0), min-p and the three penalties. `Rows::TopK`: always a top-k the top-k-first
/// sampler takes (up to `TOPK_MAX`), the rest as random.
fn random_config(r: &mut StdRng, n: usize, rows: Rows) -> SamplerConfig {
    let pick = |r: &mut StdRng, p: f64| r.random_bool(p);
    let top_k = match rows {
        Rows::Any => pick(r, 0.6).then(|| [1, 2, 5, 40, 100, 1000, n, n + 3][r.random_range(0..8)]),
        Rows::TopK => Some([1, 2, 5, 40, 100, TOPK_MAX][r.random_range(0..6)].min(n.max(2) - 1)),
    };
    SamplerConfig {
        temperature: if pick(r, 0.1) { 0.0 } else { r.random_range(0.2..2.0) },
        top_k,
        top_p: pick(r, 0.6).then(|| [0.0, 0.1, 0.5, 0.9, 0.95, 0.999][r.random_range(0..6)]),
        min_p: pick(r, 0.5).then(|| [0.001, 0.05, 0.2, 1.0][r.random_range(0..4)]),
        repeat_penalty: if pick(r, 0.5) { r.random_range(0.8..1.6) } else { 1.0 },
        repeat_last_n: r.random_range(0..80),
        presence_penalty: if pick(r, 0.4) { r.random_range(-2.0..2.0) } else { 0.0 },
        frequency_penalty: if pick(r, 0.4) { r.random_range(-2.0..2.0) } else { 0.0 },
        seed: 0,
    }
}

/// Which settings a batch's rows may have.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rows {
    Any,
    TopK,
}

/// Random rows of vocabulary `n`: spread-out logits, some rounded to a coarse grid (many ties at
/// every boundary), some with NaN and −∞ entries, an all-NaN one, with a history that repeats ids.
fn random_case(r: &mut StdRng, n: usize, kind: usize, rows: Rows) -> Case {
    let mut logits = uniform(r, n, -12.0, 12.0);
    match kind % 6 {
        1 => logits.iter_mut().for_each(|l| *l = (*l * 2.0).round() / 2.0),
        2 if n > 4 => {
            for _ in 0..n / 4 + 1 {
                let j = r.random_range(0..n);
                logits[j] = if r.random_bool(0.5) { f32::NAN } else { f32::NEG_INFINITY };
            }
        }
        3 if n < 100 => logits.fill(f32::NAN),
        _ => {}
    }
    let len = r.random_range(0..200);
    let history: Vec<u32> = (0..len).map(|_| r.random_range(0..(n as u32).min(50) + 2)).collect();
    let prompt_len = r.random_range(0..=len);
    Case { cfg: random_config(r, n, rows), prompt_len, history, logits }
}

/// The cases' rows as an `[R, n]` tensor on `dev`.
fn batch(cases: &[Case], dev: &Device) -> Tensor {
    let n = cases[0].logits.len();
    let data: Vec<f32> = cases.iter().flat_map(|c| c.logits.iter().copied()).collect();
    Tensor::from_vec(data, (cases.len(), n), dev).unwrap()
}

/// Kept sets and ids on `dev` against the host sampler, batch by batch of random cases: the
/// mask equals the support of `Sampler::distribution` exactly (argmax rows: no mask, the id is
/// the argmax), and the ids equal the reference op's for the same seeds. With `Rows::TopK`
/// every batch takes the top-k-first sampler.
fn check_kept_sets(dev: &Device, sizes: &[usize], batches: usize, kind: Rows) {
    let mut r = rng(&format!("sample kept sets {dev:?} {kind:?}"));
    for &n in sizes {
        for b in 0..batches {
            let rows = r.random_range(1..9);
            let cases: Vec<Case> = (0..rows).map(|i| random_case(&mut r, n, b + i, kind)).collect();
            let seeds: Vec<u64> = (0..rows).map(|_| r.random()).collect();
            let specs: Vec<RowSampling> =
                cases.iter().zip(&seeds).map(|(c, &s)| c.row(s)).collect();
            if kind == Rows::TopK && n > 1 {
                assert!(
                    topk_first(&specs, n),
                    "n {n}: a batch the top-k-first sampler should take"
                );
            }
            let x = batch(&cases, dev);
            let mask = kept_mask(&x, &specs).unwrap().to_vec2::<u8>().unwrap();
            let ids = sample_rows(&x, &specs).unwrap().to_vec1::<u32>().unwrap();
            let want_ids = sample_rows(&batch(&cases, &Device::Cpu), &specs)
                .unwrap()
                .to_vec1::<u32>()
                .unwrap();
            for (i, c) in cases.iter().enumerate() {
                let dist = c.distribution();
                let kept: Vec<u32> = (0..n as u32).filter(|&j| mask[i][j as usize] == 1).collect();
                let what = format!("n {n}, row {i}: {:?}", c.cfg);
                if kept.is_empty() {
                    assert_eq!(dist.len(), 1, "argmax row expected, {what}");
                    assert_eq!(ids[i], dist[0].0, "argmax, {what}");
                } else {
                    let support: Vec<u32> = dist.iter().map(|d| d.0).collect();
                    assert_eq!(kept, support, "kept set, {what}");
                    assert!(kept.binary_search(&ids[i]).is_ok(), "id outside the kept set, {what}");
                }
                assert_eq!(ids[i], want_ids[i], "id against the reference, {what}");
            }
        }
    }
}

#[test]
fn reference_keeps_the_host_samplers_set() {
    check_kept_sets(&Device::Cpu, &[1, 2, 7, 300, 1025], 12, Rows::Any);
    check_kept_sets(&Device::Cpu, &[2, 7, 300, 1025], 12, Rows::TopK);
}

/// Fixed rows and settings for the draw statistics: a common chat setting (top-k 40, top-p 0.9,
/// min-p 0.05) with a repetition penalty, plain top-p, min-p with presence/frequency penalties,
/// top-k with ties.
fn fixed_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(12);
    let n = 257;
    let logits = |r: &mut StdRng| -> Vec<f32> {
        (0..n).map(|_| (0..4).map(|_| r.random::<f32>()).sum::<f32>() * 2.0 - 4.0).collect()
    };
    let history: Vec<u32> = (0..64).map(|_| r.random_range(0..40)).collect();
    let plain = |t| SamplerConfig {
        temperature: t,
        top_k: None,
        top_p: None,
        min_p: None,
        ..SamplerConfig::greedy()
    };
    let mut ties = logits(&mut r);
    ties.iter_mut().for_each(|l| *l = (*l * 2.0).round() / 2.0);
    vec![
        Case {
            cfg: SamplerConfig {
                top_k: Some(40),
                top_p: Some(0.9),
                min_p: Some(0.05),
                repeat_penalty: 1.1,
                repeat_last_n: 64,
                ..plain(1.0)
            },
            prompt_len: 0,
            history: history.clone(),
            logits: logits(&mut r),
        },
        Case {
            cfg: SamplerConfig { top_p: Some(0.5), ..plain(0.7) },
            prompt_len: 0,
            history: vec![],
            logits: logits(&mut r),
        },
        Case {
            cfg: SamplerConfig {
                min_p: Some(0.1),
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                ..plain(1.5)
            },
            prompt_len: 20,
            history,
            logits: logits(&mut r),
        },
        Case {
            cfg: SamplerConfig { top_k: Some(6), ..plain(1.0) },
            prompt_len: 0,
            history: vec![],
            logits: ties,
        },
    ]
}

/// `draws` draws of each fixed case on `dev` (rows of one launch share the case, each with its own
/// seed) against the exact distribution: no token outside it, every frequency within 5 standard
/// deviations (at most 0.008 at this many draws, so an error of 0.01 in any probability fails),
/// and a chi-square over the bins expecting ≥ 5 draws within df + 6·√(2·df).
fn check_draw_statistics(dev: &Device, draws: usize, per_launch: usize) {
    for (k, case) in fixed_cases().iter().enumerate() {
        let want = case.distribution();
        assert!(want.len() > 3, "case {k}: too few kept tokens for a test: {}", want.len());
        let x = batch(std::slice::from_ref(case), dev)
            .broadcast_as((per_launch, case.logits.len()))
            .unwrap()
            .contiguous()
            .unwrap();
        let mut counts = vec![0usize; case.logits.len()];
        for launch in 0..draws / per_launch {
            let rows: Vec<RowSampling> = (0..per_launch)
                .map(|i| case.row(((k * draws + launch * per_launch + i) as u64) * 7919 + 1))
                .collect();
            for id in sample_rows(&x, &rows).unwrap().to_vec1::<u32>().unwrap() {
                counts[id as usize] += 1;
            }
        }
        let total = (draws / per_launch * per_launch) as f64;
        let p = |id: u32| want.iter().find(|w| w.0 == id).map_or(0.0, |w| w.1);
        let (mut chi2, mut bins, mut rest_e, mut rest_o) = (0.0, 0usize, 0.0, 0.0);
        for (id, &c) in counts.iter().enumerate() {
            let q = p(id as u32);
            let f = c as f64 / total;
            if q == 0.0 {
                assert_eq!(c, 0, "case {k}: token {id} is not in the distribution but was drawn");
                continue;
            }
            let sd = (q * (1.0 - q) / total).sqrt();
            assert!(
                (f - q).abs() <= 5.0 * sd + 1e-12,
                "case {k}: token {id}: frequency {f:.5}, probability {q:.5}"
            );
            let e = q * total;
            if e >= 5.0 {
                chi2 += (c as f64 - e).powi(2) / e;
                bins += 1;
            } else {
                rest_e += e;
                rest_o += c as f64;
            }
        }
        if rest_e > 0.0 {
            chi2 += (rest_o - rest_e).powi(2) / rest_e;
            bins += 1;
        }
        let df = bins.saturating_sub(1).max(1) as f64;
        assert!(
            chi2 <= df + 6.0 * (2.0 * df).sqrt(),
            "case {k}: chi-square {chi2:.1} over {df} degrees of freedom"
        );
        eprintln!("case {k}: {} kept, chi-square {chi2:.1} over {df}", want.len());
    }
}

#[test]
fn reference_draws_follow_the_host_distribution() {
    check_draw_statistics(&Device::Cpu, 20_000, 2_000);
}

#[test]
fn pack_drops_out_of_range_ids_and_a_k_of_the_whole_vocabulary() {
    let filter = Filter { inv_t: 2.0, top_k: 5, top_p: Some(0.25), floor: -1.5 };
    let pen = |id| Penalty { id, factor: 1.5, sub: 0.25 };
    let rows = [
        RowSampling { filter, seed: 0x1234_5678_9abc_def0, penalties: vec![pen(1), pen(9)] },
        RowSampling {
            filter: Filter { top_k: 9, top_p: None, ..filter },
            seed: 3,
            penalties: vec![pen(0)],
        },
    ];
    let (words, count) = pack(&rows, 9);
    assert_eq!(count, 2, "id 9 is outside a vocabulary of 9");
    assert_eq!(
        &words[..HEADER],
        &[
            2f32.to_bits(),
            (-1.5f32).to_bits(),
            0.25f64.to_bits() as u32,
            (0.25f64.to_bits() >> 32) as u32,
            5,
            0x9abc_def0,
            0x1234_5678,
            0
        ]
    );
    assert_eq!(words[HEADER + 4], 0, "k = n is off");
    assert_eq!(
        f64::from_bits(u64::from(words[HEADER + 2]) | u64::from(words[HEADER + 3]) << 32),
        -1.0
    );
    assert_eq!(
        &words[2 * HEADER..],
        &[0, 1, 1.5f32.to_bits(), 0.25f32.to_bits(), 1, 0, 1.5f32.to_bits(), 0.25f32.to_bits()]
    );
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_keeps_the_host_samplers_set_and_draws_the_reference_ids() {
    let dev = crate::kernels::testing::gpu();
    check_kept_sets(&dev, &[1, 2, 7, 300, 1023, 1025, 4099, 65_537, 201_088], 12, Rows::Any);
}

/// The same against `sample_topk.cu`: chunk edges (4096), ties cut inside a chunk (the rows
/// rounded to a grid: thousands of logits tie at every boundary of a large row, more than the
/// shared-memory gather holds), penalties, NaN and −∞.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_topk_first_keeps_the_host_samplers_set_and_draws_the_reference_ids() {
    let dev = crate::kernels::testing::gpu();
    check_kept_sets(&dev, &[2, 7, 300, 4095, 4096, 4097, 12_289, 65_537, 201_088], 16, Rows::TopK);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_draws_follow_the_host_distribution() {
    let dev = crate::kernels::testing::gpu();
    check_draw_statistics(&dev, 100_000, 10_000);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_same_seed_same_ids() {
    let dev = crate::kernels::testing::gpu();
    let mut r = StdRng::seed_from_u64(3);
    for kind in [Rows::Any, Rows::TopK] {
        let cases: Vec<Case> = (0..16).map(|i| random_case(&mut r, 201_088, i, kind)).collect();
        let x = batch(&cases, &dev);
        let draw = |seed: u64| {
            let rows: Vec<RowSampling> =
                cases.iter().enumerate().map(|(i, c)| c.row(seed + i as u64)).collect();
            sample_rows(&x, &rows).unwrap().to_vec1::<u32>().unwrap()
        };
        assert_eq!(draw(5), draw(5), "{kind:?}");
        assert_ne!(draw(5), draw(1005), "{kind:?}: 16 rows drawn alike under other seeds");
    }
}

/// Penalised rows whose logits are the first rows of a longer buffer (a decode graph's, padded
/// to its bucket): the same ids as from a buffer of just those rows. The penalties' scratch copy
/// once took the whole buffer past the view's start and failed its length check.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_penalised_rows_of_a_longer_buffer() {
    let dev = crate::kernels::testing::gpu();
    let mut r = StdRng::seed_from_u64(9);
    let (n, rows) = (5000, 3);
    let cfg =
        SamplerConfig { repeat_penalty: 1.3, presence_penalty: 0.5, ..SamplerConfig::default() };
    let history: Vec<u32> = (0..50).map(|_| r.random_range(0..n as u32)).collect();
    let case = Case { cfg, prompt_len: 20, history, logits: vec![0.0; n] };
    let specs: Vec<RowSampling> = (0..rows).map(|i| case.row(i as u64)).collect();
    let x =
        Tensor::from_vec(uniform(&mut r, (rows + 5) * n, -5.0, 5.0), (rows + 5, n), &dev).unwrap();
    let view = x.narrow(0, 0, rows).unwrap();
    let own = view.copy().unwrap();
    let ids = |t: &Tensor| sample_rows(t, &specs).unwrap().to_vec1::<u32>().unwrap();
    assert_eq!(ids(&view), ids(&own));
}

/// Time per call, ids read back (what a decode step waits for), of the argmax, the plain Gumbel
/// draw and the full sampler at gpt-oss's and Llama 3's vocabularies, 1 and 64 rows. Printed for
/// docs/performance.md; fails only when far off what the H100 measured (0.12 ms for one row,
/// 1.5 ms for 64).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_sampler_timing() {
    use crate::kernels::testing::time_us;
    let dev = crate::kernels::testing::gpu();
    let mut r = StdRng::seed_from_u64(8);
    let issue = SamplerConfig {
        temperature: 1.0,
        top_k: Some(40),
        top_p: Some(0.9),
        min_p: Some(0.05),
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        ..SamplerConfig::greedy()
    };
    let top_p = SamplerConfig { top_k: None, min_p: None, repeat_penalty: 1.0, ..issue.clone() };
    for (n, rows) in [(201_088, 1), (128_256, 1), (201_088, 64)] {
        let x = Tensor::from_vec(uniform(&mut r, rows * n, -10.0, 10.0), (rows, n), &dev).unwrap();
        let history: Vec<u32> = (0..600).map(|_| r.random_range(0..n as u32)).collect();
        let specs = |cfg: &SamplerConfig| -> Vec<RowSampling> {
            let case = Case {
                cfg: cfg.clone(),
                prompt_len: 512,
                history: history.clone(),
                logits: vec![0.0; n],
            };
            (0..rows).map(|i| case.row(i as u64)).collect()
        };
        let (issue_rows, top_p_rows) = (specs(&issue), specs(&top_p));
        let temps = vec![1.0f32; rows];
        let seeds: Vec<u64> = (0..rows as u64).collect();
        let argmax_us = time_us(&dev, 50, || {
            crate::kernels::argmax_rows(&x).unwrap().to_vec1::<u32>().unwrap();
        });
        let gumbel_us = time_us(&dev, 50, || {
            crate::kernels::sample_gumbel_rows(&x, &temps, &seeds)
                .unwrap()
                .to_vec1::<u32>()
                .unwrap();
        });
        let issue_us = time_us(&dev, 50, || {
            sample_rows(&x, &issue_rows).unwrap().to_vec1::<u32>().unwrap();
        });
        let top_p_us = time_us(&dev, 50, || {
            sample_rows(&x, &top_p_rows).unwrap().to_vec1::<u32>().unwrap();
        });
        eprintln!(
            "vocab {n}, {rows} rows: argmax {argmax_us:.1} µs, temperature {gumbel_us:.1} µs, \
             top-k 40 top-p 0.9 min-p 0.05 repeat 1.1 {issue_us:.1} µs, top-p 0.9 {top_p_us:.1} µs"
        );
        let bound = 1000.0 * rows as f64 / 8.0 + 1000.0;
        assert!(issue_us < bound && top_p_us < bound, "device sampler over {bound} µs");
    }
}
