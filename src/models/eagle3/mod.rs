//! EAGLE-3 draft heads (docs/speculation.md, "EAGLE-3 heads"): one Llama-style decoder layer
//! that reads the target's own hidden states, so it guesses the target's next tokens far better
//! than a model of its size alone. [`config`] reads both published layouts, [`head`] holds the
//! weights and runs the layer over the engine's paged KV; the drafter that feeds it is
//! `engine/spec/eagle.rs`.

pub mod config;
pub mod head;

pub use config::{Eagle3Config, Layout, is_eagle3};
pub use head::{Eagle3Head, Feature, Target, reads_target_embedding};
