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
}
