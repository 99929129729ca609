//! Which sequences run in the next step, and how many of their tokens. No tensor work.
//!
//! A sequence is tracked by how many of its tokens are computed (their keys are in the pool):
//! its next input is `tokens[computed..]` — a prompt (or what is left of it) or the one token
//! sampled last. There are no separate prefill and decode phases (vLLM v1's scheduler): every
//! step, each running sequence that decodes gets its one token first, so running streams keep
//! their rate; prompts then fill what is left of the step's token budget in chunks; waiting
//! requests are admitted, oldest first, while the KV pool has room for their next chunk. When a
//! decoding sequence needs a block and none is free, the newest running sequence is preempted:
//! its blocks are freed and it goes back to the front of the queue, to be recomputed (its
//! prompt is then everything it has so far; the prefix cache usually still holds most of it).
//! Nothing running is ever corrupted and nothing waiting is ever dropped.
//!
//! A decoding sequence may carry draft tokens (speculative decoding, [`super::spec`]): its chunk
//! is then its last token followed by the drafts, all of whose rows give logits, and its blocks
//! reach past the drafts. When those blocks or the step's budget are short, the drafts are
//! dropped before anything is preempted: a draft is only ever a guess.

use std::collections::VecDeque;

use super::kv::blocks::{BlockManager, SeqId};

/// Limits of one step.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Sequences running at once (the largest batch a step decodes).
    pub max_seqs: usize,
    /// Tokens one step runs at most (decode tokens plus prompt chunks).
    pub token_budget: usize,
    /// Positions a sequence may hold (the RoPE tables' length).
    pub max_context: usize,
}

/// A sequence's tokens and progress, as the scheduler sees it.
#[derive(Debug)]
pub struct SeqState {
    pub id: SeqId,
    /// Prompt, then every sampled token.
    pub tokens: Vec<u32>,
    /// Tokens whose keys are in the pool.
    pub computed: usize,
    /// Guessed tokens after the last one, to verify in the next step (empty: none).
    pub draft: Vec<u32>,
}

/// One sequence's share of a step: tokens `start..start + len` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub id: SeqId,
    pub start: usize,
    pub len: usize,
    /// The chunk ends at the sequence's last token: sample the next one from its logits.
    pub sample: bool,
    /// Draft tokens at the chunk's end (after the sequence's last token, which is the row before
    /// them): each of the last `drafts + 1` rows is sampled, to verify them. 0 for none.
    pub drafts: usize,
}

impl Chunk {
    /// Rows of the chunk whose logits are sampled: its last `drafts + 1`, or none.
    pub fn sampled_rows(&self) -> usize {
        if self.sample { self.drafts + 1 } else { 0 }
    }
}

/// One step as the scheduler planned it: the chunks it runs, and the sequences admitted and
/// preempted for it.
#[derive(Debug, Default)]
pub struct StepPlan {
    pub chunks: Vec<Chunk>,
    /// Sequences admitted in this step, with the prompt tokens the prefix cache already held.
    pub admitted: Vec<(SeqId, usize)>,
    /// Running sequences sent back to the queue to free space.
    pub preempted: Vec<SeqId>,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    /// In order of admission (the oldest first).
    running: Vec<SeqState>,
    waiting: VecDeque<SeqState>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler { cfg, running: Vec::new(), waiting: VecDeque::new() }
    }

    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }

    /// Queues a new sequence (its prompt must be non-empty and shorter than the context).
    pub fn push(&mut self, id: SeqId, prompt: Vec<u32>) {
        self.waiting.push_back(SeqState { id, tokens: prompt, computed: 0, draft: Vec::new() });
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The running sequences, the oldest first.
    pub fn running_ids(&self) -> Vec<SeqId> {
        self.running.iter().map(|s| s.id).collect()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn get(&self, id: SeqId) -> Option<&SeqState> {
        self.running.iter().chain(self.waiting.iter()).find(|s| s.id == id)
    }

    /// Removes a sequence wherever it is, freeing its blocks (finished or cancelled).
    pub fn remove(&mut self, id: SeqId, blocks: &mut BlockManager) -> Option<SeqState> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            blocks.free_sequence(id);
            return Some(self.running.remove(i));
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(i)
    }

    /// Sets the draft sequence `id` verifies in its next decode step (empty: none).
    pub fn set_draft(&mut self, id: SeqId, draft: Vec<u32>) {
        if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
            seq.draft = draft;
        }
    }

    /// The token ids `chunk` runs: the sequence's, then its drafts.
    pub fn chunk_ids(&self, chunk: &Chunk) -> Vec<u32> {
        let Some(s) = self.get(chunk.id) else { return Vec::new() };
        let own = chunk.len - chunk.drafts;
        let mut ids = s.tokens[chunk.start..chunk.start + own].to_vec();
        ids.extend_from_slice(&s.draft[..chunk.drafts.min(s.draft.len())]);
        ids
    }

    /// Records a step's results: `chunk` is computed up to its sequence's last token and the
    /// first `accepted` of its drafts (the keys of rejected drafts stay behind in the blocks, to
    /// be overwritten), and `emitted` (what it sampled, drafts accepted included) follows the
    /// sequence's tokens. Hashes the now-full blocks for the prefix cache and gives back
    /// sliding-window blocks no later query can see.
    pub fn complete(
        &mut self,
        chunk: &Chunk,
        accepted: usize,
        emitted: &[u32],
        blocks: &mut BlockManager,
    ) {
        let Some(seq) = self.running.iter_mut().find(|s| s.id == chunk.id) else { return };
        // The accepted drafts are the first emitted tokens: the sequence holds them before
        // their blocks are hashed.
        seq.tokens.extend_from_slice(emitted);
        seq.draft.clear();
        let computed = chunk.start + chunk.len - chunk.drafts + accepted.min(chunk.drafts);
        seq.computed = computed.min(seq.tokens.len());
        // Only an unknown id fails, and every running sequence is known to the manager.
        let _ = blocks.commit(seq.id, &seq.tokens[..seq.computed]);
        blocks.release_out_of_window(seq.id, seq.computed);
    }

    /// The next step. Empty when nothing can run (idle, or waiting for space that only a
    /// finishing sequence can free).
    pub fn schedule(&mut self, blocks: &mut BlockManager) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.token_budget;
        // Decoding sequences first: one token each, preempting the newest when out of blocks.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (id, start, todo) = {
                let s = &self.running[i];
                (s.id, s.computed, s.tokens.len() - s.computed)
            };
            if todo != 1 {
                i += 1;
                continue;
            }
            let drafts = self.drafts_fitting(i, budget, blocks);
            if drafts > 0 {
                plan.chunks.push(Chunk { id, start, len: 1 + drafts, sample: true, drafts });
                budget -= 1 + drafts;
                i += 1;
            } else if blocks.ensure(id, start, start + 1).is_ok() {
                plan.chunks.push(Chunk { id, start, len: 1, sample: true, drafts: 0 });
                budget -= 1;
                i += 1;
            } else if !self.preempt_newest(i, blocks, &mut plan) {
                // Nothing newer to preempt: this sequence waits for space (its own retry).
                i += 1;
            }
        }
        // Prompts still being prefilled, in admission order.
        for s in &self.running {
            let todo = s.tokens.len() - s.computed;
            if todo <= 1 || budget == 0 {
                continue;
            }
            let len = todo.min(budget);
            if blocks.ensure(s.id, s.computed, s.computed + len).is_ok() {
                let sample = s.computed + len == s.tokens.len();
                plan.chunks.push(Chunk { id: s.id, start: s.computed, len, sample, drafts: 0 });
                budget -= len;
            }
        }
        // New requests while there is room.
        while budget > 0 && self.running.len() < self.cfg.max_seqs {
            let Some(mut s) = self.waiting.pop_front() else { break };
            let cached = blocks.add_sequence(s.id, &s.tokens);
            let len = (s.tokens.len() - cached).min(budget);
            if blocks.ensure(s.id, cached, cached + len).is_err() {
                blocks.free_sequence(s.id);
                self.waiting.push_front(s);
                break;
            }
            s.computed = cached;
            let sample = cached + len == s.tokens.len();
            plan.chunks.push(Chunk { id: s.id, start: cached, len, sample, drafts: 0 });
            plan.admitted.push((s.id, cached));
            budget -= len;
            self.running.push(s);
        }
        plan
    }

    /// How many of running sequence `i`'s drafts its decode step verifies: all of them when the
    /// budget, the context and the pool allow (their blocks are then ensured), else none (the
    /// sequence decodes one token, its draft dropped).
    fn drafts_fitting(&mut self, i: usize, budget: usize, blocks: &mut BlockManager) -> usize {
        let s = &mut self.running[i];
        let k = s.draft.len();
        let fits = k > 0
            && k < budget
            && s.computed + 1 + k <= self.cfg.max_context
            && blocks.ensure(s.id, s.computed, s.computed + 1 + k).is_ok();
        if !fits {
            s.draft.clear();
            return 0;
        }
        k
    }

    /// Sends the newest running sequence after position `keep` back to the queue's front.
    /// Returns false when there is none (the sequence at `keep` is the newest).
    fn preempt_newest(
        &mut self,
        keep: usize,
        blocks: &mut BlockManager,
        plan: &mut StepPlan,
    ) -> bool {
        if self.running.len() <= keep + 1 {
            return false;
        }
        let Some(mut s) = self.running.pop() else { return false };
        blocks.free_sequence(s.id);
        plan.chunks.retain(|c| c.id != s.id);
        s.computed = 0;
        s.draft.clear();
        plan.preempted.push(s.id);
        self.waiting.push_front(s);
        true
    }
}
