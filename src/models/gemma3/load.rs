//! Loading Gemma 3 weights onto a device: an HF safetensors checkpoint (the 1B's `model.*`, the
//! 4B+ language model under `language_model.model.*` with its vision tensors left unread), or a
//! `gemma3` GGUF written by llama.cpp's converter.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::quantized::{GgmlDType, QMatMul, ggml_file};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::config::Gemma3Config;
use super::memory::{self, GgufKind, NORMS};
use super::model::{Fused, Gemma3, Layer, Weights};
use crate::error::{ErrorKind, fail};
use crate::models::embedding::Embedding;
use crate::models::gguf::GgufTensors;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::quant::{QuantLinear, WeightFormat};

/// The compute dtype: the one asked for, else the checkpoint's (bf16 when it says nothing or
/// says f16). f16 is refused: Gemma 3's activations overflow it (transformers issue 36822).
pub fn choose_dtype(requested: Option<DType>, checkpoint: Option<&str>) -> anyhow::Result<DType> {
    let dtype = requested.unwrap_or(match checkpoint {
        Some("float32") => DType::F32,
        _ => DType::BF16,
    });
    if dtype == DType::F16 {
        return Err(fail(
            ErrorKind::InvalidInput,
            "Gemma 3 does not run in f16 (its activations overflow it): use bf16 or f32",
        ));
    }
    Ok(dtype)
}

/// Loads an HF-format Gemma 3 checkpoint folder.
pub fn load_safetensors(
    dir: &Path,
    dtype: Option<DType>,
    context: usize,
    device: &Device,
) -> anyhow::Result<Gemma3> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let cfg = Gemma3Config::from_hf_json(&text)?;
    let dtype = choose_dtype(dtype, cfg.checkpoint_dtype.as_deref())?;
    let files = crate::models::checkpoint::safetensors_files(dir)?;
    let names = crate::models::checkpoint::file_tensors(dir)?;
    let prefix = memory::text_prefix(names.keys().map(String::as_str));
    let head = memory::head_name(prefix);
    let separate_head = !cfg.tie_word_embeddings || names.contains_key(&head);
    // SAFETY: the files are memory-mapped read-only; the HF cache layout (write to
    // .incomplete, then rename) rules out a concurrent writer.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device)? };
    let weights = checkpoint_weights(&cfg, &vb, prefix, separate_head.then_some(&head), dtype)
        .map_err(|e| fail(ErrorKind::Integrity, format!("loading weights: {e:#}")))?;
    Gemma3::new(cfg, weights, context, dtype, device)
}

/// `1 + w` in f32, the norm weight as it multiplies ([`super::model`]).
fn offset_norm(w: Tensor) -> candle_core::Result<Tensor> {
    w.to_dtype(DType::F32)? + 1.0
}

fn checkpoint_weights(
    cfg: &Gemma3Config,
    vb: &VarBuilder,
    prefix: &str,
    head: Option<&String>,
    dtype: DType,
) -> anyhow::Result<Weights> {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let m = vb.pp(prefix.trim_end_matches('.'));
    let dense = |vb: &VarBuilder, name: &str, out: usize, inp: usize| -> anyhow::Result<Linear> {
        Ok(Linear::Dense { weight: vb.get((out, inp), &format!("{name}.weight"))?, bias: None })
    };
    let norm = |vb: &VarBuilder, name: &str, n: usize| -> anyhow::Result<Tensor> {
        Ok(offset_norm(vb.get(n, &format!("{name}.weight"))?)?)
    };
    let embed = m.get((cfg.vocab_size, h), "embed_tokens.weight")?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let l = m.pp(format!("layers.{n}"));
        let (a, p) = (l.pp("self_attn"), l.pp("mlp"));
        let [input, post_attn, pre_ffn, post_ffn] = NORMS.map(|name| norm(&l, name, h));
        layers.push(Layer {
            input_norm: input?,
            post_attn_norm: post_attn?,
            pre_ffn_norm: pre_ffn?,
            post_ffn_norm: post_ffn?,
            q_norm: norm(&a, "q_norm", d)?,
            k_norm: norm(&a, "k_norm", d)?,
            qkv: Fused::new(vec![
                dense(&a, "q_proj", qd, h)?,
                dense(&a, "k_proj", kvd, h)?,
                dense(&a, "v_proj", kvd, h)?,
            ])?,
            o: dense(&a, "o_proj", h, qd)?,
            gate_up: Fused::new(vec![dense(&p, "gate_proj", i, h)?, dense(&p, "up_proj", i, h)?])?,
            down: dense(&p, "down_proj", h, i)?,
        });
    }
    let final_norm = norm(&m, "norm", h)?;
    let lm_head = match head {
        Some(name) => Linear::Dense { weight: vb.get((cfg.vocab_size, h), name)?, bias: None },
        None => Linear::Dense { weight: embed.clone(), bias: None },
    };
    Ok(Weights {
        embed: Embedding::whole(embed),
        embed_dtype: dtype,
        layers,
        head: Head { norm: final_norm, lm_head, eps: cfg.rms_norm_eps },
    })
}

/// The config of an opened `gemma3` GGUF (vocabulary from the embedding, tied without an
/// `output.weight`).
pub fn gguf_config(g: &GgufTensors) -> anyhow::Result<Gemma3Config> {
    let bad = |m: String| fail(ErrorKind::Integrity, format!("gemma3 GGUF: {m}"));
    let embd = g.info("token_embd.weight").ok_or_else(|| bad("no token_embd.weight".into()))?;
    let vocab = match embd.dims.as_slice() {
        [_, v] => usize::try_from(*v).map_err(|_| bad("token_embd.weight is too large".into()))?,
        dims => return Err(bad(format!("token_embd.weight has dims {dims:?}"))),
    };
    Gemma3Config::from_gguf(&g.metadata, vocab, g.info("output.weight").is_none())
}

/// The compute dtype of a GGUF and how its products are kept: a float file computes in the
/// dtype asked for (bf16 on a GPU, f32 on the CPU by default); Q8_0/Q4_K/Q6_K files on a GPU
/// run our own GEMVs in bf16 (unless f32 is asked for); other block formats run candle's
/// quantized matmul, f32 unless asked otherwise.
pub fn gguf_plan(
    tensors: &[crate::inspect::gguf::TensorInfo],
    requested: Option<DType>,
    on_gpu: bool,
) -> anyhow::Result<(GgufKind, DType)> {
    let kind = memory::gguf_kind(tensors, on_gpu && requested != Some(DType::F32));
    let default = match kind {
        GgufKind::Float if on_gpu => DType::BF16,
        GgufKind::OwnBlocks => DType::BF16,
        _ => DType::F32,
    };
    let dtype = choose_dtype(requested.or(Some(default)), None)?;
    Ok((kind, if kind == GgufKind::OwnBlocks { DType::BF16 } else { dtype }))
}

/// Loads a `gemma3` GGUF whose products are kept as `kind` says, computing in `dtype`
/// ([`gguf_plan`]).
pub fn load_gguf(
    path: &Path,
    (kind, dtype): (GgufKind, DType),
    context: usize,
    device: &Device,
) -> anyhow::Result<Gemma3> {
    let g = GgufTensors::open(path)?;
    let cfg = gguf_config(&g)?;
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let f32 = |name: String, n: usize| g.dense(&name, &[n], DType::F32, device);
    let product =
        |name: &str, out: usize, inp: usize| product(&g, name, (out, inp), kind, dtype, device);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let b = |s: &str| format!("blk.{n}.{s}.weight");
        layers.push(Layer {
            // The converter added 1 to every norm weight already.
            input_norm: f32(b("attn_norm"), h)?,
            post_attn_norm: f32(b("post_attention_norm"), h)?,
            pre_ffn_norm: f32(b("ffn_norm"), h)?,
            post_ffn_norm: f32(b("post_ffw_norm"), h)?,
            q_norm: f32(b("attn_q_norm"), d)?,
            k_norm: f32(b("attn_k_norm"), d)?,
            qkv: Fused::new(vec![
                product(&b("attn_q"), qd, h)?,
                product(&b("attn_k"), kvd, h)?,
                product(&b("attn_v"), kvd, h)?,
            ])?,
            o: product(&b("attn_output"), h, qd)?,
            gate_up: Fused::new(vec![
                product(&b("ffn_gate"), i, h)?,
                product(&b("ffn_up"), i, h)?,
            ])?,
            down: product(&b("ffn_down"), h, i)?,
        });
    }
    let vocab = cfg.vocab_size;
    let embed_dtype = match kind {
        GgufKind::Float | GgufKind::OwnBlocks => dtype,
        GgufKind::Candle => DType::F32,
    };
    let embed = g.dense("token_embd.weight", &[vocab, h], embed_dtype, device)?;
    let lm_head = match (g.info("output.weight").is_some(), kind) {
        (true, _) => product("output.weight", vocab, h)?,
        (false, GgufKind::Float) => Linear::Dense { weight: embed.clone(), bias: None },
        (false, _) => product("token_embd.weight", vocab, h)?,
    };
    let norm = f32("output_norm.weight".into(), h)?;
    let weights = Weights {
        embed: Embedding::whole(embed),
        embed_dtype,
        layers,
        head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
    };
    Gemma3::new(cfg, weights, context, dtype, device)
}

/// Product `name` of `shape` (out, in) as `kind` keeps it.
fn product(
    g: &GgufTensors,
    name: &str,
    (out, inp): (usize, usize),
    kind: GgufKind,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Linear> {
    let info = g.expect(name, &[out, inp])?;
    let ty = info.ggml_type;
    let bad = |e: &dyn std::fmt::Display| {
        fail(ErrorKind::Integrity, format!("{}: tensor {name}: {e}", g.path.display()))
    };
    let weight = match kind {
        GgufKind::Float => {
            return Ok(Linear::Dense {
                weight: g.dense(name, &[out, inp], dtype, device)?,
                bias: None,
            });
        }
        GgufKind::OwnBlocks => {
            let bytes = g.raw(name, &[out, inp], ty)?;
            let q = match ty {
                8 => QuantLinear::from_q8_0(bytes, (out, inp), device),
                12 => QuantLinear::from_k_quant(WeightFormat::Q4K, bytes, (out, inp), device),
                14 => QuantLinear::from_k_quant(WeightFormat::Q6K, bytes, (out, inp), device),
                _ => Err(anyhow::anyhow!("not a format of our GEMVs")),
            };
            return Ok(Linear::Ct { weight: Arc::new(q.map_err(|e| bad(&e))?), bias: None });
        }
        GgufKind::Candle => {
            let ggml = ggml_type(ty).ok_or_else(|| {
                bad(&format!("type {} cannot be loaded", crate::inspect::gguf::type_name(ty)))
            })?;
            let bytes = g.raw(name, &[out, inp], ty)?;
            let q = ggml_file::qtensor_from_ggml(ggml, bytes, vec![out, inp], device)
                .map_err(|e| bad(&e))?;
            QMatMul::from_qtensor(q).map_err(|e| bad(&e))?
        }
    };
    Ok(Linear::Quantized { weight, bias: None })
}

/// candle's type for a ggml type number it can build a `QTensor` of.
fn ggml_type(ty: u32) -> Option<GgmlDType> {
    use GgmlDType as G;
    Some(match ty {
        0 => G::F32,
        1 => G::F16,
        2 => G::Q4_0,
        3 => G::Q4_1,
        6 => G::Q5_0,
        7 => G::Q5_1,
        8 => G::Q8_0,
        10 => G::Q2K,
        11 => G::Q3K,
        12 => G::Q4K,
        13 => G::Q5K,
        14 => G::Q6K,
        30 => G::BF16,
        _ => return None,
    })
}
