//! Test-only hooks, honoured only when the server runs with `INFERNO_TEST_HOOKS=1` (otherwise
//! their fields are ignored like any unknown field). A model with random weights never calls a
//! tool, so the tool-call path is driven end to end by forcing the reply:
//! `"x_inferno_force_reply": "<|channel|>analysis<|message|>…<|call|>"` makes the reply's
//! tokens that text's ids (special tokens included) in place of the sampled ones. The engine
//! runs one step per forced id and continues from the forced ids (teacher forcing), so their
//! log probabilities are the model's for that text.
//!
//! Clients that cannot add a field to their requests (Claude Code, Codex) get forced replies
//! from a queue: `INFERNO_TEST_REPLIES` names a JSON file holding an array of strings, read at
//! server start; a request without `x_inferno_force_reply` takes the next one.

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
    let queued;
    let text = match c.x_inferno_force_reply.as_deref() {
        Some(t) => t,
        None => {
            queued = state.replies.lock().ok().and_then(|mut q| q.pop_front());
            match queued.as_deref() {
                Some(t) => t,
                None => return Ok(None),
            }
        }
    };
    let ids = ready
        .text
        .tokenizer
        .encode(text, false)
        .map_err(|e| ApiError::bad_request(format!("x_inferno_force_reply: {e}")))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        return Err(ApiError::bad_request("x_inferno_force_reply is empty"));
    }
    Ok(Some(ids))
}

/// The replies of `INFERNO_TEST_REPLIES` (none when it is unset; a file that cannot be read
/// is reported and gives none).
pub fn queued_replies() -> VecDeque<String> {
    let Ok(path) = std::env::var("INFERNO_TEST_REPLIES") else { return VecDeque::new() };
    let read = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<VecDeque<String>>(&b).map_err(|e| e.to_string()));
    read.unwrap_or_else(|e| {
        tracing::error!("INFERNO_TEST_REPLIES {path}: {e} (expected a JSON array of strings)");
        VecDeque::new()
    })
}
