//! A varlen batch's attention inputs ([`qkv_rope_paged`]): bias, head split, RoPE on q and k at
//! each token's own position, k and v into the paged pools (see [`super::paged_attention`]) at
//! each token's slot. On CUDA one kernel (`qkv_rope_paged.cu`) for the whole batch, whatever mix
//! of prefill chunks and decode steps it packs; on the CPU plain loops, which are the reference.
//! Everything is computed in f32 and rounded once into the pools' dtype: candle's RoPE in bf16
//! rounds each product and the difference (three roundings, and the difference of two near-equal
//! products loses most of its bits): with it, the tiny gpt-oss test model's bf16 logits were
//! 0.134 off its f32 ones at worst; with one rounding, 0.019.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Result, Tensor, bail};

/// The shapes of one call.
#[derive(Debug, Clone, Copy)]
pub struct QkvHeads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Which elements of a head RoPE rotates together (by angle `i` of the tables' row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotaryPairs {
    /// `(i, i + d/2)`: Hugging Face checkpoints (candle's `rope`).
    HalfSplit,
    /// `(2i, 2i + 1)`: GGUF checkpoints (candle's `rope_i`).
    Interleaved,
}

impl RotaryPairs {
    /// The two elements of pair `i` in a head of `d`.
    fn pair(self, i: usize, d: usize) -> (usize, usize) {
        match self {
            RotaryPairs::HalfSplit => (i, i + d / 2),
            RotaryPairs::Interleaved => (2 * i, 2 * i + 1),
        }
    }
}

/// q's and k's RMSNorm over each head before RoPE (transformers' `q_norm`/`k_norm` of Qwen3 and
/// Gemma 3): `x / sqrt(mean(x²) + eps) · w`, in f32, with one `[d]` weight each (any float
/// dtype; upcast).
#[derive(Clone, Copy)]
pub struct QkNorm<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f64,
}

/// The slot value of a token whose k and v are not stored (padding).
pub const NO_SLOT: u32 = u32::MAX;

/// One call's inputs, checked by [`qkv_rope_paged`].
#[derive(Clone)]
struct Args<'a> {
    qkv: &'a Tensor,
    bias: Option<&'a Tensor>,
    /// The norm's weights in f32, and eps.
    norm: Option<(Tensor, Tensor, f32)>,
    cos: &'a Tensor,
    sin: &'a Tensor,
    positions: &'a Tensor,
    slots: &'a Tensor,
    h: QkvHeads,
    pairs: RotaryPairs,
    k_pool: &'a Tensor,
    v_pool: &'a Tensor,
    scales: Option<(&'a Tensor, &'a Tensor)>,
    /// Only the CUDA kernel has a release to order.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    release_first: bool,
}

/// For `T` tokens: `qkv` f32 `[T, (heads + 2·kv_heads)·d]` (the fused projection without its
/// bias), `bias` f32 `[(heads + 2·kv_heads)·d]` or `None`, `cos`/`sin` the model's f32 RoPE
/// tables `[positions, d/2]`, `positions` u32 `[T]` (each token's row of the tables) and `slots`
/// u32 `[T]` (the pool slot each token's k and v go to; [`NO_SLOT`] stores nothing). Adds the
/// bias, RMSNorms q's and k's heads when `norm` is given, splits q, k, v, rotates q and k by `pairs`, writes k and v in place into `k_pool` /
/// `v_pool` (`[num_slots, kv_heads, d]`, contiguous, f32 or bf16) and returns q `[T, heads, d]`
/// in the pools' dtype. Pools of codes (`F8E4M3`, or INT8 in `U8`, with `scales`
/// `[num_slots, kv_heads]` u8 for keys and values, [`super::kv_fp8`]) take each stored row
/// quantized under its own scale, keys and q rotated first where the head width allows it
/// ([`super::kv_fp8::rotate`]: every score is unchanged), and q comes back in the dtype the
/// attention takes with them: bf16 on CUDA, f32 on the CPU. The CPU
/// refuses positions past the tables and slots past the pool; the CUDA kernel rotates the former
/// by NaN and stores nothing for the latter. `release_first`: the kernel releases its PDL
/// dependents before it waits (as [`crate::kernels::PagedAttnConfig::release_first`]).
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_paged(
    qkv: &Tensor,
    bias: Option<&Tensor>,
    norm: Option<QkNorm>,
    cos: &Tensor,
    sin: &Tensor,
    positions: &Tensor,
    slots: &Tensor,
    h: QkvHeads,
    pairs: RotaryPairs,
    k_pool: &Tensor,
    v_pool: &Tensor,
    scales: Option<(&Tensor, &Tensor)>,
    release_first: bool,
) -> Result<Tensor> {
    let d = h.head_dim;
    let width = (h.heads + 2 * h.kv_heads) * d;
    let tokens = match qkv.dims() {
        [t, w] if *w == width => *t,
        dims => bail!("qkv_rope_paged: qkv {dims:?} must be [T, {width}]"),
    };
    if h.heads == 0 || h.kv_heads == 0 || d == 0 || !d.is_multiple_of(2) || d > 2048 {
        bail!("qkv_rope_paged: unusable heads {h:?} (even head_dim up to 2048)");
    }
    if bias.is_some_and(|b| b.dims() != [width]) {
        bail!("qkv_rope_paged: bias {:?} must be [{width}]", bias.map(|b| b.dims()));
    }
    let norm = match norm {
        Some(n) if n.q.dims() != [d] || n.k.dims() != [d] || !d.is_power_of_two() => bail!(
            "qkv_rope_paged: q/k norm weights {:?} / {:?} must be [{d}], d a power of two",
            n.q.dims(),
            n.k.dims()
        ),
        Some(n) => {
            let f32 = |w: &Tensor| w.to_dtype(DType::F32)?.contiguous();
            Some((f32(n.q)?, f32(n.k)?, n.eps as f32))
        }
        None => None,
    };
    if cos.rank() != 2 || cos.dim(1)? != d / 2 || sin.dims() != cos.dims() {
        bail!(
            "qkv_rope_paged: cos {:?} / sin {:?} must be [positions, {}]",
            cos.dims(),
            sin.dims(),
            d / 2
        );
    }
    if positions.dims() != [tokens] || slots.dims() != [tokens] {
        bail!(
            "qkv_rope_paged: positions {:?} and slots {:?} must be [{tokens}]",
            positions.dims(),
            slots.dims()
        );
    }
    let codes = super::kv_fp8::Codes::of(k_pool.dtype());
    if [qkv, cos, sin].into_iter().chain(bias).any(|t| t.dtype() != DType::F32)
        || positions.dtype() != DType::U32
        || slots.dtype() != DType::U32
        || v_pool.dtype() != k_pool.dtype()
        || !matches!(k_pool.dtype(), DType::F32 | DType::BF16 | DType::F8E4M3 | DType::U8)
        || codes.is_some() != scales.is_some()
    {
        bail!(
            "qkv_rope_paged: qkv, bias, cos and sin must be f32, positions and slots u32, the \
             pools both f32, both bf16, or both fp8 or int8 codes with their scales"
        );
    }
    let dtype = q_dtype(k_pool.dtype(), qkv.device());
    if let Some((ks, vs)) = scales {
        let want = [k_pool.dim(0)?, h.kv_heads];
        if ks.dims() != want
            || vs.dims() != want
            || ks.dtype() != DType::U8
            || !ks.is_contiguous()
            || vs.dtype() != DType::U8
            || !vs.is_contiguous()
        {
            bail!("qkv_rope_paged: the pools' scales must be contiguous u8 {want:?}");
        }
    }
    match k_pool.dims() {
        [_, g, hd] if *g == h.kv_heads && *hd == d && v_pool.dims() == k_pool.dims() => {}
        _ => bail!(
            "qkv_rope_paged: pools {:?} / {:?} must be [num_slots, {}, {d}]",
            k_pool.dims(),
            v_pool.dims(),
            h.kv_heads
        ),
    }
    if !k_pool.is_contiguous() || !v_pool.is_contiguous() {
        bail!("qkv_rope_paged: the pools must be contiguous (they are written in place)");
    }
    let scale_list = scales.into_iter().flat_map(|(k, v)| [k, v]);
    let norm_list = norm.iter().flat_map(|(q, k, _)| [q, k]);
    let others = [cos, sin, positions, slots, k_pool, v_pool]
        .into_iter()
        .chain(bias)
        .chain(scale_list)
        .chain(norm_list);
    for t in others {
        if !t.device().same_device(qkv.device()) {
            bail!("qkv_rope_paged: inputs on {:?} and {:?}", t.device(), qkv.device());
        }
    }
    if tokens == 0 {
        return Tensor::zeros((0, h.heads, d), dtype, qkv.device());
    }
    let args = Args {
        qkv,
        bias,
        norm,
        cos,
        sin,
        positions,
        slots,
        h,
        pairs,
        k_pool,
        v_pool,
        scales,
        release_first,
    };
    match qkv.device() {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => gpu::launch(args),
        _ => reference(args),
    }
}

/// The sum of a head's squares as the kernel's `head_rms` adds them, so that a normed head has
/// the same bits on both: thread `i`'s pair `x[i1]² + x[i2]²`, a pairwise tree over groups of up
/// to 32 threads (the xor shuffles: `s[i] + s[i ^ m]`, the same sum on both lanes), then the
/// groups' sums left to right (the head's warps through shared memory).
fn head_sum_sq(head: &[f32], pairs: RotaryPairs) -> f32 {
    let (d, half) = (head.len(), head.len() / 2);
    let mut s: Vec<f32> = (0..half)
        .map(|i| {
            let (i1, i2) = pairs.pair(i, d);
            head[i1] * head[i1] + head[i2] * head[i2]
        })
        .collect();
    let mut m = 1;
    while m < half.min(32) {
        s = (0..half).map(|i| s[i] + s[i ^ m]).collect();
        m *= 2;
    }
    s.iter().step_by(32).copied().reduce(|a, b| a + b).unwrap_or(0.0)
}

/// q's dtype for pools of `pool`: theirs, or with pools of codes what the attention takes
/// (bf16 on CUDA, where the tensor-core kernel reads them; f32 on the CPU).
pub fn q_dtype(pool: DType, device: &Device) -> DType {
    match (super::kv_fp8::Codes::of(pool), device) {
        (Some(_), Device::Cpu) => DType::F32,
        (Some(_), _) => DType::BF16,
        (None, _) => pool,
    }
}

/// The reference in loops: per token and head, the bias added, q's and k's heads normed
/// (`x / sqrt(ss / d + eps) · w`, the sum of squares `ss` in the kernel's order:
/// [`head_sum_sq`]), the pairs rotated by the token's row of the tables (f32, no fused multiply-add), q gathered and
/// k, v written slot by slot.
fn reference(a: Args) -> Result<Tensor> {
    let Args {
        qkv, bias, norm, cos, sin, positions, slots, h, pairs, k_pool, v_pool, scales, ..
    } = a;
    let norm = match norm {
        Some((q, k, eps)) => Some((q.to_vec1::<f32>()?, k.to_vec1::<f32>()?, eps)),
        None => None,
    };
    let (d, half, dtype) = (h.head_dim, h.head_dim / 2, q_dtype(k_pool.dtype(), qkv.device()));
    let (x, cos, sin) = (qkv.to_vec2::<f32>()?, cos.to_vec2::<f32>()?, sin.to_vec2::<f32>()?);
    let bias = bias.map(|b| b.to_vec1::<f32>()).transpose()?;
    let (positions, slots) = (positions.to_vec1::<u32>()?, slots.to_vec1::<u32>()?);
    let num_slots = k_pool.dim(0)?;

    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    let mut stored = Vec::new();
    for (t, row) in x.iter().enumerate() {
        let p = positions[t] as usize;
        let (Some(c), Some(s)) = (cos.get(p), sin.get(p)) else {
            bail!("qkv_rope_paged: token {t}'s position {p} is past the {}-row tables", cos.len())
        };
        let slot = slots[t];
        if slot != NO_SLOT && slot as usize >= num_slots {
            bail!("qkv_rope_paged: token {t}'s slot {slot} is past the {num_slots}-slot pool");
        }
        for b in 0..h.heads + 2 * h.kv_heads {
            let mut head: Vec<f32> = row[b * d..][..d].to_vec();
            if let Some(bias) = &bias {
                head.iter_mut().zip(&bias[b * d..]).for_each(|(x, b)| *x += b);
            }
            if let Some((qw, kw, eps)) = &norm
                && b < h.heads + h.kv_heads
            {
                let w = if b < h.heads { qw } else { kw };
                let rms = (head_sum_sq(&head, pairs) / d as f32 + eps).sqrt();
                head.iter_mut().zip(w).for_each(|(x, w)| *x = *x / rms * w);
            }
            if b < h.heads + h.kv_heads {
                let mut rotated = head.clone();
                for i in 0..half {
                    let (i1, i2) = pairs.pair(i, d);
                    rotated[i1] = head[i1] * c[i] - head[i2] * s[i];
                    rotated[i2] = head[i1] * s[i] + head[i2] * c[i];
                }
                head = rotated;
                // Pools of codes hold keys rotated, and the queries turn alike (kv_fp8.rs).
                if scales.is_some() && super::kv_fp8::rotates(d) {
                    super::kv_fp8::rotate(&mut head, b >= h.heads);
                }
            }
            match b {
                b if b < h.heads => q.extend(head),
                _ if slot == NO_SLOT => {}
                b if b < h.heads + h.kv_heads => k.extend(head),
                _ => v.extend(head),
            }
        }
        if slot != NO_SLOT {
            stored.push(slot as usize);
        }
    }
    let rows = |x: Vec<f32>| Tensor::from_vec(x, (stored.len(), h.kv_heads, d), &Device::Cpu);
    let op = PoolWrite { slots: stored.clone() };
    for (pool, x, scale) in [(k_pool, k, scales.map(|s| s.0)), (v_pool, v, scales.map(|s| s.1))] {
        match scale {
            Some(scale) => {
                let Some(kind) = super::kv_fp8::Codes::of(pool.dtype()) else {
                    bail!("qkv_rope_paged: scales given for {:?} pools", pool.dtype())
                };
                let (codes, scales) = super::kv_fp8::quantize_pool(&rows(x)?, kind, &Device::Cpu)?;
                pool.inplace_op2(&codes, &op)?;
                scale.inplace_op2(&scales, &op)?;
            }
            None => pool.inplace_op2(&rows(x)?.to_dtype(pool.dtype())?, &op)?,
        }
    }
    Tensor::from_vec(q, (x.len(), h.heads, d), &Device::Cpu)?.to_dtype(dtype)
}

/// `pool[slots[n]] = rows[n]` for every stored token: the CPU reference's in-place pool writes.
struct PoolWrite {
    slots: Vec<usize>,
}

/// Copies row `n` of `rows` (`kv_heads · d` elements each) into row `slots[n]` of `pool`.
fn copy_slots<T: Copy>(pool: &mut [T], rows: &[T], slots: &[usize], row: usize) {
    for (n, &slot) in slots.iter().enumerate() {
        pool[slot * row..][..row].copy_from_slice(&rows[n * row..][..row]);
    }
}

impl InplaceOp2 for PoolWrite {
    fn name(&self) -> &'static str {
        "pool_write"
    }

    fn cpu_fwd(&self, p: &mut CpuStorage, pl: &Layout, r: &CpuStorage, rl: &Layout) -> Result<()> {
        let (Some((p0, p1)), Some((r0, _))) = (pl.contiguous_offsets(), rl.contiguous_offsets())
        else {
            bail!("pool_write: the pool and the rows must be contiguous");
        };
        let slots = pl.shape().dims().first().copied().unwrap_or(0);
        let row = pl.shape().elem_count() / slots.max(1);
        if self.slots.iter().any(|&s| s >= slots) || p1 - p0 != slots * row {
            bail!("pool_write: a slot past the {slots}-slot pool");
        }
        match p.dtype() {
            DType::F8E4M3 | DType::U8 => match (p, r) {
                (CpuStorage::F8E4M3(p), CpuStorage::F8E4M3(r)) => {
                    copy_slots(&mut p[p0..], &r[r0..], &self.slots, row)
                }
                (CpuStorage::U8(p), CpuStorage::U8(r)) => {
                    copy_slots(&mut p[p0..], &r[r0..], &self.slots, row)
                }
                _ => bail!("pool_write: the pool and the rows must be both fp8 or both u8"),
            },
            _ => super::float_dispatch!(
                CpuStorage,
                "pool_write: the pool and the rows must be both f32 or both bf16",
                (p => p, r => r),
                copy_slots(&mut p[p0..], &r[r0..], &self.slots, row)
            ),
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
