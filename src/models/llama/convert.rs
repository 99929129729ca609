//! GGUF → Hugging Face layout: dequantized f32 tensors under HF names, with llama.cpp's q/k row
//! permutation undone — what transformers' GGUF loader produces. It lets the real SmolLM2 GGUF
//! serve as an HF safetensors checkpoint in tests (CI has no Hub access) and is checked against
//! transformers' own conversion through tensor hashes in the reference fixture.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::{Value, json};

use super::config::LlamaConfig;
use super::load::GgufFile;
use crate::error::{ErrorKind, fail};
use crate::models::rope::{self, RopeKind};

/// Undoes llama.cpp's `permute(w, n_head)` on q/k weights: rows go back to half-split order.
pub fn reverse_permute(w: &Tensor, n_head: usize) -> candle_core::Result<Tensor> {
    let (out, inp) = w.dims2()?;
    let dim = out / n_head / 2;
    w.reshape((n_head, dim, 2, inp))?.transpose(1, 2)?.contiguous()?.reshape((out, inp))
}

/// All tensors of a llama GGUF as f32 on the CPU, under HF names.
pub fn hf_tensors(gguf: &mut GgufFile) -> anyhow::Result<HashMap<String, Tensor>> {
    let cfg = gguf.config()?;
    let cpu = Device::Cpu;
    let has_output = gguf.has("output.weight");
    let mut out = HashMap::new();
    let mut get =
        |name: &str| -> anyhow::Result<Tensor> { Ok(gguf.qtensor(name, &cpu)?.dequantize(&cpu)?) };
    out.insert("model.embed_tokens.weight".to_string(), get("token_embd.weight")?);
    out.insert("model.norm.weight".to_string(), get("output_norm.weight")?);
    for n in 0..cfg.num_layers {
        let g = |s: &str| format!("blk.{n}.{s}.weight");
        let h = |s: &str| format!("model.layers.{n}.{s}.weight");
        out.insert(h("self_attn.q_proj"), reverse_permute(&get(&g("attn_q"))?, cfg.num_heads)?);
        out.insert(h("self_attn.k_proj"), reverse_permute(&get(&g("attn_k"))?, cfg.num_kv_heads)?);
        out.insert(h("self_attn.v_proj"), get(&g("attn_v"))?);
        out.insert(h("self_attn.o_proj"), get(&g("attn_output"))?);
        out.insert(h("mlp.gate_proj"), get(&g("ffn_gate"))?);
        out.insert(h("mlp.up_proj"), get(&g("ffn_up"))?);
        out.insert(h("mlp.down_proj"), get(&g("ffn_down"))?);
        out.insert(h("input_layernorm"), get(&g("attn_norm"))?);
        out.insert(h("post_attention_layernorm"), get(&g("ffn_norm"))?);
    }
    if has_output {
        out.insert("lm_head.weight".to_string(), get("output.weight")?);
    }
    Ok(out)
}

/// Writes `model.safetensors` (f32) and a `config.json` for the GGUF into `dir`.
pub fn write_hf_checkpoint(gguf: &mut GgufFile, dir: &Path) -> anyhow::Result<()> {
    let cfg = gguf.config()?;
    let tensors = hf_tensors(gguf)?;
    let tied = !tensors.contains_key("lm_head.weight");
    std::fs::create_dir_all(dir)?;
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    let mut config = json!({
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    });
    if let Some(scaling) = rope_scaling(&cfg)? {
        config["rope_scaling"] = scaling;
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

/// `rope_scaling` for config.json: the GGUF's RoPE in transformers' terms. llama.cpp stores
/// llama3 scaling only as `rope_freqs.weight`, so the parameters are recovered from the
/// factors; factors no llama3 scaling explains are refused, since a config.json without them
/// would describe a model that rotates differently.
fn rope_scaling(cfg: &LlamaConfig) -> anyhow::Result<Option<Value>> {
    let kind = match &cfg.rope {
        RopeKind::Default => return Ok(None),
        RopeKind::FreqFactors { factors } => {
            rope::llama3_from_factors(factors, cfg.rope_theta, cfg.head_dim).ok_or_else(|| {
                fail(
                    ErrorKind::InvalidInput,
                    "rope_freqs.weight is not llama3 scaling: config.json cannot express these RoPE frequencies",
                )
            })?
        }
        other => other.clone(),
    };
    match kind {
        RopeKind::Linear { factor } => Ok(Some(json!({"rope_type": "linear", "factor": factor}))),
        RopeKind::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } => {
            Ok(Some(json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max,
            })))
        }
        other => anyhow::bail!("no config.json form for RoPE {other:?} from a GGUF"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_permute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, out/n_head/2, in).swapaxes(1, 2).reshape(out, in)
        let (n_head, out, inp) = (3, 12, 5);
        let w = Tensor::arange(0f32, (out * inp) as f32, &Device::Cpu)
            .unwrap()
            .reshape((out, inp))
            .unwrap();
        let permuted = w
            .reshape((n_head, 2, out / n_head / 2, inp))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((out, inp))
            .unwrap();
        let back = reverse_permute(&permuted, n_head).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
        assert_ne!(permuted.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
    }
}
