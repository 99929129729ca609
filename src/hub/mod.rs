//! Hugging Face Hub: the shared cache layout and the download protocol.

pub mod api;
pub mod cache;
pub mod fetch;
pub mod names;
pub mod progress;
pub mod resolve;
pub mod scan;
pub mod select;

pub use cache::{Cache, RepoCache};
pub use names::RepoId;
