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
//! drafts): the head forgets those sequences and never drafts for them ([`EagleDrafter::untap`]). The head's pool has no
//! prefix cache of its own: its keys at a position depend on the token after it.

use std::collections::HashMap;

use candle_core::{DType, Tensor};

use super::super::core::{EngineConfig, pool_groups};
use super::super::kv::blocks::{BlockConfig, BlockManager, SeqId};
use crate::kernels::PagedBounds;
use crate::models::batch::{KvPool, StepInput};
use crate::models::eagle3::{Eagle3Head, Feature};

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
    /// `head` with a pool as long as the target's (`cfg`), tapping a target of `layers` layers.
    pub fn new(head: Eagle3Head, cfg: &EngineConfig, layers: usize) -> anyhow::Result<Self> {
        let taps = head.cfg.taps(layers)?;
        let shape = head.kv_shape();
        let groups = pool_groups(&shape, cfg);
        let sizes: Vec<usize> = groups.iter().map(|g| g.blocks).collect();
        super::super::core::check_pool_fits(&shape, &sizes, cfg, head.device())?;
        let block_size = super::super::core::BLOCK_SIZE;
        let blocks = BlockManager::new(BlockConfig { block_size, groups })?;
        let pool = KvPool::new(&shape, block_size, &sizes, head.device())?;
        Ok(EagleDrafter {
            head,
            pool,
            blocks,
            taps,
            held: HashMap::new(),
            pending: HashMap::new(),
            untapped: Default::default(),
            chunk: cfg.token_budget.max(1),
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

    /// A step of sequence `id` ran without keeping its taps (more sequences ran than drafting
    /// serves, where keeping them costs every step): the head forgets the sequence and never
    /// drafts for it, rather than read zeros for the positions missed.
    pub fn untap(&mut self, id: SeqId) {
        if self.untapped.insert(id) {
            self.blocks.free_sequence(id);
            self.held.remove(&id);
            self.pending.remove(&id);
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
        let len = tokens.len();
        if k == 0 || len < 2 || len + k > self.head.max_positions() || !self.drafts_for(id) {
            return Ok(Vec::new());
        }
        let Some((mut logits, mut hidden)) = self.run(id, tokens, len - 1, len + k - 2)? else {
            return Ok(Vec::new());
        };
        // Each guess stays on the device as the next pass's input: the passes queue one after
        // another without waiting for the host, which reads all k guesses once at the end.
        let mut guess = Vec::with_capacity(k);
        for j in 0..k {
            let next = self.head.target_ids(&crate::kernels::argmax_rows(&logits)?)?;
            if j + 1 < k {
                let step = self.step_input_of(id, len - 1 + j, next.clone(), 0)?;
                (logits, hidden) =
                    self.head.forward(&step, &self.pool, Feature::Hidden(&hidden))?;
            }
            guess.push(next);
        }
        Ok(Tensor::cat(&guess, 0)?.to_vec1::<u32>()?)
    }

    /// Runs what the head can of the prompt now (all of it but the last position, which the
    /// first proposal runs): the head's prefill then counts in the time to the first token.
    pub fn catch_up(&mut self, id: SeqId, tokens: &[u32]) -> anyhow::Result<()> {
        if tokens.len() > 2 {
            self.run(id, tokens, tokens.len() - 2, tokens.len() - 2)?;
        }
        Ok(())
    }

    /// Runs positions `held..upto` of `id` from its pending taps (each with the token after it),
    /// with blocks up to position `reach`: the last row's draft logits and pre-norm output.
    /// `None` when there is nothing to run or no room (the sequence is then forgotten).
    fn run(
        &mut self,
        id: SeqId,
        tokens: &[u32],
        upto: usize,
        reach: usize,
    ) -> anyhow::Result<Option<(Tensor, Tensor)>> {
        let held = self.held.get(&id).copied().unwrap_or(0);
        let Some(p) = self.pending.get(&id) else { return Ok(None) };
        let have = p.rows;
        let upto = upto.min(held + have);
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
        let mut out = None;
        let mut pos = held;
        while pos < upto {
            let end = (pos + self.chunk).min(upto);
            let step = self.step_input(id, pos, &tokens[pos + 1..end + 1], end - pos - 1)?;
            let taps = rows.narrow(0, pos - held, end - pos)?;
            let (logits, hidden) = self.head.forward(&step, &self.pool, Feature::Taps(&taps))?;
            out = Some((logits, hidden.narrow(0, end - pos - 1, 1)?));
            pos = end;
        }
        self.held.insert(id, upto);
        let rest = have - (upto - held);
        if rest > 0 {
            let rows = rows.narrow(0, upto - held, rest)?;
            self.pending.insert(id, Pending { parts: vec![rows], rows: rest });
        } else {
            self.pending.remove(&id);
        }
        Ok(out)
    }

    /// One sequence's rows at positions `start..` with ids `ids`; logits of row `logit_row`.
    fn step_input(
        &self,
        id: SeqId,
        start: usize,
        ids: &[u32],
        logit_row: usize,
    ) -> anyhow::Result<StepInput> {
        self.step_input_of(id, start, Tensor::new(ids, self.head.device())?, logit_row)
    }

    /// [`EagleDrafter::step_input`] with the ids already a tensor (u32 `[n]`) on the device.
    fn step_input_of(
        &self,
        id: SeqId,
        start: usize,
        ids: Tensor,
        logit_row: usize,
    ) -> anyhow::Result<StepInput> {
        let dev = self.head.device();
        let n = ids.dim(0)?;
        let positions: Vec<u32> = (start..start + n).map(|p| p as u32).collect();
        let slots = (start..start + n)
            .map(|p| self.blocks.slot(id, 0, p))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| anyhow::anyhow!("EAGLE-3 head: no KV slot for sequence {id}"))?;
        let table = self.blocks.table(id, 0);
        Ok(StepInput {
            tokens: ids,
            positions: Tensor::new(positions.as_slice(), dev)?,
            slots: vec![Tensor::new(slots.as_slice(), dev)?],
            tables: vec![Tensor::from_slice(table, (1, table.len()), dev)?],
            cu_q: Tensor::new(&[0u32, n as u32], dev)?,
            q_pos: Tensor::new(&[start as u32], dev)?,
            logit_rows: Tensor::new(&[logit_row as u32], dev)?,
            bounds: PagedBounds { max_q_len: n, max_context: start + n },
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
