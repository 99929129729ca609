//! The paged KV-cache block manager: which device blocks each sequence's positions live in.
//!
//! The device KV memory of a layer group is a pool of blocks of `block_size` token slots; this
//! module only hands out block ids (pure bookkeeping, no tensors), so the engine can run
//! continuous batching over a fixed pool. A model has one or more **groups** of layers with
//! their own pool and block tables (Llama: one full-attention group; gpt-oss: full-attention
//! and sliding-window layers). Per group a block is in exactly one state:
//!
//! - **free**: never used, or freed without a hash; taken first by allocations;
//! - **referenced**: in the block table of one or more live sequences (`refs > 0`);
//! - **cached**: unreferenced but hashed: its content is known (a prefix hash), so a later
//!   sequence with the same prefix can take it back; evictable, least-recently-freed first.
//!
//! Sharing is only of **full, hashed** blocks, which are never written again: a sequence writes
//! only positions past its reused prefix, into blocks it allocated itself ([`KvError::ReadOnly`]
//! refuses the rest). A block's hash is the SHA-256 (first 128 bits) of its parent block's hash
//! and its token ids, so it names the whole token prefix up to the block's end, which is what
//! the KV content of every layer at those positions depends on.
//!
//! Block 0 of every group is [`PAD_BLOCK`]: never handed out, so padding rows of CUDA-graph
//! batches can write their garbage there. It is not counted by [`BlockManager::total_blocks`].

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

#[cfg(test)]
mod tests;

/// A sequence (request) as the scheduler names it.
pub type SeqId = u64;

/// A block-table entry with no block: never allocated, or released out of the sliding window.
pub const INVALID: u32 = u32::MAX;

/// The block of every group that is never allocated: the write target of padding rows (CUDA
/// graphs run fixed batch sizes; the extra rows need a slot that no sequence reads).
pub const PAD_BLOCK: u32 = 0;

/// Hash of a full block's token prefix (see [`block_hash`]).
type BlockHash = u128;

/// One group of layers sharing a block pool and block tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// Blocks in the device pool, [`PAD_BLOCK`] included (so `blocks - 1` are allocatable).
    pub blocks: usize,
    /// Sliding window W: a query at position P sees keys t with P − W < t ≤ P. `None`: full
    /// attention (every earlier position).
    pub window: Option<usize>,
}

/// The pools' shape; nothing else is reserved beyond what this says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockConfig {
    /// Token slots per block (we use 16).
    pub block_size: usize,
    pub groups: Vec<GroupSpec>,
}

/// An allocation that does not fit: the scheduler's cue to wait or preempt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("KV cache group {group}: {needed} blocks needed, {free} free")]
pub struct NoSpace {
    pub group: usize,
    pub needed: usize,
    pub free: usize,
}

/// What the manager refuses. Only [`KvError::NoSpace`] is expected in normal operation; the
/// others are scheduler bugs, reported instead of corrupting the cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    NoSpace(#[from] NoSpace),
    #[error("sequence {0} is not tracked by the KV block manager")]
    UnknownSequence(SeqId),
    #[error(
        "sequence {id}: writing {start}..{end} would touch shared or cached block {index} of group {group}"
    )]
    ReadOnly { id: SeqId, group: usize, index: usize, start: usize, end: usize },
    #[error("KV block config: {0}")]
    Config(String),
}

#[derive(Debug, Clone, Default)]
struct Block {
    refs: u32,
    hash: Option<BlockHash>,
    /// Key in [`Group::lru`] while cached (unreferenced and hashed).
    lru: Option<u64>,
}

#[derive(Debug)]
struct Group {
    window: Option<usize>,
    blocks: Vec<Block>,
    /// Unhashed unreferenced blocks, popped from the end.
    free: Vec<u32>,
    /// Cached blocks by the tick they were freed at: the first is evicted first.
    lru: BTreeMap<u64, u32>,
    /// Registered content: at most one block per hash.
    cached: HashMap<BlockHash, u32>,
}

impl Group {
    fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Takes a never-used block, else evicts the least recently freed cached one.
    fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                let blk = &mut self.blocks[b as usize];
                blk.lru = None;
                if let Some(h) = blk.hash.take() {
                    self.cached.remove(&h);
                }
                b
            }
        };
        self.blocks[b as usize].refs = 1;
        Some(b)
    }

    /// A reference on the block holding `h`, taking it out of the LRU if it was cached.
    fn hit(&mut self, h: BlockHash) -> Option<u32> {
        let b = *self.cached.get(&h)?;
        let blk = &mut self.blocks[b as usize];
        if let Some(tick) = blk.lru.take() {
            self.lru.remove(&tick);
        }
        blk.refs += 1;
        Some(b)
    }

    fn release(&mut self, b: u32, tick: u64) {
        let blk = &mut self.blocks[b as usize];
        blk.refs -= 1;
        if blk.refs == 0 {
            if blk.hash.is_some() {
                blk.lru = Some(tick);
                self.lru.insert(tick, b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// First block index a query at `pos` reads: 0 for full attention; for a window W, the
    /// block of position pos − W + 1 (earlier blocks may be released).
    fn first_needed(&self, pos: usize, bs: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w) / bs)
    }
}

#[derive(Debug)]
struct Seq {
    /// Per group: block id per block index, [`INVALID`] where none.
    tables: Vec<Vec<u32>>,
    /// Per group: entries below this are released (or were never needed).
    released: Vec<usize>,
    /// Prefix hashes of the blocks known full (reused or committed), by block index.
    hashes: Vec<BlockHash>,
}

/// Hands out KV blocks per group, keeps block tables, shares full blocks by prefix hash and
/// keeps freed hashed blocks as an LRU prefix cache. See the module docs.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    groups: Vec<Group>,
    seqs: HashMap<SeqId, Seq>,
    /// Release counter: the LRU order.
    tick: u64,
}

/// The prefix hash of a block: 128 bits of SHA-256 over the parent's hash and the token ids,
/// so equal hashes mean equal token prefixes (collisions are practically impossible).
fn block_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(parent.to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    u128::from_le_bytes(first)
}

impl BlockManager {
    /// Empty pools of the configured sizes. Refuses a zero block size or window, a group without
    /// room for [`PAD_BLOCK`], and pools whose slot numbers do not fit in `u32`.
    pub fn new(cfg: BlockConfig) -> Result<Self, KvError> {
        let bs = cfg.block_size;
        let err = |m: String| Err(KvError::Config(m));
        if bs == 0 {
            return err("block_size must be positive".into());
        }
        let mut groups = Vec::with_capacity(cfg.groups.len());
        for (g, spec) in cfg.groups.iter().enumerate() {
            if spec.blocks == 0 {
                return err(format!("group {g}: needs at least 1 block (the pad block)"));
            }
            if spec.window == Some(0) {
                return err(format!("group {g}: window must be positive"));
            }
            if spec.blocks.checked_mul(bs).is_none_or(|s| s > INVALID as usize) {
                return err(format!(
                    "group {g}: {} blocks of {bs} slots overflow u32",
                    spec.blocks
                ));
            }
            groups.push(Group {
                window: spec.window,
                blocks: vec![Block::default(); spec.blocks],
                // Popped from the end: block 1 first.
                free: (PAD_BLOCK + 1..spec.blocks as u32).rev().collect(),
                lru: BTreeMap::new(),
                cached: HashMap::new(),
            });
        }
        Ok(Self { block_size: bs, groups, seqs: HashMap::new(), tick: 0 })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Blocks a new allocation could get in group `g`: free ones plus evictable cached ones
    /// (0 for a group that does not exist).
    pub fn free_blocks(&self, g: usize) -> usize {
        self.groups.get(g).map_or(0, Group::available)
    }

    /// Allocatable blocks of group `g` ([`PAD_BLOCK`] excluded).
    pub fn total_blocks(&self, g: usize) -> usize {
        self.groups.get(g).map_or(0, |grp| grp.blocks.len() - 1)
    }

    /// Unreferenced blocks of group `g` that still hold reusable content.
    pub fn cached_blocks(&self, g: usize) -> usize {
        self.groups.get(g).map_or(0, |grp| grp.lru.len())
    }

    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Starts tracking `id` with prompt `tokens` and returns how many leading tokens are already
    /// in the cache, with references taken on their blocks: a multiple of the block size, at
    /// most `tokens.len() − 1` (the last token must run to give logits). n blocks are reused
    /// only if every full-attention group holds blocks 0..n and every sliding group holds the
    /// blocks of positions [n·bs − W + 1, n·bs) (the keys the first new query sees); the
    /// longest such n is taken. An `id` already tracked is freed first.
    pub fn add_sequence(&mut self, id: SeqId, tokens: &[u32]) -> usize {
        self.free_sequence(id);
        let bs = self.block_size;
        let max_n = tokens.len().saturating_sub(1) / bs;
        let mut hashes = Vec::with_capacity(max_n);
        for (i, chunk) in tokens.chunks_exact(bs).take(max_n).enumerate() {
            let parent = if i == 0 { 0 } else { hashes[i - 1] };
            hashes.push(block_hash(parent, chunk));
        }
        // Full groups: n is at most their longest cached run. Sliding groups: the window blocks
        // of each candidate n, longest first (O(W / bs) lookups each).
        let (full, sliding): (Vec<&Group>, Vec<&Group>) =
            self.groups.iter().partition(|grp| grp.window.is_none());
        let full_run = (full.iter())
            .map(|grp| hashes.iter().take_while(|h| grp.cached.contains_key(h)).count())
            .min()
            .unwrap_or(max_n);
        let window_cached = |n: usize| {
            sliding.iter().all(|grp| {
                let lo = grp.first_needed(n * bs, bs);
                hashes[lo..n].iter().all(|h| grp.cached.contains_key(h))
            })
        };
        let n = (0..=full_run).rev().find(|&n| window_cached(n)).unwrap_or(0);
        hashes.truncate(n);
        let mut seq = Seq { tables: Vec::new(), released: Vec::new(), hashes };
        for grp in &mut self.groups {
            let lo = grp.first_needed(n * bs, bs);
            let mut table = vec![INVALID; n];
            for (entry, &h) in table[lo..].iter_mut().zip(&seq.hashes[lo..]) {
                // Found cached above.
                *entry = grp.hit(h).expect("a checked cache hit vanished");
            }
            seq.tables.push(table);
            seq.released.push(lo);
        }
        self.seqs.insert(id, seq);
        n * bs
    }

    /// Block indices that writing positions `start..end` touches.
    fn span(&self, start: usize, end: usize) -> std::ops::Range<usize> {
        if start >= end { 0..0 } else { start / self.block_size..end.div_ceil(self.block_size) }
    }

    /// Blocks per group that [`ensure`](Self::ensure)`(id, start, end)` would allocate (an
    /// untracked `id` counts as holding nothing).
    pub fn blocks_needed(&self, id: SeqId, start: usize, end: usize) -> Vec<usize> {
        let span = self.span(start, end);
        (0..self.groups.len())
            .map(|g| {
                let table = self.seqs.get(&id).map_or(&[][..], |s| &s.tables[g][..]);
                span.clone().filter(|&i| table.get(i).is_none_or(|&b| b == INVALID)).count()
            })
            .collect()
    }

    /// Allocates so that positions `start..end` of `id` have slots in every group, before they
    /// are computed. All groups or nothing: on an error nothing changes. Positions before
    /// `start` are the caller's to have computed (in a sliding group only those from
    /// start − W + 1 on must still exist). Refuses to hand out a shared or hashed block for
    /// writing ([`KvError::ReadOnly`]): such content is immutable.
    pub fn ensure(&mut self, id: SeqId, start: usize, end: usize) -> Result<(), KvError> {
        let span = self.span(start, end);
        let seq = self.seqs.get(&id).ok_or(KvError::UnknownSequence(id))?;
        if span.is_empty() {
            return Ok(());
        }
        for (g, (grp, table)) in self.groups.iter().zip(&seq.tables).enumerate() {
            for (index, &b) in table.iter().enumerate().take(span.end).skip(span.start) {
                let blk = (b != INVALID).then(|| &grp.blocks[b as usize]);
                if blk.is_some_and(|blk| blk.refs > 1 || blk.hash.is_some()) {
                    return Err(KvError::ReadOnly { id, group: g, index, start, end });
                }
            }
        }
        let needed = self.blocks_needed(id, start, end);
        for (g, (&needed, grp)) in needed.iter().zip(&self.groups).enumerate() {
            if needed > grp.available() {
                return Err(NoSpace { group: g, needed, free: grp.available() }.into());
            }
        }
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        for ((grp, table), released) in
            self.groups.iter_mut().zip(&mut seq.tables).zip(&mut seq.released)
        {
            // Rewriting released positions (a recompute) makes them held again.
            *released = (*released).min(span.start);
            if table.len() < span.end {
                table.resize(span.end, INVALID);
            }
            for entry in &mut table[span.clone()] {
                if *entry == INVALID {
                    // Counted against `available()` above.
                    *entry = grp.take().expect("counted free blocks vanished");
                }
            }
        }
        Ok(())
    }

    /// Records that `tokens` (the whole sequence of `id` so far) are computed: every block that
    /// is now full gets its prefix hash and, in each group where it is allocated, is registered
    /// as cached content unless another block already holds that hash (then it stays
    /// unregistered: same content, no double entry). Registered blocks are read-only from now on.
    pub fn commit(&mut self, id: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let bs = self.block_size;
        let seq = self.seqs.get_mut(&id).ok_or(KvError::UnknownSequence(id))?;
        let full = tokens.len() / bs;
        for i in seq.hashes.len()..full {
            let parent = if i == 0 { 0 } else { seq.hashes[i - 1] };
            let h = block_hash(parent, &tokens[i * bs..(i + 1) * bs]);
            seq.hashes.push(h);
            for (grp, table) in self.groups.iter_mut().zip(&seq.tables) {
                let Some(&b) = table.get(i).filter(|&&b| b != INVALID) else { continue };
                let blk = &mut grp.blocks[b as usize];
                if blk.hash.is_none() && !grp.cached.contains_key(&h) {
                    blk.hash = Some(h);
                    grp.cached.insert(h, b);
                }
            }
        }
        Ok(())
    }

    /// Sliding groups: releases the blocks of `id` that hold only positions < next_pos − W + 1,
    /// which no query from `next_pos` on can see. Hashed ones become cached; their table entries
    /// become [`INVALID`]. Nothing to do for an untracked `id`.
    pub fn release_out_of_window(&mut self, id: SeqId, next_pos: usize) {
        let bs = self.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        for (g, grp) in self.groups.iter_mut().enumerate() {
            let Some(w) = grp.window else { continue };
            let upto = ((next_pos + 1).saturating_sub(w) / bs).min(seq.tables[g].len());
            // Later blocks first, so that the earliest become the most recent in the LRU.
            for i in (seq.released[g]..upto).rev() {
                let b = std::mem::replace(&mut seq.tables[g][i], INVALID);
                if b != INVALID {
                    self.tick += 1;
                    grp.release(b, self.tick);
                }
            }
            seq.released[g] = seq.released[g].max(upto);
        }
    }

    /// Ends `id` (finished, cancelled or preempted): drops its references. Hashed blocks stay
    /// cached, the sequence's last blocks released first so that they are evicted before its
    /// prefix, which other prompts are likelier to share. Nothing to do for an untracked `id`.
    pub fn free_sequence(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.remove(&id) else { return };
        for (grp, table) in self.groups.iter_mut().zip(&seq.tables) {
            for &b in table.iter().rev().filter(|&&b| b != INVALID) {
                self.tick += 1;
                grp.release(b, self.tick);
            }
        }
    }

    /// The block table of `id` in group `g` ([`INVALID`] where released or never allocated;
    /// empty for an untracked `id` or group).
    pub fn table(&self, id: SeqId, g: usize) -> &[u32] {
        self.seqs.get(&id).and_then(|s| s.tables.get(g)).map_or(&[], |t| &t[..])
    }

    /// The slot of position `pos` of `id` in group `g`: block · block_size + pos % block_size.
    pub fn slot(&self, id: SeqId, g: usize, pos: usize) -> Option<u32> {
        Tables::slot(self, id, g, pos)
    }

    /// Drops every cached (unreferenced) block's content, making it plain free: for tests and
    /// `/clear`-like resets. Blocks in use keep their hashes.
    pub fn clear_cache(&mut self) {
        for grp in &mut self.groups {
            while let Some((_, b)) = grp.lru.pop_first() {
                let blk = &mut grp.blocks[b as usize];
                blk.lru = None;
                if let Some(h) = blk.hash.take() {
                    grp.cached.remove(&h);
                }
                grp.free.push(b);
            }
        }
    }

    /// Consistency check for tests: reference counts equal the tables' references, every block is
    /// in exactly one of free / cached / referenced, the hash index matches the blocks' hashes,
    /// and [`PAD_BLOCK`] is never handed out.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (g, grp) in self.groups.iter().enumerate() {
            let n = grp.blocks.len();
            let mut refs = vec![0u32; n];
            for (id, seq) in &self.seqs {
                let table = &seq.tables[g];
                if table[..seq.released[g].min(table.len())].iter().any(|&b| b != INVALID) {
                    return Err(format!(
                        "group {g}: seq {id} holds a block below its released mark"
                    ));
                }
                let mut own: Vec<u32> = table.iter().copied().filter(|&b| b != INVALID).collect();
                for &b in &own {
                    if b == PAD_BLOCK || b as usize >= n {
                        return Err(format!("group {g}: seq {id} holds block {b}"));
                    }
                    refs[b as usize] += 1;
                }
                own.sort_unstable();
                if own.windows(2).any(|w| w[0] == w[1]) {
                    return Err(format!("group {g}: seq {id} holds a block twice"));
                }
            }
            let mut seen = vec![0u32; n];
            for &b in grp.free.iter().chain(grp.lru.values()) {
                seen[b as usize] += 1;
            }
            for (b, blk) in grp.blocks.iter().enumerate() {
                // Every block in exactly one place; the pad block in none.
                let place = seen[b] + u32::from(refs[b] > 0) + u32::from(b == PAD_BLOCK as usize);
                if blk.refs != refs[b] || place != 1 {
                    return Err(format!(
                        "group {g} block {b}: refs {} vs {} in tables, in {place} places",
                        blk.refs, refs[b]
                    ));
                }
                if let Some(h) = blk.hash
                    && grp.cached.get(&h) != Some(&(b as u32))
                {
                    return Err(format!("group {g} block {b}: hash not indexed"));
                }
                let in_lru = blk.lru.is_some_and(|t| grp.lru.get(&t) == Some(&(b as u32)));
                if in_lru != (blk.refs == 0 && blk.hash.is_some()) || blk.lru.is_some() != in_lru {
                    return Err(format!("group {g} block {b}: LRU entry disagrees with state"));
                }
            }
            if grp.free.iter().any(|&b| grp.blocks[b as usize].hash.is_some()) {
                return Err(format!("group {g}: a free block has a hash"));
            }
            if grp.cached.iter().any(|(h, &b)| grp.blocks[b as usize].hash != Some(*h)) {
                return Err(format!("group {g}: hash index points at a block without it"));
            }
            let referenced = refs.iter().filter(|&&r| r > 0).count();
            if grp.available() + referenced != n - 1 {
                return Err(format!("group {g}: free + cached + referenced != total"));
            }
        }
        Ok(())
    }
}

/// What a step reads of the block manager: each sequence's block tables. The runner takes it
/// from the manager, and a tensor-parallel rank that follows rank 0 from the tables rank 0 sent
/// (`engine/ranks.rs`).
pub trait Tables {
    fn block_size(&self) -> usize;
    /// The block table of `id` in group `g` (empty for an untracked `id` or group).
    fn table(&self, id: SeqId, g: usize) -> &[u32];

    /// The slot of position `pos` of `id` in group `g`: block · block_size + pos % block_size.
    fn slot(&self, id: SeqId, g: usize, pos: usize) -> Option<u32> {
        let bs = self.block_size();
        let b = *self.table(id, g).get(pos / bs).filter(|&&b| b != INVALID)?;
        // The manager checked that every slot number fits in u32.
        Some(b * bs as u32 + (pos % bs) as u32)
    }
}

impl Tables for BlockManager {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn table(&self, id: SeqId, g: usize) -> &[u32] {
        BlockManager::table(self, id, g)
    }
}
