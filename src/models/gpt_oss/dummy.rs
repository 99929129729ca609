//! Random gpt-oss weights created on the device (`inferno bench --dummy-weights`): the exact
//! shapes and dtypes of a real checkpoint, MXFP4 experts included, without downloading it.

use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::model::{Attention, Layer, Weights};
use crate::kernels::Mxfp4Experts;
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::random::{bytes, normal};

pub fn random_weights(
    cfg: &GptOssConfig,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (h, i, e) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    // Scaled as scripts/fixtures/gpt_oss_20b_random.py scales its checkpoint (see there): each
    // layer adds a quarter-size update to the residual stream, so the network is not chaotic and
    // a rounding difference stays a rounding difference (bf16 comparisons mean something).
    let damp = 0.25f32;
    let dense = |out: usize, inp: usize, std: f32, bias_std: f32| -> candle_core::Result<Linear> {
        Ok(Linear::Dense {
            weight: normal(&[out, inp], std, dtype, device)?,
            // f32, as load.rs keeps biases.
            bias: Some(Tensor::randn(0f32, bias_std, out, device)?),
        })
    };
    let proj = |out: usize, inp: usize| dense(out, inp, (inp as f32).powf(-0.5), 0.05);
    // Uniform random bytes for the FP4 codes, scales near 2^-4.
    let bytes = |shape: &[usize], lo: f32, hi: f32| bytes(shape, lo, hi, device);
    let ones = |n: usize| Tensor::ones(n, DType::F32, device);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for _ in 0..cfg.num_layers {
        let experts = Mxfp4Experts::new(
            &bytes(&[e, 2 * i, h / 32, 16], 0.0, 256.0)?,
            &bytes(&[e, 2 * i, h / 32], 116.0, 121.0)?,
            &Tensor::randn(0f32, 0.05, (e, 2 * i), device)?,
            &bytes(&[e, h, i / 32, 16], 0.0, 256.0)?,
            &bytes(&[e, h, i / 32], 114.0, 119.0)?,
            &Tensor::randn(0f32, damp * 0.05, (e, h), device)?,
        )?;
        layers.push(Layer {
            attn_norm: ones(h)?,
            attn: Attention::new(
                proj(qd, h)?,
                proj(kvd, h)?,
                proj(kvd, h)?,
                dense(h, qd, damp * 0.25 * (qd as f32).powf(-0.5), damp * 0.05)?,
                Tensor::randn(0f32, 1.0, cfg.num_heads, device)?,
            )?,
            mlp_norm: ones(h)?,
            router_w: Tensor::randn(0f32, (h as f32).powf(-0.5), (e, h), device)?,
            router_b: Tensor::randn(0f32, 0.1, e, device)?,
            experts,
        });
    }
    let embed = normal(&[cfg.vocab_size, h], 1.0, dtype, device)?;
    // Tied like a checkpoint would be, so the memory plan's count holds for both.
    let lm_head = Linear::Dense {
        weight: if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            normal(&[cfg.vocab_size, h], (h as f32).powf(-0.5), dtype, device)?
        },
        bias: None,
    };
    Ok(Weights {
        embed: Embedding::whole(embed),
        layers,
        head: Head { norm: ones(h)?, lm_head, eps: cfg.rms_norm_eps },
    })
}
