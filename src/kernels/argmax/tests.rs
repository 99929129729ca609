use candle_core::{Device, Tensor};

use super::*;
use crate::kernels::testing::{rng, uniform};

/// The greedy pick of one row (`[n]`) by the rows kernel.
fn one(t: &Tensor) -> u32 {
    argmax_rows(&t.unsqueeze(0).unwrap()).unwrap().to_vec1::<u32>().unwrap()[0]
}

/// One row's draw at temperature `temp` by the rows kernel.
fn draw(t: &Tensor, temp: f32, seed: u64) -> u32 {
    let rows = sample_gumbel_rows(&t.unsqueeze(0).unwrap(), &[temp], &[seed]).unwrap();
    rows.to_vec1::<u32>().unwrap()[0]
}

/// Random rows with planted ties (the maximum twice), NaNs, and an all-NaN row.
fn rows() -> Vec<Vec<f32>> {
    let mut r = rng("argmax");
    let mut out = Vec::new();
    for n in [1usize, 7, 256, 1000, 65_537, 201_088] {
        let mut v = uniform(&mut r, n, -30.0, 30.0);
        if n > 10 {
            v[n / 3] = 31.0;
            v[n - 2] = 31.0; // tie: n / 3 must win
            v[n / 5] = f32::NAN;
        }
        out.push(v);
    }
    out.push(vec![f32::NAN; 300]);
    out.push(vec![f32::NEG_INFINITY; 300]);
    out
}

#[test]
fn reference_takes_the_first_maximum_and_skips_nan() {
    assert_eq!(argmax_slice(&[1.0, 3.0, f32::NAN, 3.0]), 1);
    assert_eq!(argmax_slice(&[f32::NAN, f32::NEG_INFINITY]), 1);
    assert_eq!(argmax_slice(&[f32::NAN]), 0);
    for v in rows() {
        let t = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
        assert_eq!(one(&t), argmax_slice(&v));
    }
}

/// Draws follow softmax(logits / T): 40,000 draws over 5 outcomes (T = 0.7), every
/// frequency within 5 standard deviations of its probability.
fn check_draw_frequencies(dev: &Device) {
    let logits = [1.0f32, 0.0, 2.0, -1.0, 1.5];
    let t = 0.7f32;
    let weights: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / f64::from(t)).exp()).collect();
    let total: f64 = weights.iter().sum();
    let x = Tensor::new(&logits, dev).unwrap();
    let n = 40_000;
    let mut counts = [0usize; 5];
    for seed in 0..n {
        counts[draw(&x, t, seed as u64 * 7919 + 1) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let p = weights[i] / total;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (c as f64 - n as f64 * p).abs() < 5.0 * sd,
            "outcome {i}: {c} draws, expected {:.0} ± {sd:.0}",
            n as f64 * p
        );
    }
}

#[test]
fn gumbel_draws_follow_the_softmax() {
    check_draw_frequencies(&Device::Cpu);
}

/// `rows` random rows of `n` (`[rows · n]`): every fifth from the fourth all NaN (with more than
/// 3 rows), every fifth from the fifth all −∞, the others with the maximum planted twice (the
/// lower index must win) and a NaN.
fn planted(r: &mut rand::rngs::StdRng, rows: usize, n: usize) -> Vec<f32> {
    let mut data = Vec::with_capacity(rows * n);
    for row in 0..rows {
        let mut v = uniform(r, n, -30.0, 30.0);
        match row % 5 {
            3 if rows > 3 => v.fill(f32::NAN),
            4 => v.fill(f32::NEG_INFINITY),
            _ if n > 10 => {
                v[(n / 3 + row) % (n - 2)] = 31.0;
                v[n - 2] = 31.0;
                v[n / 5] = f32::NAN;
            }
            _ => {}
        }
        data.extend(v);
    }
    data
}

/// Batches of rows on `dev` (planted ties, NaNs, an all-NaN and an all −∞ row) against the
/// reference, row by row: greedy, and draws with random temperatures (some ≤ 0: greedy
/// rows) and seeds.
fn check_rows_on(dev: &Device, shapes: &[(usize, usize)]) {
    let mut r = rng(&format!("argmax rows {dev:?}"));
    for &(rows, n) in shapes {
        let data = planted(&mut r, rows, n);
        let cpu = Tensor::from_vec(data.clone(), (rows, n), &Device::Cpu).unwrap();
        let row = |i: usize| &data[i * n..(i + 1) * n];
        let t = cpu.to_device(dev).unwrap();
        let greedy = argmax_rows(&t).unwrap().to_vec1::<u32>().unwrap();
        let temps: Vec<f32> = (0..rows)
            .map(|i| match i % 4 {
                0 => 0.0,
                1 => -1.0,
                _ => uniform(&mut r, 1, 0.3, 1.5)[0],
            })
            .collect();
        let seeds: Vec<u64> = (0..rows).map(|_| rand::Rng::random(&mut r)).collect();
        let drawn = sample_gumbel_rows(&t, &temps, &seeds).unwrap().to_vec1::<u32>().unwrap();
        for i in 0..rows {
            assert_eq!(greedy[i], argmax_slice(row(i)), "argmax row {i} of {rows} × {n}");
            let inv_t = if temps[i] > 0.0 { 1.0 / temps[i] } else { 0.0 };
            let want = pick(row(i), (inv_t, seeds[i]));
            assert_eq!(drawn[i], want, "draw row {i} of {rows} × {n}, T {}", temps[i]);
        }
    }
}

#[test]
fn rows_match_the_reference() {
    check_rows_on(&Device::Cpu, &[(1, 7), (6, 1000), (3, 65_537)]);
    let x = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
    assert!(sample_gumbel_rows(&x, &[1.0], &[1, 2]).is_err(), "one temperature for 2 rows");
    assert!(sample_gumbel_rows(&x, &[1.0, f32::NAN], &[1, 2]).is_err(), "NaN temperature");
    assert!(argmax_rows(&Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap()).is_err());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_rows_match_the_reference() {
    let dev = crate::kernels::testing::gpu();
    check_rows_on(&dev, &[(1, 7), (6, 1000), (3, 65_537), (64, 201_088), (300, 333)]);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_sampling_matches_cpu_and_the_softmax() {
    let dev = crate::kernels::testing::gpu();
    for (k, v) in rows().into_iter().enumerate() {
        let (cpu, gpu) = (
            Tensor::new(v.as_slice(), &Device::Cpu).unwrap(),
            Tensor::new(v.as_slice(), &dev).unwrap(),
        );
        for seed in [k as u64, 12345, u64::MAX] {
            assert_eq!(
                draw(&gpu, 0.8, seed),
                draw(&cpu, 0.8, seed),
                "row of {} seed {seed}",
                v.len()
            );
        }
    }
    check_draw_frequencies(&dev);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_argmax_matches_cpu() {
    let dev = crate::kernels::testing::gpu();
    for v in rows() {
        let t = Tensor::new(v.as_slice(), &dev).unwrap();
        assert_eq!(one(&t), argmax_slice(&v), "row of {}", v.len());
    }
}

/// Rows on `dev` split into `world` pieces of `ceil(n / world)` columns (the last padded with
/// values larger than any real one, which must not win), each piece's candidates taken alone
/// and picked together: the ids the whole rows give, greedy and drawn (random temperatures,
/// some greedy rows, random seeds), with the maximum planted twice across pieces.
fn check_shards_on(dev: &Device, shapes: &[(usize, usize)]) {
    let mut r = rng(&format!("argmax shards {dev:?}"));
    for &(rows, n) in shapes {
        for world in [2usize, 3, 4] {
            let per = n.div_ceil(world);
            let data = planted(&mut r, rows, n);
            let temps: Vec<f32> = (0..rows)
                .map(|i| if i % 3 == 0 { 0.0 } else { uniform(&mut r, 1, 0.3, 1.5)[0] })
                .collect();
            let seeds: Vec<u64> = (0..rows).map(|_| rand::Rng::random(&mut r)).collect();
            let draws: Vec<(f32, u64)> = temps
                .iter()
                .zip(&seeds)
                .map(|(&t, &s)| (if t > 0.0 { 1.0 / t } else { 0.0 }, s))
                .collect();
            let words = Tensor::new(draw_words(&draws).as_slice(), dev).unwrap();
            let pieces: Vec<Tensor> = (0..world)
                .map(|k| {
                    let (lo, hi) = ((k * per).min(n), ((k + 1) * per).min(n));
                    let mut piece = Vec::with_capacity(rows * per);
                    for row in 0..rows {
                        piece.extend_from_slice(&data[row * n + lo..row * n + hi]);
                        piece.extend(std::iter::repeat_n(1e30f32, per - (hi - lo)));
                    }
                    let t = Tensor::from_vec(piece, (rows, per), dev).unwrap();
                    shard_candidates(&t, lo, hi - lo, &words).unwrap()
                })
                .collect();
            let got = pick_candidates(&Tensor::stack(&pieces, 0).unwrap()).unwrap();
            let got = got.to_vec1::<u32>().unwrap();
            for i in 0..rows {
                let want = pick(&data[i * n..(i + 1) * n], draws[i]);
                assert_eq!(got[i], want, "row {i} of {rows} × {n} over {world}, T {}", temps[i]);
            }
        }
    }
}

#[test]
fn shards_pick_what_the_whole_rows_give() {
    check_shards_on(&Device::Cpu, &[(1, 7), (6, 1000), (2, 65_537)]);
    let x = Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap();
    let words = Tensor::zeros(6, DType::U32, &Device::Cpu).unwrap();
    assert!(shard_candidates(&x, 0, 6, &words).is_err(), "more real columns than columns");
    assert!(shard_candidates(&x, 0, 5, &words.narrow(0, 0, 3).unwrap()).is_err(), "short draws");
    assert!(pick_candidates(&Tensor::zeros((2, 2, 3), DType::U32, &Device::Cpu).unwrap()).is_err());
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_shards_pick_what_the_whole_rows_give() {
    let dev = crate::kernels::testing::gpu();
    check_shards_on(&dev, &[(1, 7), (6, 1000), (3, 65_537), (64, 201_088), (300, 333)]);
}
