//! gpt-oss decode steps replayed as a CUDA graph.
//!
//! A decode step is ~1000 small kernels; launched one by one from the host they cost more than
//! the GPU spends on them. So the step is captured once into a CUDA graph (candle 0.11 and
//! cudarc support stream capture) and replayed with one launch per token. For that nothing a
//! launch takes may depend on the token or the position: both live in a device tensor `step`
//! (i64 `[token, position]`) that the host writes before each replay, and the step reads them
//! there (the embedding row by `index_select`, RoPE and the KV writes in
//! [`crate::kernels::qkv_rope_store`], attention in [`crate::kernels::sink_attention_at`]). The logits land
//! in a fixed buffer. Intermediate tensors are allocated and freed inside the graph
//! (stream-ordered allocations), and candle's upload cache keeps the few dims/strides uploads
//! at fixed addresses.
//!
//! Life cycle: the first decode step runs eagerly (loading kernels, initialising cuBLAS and
//! filling the upload cache, none of which may happen during a capture); the second is captured
//! and then launched; later ones are launched. If a capture fails, decode goes on eagerly
//! through the same device-position step (and the reason is printed once). Reallocating the KV
//! caches makes a new [`DecodeGraph`]. `INFERNO_CUDA_GRAPH=0` (or
//! [`GptOss::set_decode_graph`]) switches graphs off: decode steps then take the ordinary path.

use candle_core::{DType, Device, Tensor};

use super::model::GptOss;

pub struct DecodeGraph {
    /// i64 `[token, position]` for the step, written by the host before it runs.
    step: Tensor,
    /// The step's logits `[1, vocab]` (f32), written by the step.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    logits: Tensor,
    state: State,
}

enum State {
    /// No step has run: the next one runs eagerly.
    Cold,
    /// One eager step ran: the next one is captured.
    Warm,
    #[cfg(feature = "cuda")]
    Ready(candle_core::cuda_backend::cudarc::driver::CudaGraph),
    /// Capturing failed: steps run eagerly.
    Eager,
}

impl DecodeGraph {
    /// For a model on `device` (None on the CPU: nothing to gain there).
    pub fn new(device: &Device, vocab: usize) -> anyhow::Result<Option<DecodeGraph>> {
        if !device.is_cuda() || std::env::var("INFERNO_CUDA_GRAPH").is_ok_and(|v| v == "0") {
            return Ok(None);
        }
        let state = State::Cold;
        let step = Tensor::zeros(2, DType::I64, device)?;
        let logits = Tensor::zeros((1, vocab), DType::F32, device)?;
        Ok(Some(DecodeGraph { step, logits, state }))
    }

    /// Logits `[vocab]` of `token` at position `start`, appending to the model's KV caches.
    pub fn step(&mut self, model: &mut GptOss, token: u32, start: usize) -> anyhow::Result<Tensor> {
        // The kernels cannot report a position past a linear cache: refuse it here.
        anyhow::ensure!(
            start < model.cache_positions(),
            "context full: position {start} of {}",
            model.cache_positions()
        );
        let host = Tensor::new(&[i64::from(token), start as i64], model.device())?;
        self.step.slice_set(&host, 0, 0)?;
        match &self.state {
            State::Cold | State::Eager => {
                let logits = model.step_at_device_position(&self.step)?;
                if matches!(self.state, State::Cold) {
                    self.state = State::Warm;
                }
                return Ok(logits.squeeze(0)?);
            }
            State::Warm => self.capture(model)?,
            #[cfg(feature = "cuda")]
            State::Ready(_) => {}
        }
        self.replay(model)
    }

    /// Runs the captured graph, or (when capturing failed) the step eagerly.
    fn replay(&mut self, model: &mut GptOss) -> anyhow::Result<Tensor> {
        match &self.state {
            #[cfg(feature = "cuda")]
            State::Ready(graph) => {
                use candle_core::cuda_backend::WrapErr;
                graph.launch().w()?;
                // A copy: the next replay overwrites the buffer.
                Ok(self.logits.squeeze(0)?.copy()?)
            }
            _ => Ok(model.step_at_device_position(&self.step)?.squeeze(0)?),
        }
    }

    #[cfg(feature = "cuda")]
    fn capture(&mut self, model: &mut GptOss) -> anyhow::Result<()> {
        use candle_core::cuda_backend::cudarc::driver::sys::{
            CUgraphInstantiate_flags, CUstreamCaptureMode,
        };

        let Device::Cuda(cuda) = model.device().clone() else {
            anyhow::bail!("CUDA graphs need a CUDA device")
        };
        let stream = cuda.cuda_stream();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        // Everything the step allocates is freed before the capture ends (the graph owns those
        // allocations); only the fixed logits buffer is written.
        let recorded = model
            .step_at_device_position(&self.step)
            .and_then(|logits| Ok(self.logits.slice_set(&logits, 0, 0)?));
        // Always end the capture, or the stream stays in capture mode.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        self.state = match (recorded, graph) {
            (Ok(()), Ok(Some(graph))) => State::Ready(graph),
            (recorded, graph) => {
                let why = match (recorded, graph) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => "the capture was empty".to_string(),
                };
                eprintln!(
                    "inferno: CUDA graph capture failed ({}); decoding without graphs",
                    why.lines().next().unwrap_or("")
                );
                State::Eager
            }
        };
        Ok(())
    }

    #[cfg(not(feature = "cuda"))]
    fn capture(&mut self, _model: &mut GptOss) -> anyhow::Result<()> {
        self.state = State::Eager;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use candle_core::{D, DType, Device, Tensor};

    use crate::models::CausalLm;
    use crate::models::gpt_oss::load::load;

    /// The step a graph captures (token and position read from the device) against the ordinary
    /// host-position step, on the CPU with the tiny checkpoint (linear and ring caches): same
    /// logits at every position.
    #[test]
    fn device_position_step_matches_host_position_step() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt_oss_tiny");
        let (mut by_device, mut by_host) = (
            load(&dir, DType::F32, 64, &Device::Cpu).expect("tiny gpt-oss"),
            load(&dir, DType::F32, 64, &Device::Cpu).expect("tiny gpt-oss"),
        );
        // Chunks of 2: sliding layers get rings of window + 1 slots, which the steps wrap.
        by_device.set_prefill_chunk(2).unwrap();
        by_host.set_prefill_chunk(2).unwrap();
        let prompt = [5u32, 17, 2, 40, 33];
        let first = by_host.forward_last(&prompt, 0).unwrap();
        by_device.forward_last(&prompt, 0).unwrap();
        let mut token = first.argmax(D::Minus1).unwrap().to_scalar::<u32>().unwrap();
        for pos in prompt.len()..prompt.len() + 16 {
            let step = Tensor::new(&[i64::from(token), pos as i64], &Device::Cpu).unwrap();
            let got = by_device.step_at_device_position(&step).unwrap().squeeze(0).unwrap();
            let want = by_host.forward_last(&[token], pos).unwrap();
            let diff = (got - &want)
                .unwrap()
                .abs()
                .unwrap()
                .max(D::Minus1)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-5, "position {pos}: logits differ by {diff}");
            token = want.argmax(D::Minus1).unwrap().to_scalar::<u32>().unwrap();
        }
    }
}
