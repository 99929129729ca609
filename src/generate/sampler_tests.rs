//! Sampler tests: empirical frequencies against a literal, sort-everything reference of the
//! documented pipeline, plus exact checks of each filter's support.

use super::*;

const DRAWS: usize = 20_000;

/// The documented pipeline written as plainly as possible (full sorts, f64): the oracle.
fn reference(logits: &[f32], cfg: &SamplerConfig, history: &[u32]) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    if cfg.repeat_penalty != 1.0 && cfg.repeat_last_n > 0 {
        let start = history.len().saturating_sub(cfg.repeat_last_n);
        let mut seen = history[start..].to_vec();
        seen.sort();
        seen.dedup();
        let p = cfg.repeat_penalty as f64;
        for id in seen {
            if let Some(v) = l.get_mut(id as usize) {
                *v = if *v > 0.0 { *v / p } else { *v * p };
            }
        }
    }
    // Presence and frequency: the whole history is output for a sampler without a prompt length.
    for (t, v) in l.iter_mut().enumerate() {
        let n = history.iter().filter(|&&h| h as usize == t).count() as f64;
        let seen = if n > 0.0 { 1.0 } else { 0.0 };
        *v -= cfg.presence_penalty as f64 * seen + cfg.frequency_penalty as f64 * n;
    }
    let scaled: Vec<f64> = l.iter().map(|v| v / cfg.temperature as f64).collect();
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
    if let Some(k) = cfg.top_k.filter(|&k| k > 0 && k < order.len()) {
        // Ties with the k-th stay.
        let kth = scaled[order[k - 1]];
        order.retain(|&i| scaled[i] >= kth);
    }
    let max = scaled[order[0]];
    let z: f64 = order.iter().map(|&i| (scaled[i] - max).exp()).sum();
    let mut probs: Vec<(usize, f64)> =
        order.iter().map(|&i| (i, (scaled[i] - max).exp() / z)).collect();
    if let Some(p) = cfg.top_p.filter(|&p| p < 1.0) {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (j, &(i, q)) in probs.iter().enumerate() {
            acc += q;
            if acc >= p as f64 {
                // Ties with the last kept token stay.
                keep = j + probs[j..].iter().filter(|x| scaled[x.0] == scaled[i]).count();
                break;
            }
        }
        probs.truncate(keep);
    }
    if let Some(m) = cfg.min_p.filter(|&m| m > 0.0) {
        let top = probs[0].1;
        probs.retain(|&(_, q)| q >= m as f64 * top);
    }
    let z: f64 = probs.iter().map(|p| p.1).sum();
    let mut out = vec![0.0; logits.len()];
    for (i, q) in probs {
        out[i] = q / z;
    }
    out
}

fn frequencies(cfg: &SamplerConfig, logits: &[f32], history: &[u32], draws: usize) -> Vec<f64> {
    let mut s = Sampler::new(cfg.clone());
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        let mut l = logits.to_vec();
        counts[s.sample(&mut l, history) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

/// Every token the reference gives probability 0 is never drawn; the others are within `tol`.
fn assert_matches(cfg: &SamplerConfig, logits: &[f32], history: &[u32], tol: f64) {
    let want = reference(logits, cfg, history);
    let got = frequencies(cfg, logits, history, DRAWS);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        if *w == 0.0 {
            assert_eq!(*g, 0.0, "token {i} must be filtered out ({cfg:?})");
        }
        assert!((w - g).abs() < tol, "token {i}: want {w:.4}, got {g:.4} ({cfg:?})");
    }
}

fn plain(temperature: f32) -> SamplerConfig {
    SamplerConfig { temperature, top_k: None, top_p: None, min_p: None, ..SamplerConfig::greedy() }
}

const LOGITS: [f32; 8] = [2.0, 1.5, 1.4, 0.3, 0.0, -0.5, -1.0, -4.0];

#[test]
fn analytic_distribution_after_each_filter() {
    // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
    let logits = [4f32.ln(), 3f32.ln(), 2f32.ln(), 1f32.ln()];
    let cases: Vec<(SamplerConfig, [f64; 4])> = vec![
        (plain(1.0), [0.4, 0.3, 0.2, 0.1]),
        (SamplerConfig { top_k: Some(2), ..plain(1.0) }, [4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]),
        // 0.4 < 0.6 <= 0.7: the first two.
        (SamplerConfig { top_p: Some(0.6), ..plain(1.0) }, [4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]),
        // Floor 0.45 * 0.4 = 0.18 keeps 0.2, drops 0.1.
        (SamplerConfig { min_p: Some(0.45), ..plain(1.0) }, [4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0, 0.0]),
        // Temperature 0.5 squares the odds: 16, 9, 4, 1 over 30.
        (plain(0.5), [16.0 / 30.0, 9.0 / 30.0, 4.0 / 30.0, 1.0 / 30.0]),
    ];
    for (cfg, want) in cases {
        let got = frequencies(&cfg, &logits, &[], DRAWS);
        for i in 0..4 {
            assert!(
                (got[i] - want[i]).abs() < 0.012,
                "{cfg:?}: token {i} {} vs {}",
                got[i],
                want[i]
            );
            if want[i] == 0.0 {
                assert_eq!(got[i], 0.0);
            }
        }
        let r = reference(&logits, &cfg, &[]);
        for i in 0..4 {
            assert!((r[i] - want[i]).abs() < 1e-6, "reference disagrees with the hand computation");
        }
    }
}

#[test]
fn empirical_frequencies_match_reference() {
    let configs = [
        plain(1.0),
        plain(0.7),
        SamplerConfig { top_k: Some(3), ..plain(1.3) },
        SamplerConfig { top_p: Some(0.8), ..plain(1.0) },
        SamplerConfig { min_p: Some(0.3), ..plain(1.5) },
        SamplerConfig { top_k: Some(5), top_p: Some(0.9), min_p: Some(0.1), ..plain(0.9) },
        SamplerConfig { seed: 7, ..SamplerConfig::default() },
        SamplerConfig { repeat_penalty: 1.8, repeat_last_n: 3, ..plain(1.0) },
        SamplerConfig { presence_penalty: 0.8, frequency_penalty: 0.5, ..plain(1.0) },
        SamplerConfig {
            presence_penalty: -1.0,
            frequency_penalty: 0.3,
            top_k: Some(4),
            ..plain(1.2)
        },
        SamplerConfig { repeat_penalty: 1.3, presence_penalty: 0.4, ..SamplerConfig::default() },
    ];
    let history = [5, 0, 9, 0, 1, 7];
    for cfg in &configs {
        assert_matches(cfg, &LOGITS, &history, 0.015);
    }
}

#[test]
fn top_k_never_leaves_the_k_best() {
    let logits = random_logits(1000, 3);
    let mut ranked: Vec<u32> = (0..1000).collect();
    ranked.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let best: Vec<u32> = ranked[..5].to_vec();
    let mut s = Sampler::new(SamplerConfig { top_k: Some(5), seed: 11, ..plain(5.0) });
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5000 {
        let id = s.sample(&mut logits.clone(), &[]);
        assert!(best.contains(&id), "{id} is not among the top 5");
        seen.insert(id);
    }
    assert_eq!(seen.len(), 5, "a hot top-5 should reach all five");
}

#[test]
fn top_p_and_min_p_supports_on_a_large_vocab_match_reference() {
    // Spread-out logits so top-p needs thousands of tokens: exercises the growing sorted head.
    let logits = random_logits(201_088, 5);
    for cfg in [
        SamplerConfig { top_p: Some(0.9), ..plain(1.0) },
        SamplerConfig { top_p: Some(0.3), ..plain(0.5) },
        SamplerConfig { min_p: Some(0.2), ..plain(1.0) },
        SamplerConfig { top_p: Some(0.95), min_p: Some(0.05), ..plain(0.8) },
        SamplerConfig { top_k: Some(1000), top_p: Some(0.5), ..plain(1.0) },
    ] {
        let want: Vec<u32> = reference(&logits, &cfg, &[])
            .iter()
            .enumerate()
            .filter(|(_, p)| **p > 0.0)
            .map(|(i, _)| i as u32)
            .collect();
        let (mut cand, mut scratch) = (Vec::new(), Vec::new());
        assert!(keep(&cfg.filter(), &logits, &mut cand, &mut scratch));
        let mut got: Vec<u32> = cand.iter().map(|c| c.id).collect();
        got.sort();
        // Allow a single boundary token of disagreement from f32 vs f64 accumulation.
        let diff = want.len().abs_diff(got.len());
        assert!(diff <= 1, "{cfg:?}: reference keeps {}, sampler keeps {}", want.len(), got.len());
        let common = got.iter().filter(|id| want.binary_search(id).is_ok()).count();
        assert!(common + 1 >= want.len().max(got.len()), "{cfg:?}: supports differ");
        if cfg.top_p == Some(0.9) {
            assert!(want.len() > 2048, "test too easy: {} tokens kept", want.len());
        }
    }
}

#[test]
fn tiny_temperature_is_argmax_and_zero_is_greedy() {
    for seed in 0..20 {
        let logits = random_logits(5000, seed);
        let want = argmax(&logits);
        let mut s =
            Sampler::new(SamplerConfig { temperature: 1e-4, seed, ..SamplerConfig::default() });
        assert_eq!(s.sample(&mut logits.clone(), &[]), want);
        let mut g = Sampler::new(SamplerConfig::greedy());
        assert_eq!(g.sample(&mut logits.clone(), &[]), want);
    }
}

#[test]
fn greedy_ties_go_to_the_lowest_id_and_nan_never_wins() {
    let mut g = Sampler::new(SamplerConfig::greedy());
    assert_eq!(g.sample(&mut [1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(g.sample(&mut [f32::NAN, 0.5, f32::NAN, 0.7], &[]), 3);
    assert_eq!(g.sample(&mut [f32::NEG_INFINITY; 3], &[]), 0);
    let mut s = Sampler::new(SamplerConfig::default());
    assert_eq!(s.sample(&mut [f32::NAN, 0.5, f32::INFINITY, 0.7], &[]), 2);
    for _ in 0..100 {
        assert_ne!(s.sample(&mut [f32::NAN, 0.0, f32::NAN, 0.0], &[]) % 2, 0);
    }
}

#[test]
fn repetition_penalty_math() {
    let cfg = SamplerConfig { repeat_penalty: 2.0, repeat_last_n: 64, ..SamplerConfig::greedy() };
    let mut s = Sampler::new(cfg.clone());
    let mut logits = [2.0, -2.0, 1.0, 0.5, 0.0];
    // Id 0 appears twice but is penalised once; id 99 is out of range and ignored.
    let id = s.sample(&mut logits, &[0, 1, 0, 4, 99]);
    assert_eq!(logits, [1.0, -4.0, 1.0, 0.5, 0.0]);
    assert_eq!(id, 0, "tie between 0 and 2 goes to the lowest id");
    // Only the last n tokens count.
    let mut s = Sampler::new(SamplerConfig { repeat_last_n: 1, ..cfg });
    let mut logits = [2.0, -2.0, 1.0];
    assert_eq!(s.sample(&mut logits, &[0, 1]), 0);
    assert_eq!(logits, [2.0, -4.0, 1.0]);
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig { seed, ..plain(1.0) });
        (0..200).map(|_| s.sample(&mut LOGITS.clone(), &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn large_vocab_is_fast_enough() {
    let logits = random_logits(201_088, 9);
    for cfg in [
        SamplerConfig::default(),
        SamplerConfig { top_k: None, min_p: None, ..SamplerConfig::default() },
    ] {
        let mut s = Sampler::new(cfg.clone());
        let mut buf = logits.clone();
        let start = std::time::Instant::now();
        for _ in 0..20 {
            buf.copy_from_slice(&logits);
            s.sample(&mut buf, &[1, 2, 3]);
        }
        let per_call = start.elapsed() / 20;
        eprintln!("vocab 201088, {cfg:?}: {per_call:?} per token");
        // Generous for a loaded CI box; a release build takes about a millisecond.
        assert!(per_call.as_millis() < 100, "{cfg:?}: {per_call:?} per token");
    }
}

/// Logits roughly normal with spread 2, deterministic per seed.
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 2.0 - 4.0).collect()
}

#[test]
fn validate_rejects_nonsense_settings() {
    assert!(SamplerConfig::default().validate().is_ok());
    assert!(SamplerConfig::greedy().validate().is_ok());
    let bad = [
        SamplerConfig { temperature: -0.1, ..SamplerConfig::default() },
        SamplerConfig { temperature: f32::NAN, ..SamplerConfig::default() },
        SamplerConfig { top_p: Some(0.0), ..SamplerConfig::default() },
        SamplerConfig { top_p: Some(1.5), ..SamplerConfig::default() },
        SamplerConfig { min_p: Some(-0.1), ..SamplerConfig::default() },
        SamplerConfig { repeat_penalty: 0.0, ..SamplerConfig::default() },
        SamplerConfig { presence_penalty: 2.5, ..SamplerConfig::default() },
        SamplerConfig { frequency_penalty: -2.01, ..SamplerConfig::default() },
        SamplerConfig { frequency_penalty: f32::NAN, ..SamplerConfig::default() },
    ];
    for cfg in bad {
        let err = cfg.validate().expect_err("should be rejected");
        assert_eq!(crate::error::kind_of(&err), crate::error::ErrorKind::InvalidInput, "{cfg:?}");
    }
}

#[test]
fn greedy_presence_and_frequency_count_only_the_output() {
    // Prompt [0, 0]; output [1, 1, 2]: id 1 loses 0.5 + 2 * 1.0, id 2 loses 0.5 + 1.0, id 0
    // (prompt only) nothing.
    let cfg =
        SamplerConfig { presence_penalty: 0.5, frequency_penalty: 1.0, ..SamplerConfig::greedy() };
    let mut s = Sampler::new(cfg).with_prompt_len(2);
    let mut logits = [1.0, 3.0, 2.25, 0.0];
    assert_eq!(s.sample(&mut logits, &[0, 0, 1, 1, 2]), 0);
    assert_eq!(logits, [1.0, 0.5, 0.75, 0.0]);
}

#[test]
fn on_a_gpu_every_setting_samples_on_the_device_on_the_cpu_only_plain_argmax() {
    let greedy = SamplerConfig::greedy();
    assert!(greedy.samples_on_device(false));
    let penalised = [
        SamplerConfig { presence_penalty: 0.1, ..greedy.clone() },
        SamplerConfig { frequency_penalty: -0.1, ..greedy.clone() },
        SamplerConfig { repeat_penalty: 1.1, repeat_last_n: 64, ..greedy.clone() },
    ];
    for cfg in &penalised {
        assert!(!cfg.samples_on_device(false), "{cfg:?}");
        assert!(cfg.samples_on_device(true), "{cfg:?}");
    }
    assert!(plain(1.0).is_plain_temperature());
    assert!(!SamplerConfig::default().is_plain_temperature());
    assert!(SamplerConfig::default().samples_on_device(true));
    assert!(!plain(1.0).samples_on_device(false), "the CPU draws on the host");
}

/// Ties at a filter's boundary all stay (the rule the device's thresholds follow).
#[test]
fn ties_at_the_top_k_and_top_p_boundaries_stay() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, 2.0, 0.0];
    let dist = |cfg: SamplerConfig| -> Vec<u32> {
        let mut s = Sampler::new(cfg);
        s.distribution(&mut logits.clone(), &[]).iter().map(|x| x.0).collect()
    };
    assert_eq!(dist(SamplerConfig { top_k: Some(1), ..plain(1.0) }), [1, 3]);
    assert_eq!(dist(SamplerConfig { top_k: Some(3), ..plain(1.0) }), [1, 2, 3, 4]);
    assert_eq!(dist(SamplerConfig { top_p: Some(0.0), ..plain(1.0) }), [1, 3]);
    // The two 3.0s hold 2e³ / (2e³ + 2e² + e + 1) ≈ 0.70 of the mass; 0.75 reaches into the 2.0s.
    assert_eq!(dist(SamplerConfig { top_p: Some(0.6), ..plain(1.0) }), [1, 3]);
    assert_eq!(dist(SamplerConfig { top_p: Some(0.75), ..plain(1.0) }), [1, 2, 3, 4]);
    assert_eq!(dist(SamplerConfig { min_p: Some(1.0), ..plain(1.0) }), [1, 3]);
}

/// `distribution` is what `sample` draws from, and both agree with the reference.
#[test]
fn distribution_is_the_reference() {
    let history = [5, 0, 9, 0, 1, 7];
    let logits = random_logits(300, 4);
    for cfg in [
        SamplerConfig { top_k: Some(40), top_p: Some(0.9), min_p: Some(0.05), ..plain(1.0) },
        SamplerConfig { repeat_penalty: 1.3, presence_penalty: 0.4, ..SamplerConfig::default() },
        SamplerConfig { frequency_penalty: 0.7, top_p: Some(0.5), ..plain(0.6) },
    ] {
        let want = reference(&logits, &cfg, &history);
        let got = Sampler::new(cfg.clone()).distribution(&mut logits.clone(), &history);
        assert_eq!(got.len(), want.iter().filter(|&&p| p > 0.0).count(), "{cfg:?}");
        for (id, p) in got {
            assert!((p - want[id as usize]).abs() < 1e-6, "{cfg:?}: id {id}");
        }
    }
}

/// The penalty list gives the same row as the documented formula for each id.
#[test]
fn penalty_list_is_one_entry_per_touched_id() {
    let cfg = SamplerConfig {
        repeat_penalty: 2.0,
        repeat_last_n: 3,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..plain(1.0)
    };
    let mut s = Sampler::new(cfg).with_prompt_len(2);
    // Prompt [4, 1], output [1, 2, 1, 9]: recent window [2, 1, 9] (9 is outside a vocab of 5).
    let mut list = s.penalties(&[4, 1, 1, 2, 1, 9], 5).to_vec();
    list.sort_by_key(|p| p.id);
    assert_eq!(
        list,
        [
            Penalty { id: 1, factor: 2.0, sub: 0.5 + 0.25 * 2.0 },
            Penalty { id: 2, factor: 2.0, sub: 0.5 + 0.25 },
        ]
    );
    let mut row = [1.0f32, -1.0, 3.0, 0.0, 0.0];
    apply_penalties(&mut row, &list);
    assert_eq!(row, [1.0, -3.0, 0.75, 0.0, 0.0]);
}
