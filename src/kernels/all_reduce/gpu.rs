//! The launch of `all_reduce.cu`.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig};
use candle_core::{DType, Result, Storage, Tensor, bail};

use super::{BLOCKS, MAX_RANKS, THREADS};
use crate::kernels::cuda::{output, ptx, tensor};
use crate::kernels::launch::Launch;

/// Every rank's buffer as this process addresses it (`Peers` in all_reduce.cu): its own at its
/// rank, the others' mapped through CUDA IPC.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Peers {
    pub base: [u64; MAX_RANKS],
}

// SAFETY: plain data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Peers {}

/// The sum over `world` ranks of every rank's `x` (contiguous f32, its length a multiple of 4
/// and at most `region`), in rank order, as rank `rank`. Every rank must make the same call at
/// the same point of its stream, with `peers` built for buffers of `region` floats a region.
pub fn all_reduce_f32(
    x: &Tensor,
    peers: &Peers,
    rank: usize,
    world: usize,
    region: usize,
) -> Result<Tensor> {
    let n = x.elem_count();
    if x.dtype() != DType::F32
        || !x.is_contiguous()
        || !n.is_multiple_of(4)
        || n > region
        || !region.is_multiple_of(4)
        || world > MAX_RANKS
        || rank >= world
    {
        bail!(
            "all_reduce_f32: {:?} {:?} over {world} ranks does not fit regions of {region} floats",
            x.dtype(),
            x.dims()
        );
    }
    let (storage, layout) = x.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("all_reduce_f32: not a CUDA tensor") };
    let dev = s.device.clone();
    let input = s.as_cuda_slice::<f32>()?.slice(layout.start_offset()..);
    let mut out = output::<f32>(&dev, n, false)?;
    let func = ptx::all_reduce::ALL_REDUCE.func(&dev, "all_reduce_f32")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.val(*peers).val(rank as i32).val(world as i32).ptr(&input).ptr_mut(&mut out);
    b.val(n as u32).val(region as u32);
    let cfg = LaunchConfig {
        grid_dim: (BLOCKS as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel; every buffer in `peers` holds two slots of `world`
    // regions of `region` floats (the caller's contract), `out` gets all n floats. It waits (PDL)
    // before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok(tensor(out, &dev, x.dims()))
}
