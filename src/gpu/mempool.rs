//! What the device's memory pool does with the memory that steps free.
//!
//! candle allocates with `cuMemAllocAsync` from the device's memory pool. Its default release
//! threshold of 0 gives everything unused back to the driver at each synchronize, and every step
//! synchronizes: each step mapped its memory again, and between two steps another process could
//! take that memory, so that a step failed for want of memory its predecessor had. So the pool
//! keeps what is freed ([`keep_freed`]), as PyTorch's caching allocator keeps its blocks: a
//! process holds the peak of the steps it has run, and a step of a shape that has run before
//! needs nothing from the driver.
//!
//! Memory the pool keeps is free to `cuMemAllocAsync` alone. Whatever measures or takes free
//! memory otherwise gives it back first ([`trim`]): the memory plans (`gpu::available`) and the
//! capture arena's plain allocations (`gpu/arena.rs`).

use candle_core::cuda_backend::cudarc::driver::{CudaContext, result, sys};

/// Makes the pool of `context`'s device keep the memory freed into it.
pub fn keep_freed(context: &CudaContext) -> anyhow::Result<()> {
    let mut threshold = u64::MAX;
    // SAFETY: the pool is the device's current one; the attribute's value is a u64.
    unsafe {
        let pool = result::device::get_mem_pool(context.cu_device())?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )?;
    }
    Ok(())
}

/// Gives the memory the pool keeps unused back to the driver, once the work queued before has
/// run (memory freed in stream order is the pool's only then).
pub fn trim(context: &CudaContext) -> anyhow::Result<()> {
    context.synchronize()?;
    // SAFETY: the pool is the device's current one.
    unsafe {
        let pool = result::device::get_mem_pool(context.cu_device())?;
        result::mem_pool::trim_to(pool, 0)?;
    }
    Ok(())
}
