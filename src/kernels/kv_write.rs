//! One decode step's keys or values written into a preallocated KV cache at a position held in a
//! tensor rather than on the host (candle's `slice_set` takes the slot from the host, which a
//! CUDA graph would freeze). CPU only: it is the reference for the cache writes that
//! [`super::qkv_rope_store`]'s CUDA kernel does together with RoPE.
//!
//! Linear caches write slot `pos`, ring caches slot `pos mod capacity` (see [`KvLayout`]).

use candle_core::{CpuStorage, DType, InplaceOp3, Layout, Result, Tensor, bail};

use super::KvLayout;

/// Writes `new` (`[kv_heads, 1, d]`) into `cache` (`[kv_heads, capacity, d]`, contiguous) at the
/// position in `pos` (i64 `[1]`, on the cache's device). A position past a linear cache is an
/// error. CPU tensors only.
pub fn kv_write_at(cache: &Tensor, new: &Tensor, pos: &Tensor, layout: KvLayout) -> Result<()> {
    let (heads, _, d) = cache.dims3()?;
    if new.dims() != [heads, 1, d]
        || new.dtype() != cache.dtype()
        || !matches!(cache.dtype(), DType::F32 | DType::BF16)
    {
        bail!(
            "kv_write: new {:?} {:?} must be {:?} [{heads}, 1, {d}] (f32 or bf16)",
            new.dtype(),
            new.dims(),
            cache.dtype()
        );
    }
    if pos.dims() != [1] || pos.dtype() != DType::I64 {
        bail!("kv_write: the position must be i64 [1], got {:?} {:?}", pos.dtype(), pos.dims());
    }
    if !cache.is_contiguous() {
        bail!("kv_write: the cache must be contiguous");
    }
    for t in [new, pos] {
        if !t.device().same_device(cache.device()) {
            bail!("kv_write: inputs on {:?}, the cache on {:?}", t.device(), cache.device());
        }
    }
    cache.inplace_op3(
        &new.contiguous()?,
        &pos.contiguous()?,
        &KvWrite { ring: layout == KvLayout::Ring },
    )
}

struct KvWrite {
    ring: bool,
}

impl KvWrite {
    /// The slot position `pos` goes to, or why it has none.
    fn slot(&self, pos: i64, capacity: usize) -> Result<usize> {
        let Ok(p) = usize::try_from(pos) else { bail!("kv_write: negative position {pos}") };
        match (self.ring, p < capacity) {
            (true, _) => Ok(p % capacity),
            (false, true) => Ok(p),
            (false, false) => bail!("kv_write: position {p} is past the cache's {capacity} slots"),
        }
    }
}

/// `cache[h, slot, :] = src[h, :]` for every head, in plain loops.
fn copy_rows<T: Copy>(
    cache: &mut [T],
    src: &[T],
    (heads, capacity, d): (usize, usize, usize),
    slot: usize,
) {
    for h in 0..heads {
        cache[(h * capacity + slot) * d..][..d].copy_from_slice(&src[h * d..][..d]);
    }
}

impl InplaceOp3 for KvWrite {
    fn name(&self) -> &'static str {
        "kv_write"
    }

    fn cpu_fwd(
        &self,
        c: &mut CpuStorage,
        cl: &Layout,
        s: &CpuStorage,
        sl: &Layout,
        p: &CpuStorage,
        pl: &Layout,
    ) -> Result<()> {
        let dims = cl.shape().dims3()?;
        let pos = match (p, pl.contiguous_offsets()) {
            (CpuStorage::I64(v), Some((a, _))) => v[a],
            _ => bail!("kv_write: the position must be a contiguous i64 tensor"),
        };
        let slot = self.slot(pos, dims.1)?;
        let (c0, s0) = (cl.start_offset(), sl.start_offset());
        match (c, s) {
            (CpuStorage::F32(c), CpuStorage::F32(s)) => {
                copy_rows(&mut c[c0..], &s[s0..], dims, slot)
            }
            (CpuStorage::BF16(c), CpuStorage::BF16(s)) => {
                copy_rows(&mut c[c0..], &s[s0..], dims, slot)
            }
            _ => bail!("kv_write: cache and new values must be both f32 or both bf16"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, IndexOp, Tensor};

    use super::*;
    use crate::kernels::testing::{rng, tensor, uniform, values};

    fn check(dev: &Device, layout: KvLayout, pos: i64, dtype: DType) {
        let (heads, capacity, d) = (3, 5, 64);
        let mut r = rng(&format!("kv_write {layout:?} {pos}"));
        let cache =
            tensor(uniform(&mut r, heads * capacity * d, -1.0, 1.0), &[heads, capacity, d], dtype)
                .to_device(dev)
                .unwrap();
        let before = values(&cache);
        let new = tensor(uniform(&mut r, heads * d, -1.0, 1.0), &[heads, 1, d], dtype)
            .to_device(dev)
            .unwrap();
        kv_write_at(&cache, &new, &Tensor::new(&[pos], dev).unwrap(), layout).unwrap();
        let slot = pos as usize % capacity;
        for h in 0..heads {
            for s in 0..capacity {
                let got = values(&cache.i((h, s)).unwrap());
                let want = if s == slot {
                    values(&new.i((h, 0)).unwrap())
                } else {
                    before[(h * capacity + s) * d..][..d].to_vec()
                };
                assert_eq!(got, want, "{layout:?} pos {pos}: head {h} slot {s}");
            }
        }
    }

    #[test]
    fn writes_one_slot_linear_and_ring() {
        check(&Device::Cpu, KvLayout::Linear, 3, DType::F32);
        check(&Device::Cpu, KvLayout::Ring, 13, DType::BF16);
        let cache = Tensor::zeros((1, 4, 8), DType::F32, &Device::Cpu).unwrap();
        let new = Tensor::zeros((1, 1, 8), DType::F32, &Device::Cpu).unwrap();
        let err = kv_write_at(
            &cache,
            &new,
            &Tensor::new(&[4i64], &Device::Cpu).unwrap(),
            KvLayout::Linear,
        )
        .unwrap_err();
        assert!(err.to_string().contains("past the cache"), "{err}");
    }
}
