//! Attention over a paged KV pool for a varlen batch: the continuous-batching engine's attention
//! core, after RoPE ([`super::qkv_rope_paged`]) and before the output projection.
//!
//! The pool: per layer, `k_pool` and `v_pool` are `[num_slots, kv_heads, d]` (contiguous, f32 or
//! bf16), slot = `block · block_size + offset`. Each sequence has a block table (a u32 row of
//! block ids): its position `t` lives in slot `table[t / block_size] · block_size +
//! t % block_size`. The batch packs the queries of several sequences in one `[T, heads, d]`
//! tensor: sequence `s` owns rows `cu_q[s]..cu_q[s+1]`, its first query at position `q_pos[s]`,
//! the others at consecutive positions (a prefill chunk has many, a decode step one, padding
//! none).
//!
//! The math per query row (the gpt-oss attention core, docs/gpt-oss.md §4.4): query head `h`
//! reads kv head `h / (heads / kv_heads)`; a query at position `P` sees the keys `t ≤ P` and,
//! with a window `W`, `t > P − W` (the window counts the current token: gpt-oss's sliding layers
//! see 128 keys including their own); with `s_j = scale · q·k_j` and `M = max(S_h, max_j s_j)`,
//!
//! ```text
//! o = Σ_j e^{s_j − M} v_j / (e^{S_h − M} + Σ_j e^{s_j − M})
//! ```
//!
//! in f32: the sink logit `S_h` is unscaled, never masked and has no value vector, so the weights
//! sum to < 1 (`softmax([s, S_h])` with the last column dropped) when sinks are given (gpt-oss),
//! and the plain softmax otherwise (Llama). Table entries of blocks a query cannot see are never
//! read (they may be garbage).
//!
//! CUDA: head_dim 64 or 128, and 256 in bf16 ([`cuda_head_dim`]); bf16 calls on tensor cores (`paged_attention_mma.cu`: mma.sync
//! q·Kᵀ and P·V, P as bf16 hi + lo; pools of 8-bit codes, [`super::kv_fp8`], turned into the
//! bf16 they stand for tile by tile), f32 calls one key per lane (`paged_attention.cu`), one kernel
//! per dtype for decode and prefill alike (a row's bits depend on the kernel; [`PagedKernel`]).
//! The launch depends only on the number of sequences, the shapes and the host-side
//! [`PagedBounds`], never on the metadata's contents, so a CUDA graph captured for one batch
//! shape replays with other positions, lengths and tables: one block per (sequence, tile of
//! query rows of one kv group, kv head, run of key splits); a block finds its sequence's length
//! and position on the device and exits when its tile is empty. When few blocks would cover the
//! GPU (decode), a tile's keys are shared among several blocks and their partial softmax states
//! merged by a second kernel.
//!
//! Batch invariance: a row's output is bit for bit the same in any launch (alone in a decode
//! step, inside a prefill chunk, split among blocks or not), so a prefix computed token by token
//! and reused from the cache equals a fresh prefill of it. Every query folds its keys' softmax in
//! fixed runs of [`SPLIT_KEYS`] absolute positions, in position order, with one formula in both
//! the one-block and the combine path (the kernel's header has the argument).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};

use super::{F32Reader, cpu_output};

/// What [`paged_attention`] needs beyond the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedAttnConfig {
    /// Pool slots per block (the block table's unit).
    pub block_size: usize,
    /// Sliding window `W`: keys `t` with `P − W < t ≤ P`. `None`: every `t ≤ P` (full causal).
    pub window: Option<usize>,
    /// Score scale, normally `1/√d`.
    pub scale: f32,
    /// The attention kernels (and [`crate::kernels::qkv_rope_paged`] before them) release their PDL
    /// dependents before they wait (`kernels/launch.rs`): the same results, the next kernels
    /// started sooner. Measured per model: gpt-oss gains, Llama-3.2-1B loses (docs/performance.md).
    pub release_first: bool,
}

/// Host-side bounds that fix the launch, so that a CUDA graph captured for a batch shape replays
/// with other data. The kernel trusts them: a sequence longer than `max_q_len` would leave rows
/// unwritten (the CPU reference checks both bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedBounds {
    /// At least every sequence's query count `cu_q[s+1] − cu_q[s]`.
    pub max_q_len: usize,
    /// At least every `q_pos[s] + q_len(s)`: the longest context, which sizes the key splits.
    pub max_context: usize,
}

/// Attention of a varlen batch over a paged KV pool; see the module documentation. `q` is
/// `[T, heads, d]`, `k_pool`/`v_pool` `[num_slots, kv_heads, d]` (contiguous, same dtype as q:
/// f32 or bf16; or FP8 codes with `scales`, the keys' and values' u8 `[num_slots, kv_heads]`
/// ([`super::kv_fp8`]), read as the bf16 values they stand for, q bf16 on CUDA), `sinks` f32 `[heads]` or `None`, `cu_q` u32 `[S+1]` (`cu_q[0] = 0`,
/// `cu_q[S] = T`), `q_pos` u32 `[S]`, `tables` u32 `[S, max_blocks]`, all on one device. Returns
/// `[T, heads, d]` in q's dtype, contiguous. Runs the CUDA kernels on a CUDA device and the
/// reference loops on the CPU.
///
/// On the GPU the kernel reads `cu_q`, `q_pos`, `tables` and the keys and values of positions
/// before each sequence's `q_pos` before it waits for the kernel launched just before it
/// (Programmatic Dependent Launch): that kernel may write `q` and the step's own positions
/// (`qkv_rope_paged` does), nothing else this reads.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    scales: Option<(&Tensor, &Tensor)>,
    sinks: Option<&Tensor>,
    cu_q: &Tensor,
    q_pos: &Tensor,
    tables: &Tensor,
    bounds: PagedBounds,
    cfg: &PagedAttnConfig,
) -> Result<Tensor> {
    let meta = Meta { scales, sinks, cu_q, q_pos, tables };
    let op = PagedAttention::new(q, k_pool, v_pool, meta, bounds, *cfg, false)?;
    if q.dim(0)? == 0 {
        return q.zeros_like();
    }
    q.contiguous()?.apply_op3_no_bwd(k_pool, v_pool, &op)
}

/// The launch of one call as the host computes it: the same for any metadata contents, which is
/// what lets a CUDA graph replay it ([`paged_launch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedLaunch {
    /// The attention kernel's grid: (sequences × row tiles, kv heads, blocks sharing a tile's
    /// fixed splits).
    pub grid: (u32, u32, u32),
    /// The kernel variant.
    pub kernel: PagedKernel,
    /// Blocks that share one tile's fixed splits (`grid.2`); above 1 their partial states go to
    /// the combine kernel.
    pub splits: usize,
    /// Fixed splits any sequence can have: partial states kept per (token, head).
    pub fixed_splits: usize,
    /// The combine kernel's grid (0 with one block per tile).
    pub combine_blocks: usize,
}

/// Which kernel runs a call. bf16 calls all take the tensor-core kernel, f32 calls the scalar
/// one: a row's bits depend on the kernel, so decode and prefill of one dtype must share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedKernel {
    /// `paged_attention.cu`: one key per lane in f32, 4 warps of `rows_per_warp` (2 or 4) rows.
    Scalar { rows_per_warp: usize },
    /// `paged_attention_mma.cu`: mma.sync, `warps` (4 or 8) warps of 16 rows.
    Mma { warps: usize },
    /// `paged_attention_mma.cu`'s `_ds` kernels, for up to 16 rows (a decode step): 4 warps on
    /// the same rows, each the P.V of a quarter of the output's dimensions, where one warp with
    /// rows and three without spent ~3 µs a 64-key tile in that warp's chain of products. The
    /// same bits as the other tensor-core kernels. H100, same call: gpt-oss-20b decode at 1k
    /// 419.4 -> 425.4 tok/s, after an 8k prompt 381.2 -> 384.1; Llama-3.2-1B 776.8 -> 794.8.
    MmaSplitDims,
}

impl PagedKernel {
    /// Query rows (query, head-in-group pairs) per block.
    pub fn rows_per_block(self) -> usize {
        match self {
            PagedKernel::Scalar { rows_per_warp } => WARPS * rows_per_warp,
            PagedKernel::Mma { warps } => 16 * warps,
            PagedKernel::MmaSplitDims => 16,
        }
    }

    /// Threads per block.
    pub fn threads(self) -> usize {
        32 * match self {
            PagedKernel::Scalar { .. } => WARPS,
            PagedKernel::Mma { warps } => warps,
            PagedKernel::MmaSplitDims => 4,
        }
    }

    /// Blocks one multiprocessor runs at once (registers bound both): the tensor-core kernel's
    /// 244 registers a thread allow 2 blocks of 4 warps, so a decode step spreads its splits over
    /// 2 blocks per multiprocessor; more would run in a second wave (H100, gpt-oss-20b decode
    /// after an 8k prompt: 381 tok/s sized for 2 blocks, 376 for 4). The decode kernel takes 126
    /// registers a thread at d 64 (4 blocks) and 160 at d 128 (3).
    fn blocks_per_sm(self, d: usize) -> usize {
        match self {
            PagedKernel::Scalar { .. } => 4,
            PagedKernel::Mma { .. } => 2,
            PagedKernel::MmaSplitDims if d <= 64 => 4,
            PagedKernel::MmaSplitDims if d <= 128 => 3,
            PagedKernel::MmaSplitDims => 2,
        }
    }

    /// The kernel for `rows` query rows per kv head of head size `d` (more rows, bigger blocks).
    /// At d 256 every bf16 call takes the `_ds` kernel: a warp holding 16 rows over all 256
    /// output columns would keep 256 accumulators a thread.
    fn pick(bf16: bool, rows: usize, d: usize) -> Self {
        match (bf16, rows) {
            (false, r) => PagedKernel::Scalar { rows_per_warp: if r <= 8 { 2 } else { 4 } },
            (true, r) if r <= 16 || d > 128 => PagedKernel::MmaSplitDims,
            (true, r) => PagedKernel::Mma { warps: if r <= 64 { 4 } else { 8 } },
        }
    }
}

/// Whether the CUDA kernels take head size `d` in this dtype (bf16 or f32 q): 64 and 128 in
/// both, 256 in bf16 (the f32 kernel's static tiles would pass the 48 KiB a block may declare).
/// Architectures check it before loading, so a model the GPU cannot run is refused in one line.
pub fn cuda_head_dim(d: usize, bf16: bool) -> bool {
    matches!(d, 64 | 128) || (d == 256 && bf16)
}

/// Keys per tile (`BK` in the scalar kernel) and its warps per block (`NW`).
const TILE: usize = 32;
const WARPS: usize = 4;
/// Positions per fixed split (`SK` in the kernels): every query folds its keys' softmax in these
/// absolute runs, whatever the launch, which makes the result batch invariant (the kernel's
/// header). 4 scalar tiles, 2 tensor-core ones: short enough that a decode step at a few hundred
/// positions still spreads over several blocks.
pub const SPLIT_KEYS: usize = 4 * TILE;
/// Most bytes of partial states one call may take (the combine path's workspace); past it the
/// tile's blocks do not share their splits. Big batches at long bounds reach it, and have the
/// blocks to fill the GPU anyway.
const MAX_PARTIAL_BYTES: usize = 32 << 20;

/// The launch for `seqs` sequences, `tokens` query rows, `heads`:`kv_heads` heads of size `d`
/// (bf16 or f32) on a GPU of `sms` multiprocessors: a function of those and the bounds alone. A
/// tile's fixed splits are shared by more blocks until the multiprocessors are full (one wave),
/// within the partial states' memory cap.
pub fn paged_launch(
    seqs: usize,
    tokens: usize,
    (heads, kv_heads, d, bf16): (usize, usize, usize, bool),
    bounds: PagedBounds,
    window: Option<usize>,
    sms: usize,
) -> PagedLaunch {
    let rows = heads / kv_heads.max(1) * bounds.max_q_len.max(1); // query rows per kv head
    let kernel = PagedKernel::pick(bf16, rows, d);
    let row_blocks = rows.div_ceil(kernel.rows_per_block());
    let span =
        window.map_or(bounds.max_context, |w| bounds.max_context.min(w + bounds.max_q_len)).max(1);
    // A span that does not start on a split boundary touches one split more.
    let fixed_splits = span.div_ceil(SPLIT_KEYS) + 1;
    let blocks = (seqs * row_blocks * kv_heads).max(1);
    let partial_bytes = fixed_splits * tokens * heads * (d + 2) * 4;
    let splits = if partial_bytes > MAX_PARTIAL_BYTES {
        1
    } else {
        (kernel.blocks_per_sm(d) * sms.max(1)).div_ceil(blocks).clamp(1, fixed_splits)
    };
    PagedLaunch {
        grid: ((seqs * row_blocks) as u32, kv_heads as u32, splits as u32),
        kernel,
        splits,
        fixed_splits,
        combine_blocks: if splits > 1 { (tokens * heads).div_ceil(WARPS) } else { 0 },
    }
}

/// The metadata tensors of one call.
#[derive(Clone, Copy)]
struct Meta<'a> {
    scales: Option<(&'a Tensor, &'a Tensor)>,
    sinks: Option<&'a Tensor>,
    cu_q: &'a Tensor,
    q_pos: &'a Tensor,
    tables: &'a Tensor,
}

/// The CustomOp: `q`, `k_pool`, `v_pool` are its arguments, the metadata travels inside
/// (contiguous; sinks as f32).
struct PagedAttention {
    /// Query and kv heads, head size and dtype, for the launch ([`PagedAttention::plan`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    heads: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    kv_heads: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    d: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    bf16: bool,
    /// Pools of codes: their key and value scales (contiguous u8).
    scales: Option<(Tensor, Tensor)>,
    sinks: Option<Tensor>,
    cu_q: Tensor,
    q_pos: Tensor,
    tables: Tensor,
    bounds: PagedBounds,
    cfg: PagedAttnConfig,
    /// Tests: fill the CUDA output with NaN before the kernel runs.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    poison: bool,
}

impl PagedAttention {
    fn new(
        q: &Tensor,
        k_pool: &Tensor,
        v_pool: &Tensor,
        meta: Meta,
        bounds: PagedBounds,
        cfg: PagedAttnConfig,
        poison: bool,
    ) -> Result<Self> {
        let (tokens, heads, d) = q.dims3()?;
        let (num_slots, kv_heads, kd) = k_pool.dims3()?;
        if v_pool.dims() != k_pool.dims() || kd != d {
            bail!(
                "paged_attention: k_pool {:?} and v_pool {:?} must be [num_slots, kv_heads, {d}]",
                k_pool.dims(),
                v_pool.dims()
            );
        }
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            bail!("paged_attention: {heads} query heads are not a multiple of {kv_heads} kv heads");
        }
        if d == 0 || num_slots == 0 {
            bail!("paged_attention: empty head_dim ({d}) or pool ({num_slots} slots)");
        }
        let coded = super::kv_fp8::Codes::of(k_pool.dtype()).is_some();
        if (!coded && q.dtype() != k_pool.dtype())
            || k_pool.dtype() != v_pool.dtype()
            || !matches!(q.dtype(), DType::F32 | DType::BF16)
            || coded != meta.scales.is_some()
        {
            bail!(
                "paged_attention: q and the pools must all be f32 or all bf16 (or pools of fp8 or \
                 int8 codes with their scales), got {:?} {:?} {:?}",
                q.dtype(),
                k_pool.dtype(),
                v_pool.dtype()
            );
        }
        if let Some((ks, vs)) = meta.scales {
            let want = [num_slots, kv_heads];
            for s in [ks, vs] {
                if s.dims() != want || s.dtype() != DType::U8 || !s.is_contiguous() {
                    bail!("paged_attention: the pools' scales must be contiguous u8 {want:?}");
                }
            }
        }
        if !k_pool.is_contiguous() || !v_pool.is_contiguous() {
            bail!("paged_attention: the pools must be contiguous");
        }
        let seqs = match meta.cu_q.dims() {
            [n] if *n >= 2 => n - 1,
            dims => bail!("paged_attention: cu_q {dims:?} must be [S+1] with S ≥ 1"),
        };
        let max_blocks = match meta.tables.dims() {
            [s, b] if *s == seqs && *b > 0 => *b,
            dims => bail!("paged_attention: tables {dims:?} must be [{seqs}, max_blocks ≥ 1]"),
        };
        if meta.q_pos.dims() != [seqs] {
            bail!("paged_attention: q_pos {:?} must be [{seqs}]", meta.q_pos.dims());
        }
        for (name, t) in [("cu_q", meta.cu_q), ("q_pos", meta.q_pos), ("tables", meta.tables)] {
            if t.dtype() != DType::U32 {
                bail!("paged_attention: {name} must be u32, got {:?}", t.dtype());
            }
        }
        let scales = meta.scales.into_iter().flat_map(|(k, v)| [k, v]);
        let on_q = [meta.cu_q, meta.q_pos, meta.tables, k_pool, v_pool]
            .into_iter()
            .chain(meta.sinks)
            .chain(scales);
        for t in on_q {
            if !t.device().same_device(q.device()) {
                bail!("paged_attention: inputs on {:?} and {:?}", t.device(), q.device());
            }
        }
        if let Some(s) = meta.sinks
            && s.dims() != [heads]
        {
            bail!("paged_attention: sinks {:?} must be [{heads}]", s.dims());
        }
        if cfg.window == Some(0) {
            bail!("paged_attention: a window of 0 keys sees nothing; use None for full attention");
        }
        if cfg.block_size == 0 || max_blocks.checked_mul(cfg.block_size).is_none() {
            bail!("paged_attention: block_size {} is not usable", cfg.block_size);
        }
        if tokens > seqs * bounds.max_q_len {
            bail!(
                "paged_attention: {tokens} query rows do not fit {seqs} sequences of at most {} \
                 (bounds.max_q_len)",
                bounds.max_q_len
            );
        }
        Ok(Self {
            heads,
            kv_heads,
            d,
            bf16: q.dtype() == DType::BF16,
            scales: meta.scales.map(|(k, v)| (k.clone(), v.clone())),
            sinks: meta.sinks.map(|s| s.to_dtype(DType::F32)?.contiguous()).transpose()?,
            cu_q: meta.cu_q.contiguous()?,
            q_pos: meta.q_pos.contiguous()?,
            tables: meta.tables.contiguous()?,
            bounds,
            cfg,
            poison,
        })
    }

    /// The launch for `tokens` query rows on a GPU of `sms` multiprocessors ([`paged_launch`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn plan(&self, tokens: usize, sms: usize) -> PagedLaunch {
        let seqs = self.q_pos.dims().first().copied().unwrap_or(0);
        paged_launch(
            seqs,
            tokens,
            (self.heads, self.kv_heads, self.d, self.bf16),
            self.bounds,
            self.cfg.window,
            sms,
        )
    }

    /// Whether a key at position `t` is visible from a query at position `p`.
    fn allows(&self, t: usize, p: usize) -> bool {
        t <= p && self.cfg.window.is_none_or(|w| t + w > p)
    }

    /// One query row of one head at position `p`: its scores over the visible `slots` (the
    /// first at position `lo`), softmax with the sink, and the weighted sum of values into `o`.
    #[allow(clippy::too_many_arguments)]
    fn one_head(
        &self,
        q: &[f32],
        (k, v): (F32Reader, F32Reader),
        (lo, slots): (usize, &[usize]),
        (p, sink): (usize, f32),
        g: usize,
        scores: &mut Vec<(usize, f32)>,
        o: &mut [f32],
    ) {
        let (d, kv_heads) = (q.len(), self.kv_heads);
        scores.clear();
        for (j, &slot) in slots.iter().enumerate() {
            if self.allows(lo + j, p) {
                let k0 = (slot * kv_heads + g) * d;
                scores.push((k0, self.cfg.scale * k.dot(k0, q)));
            }
        }
        let m = scores.iter().fold(sink, |m, &(_, s)| m.max(s));
        let mut denom = if sink == f32::NEG_INFINITY { 0.0 } else { (sink - m).exp() };
        for &(v0, s) in scores.iter() {
            let w = (s - m).exp();
            denom += w;
            v.add_scaled(v0, w, o);
        }
        o.iter_mut().for_each(|x| *x /= denom);
    }

    /// The reference: for each sequence, query row and head, the visible keys' slots through the
    /// block table, their scores, the max with the sink (if any), and the weighted sum of values
    /// over the (sink-extended) denominator. f32 throughout. Checks the metadata on the way: the
    /// row offsets, the bounds, and every table entry it needs.
    fn reference(&self, q: F32Reader, k: F32Reader, v: F32Reader, dims: Dims) -> Result<Vec<f32>> {
        let Dims { tokens, heads, kv_heads, d, num_slots } = dims;
        let cu_q = self.cu_q.to_vec1::<u32>()?;
        let q_pos = self.q_pos.to_vec1::<u32>()?;
        let tables = self.tables.to_vec2::<u32>()?;
        let sinks = self.sinks.as_ref().map(|s| s.to_vec1::<f32>()).transpose()?;
        if cu_q[0] != 0
            || cu_q[cu_q.len() - 1] as usize != tokens
            || cu_q.windows(2).any(|w| w[1] < w[0])
        {
            bail!("paged_attention: cu_q must rise from 0 to {tokens}, got {cu_q:?}");
        }
        let bs = self.cfg.block_size;
        // Each sequence's visible slots, checked once: (first position, slots from it on).
        let mut seen: Vec<Option<(usize, Vec<usize>)>> = Vec::with_capacity(tables.len());
        for (s, table) in tables.iter().enumerate() {
            let (q_len, pos0) = ((cu_q[s + 1] - cu_q[s]) as usize, q_pos[s] as usize);
            if q_len == 0 {
                seen.push(None); // padding: its position and table may be anything
                continue;
            }
            if q_len > self.bounds.max_q_len || pos0 + q_len > self.bounds.max_context {
                bail!(
                    "paged_attention: sequence {s} ({q_len} queries from position {pos0}) is \
                     outside the bounds {:?}",
                    self.bounds
                );
            }
            let lo = self.cfg.window.map_or(0, |w| (pos0 + 1).saturating_sub(w));
            let slots = (lo..pos0 + q_len)
                .map(|t| {
                    let slot = table.get(t / bs).map(|&b| b as usize * bs + t % bs);
                    match slot {
                        Some(slot) if slot < num_slots => Ok(slot),
                        _ => bail!(
                            "paged_attention: sequence {s} position {t}: block table entry {} \
                             ({:?}) is outside the {num_slots}-slot pool",
                            t / bs,
                            table.get(t / bs)
                        ),
                    }
                })
                .collect::<Result<Vec<usize>>>()?;
            seen.push(Some((lo, slots)));
        }
        // Every row's sequence and position.
        let mut rows: Vec<(usize, usize)> = Vec::with_capacity(tokens);
        for (s, w) in cu_q.windows(2).enumerate() {
            rows.extend((0..(w[1] - w[0]) as usize).map(|i| (s, q_pos[s] as usize + i)));
        }
        let q: Vec<f32> = (0..tokens * heads * d).map(|i| q.get(i)).collect();
        let mut out = vec![0f32; tokens * heads * d];
        // Rows are independent and each is computed the same way on any thread: split them
        // over the cores (a long prompt on the CPU is otherwise minutes of attention).
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(16);
        let per = tokens.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for (part, out) in out.chunks_mut(per * heads * d).enumerate() {
                let (rows, q, seen, sinks) = (&rows, &q, &seen, &sinks);
                scope.spawn(move || {
                    let mut scores: Vec<(usize, f32)> = Vec::new();
                    for (i, o_row) in out.chunks_exact_mut(heads * d).enumerate() {
                        let row = part * per + i;
                        let (s, p) = rows[row];
                        let Some((lo, slots)) = &seen[s] else { continue };
                        for (h, o) in o_row.chunks_exact_mut(d).enumerate() {
                            let q_row = &q[(row * heads + h) * d..][..d];
                            let sink = sinks.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]);
                            let g = h / (heads / kv_heads);
                            self.one_head(
                                q_row,
                                (k, v),
                                (*lo, slots),
                                (p, sink),
                                g,
                                &mut scores,
                                o,
                            );
                        }
                    }
                });
            }
        });
        Ok(out)
    }
}

/// An f32 or bf16 CPU buffer read from element `at` on.
fn from<'a>(s: &'a CpuStorage, what: &str, at: usize) -> Result<F32Reader<'a>> {
    Ok(match F32Reader::new(s, what)? {
        F32Reader::F32(x) => F32Reader::F32(&x[at..]),
        F32Reader::Bf16(x) => F32Reader::Bf16(&x[at..]),
    })
}

/// The `n` values a pool's codes (from element `at`) and scales stand for
/// ([`super::kv_fp8::dequantize`]), rows of `d`.
fn dequantized(
    (s, kind): (&CpuStorage, super::kv_fp8::Codes),
    at: usize,
    n: usize,
    scales: &Tensor,
    d: usize,
) -> Result<Vec<f32>> {
    let codes = super::kv_fp8::cpu_codes(s)?;
    let scales = scales.flatten_all()?.to_vec1::<u8>()?;
    Ok(codes[at..at + n]
        .iter()
        .enumerate()
        .map(|(i, &c)| super::kv_fp8::dequantize(kind, c, scales[i / d]))
        .collect())
}

/// One call's sizes.
#[derive(Clone, Copy)]
struct Dims {
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    num_slots: usize,
}

impl Dims {
    fn new(ql: &Layout, kl: &Layout) -> Result<Self> {
        let (tokens, heads, d) = ql.shape().dims3()?;
        let (num_slots, kv_heads, _) = kl.shape().dims3()?;
        Ok(Self { tokens, heads, kv_heads, d, num_slots })
    }
}

impl CustomOp3 for PagedAttention {
    fn name(&self) -> &'static str {
        "paged_attention"
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
        let contiguous = |l: &Layout, what: &str| match l.contiguous_offsets() {
            Some((a, _)) => Ok(a),
            None => bail!("paged_attention: {what} must be contiguous"),
        };
        let (q0, k0, v0) =
            (contiguous(ql, "q")?, contiguous(kl, "k_pool")?, contiguous(vl, "v_pool")?);
        let dims = Dims::new(ql, kl)?;
        let q = from(qs, "q", q0)?;
        let out = match &self.scales {
            Some((k_scale, v_scale)) => {
                let n = dims.num_slots * dims.kv_heads * dims.d;
                let Some(codes) = super::kv_fp8::Codes::of(ks.dtype()) else {
                    bail!("paged_attention: scales given for {:?} pools", ks.dtype())
                };
                let k = dequantized((ks, codes), k0, n, k_scale, dims.d)?;
                let v = dequantized((vs, codes), v0, n, v_scale, dims.d)?;
                self.reference(q, F32Reader::F32(&k), F32Reader::F32(&v), dims)?
            }
            None => {
                let (k, v) = (from(ks, "k_pool", k0)?, from(vs, "v_pool", v0)?);
                self.reference(q, k, v, dims)?
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
        use candle_core::cuda_backend::CudaStorageSlice;
        let dev = qs.device.clone();
        let pools = gpu::Pools::new(&dev, (ks, kl), (vs, vl))?;
        let slice = match &qs.slice {
            CudaStorageSlice::F32(q) => f32::wrap(gpu::launch::<f32>(self, &dev, (q, ql), pools)?),
            CudaStorageSlice::BF16(q) => {
                half::bf16::wrap(gpu::launch::<half::bf16>(self, &dev, (q, ql), pools)?)
            }
            _ => bail!("paged_attention: q must be f32 or bf16"),
        };
        Ok((candle_core::CudaStorage { slice, device: dev }, ql.shape().clone()))
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
