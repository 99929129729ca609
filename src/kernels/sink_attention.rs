//! Attention with sinks, a sliding window and grouped-query heads: the gpt-oss attention core
//! (docs/gpt-oss.md §4.4), after RoPE and before the output projection.
//!
//! For query head `h` at position `P` and the keys it may see:
//!
//! ```text
//! s_j = scale · q·k_j,   M = max(S_h, max_j s_j),
//! o   = Σ_j e^{s_j − M} v_j / (e^{S_h − M} + Σ_j e^{s_j − M})
//! ```
//!
//! The sink `S_h` is not scaled, never masked and has no value vector, so the weights sum to < 1:
//! this is `softmax([s, S_h])` with the last column dropped. A key at position `t` is visible iff
//! `t ≤ P` and, with a window `W`, `t > P − W` (the window counts the current token: gpt-oss's
//! sliding layers see 128 keys including their own).
//!
//! Shapes: `q` is `[heads, q_len, d]`, query `i` at position `start + i`; `k` and `v` are
//! `[kv_heads, kv_len, d]`; query head `h` reads kv head `h / (heads / kv_heads)`. The first two
//! dimensions may have any strides (a `narrow` of a preallocated cache, or a `[len, heads, d]`
//! tensor transposed); the last must be contiguous. `sinks` is `[heads]`, f32 or bf16. The
//! output is `[heads, q_len, d]`, contiguous, in q's dtype (f32 or bf16, f32 math inside).
//!
//! Cache layouts ([`KvLayout`]): full-attention layers keep slot `j` = position `j`; sliding
//! layers may keep a ring buffer of the last positions instead.
//!
//! CUDA (`sink_attention.cu`): head_dim 64 or 128. One block per (32 or 16 query rows of one kv
//! group, kv head, split of the cache); when few blocks would cover the GPU (decode), the cache is
//! split and the partial softmax states merged by a second kernel.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};

use super::{F32Reader, cpu_f32, cpu_output, with_cpu};

/// How the cache's slots map to absolute positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// Slot `j` holds position `j` (full-attention layers). Slots past the last query's position
    /// are never read, so `k`/`v` may be a whole preallocated cache.
    Linear,
    /// A ring buffer of `kv_len` slots (sliding layers): position `p` is written to slot
    /// `p mod kv_len`, and the current `q_len` tokens are already written. With
    /// `last = start + q_len − 1`, slot `j` holds the latest position `p ≤ last` with
    /// `p ≡ j (mod kv_len)`, that is `p = last − ((last − j) mod kv_len)`; when that is negative
    /// the slot was never written and is skipped (its contents may be garbage, even NaN).
    /// Every key a query may see must still be in the buffer, which [`sink_attention`] checks:
    /// once the ring has wrapped that needs `kv_len ≥ window + q_len − 1` (decode: `≥ window`).
    Ring,
}

impl KvLayout {
    /// The absolute position that `slot` of a `kv_len`-slot cache holds when the newest position
    /// written is `last`; `None` for a ring slot never written.
    pub fn position(self, slot: usize, kv_len: usize, last: usize) -> Option<usize> {
        match self {
            KvLayout::Linear => Some(slot),
            KvLayout::Ring => {
                let back = (last % kv_len + kv_len - slot % kv_len) % kv_len; // (last − slot) mod kv_len
                last.checked_sub(back)
            }
        }
    }
}

/// What [`sink_attention`] needs beyond the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkAttnConfig {
    /// Absolute position of the first query.
    pub start: usize,
    /// Sliding window `W`: keys `t` with `P − W < t ≤ P`. `None`: every `t ≤ P` (full causal).
    pub window: Option<usize>,
    /// How cache slots map to positions.
    pub layout: KvLayout,
    /// Score scale, normally `1/√d`.
    pub scale: f32,
}

impl SinkAttnConfig {
    /// Whether a key at position `t` is visible from a query at position `p`.
    pub fn allows(&self, t: usize, p: usize) -> bool {
        t <= p && self.window.is_none_or(|w| t + w > p)
    }
}

/// Attention with per-head sinks over a cache; see the module documentation for the math and
/// layouts. Runs the CUDA kernel on a CUDA device and the reference loops on the CPU.
///
/// Per call costs to avoid in a decode loop: bf16 sinks are cast to f32 (convert them once at
/// load), and a cache whose rows are not 16-byte aligned is copied (candle's own allocations and
/// their `narrow`s always are).
pub fn sink_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: &Tensor,
    cfg: &SinkAttnConfig,
) -> Result<Tensor> {
    let op = SinkAttention::new(q, k, v, sinks, *cfg, false)?;
    q.apply_op3_no_bwd(&aligned(k)?, &aligned(v)?, &op)
}

/// [`sink_attention`] for one query whose position is read from the device: `pos` is an i64
/// `[1]` tensor (`cfg.start` is ignored) and `k`/`v` are whole caches. Nothing about the launch
/// depends on the position (the CUDA grid is the one for the last slot), so a CUDA graph that
/// captured this call replays correctly at any position. The position must be below a linear
/// cache's length (the caller checks it on the host; the CPU reference checks it too).
pub fn sink_attention_at(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: &Tensor,
    cfg: &SinkAttnConfig,
    pos: &Tensor,
) -> Result<Tensor> {
    let kv_len = k.dim(1)?;
    if q.dim(1)? != 1
        || pos.dims() != [1]
        || pos.dtype() != DType::I64
        || !pos.device().same_device(q.device())
    {
        bail!(
            "sink_attention_at: one query ({:?}) and an i64 [1] position on its device ({:?} {:?})",
            q.dims(),
            pos.dtype(),
            pos.dims()
        );
    }
    // The host-side checks and the launch grid for the worst case: the last slot.
    let cfg = SinkAttnConfig { start: kv_len - 1, ..*cfg };
    let mut op = SinkAttention::new(q, k, v, sinks, cfg, false)?;
    op.pos = Some(pos.contiguous()?);
    q.apply_op3_no_bwd(&aligned(k)?, &aligned(v)?, &op)
}

/// `t` itself when its rows start on 16-byte boundaries (the CUDA kernel reads them 16 bytes at
/// a time), else a contiguous copy. Views of a cache allocated by candle are always aligned.
fn aligned(t: &Tensor) -> Result<Tensor> {
    let (l, size) = (t.layout(), t.dtype().size_in_bytes());
    let ok = [l.start_offset(), l.stride()[0], l.stride()[1]]
        .iter()
        .all(|&n| (n * size).is_multiple_of(16));
    if ok || !t.device().is_cuda() { Ok(t.clone()) } else { t.force_contiguous() }
}

/// The CustomOp: `q`, `k`, `v` are its arguments, the sinks (as f32) travel inside.
struct SinkAttention {
    sinks: Tensor,
    cfg: SinkAttnConfig,
    /// Tests: fill the CUDA output with NaN before the kernel runs.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    poison: bool,
    /// [`sink_attention_at`]: the query's position, on the device.
    pos: Option<Tensor>,
}

impl SinkAttention {
    fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        sinks: &Tensor,
        cfg: SinkAttnConfig,
        poison: bool,
    ) -> Result<Self> {
        let (heads, q_len, d) = q.dims3()?;
        let (kv_heads, kv_len, kd) = k.dims3()?;
        if v.dims() != k.dims() || kd != d {
            bail!(
                "sink_attention: k {:?} and v {:?} must be [kv_heads, kv_len, {d}]",
                k.dims(),
                v.dims()
            );
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            bail!("sink_attention: {heads} query heads are not a multiple of {kv_heads} kv heads");
        }
        if q_len == 0 || kv_len == 0 || d == 0 {
            bail!("sink_attention: empty input (q_len {q_len}, kv_len {kv_len}, d {d})");
        }
        if q.dtype() != k.dtype()
            || q.dtype() != v.dtype()
            || !matches!(q.dtype(), DType::F32 | DType::BF16)
        {
            bail!(
                "sink_attention: q, k, v must all be f32 or all bf16, got {:?} {:?} {:?}",
                q.dtype(),
                k.dtype(),
                v.dtype()
            );
        }
        for (name, t) in [("q", q), ("k", k), ("v", v)] {
            if d > 1 && t.stride()[2] != 1 {
                bail!(
                    "sink_attention: the last dimension of {name} must be contiguous (strides {:?})",
                    t.stride()
                );
            }
        }
        if sinks.dims() != [heads] {
            bail!("sink_attention: sinks {:?} must be [{heads}]", sinks.dims());
        }
        if !sinks.device().same_device(q.device()) {
            bail!("sink_attention: sinks are on {:?}, q on {:?}", sinks.device(), q.device());
        }
        if cfg.window == Some(0) {
            bail!("sink_attention: a window of 0 keys sees nothing; use None for full attention");
        }
        if cfg.layout == KvLayout::Ring {
            // The oldest key the first query may see, against the oldest position still stored.
            let last = cfg.start + q_len - 1;
            let needed = cfg.window.map_or(0, |w| (cfg.start + 1).saturating_sub(w));
            let kept = (last + 1).saturating_sub(kv_len);
            if kept > needed {
                bail!(
                    "sink_attention: a ring of {kv_len} slots ending at position {last} has lost position {needed}, \
                     which query {} still sees (window {:?}); the ring needs at least window + q_len − 1 slots",
                    cfg.start,
                    cfg.window
                );
            }
        }
        let sinks = sinks.to_dtype(DType::F32)?.contiguous()?;
        Ok(Self { sinks, cfg, poison, pos: None })
    }

    /// The reference: for each head and query, the visible keys' scores, their max with the sink,
    /// and the weighted sum of values over the sink-extended denominator. f32 throughout.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        &self,
        q: F32Reader,
        ql: &Layout,
        k: F32Reader,
        kl: &Layout,
        v: F32Reader,
        vl: &Layout,
        sinks: &[f32],
    ) -> Result<Vec<f32>> {
        let (heads, q_len, d) = ql.shape().dims3()?;
        let (kv_heads, kv_len, _) = kl.shape().dims3()?;
        let group = heads / kv_heads;
        let last = self.cfg.start + q_len - 1;
        let at = |l: &Layout, a: usize, b: usize| {
            l.start_offset() + a * l.stride()[0] + b * l.stride()[1]
        };
        let positions: Vec<Option<usize>> =
            (0..kv_len).map(|j| self.cfg.layout.position(j, kv_len, last)).collect();

        let mut out = vec![0f32; heads * q_len * d];
        let mut scores: Vec<(usize, f32)> = Vec::with_capacity(kv_len);
        for (row, o) in out.chunks_exact_mut(d).enumerate() {
            let (h, i) = (row / q_len, row % q_len);
            let (g, p) = (h / group, self.cfg.start + i);
            let (q0, sink) = (at(ql, h, i), sinks[h]);
            scores.clear();
            for (j, pos) in positions.iter().enumerate() {
                if let Some(t) = *pos
                    && self.cfg.allows(t, p)
                {
                    let k0 = at(kl, g, j);
                    let dot: f32 = (0..d).map(|c| q.get(q0 + c) * k.get(k0 + c)).sum();
                    scores.push((j, self.cfg.scale * dot));
                }
            }
            let m = scores.iter().fold(sink, |m, &(_, s)| m.max(s));
            let mut denom = (sink - m).exp();
            for &(j, s) in &scores {
                let w = (s - m).exp();
                denom += w;
                let v0 = at(vl, g, j);
                for (c, x) in o.iter_mut().enumerate() {
                    *x += w * v.get(v0 + c);
                }
            }
            o.iter_mut().for_each(|x| *x /= denom);
        }
        Ok(out)
    }
}

impl CustomOp3 for SinkAttention {
    fn name(&self) -> &'static str {
        "sink_attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) =
            (F32Reader::new(qs, "q")?, F32Reader::new(ks, "k")?, F32Reader::new(vs, "v")?);
        let sinks = with_cpu(&self.sinks, "sinks", |s, l| Ok(cpu_f32(s, l, "sinks")?.to_vec()))?;
        let out = match &self.pos {
            None => self.reference(q, ql, k, kl, v, vl, &sinks)?,
            Some(pos) => {
                let start = pos.to_vec1::<i64>()?[0];
                let kv_len = kl.shape().dims3()?.1;
                let start = match usize::try_from(start) {
                    Ok(s) if s < kv_len || self.cfg.layout == KvLayout::Ring => s,
                    _ => {
                        bail!("sink_attention_at: position {start} outside the {kv_len}-slot cache")
                    }
                };
                let at = SinkAttention {
                    cfg: SinkAttnConfig { start, ..self.cfg },
                    sinks: self.sinks.clone(),
                    poison: false,
                    pos: None,
                };
                at.reference(q, ql, k, kl, v, vl, &sinks)?
            }
        };
        Ok((cpu_output(out, qs.dtype())?, ql.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        qs: &candle_core::CudaStorage,
        ql: &Layout,
        ks: &candle_core::CudaStorage,
        kl: &Layout,
        vs: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::KernelFloat;
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let dev = qs.device.clone();
        let slice = match (&qs.slice, &ks.slice, &vs.slice) {
            (S::F32(q), S::F32(k), S::F32(v)) => {
                f32::wrap(gpu::launch(self, &dev, (q, ql), (k, kl), (v, vl))?)
            }
            (S::BF16(q), S::BF16(k), S::BF16(v)) => {
                half::bf16::wrap(gpu::launch(self, &dev, (q, ql), (k, kl), (v, vl))?)
            }
            _ => bail!("sink_attention: q, k, v must all be f32 or all bf16"),
        };
        Ok((candle_core::CudaStorage { slice, device: dev }, ql.shape().clone()))
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
    };
    use candle_core::{CudaDevice, Layout, Result, bail};

    use super::{KvLayout, SinkAttention};
    use crate::kernels::cuda::{
        KernelFloat, SINK_ATTENTION_PTX, cuda_view, int, multiprocessors, output,
    };

    const MODULE: &str = "inferno_sink_attention";
    /// Keys per tile (`BK` in the kernel) and warps per block (`NW`).
    const TILE: usize = 32;
    const WARPS: usize = 4;
    /// Fewest cache slots in a split (4 tiles): below that the merge costs more than it saves.
    const MIN_SPLIT: usize = 4 * TILE;
    /// Most splits sink_combine merges (`MAX_SPLITS` in the kernel).
    const MAX_SPLITS: usize = 256;

    /// Mirrors `SinkAttnParams` in sink_attention.cu, field for field.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    struct Params {
        q_s0: i64,
        q_s1: i64,
        k_s0: i64,
        k_s1: i64,
        v_s0: i64,
        v_s1: i64,
        start: i64,
        key_lo: i64,
        heads: i32,
        kv_heads: i32,
        q_len: i32,
        kv_len: i32,
        window: i32,
        ring: i32,
        splits: i32,
        keys_per_split: i32,
        scale_log2: f32,
        pad: i32,
    }

    // SAFETY: plain old data with the C layout the kernel expects.
    unsafe impl DeviceRepr for Params {}

    pub(super) fn launch<T: KernelFloat>(
        op: &SinkAttention,
        dev: &CudaDevice,
        (q, ql): (&CudaSlice<T>, &Layout),
        (k, kl): (&CudaSlice<T>, &Layout),
        (v, vl): (&CudaSlice<T>, &Layout),
    ) -> Result<CudaSlice<T>> {
        let (heads, q_len, d) = ql.shape().dims3()?;
        let (kv_heads, kv_len, _) = kl.shape().dims3()?;
        if d != 64 && d != 128 {
            bail!("sink_attention: the CUDA kernel supports head_dim 64 and 128, not {d}");
        }
        let cfg = op.cfg;
        let rows = heads / kv_heads * q_len; // query rows per kv head
        let rpw = if rows <= 8 { 2 } else { 4 }; // rows per warp
        let row_blocks = rows.div_ceil(WARPS * rpw);

        // The slots any query may read, then how many splits of them keep the GPU busy.
        let last = cfg.start + q_len - 1;
        let (lo, hi) = match cfg.layout {
            KvLayout::Linear => {
                (cfg.window.map_or(0, |w| (cfg.start + 1).saturating_sub(w)), kv_len.min(last + 1))
            }
            KvLayout::Ring => (0, kv_len),
        };
        let span = hi.saturating_sub(lo).max(1);
        let blocks = row_blocks * kv_heads;
        let sms = multiprocessors(dev);
        let want = if blocks >= sms {
            1
        } else {
            (4 * sms).div_ceil(blocks).min(span.div_ceil(MIN_SPLIT)).min(MAX_SPLITS)
        };
        let keys_per_split = span.div_ceil(want.max(1)).div_ceil(TILE) * TILE;
        let splits = span.div_ceil(keys_per_split);

        let stride = |l: &Layout, i: usize| l.stride()[i] as i64;
        let params = Params {
            q_s0: stride(ql, 0),
            q_s1: stride(ql, 1),
            k_s0: stride(kl, 0),
            k_s1: stride(kl, 1),
            v_s0: stride(vl, 0),
            v_s1: stride(vl, 1),
            start: cfg.start as i64,
            key_lo: lo as i64,
            heads: int(heads, "heads")?,
            kv_heads: int(kv_heads, "kv_heads")?,
            q_len: int(q_len, "q_len")?,
            kv_len: int(kv_len, "kv_len")?,
            window: cfg.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
            ring: i32::from(cfg.layout == KvLayout::Ring),
            splits: int(splits, "splits")?,
            keys_per_split: int(keys_per_split, "keys per split")?,
            scale_log2: cfg.scale * std::f32::consts::LOG2_E,
            pad: 0,
        };

        let mut out = output::<T>(dev, heads * q_len * d, op.poison)?;
        let (q, k, v) = (
            q.slice(ql.start_offset()..),
            k.slice(kl.start_offset()..),
            v.slice(vl.start_offset()..),
        );
        let name = format!("sink_attention_{}_d{d}_r{rpw}", T::NAME);
        let func = dev.get_or_load_custom_func(&name, MODULE, SINK_ATTENTION_PTX)?;
        let grid = LaunchConfig {
            grid_dim: (int(row_blocks, "row blocks")? as u32, kv_heads as u32, splits as u32),
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (sinks_storage, sinks_layout) = op.sinks.storage_and_layout();
        let sinks = cuda_view::<f32>(&sinks_storage, sinks_layout, "sinks")?;
        // The kernel's dyn_start: the device position, or a null pointer.
        let pos_guard = op.pos.as_ref().map(|t| t.storage_and_layout());
        let pos_view = match &pos_guard {
            Some((s, l)) => Some(cuda_view::<i64>(s, l, "position")?),
            None => None,
        };
        let stream = dev.cuda_stream();
        let pos_ptr: u64 = pos_view.as_ref().map_or(0, |v| v.device_ptr(&stream).0);
        if splits == 1 {
            let mut b = func.builder();
            b.arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&sinks)
                .arg(&mut out)
                .arg(&0u64)
                .arg(&0u64)
                .arg(&pos_ptr)
                .arg(&params);
            // SAFETY: the arguments match the kernel's signature; shapes were checked above.
            unsafe { b.launch(grid) }.w()?;
        } else {
            // SAFETY: the attention kernel writes every partial that the combine kernel reads.
            let mut part_acc = unsafe { dev.alloc::<f32>(splits * heads * q_len * d)? };
            let mut part_ml = unsafe { dev.alloc::<f32>(splits * heads * q_len * 2)? };
            let mut b = func.builder();
            b.arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&sinks)
                .arg(&mut out)
                .arg(&mut part_acc)
                .arg(&mut part_ml)
                .arg(&pos_ptr);
            b.arg(&params);
            // SAFETY: as above.
            unsafe { b.launch(grid) }.w()?;

            let name = format!("sink_combine_{}_d{d}", T::NAME);
            let combine = dev.get_or_load_custom_func(&name, MODULE, SINK_ATTENTION_PTX)?;
            let (h, ql, sp) = (params.heads, params.q_len, params.splits);
            let mut b = combine.builder();
            b.arg(&part_acc).arg(&part_ml).arg(&sinks).arg(&mut out).arg(&h).arg(&ql).arg(&sp);
            let grid = LaunchConfig {
                grid_dim: (int((heads * q_len).div_ceil(WARPS), "rows")? as u32, 1, 1),
                block_dim: ((WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match sink_combine's signature.
            unsafe { b.launch(grid) }.w()?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
