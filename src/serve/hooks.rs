//! Test-only hooks, honoured only when the server runs with `INFERNO_TEST_HOOKS=1` (otherwise
//! their fields are ignored like any unknown field). A model with random weights never calls a
//! tool, so the tool-call path is driven end to end by forcing the reply:
//! `"x_inferno_force_reply": "<|channel|>analysis<|message|>…<|call|>"` makes the reply's
//! tokens that text's ids (special tokens included) in place of the sampled ones. The engine
//! runs one step per forced id and continues from the forced ids (teacher forcing), so their
//! log probabilities are the model's for that text.

use super::errors::ApiError;
use super::openai_types::Common;
use super::state::{AppState, Ready};

pub fn forced_reply(
    state: &AppState,
    ready: &Ready,
    c: &Common,
) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(text) = c.x_inferno_force_reply.as_deref().filter(|_| state.hooks) else {
        return Ok(None);
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
