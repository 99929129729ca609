//! gpt-oss configuration from the HF `config.json` (docs/gpt-oss.md §1). Accepts `rope_scaling` or
//! `rope_parameters` (docs/gpt-oss.md pitfall #2: a loader that reads only one silently drops
//! YaRN) and `layer_types` or the even-sliding/odd-full default.

use serde::Deserialize;

use crate::error::{ErrorKind, fail};
use crate::models::rope::{RopeKind, RopeScaling};

#[derive(Debug, Clone, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    head_dim: Option<usize>,
    // Both spellings appear in the real config (HF and original names): read each.
    num_local_experts: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    experts_per_token: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<RopeScaling>,
    rope_parameters: Option<RopeScaling>,
    max_position_embeddings: usize,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_limit")]
    swiglu_limit: f64,
    swiglu_alpha: Option<f64>,
    #[serde(default)]
    tie_word_embeddings: bool,
}

/// More layers than any real model has (gpt-oss-120b: 36); past this a config is corrupt.
const MAX_LAYERS: usize = 4096;

fn default_eps() -> f64 {
    1e-5
}

fn default_limit() -> f64 {
    7.0
}

#[derive(Debug, Clone)]
pub struct GptOssConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope: RopeKind,
    pub max_position_embeddings: usize,
    /// Keys a sliding layer sees, the current one included (128).
    pub sliding_window: usize,
    /// Per layer: true for sliding-window attention.
    pub sliding: Vec<bool>,
    pub swiglu_limit: f32,
    pub swiglu_alpha: f32,
    pub tie_word_embeddings: bool,
}

impl GptOssConfig {
    pub fn from_hf_json(text: &str) -> anyhow::Result<GptOssConfig> {
        let bad = |e: String| fail(ErrorKind::InvalidInput, format!("config.json: {e}"));
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if hf.model_type.as_deref() != Some("gpt_oss") {
            return Err(bad(format!("model_type {:?} is not gpt_oss", hf.model_type)));
        }
        let scaling = hf.rope_scaling.as_ref().or(hf.rope_parameters.as_ref());
        let rope = RopeKind::from_scaling(scaling, hf.max_position_embeddings)
            .map_err(|e| bad(e.to_string()))?;
        let theta = hf
            .rope_theta
            .or_else(|| hf.rope_parameters.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(150000.0);
        // The per-layer lists below are sized by this number: bound it before allocating.
        if hf.num_hidden_layers == 0 || hf.num_hidden_layers > MAX_LAYERS {
            return Err(bad(format!(
                "num_hidden_layers {} is not in 1..={MAX_LAYERS}",
                hf.num_hidden_layers
            )));
        }
        let sliding = match &hf.layer_types {
            Some(types) => {
                if types.len() != hf.num_hidden_layers {
                    return Err(bad(format!(
                        "layer_types has {} entries for {} layers",
                        types.len(),
                        hf.num_hidden_layers
                    )));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "sliding_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        other => Err(bad(format!("unknown layer type {other:?}"))),
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?
            }
            None => (0..hf.num_hidden_layers).map(|n| n % 2 == 0).collect(),
        };
        let cfg = GptOssConfig {
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads,
            head_dim: hf.head_dim.unwrap_or(64),
            num_experts: hf
                .num_local_experts
                .or(hf.num_experts)
                .ok_or_else(|| bad("num_local_experts is missing".into()))?,
            experts_per_token: hf
                .num_experts_per_tok
                .or(hf.experts_per_token)
                .ok_or_else(|| bad("num_experts_per_tok is missing".into()))?,
            vocab_size: hf.vocab_size,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: theta,
            rope,
            max_position_embeddings: hf.max_position_embeddings,
            sliding_window: hf.sliding_window.unwrap_or(128),
            sliding,
            swiglu_limit: hf.swiglu_limit as f32,
            swiglu_alpha: hf.swiglu_alpha.unwrap_or(1.702) as f32,
            tie_word_embeddings: hf.tie_word_embeddings,
        };
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return Err(format!(
                "{} heads cannot be grouped over {} kv heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.hidden_size.is_multiple_of(32) || !self.intermediate_size.is_multiple_of(32) {
            return Err("MXFP4 experts need hidden and intermediate sizes divisible by 32".into());
        }
        if self.experts_per_token == 0 || self.experts_per_token > self.num_experts {
            return Err(format!(
                "{} experts per token out of {}",
                self.experts_per_token, self.num_experts
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.sliding_window == 0 {
            return Err("head_dim must be even and sliding_window positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT_OSS_20B: &str = r#"{"architectures":["GptOssForCausalLM"],"model_type":"gpt_oss","hidden_size":2880,
      "intermediate_size":2880,"num_hidden_layers":24,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,
      "num_local_experts":32,"num_experts_per_tok":4,"experts_per_token":4,"vocab_size":201088,"rms_norm_eps":1e-05,
      "rope_theta":150000,"rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":32.0,
      "original_max_position_embeddings":4096,"rope_type":"yarn","truncate":false},"max_position_embeddings":131072,
      "initial_context_length":4096,"sliding_window":128,"swiglu_limit":7.0,"attention_bias":true,
      "tie_word_embeddings":false,"layer_types":["sliding_attention","full_attention","sliding_attention","full_attention",
      "sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention",
      "sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention",
      "sliding_attention","full_attention","sliding_attention","full_attention","sliding_attention","full_attention",
      "sliding_attention","full_attention"]}"#;

    #[test]
    fn the_real_20b_config() {
        let c = GptOssConfig::from_hf_json(GPT_OSS_20B).unwrap();
        assert_eq!(
            (c.head_dim, c.num_heads, c.num_kv_heads, c.num_experts, c.experts_per_token),
            (64, 64, 8, 32, 4)
        );
        assert!(c.sliding[0] && !c.sliding[1] && c.sliding[22]);
        assert!(matches!(c.rope, RopeKind::Yarn { truncate: false, .. }));
    }

    #[test]
    fn rope_parameters_and_default_layer_types() {
        let text = GPT_OSS_20B
            .replace(r#""rope_theta":150000,"rope_scaling""#, r#""rope_parameters""#)
            .replace(r#""truncate":false}"#, r#""truncate":false,"rope_theta":150000}"#);
        let start = text.find(r#","layer_types""#).unwrap();
        let text = format!("{}}}", &text[..start]);
        let c = GptOssConfig::from_hf_json(&text).unwrap();
        assert_eq!(c.rope_theta, 150000.0);
        assert!(matches!(c.rope, RopeKind::Yarn { .. }), "YaRN must not be dropped");
        assert_eq!(c.sliding, (0..24).map(|n| n % 2 == 0).collect::<Vec<_>>());
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        for bad in [
            GPT_OSS_20B.replace(r#""num_key_value_heads":8"#, r#""num_key_value_heads":7"#),
            GPT_OSS_20B.replace(r#""num_experts_per_tok":4"#, r#""num_experts_per_tok":40"#),
            GPT_OSS_20B.replace(r#""gpt_oss""#, r#""llama""#),
            GPT_OSS_20B
                .replace(r#""sliding_attention","full_attention"]"#, r#""sliding_attention"]"#),
            // No layer_types and a layer count that would size a list of 10^18 entries.
            GPT_OSS_20B[..GPT_OSS_20B.find(r#","layer_types""#).unwrap()]
                .replace(r#""num_hidden_layers":24"#, r#""num_hidden_layers":1000000000000000000"#)
                + "}",
        ] {
            let err = GptOssConfig::from_hf_json(&bad).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput, "{err}");
        }
    }
}
