//! Tensor parallelism's pieces below the models: which slice of a layer a rank holds
//! ([`Shard`]) and the collectives ranks combine their slices with ([`Collective`]: NCCL between
//! GPUs, threads on the CPU). A model sharded over `world` ranks keeps its attention heads, its
//! MLP's intermediate columns (gpt-oss: of every expert, at MXFP4 block boundaries) and its LM
//! head's vocabulary rows split by rank, in the Megatron layout (docs/tensor-parallel.md, "The
//! split"), and sums its row-parallel products (o_proj, down / the experts) with one collective
//! each.

use std::ops::Range;

pub mod collective;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod p2p;

pub use collective::{Collective, ThreadGroup};

/// This process's (or thread's) place among the ranks of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub world: usize,
}

impl Shard {
    /// The whole model on one rank.
    pub const SINGLE: Shard = Shard { rank: 0, world: 1 };

    pub fn new(rank: usize, world: usize) -> anyhow::Result<Shard> {
        anyhow::ensure!(world >= 1 && rank < world, "rank {rank} of {world} ranks");
        Ok(Shard { rank, world })
    }

    pub fn is_single(&self) -> bool {
        self.world == 1
    }

    /// This rank's share of `n` units, balanced: the first `n % world` ranks take one more.
    pub fn balanced(&self, n: usize) -> Range<usize> {
        let (base, extra) = (n / self.world, n % self.world);
        let start = self.rank * base + self.rank.min(extra);
        start..start + base + usize::from(self.rank < extra)
    }

    /// The query heads and key/value heads this rank attends with. Query heads split evenly;
    /// key/value heads split with them, or, where there are fewer than ranks, each rank keeps the
    /// one its query heads read (vLLM's `QKVParallelLinear`).
    pub fn heads(
        &self,
        heads: usize,
        kv_heads: usize,
    ) -> anyhow::Result<(Range<usize>, Range<usize>)> {
        let w = self.world;
        anyhow::ensure!(
            heads.is_multiple_of(w)
                && kv_heads > 0
                && (kv_heads.is_multiple_of(w) || w.is_multiple_of(kv_heads)),
            "--tp {w} must divide the model's {heads} attention heads, and its {kv_heads} key/value heads must divide by it or it by them"
        );
        let q = self.rank * heads / w..(self.rank + 1) * heads / w;
        let kv = if kv_heads >= w {
            self.rank * kv_heads / w..(self.rank + 1) * kv_heads / w
        } else {
            let h = self.rank / (w / kv_heads);
            h..h + 1
        };
        Ok((q, kv))
    }

    /// Rows of an LM head split by vocabulary: this rank's real rows, and the rows every rank
    /// holds (`ceil(vocab / world)`; the last rank's are padded with zero rows), so the gathered
    /// logits are `world` equal pieces.
    pub fn vocab(&self, vocab: usize) -> (Range<usize>, usize) {
        let per = vocab.div_ceil(self.world);
        let start = (self.rank * per).min(vocab);
        (start..((self.rank + 1) * per).min(vocab), per)
    }

    /// This rank's MXFP4 blocks of 32 of an intermediate dimension of `n` (a multiple of 32):
    /// its columns, balanced by blocks so that no block is cut.
    pub fn blocks_of_32(&self, n: usize) -> anyhow::Result<Range<usize>> {
        anyhow::ensure!(
            n.is_multiple_of(32) && n / 32 >= self.world,
            "--tp {}: the intermediate size {n} has {} blocks of 32, fewer than the ranks",
            self.world,
            n / 32
        );
        let b = self.balanced(n / 32);
        Ok(b.start * 32..b.end * 32)
    }
}

#[cfg(test)]
mod tests;
