//! Hugging Face Hub: the shared cache layout and the download protocol.

pub mod cache;
pub mod names;

pub use cache::{Cache, RepoCache};
pub use names::RepoId;
