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

/// The stream the copies run on, created on first use.
#[derive(Default)]
pub struct ReadbackStream {
    #[cfg(feature = "cuda")]
    stream: Option<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>>,
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
                let candle_core::Device::Cuda(dev) = ids.device() else {
                    anyhow::bail!("readback: ids left the GPU")
                };
                let side = match &rs.stream {
                    Some(s) => s.clone(),
                    None => {
                        let s = dev.cuda_stream().context().new_stream()?;
                        rs.stream = Some(s.clone());
                        s
                    }
                };
                side.wait(&done)?;
                let ids = ids.contiguous()?;
                let (storage, layout) = ids.storage_and_layout();
                let Storage::Cuda(s) = &*storage else {
                    anyhow::bail!("readback: ids not on the GPU")
                };
                let n = layout.shape().elem_count();
                let src = s.as_cuda_slice::<u32>()?;
                let src = src.slice(layout.start_offset()..layout.start_offset() + n);
                // Into pageable memory: returns once copied; the sync makes that explicit.
                let host = side.clone_dtoh(&src)?;
                side.synchronize()?;
                Ok(host)
            }
        }
    }
}
