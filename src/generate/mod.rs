//! Model-independent generation: everything between "the model produced logits" and "the user
//! sees text".
//!
//! - [`sampler`]: logits → next token id (penalty, temperature, top-k/p, min-p, seeded RNG).
//! - [`stop`]: when to stop (EOS ids, stop strings, token budget) and which text to hold back so
//!   a stop string never reaches the user.
//! - [`stream`]: token ids → text, incrementally, without holding back complete characters.

pub mod sampler;
pub mod stop;
pub mod stream;

pub use sampler::{Sampler, SamplerConfig};
pub use stop::{StopChecker, StopConditions, StopReason};
pub use stream::TokenStream;
