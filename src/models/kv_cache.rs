//! A KV cache preallocated for the whole context: appending writes in place (no per-token
//! allocation, no concatenation), and attention reads a narrowed view of the filled part.

use candle_core::{DType, Device, Tensor};

/// Keys and values of one attention layer, laid out `[kv_heads, capacity, head_dim]`.
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    capacity: usize,
}

impl KvCache {
    pub fn new(kv_heads: usize, capacity: usize, head_dim: usize, dtype: DType, device: &Device) -> anyhow::Result<Self> {
        let k = Tensor::zeros((kv_heads, capacity, head_dim), dtype, device)?;
        let v = Tensor::zeros((kv_heads, capacity, head_dim), dtype, device)?;
        Ok(KvCache { k, v, capacity })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes `k`, `v` (`[kv_heads, len, head_dim]`) at position `start` and returns views of
    /// positions `0..start + len`.
    pub fn append(&mut self, k: &Tensor, v: &Tensor, start: usize) -> anyhow::Result<(Tensor, Tensor)> {
        let len = k.dim(1)?;
        anyhow::ensure!(start + len <= self.capacity, "KV cache overflow: {} > {}", start + len, self.capacity);
        self.k.slice_set(&k.contiguous()?, 1, start)?;
        self.v.slice_set(&v.contiguous()?, 1, start)?;
        let end = start + len;
        Ok((self.k.narrow(1, 0, end)?, self.v.narrow(1, 0, end)?))
    }

    /// Bytes held on the device.
    pub fn bytes(&self) -> usize {
        2 * self.k.elem_count() * self.k.dtype().size_in_bytes()
    }
}
