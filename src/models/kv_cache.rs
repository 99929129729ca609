//! A KV cache preallocated once: appending writes in place (no per-token allocation, no
//! concatenation). Linear caches hold position p in slot p and attention reads the filled
//! prefix; ring caches (sliding-window layers) hold position p in slot p mod capacity, so a
//! layer that only ever looks back `window` positions needs no more than that.

use candle_core::{DType, Device, Tensor};

/// Keys and values of one attention layer, laid out `[kv_heads, capacity, head_dim]`.
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    capacity: usize,
}

impl KvCache {
    pub fn new(
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let k = Tensor::zeros((kv_heads, capacity, head_dim), dtype, device)?;
        let v = Tensor::zeros((kv_heads, capacity, head_dim), dtype, device)?;
        Ok(KvCache { k, v, capacity })
    }

    /// Bytes [`KvCache::new`] allocates for these dimensions (keys and values), saturating:
    /// what memory plans count before anything is allocated.
    pub fn planned_bytes(kv_heads: usize, capacity: usize, head_dim: usize, dtype: DType) -> u64 {
        2u64.saturating_mul(super::memory::dense_bytes(&[kv_heads, capacity, head_dim], dtype))
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dtype(&self) -> DType {
        self.k.dtype()
    }

    /// Writes `k`, `v` (`[kv_heads, len, head_dim]`) at position `start` and returns views of
    /// positions `0..start + len`.
    pub fn append(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> anyhow::Result<(Tensor, Tensor)> {
        let len = k.dim(1)?;
        anyhow::ensure!(
            start + len <= self.capacity,
            "KV cache overflow: {} > {}",
            start + len,
            self.capacity
        );
        self.k.slice_set(&k.contiguous()?, 1, start)?;
        self.v.slice_set(&v.contiguous()?, 1, start)?;
        let end = start + len;
        Ok((self.k.narrow(1, 0, end)?, self.v.narrow(1, 0, end)?))
    }

    /// Ring buffer: writes positions `start..start + len` to slots `p mod capacity` (wrapping)
    /// and returns the whole buffers; slot-to-position mapping is `KvLayout::Ring`'s.
    pub fn append_ring(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> anyhow::Result<(Tensor, Tensor)> {
        let len = k.dim(1)?;
        anyhow::ensure!(
            len <= self.capacity,
            "ring KV cache: {len} new positions exceed its {} slots",
            self.capacity
        );
        let first = start % self.capacity;
        let head = len.min(self.capacity - first);
        for (cache, new) in [(&self.k, k), (&self.v, v)] {
            cache.slice_set(&new.narrow(1, 0, head)?.contiguous()?, 1, first)?;
            if head < len {
                cache.slice_set(&new.narrow(1, head, len - head)?.contiguous()?, 1, 0)?;
            }
        }
        Ok((self.k.clone(), self.v.clone()))
    }

    /// The whole key and value buffers, for kernels that write them in place at a position held
    /// on the device (decode steps captured in a CUDA graph).
    pub fn buffers(&self) -> (Tensor, Tensor) {
        (self.k.clone(), self.v.clone())
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        2 * self.k.elem_count() * self.k.dtype().size_in_bytes()
    }

    /// Copies this cache's keys and values into `k`, `v` (same shapes): a checkpoint.
    pub fn copy_to(&self, k: &Tensor, v: &Tensor) -> anyhow::Result<()> {
        k.slice_set(&self.k, 1, 0)?;
        v.slice_set(&self.v, 1, 0)?;
        Ok(())
    }

    /// Overwrites this cache, in place, with a checkpoint taken by [`KvCache::copy_to`]. In
    /// place because a captured CUDA graph holds the buffers' addresses.
    pub fn restore_from(&mut self, k: &Tensor, v: &Tensor) -> anyhow::Result<()> {
        self.k.slice_set(k, 1, 0)?;
        self.v.slice_set(v, 1, 0)?;
        Ok(())
    }

    /// Zeroed buffers shaped like this cache's, to take checkpoints into.
    pub fn empty_like(&self) -> anyhow::Result<(Tensor, Tensor)> {
        Ok((self.k.zeros_like()?, self.v.zeros_like()?))
    }
}

/// Which positions a ring cache still holds *for the current sequence*.
///
/// Writing position `q` overwrites slot `q mod slots`, the slot of position `q − slots`. A
/// sequence that continues at its end never needs those keys again (a query at `p` sees only
/// `p − window < t ≤ p`, and the ring has `window + chunk − 1` slots). A sequence that is
/// *rewound* — a chat turn whose prompt shares only part of what the cache held, as harmony's
/// dropped reasoning makes every turn — may continue at a position whose window the ring has
/// already lost to later tokens. The tracker records the oldest position still held intact
/// (`valid_from`), including what tokens of an abandoned continuation overwrote, so a model can
/// refuse such a start instead of attending to the wrong keys (docs/gpt-oss.md §4.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTracker {
    slots: usize,
    window: usize,
    /// Positions `valid_from..end` are held for this sequence.
    valid_from: usize,
    end: usize,
}

impl RingTracker {
    pub fn new(slots: usize, window: usize) -> Self {
        RingTracker { slots, window: window.max(1), valid_from: 0, end: 0 }
    }

    /// The same ring, holding nothing (a sequence restarted at position 0).
    pub fn emptied(self) -> Self {
        RingTracker::new(self.slots, self.window)
    }

    /// Positions written so far (the sequence's end).
    pub fn end(&self) -> usize {
        self.end
    }

    /// Whether a chunk can start at `start`: at 0 (a new sequence), or within what was written
    /// with every key its first query sees (`start − window < t < start`) still held. Later
    /// queries of the chunk see the chunk's own keys.
    pub fn can_continue_at(&self, start: usize) -> bool {
        start == 0
            || (start <= self.end && start.saturating_sub(self.window - 1) >= self.valid_from)
    }

    /// Records that positions `start..start + len` were written (after `can_continue_at`).
    pub fn record_write(&mut self, start: usize, len: usize) {
        let end = start + len;
        // What was held before `start` stays, minus the slots the new positions overwrote.
        self.valid_from = self.valid_from.min(start).max(end.saturating_sub(self.slots));
        self.end = end;
    }
}

#[cfg(test)]
mod ring_tests {
    use super::RingTracker;

    /// Replays writes on a model of the ring (slot → position written there) and checks the
    /// tracker's answer against it for every start.
    #[test]
    fn tracker_agrees_with_a_model_of_the_slots() {
        let (slots, window) = (7, 3);
        let mut held: Vec<Option<usize>> = vec![None; slots];
        // What the sequence holds at each position: `Some(p)` when slot p mod slots has p.
        let mut t = RingTracker::new(slots, window);
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        for _ in 0..2000 {
            // The truth: a start is good when every key its first query sees is in its slot.
            let truth = |start: usize, end: usize, held: &[Option<usize>]| {
                start <= end
                    && (start.saturating_sub(window - 1)..start).all(|p| held[p % slots] == Some(p))
            };
            let end = t.end();
            let start = if next(3) == 0 { next(end + 1) } else { end };
            assert_eq!(t.can_continue_at(start), truth(start, end, &held), "start {start}, {t:?}");
            if !t.can_continue_at(start) {
                if next(4) == 0 {
                    t = RingTracker::new(slots, window);
                    held = vec![None; slots];
                }
                continue;
            }
            let len = 1 + next(slots - window + 1);
            for q in start..start + len {
                held[q % slots] = Some(q);
            }
            t.record_write(start, len);
        }
    }
}
