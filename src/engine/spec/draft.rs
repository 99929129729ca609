//! A draft model (`--draft MODEL`): a smaller model with the target's tokenizer guesses the next
//! tokens greedily, one decode step each, on the same device with its own KV pool. Its guesses
//! only change how many tokens a verify step keeps, never which: the target's rows decide.
//!
//! The draft follows each sequence lazily: before proposing, it runs whatever of the sequence it
//! has not computed yet (the prompt the first time, then the tokens the last verify step
//! accepted) as one prefill chunk, then `k` one-token steps. It keeps, per sequence, the ids whose
//! keys its pool holds; what the target rejected differs from the sequence there and is simply
//! computed again (rolled back), as the target's own rejected rows are. Full blocks of the
//! sequence's real tokens are hashed for the draft's own prefix cache, so a chat's next turn
//! skips them too.

use std::collections::HashMap;

use super::super::kv::blocks::{BlockManager, SeqId};
use super::super::pool::{PoolSize, runner_with_pool};
use super::super::runner::Runner;
use super::super::scheduler::Chunk;
use crate::models::batch::BatchModel;

pub struct DraftModel {
    runner: Runner,
    blocks: BlockManager,
    /// Per sequence: the ids whose keys the pool holds, in order (a prefix of the sequence, then
    /// the last draft's tokens).
    held: HashMap<SeqId, Vec<u32>>,
    /// Tokens one catch-up chunk runs at most (the engine's step budget).
    chunk: usize,
}

impl DraftModel {
    /// The draft `model` with a pool as large as the target's (`size`), refused when its
    /// vocabulary is not the target's (`vocab`).
    pub fn new(
        model: Box<dyn BatchModel>,
        size: &PoolSize,
        vocab: usize,
    ) -> anyhow::Result<DraftModel> {
        if model.vocab_size() != vocab {
            return Err(crate::error::fail(
                crate::error::ErrorKind::InvalidInput,
                format!(
                    "the draft model's vocabulary has {} ids, the model's {vocab}: a draft must share the model's tokenizer",
                    model.vocab_size()
                ),
            ));
        }
        let (runner, blocks) = runner_with_pool(model, size)?;
        Ok(DraftModel { runner, blocks, held: HashMap::new(), chunk: size.token_budget.max(1) })
    }

    /// The draft's greedy guess of the `k` tokens after `tokens` (sequence `id`); empty when its
    /// pool has no room for them.
    pub fn propose(&mut self, id: SeqId, tokens: &[u32], k: usize) -> anyhow::Result<Vec<u32>> {
        let len = tokens.len();
        if k == 0 || len == 0 || len + k > self.runner.model.max_positions() {
            return Ok(Vec::new());
        }
        // The last token always runs again: its logits give the first guess.
        let Some(mut logits) = self.run(id, tokens, len - 1, len + k - 1)? else {
            return Ok(Vec::new());
        };
        let mut guess = Vec::with_capacity(k);
        for j in 0..k {
            let next = crate::kernels::argmax_rows(&logits)?.to_vec1::<u32>()?[0];
            guess.push(next);
            if j + 1 < k {
                let c = Chunk { id, start: len + j, len: 1, sample: true, drafts: 0 };
                let l = self.runner.forward(&[c], &[&[next][..]], &self.blocks)?;
                logits = l.ok_or_else(|| anyhow::anyhow!("the draft step gave no logits"))?;
            }
        }
        // The pool now holds `tokens` ([`Self::run`]) and the guesses fed back.
        self.held.entry(id).or_default().extend_from_slice(&guess[..k - 1]);
        Ok(guess)
    }

    /// Computes the keys of all of `tokens` but the last (sequence `id`'s prompt, once the model
    /// has prefilled it): the draft's prefill then counts in the time to the first token, not
    /// in the first draft's.
    pub fn catch_up(&mut self, id: SeqId, tokens: &[u32]) -> anyhow::Result<()> {
        if tokens.len() > 1 {
            let upto = tokens.len() - 1;
            self.run(id, &tokens[..upto], upto, upto)?;
        }
        Ok(())
    }

    /// Runs `tokens` from the longest prefix the pool holds for `id` (at most `from`) to their
    /// end, with blocks up to position `reach`; the last row's logits when the run ends at a
    /// token it had not held. `None` when the pool has no room (the sequence is then forgotten).
    fn run(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        from: usize,
        reach: usize,
    ) -> anyhow::Result<Option<candle_core::Tensor>> {
        let len = tokens.len();
        if !self.blocks.contains(id) {
            let cached = self.blocks.add_sequence(id, tokens);
            self.held.insert(id, tokens[..cached].to_vec());
        }
        let held = self.held.entry(id).or_default();
        let mut pos = held.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(from);
        if pos >= len {
            return Ok(None);
        }
        if self.blocks.ensure(id, pos, reach.max(len)).is_err() {
            self.free(id);
            return Ok(None);
        }
        let mut logits = None;
        while pos < len {
            let end = (pos + self.chunk).min(len);
            let c = Chunk { id, start: pos, len: end - pos, sample: end == len, drafts: 0 };
            logits = self.runner.forward(&[c], &[&tokens[pos..end]], &self.blocks)?;
            pos = end;
        }
        // Only real tokens are hashed: a guess's keys are rewritten where it was wrong. A later
        // run starts at `len` at the earliest (the tokens before it are real).
        let _ = self.blocks.commit(id, tokens);
        self.blocks.release_out_of_window(id, len);
        let held = self.held.entry(id).or_default();
        held.clear();
        held.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Forgets sequence `id` (finished, failed or cancelled): its blocks go back.
    pub fn free(&mut self, id: SeqId) {
        self.blocks.free_sequence(id);
        self.held.remove(&id);
    }
}
