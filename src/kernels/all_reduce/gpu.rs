//! The launch of `all_reduce.cu`.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig};
use candle_core::{DType, Device, Result, Storage, Tensor, bail};
use half::bf16;

use super::{BLOCKS, MAX_RANKS, THREADS, fused_blocks};
use crate::kernels::cuda::{cuda_view, device_address, f32_aligned16, fatbin, output, tensor};
use crate::kernels::launch::Launch;
use crate::kernels::layer_norm_act::{AddNorm, Normed, norm_threads};

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
    let func = fatbin::all_reduce::ALL_REDUCE.func(&dev, "all_reduce_f32")?;
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

/// Rows a fused launch norms at most in width: `NORM_VEC` float4s a thread at 1,024 threads.
const NORM_MAX_WIDTH: usize = 16_384;

/// [`all_reduce_f32`] of `partial` (f32 `[rows, n]`) with `norm` applied to the sum in the
/// same launch (`all_reduce_add_rms_norm_bf16`): the bits of the sum and then
/// `norm.apply(sum)`. `None` where that kernel does not take it (a norm to another dtype than
/// bf16, tensors not f32, rows wider than [`NORM_MAX_WIDTH`] or not in whole float4s, more than a
/// region): the caller then takes the two steps. Every rank must make the same call at the same
/// point of its stream, as for [`all_reduce_f32`].
pub fn all_reduce_add_rms_norm(
    partial: &Tensor,
    norm: &AddNorm,
    peers: &Peers,
    rank: usize,
    world: usize,
    region: usize,
) -> Result<Option<Normed>> {
    let (rows, n) = partial.dims2()?;
    let f32s = [Some(partial), Some(norm.x), norm.bias, Some(norm.w)];
    if norm.dtype != DType::BF16
        || f32s.into_iter().flatten().any(|t| t.dtype() != DType::F32)
        || norm.x.dims() != [rows, n]
        || norm.bias.is_some_and(|b| b.dims() != [n])
        || norm.w.dims() != [n]
        || !n.is_multiple_of(4)
        || n > NORM_MAX_WIDTH
        || rows * n > region
        || !region.is_multiple_of(4)
        || world > MAX_RANKS
        || rank >= world
    {
        return Ok(None);
    }
    let Device::Cuda(dev) = partial.device() else { return Ok(None) };
    let (p, x, w) = (f32_aligned16(partial)?, f32_aligned16(norm.x)?, f32_aligned16(norm.w)?);
    let bias = norm.bias.map(f32_aligned16).transpose()?;
    let (ps, pl) = p.storage_and_layout();
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let bs = bias.as_ref().map(|t| t.storage_and_layout());
    let pv = cuda_view::<f32>(&ps, pl, "all_reduce_add_rms_norm partial")?;
    let xv = cuda_view::<f32>(&xs, xl, "all_reduce_add_rms_norm x")?;
    let wv = cuda_view::<f32>(&ws, wl, "all_reduce_add_rms_norm weight")?;
    let bv = bs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "all_reduce_add_rms_norm bias"));
    let bv = bv.transpose()?;
    let mut x_out = output::<f32>(dev, rows * n, false)?;
    // SAFETY: the kernel writes every element of the outputs it is given.
    let mut h16 = unsafe { dev.alloc::<bf16>(rows * n)? };
    let mut h32 = norm.keep_f32.then(|| unsafe { dev.alloc::<f32>(rows * n) }).transpose()?;
    let func = fatbin::all_reduce::ALL_REDUCE.func(dev, "all_reduce_add_rms_norm_bf16")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.val(*peers).val(rank as i32).val(world as i32).ptr(&pv).ptr(&xv);
    match &bv {
        Some(v) => b.ptr(v),
        None => b.null(),
    };
    b.ptr(&wv).ptr_mut(&mut x_out).ptr_mut(&mut h16);
    match &mut h32 {
        Some(v) => b.ptr_mut(v),
        None => b.null(),
    };
    b.val(rows as u32).val(n as u32).val(region as u32).val(norm.eps as f32);
    let cfg = LaunchConfig {
        grid_dim: (fused_blocks(rows) as u32, 1, 1),
        block_dim: (norm_threads(n) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel; every buffer in `peers` holds two slots of `world`
    // regions of `region` floats (the caller's contract) and rows·n ≤ region; partial, x and the
    // outputs hold rows·n floats, bias and w n, all from a 16-byte boundary; n ≤ 16,384 fits the
    // block's registers at `norm_threads(n)` threads. It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let h32 = h32.map(|s| tensor(s, dev, &[rows, n]));
    Ok(Some(Normed { x: tensor(x_out, dev, &[rows, n]), h: tensor(h16, dev, &[rows, n]), h32 }))
}

/// Whether `all_gather_b32` takes `x` as it is: 32-bit words, contiguous, at most a region.
fn gathers(x: &Tensor, rank: usize, world: usize, region: usize) -> bool {
    matches!(x.dtype(), DType::F32 | DType::U32)
        && x.is_contiguous()
        && x.elem_count() <= region
        && world <= MAX_RANKS
        && rank < world
        && x.device().is_cuda()
}

/// Launches `all_gather_b32` from `input` into `out` (device addresses of n words each, out
/// world · n where root < 0).
///
/// # Safety
/// `input` and `out` must be live device memory of this device as large as said, ordered on its
/// stream; every buffer in `peers` must hold two slots of `world` regions of `region` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn gather_into(
    dev: &candle_core::CudaDevice,
    peers: &Peers,
    rank: usize,
    world: usize,
    region: usize,
    input: u64,
    out: u64,
    n: usize,
    root: i32,
) -> Result<()> {
    let func = fatbin::all_reduce::ALL_REDUCE.func(dev, "all_gather_b32")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.val(*peers).val(rank as i32).val(world as i32).val(input).val(out);
    b.val(n as u32).val(region as u32).val(root);
    let cfg = LaunchConfig {
        grid_dim: (BLOCKS as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel; the buffers are the caller's contract.
    unsafe { b.launch(cfg) }
}

/// Every rank's `x` (f32 or u32, contiguous, at most `region` elements), stacked in rank order:
/// `[world, ..x.dims()]`, through the ranks' buffers as the sums go; `None` where `x` does not go
/// this way. Every rank must make the same call at the same point of its stream.
pub fn all_gather_b32(
    x: &Tensor,
    peers: &Peers,
    rank: usize,
    world: usize,
    region: usize,
) -> Result<Option<Tensor>> {
    if !gathers(x, rank, world, region) {
        return Ok(None);
    }
    let Device::Cuda(dev) = x.device() else { return Ok(None) };
    let n = x.elem_count();
    let mut dims = vec![world];
    dims.extend_from_slice(x.dims());
    let out = match x.dtype() {
        DType::F32 => tensor(output::<f32>(dev, world * n, false)?, dev, &dims),
        // SAFETY: the kernel writes all world · n words.
        _ => tensor(unsafe { dev.alloc::<u32>(world * n)? }, dev, &dims),
    };
    // SAFETY: x holds n words and out world · n, both on this device; `peers` is the caller's.
    unsafe {
        gather_into(
            dev,
            peers,
            rank,
            world,
            region,
            device_address(x)?,
            device_address(&out)?,
            n,
            -1,
        )?
    };
    Ok(Some(out))
}

/// Rank `root`'s `x` written over every rank's `x`, in place (f32 or u32, contiguous, at most
/// `region` elements, the same shape on every rank); `false` where `x` does not go this way.
/// Every rank must make the same call at the same point of its stream.
pub fn broadcast_b32(
    x: &Tensor,
    peers: &Peers,
    rank: usize,
    world: usize,
    region: usize,
    root: usize,
) -> Result<bool> {
    if !gathers(x, rank, world, region) || root >= world {
        return Ok(false);
    }
    let Device::Cuda(dev) = x.device() else { return Ok(false) };
    let at = device_address(x)?;
    // SAFETY: x holds its n words on this device, read and written in place; `peers` is the
    // caller's.
    unsafe { gather_into(dev, peers, rank, world, region, at, at, x.elem_count(), root as i32)? };
    Ok(true)
}
