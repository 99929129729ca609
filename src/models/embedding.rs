//! The token embedding, whole on one GPU or split by vocabulary over tensor-parallel ranks, as the
//! LM head is (docs/tensor-parallel.md, "The embedding and the LM head"): each rank keeps the rows
//! of its share of the ids, looks up zeros for the others' tokens, and the sum over the ranks gives
//! every token its row with the bits one GPU's lookup gives (one rank's values plus zeros). A head
//! tied to the embedding shares the rank's rows.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::head::{Head, vocab_rows};
use super::linear::Linear;
use super::memory::Measured;
use crate::dist::{Collective, Shard, collective::sum_over};
use crate::kernels::embed_rows;

#[derive(Clone)]
pub struct Embedding {
    /// This rank's rows `[rows, hidden]` (on one GPU, the whole table), in the compute dtype
    /// (f32 for a quantized GGUF's).
    rows: Tensor,
    /// The id of `rows`' first row.
    first: usize,
    /// The whole table, where this rank keeps it: on one GPU, and on rank 0 of a group whose
    /// EAGLE-3 head has no embedding of its own and reads the model's.
    whole: Option<Tensor>,
    /// `rows` are a rank's share: a lookup is summed over the ranks.
    split: bool,
}

impl Embedding {
    /// The whole table `[vocab, hidden]`.
    pub fn whole(table: Tensor) -> Embedding {
        Embedding { rows: table.clone(), first: 0, whole: Some(table), split: false }
    }

    /// The whole table, where this rank keeps it.
    pub fn table(&self) -> Option<&Tensor> {
        self.whole.as_ref()
    }

    /// Whether `lm_head` is this embedding (a tied head, or a rank's rows of one).
    pub fn is_head(&self, lm_head: &Linear) -> bool {
        matches!(lm_head, Linear::Dense { weight, .. } if weight.id() == self.rows.id())
    }

    /// The f32 rows of `tokens` (u32 `[n]`): `[n, hidden]`, summed over `comm`'s ranks when
    /// the table is split (every rank must then call it).
    pub fn lookup(
        &self,
        tokens: &Tensor,
        comm: Option<&Arc<dyn Collective>>,
    ) -> anyhow::Result<Tensor> {
        let mine = embed_rows(&self.rows, tokens, self.first)?;
        if !self.split {
            return Ok(mine);
        }
        anyhow::ensure!(comm.is_some(), "a split embedding's lookup needs its ranks");
        sum_over(comm, mine)
    }

    /// Bytes of one row (what a step reads per token).
    pub fn row_bytes(&self) -> u64 {
        let hidden = self.rows.dims().get(1).copied().unwrap_or(0);
        (hidden * self.rows.dtype().size_in_bytes()) as u64
    }

    /// Counts the table's bytes once in `m` (this rank's rows are a view of the whole table where
    /// it keeps both).
    pub fn measure(&self, m: &mut Measured) {
        match &self.whole {
            Some(w) => {
                m.tensor(w);
                m.view(&self.rows);
            }
            None => m.tensor(&self.rows),
        }
    }
}

/// Rank `shard`'s embedding and head from the whole ones (anywhere: loaded on the CPU), on
/// `device`: the head's rows of the vocabulary ([`Head::shard`]), the embedding's same rows, and
/// the whole embedding too with `keep_whole`. A tied head is the embedding's rows, one tensor
/// (kept apart beside a whole table).
pub fn shard_ends(
    embed: &Embedding,
    head: &Head,
    shard: Shard,
    keep_whole: bool,
    device: &Device,
) -> anyhow::Result<(Embedding, Head)> {
    let Some(table) = embed.table() else {
        anyhow::bail!("sharding the embedding needs the whole table")
    };
    let (range, _) = shard.vocab(table.dim(0)?);
    if keep_whole {
        let whole = table.to_device(device)?;
        let rows = whole.narrow(0, range.start, range.len())?;
        let e = Embedding { rows, first: range.start, whole: Some(whole), split: true };
        return Ok((e, head.shard(shard, device)?));
    }
    let rows = vocab_rows(table, shard, device)?;
    let head = match embed.is_head(&head.lm_head) {
        true => Head {
            norm: head.norm.to_device(device)?,
            lm_head: Linear::Dense { weight: rows.clone(), bias: None },
            eps: head.eps,
        },
        false => head.shard(shard, device)?,
    };
    Ok((Embedding { rows, first: range.start, whole: None, split: true }, head))
}
