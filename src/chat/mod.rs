//! Chat formats: turning a conversation into the prompt text a model was trained on.
//!
//! - [`template`]: Hugging Face Jinja chat templates, rendered with transformers' semantics.
//! - [`harmony`]: gpt-oss's harmony format, rendered straight to token ids and parsed back by
//!   channel as the model streams.
//! - [`pyjson`], [`strftime`]: the Python behaviours those templates rely on (`tojson` is
//!   `json.dumps`, `strftime_now`).

pub mod harmony;
pub mod pyjson;
pub mod strftime;
pub mod template;

pub use template::{ChatTemplate, Message};
