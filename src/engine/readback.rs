//! Sampled ids on their way to the host without stopping the GPU.
//!
//! A decode step ends with its ids on the device. Reading them the ordinary way (a copy on the
//! compute stream, which waits for everything enqueued before it) would wait for the step the
//! pipelined decode (core.rs) has already enqueued behind them. Here the step's end is marked
//! with an event, and the copy runs later on a stream of its own that waits for that event only:
//! it returns as soon as this step is done, while the next one runs.

use candle_core::Tensor;

/// A step's ids, readable once the step is done.
pub struct Readback {
    inner: Inner,
}

enum Inner {
    /// Read at once (a CPU tensor: nothing runs behind it).
    Ready(Vec<u32>),
    #[cfg(feature = "cuda")]
    Pending { ids: Tensor, done: candle_core::cuda_backend::cudarc::driver::CudaEvent },
}

/// The stream the copies run on, created on first use. A raw driver stream, not cudarc's: a
/// second cudarc stream switches the context to multi-stream mode, in which cudarc makes every
/// buffer's later use wait on events recorded on the stream that last touched it, and a graph
/// captured after a readback would then depend on work outside the capture
/// (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
#[derive(Default)]
pub struct ReadbackStream {
    #[cfg(feature = "cuda")]
    stream: Option<RawStream>,
}

#[cfg(feature = "cuda")]
struct RawStream(candle_core::cuda_backend::cudarc::driver::sys::CUstream);

#[cfg(feature = "cuda")]
impl RawStream {
    fn new() -> anyhow::Result<RawStream> {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let mut s = std::ptr::null_mut();
        // SAFETY: creates a stream in the current context (the engine thread's, bound by candle).
        check(unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(RawStream(s))
    }
}

#[cfg(feature = "cuda")]
impl Drop for RawStream {
    fn drop(&mut self) {
        // SAFETY: the stream is ours; its only work (a copy) was waited for.
        unsafe { candle_core::cuda_backend::cudarc::driver::sys::cuStreamDestroy_v2(self.0) };
    }
}

#[cfg(feature = "cuda")]
fn check(r: candle_core::cuda_backend::cudarc::driver::sys::CUresult) -> anyhow::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUresult;
    anyhow::ensure!(r == CUresult::CUDA_SUCCESS, "readback: {r:?}");
    Ok(())
}

impl Readback {
    /// Marks the end of the work enqueued so far on the stream of `ids` (u32 `[n]`), which
    /// holds the step's ids once it is done.
    pub fn enqueue(ids: &Tensor) -> anyhow::Result<Readback> {
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(dev) = ids.device() {
            let done = dev.cuda_stream().record_event(None)?;
            return Ok(Readback { inner: Inner::Pending { ids: ids.clone(), done } });
        }
        Ok(Readback { inner: Inner::Ready(ids.to_vec1::<u32>()?) })
    }

    /// The ids: waits for the marked work only, not for what was enqueued after it.
    pub fn wait(self, rs: &mut ReadbackStream) -> anyhow::Result<Vec<u32>> {
        #[cfg(not(feature = "cuda"))]
        let _ = rs;
        match self.inner {
            Inner::Ready(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Inner::Pending { ids, done } => {
                use candle_core::Storage;
                use candle_core::cuda_backend::cudarc::driver::{DevicePtr, sys};
                let candle_core::Device::Cuda(dev) = ids.device() else {
                    anyhow::bail!("readback: ids left the GPU")
                };
                if rs.stream.is_none() {
                    rs.stream = Some(RawStream::new()?);
                }
                let Some(side) = &rs.stream else { anyhow::bail!("readback: no stream") };
                let ids = ids.contiguous()?;
                let (storage, layout) = ids.storage_and_layout();
                let Storage::Cuda(s) = &*storage else {
                    anyhow::bail!("readback: ids not on the GPU")
                };
                let n = layout.shape().elem_count();
                let main = dev.cuda_stream();
                let (base, guard) = s.as_cuda_slice::<u32>()?.device_ptr(&main);
                drop(guard);
                let src = base + (layout.start_offset() * std::mem::size_of::<u32>()) as u64;
                let mut host = vec![0u32; n];
                // SAFETY: `side` waits for the event behind the ids' writer, then copies n u32
                // from the ids' buffer (alive: `ids` holds it) into `host`, and is synchronized
                // before `host` is read or dropped.
                unsafe {
                    check(sys::cuStreamWaitEvent(side.0, done.cu_event(), 0))?;
                    check(sys::cuMemcpyDtoHAsync_v2(
                        host.as_mut_ptr().cast(),
                        src,
                        n * std::mem::size_of::<u32>(),
                        side.0,
                    ))?;
                    check(sys::cuStreamSynchronize(side.0))?;
                }
                Ok(host)
            }
        }
    }
}
