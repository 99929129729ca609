//! Chat formats and conversations: turning a conversation into the prompt a model was trained
//! on, and a model's reply back into what a front end shows.
//!
//! - [`harmony`]: gpt-oss's harmony format, rendered straight to token ids and parsed back by
//!   channel as the model streams.
//! - [`conversation`]: the history of a chat-template conversation, rendered by the model's
//!   Hugging Face template (`template`, loaded with the tokenizer).
//! - [`reply`]: the one reader of a reply, from sampled ids to text, reasoning and tool calls,
//!   for every chat format and every front end (play's turns, serve's endpoints).
//! - [`turn`]: one assistant turn in either format, run on a session and reported as events
//!   to a sink; the history rules (answer-only for harmony, undo on failure) live there.

pub mod conversation;
pub mod harmony;
pub mod reply;
pub mod saved;
pub mod turn;

pub use conversation::Conversation;
pub use reply::events::{Part, TurnEnd, TurnEvent, TurnSink};
pub use saved::SavedChat;
pub use turn::{Dialogue, Sampling, default_sampling};
