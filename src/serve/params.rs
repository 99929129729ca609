//! Request fields to generation settings: the sampler (defaults as `inferno play` has them, so
//! the same request and flags give the same output), the token budget, stop strings, logprobs,
//! and the 400s for values out of range or features not offered (`n > 1`).

use super::errors::ApiError;
use super::openai_types::Common;
use crate::generate::SamplerConfig;

/// Stop strings accepted at most (OpenAI allows 4).
const MAX_STOP: usize = 16;
/// Alternatives per token at most (OpenAI's `top_logprobs` limit; vLLM's default too).
const MAX_TOP_LOGPROBS: i64 = 20;

#[derive(Debug, Clone)]
pub struct Settings {
    pub sampling: SamplerConfig,
    /// As asked; [`clip_max_tokens`] fits it to the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

pub fn settings(c: &Common, max_tokens: Option<i64>, harmony: bool) -> Result<Settings, ApiError> {
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::bad_param(
            "n",
            format!("n = {n} is not supported: this server returns one choice per request (n = 1)"),
        ));
    }
    let mut cfg = crate::chat::default_sampling(harmony);
    if let Some(t) = c.temperature {
        cfg.temperature = finite("temperature", t)? as f32;
    }
    if let Some(p) = c.top_p {
        cfg.top_p = Some(finite("top_p", p)? as f32);
    }
    if let Some(k) = c.top_k {
        cfg.top_k = match k {
            -1 | 0 => None,
            k if k > 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            k => {
                return Err(ApiError::bad_param(
                    "top_k",
                    format!("top_k must be -1, 0 (off) or positive, not {k}"),
                ));
            }
        };
    }
    if let Some(m) = c.min_p {
        cfg.min_p = Some(finite("min_p", m)? as f32);
    }
    // OpenAI's additive penalties, over the output only (see `generate::penalty`).
    for (name, v, field) in [
        ("presence_penalty", c.presence_penalty, &mut cfg.presence_penalty),
        ("frequency_penalty", c.frequency_penalty, &mut cfg.frequency_penalty),
    ] {
        if let Some(v) = v {
            if !(-2.0..=2.0).contains(&finite(name, v)?) {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} must be in [-2, 2], not {v}"),
                ));
            }
            *field = v as f32;
        }
    }
    if let Some(r) = c.repetition_penalty {
        cfg.repeat_penalty = finite("repetition_penalty", r)? as f32;
    }
    if cfg.repeat_penalty != 1.0 && cfg.repeat_last_n == 0 {
        cfg.repeat_last_n = SamplerConfig::default().repeat_last_n;
    }
    cfg.seed = match c.seed {
        Some(s) => s as u64,
        None => rand::random(),
    };
    cfg.validate().map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
    let max_tokens = match max_tokens {
        None => None,
        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("max_tokens must be at least 1, not {n}"),
            ));
        }
    };
    let stop = c.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ApiError::bad_param(
            "stop",
            format!("at most {MAX_STOP} stop strings, not {}", stop.len()),
        ));
    }
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    Ok(Settings {
        sampling: cfg,
        max_tokens,
        stop,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
    })
}

fn finite(name: &str, v: f64) -> Result<f64, ApiError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ApiError::bad_param(name, format!("{name} must be a finite number")))
    }
}

/// The token budget of a request with `prompt` tokens in a `context`: what was asked, at most
/// what the context has left (the reply then ends with `finish_reason: "length"`), or all of
/// it when nothing was asked.
pub fn clip_max_tokens(asked: Option<usize>, prompt: usize, context: usize) -> usize {
    let room = context.saturating_sub(prompt);
    asked.map_or(room, |n| n.min(room))
}

/// Chat's `logprobs` (a bool) and `top_logprobs` (0..=20): the alternatives per token, or
/// `None` when not asked. `top_logprobs` without `logprobs: true` is a 400, as in vLLM.
pub fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top = match top {
        None => 0,
        Some(n) => top_count("top_logprobs", n)?,
    };
    match logprobs {
        Some(true) => Ok(Some(top)),
        _ if top > 0 => {
            Err(ApiError::bad_param("top_logprobs", "top_logprobs needs logprobs: true"))
        }
        _ => Ok(None),
    }
}

/// The completions `logprobs` (an integer 0..=20, the alternatives per token; null or absent
/// for none).
pub fn completion_logprobs(v: Option<&serde_json::Value>) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => Ok(None),
        Some(n) => match n.as_i64() {
            Some(n) => top_count("logprobs", n).map(Some),
            None => Err(ApiError::bad_param(
                "logprobs",
                format!("logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {n}"),
            )),
        },
    }
}

fn top_count(name: &str, n: i64) -> Result<usize, ApiError> {
    if !(0..=MAX_TOP_LOGPROBS).contains(&n) {
        return Err(ApiError::bad_param(
            name,
            format!("{name} must be from 0 to {MAX_TOP_LOGPROBS}, not {n}"),
        ));
    }
    Ok(n as usize)
}

/// `prediction` (OpenAI's Predicted Outputs) as the ids the reply's drafts come from: its text
/// encoded as the reply's would be (no special tokens). A prediction longer than the context
/// could never be repeated, and would cost its length in every draft's search: refused.
pub fn prediction(
    ready: &super::state::Ready,
    p: Option<&super::openai_types::Prediction>,
) -> Result<Vec<u32>, ApiError> {
    let Some(p) = p else { return Ok(Vec::new()) };
    if p.kind != "content" {
        let msg = format!("prediction.type must be \"content\", not {:?}", p.kind);
        return Err(ApiError::bad_param("prediction", msg));
    }
    let text = p
        .content
        .text()
        .map_err(|_| ApiError::bad_param("prediction", "prediction.content parts must be text"))?;
    let ids = ready
        .text
        .tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| ApiError::bad_param("prediction", format!("prediction: {e}")))?
        .get_ids()
        .to_vec();
    let context = ready.engine.context();
    if ids.len() > context {
        let msg = format!(
            "prediction is {} tokens, longer than the context ({context}): it could not be repeated",
            ids.len()
        );
        return Err(ApiError::bad_param("prediction", msg));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> Common {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn fields_map_onto_the_sampler() {
        let s = settings(
            &common(r#"{"temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 7,
                        "stop": ["a", ""], "stream": true, "stream_options": {"include_usage": true}}"#),
            Some(12),
            false,
        )
        .unwrap();
        assert!(s.sampling.is_greedy());
        assert_eq!((s.sampling.top_k, s.sampling.top_p, s.sampling.seed), (Some(5), Some(0.5), 7));
        assert_eq!(s.stop, ["a"]);
        assert_eq!(s.max_tokens, Some(12));
        assert!(s.stream && s.include_usage);
    }

    #[test]
    fn defaults_are_plays() {
        let s = settings(&common("{}"), None, true).unwrap();
        assert_eq!(s.sampling.temperature, 1.0);
        assert_eq!(s.sampling.top_k, None);
        let s = settings(&common("{}"), None, false).unwrap();
        assert_eq!(s.sampling.top_k, SamplerConfig::default().top_k);
    }

    #[test]
    fn penalties_are_openais_and_repetition_is_separate() {
        let s = settings(
            &common(r#"{"presence_penalty": 0.5, "frequency_penalty": -1.5}"#),
            None,
            false,
        )
        .unwrap();
        assert_eq!((s.sampling.presence_penalty, s.sampling.frequency_penalty), (0.5, -1.5));
        assert_eq!(s.sampling.repeat_penalty, 1.0, "no longer folded into the repetition penalty");
        let s =
            settings(&common(r#"{"presence_penalty": 1, "repetition_penalty": 1.1}"#), None, true)
                .unwrap();
        assert_eq!((s.sampling.presence_penalty, s.sampling.repeat_penalty), (1.0, 1.1));
        assert!(s.sampling.repeat_last_n > 0);
        for bad in [r#"{"presence_penalty": 3}"#, r#"{"frequency_penalty": -2.5}"#] {
            assert_eq!(settings(&common(bad), None, false).unwrap_err().status.as_u16(), 400);
        }
    }

    #[test]
    fn logprobs_fields() {
        assert_eq!(chat_logprobs(None, None).unwrap(), None);
        assert_eq!(chat_logprobs(Some(false), Some(0)).unwrap(), None);
        assert_eq!(chat_logprobs(Some(true), None).unwrap(), Some(0));
        assert_eq!(chat_logprobs(Some(true), Some(20)).unwrap(), Some(20));
        for (l, t) in [(Some(true), Some(21)), (Some(true), Some(-1)), (None, Some(3))] {
            assert_eq!(chat_logprobs(l, t).unwrap_err().status.as_u16(), 400, "{l:?} {t:?}");
        }
        let v = |j: &str| serde_json::from_str::<serde_json::Value>(j).unwrap();
        assert_eq!(completion_logprobs(None).unwrap(), None);
        assert_eq!(completion_logprobs(Some(&v("null"))).unwrap(), None);
        assert_eq!(completion_logprobs(Some(&v("0"))).unwrap(), Some(0));
        assert_eq!(completion_logprobs(Some(&v("5"))).unwrap(), Some(5));
        for bad in ["21", "-1", "true", "2.5", "\"5\""] {
            assert!(completion_logprobs(Some(&v(bad))).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_values_are_400s() {
        for json in [
            r#"{"n": 2}"#,
            r#"{"temperature": -1}"#,
            r#"{"top_p": 0}"#,
            r#"{"top_p": 1.5}"#,
            r#"{"min_p": 2}"#,
            r#"{"top_k": -5}"#,
            r#"{"repetition_penalty": 0}"#,
        ] {
            let e = settings(&common(json), None, false).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{json}");
        }
        assert!(settings(&common("{}"), Some(0), false).is_err());
    }

    #[test]
    fn the_budget_fits_the_context() {
        assert_eq!(clip_max_tokens(Some(10), 100, 256), 10);
        assert_eq!(clip_max_tokens(Some(1000), 100, 256), 156);
        assert_eq!(clip_max_tokens(None, 100, 256), 156);
    }
}
