//! Random weights for a Llama config, created directly on the device (like vLLM's
//! `--load-format dummy`): benchmarks of large shapes without downloading them.

use candle_core::{DType, Device, Tensor};

use super::config::LlamaConfig;
use super::model::{Layer, Weights};
use crate::models::head::Head;
use crate::models::linear::Linear;

pub fn random_weights(
    cfg: &LlamaConfig,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Weights> {
    let t = |shape: (usize, usize)| Tensor::randn(0f32, 0.02, shape, device)?.to_dtype(dtype);
    // What each layer adds to the residual stream is 4x smaller (the o and down projections),
    // as in the gpt-oss dummy weights: random networks with full-size updates are chaotic, and
    // bf16 comparisons on them measure the chaos, not the implementation.
    let damped = |out: usize, inp: usize, bias: bool| -> candle_core::Result<Linear> {
        let bias = if bias { Some(Tensor::zeros(out, dtype, device)?) } else { None };
        let weight = Tensor::randn(0f32, 0.005, (out, inp), device)?.to_dtype(dtype)?;
        Ok(Linear::Dense { weight, bias })
    };
    let ones = |n: usize| Tensor::ones(n, DType::F32, device);
    let lin = |out: usize, inp: usize, bias: bool| -> candle_core::Result<Linear> {
        let bias = if bias { Some(Tensor::zeros(out, dtype, device)?) } else { None };
        Ok(Linear::Dense { weight: t((out, inp))?, bias })
    };
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for _ in 0..cfg.num_layers {
        layers.push(Layer {
            attn_norm: ones(h)?,
            q: lin(qd, h, cfg.attention_bias)?,
            k: lin(kvd, h, cfg.attention_bias)?,
            v: lin(kvd, h, cfg.attention_bias)?,
            o: damped(h, qd, cfg.attention_bias)?,
            mlp_norm: ones(h)?,
            gate: lin(i, h, cfg.mlp_bias)?,
            up: lin(i, h, cfg.mlp_bias)?,
            down: damped(h, i, cfg.mlp_bias)?,
        });
    }
    let embed = t((cfg.vocab_size, h))?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::Dense { weight: embed.clone(), bias: None }
    } else {
        lin(cfg.vocab_size, h, false)?
    };
    Ok(Weights { embed, layers, head: Head { norm: ones(h)?, lm_head, eps: cfg.rms_norm_eps } })
}
