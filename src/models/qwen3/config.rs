//! Qwen3's `config.json` (transformers' `Qwen3Config`) read into Llama's config, and its
//! variant of Llama's layers. Its defaults differ from Llama's where a key is absent:
//! `head_dim` 128 (not hidden / heads), 32768 positions, RMSNorm eps 1e-6.

use serde::Deserialize;

use crate::error::{ErrorKind, fail};
use crate::models::llama::config::{HfLlamaConfig, LlamaConfig, RopeStyle, Variant};

/// Llama's layers as Qwen3 changes them: q/k norms, NeoX pairs in GGUF files (llama.cpp's
/// converter permutes only Llama's q/k rows).
pub const VARIANT: Variant = Variant {
    read_hf: from_hf_json,
    qk_norm: true,
    gguf_arch: "qwen3",
    gguf_pairs: RopeStyle::HalfSplit,
};

/// The keys Qwen3 reads beyond Llama's.
#[derive(Deserialize)]
struct Qwen3Keys {
    model_type: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    layer_types: Option<Vec<String>>,
}

/// A Qwen3 `config.json`.
pub fn from_hf_json(text: &str) -> anyhow::Result<LlamaConfig> {
    let bad = |e: String| fail(ErrorKind::InvalidInput, format!("config.json: {e}"));
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let keys: Qwen3Keys = serde_json::from_value(value.clone()).map_err(|e| bad(e.to_string()))?;
    if keys.model_type.as_deref() != Some("qwen3") {
        return Err(bad(format!("model_type {:?} is not Qwen3", keys.model_type)));
    }
    // Every released Qwen3 attends in full; the sliding window its config carries is unused
    // unless `use_sliding_window` (or a `sliding_attention` layer type) says otherwise.
    let sliding = keys.layer_types.iter().flatten().any(|t| t != "full_attention");
    if keys.use_sliding_window || sliding {
        return Err(bad("sliding-window attention is not supported for Qwen3 yet".into()));
    }
    let mut hf: HfLlamaConfig =
        serde_json::from_value(value.clone()).map_err(|e| bad(e.to_string()))?;
    hf.head_dim = Some(keys.head_dim.unwrap_or(128));
    hf.sliding_window = None;
    hf.max_position_embeddings = keys.max_position_embeddings.unwrap_or(32768);
    LlamaConfig::from_hf(hf, &value, VARIANT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::rope::RopeKind;

    /// Qwen3-8B's config.json as the Hub has it.
    const QWEN3_8B: &str = r#"{"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
        "bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu","hidden_size":4096,
        "initializer_range":0.02,"intermediate_size":12288,"max_position_embeddings":40960,"max_window_layers":36,
        "model_type":"qwen3","num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,
        "rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":1000000,"sliding_window":null,
        "tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.51.0","use_cache":true,
        "use_sliding_window":false,"vocab_size":151936}"#;

    #[test]
    fn qwen3_8b() {
        let c = from_hf_json(QWEN3_8B).unwrap();
        assert!(c.variant.qk_norm && !c.tie_word_embeddings);
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (32, 8, 128));
        assert_eq!((c.rope_theta, c.max_position_embeddings), (1e6, 40960));
        assert_eq!(c.rope, RopeKind::Default);
    }

    #[test]
    fn head_dim_defaults_to_128_not_hidden_over_heads() {
        // Qwen3-0.6B: 16 heads of 128 over a hidden size of 1024.
        let text = QWEN3_8B.replace(r#""head_dim":128,"#, "").replace("4096", "1024");
        let c = from_hf_json(&text).unwrap();
        assert_eq!((c.hidden_size, c.head_dim), (1024, 128));
    }

    #[test]
    fn yarn_as_qwen_documents_it() {
        let text = QWEN3_8B.replace(
            r#""rope_scaling":null"#,
            r#""rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}"#,
        );
        let c = from_hf_json(&text).unwrap();
        assert!(matches!(
            c.rope,
            RopeKind::Yarn { factor: 4.0, original_max: 32768, truncate: true, .. }
        ));
        assert!((c.rope.attention_scaling() - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn bad_configs_are_one_line_errors() {
        for text in [
            QWEN3_8B.replace(r#""model_type":"qwen3""#, r#""model_type":"qwen2""#),
            QWEN3_8B.replace(r#""use_sliding_window":false"#, r#""use_sliding_window":true"#),
            QWEN3_8B.replace(r#""num_key_value_heads":8"#, r#""num_key_value_heads":5"#),
            QWEN3_8B.replace(r#""hidden_size":4096,"#, ""),
            QWEN3_8B.replace(r#""head_dim":128"#, r#""head_dim":127"#),
        ] {
            let err = from_hf_json(&text).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput, "{err}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
