//! The launch of `token_mask.cu`.

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{CudaStorage, Layout, Result, Shape};

use crate::kernels::cuda::{fatbin, int};
use crate::kernels::launch::Launch;

/// Threads per block; each writes 4 tokens of its row.
const THREADS: u32 = 256;

pub(super) fn launch(
    (ls, ll): (&CudaStorage, &Layout),
    (ws, wl): (&CudaStorage, &Layout),
    (bs, bl): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = ls.device.clone();
    let (rows, vocab) = ll.shape().dims2()?;
    let words = bl.shape().dims2()?.1;
    let logits = ls.as_cuda_slice::<f32>()?.slice(ll.start_offset()..);
    let which = ws.as_cuda_slice::<i32>()?.slice(wl.start_offset()..);
    let bits = bs.as_cuda_slice::<u32>()?.slice(bl.start_offset()..);
    // SAFETY: every element is written by the thread of its 4 tokens.
    let mut out = unsafe { dev.alloc::<f32>(rows * vocab)? };
    if rows > 0 && vocab > 0 {
        let func = fatbin::token_mask::TOKEN_MASK.func(&dev, "token_mask")?;
        let stream = dev.cuda_stream();
        let chunks = vocab.div_ceil(4 * THREADS as usize);
        let cfg = LaunchConfig {
            grid_dim: (int(rows, "rows")? as u32, int(chunks, "chunks")? as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = Launch::new(&stream, &func);
        b.ptr(&logits).ptr(&which).ptr(&bits).ptr_mut(&mut out);
        b.val(int(vocab, "vocab")?).val(int(words, "words")?);
        // SAFETY: the arguments match the kernel's signature; the inputs are contiguous
        // (mod.rs), `which` has a value per row and names a mask of `bits` or -1 (the caller's
        // contract, checked on the host by engine::constraint).
        unsafe { b.launch(cfg) }?;
    }
    let slice = candle_core::cuda_backend::CudaStorageSlice::F32(out);
    Ok((CudaStorage { slice, device: dev }, Shape::from((rows, vocab))))
}
