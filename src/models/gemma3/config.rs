//! Gemma 3 (text) configuration: from an HF `config.json` (`gemma3_text`, the 1B's flat config,
//! or `gemma3`, whose sparse `text_config` takes transformers' `Gemma3TextConfig` defaults for
//! every key it leaves out) or from GGUF `gemma3.*` metadata, read as llama.cpp reads it.

use serde_json::{Map, Value};

use crate::error::{ErrorKind, fail};
use crate::inspect::gguf::FullMetadata;
use crate::models::rope::{RopeKind, RopeScaling};

/// What the model code uses, whichever file it came from.
#[derive(Debug, Clone)]
pub struct Gemma3Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    /// The global (full-attention) layers' RoPE base and scaling (linear ×8 on 4B+).
    pub rope_theta: f64,
    pub rope: RopeKind,
    /// The sliding layers' RoPE base (1e4), never scaled.
    pub rope_local_theta: f64,
    /// Keys `j` a sliding layer's query `i` sees: `i − j < sliding_window`.
    pub sliding_window: usize,
    /// Per layer: sliding-window attention (else global).
    pub sliding: Vec<bool>,
    /// Scores are scaled by `query_pre_attn_scalar^-0.5` (256; 168 on 27B, where head_dim is
    /// 128).
    pub query_pre_attn_scalar: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The checkpoint's own dtype name (`bfloat16`, `float32`), if stated.
    pub checkpoint_dtype: Option<String>,
}

fn bad(msg: impl std::fmt::Display) -> anyhow::Error {
    fail(ErrorKind::InvalidInput, format!("config.json: {msg}"))
}

/// The keys of a Gemma 3 text config, with `Gemma3TextConfig`'s defaults.
struct Keys<'a>(&'a Map<String, Value>);

impl Keys<'_> {
    fn uint(&self, key: &str, default: usize) -> anyhow::Result<usize> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad(format!("{key} should be a non-negative integer, not {v}"))),
        }
    }

    fn float(&self, key: &str, default: f64) -> anyhow::Result<f64> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| bad(format!("{key} should be a number, not {v}"))),
        }
    }

    fn string(&self, key: &str) -> anyhow::Result<Option<&str>> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(bad(format!("{key} should be a string, not {v}"))),
        }
    }

    fn flag(&self, key: &str, default: bool) -> anyhow::Result<bool> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(bad(format!("{key} should be true or false, not {v}"))),
        }
    }

    /// Set to something other than null.
    fn is_set(&self, key: &str) -> bool {
        self.0.get(key).is_some_and(|v| !v.is_null())
    }
}

impl Gemma3Config {
    /// From a `config.json` text of `model_type` `gemma3_text` or `gemma3` (its `text_config`).
    pub fn from_hf_json(text: &str) -> anyhow::Result<Gemma3Config> {
        let value: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let top = value.as_object().ok_or_else(|| bad("not a JSON object"))?;
        let dtype_of = |m: &Map<String, Value>| {
            ["torch_dtype", "dtype"]
                .iter()
                .find_map(|k| m.get(*k).and_then(Value::as_str).map(str::to_string))
        };
        let (text_cfg, outer_dtype) = match top.get("model_type").and_then(Value::as_str) {
            Some("gemma3_text") => (top, None),
            Some("gemma3") => {
                let inner = match top.get("text_config") {
                    Some(Value::Object(m)) => m,
                    Some(_) => return Err(bad("gemma3's text_config should be an object")),
                    None => return Err(bad("model_type \"gemma3\" needs a text_config")),
                };
                match inner.get("model_type").and_then(Value::as_str) {
                    None | Some("gemma3_text") => {}
                    Some(other) => {
                        return Err(bad(format!(
                            "gemma3's text_config has model_type {other:?}, not \"gemma3_text\""
                        )));
                    }
                }
                (inner, dtype_of(top))
            }
            other => return Err(bad(format!("model_type {other:?} is not Gemma 3"))),
        };
        let k = Keys(text_cfg);
        for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if k.is_set(key) {
                return Err(bad(format!("{key} is set, but Gemma 3 has no softcap")));
            }
        }
        if k.flag("attention_bias", false)? {
            return Err(bad("attention_bias is true, but Gemma 3 has no biases"));
        }
        if k.flag("use_bidirectional_attention", false)? {
            return Err(bad("use_bidirectional_attention (an embedding model) is not supported"));
        }
        let act = k.string("hidden_activation")?.or(k.string("hidden_act")?);
        if let Some(act) = act.filter(|a| *a != "gelu_pytorch_tanh") {
            return Err(bad(format!("hidden_activation {act:?} (Gemma 3 uses gelu_pytorch_tanh)")));
        }
        let num_layers = k.uint("num_hidden_layers", 26)?;
        let (rope_theta, rope, rope_local_theta) = hf_rope(&k)?;
        let cfg = Gemma3Config {
            hidden_size: k.uint("hidden_size", 2304)?,
            intermediate_size: k.uint("intermediate_size", 9216)?,
            num_layers,
            num_heads: k.uint("num_attention_heads", 8)?,
            num_kv_heads: k.uint("num_key_value_heads", 4)?,
            head_dim: k.uint("head_dim", 256)?,
            vocab_size: k.uint("vocab_size", 262_208)?,
            rms_norm_eps: k.float("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope,
            rope_local_theta,
            sliding_window: k.uint("sliding_window", 4096)?,
            sliding: hf_layer_types(&k, num_layers)?,
            query_pre_attn_scalar: k.float("query_pre_attn_scalar", 256.0)?,
            max_position_embeddings: k.uint("max_position_embeddings", 131_072)?,
            tie_word_embeddings: k.flag("tie_word_embeddings", true)?,
            checkpoint_dtype: dtype_of(text_cfg).or(outer_dtype),
        };
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// The config from `gemma3.*` metadata (`vocab_size` from the embedding's rows, `tied`
    /// when the file has no `output.weight`). There is no key for query_pre_attn_scalar, the
    /// local RoPE base or the pattern: as llama.cpp, sliding layers (when
    /// `attention.sliding_window` is set) are those with `(i + 1) % 6 ≠ 0`, rotate with base
    /// 1e4 unscaled, and scores are scaled by `head_dim^-0.5`, or by `(hidden / heads)^-0.5`
    /// on the 62-layer 27B (168).
    pub fn from_gguf(md: &FullMetadata, vocab_size: usize, tied: bool) -> anyhow::Result<Self> {
        let m = Meta(md);
        let num_layers = m.usize("block_count")?;
        let hidden = m.usize("embedding_length")?;
        let heads = m.usize("attention.head_count")?;
        let head_dim = match m.uint("attention.key_length")? {
            Some(d) => d,
            None => hidden / heads.max(1),
        };
        if m.uint("attention.value_length")?.is_some_and(|v| v != head_dim) {
            return Err(gguf_bad("attention.value_length differs from attention.key_length"));
        }
        let window = m.uint("attention.sliding_window")?.unwrap_or(0);
        let sliding = (0..num_layers).map(|i| window > 0 && (i + 1) % 6 != 0).collect();
        let scalar = if num_layers == 62 { hidden / heads.max(1) } else { head_dim };
        if m.float("final_logit_softcapping")?.is_some_and(|c| c != 0.0) {
            return Err(gguf_bad("final_logit_softcapping is set, but Gemma 3 has no softcap"));
        }
        let rope = match m.string("rope.scaling.type")? {
            None | Some("none") => RopeKind::Default,
            Some("linear") => match m.float("rope.scaling.factor")? {
                Some(f) if f > 0.0 && f != 1.0 => RopeKind::Linear { factor: f },
                _ => RopeKind::Default,
            },
            Some(other) => return Err(gguf_bad(format!("rope.scaling.type {other:?}"))),
        };
        let cfg = Gemma3Config {
            hidden_size: hidden,
            intermediate_size: m.usize("feed_forward_length")?,
            num_layers,
            num_heads: heads,
            num_kv_heads: m.uint("attention.head_count_kv")?.unwrap_or(heads),
            head_dim,
            vocab_size,
            rms_norm_eps: m.float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            rope_theta: m.float("rope.freq_base")?.unwrap_or(1e6),
            rope,
            rope_local_theta: m.float("rope.freq_base_swa")?.unwrap_or(1e4),
            sliding_window: window.max(1),
            sliding,
            query_pre_attn_scalar: scalar as f64,
            max_position_embeddings: m.usize("context_length")?,
            tie_word_embeddings: tied,
            checkpoint_dtype: None,
        };
        cfg.validate().map_err(gguf_bad)?;
        Ok(cfg)
    }

    /// Whether any layer slides.
    pub fn has_sliding(&self) -> bool {
        self.sliding.iter().any(|&s| s)
    }

    /// What a corrupt or hostile file could get wrong, before anything is sized by it.
    fn validate(&self) -> Result<(), String> {
        if self.num_layers == 0 || self.num_layers > 4096 {
            return Err(format!("{} layers is not in 1..=4096", self.num_layers));
        }
        let heads_ok = self.num_heads > 0
            && self.num_kv_heads > 0
            && self.num_heads.is_multiple_of(self.num_kv_heads);
        if !heads_ok {
            return Err(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 1024 {
            return Err(format!("head_dim {} is not even and in 2..=1024", self.head_dim));
        }
        if self.hidden_size == 0 || self.intermediate_size == 0 || self.vocab_size == 0 {
            return Err("hidden_size, intermediate_size and vocab_size must be positive".into());
        }
        if self.sliding_window == 0 {
            return Err("sliding_window must be positive".into());
        }
        if !(self.query_pre_attn_scalar > 0.0 && self.query_pre_attn_scalar.is_finite()) {
            return Err(format!(
                "query_pre_attn_scalar {} is not positive",
                self.query_pre_attn_scalar
            ));
        }
        if !(self.rms_norm_eps >= 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(format!(
                "rms_norm_eps {} is not a small positive number",
                self.rms_norm_eps
            ));
        }
        for theta in [self.rope_theta, self.rope_local_theta] {
            if !(theta > 1.0 && theta.is_finite()) {
                return Err(format!("RoPE base {theta} is not above 1"));
            }
        }
        if self.sliding.len() != self.num_layers {
            return Err(format!(
                "{} layer types for {} layers",
                self.sliding.len(),
                self.num_layers
            ));
        }
        Ok(())
    }
}

/// The global layers' RoPE (base and scaling) and the local base: the Hub's `rope_theta`,
/// `rope_scaling` and `rope_local_base_freq`, or transformers 5.x's `rope_parameters` with one
/// entry per layer type (`full_attention`, `sliding_attention`).
fn hf_rope(k: &Keys) -> anyhow::Result<(f64, RopeKind, f64)> {
    let max_pos = k.uint("max_position_embeddings", 131_072)?;
    let parse = |v: &Value, what: &str| -> anyhow::Result<RopeScaling> {
        serde_json::from_value(v.clone()).map_err(|e| bad(format!("{what}: {e}")))
    };
    let kind = |s: Option<&RopeScaling>, what: &str| -> anyhow::Result<RopeKind> {
        let kind = RopeKind::from_scaling(s, max_pos).map_err(|e| bad(format!("{what}: {e}")))?;
        match kind {
            RopeKind::Default | RopeKind::Linear { .. } => Ok(kind),
            other => {
                Err(bad(format!("{what}: {other:?} is not Gemma 3's RoPE (default or linear)")))
            }
        }
    };
    let params = k.0.get("rope_parameters").filter(|v| !v.is_null());
    if let Some(Value::Object(p)) = params
        && (p.contains_key("full_attention") || p.contains_key("sliding_attention"))
    {
        let get = |name: &str| -> anyhow::Result<Option<RopeScaling>> {
            p.get(name).map(|v| parse(v, &format!("rope_parameters.{name}"))).transpose()
        };
        let (full, local) = (get("full_attention")?, get("sliding_attention")?);
        let theta = full.as_ref().and_then(|s| s.rope_theta);
        let local_theta = local.as_ref().and_then(|s| s.rope_theta);
        let local_kind = kind(local.as_ref(), "rope_parameters.sliding_attention")?;
        if local_kind != RopeKind::Default {
            return Err(bad("rope_parameters.sliding_attention: the local RoPE is never scaled"));
        }
        return Ok((
            theta.map_or_else(|| k.float("rope_theta", 1e6), Ok)?,
            kind(full.as_ref(), "rope_parameters.full_attention")?,
            local_theta.map_or_else(|| k.float("rope_local_base_freq", 1e4), Ok)?,
        ));
    }
    let scaling = match (k.0.get("rope_scaling").filter(|v| !v.is_null()), params) {
        (Some(v), _) => Some(parse(v, "rope_scaling")?),
        (None, Some(v)) => Some(parse(v, "rope_parameters")?),
        (None, None) => None,
    };
    let theta = match scaling.as_ref().and_then(|s| s.rope_theta) {
        Some(t) => t,
        None => k.float("rope_theta", 1e6)?,
    };
    let rope = kind(scaling.as_ref(), "rope_scaling")?;
    Ok((theta, rope, k.float("rope_local_base_freq", 1e4)?))
}

/// Which layers slide: `layer_types` when given, else every layer but each
/// `sliding_window_pattern`-th (6).
fn hf_layer_types(k: &Keys, layers: usize) -> anyhow::Result<Vec<bool>> {
    match k.0.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(types)) => {
            if types.len() != layers {
                return Err(bad(format!(
                    "layer_types has {} entries for {layers} layers",
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(bad(format!("layer_types holds {t}, not sliding or full attention"))),
                })
                .collect()
        }
        Some(v) => Err(bad(format!("layer_types should be a list, not {v}"))),
        None => {
            let pattern = k.uint("sliding_window_pattern", 6)?;
            if pattern == 0 {
                return Err(bad("sliding_window_pattern must be positive"));
            }
            Ok((0..layers).map(|i| (i + 1) % pattern != 0).collect())
        }
    }
}

fn gguf_bad(msg: impl std::fmt::Display) -> anyhow::Error {
    fail(ErrorKind::InvalidInput, format!("gemma3 GGUF: {msg}"))
}

/// Typed reads of `gemma3.<key>`; a value of the wrong type is a bad file.
struct Meta<'a>(&'a FullMetadata);

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&candle_core::quantized::gguf_file::Value> {
        self.0.get(&format!("gemma3.{key}"))
    }

    fn uint(&self, key: &str) -> anyhow::Result<Option<usize>> {
        use candle_core::quantized::gguf_file::Value as V;
        let v: Option<i128> = match self.get(key) {
            None => None,
            Some(V::U8(x)) => Some((*x).into()),
            Some(V::U16(x)) => Some((*x).into()),
            Some(V::U32(x)) => Some((*x).into()),
            Some(V::U64(x)) => Some((*x).into()),
            Some(V::I8(x)) => Some((*x).into()),
            Some(V::I16(x)) => Some((*x).into()),
            Some(V::I32(x)) => Some((*x).into()),
            Some(V::I64(x)) => Some((*x).into()),
            Some(_) => return Err(gguf_bad(format!("gemma3.{key} should be an integer"))),
        };
        v.map(|v| usize::try_from(v).map_err(|_| gguf_bad(format!("gemma3.{key} = {v}"))))
            .transpose()
    }

    fn usize(&self, key: &str) -> anyhow::Result<usize> {
        self.uint(key)?.ok_or_else(|| gguf_bad(format!("the metadata lacks gemma3.{key}")))
    }

    fn float(&self, key: &str) -> anyhow::Result<Option<f64>> {
        use candle_core::quantized::gguf_file::Value as V;
        match self.get(key) {
            None => Ok(None),
            Some(V::F32(x)) => Ok(Some(f64::from(*x))),
            Some(V::F64(x)) => Ok(Some(*x)),
            Some(_) => Err(gguf_bad(format!("gemma3.{key} should be a number"))),
        }
    }

    fn string(&self, key: &str) -> anyhow::Result<Option<&str>> {
        use candle_core::quantized::gguf_file::Value as V;
        match self.get(key) {
            None => Ok(None),
            Some(V::String(s)) => Ok(Some(s)),
            Some(_) => Err(gguf_bad(format!("gemma3.{key} should be a string"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-3-1b-it's config.json.
    const ONE_B: &str = r#"{"architectures":["Gemma3ForCausalLM"],"attention_bias":false,
        "attention_dropout":0.0,"attn_logit_softcapping":null,"bos_token_id":2,"cache_implementation":"hybrid",
        "eos_token_id":[1,106],"final_logit_softcapping":null,"head_dim":256,"hidden_activation":"gelu_pytorch_tanh",
        "hidden_size":1152,"initializer_range":0.02,"intermediate_size":6912,"max_position_embeddings":32768,
        "model_type":"gemma3_text","num_attention_heads":4,"num_hidden_layers":26,"num_key_value_heads":1,
        "pad_token_id":0,"query_pre_attn_scalar":256,"rms_norm_eps":1e-06,"rope_local_base_freq":10000,
        "rope_scaling":null,"rope_theta":1000000,"sliding_window":512,"sliding_window_pattern":6,
        "torch_dtype":"bfloat16","use_cache":true,"vocab_size":262144}"#;

    /// google/gemma-3-4b-it's config.json, vision config shortened.
    const FOUR_B: &str = r#"{"architectures":["Gemma3ForConditionalGeneration"],"boi_token_index":255999,
        "eoi_token_index":256000,"eos_token_id":[1,106],"image_token_index":262144,"initializer_range":0.02,
        "mm_tokens_per_image":256,"model_type":"gemma3","text_config":{"hidden_size":2560,
        "intermediate_size":10240,"model_type":"gemma3_text","num_hidden_layers":34,
        "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
        "torch_dtype":"bfloat16","transformers_version":"4.50.0.dev0",
        "vision_config":{"hidden_size":1152,"model_type":"siglip_vision_model"}}"#;

    #[test]
    fn one_b_flat_config() {
        let c = Gemma3Config::from_hf_json(ONE_B).unwrap();
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim, c.sliding_window), (4, 1, 256, 512));
        assert_eq!(
            (c.rope_theta, c.rope_local_theta, c.rope.clone()),
            (1e6, 1e4, RopeKind::Default)
        );
        let globals: Vec<usize> = (0..26).filter(|&i| !c.sliding[i]).collect();
        assert_eq!(globals, [5, 11, 17, 23]);
        assert!(c.tie_word_embeddings && c.query_pre_attn_scalar == 256.0);
        assert_eq!(c.checkpoint_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn four_b_sparse_text_config_takes_the_defaults() {
        let c = Gemma3Config::from_hf_json(FOUR_B).unwrap();
        assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads), (2560, 34, 8, 4));
        assert_eq!((c.head_dim, c.vocab_size, c.max_position_embeddings), (256, 262_208, 131_072));
        assert_eq!(c.rope, RopeKind::Linear { factor: 8.0 });
        assert_eq!((c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar), (1e6, 1e4, 256.0));
        assert_eq!(c.sliding.iter().filter(|&&s| !s).count(), 5);
        assert_eq!(c.checkpoint_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn rope_parameters_and_layer_types_of_transformers_5() {
        let text = ONE_B
            .replace(r#""rope_local_base_freq":10000,"#, "")
            .replace(r#""rope_scaling":null,"rope_theta":1000000,"#, r#""rope_parameters":{"full_attention":{"rope_type":"linear","factor":4.0,"rope_theta":5e5},"sliding_attention":{"rope_type":"default","rope_theta":2e4}},"#)
            .replace(r#""num_hidden_layers":26"#, r#""num_hidden_layers":3,"layer_types":["full_attention","sliding_attention","full_attention"]"#);
        let c = Gemma3Config::from_hf_json(&text).unwrap();
        assert_eq!((c.rope_theta, c.rope_local_theta), (5e5, 2e4));
        assert_eq!(c.rope, RopeKind::Linear { factor: 4.0 });
        assert_eq!(c.sliding, [false, true, false]);
    }

    #[test]
    fn missing_or_contradictory_keys_are_one_line_errors() {
        let no_text = r#"{"model_type":"gemma3","vision_config":{}}"#.to_string();
        for (bad, says) in [
            (no_text, "needs a text_config"),
            (ONE_B.replace(r#""num_key_value_heads":1"#, r#""num_key_value_heads":3"#), "multiple"),
            (
                ONE_B.replace(
                    r#""final_logit_softcapping":null"#,
                    r#""final_logit_softcapping":30.0"#,
                ),
                "softcap",
            ),
            (ONE_B.replace(r#""sliding_window":512"#, r#""sliding_window":0"#), "sliding_window"),
            (ONE_B.replace("gelu_pytorch_tanh", "silu"), "hidden_activation"),
            (ONE_B.replace(r#""head_dim":256"#, r#""head_dim":"x""#), "head_dim"),
            (
                ONE_B.replace(
                    r#""rope_scaling":null"#,
                    r#""rope_scaling":{"rope_type":"yarn","factor":4.0}"#,
                ),
                "RoPE",
            ),
            (
                ONE_B.replace(
                    r#""sliding_window_pattern":6"#,
                    r#""layer_types":["full_attention"]"#,
                ),
                "layer_types",
            ),
            (
                FOUR_B.replace(r#""model_type":"gemma3_text""#, r#""model_type":"llama""#),
                "text_config",
            ),
        ] {
            let err = Gemma3Config::from_hf_json(&bad).unwrap_err();
            let msg = format!("{err:#}");
            assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput, "{msg}");
            assert!(msg.contains(says) && !msg.contains('\n'), "{says}: {msg}");
        }
    }
}
