//! The batching engine: one thread that owns a loaded model and its paged KV pool and runs every
//! generation of the process as steps of a continuous batch ([`core`]). What it runs is built
//! elsewhere (`load`); front ends submit [`request::Request`]s and read their events, or hold a
//! [`Session`] for a blocking conversation.
//!
//! - [`core`]: the engine thread and its loop.
//! - [`scheduler`]: which sequences run in a step and how much of each prompt.
//! - [`kv`]: the pool's blocks, content-addressed for the prefix cache; [`pool`]: how many
//!   blocks a pool of an engine's size holds.
//! - [`runner`], [`graphs`]: a step's forward pass and sampling, captured as CUDA graphs for
//!   decode; [`readback`]: the sampled ids back to the host; [`ranks`]: the steps a
//!   tensor-parallel rank 0 sends the other ranks, and the draw they make together.
//! - [`request`], [`constraint`], [`logprobs`]: what a request asks for and gets back.
//! - [`session`]: a conversation's blocking view of the engine.
//! - [`spec`]: speculative decoding (drafts verified in one step, the same tokens as without),
//!   all of its state in the engine's [`spec::Speculator`].

pub mod constraint;
pub mod core;
pub mod graphs;
pub mod kv;
pub mod logprobs;
pub mod pool;
pub mod ranks;
pub mod readback;
pub mod request;
pub mod runner;
pub mod scheduler;
pub mod session;
pub mod spec;

pub use session::Session;

use crate::generate::SamplerConfig;
use request::{Event, Request};

/// One greedy token through the engine: loads the kernels and creates the cuBLAS handle, so that
/// a front end's first reply measures the model, not CUDA start-up.
pub fn warm_up(engine: &core::Engine) -> anyhow::Result<()> {
    let request = Request {
        prompt: vec![0],
        sampling: SamplerConfig::greedy(),
        max_tokens: 1,
        eos_ids: Vec::new(),
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    };
    let mut handle = engine.submit(request)?;
    while let Some(event) = handle.blocking_next() {
        if let Event::Failed(msg) = event {
            return Err(anyhow::anyhow!(msg));
        }
    }
    Ok(())
}
