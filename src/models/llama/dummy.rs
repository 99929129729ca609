//! Random weights for a Llama config, created directly on the device (like vLLM's
//! `--load-format dummy`): benchmarks of large shapes without downloading them.

use candle_core::{DType, Device, Tensor};

use super::config::LlamaConfig;
use super::model::{Layer, Weights};
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::random::normal;
use crate::quant::QuantLinear;

pub fn random_weights(cfg: &LlamaConfig, dtype: DType, device: &Device) -> anyhow::Result<Weights> {
    let t = |(rows, cols): (usize, usize)| normal(&[rows, cols], 0.02, dtype, device);
    // What each layer adds to the residual stream is 4x smaller (the o and down projections),
    // as in the gpt-oss dummy weights: random networks with full-size updates are chaotic, and
    // bf16 comparisons on them measure the chaos, not the implementation.
    // A quantized layout (a config with a compressed-tensors `quantization_config`) gets
    // random codes for the projections its scheme covers.
    let seed = std::cell::Cell::new(0u64);
    let proj =
        |name: String, out: usize, inp: usize, bias: bool, std: f32| -> anyhow::Result<Linear> {
            let bias = if bias { Some(Tensor::zeros(out, dtype, device)?) } else { None };
            if let Some(scheme) = cfg.quant.as_ref().and_then(|q| q.scheme_for(&name)) {
                seed.set(seed.get() + 1);
                let q = QuantLinear::random(scheme, (out, inp), std, seed.get(), device)?;
                return Ok(Linear::Ct { weight: std::sync::Arc::new(q), bias });
            }
            let weight = normal(&[out, inp], std, dtype, device)?;
            Ok(Linear::Dense { weight, bias })
        };
    let damped =
        |name: String, out: usize, inp: usize, bias: bool| proj(name, out, inp, bias, 0.005);
    let ones = |n: usize| Tensor::ones(n, DType::F32, device);
    let lin = |name: String, out: usize, inp: usize, bias: bool| proj(name, out, inp, bias, 0.02);
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let a = |p: &str| format!("model.layers.{n}.self_attn.{p}");
        let m = |p: &str| format!("model.layers.{n}.mlp.{p}");
        let (ab, mb) = (cfg.attention_bias, cfg.mlp_bias);
        layers.push(
            Layer {
                attn_norm: ones(h)?,
                q: lin(a("q_proj"), qd, h, ab)?,
                k: lin(a("k_proj"), kvd, h, ab)?,
                qk_norm: match cfg.variant.qk_norm {
                    true => Some((ones(cfg.head_dim)?, ones(cfg.head_dim)?)),
                    false => None,
                },
                v: lin(a("v_proj"), kvd, h, ab)?,
                o: damped(a("o_proj"), h, qd, ab)?,
                mlp_norm: ones(h)?,
                gate: lin(m("gate_proj"), i, h, mb)?,
                up: lin(m("up_proj"), i, h, mb)?,
                down: damped(m("down_proj"), h, i, mb)?,
                fused: Default::default(),
            }
            .fuse()?,
        );
    }
    let embed = t((cfg.vocab_size, h))?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::Dense { weight: embed.clone(), bias: None }
    } else {
        lin("lm_head".into(), cfg.vocab_size, h, false)?
    };
    Ok(Weights {
        embed: Embedding::whole(embed),
        layers,
        head: Head { norm: ones(h)?, lm_head, eps: cfg.rms_norm_eps },
    })
}
