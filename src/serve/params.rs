//! Request fields to generation settings: the sampler (defaults as `inferno play` has them, so
//! the same request and flags give the same output), the token budget, stop strings, and the
//! 400s for values out of range or features not offered (`n > 1`, logprobs).

use super::errors::ApiError;
use super::openai_types::Common;
use crate::generate::SamplerConfig;

/// Stop strings accepted at most (OpenAI allows 4).
const MAX_STOP: usize = 16;

#[derive(Debug, Clone)]
pub struct Settings {
    pub sampling: SamplerConfig,
    /// As asked; [`clip_max_tokens`] fits it to the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// The sampling a chat gets when a field is left out: `inferno play`'s (gpt-oss's
/// recommendation for harmony models, the library default otherwise).
pub fn default_sampling(harmony: bool) -> SamplerConfig {
    crate::commands::play::default_sampling(harmony)
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
    let mut cfg = default_sampling(harmony);
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
    for (name, v) in
        [("presence_penalty", c.presence_penalty), ("frequency_penalty", c.frequency_penalty)]
    {
        if let Some(v) = v
            && !(-2.0..=2.0).contains(&finite(name, v)?)
        {
            return Err(ApiError::bad_param(name, format!("{name} must be in [-2, 2], not {v}")));
        }
    }
    cfg.repeat_penalty = match c.repetition_penalty {
        Some(r) => finite("repetition_penalty", r)? as f32,
        None => approximate_penalty(c.presence_penalty, c.frequency_penalty)
            .unwrap_or(cfg.repeat_penalty),
    };
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

/// OpenAI's presence and frequency penalties subtract from the logits of tokens already in the
/// output (frequency once per occurrence). The sampler has only Hugging Face's multiplicative
/// repetition penalty over the last 64 tokens (prompt included), so they are **approximated**:
/// `repeat_penalty = 1 + (presence + frequency) / 2`, kept within [0.5, 2]. An explicit
/// `repetition_penalty` wins. Both zero (the default) leaves the sampler as it is.
fn approximate_penalty(presence: Option<f64>, frequency: Option<f64>) -> Option<f32> {
    let sum = presence.unwrap_or(0.0) + frequency.unwrap_or(0.0);
    (sum != 0.0).then(|| (1.0 + sum / 2.0).clamp(0.5, 2.0) as f32)
}

/// The token budget of a request with `prompt` tokens in a `context`: what was asked, at most
/// what the context has left (the reply then ends with `finish_reason: "length"`), or all of
/// it when nothing was asked.
pub fn clip_max_tokens(asked: Option<usize>, prompt: usize, context: usize) -> usize {
    let room = context.saturating_sub(prompt);
    asked.map_or(room, |n| n.min(room))
}

/// 400 for logprobs, which are not implemented.
pub fn refuse_logprobs(asked: bool) -> Result<(), ApiError> {
    if asked {
        return Err(ApiError::bad_param("logprobs", "logprobs are not supported by this server"));
    }
    Ok(())
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
    fn penalties_are_approximated_and_explicit_wins() {
        let s = settings(
            &common(r#"{"presence_penalty": 0.5, "frequency_penalty": 0.5}"#),
            None,
            false,
        )
        .unwrap();
        assert_eq!(s.sampling.repeat_penalty, 1.5);
        let s =
            settings(&common(r#"{"presence_penalty": 1, "repetition_penalty": 1.1}"#), None, false)
                .unwrap();
        assert_eq!(s.sampling.repeat_penalty, 1.1);
        assert!(settings(&common(r#"{"presence_penalty": 3}"#), None, false).is_err());
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
