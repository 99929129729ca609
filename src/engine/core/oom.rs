//! A step that fails, and the one failure a step can recover from: the device out of memory.
//!
//! Any other error leaves the pool's contents for the step's sequences unknown (a kernel fault,
//! a driver error), so those sequences fail and the engine serves on. An allocation that fails
//! is different: the kernels before it ran on the right inputs and the ones after it never
//! started, and nothing a step writes counts until [`Scheduler::complete`] moves a sequence on.
//! A sequence whose step is not completed simply runs the same step again, and writes the same
//! keys to the same slots (its rows' bits do not depend on what shares their step); its draw is
//! the same too (a sampler is seeded by the token's index, and nothing on the host changes
//! before a step's draw has succeeded). So only the requests that need the memory fail:
//! - the prompts in the step: a prompt chunk is what a step's activations grow with;
//! - in a step of decodes alone, the newest sequence (the one a shortage of KV blocks would
//!   preempt): each failed step ends at least one request, so a shortage that lasts ends them
//!   all, one line each, and never loops.
//!
//! The others decode on in the next step.
//!
//! [`Scheduler::complete`]: crate::engine::scheduler::Scheduler::complete

use super::Core;
use crate::engine::scheduler::Chunk;

/// How every out-of-memory failure of a request starts (serve answers it with 503: the
/// request may succeed once memory is free).
pub const OUT_OF_MEMORY: &str = "the GPU ran out of memory";

impl Core {
    /// Ends what step `chunks` cannot go on with after `err`.
    pub(super) fn step_failed(&mut self, chunks: &[Chunk], err: &anyhow::Error) {
        if !crate::error::is_out_of_memory(err) {
            self.fail_chunks(chunks, &format!("{err:#}"));
            return;
        }
        let cause = crate::error::one_line(err);
        tracing::warn!("a step of {} sequences ran out of device memory: {cause}", chunks.len());
        for c in victims(chunks) {
            let msg = if c.len > c.drafts + 1 {
                format!(
                    "{OUT_OF_MEMORY} running this prompt ({} tokens in one step); \
                     retry, or send a shorter prompt",
                    c.len
                )
            } else {
                format!(
                    "{OUT_OF_MEMORY} while decoding; this request stopped so that the others go on"
                )
            };
            self.fail(c.id, &msg);
        }
    }
}

/// The chunks an out-of-memory step fails: its prompt chunks, or with none, its newest decode.
fn victims(chunks: &[Chunk]) -> Vec<Chunk> {
    let prompts: Vec<Chunk> = chunks.iter().filter(|c| c.len > c.drafts + 1).copied().collect();
    if !prompts.is_empty() {
        return prompts;
    }
    // Decodes come in admission order, the oldest first.
    chunks.last().copied().into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(id: u64, len: usize, drafts: usize) -> Chunk {
        Chunk { id, start: 10, len, sample: true, drafts }
    }

    #[test]
    fn prompts_fail_and_decodes_go_on() {
        let step = [chunk(1, 1, 0), chunk(2, 4, 3), chunk(3, 700, 0), chunk(4, 1, 0)];
        let ids: Vec<u64> = victims(&step).iter().map(|c| c.id).collect();
        assert_eq!(ids, [3]);
    }

    #[test]
    fn decodes_alone_lose_their_newest() {
        let step = [chunk(1, 1, 0), chunk(2, 4, 3), chunk(5, 1, 0)];
        let ids: Vec<u64> = victims(&step).iter().map(|c| c.id).collect();
        assert_eq!(ids, [5]);
        assert!(victims(&[]).is_empty());
    }
}
