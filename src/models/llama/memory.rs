//! What a Llama model allocates, as functions of its config, the context and the compute
//! dtype. `model.rs` and the loaders decide with the same functions ([`kv_shape`],
//! [`keeps_f32_head`], [`ROPE_DTYPE`]), so `load::plan` and the allocation cannot drift
//! apart; tests compare the plan with the bytes of a built model.

use candle_core::DType;

use super::config::LlamaConfig;
use crate::inspect::gguf::TensorInfo;
use crate::models::batch::KvShape;
use crate::models::memory::{FileTensors, dense_bytes, elems, sum};
use crate::models::rope::RopeKind;

/// Largest LM head kept as an f32 copy under bf16/f16 compute (`model.rs` says why).
const F32_HEAD_MAX_BYTES: u64 = 1 << 30;

/// Whether the LM head of `elems` weights gets an f32 copy under compute dtype `dtype`: under
/// f16 only. A bf16 head needs none: `Head::logits` multiplies it by the f32 state carried as
/// bf16 hi + lo, with f32 products and sums (`matmul_hi_lo`), reading half the bytes of an f32
/// copy (Llama-3.2-1B: 525 MB per decoded token instead of 1.05 GB).
pub fn keeps_f32_head(elems: u64, dtype: DType) -> bool {
    dtype == DType::F16 && elems.saturating_mul(4) <= F32_HEAD_MAX_BYTES
}

/// Dynamic NTK's frequencies depend on the length: no fixed tables, which the batched path
/// needs (such a model is refused at load).
pub fn has_rope_tables(cfg: &LlamaConfig) -> bool {
    !matches!(cfg.rope, RopeKind::Dynamic { .. })
}

/// The RoPE tables are f32: the batched path rotates in f32 and rounds once.
pub const ROPE_DTYPE: DType = DType::F32;

/// The paged pool's layout: every layer in one group of block tables, full attention or the
/// one sliding window of every layer.
pub fn kv_shape(cfg: &LlamaConfig, dtype: DType) -> KvShape {
    KvShape {
        kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        dtype,
        group_windows: vec![cfg.sliding_window],
        layer_group: vec![0; cfg.num_layers],
    }
}

/// Bytes of the cos and sin tables, one row per position.
pub fn rope_table_bytes(cfg: &LlamaConfig, context: usize) -> u64 {
    crate::models::rope::table_bytes(cfg.head_dim / 2, context, ROPE_DTYPE)
}

/// Every tensor the safetensors loader (or the random-weight builder) makes, with its shape;
/// `separate_head`: the LM head is its own tensor (untied, or present in the checkpoint).
pub fn checkpoint_tensors(cfg: &LlamaConfig, separate_head: bool) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![cfg.vocab_size, h])];
    for n in 0..cfg.num_layers {
        let p = format!("model.layers.{n}");
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        if cfg.variant.qk_norm {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim]));
        }
        let projections = [
            ("self_attn.q_proj", qd, h, cfg.attention_bias),
            ("self_attn.k_proj", kvd, h, cfg.attention_bias),
            ("self_attn.v_proj", kvd, h, cfg.attention_bias),
            ("self_attn.o_proj", h, qd, cfg.attention_bias),
            ("mlp.gate_proj", i, h, cfg.mlp_bias),
            ("mlp.up_proj", i, h, cfg.mlp_bias),
            ("mlp.down_proj", h, i, cfg.mlp_bias),
        ];
        for (name, rows, cols, bias) in projections {
            out.push((format!("{p}.{name}.weight"), vec![rows, cols]));
            if bias {
                out.push((format!("{p}.{name}.bias"), vec![rows]));
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if separate_head {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    out
}

/// Bytes of the weights of a safetensors checkpoint (`file`: its headers) or of random weights
/// (`None`) once loaded: everything in the compute dtype but the f32 norms, and the LM head
/// also as an f32 copy when [`keeps_f32_head`] (replacing it, or beside a tied embedding).
pub fn weight_bytes(cfg: &LlamaConfig, dtype: DType, file: Option<&FileTensors>) -> u64 {
    let separate_head =
        !cfg.tie_word_embeddings || file.is_some_and(|f| f.contains_key("lm_head.weight"));
    let tensors = checkpoint_tensors(cfg, separate_head);
    let stored = sum(tensors.iter().map(|(name, shape)| {
        let n = file.and_then(|f| f.get(name)).map_or_else(|| elems(shape), |t| t.elems);
        let size = if name.ends_with("norm.weight")
            || (name == "lm_head.weight" && keeps_f32_head(n, dtype))
        {
            4
        } else {
            dtype.size_in_bytes() as u64
        };
        n.saturating_mul(size)
    }));
    let head = elems(&[cfg.vocab_size, cfg.hidden_size]);
    let tied_copy = if !separate_head && keeps_f32_head(head, dtype) { head * 4 } else { 0 };
    stored.saturating_add(tied_copy)
}

/// The GGUF tensors `load_gguf` reads. Projections (and the LM head) stay quantized as candle's
/// `QMatMul` keeps them; embeddings and norms are dequantized to f32.
const GGUF_PROJECTIONS: [&str; 7] =
    ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// Bytes of a GGUF file's weights once loaded by `load_gguf`, from its tensor infos. On a GPU,
/// candle pads every quantized tensor by 512 elements' worth of blocks; a file our own GEMVs take
/// (`own_gemv_bytes`) holds its weights in their repacked layouts and its embedding in bf16.
pub fn gguf_weight_bytes(cfg: &LlamaConfig, tensors: &[TensorInfo], on_gpu: bool) -> u64 {
    let find = |name: &str| tensors.iter().find(|t| t.name == name);
    let count = |t: &TensorInfo| t.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
    let own = on_gpu && own_gemvs_take(tensors);
    let dequantized = |name: &str| {
        let size = if own && name == "token_embd.weight" { 2 } else { 4 };
        find(name).map_or(0, |t| count(t).saturating_mul(size))
    };
    let matmul = |t: &TensorInfo| match own {
        true => own_gemv_bytes(t.ggml_type, count(t), t.bytes),
        false => qmatmul_bytes(t.ggml_type, count(t), t.bytes, on_gpu),
    };
    let mut parts = vec![dequantized("token_embd.weight"), dequantized("output_norm.weight")];
    for n in 0..cfg.num_layers {
        for norm in ["attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm"] {
            parts.push(dequantized(&format!("blk.{n}.{norm}.weight")));
        }
        for p in GGUF_PROJECTIONS {
            parts.push(find(&format!("blk.{n}.{p}.weight")).map_or(0, matmul));
        }
    }
    // Without an output tensor the LM head is the quantized embedding, kept beside its f32 copy.
    let head = find("output.weight").or_else(|| find("token_embd.weight"));
    parts.push(head.map_or(0, matmul));
    sum(parts)
}

/// Whether `load_gguf` puts the file on our own GEMVs on a GPU (its `own_blocks_only`, from the
/// header: every matmul tensor Q8_0 with rows of 64-column multiples, or Q4_K / Q6_K with rows
/// of 256-column multiples).
fn own_gemvs_take(tensors: &[TensorInfo]) -> bool {
    tensors.iter().all(|t| {
        let k = t.dims.first().copied().unwrap_or(0);
        t.name.ends_with("_norm.weight")
            || t.name == "rope_freqs.weight"
            || match t.ggml_type {
                8 => k > 0 && k % 64 == 0,
                12 | 14 => k > 0 && k % 256 == 0,
                _ => false,
            }
    })
}

/// Bytes of a weight in our repacked layouts: Q8_0 and Q6_K as in the file; Q4_K with each
/// block's 6-bit scale and min as whole bytes (148 bytes per 256 columns against the file's 144).
fn own_gemv_bytes(ggml_type: u32, elems: u64, file_bytes: u64) -> u64 {
    match ggml_type {
        12 => elems / 256 * 148,
        _ => file_bytes,
    }
}

/// What candle's `QMatMul::from_qtensor` keeps: f32/f16/bf16 tensors (and every tensor under
/// `CANDLE_DEQUANTIZE_ALL`) become dense f32, `CANDLE_DEQUANTIZE_ALL_F16` dense f16, the rest
/// stays in its blocks.
fn qmatmul_bytes(ggml_type: u32, elems: u64, file_bytes: u64, on_gpu: bool) -> u64 {
    let env = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0");
    if matches!(ggml_type, 0 | 1 | 30) || env("CANDLE_DEQUANTIZE_ALL") {
        return elems.saturating_mul(4);
    }
    if env("CANDLE_DEQUANTIZE_ALL_F16") {
        return elems.saturating_mul(2);
    }
    let padding = match crate::inspect::gguf::type_layout(ggml_type) {
        Some((block, size)) if on_gpu => 512 * size / block,
        _ => 0,
    };
    file_bytes.saturating_add(padding)
}

/// Peak bytes of the intermediates of a forward pass: one step of `chunk` tokens (the engine's
/// token budget) through one layer, every intermediate counted as live at once (an upper
/// bound: most are freed before the next is made), plus the logits. Paged attention reads the
/// pool in place and never materialises scores, so nothing here grows with the context beyond
/// the step. Kernel scratch that does not scale with the model (attention split partials,
/// argmax) is in the plan's runtime term.
pub fn workspace_bytes(cfg: &LlamaConfig, context: usize, chunk: usize, dtype: DType) -> u64 {
    let (n, sd) = (chunk.min(context), dtype.size_in_bytes());
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let bytes =
        |dims: &[usize], size: usize| dense_bytes(dims, DType::U8).saturating_mul(size as u64);
    sum([
        // Embedding rows, the f32 residual, norms, attention and MLP outputs in both dtypes.
        bytes(&[n, h], 8 * 4 + 4 * sd),
        // The fused q/k/v product in f32 (and unfused parts' outputs), the rotated queries;
        // attention's output and its [seq, heads·d] copy.
        bytes(&[n, qd + 2 * kvd], 2 * 4 + sd),
        bytes(&[n, qd], 2 * sd),
        // MLP: the fused gate/up product, gate, its SiLU, up and their product
        // ([seq, intermediate]); the quantized kernels' q8_1 copy of their input is smaller
        // than one of these.
        bytes(&[n, i], 6 * sd + 2),
        // f32 logits of the sampling rows, and their host-side sampling copy's device twin.
        dense_bytes(&[2, cfg.vocab_size], DType::F32),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> LlamaConfig {
        let path = format!("{}/benches/configs/{name}.json", env!("CARGO_MANIFEST_DIR"));
        LlamaConfig::from_hf_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn llama_8b_by_hand() {
        // 8 kv heads × 128 dims × (k and v) × bf16 = 4 KiB per token and layer, 32 layers.
        let cfg = config("llama-3.1-8b");
        let shape = kv_shape(&cfg, DType::BF16);
        assert_eq!(shape.bytes_per_token_layer() * 32, 128 * 1024);
        assert_eq!(shape.pool_bytes(16, &[513]), 513 * 16 * 128 * 1024);
        // 8.03 B parameters in bf16; the 128256 × 4096 head is 2.1 GB in f32, over the limit
        // for an f32 copy.
        let w = weight_bytes(&cfg, DType::BF16, None);
        let params: u64 =
            128256 * 4096 * 2 + 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336);
        let norms: u64 = (32 * 2 + 1) * 4096;
        assert_eq!(w, params * 2 + norms * 4);
        // RoPE tables: 64 frequencies × cos and sin × f32 per position.
        assert_eq!(rope_table_bytes(&cfg, 8192), 8192 * 64 * 2 * 4);
    }

    #[test]
    fn a_small_head_gets_an_f32_copy_under_f16_only() {
        // TinyLlama: the 32000 × 2048 head is 262 MB in f32, under the 1 GiB limit.
        let cfg = config("tinyllama-1.1b");
        let (head, norms): (u64, u64) = (32000 * 2048, (22 * 2 + 1) * 2048);
        let layers: u64 = 22 * (2048 * (2048 + 2 * 256 + 2048) + 3 * 2048 * 5632);
        let f32 = weight_bytes(&cfg, DType::F32, None);
        assert_eq!(f32, (2 * head + layers + norms) * 4);
        // f16: the head is replaced by its f32 copy.
        let f16 = weight_bytes(&cfg, DType::F16, None);
        assert_eq!(f16, (head + layers) * 2 + (head + norms) * 4);
        // bf16: no copy (the head's product is f32 out of the bf16 weights).
        let bf16 = weight_bytes(&cfg, DType::BF16, None);
        assert_eq!(bf16, (2 * head + layers) * 2 + norms * 4);
        // Tied: the f16 embedding stays and the f32 copy comes beside it: the same bytes.
        let mut tied = cfg.clone();
        tied.tie_word_embeddings = true;
        assert_eq!(weight_bytes(&tied, DType::F16, None), f16);
        assert_eq!(weight_bytes(&tied, DType::BF16, None), bf16 - head * 2);
        assert_eq!(weight_bytes(&tied, DType::F32, None), f32 - head * 4);
    }

    /// The plan's bytes for our repacked GGUF weights are what the loaded weights hold.
    #[test]
    fn own_gemv_bytes_are_what_the_repacked_weights_hold() {
        use crate::quant::{QuantLinear, WeightFormat};
        use candle_core::quantized::{GgmlDType, QTensor};
        let dev = candle_core::Device::Cpu;
        let (out, inp) = (8, 512);
        let w = candle_core::Tensor::randn(0f32, 0.02, (out, inp), &dev).expect("w");
        for (ty, dtype) in [(8, GgmlDType::Q8_0), (12, GgmlDType::Q4K), (14, GgmlDType::Q6K)] {
            let qt = QTensor::quantize(&w, dtype).expect("quantize");
            let bytes = qt.data().expect("bytes").to_vec();
            let l = match ty {
                8 => QuantLinear::from_q8_0(&bytes, (out, inp), &dev),
                12 => QuantLinear::from_k_quant(WeightFormat::Q4K, &bytes, (out, inp), &dev),
                _ => QuantLinear::from_k_quant(WeightFormat::Q6K, &bytes, (out, inp), &dev),
            }
            .expect("load");
            let held = l.q.elem_count() + 2 * l.scale.elem_count();
            let planned = own_gemv_bytes(ty, (out * inp) as u64, bytes.len() as u64);
            assert_eq!(planned, held as u64, "{dtype:?}");
        }
    }
}
