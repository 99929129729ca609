//! The bookkeeping of the capture arena (`arena.rs`): which bytes of its chunks are free, as a
//! pure structure over addresses, so that it is tested without a GPU.
//!
//! Best fit with coalescing: a captured decode step allocates and frees a few hundred buffers of
//! a few dozen sizes, and every capture frees all it took, so the free space returns to whole
//! chunks and the next capture (another batch size, other sizes) reuses all of it.

use std::collections::{BTreeMap, HashMap};

/// Every block starts on this boundary (`cuMemAlloc`'s own guarantee; kernels load 16 bytes).
pub const ALIGN: u64 = 256;

/// Free and live blocks over chunks of device addresses.
#[derive(Debug, Default)]
pub struct Blocks {
    /// (start, length) of each chunk.
    chunks: Vec<(u64, u64)>,
    /// Free blocks: start -> length. Adjacent free blocks of one chunk are always merged.
    free: BTreeMap<u64, u64>,
    /// Live blocks: start -> length.
    live: HashMap<u64, u64>,
}

impl Blocks {
    /// Adds a chunk of `len` bytes at `start` (aligned), all free.
    pub fn add_chunk(&mut self, start: u64, len: u64) {
        debug_assert_eq!(start % ALIGN, 0);
        let len = len / ALIGN * ALIGN;
        self.chunks.push((start, len));
        self.free.insert(start, len);
    }

    /// A block of at least `bytes` (zero included) from the best-fitting free block, or `None`
    /// when no free block is large enough.
    pub fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let want = bytes.max(1).div_ceil(ALIGN) * ALIGN;
        let (&start, &len) =
            self.free.iter().filter(|&(_, &len)| len >= want).min_by_key(|&(_, &len)| len)?;
        self.free.remove(&start);
        if len > want {
            self.free.insert(start + want, len - want);
        }
        self.live.insert(start, want);
        Some(start)
    }

    /// Frees the live block at `start`: `false` when there is none (not an arena address).
    pub fn free(&mut self, start: u64) -> bool {
        let Some(mut len) = self.live.remove(&start) else { return false };
        let mut start = start;
        let chunk = self.chunk_of(start);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back()
            && prev + plen == start
            && self.chunk_of(prev) == chunk
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = self.free.get(&(start + len))
            && self.chunk_of(start + len) == chunk
        {
            self.free.remove(&(start + len));
            len += nlen;
        }
        self.free.insert(start, len);
        true
    }

    /// Whether `start` is a live block.
    #[cfg(test)]
    pub fn is_live(&self, start: u64) -> bool {
        self.live.contains_key(&start)
    }

    /// Bytes in live blocks.
    pub fn live_bytes(&self) -> u64 {
        self.live.values().sum()
    }

    /// The largest free block's bytes.
    pub fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// (start, length) of each chunk.
    pub fn chunks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.chunks.iter().copied()
    }

    /// Bytes in all chunks.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.1).sum()
    }

    /// Free blocks (start, length), in address order.
    #[cfg(test)]
    pub fn free_blocks(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&s, &l)| (s, l)).collect()
    }

    fn chunk_of(&self, addr: u64) -> Option<usize> {
        self.chunks.iter().position(|&(s, l)| addr >= s && addr < s + l)
    }
}

#[cfg(test)]
#[path = "arena_blocks_tests.rs"]
mod tests;
