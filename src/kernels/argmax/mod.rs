//! Picking the next token of every row of a batch on the device: greedy decoding's argmax
//! ([`argmax_rows`]) and plain temperature sampling by the Gumbel-max trick
//! ([`sample_gumbel_rows`]), one launch pair for all rows, each row with its own temperature and
//! seed. candle reduces a row in a single block, 156 µs for gpt-oss's 201,088 logits on an H200,
//! a twentieth of a decode step; the CUDA version here (`argmax.cu`, launched from `gpu.rs`) spreads the rows over about
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
        gpu::launch(self.draws.as_deref(), self.rows, s, l)
    }
}

#[cfg(feature = "cuda")]
pub(super) mod gpu;

#[cfg(test)]
mod tests;
