//! Chat formats and conversations: turning a conversation into the prompt a model was trained
//! on, and a model's reply back into what a front end shows.
//!
//! - [`harmony`]: gpt-oss's harmony format, rendered straight to token ids and parsed back by
//!   channel as the model streams.
//! - [`conversation`]: the history of a chat-template conversation, rendered by the model's
//!   Hugging Face template (`template`, loaded with the tokenizer).
//! - [`turn`]: one assistant turn in either format, run on a session and reported as events
//!   to a sink; the history rules (answer-only for harmony, undo on failure) live there, so
//!   every front end (REPL, server) runs the same turn.

pub mod conversation;
pub mod harmony;
pub mod saved;
pub mod turn;

pub use conversation::Conversation;
pub use saved::SavedChat;
pub use turn::{Dialogue, Part, Sampling, TurnEnd, TurnEvent, TurnSink, default_sampling};
