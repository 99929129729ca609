//! When generation ends, and which text must not reach the user because of it.
//!
//! Three things end a generation on their own: an end-of-sequence id (a model may have several:
//! Llama 3 instruct stops on `<|eot_id|>` *and* `<|end_of_text|>`), a user stop string, and the
//! token budget. Stop strings are matched on text, not ids, because a string like `"\nUser:"` can
//! be split across tokens in many ways. So the [`StopChecker`] sits between the detokeniser and
//! the user: it releases text as soon as it can no longer be the start of a stop string and holds
//! back only the shortest necessary suffix, so the stop string itself is never shown. The loop
//! itself decides [`StopReason::ContextFull`] and [`StopReason::Interrupted`].

use std::fmt;

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced this end-of-sequence id.
    Eos(u32),
    /// The output contained this stop string (not shown to the user).
    StopString(String),
    /// The token budget (`max_tokens`) was used up.
    MaxTokens,
    /// The KV cache / context window is full.
    ContextFull,
    /// The user interrupted (Ctrl-C).
    Interrupted,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Eos(_) => f.write_str("eos"),
            StopReason::StopString(s) => write!(f, "stop string {s:?}"),
            StopReason::MaxTokens => f.write_str("max tokens"),
            StopReason::ContextFull => f.write_str("context full"),
            StopReason::Interrupted => f.write_str("interrupted"),
        }
    }
}

/// What ends a generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Ids that end the generation (see [`eos_ids_from`]).
    pub eos_ids: Vec<u32>,
    /// Strings that end the generation; empty strings are ignored.
    pub stop_strings: Vec<String>,
    /// How many tokens may be generated; the loop should not sample when
    /// [`StopChecker::remaining`] is 0 (so 0 generates nothing).
    pub max_tokens: usize,
}

/// The checker's verdict on one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Text that is now safe to show (may be empty).
    pub text: String,
    /// `Some` when generation must end after this token.
    pub stop: Option<StopReason>,
}

/// Applies [`StopConditions`] to a stream of (token id, decoded text) pairs.
#[derive(Debug, Clone)]
pub struct StopChecker {
    eos_ids: Vec<u32>,
    stop_strings: Vec<String>,
    max_tokens: usize,
    generated: usize,
    /// Text received but not yet released: always a (proper) prefix of some stop string.
    held: String,
}

impl StopChecker {
    pub fn new(cond: StopConditions) -> Self {
        let stop_strings = cond.stop_strings.into_iter().filter(|s| !s.is_empty()).collect();
        StopChecker {
            eos_ids: cond.eos_ids,
            stop_strings,
            max_tokens: cond.max_tokens,
            generated: 0,
            held: String::new(),
        }
    }

    /// Tokens still allowed before [`StopReason::MaxTokens`].
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated)
    }

    /// True if `id` ends the generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    /// Feeds one generated token and the text the detokeniser released for it (possibly empty).
    /// An EOS token's own text is ignored. On any stop, the held-back text is released except a
    /// matched stop string and what follows it.
    pub fn push(&mut self, id: u32, text: &str) -> Step {
        self.generated += 1;
        if self.is_eos(id) {
            return Step { text: std::mem::take(&mut self.held), stop: Some(StopReason::Eos(id)) };
        }
        self.held.push_str(text);
        if let Some((at, s)) = self.find_stop() {
            self.held.truncate(at);
            return Step {
                text: std::mem::take(&mut self.held),
                stop: Some(StopReason::StopString(s)),
            };
        }
        if self.generated >= self.max_tokens {
            return Step {
                text: std::mem::take(&mut self.held),
                stop: Some(StopReason::MaxTokens),
            };
        }
        let keep = self.partial_match_len();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Step { text, stop: None }
    }

    /// Releases whatever is held back (the generation ended for a reason decided outside).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Earliest occurrence of any stop string in the held text (longest string on a tie).
    fn find_stop(&self) -> Option<(usize, String)> {
        let mut best: Option<(usize, &String)> = None;
        for s in &self.stop_strings {
            if let Some(at) = self.held.find(s.as_str()) {
                let better = match best {
                    None => true,
                    Some((b, bs)) => at < b || (at == b && s.len() > bs.len()),
                };
                if better {
                    best = Some((at, s));
                }
            }
        }
        best.map(|(at, s)| (at, s.clone()))
    }

    /// Length in bytes of the longest suffix of the held text that is a proper prefix of some
    /// stop string (so it might still grow into one). Always on a char boundary.
    fn partial_match_len(&self) -> usize {
        let mut best = 0;
        for s in &self.stop_strings {
            // Candidate suffix lengths: char boundaries of `s`, shorter than `s`.
            for (len, _) in s.char_indices().skip(1) {
                if len > best && self.held.ends_with(&s[..len]) {
                    best = len;
                }
            }
        }
        best
    }
}

/// End-of-sequence ids from a model's `config.json` and (optional) `generation_config.json`.
/// `eos_token_id` may be a single integer or a list in either file; the result is the union,
/// `config.json`'s ids first, without duplicates. Anything else (null, missing) contributes
/// nothing.
pub fn eos_ids_from(
    config_json: &serde_json::Value,
    generation_config: Option<&serde_json::Value>,
) -> Vec<u32> {
    let mut ids = Vec::new();
    for v in std::iter::once(config_json).chain(generation_config) {
        let field = &v["eos_token_id"];
        let items: Vec<&serde_json::Value> = match field {
            serde_json::Value::Array(a) => a.iter().collect(),
            other => vec![other],
        };
        for id in items.into_iter().filter_map(|x| x.as_u64()).filter_map(|x| u32::try_from(x).ok())
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn checker(stops: &[&str], max_tokens: usize) -> StopChecker {
        StopChecker::new(StopConditions {
            eos_ids: vec![2, 7],
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
            max_tokens,
        })
    }

    /// Feeds pieces as tokens 100, 101, …; returns the released text and the stop reason.
    fn run(c: &mut StopChecker, pieces: &[&str]) -> (String, Option<StopReason>) {
        let mut out = String::new();
        for (i, p) in pieces.iter().enumerate() {
            let step = c.push(100 + i as u32, p);
            out.push_str(&step.text);
            if step.stop.is_some() {
                return (out, step.stop);
            }
        }
        out.push_str(&c.finish());
        (out, None)
    }

    #[test]
    fn display_strings() {
        assert_eq!(StopReason::Eos(3).to_string(), "eos");
        assert_eq!(
            StopReason::StopString("\nUser:".into()).to_string(),
            "stop string \"\\nUser:\""
        );
        assert_eq!(StopReason::MaxTokens.to_string(), "max tokens");
        assert_eq!(StopReason::ContextFull.to_string(), "context full");
        assert_eq!(StopReason::Interrupted.to_string(), "interrupted");
    }

    #[test]
    fn stop_string_split_across_tokens_is_never_shown() {
        let mut c = checker(&["</answer>"], 100);
        let (out, stop) = run(&mut c, &["The result", " is 4</", "ans", "wer> trailing"]);
        assert_eq!(out, "The result is 4");
        assert_eq!(stop, Some(StopReason::StopString("</answer>".into())));
    }

    #[test]
    fn holds_back_only_a_possible_prefix_and_releases_it_when_it_fails() {
        let mut c = checker(&["STOP"], 100);
        let s = c.push(1, "abc ST");
        assert_eq!((s.text.as_str(), s.stop), ("abc ", None));
        // "STx" can no longer become "STOP": released at once.
        let s = c.push(1, "x");
        assert_eq!((s.text.as_str(), s.stop), ("STx", None));
        // A held prefix overlapping a new start: "SSTO" keeps "STO".
        let s = c.push(1, "SSTO");
        assert_eq!(s.text, "S");
        let s = c.push(1, "P!");
        assert_eq!(s.text, "");
        assert_eq!(s.stop, Some(StopReason::StopString("STOP".into())));
    }

    #[test]
    fn no_stop_strings_releases_everything_immediately() {
        let mut c = checker(&[], 100);
        assert_eq!(c.push(1, "héllo <").text, "héllo <");
    }

    #[test]
    fn earliest_stop_string_wins() {
        let mut c = checker(&["world", "lo w"], 100);
        let (out, stop) = run(&mut c, &["hello world"]);
        assert_eq!(out, "hel");
        assert_eq!(stop, Some(StopReason::StopString("lo w".into())));
    }

    #[test]
    fn multibyte_stop_strings_hold_on_char_boundaries() {
        let mut c = checker(&["终了。"], 100);
        let s = c.push(1, "答案终");
        assert_eq!(s.text, "答案");
        let s = c.push(1, "止");
        assert_eq!(s.text, "终止");
        let (out, stop) = run(&mut c, &["好", "终了", "。后"]);
        assert_eq!(out, "好");
        assert!(matches!(stop, Some(StopReason::StopString(_))));
    }

    #[test]
    fn eos_releases_held_text_and_ignores_its_own_text() {
        let mut c = checker(&["STOP"], 100);
        assert_eq!(c.push(1, "x ST").text, "x ");
        let s = c.push(7, "<|eot|>");
        assert_eq!(s.text, "ST");
        assert_eq!(s.stop, Some(StopReason::Eos(7)));
    }

    #[test]
    fn max_tokens_counts_every_token_and_flushes() {
        let mut c = checker(&["STOP"], 3);
        assert_eq!(c.remaining(), 3);
        assert_eq!(c.push(1, "a").stop, None);
        assert_eq!(c.push(1, "b").stop, None);
        assert_eq!(c.remaining(), 1);
        let s = c.push(1, "ST");
        assert_eq!(s.text, "ST");
        assert_eq!(s.stop, Some(StopReason::MaxTokens));
        assert_eq!(c.remaining(), 0);
        assert_eq!(checker(&[], 0).remaining(), 0);
    }

    #[test]
    fn stop_string_on_the_last_allowed_token_reports_the_string() {
        let mut c = checker(&["END"], 1);
        let s = c.push(1, "ok END");
        assert_eq!(s.text, "ok ");
        assert_eq!(s.stop, Some(StopReason::StopString("END".into())));
    }

    #[test]
    fn finish_releases_a_dangling_prefix() {
        let mut c = checker(&["\nUser:"], 100);
        assert_eq!(c.push(1, "bye\nUs").text, "bye");
        assert_eq!(c.finish(), "\nUs");
        assert_eq!(c.finish(), "");
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let mut c = checker(&[""], 100);
        assert_eq!(c.push(1, "abc").text, "abc");
    }

    #[test]
    fn eos_ids_from_ints_lists_and_union() {
        let cfg = json!({"eos_token_id": 128001});
        assert_eq!(eos_ids_from(&cfg, None), vec![128001]);
        let gen_cfg = json!({"eos_token_id": [128001, 128008, 128009]});
        assert_eq!(eos_ids_from(&cfg, Some(&gen_cfg)), vec![128001, 128008, 128009]);
        let cfg = json!({"eos_token_id": [200002, 199999]});
        let gen_cfg = json!({"eos_token_id": 200012});
        assert_eq!(eos_ids_from(&cfg, Some(&gen_cfg)), vec![200002, 199999, 200012]);
        assert!(eos_ids_from(&json!({"eos_token_id": null}), Some(&json!({}))).is_empty());
        assert_eq!(
            eos_ids_from(&json!({}), Some(&json!({"eos_token_id": [2, "x", -1, 2]}))),
            vec![2]
        );
    }
}
