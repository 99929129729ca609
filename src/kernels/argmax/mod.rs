//! Picking the next token of every row of a batch on the device: greedy decoding's argmax
//! ([`argmax_rows`]) and plain temperature sampling by the Gumbel-max trick
//! ([`sample_gumbel_rows`]), one launch pair for all rows, each row with its own temperature and
//! seed. candle reduces a row in a single block, 156 µs for gpt-oss's 201,088 logits on an H200,
//! a twentieth of a decode step; the CUDA version here (`argmax.cu`) spreads the rows over about
//! 256 blocks, then reduces those. Sampling on the host instead costs a copy of the logits and
//! 201k exponentials per token.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};

use super::cpu_f32;
// The reference: the sampler's host argmax, whose rules the kernel follows.
use crate::generate::sampler::argmax as argmax_slice;

/// The Gumbel noise for entry `j` of the draw `seed` (the kernel's `gumbel`, bit for bit:
/// splitmix64 of `seed + φ·(j + 1)`, 53 bits to a double in (0, 1), `−ln(−ln u)` in double,
/// rounded to f32).
pub fn gumbel(seed: u64, j: usize) -> f32 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(j as u64 + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = ((z >> 11) as f64 + 0.5) * (-53f64).exp2();
    (-(-u.ln()).ln()) as f32
}

/// Index of the largest value of every row of `logits` (f32 `[R, n]`): u32 `[R]`, by the
/// sampler's rules ([`crate::generate::sampler::argmax`]): NaN never wins, ties go to the lower
/// index, a row of only NaN gives 0.
pub fn argmax_rows(logits: &Tensor) -> Result<Tensor> {
    let rows = check_rows(logits)?;
    logits.contiguous()?.apply_op1_no_bwd(&ArgmaxRows { draws: None, rows })
}

/// One draw per row of `logits` (f32 `[R, n]`): u32 `[R]`, row `r` from
/// `softmax(row / temperatures[r])` by the Gumbel-max trick: the argmax of `row / T + g`, with
/// `g = −ln(−ln u)` for `u` uniform from a hash of `seeds[r]` and the index ([`gumbel`]). Exact
/// sampling without a softmax and without copying the logits to the host; the same seed gives
/// the same draw on the CPU and the GPU. A row with `temperatures[r] ≤ 0` takes the plain
/// argmax (a greedy row).
pub fn sample_gumbel_rows(logits: &Tensor, temperatures: &[f32], seeds: &[u64]) -> Result<Tensor> {
    let rows = check_rows(logits)?;
    if temperatures.len() != rows || seeds.len() != rows {
        bail!(
            "sample_gumbel_rows: {rows} rows, {} temperatures, {} seeds",
            temperatures.len(),
            seeds.len()
        );
    }
    if let Some(t) = temperatures.iter().find(|t| !t.is_finite()) {
        bail!("sample_gumbel_rows: temperature {t} (≤ 0 is greedy, > 0 must be finite)");
    }
    // 1/T; 0 marks a greedy row.
    let draws = temperatures
        .iter()
        .zip(seeds)
        .map(|(&t, &seed)| (if t > 0.0 { 1.0 / t } else { 0.0 }, seed))
        .collect();
    logits.contiguous()?.apply_op1_no_bwd(&ArgmaxRows { draws: Some(draws), rows })
}

/// The row count of f32 `[R, n]` logits with `R, n ≥ 1` that the kernels can index.
fn check_rows(logits: &Tensor) -> Result<usize> {
    match (logits.dims(), logits.dtype()) {
        ([r, n], DType::F32) if *r > 0 && *r <= 65_535 && *n > 0 && *n <= i32::MAX as usize => {
            Ok(*r)
        }
        (dims, dtype) => bail!(
            "argmax_rows: expected f32 [rows, n] logits (1 ≤ rows ≤ 65535, n ≥ 1), got {dtype:?} \
             {dims:?}"
        ),
    }
}

/// The index of `values` as the kernels pick it (the reference): greedy for `inv_t ≤ 0`, else
/// the Gumbel-max draw of `seed`.
fn pick(values: &[f32], (inv_t, seed): (f32, u64)) -> u32 {
    if inv_t > 0.0 {
        let noisy: Vec<f32> =
            values.iter().enumerate().map(|(j, &x)| x * inv_t + gumbel(seed, j)).collect();
        argmax_slice(&noisy)
    } else {
        argmax_slice(values)
    }
}

/// `draws`: per row `(1/T, seed)`, 1/T = 0 for a greedy row; `None`: every row greedy.
struct ArgmaxRows {
    draws: Option<Vec<(f32, u64)>>,
    rows: usize,
}

impl CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "argmax_rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = cpu_f32(s, l, "argmax_rows")?;
        let n = values.len() / self.rows;
        let out = values
            .chunks_exact(n)
            .enumerate()
            .map(|(r, row)| pick(row, self.draws.as_ref().map_or((0.0, 0), |d| d[r])))
            .collect();
        Ok((CpuStorage::U32(out), Shape::from(self.rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

        use super::cuda::{ARGMAX_PTX, int};

        const BLOCKS: usize = 256;
        const THREADS: u32 = 256;
        let dev = s.device.clone();
        let rows = self.rows;
        let n = l.shape().elem_count() / rows;
        let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        // About BLOCKS blocks in all, at least 4 per row: one row gets argmax's 256 chunks.
        let chunk = n.div_ceil((BLOCKS / rows).max(4)).max(1);
        let parts = n.div_ceil(chunk);
        // SAFETY (all three): argmax_rows_partial writes every partial, argmax_rows_final every
        // output.
        let mut part_v = unsafe { dev.alloc::<f32>(rows * parts)? };
        let mut part_i = unsafe { dev.alloc::<i32>(rows * parts)? };
        let mut out = unsafe { dev.alloc::<u32>(rows)? };
        let (n32, chunk32, parts32) =
            (int(n, "logits")?, int(chunk, "chunk")?, int(parts, "parts")?);
        int(rows * parts, "partials")?;
        // Per-row seeds (two words each, first: 8-byte aligned) then 1/T on the device, in one
        // copy from pinned memory (`upload`: the launches still queue behind the decode step),
        // or null pointers (every row greedy).
        let draws = match &self.draws {
            Some(d) => {
                let mut words: Vec<u32> =
                    d.iter().flat_map(|x| [x.1 as u32, (x.1 >> 32) as u32]).collect();
                words.extend(d.iter().map(|x| x.0.to_bits()));
                Some(super::cuda::upload(&dev, &words)?)
            }
            None => None,
        };
        let func =
            dev.get_or_load_custom_func("argmax_rows_partial", "inferno_argmax", ARGMAX_PTX)?;
        let mut b = func.builder();
        b.arg(&x).arg(&n32).arg(&chunk32).arg(&parts32);
        let null = 0u64;
        let views = draws.as_ref().map(|w| (w.slice(2 * rows..3 * rows), w.slice(0..2 * rows)));
        match &views {
            Some((inv_t, seeds)) => b.arg(inv_t).arg(seeds),
            None => b.arg(&null).arg(&null),
        };
        b.arg(&mut part_v).arg(&mut part_i);
        let cfg = LaunchConfig {
            grid_dim: (parts as u32, rows as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature; blocks stay inside their row.
        unsafe { b.launch(cfg) }.w()?;
        let func =
            dev.get_or_load_custom_func("argmax_rows_final", "inferno_argmax", ARGMAX_PTX)?;
        let mut b = func.builder();
        b.arg(&part_v).arg(&part_i).arg(&parts32).arg(&mut out);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as above; each row's block reads the `parts` partials just written.
        unsafe { b.launch(cfg) }.w()?;
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::U32(out), device: dev },
            Shape::from(rows),
        ))
    }
}

#[cfg(test)]
mod tests {
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
        let weights: Vec<f64> =
            logits.iter().map(|&l| (f64::from(l) / f64::from(t)).exp()).collect();
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

    /// Batches of rows on `dev` (planted ties, NaNs, an all-NaN and an all −∞ row) against the
    /// reference, row by row: greedy, and draws with random temperatures (some ≤ 0: greedy
    /// rows) and seeds.
    fn check_rows_on(dev: &Device, shapes: &[(usize, usize)]) {
        let mut r = rng(&format!("argmax rows {dev:?}"));
        for &(rows, n) in shapes {
            let mut data = Vec::with_capacity(rows * n);
            for row in 0..rows {
                let mut v = uniform(&mut r, n, -30.0, 30.0);
                match row % 5 {
                    3 if rows > 3 => v.fill(f32::NAN),
                    4 => v.fill(f32::NEG_INFINITY),
                    _ if n > 10 => {
                        v[(n / 3 + row) % (n - 2)] = 31.0;
                        v[n - 2] = 31.0; // tie: the lower index must win
                        v[n / 5] = f32::NAN;
                    }
                    _ => {}
                }
                data.extend(v);
            }
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
}
