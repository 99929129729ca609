//! ggml's MXFP4 expert blocks (GGUF type 39) in the checkpoint layout our MoE kernels take, on
//! the device the model lives on. On a GPU the raw 17-byte blocks are uploaded as they lie in the
//! file and respelled there (`mxfp4_ggml.cu`): respelling the 600 million blocks of a
//! gpt-oss-20b GGUF on the host cost seconds of CPU and a host copy of every expert before the
//! upload. On the CPU the host respelling ([`mxfp4::ggml_rows_to_hf`], the kernel's reference)
//! builds the tensors directly.

use candle_core::{Device, Result, Tensor, bail};

use super::mxfp4::{self, BLOCK_BYTES, GGML_BLOCK_BYTES};

/// [`mxfp4::ggml_rows_to_hf`] of one or two sources (two: gate and up, fused as HF's gate_up)
/// as u8 tensors on `device`: codes `[rows·n, row_blocks, 16]` and scales `[rows·n, row_blocks]`.
pub fn ggml_rows_to_hf_on(
    sources: &[&[u8]],
    row_blocks: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let row_bytes = row_blocks * GGML_BLOCK_BYTES;
    let Some(first) = sources.first() else { bail!("mxfp4_ggml: no source") };
    if sources.len() > 2
        || row_bytes == 0
        || first.len() % row_bytes != 0
        || sources.iter().any(|s| s.len() != first.len())
    {
        bail!("mxfp4_ggml: 1 or 2 sources of equal whole rows of {row_blocks} ggml blocks");
    }
    let out_rows = first.len() / row_bytes * sources.len();
    let (codes_shape, scales_shape) = ((out_rows, row_blocks, BLOCK_BYTES), (out_rows, row_blocks));
    match device {
        Device::Cpu => {
            let (codes, scales) = mxfp4::ggml_rows_to_hf(sources, row_blocks);
            Ok((
                Tensor::from_vec(codes, codes_shape, device)?,
                Tensor::from_vec(scales, scales_shape, device)?,
            ))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            let (codes, scales) = gpu::respell(dev, sources, row_blocks, out_rows)?;
            Ok((codes.reshape(codes_shape)?, scales.reshape(scales_shape)?))
        }
        _ => bail!("mxfp4_ggml: unsupported device {device:?}"),
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
