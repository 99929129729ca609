//! The launches of `sample.cu` and `sample_topk.cu` (their header comments list them).

use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaStorage, Layout, Result, Shape};

use super::{RowSampling, TOPK_CHUNK, pack, topk_first};
use crate::kernels::argmax::gpu::launch_final;
use crate::kernels::cuda::{fatbin, int, upload};
use crate::kernels::launch::Launch;

const THREADS: u32 = 256;
const BUCKETS: usize = 256;
const DIGITS: usize = 4;
/// Blocks per launch to aim for: two per SM of an H100.
const BLOCKS: usize = 264;
/// Fewest logits per block (a block also re-derives its row's thresholds, a few µs of scans).
const MIN_CHUNK: usize = 1024;

pub(super) fn launch(
    rows: &[RowSampling],
    mask: bool,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s.device.clone();
    let stream = dev.cuda_stream();
    let r = rows.len();
    let n = l.shape().elem_count() / r;
    // Just the rows': the logits may be a view of a longer buffer (a decode graph's, padded to
    // its bucket), and the penalties' scratch copy below takes all of `x`.
    let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..l.start_offset() + r * n);
    let parts = BLOCKS.div_ceil(r).clamp(1, n.div_ceil(MIN_CHUNK));
    let chunk = n.div_ceil(parts);
    let parts = n.div_ceil(chunk);
    let (n32, chunk32, parts32) = (int(n, "logits")?, int(chunk, "chunk")?, int(parts, "parts")?);
    int(r * n, "logits")?;
    let (words, penalties) = pack(rows, n);
    let params = upload(&dev, &words)?;
    if topk_first(rows, n) {
        return launch_topk(rows, mask, &x, n, &params, penalties, &dev);
    }
    // The penalties go into a scratch copy: logprobs and the caller read the logits as they are.
    let scratch = if penalties > 0 {
        let mut y = unsafe { dev.alloc::<f32>(r * n)? }; // SAFETY: filled by the copy below
        stream.memcpy_dtod(&x, &mut y).w()?;
        let entries = params.slice(r * super::HEADER..);
        let count = int(penalties, "penalties")?;
        let func = fatbin::sample::SAMPLE.func(&dev, "sample_penalise")?;
        let mut b = Launch::new(&stream, &func);
        b.ptr_mut(&mut y).val(n32).ptr(&entries).val(count);
        let cfg = LaunchConfig {
            grid_dim: (penalties.div_ceil(THREADS as usize) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches the kernel's signature; each entry's (row, id) lies inside the rows.
        // It waits (PDL) before anything else.
        unsafe { b.launch(cfg) }?;
        drop(b);
        Some(y)
    } else {
        None
    };
    let y: CudaView<f32> = match &scratch {
        Some(y) => y.as_view(),
        None => x,
    };
    let mut rowmax = stream.alloc_zeros::<u32>(r).w()?;
    let mut cnt = stream.alloc_zeros::<u32>(r * 2 * DIGITS * BUCKETS).w()?;
    // Per row: top-p's histograms, then each stage's derived state (sample.cu `SLOTS_ROW`).
    let mut mass = stream.alloc_zeros::<f64>(r * (DIGITS * BUCKETS + 2 * DIGITS * 3)).w()?;
    let grid = LaunchConfig {
        grid_dim: (parts as u32, r as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let top_k =
        rows.iter().any(|x| x.filter.inv_t > 0.0 && x.filter.top_k > 0 && x.filter.top_k < n);
    let top_p = rows.iter().any(|x| x.filter.inv_t > 0.0 && x.filter.top_p.is_some());
    let hist = fatbin::sample::SAMPLE.func(&dev, "sample_hist")?;
    let mut passes = vec![(0i32, 0i32)];
    if top_k {
        passes.extend((1..DIGITS as i32).map(|d| (0, d)));
    }
    if top_p {
        passes.extend((0..DIGITS as i32).map(|d| (1, d)));
    }
    for (stage, digit) in passes {
        let mut b = Launch::new(&stream, &hist);
        b.ptr(&y).val(n32).val(chunk32).ptr(&params);
        b.ptr_mut(&mut rowmax).ptr_mut(&mut cnt).ptr_mut(&mut mass).val(stage).val(digit);
        // SAFETY: matches the kernel's signature; blocks stay inside their row. It waits (PDL)
        // before anything else: each pass reads what the one before wrote.
        unsafe { b.launch(grid) }?;
    }
    // SAFETY (both): sample_draw writes every partial.
    let mut part_v = unsafe { dev.alloc::<f32>(r * parts)? };
    let mut part_i = unsafe { dev.alloc::<i32>(r * parts)? };
    let mut kept = if mask { Some(stream.alloc_zeros::<u8>(r * n).w()?) } else { None };
    let draw = fatbin::sample::SAMPLE.func(&dev, "sample_draw")?;
    let mut b = Launch::new(&stream, &draw);
    b.ptr(&y).val(n32).val(chunk32).val(parts32).ptr(&params);
    b.ptr(&rowmax).ptr(&cnt).ptr(&mass).ptr_mut(&mut part_v).ptr_mut(&mut part_i);
    match &mut kept {
        Some(k) => b.ptr_mut(k),
        None => b.null(),
    };
    // SAFETY: as above.
    unsafe { b.launch(grid) }?;
    drop(b);
    if let Some(k) = kept {
        return Ok((
            CudaStorage { slice: CudaStorageSlice::U8(k), device: dev },
            Shape::from((r, n)),
        ));
    }
    let out = launch_final(&dev, &part_v, &part_i, parts, r)?;
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev }, Shape::from(r)))
}

/// The top-k-first sampler (`sample_topk.cu`): every sampling row has a top-k of at most
/// [`super::TOPK_MAX`] ([`topk_first`]). The penalties are applied inside its first kernel.
fn launch_topk(
    rows: &[RowSampling],
    mask: bool,
    x: &CudaView<f32>,
    n: usize,
    params: &candle_core::cuda_backend::cudarc::driver::CudaSlice<u32>,
    penalties: usize,
    dev: &candle_core::CudaDevice,
) -> Result<(CudaStorage, Shape)> {
    let stream = dev.cuda_stream();
    let r = rows.len();
    let parts = n.div_ceil(TOPK_CHUNK);
    let k_stride = rows
        .iter()
        .filter(|x| x.filter.inv_t > 0.0)
        .map(|x| x.filter.top_k)
        .max()
        .unwrap_or(0)
        .max(1);
    let (n32, parts32, rows32) = (int(n, "logits")?, int(parts, "parts")?, int(r, "rows")?);
    let (pen32, stride32) = (int(penalties, "penalties")?, int(k_stride, "top-k")?);
    // SAFETY (all): sample_topk_local writes every part's argmax, and for each top-k row its
    // threshold, tie count and all k_stride candidate slots; sample_topk_draw reads the tie
    // lists only of parts whose tie count says they were written.
    let mut part_v = unsafe { dev.alloc::<f32>(r * parts)? };
    let mut part_i = unsafe { dev.alloc::<i32>(r * parts)? };
    let mut part_kth = unsafe { dev.alloc::<u32>(r * parts)? };
    let mut part_ties = unsafe { dev.alloc::<u32>(r * parts)? };
    let mut cand_key = unsafe { dev.alloc::<u32>(r * parts * k_stride)? };
    let mut cand_idx = unsafe { dev.alloc::<i32>(r * parts * k_stride)? };
    // Offsets in the chunk (u16: CHUNK is 4,096).
    let mut ties = unsafe { dev.alloc::<u16>(r * parts * TOPK_CHUNK)? };
    let local = fatbin::sample::SAMPLE_TOPK.func(dev, "sample_topk_local")?;
    let mut b = Launch::new(&stream, &local);
    b.ptr(x).val(n32).val(parts32).ptr(params).val(rows32).val(pen32).val(stride32);
    b.ptr_mut(&mut part_v).ptr_mut(&mut part_i).ptr_mut(&mut part_kth).ptr_mut(&mut part_ties);
    b.ptr_mut(&mut cand_key).ptr_mut(&mut cand_idx).ptr_mut(&mut ties);
    let cfg = LaunchConfig {
        grid_dim: (parts as u32, r as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches the kernel's signature; blocks stay inside their row and part. It waits
    // (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let mut kept = if mask { Some(stream.alloc_zeros::<u8>(r * n).w()?) } else { None };
    let mut out = unsafe { dev.alloc::<u32>(r)? }; // SAFETY: one id per row, unless mask
    let draw = fatbin::sample::SAMPLE_TOPK.func(dev, "sample_topk_draw")?;
    let mut b = Launch::new(&stream, &draw);
    b.val(n32).val(parts32).ptr(params).val(stride32);
    b.ptr(&part_v).ptr(&part_i).ptr(&part_kth).ptr(&part_ties);
    b.ptr(&cand_key).ptr(&cand_idx).ptr(&ties).ptr_mut(&mut out);
    match &mut kept {
        Some(k) => b.ptr_mut(k),
        None => b.null(),
    };
    let cfg = LaunchConfig {
        grid_dim: (r as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches the kernel's signature; one block per row reads that row's outputs above.
    // It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok(match kept {
        Some(k) => (
            CudaStorage { slice: CudaStorageSlice::U8(k), device: dev.clone() },
            Shape::from((r, n)),
        ),
        None => {
            (CudaStorage { slice: CudaStorageSlice::U32(out), device: dev.clone() }, Shape::from(r))
        }
    })
}
