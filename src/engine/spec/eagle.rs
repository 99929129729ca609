//! EAGLE-3 drafting (`--draft HEAD`, [`crate::models::eagle3`]): a one-layer head reads the
//! target's hidden states at three layers and guesses the next tokens, one chained pass each.
//! Its guesses only change how many tokens a verify step keeps, never which.
//!
//! Position `t` of the head takes the target's taps at `t` and token `t + 1`, so it can run a
//! position only once the target has computed it and the token after it is known. Every target
//! step hands the taps of all its rows to [`EagleDrafter::record`]; they wait per sequence until
//! the next proposal, which first runs the positions whose taps and next token are known (one
//! chunk: the prompt once, then the rows the last verify step accepted; a rejected row's taps
//! are replaced by the next step's at the same position), then `k − 1` chained single-row
//! passes on its own output. The head's KV pool holds, per sequence, the positions computed
//! from real taps (`held`); a chained pass writes past them, and what it wrote is computed
//! again from the target's taps once they come.
//!
//! Positions the target never computed for this sequence (a prompt prefix its cache held) have
//! no taps: the head reads zeros there, which only costs acceptance. While more sequences run
//! than speculation serves, no step keeps taps (it would cost every step of a batch that never
//! drafts): the head forgets those sequences and never drafts for them
//! ([`EagleDrafter::untap`]), as it does for a sequence that came while it slept (its drafts
//! kept missing for every sequence) and for whose steps no taps are kept. The head's pool has no
//! prefix cache of its own: its keys at a position depend on the token after it.
//!
//! The sequences that draft in a step get their guesses together
//! ([`EagleDrafter::propose_many`]): one pass over all their new rows, then the chained passes
//! of a row each, so the head's weights are read once a pass whatever the number of sequences.

use std::collections::HashMap;

use candle_core::{DType, Tensor};

use super::super::kv::blocks::{BlockManager, SeqId};
use super::super::pool::{PoolSize, pool_with_blocks};
use super::super::runner::block_tables;
use crate::kernels::PagedBounds;
use crate::models::batch::{KvPool, StepInput};
use crate::models::eagle3::{Eagle3Head, Feature};

/// A sequence's rows in a proposal's first pass: positions `start..end`, with their taps.
struct Rows {
    start: usize,
    end: usize,
    taps: Tensor,
}

/// Rows of a sequence a proposal's first pass runs at most beside the other sequences' (more,
/// left by a long pause, run alone before it): about what a sequence gathers between
/// catch-ups.
const FIRST_PASS_ROWS: usize = 64;

/// Taps a sequence's next proposal reads: the rows of positions `held..held + rows`, in the
/// pieces the steps handed over (joined when the head runs them, not at every step).
struct Pending {
    parts: Vec<Tensor>,
    rows: usize,
}

impl Pending {
    fn new(parts: Vec<Tensor>) -> anyhow::Result<Pending> {
        let rows = parts.iter().map(|p| p.dim(0)).sum::<candle_core::Result<usize>>()?;
        Ok(Pending { parts, rows })
    }

    /// The first `n` rows' pieces.
    fn first(self, n: usize) -> anyhow::Result<Vec<Tensor>> {
        let mut kept = Vec::new();
        let mut left = n;
        for part in self.parts {
            if left == 0 {
                break;
            }
            let rows = part.dim(0)?;
            kept.push(if rows <= left { part } else { part.narrow(0, 0, left)? });
            left -= rows.min(left);
        }
        Ok(kept)
    }

    /// All the rows in one tensor.
    fn joined(&self) -> anyhow::Result<Tensor> {
        Ok(match self.parts.as_slice() {
            [one] => one.clone(),
            parts => Tensor::cat(parts, 0)?,
        })
    }
}

pub struct EagleDrafter {
    head: Eagle3Head,
    pool: KvPool,
    blocks: BlockManager,
    /// The target layers tapped (streams entering them).
    taps: [usize; 3],
    /// Per sequence: positions whose keys the head's pool holds from the target's taps.
    held: HashMap<SeqId, usize>,
    pending: HashMap<SeqId, Pending>,
    /// Sequences whose taps some step did not keep ([`EagleDrafter::untap`]): never drafted for.
    untapped: std::collections::HashSet<SeqId>,
    /// Positions one catch-up chunk runs at most (the engine's step budget).
    chunk: usize,
}

impl EagleDrafter {
    /// `head` with a pool as long as the target's (`size`), tapping a target of `layers` layers.
    pub fn new(head: Eagle3Head, size: &PoolSize, layers: usize) -> anyhow::Result<Self> {
        let taps = head.cfg.taps(layers)?;
        let (pool, blocks) = pool_with_blocks(&head.kv_shape(), size, head.device())?;
        Ok(EagleDrafter {
            head,
            pool,
            blocks,
            taps,
            held: HashMap::new(),
            pending: HashMap::new(),
            untapped: Default::default(),
            chunk: size.token_budget.max(1),
        })
    }

    /// The target layers whose entering stream the head reads (the runner's taps).
    pub fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// The target computed positions `start..start + rows.dim(0)` of sequence `id`, whose taps
    /// are `rows` (f32 `[n, 3 · hidden]`): they replace what was pending from `start` on.
    pub fn record(&mut self, id: SeqId, start: usize, rows: Tensor) -> anyhow::Result<()> {
        if self.untapped.contains(&id) {
            return Ok(());
        }
        let held = self.held.get(&id).copied().unwrap_or(0);
        let parts = match self.pending.remove(&id) {
            Some(p) if start > held => {
                let keep = (start - held).min(p.rows);
                let gap = start - held - keep;
                let mut parts = p.first(keep)?;
                if gap > 0 {
                    parts.push(Tensor::zeros((gap, rows.dim(1)?), DType::F32, rows.device())?);
                }
                parts.push(rows);
                parts
            }
            None if start > held => {
                let gap = Tensor::zeros((start - held, rows.dim(1)?), DType::F32, rows.device())?;
                vec![gap, rows]
            }
            _ => vec![rows],
        };
        // The target recomputed positions the head held (a preempted sequence): run them again.
        self.held.insert(id, held.min(start));
        self.pending.insert(id, Pending::new(parts)?);
        Ok(())
    }

    /// Sequence `id` is not drafted for: a step of it ran without keeping its taps (more
    /// sequences ran than drafting serves, where keeping them costs every step), or it came
    /// while the drafter slept. The head forgets the sequence and never drafts for it, rather
    /// than read zeros for the positions missed.
    pub fn untap(&mut self, id: SeqId) {
        if !self.untapped.contains(&id) {
            self.free(id);
            self.untapped.insert(id);
        }
    }

    /// Whether the head may draft for sequence `id` (its taps were all kept).
    pub fn drafts_for(&self, id: SeqId) -> bool {
        !self.untapped.contains(&id)
    }

    /// Taps of sequence `id` waiting for the head.
    pub fn pending_rows(&self, id: SeqId) -> usize {
        self.pending.get(&id).map_or(0, |p| p.rows)
    }

    /// The head's greedy guess of the `k` tokens after `tokens` (sequence `id`); empty when it
    /// has no new taps to start from or its pool has no room.
    pub fn propose(&mut self, id: SeqId, tokens: &[u32], k: usize) -> anyhow::Result<Vec<u32>> {
        Ok(self.propose_many(&[(id, tokens, k)])?.remove(0))
    }

    /// [`EagleDrafter::propose`] for several sequences at once, each `(id, tokens, k)`: one pass
    /// over every sequence's new rows, then `k − 1` chained passes of one row a sequence (the
    /// longest `k`; a shorter guess is cut). The passes read the head's weights once for all
    /// the sequences, where proposing one at a time reads them once a sequence.
    pub fn propose_many(
        &mut self,
        wants: &[(SeqId, &[u32], usize)],
    ) -> anyhow::Result<Vec<Vec<u32>>> {
        let mut out = vec![Vec::new(); wants.len()];
        let fits: Vec<bool> =
            wants.iter().map(|&(id, t, k)| k > 0 && t.len() >= 2 && self.drafts_for(id)).collect();
        let k_max = wants.iter().zip(&fits).filter(|w| *w.1).map(|w| w.0.2).max().unwrap_or(0);
        // Who drafts: (index in `wants`, the rows its first pass runs).
        let mut runs: Vec<(usize, Rows)> = Vec::new();
        for (i, &(id, tokens, _)) in wants.iter().enumerate() {
            if !fits[i] || tokens.len() + k_max > self.head.max_positions() {
                continue;
            }
            if let Some(rows) = self.first_rows(id, tokens, tokens.len() + k_max - 2)? {
                runs.push((i, rows));
            }
        }
        if runs.is_empty() {
            return Ok(out);
        }
        let dev = self.head.device().clone();
        let ids: Vec<u32> =
            runs.iter().flat_map(|(i, r)| wants[*i].1[r.start + 1..r.end + 1].to_vec()).collect();
        let spans: Vec<(SeqId, usize, usize)> =
            runs.iter().map(|(i, r)| (wants[*i].0, r.start, r.end - r.start)).collect();
        let taps: Vec<Tensor> = runs.iter().map(|(_, r)| r.taps.clone()).collect();
        let step = self.rows_input(&spans, Tensor::new(ids.as_slice(), &dev)?)?;
        let (mut logits, hidden) =
            self.head.forward(&step, &self.pool, Feature::Taps(&Tensor::cat(&taps, 0)?))?;
        let mut hidden = hidden.index_select(&step.logit_rows, 0)?;
        // Each guess stays on the device as the next pass's input: the passes queue one after
        // another without waiting for the host, which reads all the guesses once at the end.
        let mut guesses = Vec::with_capacity(k_max);
        for j in 0..k_max {
            let next = self.head.target_ids(&crate::kernels::argmax_rows(&logits)?)?;
            if j + 1 < k_max {
                let spans: Vec<(SeqId, usize, usize)> =
                    runs.iter().map(|(i, _)| (wants[*i].0, wants[*i].1.len() - 1 + j, 1)).collect();
                let step = self.rows_input(&spans, next.clone())?;
                (logits, hidden) =
                    self.head.forward(&step, &self.pool, Feature::Hidden(&hidden))?;
            }
            guesses.push(next);
        }
        let guesses = Tensor::stack(&guesses, 1)?.to_vec2::<u32>()?;
        for ((i, _), mut guess) in runs.iter().zip(guesses) {
            guess.truncate(wants[*i].2);
            out[*i] = guess;
        }
        Ok(out)
    }

    /// The rows of sequence `id` a proposal's first pass runs: its pending taps up to the last
    /// of `tokens`, with blocks up to position `reach`; any but the last [`FIRST_PASS_ROWS`]
    /// are run now, alone. `None` when there is nothing new or no room (the sequence is then
    /// forgotten).
    fn first_rows(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        reach: usize,
    ) -> anyhow::Result<Option<Rows>> {
        let upto = tokens.len() - 1;
        let held = self.held.get(&id).copied().unwrap_or(0);
        if upto > held + FIRST_PASS_ROWS {
            self.run(&[(id, tokens, upto - FIRST_PASS_ROWS)])?;
        }
        self.take(id, upto, reach)
    }

    /// Runs what the head can of each sequence `(id, tokens)` now, in passes shared by all of
    /// them: for a prompt (all of it but the last position, which the first proposal runs; the
    /// head's prefill then counts in the time to the first token), or taps piled up while a
    /// sequence did not draft. Sharing the passes matters where prompts end in the same step:
    /// one pass reads the head's weights and launches its kernels once for all of them.
    pub fn catch_up(&mut self, seqs: &[(SeqId, &[u32])]) -> anyhow::Result<()> {
        let wants: Vec<(SeqId, &[u32], usize)> =
            seqs.iter().filter(|(_, t)| t.len() > 2).map(|&(id, t)| (id, t, t.len() - 2)).collect();
        self.run(&wants)
    }

    /// Runs positions `held..upto` of each `(id, tokens, upto)` from its pending taps (each with
    /// the token after it), with blocks up to `upto`, in passes of at most the step budget's
    /// rows. A pass takes at most one piece of a sequence: a second piece's queries would read
    /// keys the same kernel is still writing.
    fn run(&mut self, wants: &[(SeqId, &[u32], usize)]) -> anyhow::Result<()> {
        let mut left: Vec<(SeqId, &[u32], Rows)> = Vec::new();
        for &(id, tokens, upto) in wants {
            if let Some(rows) = self.take(id, upto, upto)? {
                left.push((id, tokens, rows));
            }
        }
        let dev = self.head.device().clone();
        while !left.is_empty() {
            let (mut spans, mut ids, mut taps, mut room) =
                (Vec::new(), Vec::new(), Vec::new(), self.chunk);
            for (id, tokens, rows) in left.iter_mut() {
                let n = (rows.end - rows.start).min(room);
                if n == 0 {
                    break;
                }
                spans.push((*id, rows.start, n));
                ids.extend_from_slice(&tokens[rows.start + 1..rows.start + n + 1]);
                taps.push(rows.taps.narrow(0, 0, n)?);
                let rest = rows.end - rows.start - n;
                if rest > 0 {
                    rows.taps = rows.taps.narrow(0, n, rest)?;
                }
                rows.start += n;
                room -= n;
            }
            let step = self.rows_input(&spans, Tensor::new(ids.as_slice(), &dev)?)?;
            let taps = if taps.len() == 1 { taps.remove(0) } else { Tensor::cat(&taps, 0)? };
            self.head.forward(&step, &self.pool, Feature::Taps(&taps))?;
            left.retain(|(_, _, rows)| rows.start < rows.end);
        }
        Ok(())
    }

    /// Takes positions `held..upto` of `id` (as far as its pending taps reach) out of the
    /// pending ones, with blocks up to position `reach`: the head holds them once they run.
    /// `None` when there is nothing to run or no room (the sequence is then forgotten).
    fn take(&mut self, id: SeqId, upto: usize, reach: usize) -> anyhow::Result<Option<Rows>> {
        let held = self.held.get(&id).copied().unwrap_or(0);
        let Some(p) = self.pending.get(&id) else { return Ok(None) };
        let (have, upto) = (p.rows, upto.min(held + p.rows));
        if upto <= held {
            return Ok(None);
        }
        if !self.blocks.contains(id) {
            self.blocks.add_sequence(id, &[]);
        }
        if self.blocks.ensure(id, held, reach.max(upto) + 1).is_err() {
            self.free(id);
            return Ok(None);
        }
        let rows = p.joined()?;
        let taken = upto - held;
        self.held.insert(id, upto);
        if have > taken {
            let rest = rows.narrow(0, taken, have - taken)?;
            self.pending.insert(id, Pending { parts: vec![rest], rows: have - taken });
        } else {
            self.pending.remove(&id);
        }
        Ok(Some(Rows { start: held, end: upto, taps: rows.narrow(0, 0, taken)? }))
    }

    /// Rows of several sequences, each `(id, start, n)` (positions `start..start + n`), whose
    /// ids are `ids` (u32, in that order, on the device); logits of each sequence's last row.
    fn rows_input(
        &self,
        spans: &[(SeqId, usize, usize)],
        ids: Tensor,
    ) -> anyhow::Result<StepInput> {
        let dev = self.head.device();
        let (mut positions, mut slots, mut cu_q, mut q_pos, mut last) =
            (Vec::new(), Vec::new(), vec![0u32], Vec::new(), Vec::new());
        let (mut max_q, mut max_ctx) = (0, 0);
        for &(id, start, n) in spans {
            for p in start..start + n {
                positions.push(p as u32);
                slots.push(self.blocks.slot(id, 0, p).ok_or_else(|| {
                    anyhow::anyhow!("EAGLE-3 head: no KV slot for sequence {id}")
                })?);
            }
            let end = cu_q.last().copied().unwrap_or(0) + n as u32;
            cu_q.push(end);
            last.push(end - 1);
            q_pos.push(start as u32);
            max_q = max_q.max(n);
            max_ctx = max_ctx.max(start + n);
        }
        let seqs: Vec<SeqId> = spans.iter().map(|s| s.0).collect();
        Ok(StepInput {
            tokens: ids,
            positions: Tensor::new(positions.as_slice(), dev)?,
            slots: vec![Tensor::new(slots.as_slice(), dev)?],
            tables: vec![block_tables(&self.blocks, &seqs, 0, dev)?],
            cu_q: Tensor::new(cu_q.as_slice(), dev)?,
            q_pos: Tensor::new(q_pos.as_slice(), dev)?,
            logit_rows: Tensor::new(last.as_slice(), dev)?,
            live_rows: None,
            bounds: PagedBounds { max_q_len: max_q, max_context: max_ctx },
            local_logits: false,
        })
    }

    /// Forgets sequence `id` (finished, failed or cancelled): its blocks go back.
    pub fn free(&mut self, id: SeqId) {
        self.blocks.free_sequence(id);
        self.held.remove(&id);
        self.pending.remove(&id);
        self.untapped.remove(&id);
    }
}
