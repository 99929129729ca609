//! Sampling on the device for every setting: penalties (repetition, presence, frequency),
//! temperature, top-k, top-p, min-p and a seeded draw, for every row of a batch in one chain of
//! launches. Copying gpt-oss's 201,088 logits to the host and filtering them there cost 2.4× the
//! decode speed; here the row never leaves the GPU.
//!
//! The filters are the host sampler's ([`crate::generate::sampler::keep`]), which keep sets of the
//! form "logit ≥ threshold": the kernels find each row's thresholds by radix selection over the
//! logits' bits (exact, no sort) and draw from the kept set by the Gumbel-max trick, with the
//! noise of [`super::argmax::gumbel`]. Two paths find the same set: where every sampling row has
//! a top-k of at most [`TOPK_MAX`] ([`topk_first`]), each chunk's k largest first and the rest
//! over those (`sample_topk.cu`, two launches); otherwise selection over whole rows (`sample.cu`,
//! up to ten). The reference (`cpu_fwd`) is the host sampler's `keep` plus the same Gumbel draw,
//! so the same seed picks the same id on all three.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};

use super::argmax::gumbel;
use super::cpu_f32;
use crate::generate::sampler::{Filter, Penalty, apply_penalties, argmax, keep};

/// One row's draw: its filters, the seed of its Gumbel noise, and its penalties (distinct ids;
/// ids outside the vocabulary are ignored).
#[derive(Debug, Clone)]
pub struct RowSampling {
    pub filter: Filter,
    pub seed: u64,
    pub penalties: Vec<Penalty>,
}

/// The next id of every row of `logits` (f32 `[R, n]`): u32 `[R]`, row `r` drawn by `rows[r]`
/// (the argmax of the penalised row for a greedy filter, `inv_t ≤ 0`).
pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Tensor> {
    check(logits, rows)?;
    logits.contiguous()?.apply_op1_no_bwd(&SampleRows { rows, mask: false })
}

/// Which tokens each row may draw (u8 `[R, n]`, 1 = kept; all 0 in a row that takes the argmax):
/// the kept set [`sample_rows`] draws from, for tests.
pub fn kept_mask(logits: &Tensor, rows: &[RowSampling]) -> Result<Tensor> {
    check(logits, rows)?;
    logits.contiguous()?.apply_op1_no_bwd(&SampleRows { rows, mask: true })
}

fn check(logits: &Tensor, rows: &[RowSampling]) -> Result<()> {
    match (logits.dims(), logits.dtype()) {
        ([r, n], DType::F32)
            if *r == rows.len() && *r <= 65_535 && *n > 0 && *n < i32::MAX as usize =>
        {
            Ok(())
        }
        (dims, dtype) => bail!(
            "sample_rows: expected f32 [{}, n] logits (rows ≤ 65535, n ≥ 1), got {dtype:?} {dims:?}",
            rows.len()
        ),
    }
}

struct SampleRows<'a> {
    rows: &'a [RowSampling],
    /// Output the kept mask instead of the ids.
    mask: bool,
}

/// The reference draw of one row: the id, and the kept ids (empty for an argmax row).
fn reference_row(row: &[f32], r: &RowSampling) -> (u32, Vec<u32>) {
    let mut l = row.to_vec();
    apply_penalties(&mut l, &r.penalties);
    let (mut cand, mut scratch) = (Vec::new(), Vec::new());
    let sampling = r.filter.inv_t > 0.0;
    if !sampling || !keep(&r.filter, &l, &mut cand, &mut scratch) || cand.is_empty() {
        return (argmax(&l), Vec::new());
    }
    // Gumbel-max over the kept set: ties to the lower id, as the kernel's reduction.
    let mut best = (f32::NEG_INFINITY, u32::MAX);
    for c in &cand {
        let v = c.logit * r.filter.inv_t + gumbel(r.seed, c.id as usize);
        if v > best.0 || (v == best.0 && c.id < best.1) {
            best = (v, c.id);
        }
    }
    (best.1, cand.iter().map(|c| c.id).collect())
}

impl CustomOp1 for SampleRows<'_> {
    fn name(&self) -> &'static str {
        "sample_rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = cpu_f32(s, l, "sample_rows")?;
        let rows = self.rows.len();
        let n = values.len() / rows;
        let picks = values.chunks_exact(n).zip(self.rows).map(|(row, r)| reference_row(row, r));
        if self.mask {
            let mut out = vec![0u8; rows * n];
            for (i, (_, kept)) in picks.enumerate() {
                for id in kept {
                    out[i * n + id as usize] = 1;
                }
            }
            return Ok((CpuStorage::U8(out), Shape::from((rows, n))));
        }
        Ok((CpuStorage::U32(picks.map(|p| p.0).collect()), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch(self.rows, self.mask, s, l)
    }
}

/// Words of per-row settings in the kernels' parameter block (sample.cu `row_cfg`).
#[cfg(any(feature = "cuda", test))]
const HEADER: usize = 8;

/// The kernels' parameter block: per row `HEADER` words (1/T, min-p floor, top-p as f64 — < 0
/// off —, top-k — 0 off —, seed as two words), then the penalties as (row, id, factor, sub)
/// quadruples. Returns the block and the number of penalties.
#[cfg(any(feature = "cuda", test))]
fn pack(rows: &[RowSampling], n: usize) -> (Vec<u32>, usize) {
    let mut words = Vec::with_capacity(rows.len() * HEADER);
    for r in rows {
        let f = &r.filter;
        let p = f.top_p.unwrap_or(-1.0).to_bits();
        let k = if f.top_k < n { f.top_k as u32 } else { 0 };
        let (inv_t, floor) = (f.inv_t.to_bits(), f.floor.to_bits());
        words.extend([inv_t, floor, p as u32, (p >> 32) as u32, k]);
        words.extend([r.seed as u32, (r.seed >> 32) as u32, 0]);
    }
    let mut count = 0;
    for (i, r) in rows.iter().enumerate() {
        for p in r.penalties.iter().filter(|p| (p.id as usize) < n) {
            words.extend([i as u32, p.id, p.factor.to_bits(), p.sub.to_bits()]);
            count += 1;
        }
    }
    (words, count)
}

/// The largest top-k the top-k-first sampler (`sample_topk.cu`) takes: it keeps this many
/// candidates per chunk of [`TOPK_CHUNK`] logits.
#[cfg(any(feature = "cuda", test))]
pub(crate) const TOPK_MAX: usize = 256;
/// sample_topk.cu's `CHUNK` (logits per block) and `MAX_PARTS` (chunks per row).
#[cfg(any(feature = "cuda", test))]
const TOPK_CHUNK: usize = 4096;
#[cfg(any(feature = "cuda", test))]
const TOPK_MAX_PARTS: usize = 1024;

/// Whether a batch takes the top-k-first sampler: every sampling row has a top-k of at most
/// [`TOPK_MAX`] below the vocabulary (greedy rows take any path). Otherwise the radix selection
/// over whole rows (`sample.cu`), which any setting can take.
#[cfg(any(feature = "cuda", test))]
pub(crate) fn topk_first(rows: &[RowSampling], n: usize) -> bool {
    n <= TOPK_CHUNK * TOPK_MAX_PARTS
        && rows.iter().all(|r| {
            let f = &r.filter;
            f.inv_t <= 0.0 || (1..=TOPK_MAX).contains(&f.top_k) && f.top_k < n
        })
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
