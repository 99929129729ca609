//! Random gpt-oss weights created on the device (`inferno bench --dummy-weights`): the exact
//! shapes and dtypes of a real checkpoint, MXFP4 experts included, without downloading it.

use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::model::{Attention, Layer, Weights};
use crate::kernels::Mxfp4Experts;
use crate::models::head::Head;
use crate::models::linear::Linear;

pub fn random_weights(
    cfg: &GptOssConfig,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (h, i, e) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let dense = |out: usize, inp: usize| -> candle_core::Result<Linear> {
        Ok(Linear::Dense {
            weight: Tensor::randn(0f32, (inp as f32).powf(-0.5), (out, inp), device)?
                .to_dtype(dtype)?,
            bias: Some(Tensor::randn(0f32, 0.02, out, device)?.to_dtype(dtype)?),
        })
    };
    // Uniform random bytes for the FP4 codes, scales near 2^-4.
    let bytes = |shape: &[usize], lo: f64, hi: f64| -> candle_core::Result<Tensor> {
        Tensor::rand(lo as f32, hi as f32, shape, device)?.floor()?.to_dtype(DType::U8)
    };
    let ones = |n: usize| Tensor::ones(n, DType::F32, device);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for _ in 0..cfg.num_layers {
        let experts = Mxfp4Experts::new(
            &bytes(&[e, 2 * i, h / 32, 16], 0.0, 256.0)?,
            &bytes(&[e, 2 * i, h / 32], 119.0, 124.0)?,
            &Tensor::randn(0f32, 0.02, (e, 2 * i), device)?,
            &bytes(&[e, h, i / 32, 16], 0.0, 256.0)?,
            &bytes(&[e, h, i / 32], 119.0, 124.0)?,
            &Tensor::randn(0f32, 0.02, (e, h), device)?,
        )?;
        layers.push(Layer {
            attn_norm: ones(h)?,
            attn: Attention::new(
                dense(qd, h)?,
                dense(kvd, h)?,
                dense(kvd, h)?,
                dense(h, qd)?,
                Tensor::randn(0f32, 1.0, cfg.num_heads, device)?,
            )?,
            mlp_norm: ones(h)?,
            router_w: Tensor::randn(0f32, (h as f32).powf(-0.5), (e, h), device)?,
            router_b: Tensor::zeros(e, DType::F32, device)?,
            experts,
        });
    }
    let embed = Tensor::randn(0f32, 1.0, (cfg.vocab_size, h), device)?.to_dtype(dtype)?;
    // Tied like a checkpoint would be, so the memory plan's count holds for both.
    let lm_head = Linear::Dense {
        weight: if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            Tensor::randn(0f32, (h as f32).powf(-0.5), (cfg.vocab_size, h), device)?
                .to_dtype(dtype)?
        },
        bias: None,
    };
    Ok(Weights { embed, layers, head: Head { norm: ones(h)?, lm_head, eps: cfg.rms_norm_eps } })
}
