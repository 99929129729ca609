//! The launch of `mxfp4_ggml.cu`.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig};
use candle_core::{CudaDevice, Result, Tensor};

use crate::kernels::cuda::{fatbin, int, tensor};
use crate::kernels::launch::Launch;
use crate::kernels::mxfp4::BLOCK_BYTES;

/// Uploads the sources and respells them: flat codes and scales.
pub(super) fn respell(
    dev: &CudaDevice,
    sources: &[&[u8]],
    row_blocks: usize,
    out_rows: usize,
) -> Result<(Tensor, Tensor)> {
    let stream = dev.cuda_stream();
    let raw: Vec<CudaSlice<u8>> =
        sources.iter().map(|s| stream.clone_htod(*s)).collect::<std::result::Result<_, _>>().w()?;
    let out_blocks = out_rows * row_blocks;
    // SAFETY: the kernel writes every code and scale (one thread per output block).
    let mut codes = unsafe { dev.alloc::<u8>(out_blocks * BLOCK_BYTES)? };
    let mut scales = unsafe { dev.alloc::<u8>(out_blocks)? };
    let func = fatbin::mxfp4_ggml::MXFP4_GGML.func(dev, "mxfp4_ggml_to_hf")?;
    let n_src = raw.len() as i32;
    let blocks = out_blocks as i64;
    let rb = int(row_blocks, "mxfp4_ggml row blocks")?;
    let grid = u32::try_from(out_blocks.div_ceil(256))
        .map_err(|_| candle_core::Error::Msg("mxfp4_ggml: tensor too large".into()))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(&raw[0]).ptr(&raw[raw.len() - 1]).val(n_src);
    b.ptr_mut(&mut codes).ptr_mut(&mut scales).val(blocks).val(rb);
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match the kernel's signature; the sources hold out_rows / n_src
    // rows of row_blocks 17-byte blocks each (checked by the caller); threads past the last
    // block return. It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let (nc, ns) = (codes.len(), scales.len());
    Ok((tensor(codes, dev, &[nc]), tensor(scales, dev, &[ns])))
}
