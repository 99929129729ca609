//! Tensor parallelism in the engine: rank 0 runs the scheduler, the block manager and the
//! sampler; the other ranks hold their slices of the model and of the KV pool (the same blocks,
//! their own heads) and run every step rank 0 runs, in the same order, so that the collectives
//! inside the model meet. Before each step, rank 0's runner sends the others a [`StepOp`]: the
//! chunks, their token ids and their sequences' block tables, which is everything a runner's
//! step reads from the host, and the rows' draws where the ranks draw the step's ids
//! ([`draw_on_ranks`]: every rank takes part in that draw); the other ranks' runners follow
//! ([`Runner::follow`](super::runner::Runner::follow)). A pipelined decode step's ids exist only
//! on rank 0's device; they reach the other ranks by a broadcast on the stream, in front of the
//! step (`graphs.rs`).
//!
//! The ops travel as words (u32), framed by the transport (`load/ranks.rs`): a decode step of 64
//! sequences with 8k-token tables is ~130 KB, written and parsed without a serializer's cost.

use std::collections::HashMap;

use candle_core::Tensor;

use super::kv::blocks::{SeqId, Tables};
use super::scheduler::Chunk;
use crate::models::batch::BatchModel;

/// What rank 0 sends the other ranks before a step.
#[derive(Debug, PartialEq)]
pub enum StepOp {
    /// [`Runner::forward_drawn`](super::runner::Runner::forward_drawn) of these chunks, ids and
    /// draws.
    Forward { chunks: Vec<Chunk>, inputs: Vec<Vec<u32>>, tables: TableSnapshot, draws: Draws },
    /// [`Runner::forward_after`](super::runner::Runner::forward_after) of these chunks (the ids
    /// come by broadcast) and draws.
    ForwardAfter { chunks: Vec<Chunk>, tables: TableSnapshot, draws: Draws },
    /// The engine stopped: the rank exits.
    Stop,
}

/// Each sampled row's `(1/T, seed)` where the ranks draw the step's ids.
pub type Draws = Option<Vec<(f32, u64)>>;

/// The ranks rank 0's runner sends each step to.
pub trait Followers: Send {
    fn send(&mut self, words: Vec<u32>) -> anyhow::Result<()>;
}

/// The ids of a step's rows from this rank's piece of their logits (`[R, ceil(vocab / world)]`,
/// [`crate::models::batch::StepInput::local_logits`]) and the draws' words (u32 `[3R]`,
/// [`crate::kernels::draw_words`]): every rank's candidates gathered, then picked (the same ids
/// on every rank, those [`device_ids`](super::runner::device_ids) draws from the whole logits).
/// Every rank of the model must call it.
pub fn draw_on_ranks(
    model: &dyn BatchModel,
    logits: &Tensor,
    words: &Tensor,
) -> anyhow::Result<Tensor> {
    let c = model.collective().ok_or_else(|| anyhow::anyhow!("a draw on ranks without ranks"))?;
    let (mine, _) = c.shard().vocab(model.vocab_size());
    let candidates = crate::kernels::shard_candidates(logits, mine.start, mine.len(), words)?;
    Ok(crate::kernels::pick_candidates(&c.all_gather(&candidates)?)?)
}

/// The block tables of a step's sequences, as rank 0's block manager had them.
#[derive(Debug, Default, PartialEq)]
pub struct TableSnapshot {
    block_size: usize,
    seqs: HashMap<SeqId, Vec<Vec<u32>>>,
}

impl Tables for TableSnapshot {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn table(&self, id: SeqId, g: usize) -> &[u32] {
        self.seqs.get(&id).and_then(|t| t.get(g)).map_or(&[], |t| &t[..])
    }
}

const FORWARD: u32 = 0;
const FORWARD_AFTER: u32 = 1;
const STOP: u32 = 2;

/// The words of a step: `[kind, chunks, groups, block_size]`, then per chunk `[id (2 words),
/// start, len, sample, drafts, ids…, per group: table length, table…]` (ids counted by `len`
/// for a forward, none after), then the draws: `[0]` for none, else `[rows + 1]` and their
/// [`crate::kernels::draw_words`].
pub fn encode(
    kind_after: bool,
    chunks: &[Chunk],
    inputs: &[&[u32]],
    tables: &dyn Tables,
    groups: usize,
    draws: Option<&[(f32, u64)]>,
) -> Vec<u32> {
    let kind = if kind_after { FORWARD_AFTER } else { FORWARD };
    let mut w = vec![kind, chunks.len() as u32, groups as u32, tables.block_size() as u32];
    for (i, c) in chunks.iter().enumerate() {
        w.extend([c.id as u32, (c.id >> 32) as u32, c.start as u32, c.len as u32]);
        w.extend([u32::from(c.sample), c.drafts as u32]);
        if !kind_after {
            w.extend_from_slice(inputs.get(i).copied().unwrap_or(&[]));
        }
        for g in 0..groups {
            let t = tables.table(c.id, g);
            w.push(t.len() as u32);
            w.extend_from_slice(t);
        }
    }
    match draws {
        Some(d) => {
            w.push(d.len() as u32 + 1);
            w.extend(crate::kernels::draw_words(d));
        }
        None => w.push(0),
    }
    w
}

/// The stop op's words.
pub fn encode_stop() -> Vec<u32> {
    vec![STOP]
}

/// Parses [`encode`]'s words; a malformed op is an error, never a panic.
pub fn decode(words: &[u32]) -> anyhow::Result<StepOp> {
    let mut at = 0;
    let mut take = |n: usize| -> anyhow::Result<&[u32]> {
        let s = words.get(at..at + n).ok_or_else(|| anyhow::anyhow!("rank: a truncated step"))?;
        at += n;
        Ok(s)
    };
    let kind = take(1)?[0];
    if kind == STOP {
        return Ok(StepOp::Stop);
    }
    anyhow::ensure!(kind == FORWARD || kind == FORWARD_AFTER, "rank: unknown step kind {kind}");
    let head = take(3)?;
    let (n, groups, block_size) = (head[0] as usize, head[1] as usize, head[2] as usize);
    let (mut chunks, mut inputs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut seqs = HashMap::with_capacity(n);
    for _ in 0..n {
        let c = take(6)?;
        let chunk = Chunk {
            id: u64::from(c[0]) | (u64::from(c[1]) << 32),
            start: c[2] as usize,
            len: c[3] as usize,
            sample: c[4] != 0,
            drafts: c[5] as usize,
        };
        if kind == FORWARD {
            inputs.push(take(chunk.len)?.to_vec());
        }
        let mut tables = Vec::with_capacity(groups);
        for _ in 0..groups {
            let len = take(1)?[0] as usize;
            tables.push(take(len)?.to_vec());
        }
        seqs.insert(chunk.id, tables);
        chunks.push(chunk);
    }
    let draws = match take(1)?[0] as usize {
        0 => None,
        marked => {
            let w = take(3 * (marked - 1))?;
            Some((0..marked - 1).map(|r| crate::kernels::draw_of(w, r)).collect())
        }
    };
    anyhow::ensure!(at == words.len(), "rank: {} words after a step", words.len() - at);
    let tables = TableSnapshot { block_size, seqs };
    Ok(if kind == FORWARD {
        StepOp::Forward { chunks, inputs, tables, draws }
    } else {
        StepOp::ForwardAfter { chunks, tables, draws }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_round_trip_and_bad_words_are_errors() {
        let mut blocks = TableSnapshot { block_size: 16, seqs: HashMap::new() };
        blocks.seqs.insert(7 | (3 << 32), vec![vec![1, 2], vec![9]]);
        blocks.seqs.insert(2, vec![vec![4], vec![]]);
        let chunks = vec![
            Chunk { id: 7 | (3 << 32), start: 17, len: 3, sample: true, drafts: 2 },
            Chunk { id: 2, start: 0, len: 1, sample: false, drafts: 0 },
        ];
        let ids: [&[u32]; 2] = [&[5, 6, 7], &[8]];
        let words = encode(false, &chunks, &ids, &blocks, 2, None);
        let want = StepOp::Forward {
            chunks: chunks.clone(),
            inputs: vec![vec![5, 6, 7], vec![8]],
            tables: TableSnapshot { block_size: 16, seqs: blocks.seqs.clone() },
            draws: None,
        };
        assert_eq!(decode(&words).unwrap(), want);
        let draws = [(0.0, 0), (1.25, u64::MAX - 3), (0.5, 1 << 40)];
        let after = decode(&encode(true, &chunks, &[], &blocks, 2, Some(&draws))).unwrap();
        assert!(matches!(after, StepOp::ForwardAfter { chunks: c, draws: Some(d), .. }
            if c == chunks && d == draws));
        assert_eq!(decode(&encode_stop()).unwrap(), StepOp::Stop);
        for cut in 0..words.len() {
            assert!(decode(&words[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode(&[9]).is_err());
    }
}
