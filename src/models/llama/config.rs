//! Llama-family configuration, from an HF `config.json` (llama, and mistral, with its sliding
//! window where it has one) or from GGUF metadata (`llama.*` keys). Families built on Llama's layers
//! (Qwen3, `models/qwen3/`) read their own files into the same config, with the [`Variant`] of
//! the layers they need.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde::Deserialize;

use crate::error::{ErrorKind, fail};
use crate::models::rope::{RopeKind, RopeScaling};
use crate::quant::CtConfig;

/// The subset of HF `config.json` the Llama forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct HfLlamaConfig {
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<RopeScaling>,
    pub rope_parameters: Option<RopeScaling>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    /// Mistral's window over every layer (`null`: full attention).
    pub sliding_window: Option<usize>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_max_pos() -> usize {
    2048
}

/// What a family built on Llama's layers changes in them; Llama's own is [`Variant::LLAMA`].
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// Its reader of a `config.json`.
    pub read_hf: fn(&str) -> anyhow::Result<LlamaConfig>,
    /// q and k RMSNormed over each head before RoPE, one `[head_dim]` weight each for all
    /// heads (`self_attn.{q,k}_norm`, GGUF `attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// The GGUF `general.architecture`, which prefixes its metadata keys.
    pub gguf_arch: &'static str,
    /// GGUF files' q/k pairing: llama.cpp's converter permutes Llama's q/k rows so that RoPE
    /// pairs neighbours (its NORM rope), and leaves NeoX-rope families' rows as they are.
    pub gguf_pairs: RopeStyle,
}

/// How q/k pairs are rotated: HF checkpoints pair dim i with i + d/2; llama.cpp's converter
/// permutes Llama's q/k rows so its GGUF files pair 2i with 2i+1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    HalfSplit,
    Interleaved,
}

impl Variant {
    pub const LLAMA: Variant = Variant {
        read_hf: LlamaConfig::from_hf_json,
        qk_norm: false,
        gguf_arch: "llama",
        gguf_pairs: RopeStyle::Interleaved,
    };
}

/// What the model code uses, whichever file it came from.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// The layers' variant (the family).
    pub variant: Variant,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope: RopeKind,
    pub max_position_embeddings: usize,
    /// Every layer attends to its last `w` positions, its own included (Mistral's
    /// `sliding_window`); `None`: full causal attention.
    pub sliding_window: Option<usize>,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// The checkpoint's own dtype name (`bfloat16`, `float16`, `float32`), if stated.
    pub checkpoint_dtype: Option<String>,
    /// compressed-tensors quantization of the projections, if any.
    pub quant: Option<CtConfig>,
}

impl LlamaConfig {
    pub fn from_hf_json(text: &str) -> anyhow::Result<LlamaConfig> {
        let bad = |e: String| fail(ErrorKind::InvalidInput, format!("config.json: {e}"));
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let hf: HfLlamaConfig =
            serde_json::from_value(value.clone()).map_err(|e| bad(e.to_string()))?;
        match hf.model_type.as_deref() {
            Some("llama") | Some("mistral") | None => {}
            Some(other) => {
                return Err(bad(format!("model_type {other:?} is not a Llama-family model")));
            }
        }
        Self::from_hf(hf, &value, Variant::LLAMA)
    }

    /// From a parsed `config.json` (`value`, and `hf` read from it) whose family has checked
    /// its own keys.
    pub fn from_hf(
        hf: HfLlamaConfig,
        value: &serde_json::Value,
        variant: Variant,
    ) -> anyhow::Result<LlamaConfig> {
        let bad = |e: String| fail(ErrorKind::InvalidInput, format!("config.json: {e}"));
        if hf.num_attention_heads == 0 || hf.num_hidden_layers == 0 || hf.hidden_size == 0 {
            return Err(bad("heads, layers and hidden_size must be positive".into()));
        }
        let scaling = hf.rope_scaling.as_ref().or(hf.rope_parameters.as_ref());
        let theta = hf
            .rope_theta
            .or_else(|| hf.rope_parameters.as_ref().and_then(|p| p.rope_theta))
            .unwrap_or(10000.0);
        let rope = RopeKind::from_scaling(scaling, hf.max_position_embeddings)
            .map_err(|e| bad(e.to_string()))?;
        let cfg = LlamaConfig {
            variant,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim: hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads),
            vocab_size: hf.vocab_size,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: theta,
            rope,
            max_position_embeddings: hf.max_position_embeddings,
            sliding_window: hf.sliding_window,
            tie_word_embeddings: hf.tie_word_embeddings,
            attention_bias: hf.attention_bias,
            mlp_bias: hf.mlp_bias,
            checkpoint_dtype: hf.torch_dtype.or(hf.dtype),
            quant: CtConfig::from_config(value)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From GGUF metadata of a file of `variant`'s architecture (`llama.*` keys for Llama);
    /// `vocab_size` from the embedding, `rope_freqs` from the `rope_freqs.weight` tensor when
    /// the file has one.
    pub fn from_gguf(
        md: &HashMap<String, Value>,
        variant: Variant,
        vocab_size: usize,
        rope_freqs: Option<Vec<f32>>,
    ) -> anyhow::Result<LlamaConfig> {
        let arch = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
            .unwrap_or("");
        let prefix = variant.gguf_arch;
        if arch != prefix {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!("GGUF architecture {arch:?} is not supported (expected {prefix})"),
            ));
        }
        let get = |k: &str| md.get(&format!("{prefix}.{k}"));
        let int = |k: &str| -> anyhow::Result<usize> {
            let v = get(k).ok_or_else(|| {
                fail(ErrorKind::InvalidInput, format!("GGUF metadata lacks {prefix}.{k}"))
            })?;
            Ok(v.to_u64()
                .or_else(|_| v.to_u32().map(u64::from))
                .or_else(|_| v.to_i32().map(|x| x as u64))? as usize)
        };
        let float = |k: &str| {
            get(k).and_then(|v| v.to_f32().ok().map(f64::from).or_else(|| v.to_f64().ok()))
        };
        let heads = int("attention.head_count")?;
        let hidden = int("embedding_length")?;
        // `attention.key_length` where q's width is not the hidden size (Qwen3); the rotated
        // dimensions are all of a head's in every family read here.
        let head_dim = int("attention.key_length")
            .or_else(|_| int("rope.dimension_count"))
            .unwrap_or(hidden / heads.max(1));
        let max_pos = int("context_length").unwrap_or(2048);
        let scaling = get("rope.scaling.type").and_then(|v| v.to_string().ok()).cloned();
        let rope = match (scaling.as_deref(), float("rope.scaling.factor")) {
            // YaRN as llama.cpp's converter writes it (Qwen's long-context setting).
            (Some("yarn"), Some(factor)) => {
                let original = int("rope.scaling.original_context_length").map_err(|_| {
                    fail(
                        ErrorKind::InvalidInput,
                        format!(
                            "GGUF YaRN scaling lacks {prefix}.rope.scaling.original_context_length"
                        ),
                    )
                })?;
                RopeKind::yarn(factor, original)
            }
            (Some("linear"), f) => gguf_rope(f, rope_freqs, head_dim),
            _ => gguf_rope(None, rope_freqs, head_dim),
        }
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("GGUF {e}")))?;
        let cfg = LlamaConfig {
            variant,
            hidden_size: hidden,
            intermediate_size: int("feed_forward_length")?,
            num_layers: int("block_count")?,
            num_heads: heads,
            num_kv_heads: int("attention.head_count_kv").unwrap_or(heads),
            head_dim,
            vocab_size,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: float("rope.freq_base").unwrap_or(10000.0),
            rope,
            max_position_embeddings: max_pos,
            // llama.cpp runs `llama` and `qwen3` files with full attention (its converter
            // writes no Mistral window), and a GGUF is what llama.cpp makes of it.
            sliding_window: None,
            tie_word_embeddings: false,
            attention_bias: false,
            mlp_bias: false,
            checkpoint_dtype: None,
            quant: None,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> anyhow::Result<()> {
        // Lists are sized by the layer count: a corrupt one must not reach an allocation.
        if self.num_layers == 0 || self.num_layers > 4096 {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!("model config: {} layers is not in 1..=4096", self.num_layers),
            ));
        }
        let ok = self.num_heads > 0
            && self.num_kv_heads > 0
            && self.num_heads.is_multiple_of(self.num_kv_heads)
            && self.head_dim.is_multiple_of(2)
            && self.head_dim > 0
            && self.vocab_size > 0;
        if self.sliding_window == Some(0) {
            return Err(fail(
                ErrorKind::InvalidInput,
                "model config: sliding_window 0 sees nothing",
            ));
        }
        if !ok {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "inconsistent model config: {} heads, {} kv heads, head_dim {}, vocab {}",
                    self.num_heads, self.num_kv_heads, self.head_dim, self.vocab_size
                ),
            ));
        }
        Ok(())
    }
}

/// A GGUF's RoPE: linear scaling from the metadata, and llama.cpp's per-pair factors
/// (`rope_freqs.weight`, how its converter stores Llama 3.x's llama3 scaling) when present.
/// llama.cpp applies both, so a linear factor multiplies each per-pair factor.
fn gguf_rope(
    linear: Option<f64>,
    rope_freqs: Option<Vec<f32>>,
    head_dim: usize,
) -> anyhow::Result<RopeKind> {
    Ok(match (rope_freqs, linear) {
        (None, None) => RopeKind::Default,
        (None, Some(factor)) => RopeKind::Linear { factor },
        (Some(factors), linear) => {
            let scale = linear.unwrap_or(1.0) as f32;
            RopeKind::freq_factors(factors.into_iter().map(|f| f * scale).collect(), head_dim)?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = r#"{"model_type":"llama","hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
        "num_attention_heads":9,"num_key_value_heads":3,"vocab_size":49152,"rms_norm_eps":1e-5,"rope_theta":100000.0,
        "max_position_embeddings":8192,"tie_word_embeddings":true,"torch_dtype":"bfloat16"}"#;

    #[test]
    fn hf_config() {
        let c = LlamaConfig::from_hf_json(SMOLLM2).unwrap();
        assert_eq!((c.num_kv_heads, c.head_dim, c.rope_theta), (3, 64, 100000.0));
        assert!(c.tie_word_embeddings && c.rope == RopeKind::Default);
    }

    #[test]
    fn rope_parameters_spelling() {
        let text = SMOLLM2.replace(
            r#""rope_theta":100000.0,"#,
            r#""rope_parameters":{"rope_type":"default","rope_theta":5e5},"#,
        );
        assert_eq!(LlamaConfig::from_hf_json(&text).unwrap().rope_theta, 5e5);
        let l3 = SMOLLM2.replace(
            r#""rope_theta":100000.0,"#,
            r#""rope_theta":5e5,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192},"#,
        );
        assert!(matches!(LlamaConfig::from_hf_json(&l3).unwrap().rope, RopeKind::Llama3 { .. }));
    }

    #[test]
    fn gguf_rope_takes_rope_freqs_and_linear_scaling() {
        assert_eq!(gguf_rope(None, None, 8).unwrap(), RopeKind::Default);
        assert_eq!(gguf_rope(Some(2.0), None, 8).unwrap(), RopeKind::Linear { factor: 2.0 });
        // llama.cpp divides by both, so the linear factor multiplies each pair's factor.
        assert_eq!(
            gguf_rope(Some(2.0), Some(vec![1.0, 1.5, 4.0, 8.0]), 8).unwrap(),
            RopeKind::FreqFactors { factors: vec![2.0, 3.0, 8.0, 16.0] }
        );
        assert!(gguf_rope(None, Some(vec![1.0; 3]), 8).is_err());
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        for bad in [
            SMOLLM2.replace("\"llama\"", "\"gpt2\""),
            SMOLLM2.replace("\"num_key_value_heads\":3", "\"num_key_value_heads\":4"),
            SMOLLM2.replace("\"hidden_size\":576,", ""),
            "not json".to_string(),
        ] {
            let err = LlamaConfig::from_hf_json(&bad).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput, "{err}");
        }
    }
}
