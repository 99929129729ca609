//! The launch of `router_logits.cu`.

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{CudaStorage, Layout, Result, Shape, bail};

use crate::kernels::cuda::{fatbin, int};
use crate::kernels::launch::Launch;

/// From this many tokens a block computes 8 tokens × 8 experts: a quarter of the 4 × 4 tiles'
/// blocks, each reading twice the rows, so half the reads from L2.
const WIDE_TILE_TOKENS: usize = 32;

/// `h · wᵀ` for f32 `h` `[tokens, hidden]` and `w` `[experts, hidden]`.
pub(super) fn launch(
    (hs, hl): (&CudaStorage, &Layout),
    (ws, wl): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = hs.device.clone();
    let (tokens, hidden) = hl.shape().dims2()?;
    let experts = wl.shape().dims2()?.0;
    if !hl.start_offset().is_multiple_of(4) || !wl.start_offset().is_multiple_of(4) {
        bail!("router_logits: h and w must start on a 16-byte boundary");
    }
    let h = hs.as_cuda_slice::<f32>()?.slice(hl.start_offset()..);
    let w = ws.as_cuda_slice::<f32>()?.slice(wl.start_offset()..);
    // SAFETY: every (token, expert) output is written by the block that computes it.
    let mut out = unsafe { dev.alloc::<f32>(tokens * experts)? };
    // One block per RT tokens × RE experts: 8 × 8 from WIDE_TILE_TOKENS on, else 4 × 4 (the same
    // sums either way).
    let (name, tile) = if tokens >= WIDE_TILE_TOKENS {
        ("router_logits_f32_t8", 8)
    } else {
        ("router_logits_f32", 4)
    };
    let func = fatbin::router_logits::ROUTER_LOGITS.func(&dev, name)?;
    let blocks = tokens.div_ceil(tile) * experts.div_ceil(tile);
    let (t32, e32, h32) =
        (int(tokens, "tokens")?, int(experts, "experts")?, int(hidden, "hidden")?);
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&h).ptr(&w).ptr_mut(&mut out).val(t32).val(e32).val(h32);
    let cfg = LaunchConfig {
        grid_dim: (int(blocks, "blocks")? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's signature; rows are contiguous, aligned and
    // a multiple of 4 floats long (checked above and in router_logits). Before its PDL wait
    // the kernel only prefetches the weights.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let slice = CudaStorageSlice::F32(out);
    Ok((CudaStorage { slice, device: dev }, Shape::from((tokens, experts))))
}
