//! Random weights for a Gemma 3 config, made on the device (`--dummy-weights`): benchmarks of
//! large shapes without downloading them.

use candle_core::{DType, Device, Tensor};

use super::config::Gemma3Config;
use super::model::{Fused, Layer, Weights};
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::random::normal;

/// Norms are `1 + w` with `w` = 0; the products that add to the residual stream (o and down)
/// are 4x smaller, as in the other architectures' random weights, so the random network is not
/// chaotic.
pub fn random_weights(
    cfg: &Gemma3Config,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let lin = |out: usize, inp: usize, std: f32| -> anyhow::Result<Linear> {
        Ok(Linear::Dense { weight: normal(&[out, inp], std, dtype, device)?, bias: None })
    };
    let ones = |n: usize| Tensor::ones(n, DType::F32, device);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for _ in 0..cfg.num_layers {
        layers.push(Layer {
            input_norm: ones(h)?,
            post_attn_norm: ones(h)?,
            pre_ffn_norm: ones(h)?,
            post_ffn_norm: ones(h)?,
            q_norm: ones(d)?,
            k_norm: ones(d)?,
            qkv: Fused::One(lin(qd + 2 * kvd, h, 0.02)?),
            o: lin(h, qd, 0.005)?,
            gate_up: Fused::One(lin(2 * i, h, 0.02)?),
            down: lin(h, i, 0.005)?,
        });
    }
    let embed = normal(&[cfg.vocab_size, h], 0.02, dtype, device)?;
    let lm_head = match cfg.tie_word_embeddings {
        true => Linear::Dense { weight: embed.clone(), bias: None },
        false => lin(cfg.vocab_size, h, 0.02)?,
    };
    Ok(Weights {
        embed: Embedding::whole(embed),
        embed_dtype: dtype,
        layers,
        head: Head { norm: ones(h)?, lm_head, eps: cfg.rms_norm_eps },
    })
}
