//! The one pipeline every generation endpoint runs. Each protocol (chat completions,
//! completions, Responses, Messages) converts its body into one [`GenRequest`] and gives a
//! [`Shape`] for its output; [`run`] does the rest, in one order for all: check the model,
//! settle the settings, render the prompt, compile the constraint, check the prompt's length,
//! admit the request, build the engine's [`Job`], then stream or collect the reply through the
//! shape. llama.cpp's server and vLLM's entrypoints are laid out the same way: converters at
//! the edge, one request type and one event stream in the middle.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::constraint::{self, ReplyConstraints};
use super::errors::ApiError;
use super::generation::Job;
use super::hooks;
use super::openai_types::{ChatRequest, Common};
use super::params::{self, clip_max_tokens, settings};
use super::prompt;
use super::sse::{self, RequestLog, Shape};
use super::state::{AppState, Ready};

/// One generation request, whatever protocol it came in.
pub struct GenRequest {
    pub input: Input,
    /// What constrains the reply: structured outputs, a forced tool call.
    pub structured: ReplyConstraints,
    /// Log probabilities of each content token and this many alternatives (`None`: not asked).
    pub logprobs: Option<usize>,
}

/// What the model continues.
pub enum Input {
    /// A conversation: rendered in the model's chat format, its reply read in that format
    /// (reasoning and tool calls apart). Its `common` holds the sampling fields.
    Chat(ChatRequest),
    /// A conversation whose protocol rendered it already (Responses fits it to the context).
    Rendered(ChatRequest, Vec<u32>),
    /// Raw text or token ids (completions' `prompt`), continued as plain text whatever the
    /// model.
    Text(Common, Option<Value>),
}

impl Input {
    fn common(&self) -> &Common {
        match self {
            Input::Chat(c) | Input::Rendered(c, _) => &c.common,
            Input::Text(c, _) => c,
        }
    }

    fn chat(&self) -> Option<&ChatRequest> {
        match self {
            Input::Chat(c) | Input::Rendered(c, _) => Some(c),
            Input::Text(..) => None,
        }
    }
}

/// What a protocol's [`Shape`] may need to know of the request once it is admitted.
pub struct Admitted {
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// Runs `req`: the reply streamed or whole, shaped by what `shape` makes of the admitted
/// request.
pub async fn run<S: Shape>(
    state: &Arc<AppState>,
    req: GenRequest,
    log: &RequestLog,
    shape: impl FnOnce(&Admitted) -> S,
) -> Result<Response, ApiError> {
    let stream = req.input.common().stream.unwrap_or(false);
    let a = admit(state, req, log)?;
    let shape = shape(&Admitted { prompt_tokens: a.job.prompt.len(), include_usage: a.usage });
    if stream {
        return Ok(sse::stream(state.clone(), a.ready, a.job, shape, log.clone(), a.slot));
    }
    let (mut body, outcome) = sse::collect(state, &a.ready, a.job, shape, log).await?;
    drop(a.slot);
    log.done(200, &outcome, false);
    if let Some(ids) = a.echo {
        body["x_inferno_prompt_ids"] = ids.into();
    }
    Ok(axum::Json(body).into_response())
}

/// A request past every check, holding its place.
struct Ticket {
    ready: Arc<Ready>,
    job: Job,
    slot: super::state::Slot,
    usage: bool,
    /// Test hook: the prompt's ids, for the body.
    echo: Option<Vec<u32>>,
}

fn admit(state: &Arc<AppState>, req: GenRequest, log: &RequestLog) -> Result<Ticket, ApiError> {
    let GenRequest { input, structured, logprobs } = req;
    let common = input.common();
    state.model.check(common.model.as_deref())?;
    let ready = state.ready()?;
    let chat = input.chat();
    // A raw continuation is plain text, whatever the model (the library's default sampling).
    let harmony = chat.is_some() && ready.harmony;
    let max_tokens =
        chat.map_or(common.max_tokens, |c| c.max_completion_tokens.or(c.common.max_tokens));
    let s = settings(common, max_tokens, harmony)?;
    if let Some(user) = &common.user {
        tracing::debug!("{} user {user:?}", log.id);
    }
    let prompt = match &input {
        Input::Chat(c) => {
            let date = c.common.x_inferno_date.as_deref().filter(|_| state.hooks);
            prompt::chat_prompt(&ready, c, date, structured.format.as_ref())?
        }
        Input::Rendered(_, ids) => ids.clone(),
        Input::Text(_, p) => prompt::text_prompt(&ready, p.as_ref())?,
    };
    let constraint = match chat {
        Some(_) => constraint::compile(&ready, &structured)?,
        // Raw text: never harmony, so the constraint covers the whole continuation.
        None => constraint::compile_plain(&ready, &structured)?,
    };
    let echo = (state.hooks && common.x_inferno_prompt_ids == Some(true)).then(|| prompt.clone());
    check_prompt(&ready, prompt.len())?;
    let slot = state.admit()?;
    let job = Job {
        max_tokens: clip_max_tokens(s.max_tokens, prompt.len(), ready.engine.context()),
        forced: hooks::forced_reply(state, &ready, common)?,
        forced_prefix: hooks::forced_prefix(state, &ready, common)?,
        prediction: params::prediction(&ready, chat.and_then(|c| c.prediction.as_ref()))?,
        constraint,
        // Harmony has its own tool-call syntax, read by its parser.
        tools: match chat {
            Some(c) if !harmony => prompt::tool_names(c),
            _ => Vec::new(),
        },
        prompt,
        sampling: s.sampling,
        stop: s.stop,
        chat: chat.is_some(),
        logprobs,
        token_ids: common.return_tokens_as_token_ids == Some(true),
    };
    Ok(Ticket { ready, job, slot, usage: s.include_usage, echo })
}

/// 400 for a prompt the engine could never run.
fn check_prompt(ready: &Ready, len: usize) -> Result<(), ApiError> {
    let context = ready.engine.context();
    if len == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if len >= context {
        return Err(ApiError::bad_request(format!(
            "the prompt is {len} tokens; this model's context holds {context} (prompt and reply): shorten it or restart the server with a larger --context"
        )));
    }
    Ok(())
}
