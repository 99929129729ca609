//! The launches of `argmax.cu`: the partial reductions of every row's chunks, then one block per
//! row over its partials ([`launch_final`], which the device sampler shares).

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

use crate::kernels::cuda::{fatbin, int, upload};
use crate::kernels::launch::Launch;

/// Blocks per launch to aim for, and threads per block (`ARGMAX_THREADS` in argmax.cuh).
const BLOCKS: usize = 256;
const THREADS: u32 = 256;

/// The chunk of a row each block reduces, and the chunks a row has: about BLOCKS blocks in all,
/// at least 4 per row (one row gets 256 chunks).
fn chunking(n: usize, rows: usize) -> (usize, usize) {
    let chunk = n.div_ceil((BLOCKS / rows).max(4)).max(1);
    (chunk, n.div_ceil(chunk))
}

/// A grid of `x` × `y` blocks of THREADS.
fn grid(x: u32, y: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (x, y, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Row `r` of the f32 `[rows, n]` logits in `s` to its index, greedy or by the draw
/// `draws[r] = (1/T, seed)` (1/T = 0: greedy).
pub(super) fn launch(
    draws: Option<&[(f32, u64)]>,
    rows: usize,
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s.device.clone();
    let n = l.shape().elem_count() / rows;
    let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    let (chunk, parts) = chunking(n, rows);
    // SAFETY (both): argmax_rows_partial writes every partial.
    let mut part_v = unsafe { dev.alloc::<f32>(rows * parts)? };
    let mut part_i = unsafe { dev.alloc::<i32>(rows * parts)? };
    let (n32, chunk32, parts32) = (int(n, "logits")?, int(chunk, "chunk")?, int(parts, "parts")?);
    int(rows * parts, "partials")?;
    // Per-row seeds (two words each, first: 8-byte aligned) then 1/T on the device, in one
    // copy from pinned memory (`upload`: the launches still queue behind the decode step),
    // or null pointers (every row greedy).
    let draws = match draws {
        Some(d) => {
            let mut words: Vec<u32> =
                d.iter().flat_map(|x| [x.1 as u32, (x.1 >> 32) as u32]).collect();
            words.extend(d.iter().map(|x| x.0.to_bits()));
            Some(upload(&dev, &words)?)
        }
        None => None,
    };
    let views = draws.as_ref().map(|w| (w.slice(2 * rows..3 * rows), w.slice(0..2 * rows)));
    let func = fatbin::argmax::ARGMAX.func(&dev, "argmax_rows_partial")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&x).val(n32).val(chunk32).val(parts32);
    match &views {
        Some((inv_t, seeds)) => b.ptr(inv_t).ptr(seeds),
        None => b.null().null(),
    };
    b.ptr_mut(&mut part_v).ptr_mut(&mut part_i);
    let cfg = grid(parts as u32, rows as u32);
    // SAFETY: the arguments match the kernel's signature; blocks stay inside their row. It
    // waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let out = launch_final(&dev, &part_v, &part_i, parts, rows)?;
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev }, Shape::from(rows)))
}

/// `argmax_rows_final`: the index of the best of each row's `parts` partials (value, index)
/// `[rows, parts]`, u32 `[rows]`.
pub(crate) fn launch_final(
    dev: &CudaDevice,
    part_v: &CudaSlice<f32>,
    part_i: &CudaSlice<i32>,
    parts: usize,
    rows: usize,
) -> Result<CudaSlice<u32>> {
    // SAFETY: one block per row writes its id.
    let mut out = unsafe { dev.alloc::<u32>(rows)? };
    let func = fatbin::argmax::ARGMAX.func(dev, "argmax_rows_final")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(part_v).ptr(part_i).val(int(parts, "parts")?).ptr_mut(&mut out);
    let cfg = grid(rows as u32, 1);
    // SAFETY: the arguments match the kernel's signature; each row's block reads the `parts`
    // partials its row was given. It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok(out)
}

/// `argmax_shard_partial`: row `r`'s candidates of the f32 `[rows, n]` logits in `s` (global
/// columns from `offset`, the first `valid` real) by the draw words in `ds`, u32 `[rows, 2P]`.
pub(super) fn launch_candidates(
    rows: usize,
    (offset, valid): (usize, usize),
    s: &CudaStorage,
    l: &Layout,
    ds: &CudaStorage,
    dl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s.device.clone();
    let n = l.shape().elem_count() / rows;
    let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    let draws = ds.as_cuda_slice::<u32>()?.slice(dl.start_offset()..);
    let (chunk, parts) = chunking(n, rows);
    // SAFETY: every block writes its row's two words of its part.
    let mut cand = unsafe { dev.alloc::<u32>(rows * 2 * parts)? };
    let func = fatbin::argmax::ARGMAX.func(&dev, "argmax_shard_partial")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&x).val(int(n, "logits")?).val(int(valid, "real columns")?).val(int(offset, "offset")?);
    b.val(int(chunk, "chunk")?).val(int(parts, "parts")?).ptr(&draws).ptr_mut(&mut cand);
    let cfg = grid(parts as u32, rows as u32);
    // SAFETY: the arguments match the kernel's signature; blocks stay inside their row and the
    // draws hold 3 words a row (checked by shard_candidates). It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let out = CudaStorage { slice: CudaStorageSlice::U32(cand), device: dev };
    Ok((out, Shape::from((rows, 2 * parts))))
}

/// `argmax_shard_pick`: each row's id from every rank's candidates (u32 `[W, rows, 2P]` in `s`).
pub(super) fn launch_pick(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let dev = s.device.clone();
    let (w, rows, c) = l.shape().dims3()?;
    let all = s.as_cuda_slice::<u32>()?.slice(l.start_offset()..);
    // SAFETY: one block per row writes its id.
    let mut out = unsafe { dev.alloc::<u32>(rows)? };
    let func = fatbin::argmax::ARGMAX.func(&dev, "argmax_shard_pick")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&all).val(int(w, "ranks")?).val(int(c / 2, "parts")?).ptr_mut(&mut out);
    int(w * rows * c, "candidates")?;
    let cfg = grid(rows as u32, 1);
    // SAFETY: the arguments match the kernel's signature; row r's block reads the W · 2P words
    // of its row (the shape checked by pick_candidates). It waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev }, Shape::from(rows)))
}
