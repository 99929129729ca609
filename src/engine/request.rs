//! What goes into the engine and what comes out: a [`Request`] (prompt ids, sampling, limits)
//! becomes a [`RequestHandle`] that yields [`Event`]s: each sampled id as it is made (with its
//! log probabilities when asked), then one [`Finish`] with the stop reason and the timings.
//! The channel works from synchronous code (`blocking_recv`, play and bench) and from async
//! code (`recv().await`, the server). Dropping the handle or calling [`RequestHandle::cancel`]
//! stops the sequence at the next step and frees its cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::generate::{SamplerConfig, StopReason};

/// One generation to run.
#[derive(Debug, Clone)]
pub struct Request {
    /// The whole prompt as token ids (rendered by the caller: template or harmony).
    pub prompt: Vec<u32>,
    /// Sampling settings; `seed` makes the draws reproducible, alone or in a batch.
    pub sampling: SamplerConfig,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Ids that end the generation (included as the last [`Event::Token`]).
    pub eos_ids: Vec<u32>,
    /// A flag the caller owns (Ctrl-C): set, it stops the request like [`RequestHandle::cancel`].
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Report each token's log probability and this many most likely alternatives (in its
    /// [`Event::Token`]); `None` for none (the fast path).
    pub logprobs: Option<usize>,
    /// Teacher forcing: the first tokens of the reply are these ids in place of sampled ones
    /// (the sequence continues from them, and their log probabilities are theirs). Empty for
    /// none.
    pub forced: Vec<u32>,
    /// Structured output: the tokens sampled are those this grammar allows (the other logits
    /// of the row are masked to -inf on the device before sampling; forced tokens are
    /// committed to it too). A mask that fails or allows nothing ends the request with
    /// [`Event::Failed`]. `None`: unconstrained.
    pub constraint: Option<super::constraint::Constraint>,
    /// Tokens the reply is expected to repeat (OpenAI's Predicted Outputs: a file being edited,
    /// a document being revised): the sequence drafts from them ([`super::spec::prediction`]),
    /// whatever the engine's drafter, so the runs it copies take one step each. The tokens are
    /// the same with or without it. Empty for none.
    pub prediction: Vec<u32>,
}

/// What a request reports, in order: tokens, then exactly one `Finished` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    /// A sampled id, with its log probabilities when the request asked for them.
    Token(u32, Option<Box<super::logprobs::TokenLogprobs>>),
    Finished(Finish),
    /// The request could not run (a prompt longer than the context, a failed step).
    Failed(String),
}

/// How a request ended.
#[derive(Debug, Clone)]
pub struct Finish {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys came from the prefix cache (not run again).
    pub cached_tokens: usize,
    pub generated: usize,
    /// From submission until the request's first step ran.
    pub queued: Duration,
    /// From submission until the first token was sampled.
    pub time_to_first_token: Duration,
    /// From the first token until the last.
    pub decode_time: Duration,
    /// Draft tokens this request's verify steps checked, and how many of them were accepted
    /// (emitted as they were drafted).
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

/// The caller's end of a request.
pub struct RequestHandle {
    pub id: u64,
    pub(super) events: UnboundedReceiver<Event>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) wake: std::sync::mpsc::Sender<Command>,
}

/// What the engine thread's channel carries.
pub(super) enum Command {
    Submit(Box<Pending>),
    /// Something changed (a cancellation): look again.
    Wake,
    Shutdown,
}

/// A request submitted, with the engine's end of its channel.
pub(super) struct Pending {
    pub(super) id: u64,
    pub(super) req: Request,
    pub(super) events: UnboundedSender<Event>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) submitted: Instant,
}

impl RequestHandle {
    /// The next event, blocking; `None` once the engine has sent the last one.
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }

    /// The next event (async).
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Stops the request at the engine's next step; its cache blocks are freed.
    pub fn cancel(&self) {
        if !self.cancel.swap(true, Ordering::SeqCst) {
            // Wakes an idle engine loop so the cancellation is seen at once; a closed engine
            // has nothing left to stop.
            let _ = self.wake.send(Command::Wake);
        }
    }

    /// A flag that cancels this request when set (a Ctrl-C handler, a disconnected client).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}
