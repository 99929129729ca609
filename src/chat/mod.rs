//! Chat formats and conversations: turning a conversation into the prompt a model was trained
//! on, and a model's reply back into what a front end shows.
//!
//! - [`template`]: Hugging Face Jinja chat templates, rendered with transformers' semantics.
//! - [`harmony`]: gpt-oss's harmony format, rendered straight to token ids and parsed back by
//!   channel as the model streams.
//! - [`conversation`]: the history of a chat-template conversation.
//! - [`turn`]: one assistant turn in either format, run on a session and reported as events
//!   to a sink; the history rules (answer-only for harmony, undo on failure) live there, so
//!   every front end (REPL, server) runs the same turn.
//! - [`pyjson`], [`strftime`]: the Python behaviours those templates rely on (`tojson` is
//!   `json.dumps`, `strftime_now`).

pub mod conversation;
pub mod harmony;
pub mod pyjson;
pub mod strftime;
pub mod template;
pub mod turn;

pub use conversation::Conversation;
pub use template::{ChatTemplate, Message};
pub use turn::{Dialogue, Part, Sampling, TurnEnd, TurnEvent, TurnSink};
