//! The launch of `embed_rows.cu`.

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig};
use candle_core::{CudaStorage, Layout, Result, Shape, bail};
use half::bf16;

use crate::kernels::cuda::{fatbin, int};
use crate::kernels::launch::Launch;

/// Threads per block (the kernel's grid takes any).
const THREADS: u32 = 128;

/// The table from its offset on, in its dtype.
enum Table<'a> {
    F32(CudaView<'a, f32>),
    Bf16(CudaView<'a, bf16>),
}

/// The lookup of `tokens` (u32 `[n]`) in `table` (`[rows, hidden]`, the vocabulary from `first`).
pub(super) fn launch(
    (ts, tl): (&CudaStorage, &Layout),
    (is, il): (&CudaStorage, &Layout),
    first: u32,
    rows: u32,
) -> Result<(CudaStorage, Shape)> {
    let dev = ts.device.clone();
    let hidden = tl.shape().dims2()?.1;
    let n = il.shape().dims1()?;
    let ids = is.as_cuda_slice::<u32>()?.slice(il.start_offset()..);
    let at = tl.start_offset();
    let (table, name) = match &ts.slice {
        CudaStorageSlice::F32(s) => (Table::F32(s.slice(at..)), "embed_rows_f32"),
        CudaStorageSlice::BF16(s) => (Table::Bf16(s.slice(at..)), "embed_rows_bf16"),
        _ => bail!("embed_rows: the table must be f32 or bf16"),
    };
    // 16-byte loads where every row starts on 16 bytes (allocations are 256-byte aligned) and
    // the stores' rows too.
    let width = match &table {
        Table::F32(_) => 4,
        Table::Bf16(_) => 8,
    };
    let vector = hidden.is_multiple_of(width) && at.is_multiple_of(width);
    let (name, per) = if vector { (format!("{name}_v{width}"), width) } else { (name.into(), 1) };
    // SAFETY: the thread of each of a row's runs of `per` values writes them.
    let mut out = unsafe { dev.alloc::<f32>(n * hidden)? };
    let func = fatbin::embed_rows::EMBED_ROWS.func(&dev, &name)?;
    let stream = dev.cuda_stream();
    let chunks = hidden.div_ceil(per * THREADS as usize);
    let cfg = LaunchConfig {
        grid_dim: (int(n, "tokens")? as u32, int(chunks, "chunks")? as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = Launch::new(&stream, &func);
    match &table {
        Table::F32(t) => b.ptr(t),
        Table::Bf16(t) => b.ptr(t),
    };
    b.ptr(&ids).ptr_mut(&mut out).val(int(hidden, "hidden")?).val(first).val(rows);
    // SAFETY: the arguments match the kernel's signature; the table is contiguous (mod.rs) and
    // a row is read only for an id below `rows`. The kernel waits (PDL) before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    let slice = CudaStorageSlice::F32(out);
    Ok((CudaStorage { slice, device: dev }, Shape::from((n, hidden))))
}
