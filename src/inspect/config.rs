//! The few facts `inferno list` needs from a Hugging Face `config.json`.
//!
//! Only a loose read: every architecture names its fields a little differently, and a model we
//! cannot run yet should still be listed with whatever we can tell about it.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

/// Field names for the trained context length, most common first (GPT-2 style `n_positions`,
/// MPT `max_seq_len`, ChatGLM/Qwen-1 `seq_length`).
const CONTEXT_KEYS: [&str; 4] =
    ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length"];

/// What `config.json` says about a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    /// `model_type`, e.g. `llama`, `gpt_oss`.
    pub model_type: Option<String>,
    pub context_length: Option<u64>,
    /// `quantization_config.quant_method`, lowercased (`mxfp4`, `awq`, `gptq`, `fp8` …); for
    /// compressed-tensors the scheme instead (`w8a8-int8`, `fp8`, `w4a16`).
    pub quant_method: Option<String>,
}

/// Reads `config.json` at `path`; a missing or malformed file is an error.
pub fn read(path: &Path) -> anyhow::Result<ConfigFacts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: Value = serde_json::from_str(&text).context("not valid JSON")?;
    facts(&value)
}

/// Extracts the facts from a parsed config. Multimodal configs keep the language model's
/// fields under `text_config`, so that is searched when the top level lacks them.
pub fn facts(config: &Value) -> anyhow::Result<ConfigFacts> {
    let obj = config.as_object().context("not a JSON object")?;
    let text = obj.get("text_config");
    let model_type = obj.get("model_type").and_then(Value::as_str).map(str::to_string);
    let context_length = context_length(config).or_else(|| text.and_then(context_length));
    let quant = obj.get("quantization_config").or_else(|| obj.get("compression_config"));
    let quant_method = quant.and_then(|q| q.get("quant_method")).and_then(Value::as_str).map(|m| {
        match crate::quant::CtConfig::from_config(config) {
            // A scheme we cannot run is still listed by its method.
            Ok(Some(ct)) => ct.label().to_string(),
            _ => m.to_lowercase(),
        }
    });
    Ok(ConfigFacts { model_type, context_length, quant_method })
}

fn context_length(config: &Value) -> Option<u64> {
    CONTEXT_KEYS.iter().find_map(|k| config.get(k).and_then(Value::as_u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llama_config() {
        let f = facts(
            &json!({"model_type": "llama", "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}),
        );
        let want = ConfigFacts {
            model_type: Some("llama".into()),
            context_length: Some(2048),
            quant_method: None,
        };
        assert_eq!(f.unwrap(), want);
    }

    #[test]
    fn gpt_oss_config() {
        let f = facts(&json!({
            "model_type": "gpt_oss",
            "max_position_embeddings": 131072,
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
        }))
        .unwrap();
        assert_eq!(f.model_type.as_deref(), Some("gpt_oss"));
        assert_eq!(f.context_length, Some(131072));
        assert_eq!(f.quant_method.as_deref(), Some("mxfp4"));
    }

    #[test]
    fn compressed_tensors_shows_the_scheme() {
        let w4 = json!({"model_type": "llama", "compression_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4,
                "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}}});
        assert_eq!(facts(&w4).unwrap().quant_method.as_deref(), Some("w4a16"));
        let odd = json!({"quantization_config": {"quant_method": "compressed-tensors",
            "format": "marlin-24", "config_groups": {}}});
        assert_eq!(facts(&odd).unwrap().quant_method.as_deref(), Some("compressed-tensors"));
    }

    #[test]
    fn context_length_fallbacks() {
        assert_eq!(facts(&json!({"n_positions": 1024})).unwrap().context_length, Some(1024));
        assert_eq!(facts(&json!({"max_seq_len": 8192})).unwrap().context_length, Some(8192));
        assert_eq!(facts(&json!({"seq_length": 32768})).unwrap().context_length, Some(32768));
        let mm =
            json!({"model_type": "gemma3", "text_config": {"max_position_embeddings": 131072}});
        assert_eq!(facts(&mm).unwrap().context_length, Some(131072));
        assert_eq!(facts(&json!({"model_type": "x"})).unwrap().context_length, None);
    }

    #[test]
    fn malformed_config_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config.json");
        std::fs::write(&path, "{\"model_type\": ").unwrap();
        assert!(read(&path).is_err());
        std::fs::write(&path, "[]").unwrap();
        assert!(read(&path).is_err());
    }
}
