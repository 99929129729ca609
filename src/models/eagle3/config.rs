//! An EAGLE-3 draft head's `config.json`, in the two published layouts (docs/speculation.md,
//! "EAGLE-3 heads"):
//!
//! - SpecForge / lmsys (`architectures ["LlamaForCausalLMEagle3"]`): a Llama config at the top
//!   level with `draft_vocab_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`;
//! - speculators (`architectures ["Eagle3Speculator"]`): the Llama config nested in
//!   `transformer_layer_config`, the EAGLE keys at the top level (`draft_vocab_size`,
//!   `target_hidden_size`, `norm_before_residual`, `norm_before_fc`, ...).
//!
//! The two mean different things by a tap id: SGLang, which SpecForge heads are trained
//! against, taps the *output* of layer `id`; vLLM, speculators' engine, the stream *entering*
//! layer `id`. Inside inferno a tap is always the stream entering a layer (the last layer's
//! output is "entering" layer L), so a SpecForge id is read as `id + 1`.

use serde_json::Value;

use crate::error::{ErrorKind, fail};
use crate::models::llama::config::LlamaConfig;

/// Where a head comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// SpecForge / lmsys (`LlamaForCausalLMEagle3`; also vLLM's `Eagle3LlamaForCausalLM`
    /// name): module `midlayer.*`, tap ids are layer outputs.
    SpecForge,
    /// speculators (`Eagle3Speculator`): module `layers.0.*`, tap ids are layer inputs.
    Speculators,
}

/// What the head needs from its config.
#[derive(Debug, Clone)]
pub struct Eagle3Config {
    pub layout: Layout,
    /// The decoder layer's shape, RoPE and norms (its `vocab_size` is the target's).
    pub layer: LlamaConfig,
    pub draft_vocab: usize,
    /// The target's hidden size the taps have (the head's own when the config says nothing).
    pub target_hidden: usize,
    /// Taps as residual streams entering these target layers (`L` = after the last), converted
    /// from the layout's convention; `None`: the default for the target's depth ([`Self::taps`]).
    aux_ids: Option<Vec<usize>>,
    /// The layer's residual is the normed feature (`hidden_norm(g)`), not `g`.
    pub norm_before_residual: bool,
    /// One RMSNorm (`input_norm`) over the concatenated taps before `fc`.
    pub norm_before_fc: bool,
}

/// Whether the `config.json` text is an EAGLE-3 head's (either layout).
pub fn is_eagle3(config: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(config) else { return false };
    layout_of(&v).is_some()
}

fn layout_of(v: &Value) -> Option<Layout> {
    let archs = v.get("architectures")?.as_array()?;
    archs.iter().filter_map(Value::as_str).find_map(|a| match a {
        "LlamaForCausalLMEagle3" | "Eagle3LlamaForCausalLM" => Some(Layout::SpecForge),
        "Eagle3Speculator" => Some(Layout::Speculators),
        _ => None,
    })
}

impl Eagle3Config {
    pub fn from_json(text: &str) -> anyhow::Result<Eagle3Config> {
        let bad = |e: String| fail(ErrorKind::InvalidInput, format!("EAGLE-3 config.json: {e}"));
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let layout = layout_of(&v).ok_or_else(|| {
            bad("architectures names neither LlamaForCausalLMEagle3 nor Eagle3Speculator".into())
        })?;
        let layer_json = match layout {
            Layout::SpecForge => v.clone(),
            Layout::Speculators => v
                .get("transformer_layer_config")
                .cloned()
                .ok_or_else(|| bad("transformer_layer_config is missing".into()))?,
        };
        let layer = LlamaConfig::from_hf_json(&with_llama_type(layer_json).to_string())?;
        let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
        for unsupported in ["fc_norm", "norm_output"] {
            if flag(unsupported) {
                return Err(bad(format!("{unsupported}: true is not supported")));
            }
        }
        let draft_vocab = v
            .get("draft_vocab_size")
            .and_then(Value::as_u64)
            .map_or(layer.vocab_size, |n| n as usize);
        let target_hidden = v
            .get("target_hidden_size")
            .and_then(Value::as_u64)
            .map_or(layer.hidden_size, |n| n as usize);
        let ids = v
            .get("eagle_aux_hidden_state_layer_ids")
            .or_else(|| {
                v.get("eagle_config").and_then(|e| e.get("eagle_aux_hidden_state_layer_ids"))
            })
            .filter(|x| !x.is_null());
        let aux_ids = match ids {
            None => None,
            Some(x) => {
                let ids: Vec<usize> = serde_json::from_value(x.clone())
                    .map_err(|e| bad(format!("eagle_aux_hidden_state_layer_ids: {e}")))?;
                let shift = usize::from(layout == Layout::SpecForge);
                Some(ids.iter().map(|i| i + shift).collect())
            }
        };
        if aux_ids.as_ref().is_some_and(|ids: &Vec<usize>| ids.len() != 3) {
            return Err(bad("eagle_aux_hidden_state_layer_ids must name 3 layers".into()));
        }
        if draft_vocab == 0 || draft_vocab > layer.vocab_size {
            return Err(bad(format!(
                "draft_vocab_size {draft_vocab} must be 1 to vocab_size {}",
                layer.vocab_size
            )));
        }
        Ok(Eagle3Config {
            layout,
            layer,
            draft_vocab,
            target_hidden,
            aux_ids,
            norm_before_residual: flag("norm_before_residual"),
            norm_before_fc: flag("norm_before_fc"),
        })
    }

    /// Bytes its weights take in `dtype` (norms in f32), with its own embedding when `own_embed`.
    pub fn weight_bytes(&self, dtype: candle_core::DType, own_embed: bool) -> u64 {
        let l = &self.layer;
        let (h, i) = (l.hidden_size as u64, l.intermediate_size as u64);
        let (qd, kvd) = ((l.num_heads * l.head_dim) as u64, (l.num_kv_heads * l.head_dim) as u64);
        let embed = if own_embed { l.vocab_size as u64 * h } else { 0 };
        let params = 3 * self.target_hidden as u64 * h
            + (qd + 2 * kvd) * 2 * h
            + h * qd
            + 3 * h * i
            + self.draft_vocab as u64 * h
            + embed;
        params * dtype.size_in_bytes() as u64 + 4 * (4 * h + 3 * self.target_hidden as u64)
    }

    /// The three target layers whose entering residual stream feeds the head, for a target of
    /// `layers` layers: the config's, else vLLM's and SGLang's default `(2, L/2, L − 3)` (as
    /// layer inputs). Refused when one is past the target's last layer's output.
    pub fn taps(&self, layers: usize) -> anyhow::Result<[usize; 3]> {
        let ids = match &self.aux_ids {
            Some(ids) => [ids[0], ids[1], ids[2]],
            None => [2.min(layers), layers / 2, layers.saturating_sub(3)],
        };
        if let Some(bad) = ids.iter().find(|&&i| i > layers) {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "the EAGLE-3 head taps layer {bad}, past the model's {layers} layers: it was trained for another model"
                ),
            ));
        }
        Ok(ids)
    }
}

/// The nested layer config as `LlamaConfig` reads it: SpecForge's says `model_type llama`
/// already; speculators' may omit it or carry an `architectures` of its own.
fn with_llama_type(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("model_type".into(), Value::String("llama".into()));
        o.remove("sliding_window");
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: &str = r#""hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320"#;

    #[test]
    fn reads_both_layouts_with_their_tap_conventions() {
        let sf = format!(
            r#"{{"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", {LAYER},
            "draft_vocab_size": 100, "eagle_config": {{"eagle_aux_hidden_state_layer_ids": [1, 17, 33]}}}}"#
        );
        let c = Eagle3Config::from_json(&sf).expect("SpecForge config");
        assert_eq!(c.layout, Layout::SpecForge);
        assert_eq!((c.draft_vocab, c.target_hidden), (100, 64));
        assert_eq!(c.taps(36).expect("taps"), [2, 18, 34]);
        assert!(c.taps(24).is_err(), "a 24-layer model has no layer 34");

        let sp = format!(
            r#"{{"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": {{{LAYER}}}, "draft_vocab_size": 32, "target_hidden_size": 48,
            "norm_before_residual": true, "eagle_aux_hidden_state_layer_ids": [2, 18, 33]}}"#
        );
        let c = Eagle3Config::from_json(&sp).expect("speculators config");
        assert_eq!(c.layout, Layout::Speculators);
        assert_eq!((c.draft_vocab, c.target_hidden), (32, 48));
        assert!(c.norm_before_residual && !c.norm_before_fc);
        assert_eq!(c.taps(36).expect("taps"), [2, 18, 33]);
        assert!(is_eagle3(&sp) && is_eagle3(&sf));
        assert!(!is_eagle3(r#"{"architectures": ["LlamaForCausalLM"]}"#));
    }

    #[test]
    fn defaults_and_refusals() {
        let base = format!(r#"{{"architectures": ["LlamaForCausalLMEagle3"], {LAYER}"#);
        let c = Eagle3Config::from_json(&format!("{base}}}")).expect("config");
        assert_eq!(c.taps(24).expect("taps"), [2, 12, 21]);
        assert_eq!(c.draft_vocab, 320);
        for extra in [r#""fc_norm": true"#, r#""draft_vocab_size": 400"#] {
            let e = Eagle3Config::from_json(&format!("{base}, {extra}}}")).expect_err("refused");
            assert_eq!(format!("{e:#}").lines().count(), 1);
        }
    }
}
