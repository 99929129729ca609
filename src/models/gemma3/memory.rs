//! What a Gemma 3 model allocates, as functions of its config, the context and the compute
//! dtype. The model lays out what it allocates with the same functions ([`kv_shape`],
//! [`ROPE_DTYPE`], [`checkpoint_tensors`]), so `load::plan` and the allocation cannot drift
//! apart; tests compare the plan with the bytes of a built model.

use candle_core::DType;

use super::config::Gemma3Config;
use crate::inspect::gguf::TensorInfo;
use crate::models::batch::KvShape;
use crate::models::memory::{FileTensors, dense_bytes, elems, sum};

/// The RoPE tables are f32: RoPE runs in f32 and rounds once (kernels/qkv_rope_paged says why).
pub const ROPE_DTYPE: DType = DType::F32;

/// KV group of the global layers; the sliding layers, when there are any, are group 1.
const GLOBAL: usize = 0;
const SLIDING: usize = 1;

/// The KV group of layer `n`.
pub fn kv_group(cfg: &Gemma3Config, n: usize) -> usize {
    if cfg.sliding[n] { SLIDING } else { GLOBAL }
}

/// The paged pool's layout: the global layers in one group of block tables, whose pool grows
/// with the context; the sliding layers in another with their window, whose pool holds the
/// window and a step per sequence (`engine::pool::pool_groups`), whatever the context. On
/// gemma-3-12b at 128k tokens that is 8 of 48 layers' KV growing with the context, not 48.
pub fn kv_shape(cfg: &Gemma3Config, dtype: DType) -> KvShape {
    let mut group_windows = vec![None];
    if cfg.has_sliding() {
        group_windows.push(Some(cfg.sliding_window));
    }
    KvShape {
        kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        dtype,
        group_windows,
        layer_group: (0..cfg.num_layers).map(|n| kv_group(cfg, n)).collect(),
    }
}

/// Bytes of the cos and sin tables, one row per position: the global layers' and, when some
/// layers slide, the local base's.
pub fn rope_table_bytes(cfg: &Gemma3Config, context: usize) -> u64 {
    let one = crate::models::rope::table_bytes(cfg.head_dim / 2, context, ROPE_DTYPE);
    if cfg.has_sliding() { one.saturating_mul(2) } else { one }
}

/// Every tensor of the text model in the HF layout under `prefix` (`model.` for the 1B,
/// `language_model.model.` for 4B+), with its shape; `separate_head`: an `lm_head.weight`
/// beside the embedding (an untied checkpoint).
pub fn checkpoint_tensors(
    cfg: &Gemma3Config,
    prefix: &str,
    separate_head: bool,
) -> Vec<(String, Vec<usize>)> {
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let mut out = vec![(format!("{prefix}embed_tokens.weight"), vec![cfg.vocab_size, h])];
    for n in 0..cfg.num_layers {
        let p = format!("{prefix}layers.{n}");
        for norm in NORMS {
            out.push((format!("{p}.{norm}.weight"), vec![h]));
        }
        out.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
        out.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
        for (name, rows, cols) in [
            ("self_attn.q_proj", qd, h),
            ("self_attn.k_proj", kvd, h),
            ("self_attn.v_proj", kvd, h),
            ("self_attn.o_proj", h, qd),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ] {
            out.push((format!("{p}.{name}.weight"), vec![rows, cols]));
        }
    }
    out.push((format!("{prefix}norm.weight"), vec![h]));
    if separate_head {
        out.push((head_name(prefix), vec![cfg.vocab_size, h]));
    }
    out
}

/// A layer's four norms, in the order they apply.
pub const NORMS: [&str; 4] = [
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
];

/// The untied LM head's name beside the text model's tensors under `prefix`.
pub fn head_name(prefix: &str) -> String {
    let outer = prefix.strip_suffix("model.").unwrap_or("");
    format!("{outer}lm_head.weight")
}

/// Bytes of the weights once loaded: everything in the compute dtype but the f32 norms
/// (`file`: the checkpoint's headers; `None`: random weights in the 1B's layout). A tied head
/// is the embedding.
pub fn weight_bytes(cfg: &Gemma3Config, dtype: DType, file: Option<&FileTensors>) -> u64 {
    let prefix = file.map_or("model.", |f| text_prefix(f.keys().map(String::as_str)));
    let separate_head =
        !cfg.tie_word_embeddings || file.is_some_and(|f| f.contains_key(&head_name(prefix)));
    let tensors = checkpoint_tensors(cfg, prefix, separate_head);
    sum(tensors.iter().map(|(name, shape)| {
        let n = file.and_then(|f| f.get(name)).map_or_else(|| elems(shape), |t| t.elems);
        let size = if name.ends_with("norm.weight") { 4 } else { dtype.size_in_bytes() as u64 };
        n.saturating_mul(size)
    }))
}

/// Where a checkpoint keeps the text model: `model.` (1B, `Gemma3ForCausalLM`),
/// `language_model.model.` (4B+ as published) or `model.language_model.` (4B+ saved by
/// transformers ≥ 4.52).
pub fn text_prefix<'a>(mut names: impl Iterator<Item = &'a str>) -> &'static str {
    const PREFIXES: [&str; 3] = ["language_model.model.", "model.language_model.", "model."];
    let found = names.find_map(|n| {
        PREFIXES.into_iter().find(|p| n.strip_prefix(p) == Some("embed_tokens.weight"))
    });
    found.unwrap_or("model.")
}

/// The GGUF tensors the loader reads as products.
pub const GGUF_PROJECTIONS: [&str; 7] =
    ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// How the GGUF loader keeps a file's products ([`gguf_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufKind {
    /// Every product a plain float: dense tensors in the compute dtype.
    Float,
    /// Q8_0 / Q4_K / Q6_K only, on a GPU: our own GEMVs, bf16 activations.
    OwnBlocks,
    /// Any other block format: candle's quantized matmul, f32 activations.
    Candle,
}

/// How the loader keeps the products of a file whose tensors are `tensors`; `own`: our GEMVs
/// may take them (on a GPU, computing in bf16).
pub fn gguf_kind(tensors: &[TensorInfo], own: bool) -> GgufKind {
    let products = tensors.iter().filter(|t| is_product(&t.name));
    let mut any = false;
    let (mut float, mut own) = (true, own);
    for t in products {
        any = true;
        float &= matches!(t.ggml_type, 0 | 1 | 30);
        let k = t.dims.first().copied().unwrap_or(0);
        own &= match t.ggml_type {
            8 => k > 0 && k % 64 == 0,
            12 | 14 => k > 0 && k % 256 == 0,
            _ => false,
        };
    }
    match (any && float, any && own) {
        (true, _) => GgufKind::Float,
        (false, true) => GgufKind::OwnBlocks,
        _ => GgufKind::Candle,
    }
}

/// The tensors that are products (the embedding is the tied LM head's).
fn is_product(name: &str) -> bool {
    name == "token_embd.weight"
        || name == "output.weight"
        || GGUF_PROJECTIONS.iter().any(|p| name.ends_with(&format!(".{p}.weight")))
}

/// Bytes of a GGUF file's weights once loaded as `kind` keeps them ([`gguf_kind`]): norms f32; a float file's products in `dtype`;
/// a quantized file's products in their blocks (candle pads each by 512 elements' worth on a
/// GPU; ours repack Q4_K to 148 bytes per 256 columns), the embedding dequantized (f32 for
/// candle's kernels, bf16 beside ours) and kept beside its quantized self as the tied head.
pub fn gguf_weight_bytes(
    tensors: &[TensorInfo],
    kind: GgufKind,
    dtype: DType,
    on_gpu: bool,
) -> u64 {
    let count = |t: &TensorInfo| t.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    sum(tensors.iter().map(|t| {
        let n = count(t);
        if t.name.ends_with("norm.weight") {
            return n.saturating_mul(4);
        }
        if !is_product(&t.name) {
            return 0;
        }
        let blocks = match kind {
            GgufKind::Float => return n.saturating_mul(dtype.size_in_bytes() as u64),
            GgufKind::OwnBlocks if t.ggml_type == 12 => n / 256 * 148,
            GgufKind::OwnBlocks => t.bytes,
            // candle keeps float tensors as dense f32.
            GgufKind::Candle if matches!(t.ggml_type, 0 | 1 | 30) => n.saturating_mul(4),
            GgufKind::Candle => {
                let padding = match crate::inspect::gguf::type_layout(t.ggml_type) {
                    Some((block, size)) if on_gpu => 512 * size / block,
                    _ => 0,
                };
                t.bytes.saturating_add(padding)
            }
        };
        let dense = match (t.name == "token_embd.weight", kind) {
            (true, GgufKind::OwnBlocks) => n.saturating_mul(2),
            (true, _) => n.saturating_mul(4),
            (false, _) => 0,
        };
        // An untied file's embedding is only looked up: its dense copy alone.
        let head_copy = if t.name == "token_embd.weight" && !tied { 0 } else { blocks };
        dense.saturating_add(head_copy)
    }))
}

/// Peak bytes of a step's intermediates: `chunk` tokens (the engine's token budget) through
/// one layer, every intermediate counted as live at once (an upper bound), plus the logits.
/// Paged attention reads the pool in place, so nothing grows with the context beyond the step.
pub fn workspace_bytes(cfg: &Gemma3Config, context: usize, chunk: usize, dtype: DType) -> u64 {
    let (n, sd) = (chunk.min(context), dtype.size_in_bytes());
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let bytes =
        |dims: &[usize], size: usize| dense_bytes(dims, DType::U8).saturating_mul(size as u64);
    sum([
        // Embedding rows, the f32 residual, the four norms' outputs, attention and MLP
        // outputs in both dtypes.
        bytes(&[n, h], 12 * 4 + 4 * sd),
        // The q/k/v product in f32, its normed q and k and their concatenation, the rotated
        // queries; attention's output and its [seq, heads·d] copy.
        bytes(&[n, qd + 2 * kvd], 4 * 4 + sd),
        bytes(&[n, qd], 2 * sd),
        // MLP: the gate/up product in f32, the gate's GELU, up and their product.
        bytes(&[n, i], 2 * 4 + 3 * 4 + sd),
        dense_bytes(&[2, cfg.vocab_size], DType::F32),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-3-12b-it's text_config, as sparse as on the Hub.
    const TWELVE_B: &str = r#"{"model_type":"gemma3","text_config":{"hidden_size":3840,
        "intermediate_size":15360,"model_type":"gemma3_text","num_attention_heads":16,
        "num_hidden_layers":48,"num_key_value_heads":8,"rope_scaling":{"factor":8.0,
        "rope_type":"linear"},"sliding_window":1024},"torch_dtype":"bfloat16"}"#;

    #[test]
    fn gemma_3_12b_by_hand() {
        let cfg = Gemma3Config::from_hf_json(TWELVE_B).unwrap();
        let shape = kv_shape(&cfg, DType::BF16);
        assert_eq!(shape.group_windows, vec![None, Some(1024)]);
        // 8 global layers grow with the context: 8 kv heads × 256 × (k, v) × bf16 each.
        assert_eq!(shape.layers_in(GLOBAL), 8);
        assert_eq!(shape.bytes_per_token_layer() * 8, 64 * 1024);
        // 11.77 B parameters in bf16 (the model card's 12B less the vision tower), norms f32.
        let (h, i, d, l) = (3840u64, 15360u64, 256u64, 48u64);
        let params = 262_208 * h + l * (h * (16 * d + 2 * 8 * d) + 16 * d * h + 3 * h * i);
        let norms = l * (4 * h + 2 * d) + h;
        assert_eq!(weight_bytes(&cfg, DType::BF16, None), params * 2 + norms * 4);
        assert!((params as f64 / 1e9 - 11.77).abs() < 0.01, "{params}");
        // Two RoPE tables (global and local): 128 frequencies × cos and sin × f32 each.
        assert_eq!(rope_table_bytes(&cfg, 1000), 2 * 1000 * 128 * 2 * 4);
    }
}
