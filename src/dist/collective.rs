//! What ranks exchange in a step: every rank's tensor gathered on every rank, one rank's tensor
//! broadcast to the others, and the sum a row-parallel product needs. The sum is always the
//! pieces added in rank order, by each rank itself ([`all_reduce_sum`] builds it on the gather;
//! between GPUs that reach each other's memory, one kernel does it: `dist::p2p`), so every rank
//! gets the same bits, and a row gets the same bits whatever rows share its step (NCCL's
//! all-reduce picks its algorithm and its order of additions by message size, which a batch
//! changes: docs/tensor-parallel.md, "Identical bits on every rank").

use std::sync::{Arc, Barrier, Mutex};

use candle_core::Tensor;

use super::Shard;
use crate::kernels::layer_norm_act::{AddNorm, Normed};

/// One rank's end of a group of ranks. Every rank must make the same calls in the same order
/// with tensors of the same shape and dtype (NCCL's rule); on a GPU the calls are enqueued on the
/// device's stream, so they may be captured in a CUDA graph.
pub trait Collective: Send + Sync {
    fn shard(&self) -> Shard;
    /// Every rank's `x`, stacked in rank order: `[world, ..x.dims()]`.
    fn all_gather(&self, x: &Tensor) -> anyhow::Result<Tensor>;
    /// Writes rank `root`'s `x` into every rank's `x`, in place (a contiguous tensor of the same
    /// shape on every rank).
    fn broadcast(&self, x: &Tensor, root: usize) -> anyhow::Result<()>;
    /// How [`Collective::sum`] reaches the other ranks, for banners: `NCCL`, `peer memory`.
    fn sums_through(&self) -> &'static str {
        "an all-gather"
    }
    /// The sum over ranks of `x` (f32), added in rank order: [`all_reduce_sum`]'s bits.
    fn sum(&self, x: &Tensor) -> anyhow::Result<Tensor> {
        all_reduce_sum(self, x)
    }
    /// `norm` applied to the sum of `x` (the residual add and the norm after a row-parallel
    /// product): the bits of [`Collective::sum`] then [`AddNorm::apply`], in one launch where a
    /// collective can.
    fn sum_add_norm(&self, x: &Tensor, norm: &AddNorm) -> anyhow::Result<Normed> {
        Ok(norm.apply(&self.sum(x)?)?)
    }
}

/// The sum over ranks of `x` (f32), added in rank order: the same bits on every rank.
pub fn all_reduce_sum<C: Collective + ?Sized>(c: &C, x: &Tensor) -> anyhow::Result<Tensor> {
    let all = c.all_gather(x)?;
    let mut sum = all.get(0)?;
    for r in 1..c.shard().world {
        sum = (sum + all.get(r)?)?;
    }
    Ok(sum)
}

/// The sum over `comm`'s ranks ([`Collective::sum`]); `x` itself without one (the whole model on one rank):
/// what a row-parallel product's output goes through.
pub fn sum_over(comm: Option<&Arc<dyn Collective>>, x: Tensor) -> anyhow::Result<Tensor> {
    match comm {
        Some(_) if crate::switches::tp_skip_sums() => Ok(x),
        Some(c) => c.sum(&x),
        None => Ok(x),
    }
}

/// [`sum_over`] followed by `norm` ([`Collective::sum_add_norm`]): what a row-parallel
/// product's output goes through when a residual add and a norm come next.
pub fn sum_add_norm(
    comm: Option<&Arc<dyn Collective>>,
    x: Tensor,
    norm: &AddNorm,
) -> anyhow::Result<Normed> {
    match comm {
        Some(c) if !crate::switches::tp_skip_sums() => c.sum_add_norm(&x, norm),
        _ => Ok(norm.apply(&x)?),
    }
}

/// Every rank's `[rows, cols]` side by side: `[rows, world · cols]` (an LM head split by
/// vocabulary: each rank's logits for its rows of the vocabulary).
pub fn all_gather_cols(c: &dyn Collective, x: &Tensor) -> anyhow::Result<Tensor> {
    let (rows, cols) = x.dims2()?;
    let world = c.shard().world;
    let all = c.all_gather(&x.contiguous()?)?; // [world, rows, cols]
    Ok(all.transpose(0, 1)?.contiguous()?.reshape((rows, world * cols))?)
}

/// Ranks as threads of one process, on the CPU: the sharded forward passes checked against one
/// rank in tests, with no GPU. Built by [`ThreadGroup::new`], one end per thread.
pub struct ThreadGroup {
    shard: Shard,
    shared: Arc<Shared>,
}

struct Shared {
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

impl ThreadGroup {
    /// The `world` ends of a new group, in rank order.
    pub fn new(world: usize) -> Vec<ThreadGroup> {
        let shared =
            Arc::new(Shared { slots: Mutex::new(vec![None; world]), barrier: Barrier::new(world) });
        (0..world)
            .map(|rank| ThreadGroup { shard: Shard { rank, world }, shared: shared.clone() })
            .collect()
    }

    /// Every rank's tensor, once all have put theirs.
    fn exchange(&self, x: &Tensor) -> anyhow::Result<Vec<Tensor>> {
        let lock = || self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        lock()[self.shard.rank] = Some(x.copy()?);
        self.shared.barrier.wait();
        let all: Option<Vec<Tensor>> = lock().iter().cloned().collect();
        // Nobody puts the next tensor before everyone has read this one.
        self.shared.barrier.wait();
        all.ok_or_else(|| anyhow::anyhow!("collective: a rank's tensor is missing"))
    }
}

impl Collective for ThreadGroup {
    fn shard(&self) -> Shard {
        self.shard
    }

    fn all_gather(&self, x: &Tensor) -> anyhow::Result<Tensor> {
        let all = self.exchange(x)?;
        anyhow::ensure!(
            all.iter().all(|t| t.dims() == x.dims() && t.dtype() == x.dtype()),
            "collective: ranks gathered tensors of different shapes"
        );
        Ok(Tensor::stack(&all, 0)?)
    }

    fn broadcast(&self, x: &Tensor, root: usize) -> anyhow::Result<()> {
        let all = self.exchange(x)?;
        let src = all.get(root).ok_or_else(|| anyhow::anyhow!("collective: no rank {root}"))?;
        anyhow::ensure!(src.dims() == x.dims(), "collective: broadcast of another shape");
        if self.shard.rank != root {
            x.slice_set(src, 0, 0)?;
        }
        Ok(())
    }
}
