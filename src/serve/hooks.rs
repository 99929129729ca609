//! Test-only hooks, honoured only when the server runs with `INFERNO_TEST_HOOKS=1` (otherwise
//! their fields are ignored like any unknown field). A model with random weights never calls a
//! tool, so the tool-call path is driven end to end by forcing the reply:
//! `"x_inferno_force_reply": "<|channel|>analysis<|message|>…<|call|>"` makes the reply's
//! tokens that text's ids (special tokens included) in place of the sampled ones. The engine
//! runs one step per forced id and continues from the forced ids (teacher forcing), so their
//! log probabilities are the model's for that text. `"x_inferno_force_prefix"` forces only
//! the reply's first tokens; the rest is sampled as usual (under the request's constraint).
//!
//! Clients that cannot add a field to their requests (Codex CLI, Claude Code) get their forced
//! replies from a queue instead: `INFERNO_TEST_REPLIES` names a JSON file holding an array of
//! strings, read at start; a request without `x_inferno_force_reply` takes the next one.

use std::collections::VecDeque;

use super::errors::ApiError;
use super::openai_types::Common;
use super::state::{AppState, Ready};

pub fn forced_reply(
    state: &AppState,
    ready: &Ready,
    c: &Common,
) -> Result<Option<Vec<u32>>, ApiError> {
    if !state.hooks {
        return Ok(None);
    }
    let queued = || state.test_replies.lock().ok()?.pop_front();
    let text = c.x_inferno_force_reply.clone().or_else(queued);
    forced_ids(state, ready, text.as_deref(), "x_inferno_force_reply")
}

/// `x_inferno_force_prefix`: the reply's first ids (then it is sampled, under the request's
/// constraint if any: a gpt-oss analysis message before a constrained answer, say).
pub fn forced_prefix(state: &AppState, ready: &Ready, c: &Common) -> Result<Vec<u32>, ApiError> {
    let ids =
        forced_ids(state, ready, c.x_inferno_force_prefix.as_deref(), "x_inferno_force_prefix")?;
    Ok(ids.unwrap_or_default())
}

fn forced_ids(
    state: &AppState,
    ready: &Ready,
    text: Option<&str>,
    field: &str,
) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(text) = text.filter(|_| state.hooks) else {
        return Ok(None);
    };
    let ids = ready
        .text
        .tokenizer
        .encode(text, false)
        .map_err(|e| ApiError::bad_request(format!("{field}: {e}")))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        return Err(ApiError::bad_request(format!("{field} is empty")));
    }
    Ok(Some(ids))
}

/// The replies of the file `INFERNO_TEST_REPLIES` names (none when unset). A file that cannot
/// be read as a JSON array of strings stops the server: a test must not run without them.
pub fn queued_replies() -> VecDeque<String> {
    let Some(path) = crate::switches::test_replies() else { return VecDeque::new() };
    let read = std::fs::read_to_string(path)
        .map_err(anyhow::Error::from)
        .and_then(|t| serde_json::from_str::<VecDeque<String>>(&t).map_err(anyhow::Error::from));
    match read {
        Ok(replies) => replies,
        Err(e) => {
            eprintln!("INFERNO_TEST_REPLIES={path}: {e}");
            std::process::exit(2);
        }
    }
}
