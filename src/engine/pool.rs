//! How large a KV pool is: the blocks of each group for an engine of a given size, the check that
//! they fit beside the model, and a runner built over them. The engine's pool and its drafters'
//! (a draft model's, an EAGLE-3 head's) are sized alike, so that a drafter follows every
//! sequence the engine holds.

use super::kv::blocks::{BlockConfig, BlockManager, GroupSpec};
use super::runner::Runner;
use crate::error::{ErrorKind, fail};
use crate::models::batch::{BatchModel, KvPool, KvShape};

/// Tokens per KV block (vLLM's default): the prefix cache's granularity.
pub const BLOCK_SIZE: usize = 16;

/// Tokens of released sliding-window blocks kept for the prefix cache beyond what running
/// sequences need (see [`pool_groups`]).
pub const SLIDING_HEADROOM: usize = 4096;

/// What a pool is sized by: the engine's batch, context and step (the parts of
/// [`crate::engine::core::EngineConfig`] a pool reads).
#[derive(Debug, Clone, Copy)]
pub struct PoolSize {
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Tokens of KV the pool holds for full-attention layers (over all sequences).
    pub kv_tokens: usize,
    /// Tokens one step runs at most.
    pub token_budget: usize,
}

/// Memory kept free beside the pool for a step's intermediates and the CUDA libraries (the
/// loader's plan counted them for one sequence; a batch of prompt chunks is bounded by the
/// same token budget).
const POOL_RESERVE: u64 = 512 << 20;

/// The blocks of each KV group a pool of `size` allocates (the memory plan counts the same, at
/// [`crate::engine::core::EngineConfig::single`]).
pub fn pool_groups(shape: &KvShape, size: &PoolSize) -> Vec<GroupSpec> {
    // One more block per group: the manager's padding block.
    let full = size.kv_tokens.div_ceil(BLOCK_SIZE).max(1) + 1;
    shape
        .group_windows
        .iter()
        .map(|w| {
            // A sliding layer needs no more than its window and one chunk per sequence, plus
            // room to keep released windows cached: a chat's next turn reuses the window at
            // the end of the previous prompt, which a reply of up to SLIDING_HEADROOM tokens
            // does not evict.
            let blocks = match w {
                Some(w) => {
                    let per_seq = (w + size.token_budget).div_ceil(BLOCK_SIZE) + 1;
                    let headroom = SLIDING_HEADROOM.div_ceil(BLOCK_SIZE);
                    full.min(per_seq * size.max_seqs + headroom + 1)
                }
                None => full,
            };
            GroupSpec { blocks, window: *w }
        })
        .collect()
}

/// `model`'s runner with a KV pool of `size` ([`pool_with_blocks`]), and the block manager that
/// hands its blocks out.
pub(crate) fn runner_with_pool(
    model: Box<dyn BatchModel>,
    size: &PoolSize,
) -> anyhow::Result<(Runner, BlockManager)> {
    let shape = model.kv_shape();
    let (pool, blocks) = pool_with_blocks(&shape, size, model.device())?;
    Ok((Runner::new(model, pool, shape), blocks))
}

/// A pool of `size` ([`pool_groups`]) for keys and values of `shape` on `device`, and the block
/// manager that hands its blocks out; refused when the pool would not fit in what the device
/// has free.
pub(crate) fn pool_with_blocks(
    shape: &KvShape,
    size: &PoolSize,
    device: &candle_core::Device,
) -> anyhow::Result<(KvPool, BlockManager)> {
    let groups = pool_groups(shape, size);
    // The pool holds every block the manager hands out, its padding block included.
    let pool_blocks: Vec<usize> = groups.iter().map(|g| g.blocks).collect();
    check_pool_fits(shape, &pool_blocks, size, device)?;
    let blocks = BlockManager::new(BlockConfig { block_size: BLOCK_SIZE, groups })?;
    let pool = KvPool::new(shape, BLOCK_SIZE, &pool_blocks, device)?;
    Ok((pool, blocks))
}

/// Refuses a pool that would not fit in what is free now (exit code 7, with the numbers and
/// what to lower), instead of failing in the allocator.
fn check_pool_fits(
    shape: &KvShape,
    blocks: &[usize],
    size: &PoolSize,
    device: &candle_core::Device,
) -> anyhow::Result<()> {
    let per_block: Vec<u64> = (0..blocks.len())
        .map(|g| shape.bytes_per_token_layer() * (BLOCK_SIZE * shape.layers_in(g)) as u64)
        .collect();
    let bytes = blocks
        .iter()
        .zip(&per_block)
        .fold(0u64, |sum, (&n, &b)| sum.saturating_add((n as u64).saturating_mul(b)));
    let Some(free) = crate::gpu::available(device) else { return Ok(()) };
    if bytes.saturating_add(POOL_RESERVE) <= free {
        return Ok(());
    }
    let iec = crate::util::human_bytes_iec;
    Err(fail(
        ErrorKind::Memory,
        format!(
            "the KV cache for {} sequence(s) and {} tokens needs {}, but {} is free beside the model (keeping {} for the steps): lower the concurrency, --kv-tokens or --context",
            size.max_seqs,
            size.kv_tokens,
            iec(bytes),
            iec(free),
            iec(POOL_RESERVE)
        ),
    ))
}
