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
    let draws: Vec<(f32, u64)> = temperatures
        .iter()
        .zip(seeds)
        .map(|(&t, &seed)| (if t > 0.0 { 1.0 / t } else { 0.0 }, seed))
        .collect();
    draw_rows(logits, &draws)
}

/// [`sample_gumbel_rows`] by each row's `(1/T, seed)` (1/T = 0: a greedy row): u32 `[R]`.
pub fn draw_rows(logits: &Tensor, draws: &[(f32, u64)]) -> Result<Tensor> {
    let rows = check_rows(logits)?;
    if draws.len() != rows {
        bail!("draw_rows: {rows} rows, {} draws", draws.len());
    }
    logits.contiguous()?.apply_op1_no_bwd(&ArgmaxRows { draws: Some(draws.to_vec()), rows })
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

/// The words of a step's draws for [`shard_candidates`]: each row's `(1/T, seed)` (1/T = 0: a
/// greedy row) as the seeds' low and high words, then the 1/T bits.
pub fn draw_words(draws: &[(f32, u64)]) -> Vec<u32> {
    let mut w: Vec<u32> = draws.iter().flat_map(|d| [d.1 as u32, (d.1 >> 32) as u32]).collect();
    w.extend(draws.iter().map(|d| d.0.to_bits()));
    w
}

/// One rank's part of the draw over a vocabulary split between ranks: the best `(value, index)`
/// candidates of each row of its logits (f32 `[R, n]`, global columns `offset..offset + n`,
/// the first `valid` real), by the draws `draws` (u32 `[3R]`, [`draw_words`]): u32 `[R, 2P]`,
/// P values' bits then their global indices (`i32::MAX`: none). Gathered from every rank,
/// [`pick_candidates`] gives what [`sample_gumbel_rows`] gives on the whole rows: the noise is
/// drawn at the global index and the rule is the same, so only these pairs travel between the
/// ranks, never the logits.
pub fn shard_candidates(
    logits: &Tensor,
    offset: usize,
    valid: usize,
    draws: &Tensor,
) -> Result<Tensor> {
    let rows = check_rows(logits)?;
    let n = logits.dim(1)?;
    if valid > n || offset + n > i32::MAX as usize || draws.dims() != [3 * rows] {
        bail!(
            "shard_candidates: {valid} real of {n} columns at {offset}, draws {:?} for {rows} rows",
            draws.dims()
        );
    }
    let op = ShardCandidates { rows, offset, valid };
    logits.contiguous()?.apply_op2_no_bwd(&draws.to_dtype(DType::U32)?, &op)
}

/// The id each row draws from every rank's [`shard_candidates`] stacked in rank order (u32
/// `[W, R, 2P]`): u32 `[R]`, the larger value, on a tie the lower index (0 where no rank had a
/// value: a row of only NaN, as [`argmax_rows`]).
pub fn pick_candidates(all: &Tensor) -> Result<Tensor> {
    match (all.dims(), all.dtype()) {
        ([w, r, c], DType::U32) if *w > 0 && *r > 0 && *r <= 65_535 && *c > 0 && c % 2 == 0 => {}
        (dims, dtype) => {
            bail!("pick_candidates: expected u32 [ranks, rows, 2·parts], got {dtype:?} {dims:?}")
        }
    }
    all.contiguous()?.apply_op1_no_bwd(&PickCandidates)
}

/// The reference's candidate of one row: the best `(value, global index)` of its real columns
/// (the kernels' `better`: NaN never wins, ties to the lower index).
fn candidate(values: &[f32], offset: usize, (inv_t, seed): (f32, u64)) -> (f32, u32) {
    let mut best = (f32::NEG_INFINITY, i32::MAX as u32);
    for (j, &x) in values.iter().enumerate() {
        let g = offset + j;
        let x = if inv_t > 0.0 { x * inv_t + gumbel(seed, g) } else { x };
        if !x.is_nan() && beats((x, g as u32), best) {
            best = (x, g as u32);
        }
    }
    best
}

/// `(1/T, seed)` of row `r` from [`draw_words`]' words (3 a row).
pub fn draw_of(words: &[u32], r: usize) -> (f32, u64) {
    let rows = words.len() / 3;
    let seed = u64::from(words[2 * r]) | (u64::from(words[2 * r + 1]) << 32);
    (f32::from_bits(words[2 * rows + r]), seed)
}

/// Whether `(v, i)` beats `best` by the kernels' `better`: the larger value, on a tie the lower
/// index (the callers keep NaN out).
fn beats((v, i): (f32, u32), best: (f32, u32)) -> bool {
    v > best.0 || (v == best.0 && i < best.1)
}

struct ShardCandidates {
    rows: usize,
    offset: usize,
    valid: usize,
}

impl candle_core::CustomOp2 for ShardCandidates {
    fn name(&self) -> &'static str {
        "shard_candidates"
    }

    /// One candidate a row (P = 1).
    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let values = cpu_f32(s, l, "shard_candidates")?;
        let words = match (ds, dl.contiguous_offsets()) {
            (CpuStorage::U32(v), Some((a, b))) => &v[a..b],
            _ => bail!("shard_candidates: expected contiguous u32 draws"),
        };
        let n = values.len() / self.rows;
        let mut out = Vec::with_capacity(2 * self.rows);
        for (r, row) in values.chunks_exact(n).enumerate() {
            let (v, i) = candidate(&row[..self.valid], self.offset, draw_of(words, r));
            out.extend([v.to_bits(), i]);
        }
        Ok((CpuStorage::U32(out), Shape::from((self.rows, 2))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        ds: &candle_core::CudaStorage,
        dl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch_candidates(self.rows, (self.offset, self.valid), s, l, ds, dl)
    }
}

struct PickCandidates;

impl CustomOp1 for PickCandidates {
    fn name(&self) -> &'static str {
        "pick_candidates"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (w, rows, c) = l.shape().dims3()?;
        let all = match (s, l.contiguous_offsets()) {
            (CpuStorage::U32(v), Some((a, b))) => &v[a..b],
            _ => bail!("pick_candidates: expected a contiguous u32 tensor"),
        };
        let parts = c / 2;
        let out = (0..rows)
            .map(|r| {
                let mut best = (f32::NEG_INFINITY, i32::MAX as u32);
                for k in 0..w {
                    let cand = &all[(k * rows + r) * c..(k * rows + r + 1) * c];
                    for p in 0..parts {
                        let c = (f32::from_bits(cand[p]), cand[parts + p]);
                        if beats(c, best) {
                            best = c;
                        }
                    }
                }
                if best.1 == i32::MAX as u32 { 0 } else { best.1 }
            })
            .collect();
        Ok((CpuStorage::U32(out), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch_pick(s, l)
    }
}

#[cfg(feature = "cuda")]
pub(super) mod gpu;

#[cfg(test)]
mod tests;
