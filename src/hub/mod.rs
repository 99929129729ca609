//! Hugging Face Hub: the shared cache layout and the download protocol.

pub mod cache;
pub mod names;
pub mod resolve;
pub mod scan;

pub use cache::{Cache, RepoCache};
pub use names::RepoId;
pub use resolve::{ResolvedModel, resolve_model};
