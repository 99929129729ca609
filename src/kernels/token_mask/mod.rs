//! Output constraints' masks written into a step's logits (`engine::constraint`): the rows a
//! grammar constrains keep the logits of the tokens it allows and get -inf for the others; the
//! other rows are copied bit for bit. One launch (`token_mask.cu`) from the masks' bit words,
//! where candle's ops took a byte per token, two full-size f32 tensors and an `index_add`.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};

/// `logits` (f32 `[rows, vocab]`) with row `r` masked by mask `which[r]` (i32 `[rows]`, -1:
/// no mask): token `t` keeps its logit where bit `t` of that mask is set in `bits` (u32
/// `[masks, words]`, bit `t` of word `t / 32`, llguidance's layout) and is -inf elsewhere,
/// tokens past `words · 32` included.
pub fn token_mask(logits: &Tensor, which: &Tensor, bits: &Tensor) -> Result<Tensor> {
    let (rows, _) = logits.dims2()?;
    let (_, words) = bits.dims2()?;
    if logits.dtype() != DType::F32 || which.dtype() != DType::I32 || bits.dtype() != DType::U32 {
        bail!(
            "token_mask: logits {:?}, which {:?}, bits {:?}",
            logits.dtype(),
            which.dtype(),
            bits.dtype()
        );
    }
    if which.dims1()? != rows {
        bail!("token_mask: {} masks named for {rows} rows", which.dims1()?);
    }
    let (Ok(_), Ok(_)) = (i32::try_from(logits.dim(1)?), i32::try_from(words)) else {
        bail!("token_mask: a vocabulary of {} is too wide", logits.dim(1)?);
    };
    logits.contiguous()?.apply_op3_no_bwd(&which.contiguous()?, &bits.contiguous()?, &TokenMask)
}

struct TokenMask;

impl CustomOp3 for TokenMask {
    fn name(&self) -> &'static str {
        "token_mask"
    }

    fn cpu_fwd(
        &self,
        ls: &CpuStorage,
        ll: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = ll.shape().dims2()?;
        let words = bl.shape().dims2()?.1;
        let (CpuStorage::F32(l), CpuStorage::I32(w), CpuStorage::U32(b)) = (ls, ws, bs) else {
            bail!("token_mask: expected f32 logits, i32 rows and u32 bits");
        };
        let (l, w, b) = (&l[ll.start_offset()..], &w[wl.start_offset()..], &b[bl.start_offset()..]);
        let mut out = l[..rows * vocab].to_vec();
        for (r, row) in out.chunks_mut(vocab.max(1)).enumerate() {
            let Ok(m) = usize::try_from(w[r]) else { continue };
            let mask = b.get(m * words..(m + 1) * words).unwrap_or(&[]);
            for (t, v) in row.iter_mut().enumerate() {
                if mask.get(t / 32).is_none_or(|word| (word >> (t % 32)) & 1 == 0) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, vocab))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ls: &candle_core::CudaStorage,
        ll: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
        bs: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch((ls, ll), (ws, wl), (bs, bl))
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
