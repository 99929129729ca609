//! The launches of `sample.cu` (its header comment lists them).

use candle_core::cuda_backend::cudarc::driver::{
    CudaStream, CudaView, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaStorage, Layout, Result, Shape};

use super::{RowSampling, pack};
use crate::kernels::cuda::{SAMPLE_PTX, int, upload};

const THREADS: u32 = 256;
const BUCKETS: usize = 256;
const DIGITS: usize = 4;
/// Blocks per launch to aim for: two per SM of an H100.
const BLOCKS: usize = 264;
/// Fewest logits per block (a block also re-derives its row's thresholds: a scan or two).
const MIN_CHUNK: usize = 1024;
/// Most logits per block (many rows: more blocks rather than long loops).
const MAX_CHUNK: usize = 4096;

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
    let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    let parts = BLOCKS.div_ceil(r).max(n.div_ceil(MAX_CHUNK)).min(n.div_ceil(MIN_CHUNK)).max(1);
    let chunk = n.div_ceil(parts);
    let parts = n.div_ceil(chunk);
    let (n32, chunk32, parts32) = (int(n, "logits")?, int(chunk, "chunk")?, int(parts, "parts")?);
    int(r * n, "logits")?;
    let (words, penalties) = pack(rows, n);
    let params = upload(&dev, &words)?;
    let count = int(penalties, "penalties")?;
    // The penalties go into a scratch copy (written by the first pass): logprobs and the caller
    // read the logits as they are.
    // SAFETY: the first pass writes every element before any later pass reads it.
    let mut scratch = if penalties > 0 { Some(unsafe { dev.alloc::<f32>(r * n)? }) } else { None };
    // One zeroed workspace: per row top-p's histograms and each stage's derived state (f64,
    // sample.cu `MASS_ROW`), then the u32 words: row maxima, finished-block counts, histograms.
    let mass_len = r * (DIGITS * BUCKETS + 2 * DIGITS * 3);
    let words_len = r * (2 + 2 * DIGITS * BUCKETS);
    let ws = stream.alloc_zeros::<f64>(mass_len + words_len.div_ceil(2)).w()?;
    let mass = ws.slice(0..mass_len);
    let u32s = ws.slice(mass_len..);
    // The u32 regions, as byte offsets of the f64 view (the kernels take plain pointers).
    let (rowmax, done, cnt) =
        (u32s.slice(0..), offset(&u32s, &stream, r), offset(&u32s, &stream, 2 * r));
    let grid = LaunchConfig {
        grid_dim: (parts as u32, r as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let top_k =
        rows.iter().any(|x| x.filter.inv_t > 0.0 && x.filter.top_k > 0 && x.filter.top_k < n);
    let top_p = rows.iter().any(|x| x.filter.inv_t > 0.0 && x.filter.top_p.is_some());
    let hist = dev.get_or_load_custom_func("sample_hist", "inferno_sample", SAMPLE_PTX)?;
    let mut passes = vec![(0i32, 0i32)];
    if top_k {
        passes.extend((1..DIGITS as i32).map(|d| (0, d)));
    }
    if top_p {
        passes.extend((0..DIGITS as i32).map(|d| (1, d)));
    }
    let null = 0u64;
    for (stage, digit) in passes {
        let mut b = hist.builder();
        match (&mut scratch, stage + digit) {
            (Some(y), 0) => b.arg(&x).arg(y),
            (Some(y), _) => b.arg(&*y).arg(&null),
            (None, _) => b.arg(&x).arg(&null),
        };
        b.arg(&n32).arg(&chunk32).arg(&params).arg(&count);
        b.arg(&rowmax).arg(&cnt).arg(&mass).arg(&stage).arg(&digit);
        // SAFETY: matches the kernel's signature; blocks stay inside their row.
        unsafe { b.launch(grid) }.w()?;
    }
    // SAFETY (all three): sample_draw writes every partial and every id.
    let part_v = unsafe { dev.alloc::<f32>(r * parts)? };
    let part_i = unsafe { dev.alloc::<i32>(r * parts)? };
    let mut out = unsafe { dev.alloc::<u32>(r)? };
    let mut kept = if mask { Some(stream.alloc_zeros::<u8>(r * n).w()?) } else { None };
    let draw = dev.get_or_load_custom_func("sample_draw", "inferno_sample", SAMPLE_PTX)?;
    let mut b = draw.builder();
    match &scratch {
        Some(y) => b.arg(y),
        None => b.arg(&x),
    };
    b.arg(&n32).arg(&chunk32).arg(&parts32).arg(&params);
    b.arg(&rowmax).arg(&cnt).arg(&mass).arg(&part_v).arg(&part_i).arg(&done).arg(&mut out);
    match &mut kept {
        Some(k) => b.arg(k),
        None => b.arg(&null),
    };
    // SAFETY: as above.
    unsafe { b.launch(grid) }.w()?;
    if let Some(k) = kept {
        return Ok((
            CudaStorage { slice: CudaStorageSlice::U8(k), device: dev },
            Shape::from((r, n)),
        ));
    }
    Ok((CudaStorage { slice: CudaStorageSlice::U32(out), device: dev }, Shape::from(r)))
}

/// The device address `words` u32 words into `view` (an f64 view used as u32 words).
fn offset(view: &CudaView<f64>, stream: &CudaStream, words: usize) -> u64 {
    let (ptr, _sync) = view.device_ptr(stream);
    ptr + 4 * words as u64
}
