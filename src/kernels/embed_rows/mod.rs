//! The token embedding's lookup: row `tokens[t]` of the table, in f32, one launch
//! (`embed_rows.cu` on the GPU) where candle takes two (`index_select`, then the cast).
//!
//! With tensor parallelism each rank keeps the rows `first .. first + rows` of the vocabulary
//! (`models::embedding`); a token another rank holds looks up zeros, and the sum over the ranks
//! gives every row whole: one rank's values plus zeros, so the same bits as one GPU's lookup.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};

/// f32 `[tokens, hidden]`: row `t` is row `tokens[t] − first` of `table` (f32 or bf16
/// `[rows, hidden]`, the vocabulary's rows `first .. first + rows`), or zeros where `tokens[t]`
/// is outside them. `tokens`: u32 `[tokens]`.
pub fn embed_rows(table: &Tensor, tokens: &Tensor, first: usize) -> Result<Tensor> {
    let (rows, _) = table.dims2()?;
    let n = tokens.dims1()?;
    if !matches!(table.dtype(), DType::F32 | DType::BF16) || tokens.dtype() != DType::U32 {
        bail!("embed_rows: table {:?}, tokens {:?}", table.dtype(), tokens.dtype());
    }
    let (Ok(first), Ok(rows)) = (u32::try_from(first), u32::try_from(rows)) else {
        bail!("embed_rows: {rows} rows from {first} exceed u32 ids");
    };
    if n == 0 {
        return Tensor::zeros((0, table.dim(1)?), DType::F32, table.device());
    }
    table.contiguous()?.apply_op2_no_bwd(&tokens.contiguous()?, &EmbedRows { first, rows })
}

struct EmbedRows {
    first: u32,
    rows: u32,
}

impl EmbedRows {
    /// The table's row for `token`, or `None` where another rank holds it.
    fn row(&self, token: u32) -> Option<usize> {
        let r = token.wrapping_sub(self.first);
        (r < self.rows).then_some(r as usize)
    }
}

impl CustomOp2 for EmbedRows {
    fn name(&self) -> &'static str {
        "embed_rows"
    }

    fn cpu_fwd(
        &self,
        ts: &CpuStorage,
        tl: &Layout,
        is: &CpuStorage,
        il: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let hidden = tl.shape().dims2()?.1;
        let table = super::F32Reader::new(ts, "embed_rows: table")?;
        let at = tl.start_offset();
        let ids = match (is, il.contiguous_offsets()) {
            (CpuStorage::U32(v), Some((a, b))) => &v[a..b],
            _ => bail!("embed_rows: expected contiguous u32 tokens"),
        };
        let mut out = vec![0f32; ids.len() * hidden];
        for (row, &id) in out.chunks_mut(hidden).zip(ids) {
            if let Some(r) = self.row(id) {
                row.iter_mut().enumerate().for_each(|(c, o)| *o = table.get(at + r * hidden + c));
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((ids.len(), hidden))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ts: &candle_core::CudaStorage,
        tl: &Layout,
        is: &candle_core::CudaStorage,
        il: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch((ts, tl), (is, il), self.first, self.rows)
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
