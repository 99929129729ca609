//! Loading a gpt-oss checkpoint in the HF layout (docs/gpt-oss.md §2): shards through
//! `model.safetensors.index.json` (zero-based `model-00000-of-00002` naming, resolved by the
//! index, never guessed), MXFP4 expert blocks/scales kept packed as u8 on the device, biases,
//! norms, sinks and router in f32, attention and embeddings in the compute dtype
//! ([`memory::stored_dtype`], which the memory plan uses too).

use std::path::Path;

use anyhow::Context;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::memory;
use super::model::{Attention, GptOss, Layer, Weights};
use crate::error::{ErrorKind, fail};
use crate::kernels::Mxfp4Experts;
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;

struct Reader<'a> {
    st: MmapedSafetensors,
    device: &'a Device,
    /// The compute dtype.
    dtype: DType,
}

impl Reader<'_> {
    /// Tensor `name` with the expected shape, on the device, in the dtype it is kept in.
    fn get(&self, name: &str, shape: &[usize]) -> anyhow::Result<Tensor> {
        let t = self
            .st
            .load(name, self.device)
            .map_err(|e| fail(ErrorKind::Integrity, format!("checkpoint tensor {name}: {e}")))?;
        if t.dims() != shape {
            return Err(fail(
                ErrorKind::Integrity,
                format!("tensor {name} has shape {:?}, expected {shape:?}", t.dims()),
            ));
        }
        Ok(match memory::stored_dtype(name, self.dtype) {
            Some(d) => t.to_dtype(d)?,
            None => t,
        })
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize) -> anyhow::Result<Linear> {
        Ok(Linear::Dense {
            weight: self.get(&format!("{prefix}.weight"), &[out, inp])?,
            bias: Some(self.get(&format!("{prefix}.bias"), &[out])?),
        })
    }
}

pub fn load(dir: &Path, dtype: DType, context: usize, device: &Device) -> anyhow::Result<GptOss> {
    let text = std::fs::read_to_string(dir.join("config.json"))
        .with_context(|| format!("reading {}/config.json", dir.display()))?;
    let cfg = GptOssConfig::from_hf_json(&text)?;
    let files = crate::models::checkpoint::safetensors_files(dir)?;
    // SAFETY: read-only maps of files the cache never rewrites in place.
    let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
        fail(
            ErrorKind::Integrity,
            format!("opening the safetensors files in {}: {e}", dir.display()),
        )
    })?;
    let r = Reader { st, device, dtype };
    let weights = read_weights(&r, &cfg)?;
    GptOss::new(cfg, weights, context, dtype, device)
}

fn read_weights(r: &Reader, cfg: &GptOssConfig) -> anyhow::Result<Weights> {
    let (h, i, e) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let p = format!("model.layers.{n}");
        let a = format!("{p}.self_attn");
        let m = format!("{p}.mlp");
        let x = format!("{m}.experts");
        layers.push(Layer {
            attn_norm: r.get(&format!("{p}.input_layernorm.weight"), &[h])?,
            attn: Attention::new(
                r.linear(&format!("{a}.q_proj"), qd, h)?,
                r.linear(&format!("{a}.k_proj"), kvd, h)?,
                r.linear(&format!("{a}.v_proj"), kvd, h)?,
                r.linear(&format!("{a}.o_proj"), h, qd)?,
                r.get(&format!("{a}.sinks"), &[cfg.num_heads])?,
            )?,
            mlp_norm: r.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            router_w: r.get(&format!("{m}.router.weight"), &[e, h])?,
            router_b: r.get(&format!("{m}.router.bias"), &[e])?,
            experts: Mxfp4Experts::new(
                &r.get(&format!("{x}.gate_up_proj_blocks"), &[e, 2 * i, h / 32, 16])?,
                &r.get(&format!("{x}.gate_up_proj_scales"), &[e, 2 * i, h / 32])?,
                &r.get(&format!("{x}.gate_up_proj_bias"), &[e, 2 * i])?,
                &r.get(&format!("{x}.down_proj_blocks"), &[e, h, i / 32, 16])?,
                &r.get(&format!("{x}.down_proj_scales"), &[e, h, i / 32])?,
                &r.get(&format!("{x}.down_proj_bias"), &[e, h])?,
            )?,
        });
    }
    let embed = r.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::Dense { weight: embed.clone(), bias: None }
    } else {
        Linear::Dense { weight: r.get("lm_head.weight", &[cfg.vocab_size, h])?, bias: None }
    };
    let head = Head { norm: r.get("model.norm.weight", &[h])?, lm_head, eps: cfg.rms_norm_eps };
    Ok(Weights { embed: Embedding::whole(embed), layers, head })
}
