//! What a gpt-oss model allocates, as functions of its config, the context and the compute
//! dtype. The model uses the same functions to lay out what it allocates ([`kv_shape`],
//! [`stored_dtype`], [`ROPE_DTYPE`]), so `load::plan` and the allocation cannot drift apart;
//! tests compare the plan with the bytes of a built model.

use candle_core::DType;

use super::config::GptOssConfig;
use crate::models::batch::KvShape;
use crate::models::memory::{FileTensors, dense_bytes, elems, sum};

/// The RoPE tables are f32: RoPE runs in f32 and rounds once (kernels/qkv_rope_paged says why).
pub const ROPE_DTYPE: DType = DType::F32;

/// KV group of the full-attention layers; sliding layers, when the model has any, are group 1.
const FULL: usize = 0;
const SLIDING: usize = 1;

/// The KV group of layer `n`.
pub fn kv_group(cfg: &GptOssConfig, n: usize) -> usize {
    if cfg.sliding[n] { SLIDING } else { FULL }
}

/// The paged pool's layout: full layers in one group of block tables, sliding layers (their
/// window) in another.
pub fn kv_shape(cfg: &GptOssConfig, dtype: DType) -> KvShape {
    let mut group_windows = vec![None];
    if cfg.sliding.iter().any(|&s| s) {
        group_windows.push(Some(cfg.sliding_window));
    }
    KvShape {
        kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        dtype,
        group_windows,
        layer_group: (0..cfg.sliding.len()).map(|n| kv_group(cfg, n)).collect(),
    }
}

/// Bytes of the cos and sin tables, one row per position.
pub fn rope_table_bytes(cfg: &GptOssConfig, context: usize) -> u64 {
    crate::models::rope::table_bytes(cfg.head_dim / 2, context, ROPE_DTYPE)
}

/// The dtype the loader keeps a checkpoint tensor in; `None`: as stored (the MXFP4 blocks and
/// scales stay packed u8). Norms, sinks, the router and every bias are f32 (the router and the
/// residual stream run in f32, docs/gpt-oss.md pitfall #5); the projections and embeddings take the
/// compute dtype.
pub fn stored_dtype(name: &str, compute: DType) -> Option<DType> {
    if name.ends_with("_blocks") || name.ends_with("_scales") {
        return None;
    }
    let f32 = name.ends_with("bias")
        || name.ends_with("norm.weight")
        || name.ends_with(".sinks")
        || name.contains(".router.");
    Some(if f32 { DType::F32 } else { compute })
}

/// Every checkpoint tensor the loader reads, with the shape `load.rs` requires of it.
pub fn checkpoint_tensors(cfg: &GptOssConfig) -> Vec<(String, Vec<usize>)> {
    let (h, i, e) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut out = Vec::new();
    for n in 0..cfg.num_layers {
        let p = format!("model.layers.{n}");
        let mut add = |name: String, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
        add("input_layernorm.weight".into(), vec![h]);
        add("post_attention_layernorm.weight".into(), vec![h]);
        for (proj, rows, cols) in [("q", qd, h), ("k", kvd, h), ("v", kvd, h), ("o", h, qd)] {
            add(format!("self_attn.{proj}_proj.weight"), vec![rows, cols]);
            add(format!("self_attn.{proj}_proj.bias"), vec![rows]);
        }
        add("self_attn.sinks".into(), vec![cfg.num_heads]);
        add("mlp.router.weight".into(), vec![e, h]);
        add("mlp.router.bias".into(), vec![e]);
        let x = "mlp.experts";
        add(format!("{x}.gate_up_proj_blocks"), vec![e, 2 * i, h / 32, 16]);
        add(format!("{x}.gate_up_proj_scales"), vec![e, 2 * i, h / 32]);
        add(format!("{x}.gate_up_proj_bias"), vec![e, 2 * i]);
        add(format!("{x}.down_proj_blocks"), vec![e, h, i / 32, 16]);
        add(format!("{x}.down_proj_scales"), vec![e, h, i / 32]);
        add(format!("{x}.down_proj_bias"), vec![e, h]);
    }
    out.push(("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h]));
    out.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out
}

/// Bytes the weights take once loaded: each tensor the loader reads, sized from the
/// checkpoint's headers (`file`), or from the config for random weights in the checkpoint's
/// layout (`None`), in the dtype [`stored_dtype`] gives it.
pub fn weight_bytes(cfg: &GptOssConfig, compute: DType, file: Option<&FileTensors>) -> u64 {
    sum(checkpoint_tensors(cfg).iter().map(|(name, shape)| {
        // Packed tensors are u8 in the checkpoint: one byte per element.
        let (n, stored) = match file.and_then(|f| f.get(name)) {
            Some(t) => (t.elems, t.bytes),
            None => (elems(shape), elems(shape)),
        };
        match stored_dtype(name, compute) {
            Some(dtype) => n.saturating_mul(dtype.size_in_bytes() as u64),
            None => stored,
        }
    }))
}

/// Peak bytes of the intermediates of a forward pass: one prefill chunk of `chunk` tokens (the
/// engine's step) through one layer, every intermediate counted as live at once (an upper
/// bound: most are freed before the next is made), plus the logits. Attention reads the cache in place and never materialises
/// scores, so nothing here grows with the context beyond the chunk. Kernel scratch that does
/// not scale with the model (attention split partials, argmax) is in the plan's runtime term.
pub fn workspace_bytes(cfg: &GptOssConfig, context: usize, chunk: usize, dtype: DType) -> u64 {
    let n = chunk.min(context);
    let sd = dtype.size_in_bytes();
    let (h, i, k, e) =
        (cfg.hidden_size, cfg.intermediate_size, cfg.experts_per_token, cfg.num_experts);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let qkv = qd.saturating_add(2 * kvd);
    let f32 = 4;
    sum([
        // Embedding rows, the f32 residual, both norms' outputs, attention and MoE outputs and
        // the two residual sums (f32), the normed inputs in the compute dtype.
        dense_bytes(&[n, h], DType::U8).saturating_mul((7 * f32 + 3 * sd) as u64),
        // q/k/v: the f32 product, its head-split copies, RoPE's f32 outputs, all of it rounded
        // to the compute dtype; attention's output and its [seq, heads·d] copy.
        dense_bytes(&[n, qkv], DType::U8).saturating_mul((3 * f32 + sd) as u64),
        dense_bytes(&[n, qd], DType::U8).saturating_mul((f32 + 2 * sd) as u64),
        // Router logits, routing ids and weights, then the experts' scratch: the per-slot path
        // keeps [n·k, I] and [n·k, H] in f32, the grouped path [n·k, I] twice in bf16 plus
        // [n·k, H] in f32 (the larger of the two is counted).
        dense_bytes(&[n, e], DType::F32),
        dense_bytes(&[n, k, 2], DType::F32),
        dense_bytes(&[n, k, i], DType::F32).max(dense_bytes(&[n, k, 2, i], DType::BF16)),
        dense_bytes(&[n, k, h], DType::F32),
        // f32 logits of the last position, and the decode graph's fixed logits buffer.
        dense_bytes(&[2, cfg.vocab_size], DType::F32),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_20b() -> GptOssConfig {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/configs/gpt-oss-20b.json"
        ))
        .unwrap();
        GptOssConfig::from_hf_json(&text).unwrap()
    }

    #[test]
    fn the_20b_kv_shape_by_hand() {
        // 8 kv heads × 64 dims × (k and v) × bf16 = 2 KiB per token and layer; 12 full layers
        // (odd), 12 sliding ones (even) with their 128-token window.
        let shape = kv_shape(&config_20b(), DType::BF16);
        assert_eq!(shape.bytes_per_token_layer(), 8 * 64 * 2 * 2);
        assert_eq!(shape.group_windows, vec![None, Some(128)]);
        assert_eq!((shape.layers_in(0), shape.layers_in(1)), (12, 12));
        assert_eq!(shape.layer_group[..3], [1, 0, 1]);
        assert_eq!(shape.pool_bytes(16, &[2, 3]), (2 * 12 + 3 * 12) * 16 * 2048);
    }

    #[test]
    fn the_20b_weights_by_hand() {
        // Per layer: packed experts 32 × (5760 + 2880) rows × 90 blocks × 17 bytes, their f32
        // biases, the bf16 attention projections, f32 attention biases, sinks, router and norms;
        // then the bf16 embedding and LM head and the final norm (about 13.8 GB, the size of
        // the published checkpoint, as its tensors are bf16 and u8 too).
        let cfg = config_20b();
        let w = weight_bytes(&cfg, DType::BF16, None);
        let experts: u64 = 32 * (5760 + 2880) * 90 * 17 + 32 * (5760 + 2880) * 4;
        let attention: u64 = 9216 * 2880 * 2 + (4096 + 512 + 512 + 2880) * 4 + 64 * 4;
        let rest: u64 = 2 * 2880 * 4 + 32 * 2880 * 4 + 32 * 4;
        assert_eq!(w, 24 * (experts + attention + rest) + 2 * 201088 * 2880 * 2 + 2880 * 4);
        let f32 = weight_bytes(&cfg, DType::F32, None);
        let dense: u64 = 24 * (64 * 64 + 2 * 8 * 64 + 64 * 64) * 2880 + 2 * 201088 * 2880;
        assert_eq!(f32 - w, dense * 2, "only the dense projections change size");
    }

    #[test]
    fn stored_dtypes_follow_the_loader() {
        let b = DType::BF16;
        assert_eq!(stored_dtype("model.layers.0.mlp.experts.down_proj_blocks", b), None);
        assert_eq!(stored_dtype("model.layers.0.mlp.experts.down_proj_bias", b), Some(DType::F32));
        assert_eq!(stored_dtype("model.layers.0.self_attn.q_proj.bias", b), Some(DType::F32));
        assert_eq!(stored_dtype("model.layers.0.self_attn.q_proj.weight", b), Some(b));
        assert_eq!(stored_dtype("model.layers.0.mlp.router.weight", b), Some(DType::F32));
        assert_eq!(stored_dtype("model.norm.weight", b), Some(DType::F32));
        assert_eq!(stored_dtype("lm_head.weight", b), Some(b));
    }
}
