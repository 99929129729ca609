//! Model-independent generation: everything between "the model produced logits" and "the user
//! sees text".
//!
//! - [`sampler`]: logits → next token id (penalties, temperature, top-k/p, min-p, seeded RNG);
//!   [`penalty`]: OpenAI's presence and frequency penalties.
//! - [`stop`]: when to stop (EOS ids, stop strings, token budget) and which text to hold back so
//!   a stop string never reaches the user.
//! - [`stream`]: token ids → text, incrementally, without holding back complete characters.
//! - [`generation`]: what one generation did (tokens, text, stop reason, timings).
//!
//! Nothing here runs a model: the engine's sampling and stop checks and the reply reader
//! (`chat::reply`) are built on these pieces. How a generation loop puts them together (the
//! model call is the only model-specific part):
//!
//! ```ignore
//! let mut sampler = Sampler::new(cfg);                 // cfg.validate()? on user input first
//! let mut stream = TokenStream::new(&tokenizer);
//! let mut stop = StopChecker::new(StopConditions { eos_ids, stop_strings, max_tokens });
//! let mut history = prompt_ids.clone();
//! let reason = loop {
//!     if stop.remaining() == 0 { break StopReason::MaxTokens; }
//!     if history.len() >= context_len { break StopReason::ContextFull; }
//!     let mut logits = model.forward(&history)?;        // last position, vocab-sized f32
//!     let id = sampler.sample(&mut logits, &history);
//!     history.push(id);
//!     let text = if stop.is_eos(id) { None } else { stream.push(id)? };
//!     let step = stop.push(id, text.as_deref().unwrap_or(""));
//!     print!("{}", step.text);
//!     if let Some(reason) = step.stop { break reason; }
//! };
//! if !matches!(reason, StopReason::StopString(_)) {
//!     // Held-back text first, then a dangling partial character (shown as U+FFFD).
//!     print!("{}{}", stop.finish(), stream.finish()?.unwrap_or_default());
//! }
//! ```

pub mod generation;
pub mod penalty;
pub mod sampler;
pub mod stop;
pub mod stream;

pub use generation::Generation;
pub use sampler::{Sampler, SamplerConfig};
pub use stop::{StopChecker, StopConditions, StopReason};
pub use stream::TokenStream;
