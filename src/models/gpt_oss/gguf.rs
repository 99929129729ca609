//! gpt-oss from a GGUF file (`general.architecture = "gpt-oss"`, the layout of
//! ggml-org/gpt-oss-20b-GGUF written by llama.cpp's `convert_hf_to_gguf.py`; docs/quant-formats.md,
//! "MXFP4").
//!
//! The config comes from the `gpt-oss.*` metadata, read as llama.cpp reads it
//! (`src/models/openai-moe.cpp`). The weights are mapped onto the same [`Weights`] the HF loader
//! builds, so the model, its kernels and the batched engine run unchanged:
//! - the MXFP4 experts (`ffn_{gate,up,down}_exps`, 17-byte ggml blocks) are respelled into the
//!   checkpoint's layout ([`mxfp4_ggml::ggml_rows_to_hf_on`]: same codes and scales, other
//!   nibble order; on a GPU the raw blocks are uploaded and respelled there) and gate and up are
//!   interleaved row by row as HF's `gate_up_proj` is (gate channel j = row 2j, up = row 2j + 1),
//!   with their biases likewise;
//! - the Q8_0 tensors (attention, embedding, output) are dequantized to the compute dtype at load.
//!   That is the simple choice: it keeps the fused QKV GEMM, the f32-output matmuls and the decode
//!   CUDA graph of the HF path. It costs memory and bandwidth (bf16 is 1.9× Q8_0's bytes for those
//!   tensors) which a Q8_0 GEMV would save;
//! - F32 norms, biases, sinks and router as they are.

use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::model::{Attention, GptOss, Layer, Weights};
use crate::error::{ErrorKind, fail};
use crate::inspect::gguf::FullMetadata;
use crate::kernels::{Mxfp4Experts, mxfp4_ggml};
use crate::models::embedding::Embedding;
use crate::models::gguf::{GgufTensors, MXFP4};
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::rope::{RopeKind, RopeScaling};

/// The architecture name in `general.architecture`.
pub const ARCH: &str = "gpt-oss";

/// Loads the gpt-oss GGUF at `path` to compute in `dtype`.
pub fn load(
    path: &std::path::Path,
    dtype: DType,
    context: usize,
    device: &Device,
) -> anyhow::Result<GptOss> {
    let g = GgufTensors::open(path)?;
    let cfg = config(&g)?;
    let weights = read_weights(&g, &cfg, dtype, device)?;
    GptOss::new(cfg, weights, context, dtype, device)
}

/// The config of an opened gpt-oss GGUF (vocabulary size and tied head from its tensors).
pub fn config(g: &GgufTensors) -> anyhow::Result<GptOssConfig> {
    let embd = g.info("token_embd.weight").ok_or_else(|| bad("no token_embd.weight"))?;
    let vocab = match embd.dims.as_slice() {
        [_, v] => usize::try_from(*v).map_err(|_| bad("token_embd.weight is too large"))?,
        dims => return Err(bad(format!("token_embd.weight has dims {dims:?}"))),
    };
    let tied = g.info("output.weight").is_none();
    from_metadata(&g.metadata, vocab, tied)
}

fn bad(msg: impl std::fmt::Display) -> anyhow::Error {
    fail(ErrorKind::Integrity, format!("gpt-oss GGUF: {msg}"))
}

/// Typed reads of `gpt-oss.<key>`; a value of the wrong type is a corrupt file.
struct Meta<'a>(&'a FullMetadata);

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&candle_core::quantized::gguf_file::Value> {
        self.0.get(&format!("{ARCH}.{key}"))
    }

    /// Any non-negative integer type (writers differ).
    fn uint(&self, key: &str) -> anyhow::Result<Option<u64>> {
        use candle_core::quantized::gguf_file::Value as V;
        let v = match self.get(key) {
            None => return Ok(None),
            Some(V::U8(x)) => u64::from(*x),
            Some(V::U16(x)) => u64::from(*x),
            Some(V::U32(x)) => u64::from(*x),
            Some(V::U64(x)) => *x,
            Some(V::I8(x)) => u64::try_from(*x).map_err(|_| bad(format!("{ARCH}.{key} < 0")))?,
            Some(V::I16(x)) => u64::try_from(*x).map_err(|_| bad(format!("{ARCH}.{key} < 0")))?,
            Some(V::I32(x)) => u64::try_from(*x).map_err(|_| bad(format!("{ARCH}.{key} < 0")))?,
            Some(V::I64(x)) => u64::try_from(*x).map_err(|_| bad(format!("{ARCH}.{key} < 0")))?,
            Some(_) => return Err(bad(format!("{ARCH}.{key} should be an integer"))),
        };
        Ok(Some(v))
    }

    fn usize(&self, key: &str) -> anyhow::Result<usize> {
        let v = self.uint(key)?.ok_or_else(|| bad(format!("the metadata lacks {ARCH}.{key}")))?;
        usize::try_from(v).map_err(|_| bad(format!("{ARCH}.{key} = {v} is too large")))
    }

    fn float(&self, key: &str) -> anyhow::Result<Option<f64>> {
        use candle_core::quantized::gguf_file::Value as V;
        match self.get(key) {
            None => Ok(None),
            Some(V::F32(x)) => Ok(Some(f64::from(*x))),
            Some(V::F64(x)) => Ok(Some(*x)),
            Some(_) => Err(bad(format!("{ARCH}.{key} should be a number"))),
        }
    }

    fn string(&self, key: &str) -> anyhow::Result<Option<&str>> {
        use candle_core::quantized::gguf_file::Value as V;
        match self.get(key) {
            None => Ok(None),
            Some(V::String(s)) => Ok(Some(s)),
            Some(_) => Err(bad(format!("{ARCH}.{key} should be a string"))),
        }
    }
}

/// The config from `gpt-oss.*` metadata. Keys as llama.cpp writes and reads them; the SwiGLU
/// limit and slope have no key (llama.cpp hard-codes gpt-oss's 7.0 and 1.702, as we do).
pub fn from_metadata(
    md: &FullMetadata,
    vocab_size: usize,
    tied: bool,
) -> anyhow::Result<GptOssConfig> {
    let m = Meta(md);
    let arch = md.get("general.architecture").and_then(|v| v.to_string().ok());
    if arch.map(String::as_str) != Some(ARCH) {
        return Err(bad(format!("general.architecture is {arch:?}, not {ARCH:?}")));
    }
    let num_layers = m.usize("block_count")?;
    if num_layers == 0 || num_layers > 4096 {
        return Err(bad(format!("{ARCH}.block_count = {num_layers} is not in 1..=4096")));
    }
    let hidden = m.usize("embedding_length")?;
    let heads = m.usize("attention.head_count")?;
    let max_pos = m.usize("context_length")?;
    let head_dim = match m.uint("attention.key_length")? {
        Some(d) => usize::try_from(d).map_err(|_| bad("attention.key_length is too large"))?,
        None => hidden / heads.max(1),
    };
    let cfg = GptOssConfig {
        hidden_size: hidden,
        intermediate_size: m.usize("expert_feed_forward_length")?,
        num_layers,
        num_heads: heads,
        num_kv_heads: m.uint("attention.head_count_kv")?.map_or(Ok(heads), |v| {
            usize::try_from(v).map_err(|_| bad("attention.head_count_kv is too large"))
        })?,
        head_dim,
        num_experts: m.usize("expert_count")?,
        experts_per_token: m.usize("expert_used_count")?,
        vocab_size,
        rms_norm_eps: m.float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        rope_theta: m.float("rope.freq_base")?.unwrap_or(150000.0),
        rope: rope(&m, max_pos)?,
        max_position_embeddings: max_pos,
        sliding_window: m.usize("attention.sliding_window")?,
        sliding: sliding_layers(&m, num_layers)?,
        swiglu_limit: 7.0,
        swiglu_alpha: 1.702,
        tie_word_embeddings: tied,
    };
    cfg.validate().map_err(bad)?;
    Ok(cfg)
}

/// YaRN from `rope.scaling.*`. The correction range is not rounded (`truncate: false`): that is
/// gpt-oss's definition (its HF config and OpenAI's reference, docs/gpt-oss.md pitfall #1),
/// which the GGUF cannot state; llama.cpp's ggml rounds it.
fn rope(m: &Meta, max_pos: usize) -> anyhow::Result<RopeKind> {
    let kind = m.string("rope.scaling.type")?;
    let scaling = match kind {
        None | Some("none") => return Ok(RopeKind::Default),
        Some(kind) => RopeScaling {
            rope_type: Some(kind.to_string()),
            factor: m.float("rope.scaling.factor")?,
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: m
                .uint("rope.scaling.original_context_length")?
                .map(|v| usize::try_from(v).unwrap_or(usize::MAX)),
            rope_theta: None,
            beta_fast: m.float("rope.scaling.yarn_beta_fast")?,
            beta_slow: m.float("rope.scaling.yarn_beta_slow")?,
            truncate: Some(false),
            attention_factor: m.float("rope.scaling.yarn_attn_factor")?,
        },
    };
    RopeKind::from_scaling(Some(&scaling), max_pos).map_err(|e| bad(format!("rope: {e}")))
}

/// Which layers use the sliding window: `attention.sliding_window_pattern` as llama.cpp reads it
/// (an array of one bool per layer, or a period n: layer l slides unless l % n == n − 1), else
/// gpt-oss's period 2 (even layers slide, as HF's `layer_types`).
fn sliding_layers(m: &Meta, layers: usize) -> anyhow::Result<Vec<bool>> {
    use candle_core::quantized::gguf_file::Value as V;
    const KEY: &str = "attention.sliding_window_pattern";
    if let Some(V::Array(items)) = m.get(KEY) {
        if items.len() != layers {
            return Err(bad(format!("{KEY} has {} entries for {layers} layers", items.len())));
        }
        return items
            .iter()
            .map(|v| match v {
                V::Bool(b) => Ok(*b),
                _ => Err(bad(format!("{KEY} should hold bools"))),
            })
            .collect();
    }
    let period = m.uint(KEY)?.unwrap_or(2);
    Ok((0..layers as u64).map(|l| period == 0 || l % period < period - 1).collect())
}

fn read_weights(
    g: &GgufTensors,
    cfg: &GptOssConfig,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (h, e) = (cfg.hidden_size, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let f32 = |name: String, shape: &[usize]| g.dense(&name, shape, DType::F32, device);
    let linear = |p: String, out: usize, inp: usize| -> anyhow::Result<Linear> {
        Ok(Linear::Dense {
            weight: g.dense(&format!("{p}.weight"), &[out, inp], dtype, device)?,
            bias: Some(f32(format!("{p}.bias"), &[out])?),
        })
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for n in 0..cfg.num_layers {
        let b = format!("blk.{n}");
        layers.push(Layer {
            attn_norm: f32(format!("{b}.attn_norm.weight"), &[h])?,
            attn: Attention::new(
                linear(format!("{b}.attn_q"), qd, h)?,
                linear(format!("{b}.attn_k"), kvd, h)?,
                linear(format!("{b}.attn_v"), kvd, h)?,
                linear(format!("{b}.attn_output"), h, qd)?,
                f32(format!("{b}.attn_sinks.weight"), &[cfg.num_heads])?,
            )?,
            mlp_norm: f32(format!("{b}.post_attention_norm.weight"), &[h])?,
            router_w: f32(format!("{b}.ffn_gate_inp.weight"), &[e, h])?,
            router_b: f32(format!("{b}.ffn_gate_inp.bias"), &[e])?,
            experts: experts(g, &b, cfg, device)?,
        });
    }
    let embed = g.dense("token_embd.weight", &[cfg.vocab_size, h], dtype, device)?;
    let lm_head = if cfg.tie_word_embeddings {
        Linear::Dense { weight: embed.clone(), bias: None }
    } else {
        let weight = g.dense("output.weight", &[cfg.vocab_size, h], dtype, device)?;
        Linear::Dense { weight, bias: None }
    };
    let norm = f32("output_norm.weight".into(), &[h])?;
    Ok(Weights {
        embed: Embedding::whole(embed),
        layers,
        head: Head { norm, lm_head, eps: cfg.rms_norm_eps },
    })
}

/// One layer's experts in the checkpoint layout [`Mxfp4Experts`] takes.
fn experts(
    g: &GgufTensors,
    b: &str,
    cfg: &GptOssConfig,
    device: &Device,
) -> anyhow::Result<Mxfp4Experts> {
    let (h, i, e) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts);
    let raw = |name: &str, rows: usize, cols: usize| -> anyhow::Result<&[u8]> {
        g.raw(&format!("{b}.{name}.weight"), &[e, rows, cols], MXFP4)
    };
    let host_f32 = |name: &str, rows: usize| -> anyhow::Result<Vec<f32>> {
        let t = g.dense(&format!("{b}.{name}.bias"), &[e, rows], DType::F32, &Device::Cpu)?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    };
    let hb = h / 32;
    let (gate, up) = (raw("ffn_gate_exps", i, h)?, raw("ffn_up_exps", i, h)?);
    let (gate_up, gate_up_scales) = mxfp4_ggml::ggml_rows_to_hf_on(&[gate, up], hb, device)?;
    let down = raw("ffn_down_exps", h, i)?;
    let (down, down_scales) = mxfp4_ggml::ggml_rows_to_hf_on(&[down], i / 32, device)?;
    let gate_up_bias =
        interleave_rows(&host_f32("ffn_gate_exps", i)?, &host_f32("ffn_up_exps", i)?, 1);
    let down_bias = g.dense(&format!("{b}.ffn_down_exps.bias"), &[e, h], DType::F32, device)?;
    Ok(Mxfp4Experts::new(
        &gate_up.reshape((e, 2 * i, hb, 16))?,
        &gate_up_scales.reshape((e, 2 * i, hb))?,
        &Tensor::from_vec(gate_up_bias, (e, 2 * i), device)?,
        &down.reshape((e, h, i / 32, 16))?,
        &down_scales.reshape((e, h, i / 32))?,
        &down_bias,
    )?)
}

/// Rows of `a` and `b` (each `row` elements) alternated: a₀ b₀ a₁ b₁ … — HF's fused gate/up
/// order (of the biases; the packed weights are fused by [`mxfp4_ggml::ggml_rows_to_hf_on`]). Over all experts at once: expert x's row j is row x·I + j of either input and lands at
/// row x·2I + 2j (+1 for `b`).
fn interleave_rows<T: Copy>(a: &[T], b: &[T], row: usize) -> Vec<T> {
    debug_assert_eq!(a.len(), b.len());
    let mut out = Vec::with_capacity(a.len() * 2);
    for (ra, rb) in a.chunks_exact(row).zip(b.chunks_exact(row)) {
        out.extend_from_slice(ra);
        out.extend_from_slice(rb);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_interleave_as_hf_fuses_gate_and_up() {
        // 2 experts × 2 rows of 3: gate rows are 0.., up rows 100..
        let gate: Vec<u32> = (0..12).collect();
        let up: Vec<u32> = (100..112).collect();
        let fused = interleave_rows(&gate, &up, 3);
        let row = |r: usize| &fused[3 * r..3 * r + 3];
        // Expert 1, channel 1: gate row 2·2 + 2·1 = 6, up row 7.
        assert_eq!(row(6), &[9, 10, 11]);
        assert_eq!(row(7), &[109, 110, 111]);
        assert_eq!(row(0), &[0, 1, 2]);
        assert_eq!(row(1), &[100, 101, 102]);
    }
}
