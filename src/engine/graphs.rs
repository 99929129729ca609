//! Decode steps as CUDA graphs, one per batch-size bucket (1, 2, 4, 8, 16, 32, 48, 64): a step
//! whose every sequence decodes one token is padded to the next bucket and replays the graph
//! captured for it, instead of ~30 launches per layer issued by the host. Everything a step
//! reads lives in one fixed device buffer the host rewrites before each replay (an upload
//! through page-locked staging, then one device copy): token ids, positions, pool slots, block
//! tables (as wide as the longest sequence can need) and the varlen offsets. The launches
//! depend only on the bucket and on the model's longest sequence, never on the data, which is
//! what makes replays correct.
//!
//! A speculative step whose every sequence verifies the same number of drafts is a decode step
//! of `q` rows per sequence (the last token and `q − 1` drafts): it has graphs of its own, one
//! per (bucket, q).
//!
//! Padding sequences decode token 0 at positions 0.. into the block manager's padding block,
//! which no sequence owns; their logits are ignored, and the step tells the model where their
//! rows start (`live_rows`), so that gpt-oss reads no experts for them. `INFERNO_CUDA_GRAPH=0`
//! switches graphs off.
//!
//! A graph gives its rows' logits, or, for a model split by vocabulary over ranks whose step
//! draws on them, their ids: each row's draw (`(1/T, seed)`) is one more input, and the graph
//! holds the draw ([`super::ranks::draw_on_ranks`]) with its gather.

use candle_core::{DType, Device, Tensor};

use super::kv::blocks::{PAD_BLOCK, Tables};
use super::ranks::draw_on_ranks;
use super::scheduler::Chunk;
use crate::kernels::PagedBounds;
use crate::models::batch::{BatchModel, KvPool, StepInput};

const BUCKETS: [usize; 8] = [1, 2, 4, 8, 16, 32, 48, 64];

/// A decode step's input ids: from the host, or the previous step's sampled ids still on the
/// device (a step enqueued before the host has read them: core.rs's pipelined decode).
#[derive(Clone, Copy)]
pub enum StepIds<'a> {
    Host(&'a [u32]),
    Device(&'a Tensor),
}

/// The bucket a decode batch of `n` sequences of `q` rows each pads to (`None`: larger than
/// any, or more rows than a block holds).
pub fn bucket(n: usize, q: usize) -> Option<usize> {
    if q == 0 || q > MAX_ROWS_PER_SEQ {
        return None;
    }
    BUCKETS.iter().copied().find(|&b| b >= n)
}

/// Rows per sequence a graph runs at most: a padding sequence's rows all fit in the padding
/// block (16 slots).
const MAX_ROWS_PER_SEQ: usize = 16;

/// Whether decode graphs are used on `device`.
pub fn enabled(device: &Device) -> bool {
    device.is_cuda() && crate::switches::cuda_graphs()
}

enum State {
    /// No step has run: the next one runs eagerly (loads kernels, sizes the allocator).
    Cold,
    /// One eager step ran: the next one is captured.
    Warm,
    #[cfg(feature = "cuda")]
    Ready(candle_core::cuda_backend::cudarc::driver::CudaGraph),
    /// Capturing failed: steps run eagerly through the same buffers.
    Eager,
}

/// The capture memory one engine's graphs share (`gpu/arena.rs`): they replay one at a time on
/// the engine's stream, while another engine's graphs may replay beside them on its own.
#[derive(Clone, Default)]
pub struct GraphArena {
    #[cfg(feature = "cuda")]
    arena: std::sync::Arc<crate::gpu::arena::Arena>,
}

/// One bucket's fixed buffers and graph.
pub struct BucketGraph {
    /// Sequences.
    size: usize,
    /// Rows per sequence.
    q: usize,
    /// Blocks a table row holds: enough for the longest sequence.
    width: usize,
    groups: usize,
    /// Views of `packed`.
    input: StepInput,
    /// Every input of a step, u32 `[packed_len]`, written by one copy per step.
    packed: Tensor,
    packed_len: usize,
    /// What the step writes.
    out: Out,
    /// Layers whose entering stream the step keeps (an EAGLE-3 head's taps; empty: none).
    tap_ids: Vec<usize>,
    /// f32 `[size · q, 3 · hidden]`, written by the step when it taps (allocated by the first,
    /// eager step, before any capture).
    taps: Option<Tensor>,
    /// Peak bytes the warm-up step had allocated at once: what the capture takes from the arena.
    arena_bytes: u64,
    state: State,
    /// Last: the graph in `state` goes before the bytes it uses.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    arena: GraphArena,
}

/// A graph's output buffers.
enum Out {
    /// f32 `[size · q, vocab]`.
    Logits(Tensor),
    /// The rows' draws (u32 `[3 · size · q]`, [`crate::kernels::draw_words`], a view of the
    /// inputs) and the ids drawn (u32 `[size · q]`).
    Ids { draws: Tensor, ids: Tensor },
}

impl BucketGraph {
    /// The graph of `size` sequences of `q` rows each; `drawn`: its rows' ids drawn on the
    /// model's ranks rather than its logits.
    pub fn new(
        (size, q): (usize, usize),
        drawn: bool,
        model: &dyn BatchModel,
        groups: usize,
        block_size: usize,
        arena: &GraphArena,
    ) -> anyhow::Result<BucketGraph> {
        anyhow::ensure!(q >= 1 && q <= block_size, "decode graph: {q} rows per sequence");
        let dev = model.device();
        let max_context = model.max_positions();
        let width = max_context.div_ceil(block_size).max(1);
        let rows = size * q;
        let packed_len = rows * (3 + groups)
            + size * (2 + groups * width)
            + 2
            + if drawn { 3 * rows } else { 0 };
        // Every input is a view of one buffer, in `upload`'s order: a step's inputs arrive in
        // one copy instead of one per tensor (each a GPU operation between two replays).
        let packed = Tensor::zeros(packed_len, DType::U32, dev)?;
        let mut at = 0;
        let mut view = |len: usize| {
            let t = packed.narrow(0, at, len);
            at += len;
            t
        };
        let tokens = view(rows)?;
        let positions = view(rows)?;
        let slots = (0..groups).map(|_| view(rows)).collect::<Result<_, _>>()?;
        let tables = (0..groups)
            .map(|_| view(size * width)?.reshape((size, width)))
            .collect::<Result<_, _>>()?;
        let input = StepInput {
            tokens,
            positions,
            slots,
            tables,
            cu_q: view(size + 1)?,
            q_pos: view(size)?,
            logit_rows: view(rows)?,
            live_rows: Some(view(1)?),
            bounds: PagedBounds { max_q_len: q, max_context },
            local_logits: drawn,
        };
        let out = if drawn {
            Out::Ids { draws: view(3 * rows)?, ids: Tensor::zeros(rows, DType::U32, dev)? }
        } else {
            Out::Logits(Tensor::zeros((rows, model.vocab_size()), DType::F32, dev)?)
        };
        Ok(BucketGraph {
            size,
            q,
            width,
            groups,
            input,
            packed,
            packed_len,
            out,
            tap_ids: Vec::new(),
            taps: None,
            arena_bytes: 0,
            state: State::Cold,
            arena: arena.clone(),
        })
    }

    /// The graph keeping the streams entering layers `taps` ([`BatchModel::forward_taps`]).
    pub fn with_taps(self, taps: &[usize]) -> BucketGraph {
        BucketGraph { tap_ids: taps.to_vec(), ..self }
    }

    /// The last step's taps of its first `rows` rows (a view of the graph's buffer).
    pub fn taps(&self, rows: usize) -> Option<candle_core::Result<Tensor>> {
        self.taps.as_ref().map(|t| t.narrow(0, 0, rows))
    }

    /// Runs a decode step of `chunks` (each `q` tokens, their ids one after the other in `ids`)
    /// and returns the logits of its rows `[chunks.len() · q, vocab]`, or in a graph that draws
    /// on the ranks the ids `draws` (one per row) gave them.
    pub fn step(
        &mut self,
        model: &dyn BatchModel,
        pool: &KvPool,
        chunks: &[Chunk],
        ids: StepIds,
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<Tensor> {
        anyhow::ensure!(
            draws.is_some() == matches!(self.out, Out::Ids { .. }),
            "decode graph: draws for a graph of logits, or none for a graph that draws"
        );
        anyhow::ensure!(chunks.len() <= self.size, "decode graph: batch over its bucket");
        anyhow::ensure!(
            chunks.iter().all(|c| c.len == self.q),
            "decode graph: a chunk of other than {} rows",
            self.q
        );
        let rows = chunks.len() * self.q;
        match ids {
            StepIds::Host(ids) => {
                anyhow::ensure!(ids.len() == rows, "decode graph: one id per row");
                self.upload(chunks, ids, blocks, pool.block_size, draws)?
            }
            StepIds::Device(ids) => {
                anyhow::ensure!(ids.dims() == [rows], "decode graph: one id per row");
                self.upload(chunks, &vec![0; rows], blocks, pool.block_size, draws)?;
                // Behind the previous step on the stream: its sampled ids, never on the host.
                self.input.tokens.slice_set(&ids.to_dtype(DType::U32)?, 0, 0)?;
                // The other ranks of a sharded model take rank 0's ids, on the stream.
                if let Some(c) = model.collective() {
                    c.broadcast(&self.input.tokens.narrow(0, 0, rows)?, 0)?;
                }
            }
        }
        match &self.state {
            State::Cold | State::Eager => {
                let cold = matches!(self.state, State::Cold);
                // The warm-up step measures what the capture will take from the arena.
                let measure = cold.then(|| arena_measure(model.device()));
                self.run_into_buffer(model, pool)?;
                drop(measure);
                if cold {
                    self.arena_bytes = arena_peak();
                    self.state = State::Warm;
                }
            }
            State::Warm => {
                self.capture(model, pool)?;
                self.replay(model, pool)?;
            }
            #[cfg(feature = "cuda")]
            State::Ready(_) => self.replay(model, pool)?,
        }
        Ok(match &self.out {
            Out::Logits(l) => l.narrow(0, 0, rows)?,
            // A copy: the next step's replay rewrites the buffer while the host may still be
            // reading these (the pipelined decode).
            Out::Ids { ids, .. } => ids.narrow(0, 0, rows)?.copy()?,
        })
    }

    /// Whether capturing this bucket's graph failed (its steps run eagerly).
    pub fn capture_failed(&self) -> bool {
        matches!(self.state, State::Eager)
    }

    /// Writes the step's inputs into the fixed buffer: one upload, then one device copy.
    fn upload(
        &self,
        chunks: &[Chunk],
        ids: &[u32],
        blocks: &dyn Tables,
        block_size: usize,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<()> {
        let (b, q, w, g) = (self.size, self.q, self.width, self.groups);
        let mut p = Vec::with_capacity(self.packed_len);
        let n = chunks.len();
        let pad_rows = (b - n) * q;
        p.extend_from_slice(ids);
        p.extend(std::iter::repeat_n(0, pad_rows));
        for c in chunks {
            p.extend(c.start as u32..(c.start + q) as u32);
        }
        for _ in n..b {
            p.extend(0..q as u32);
        }
        for group in 0..g {
            for c in chunks {
                for pos in c.start..c.start + q {
                    let slot = blocks.slot(c.id, group, pos).ok_or_else(|| {
                        anyhow::anyhow!("decode graph: no KV slot for sequence {}", c.id)
                    })?;
                    p.push(slot);
                }
            }
            for _ in n..b {
                p.extend((0..q as u32).map(|j| PAD_BLOCK * block_size as u32 + j));
            }
        }
        for group in 0..g {
            for c in chunks {
                let row = blocks.table(c.id, group);
                anyhow::ensure!(
                    row.len() <= w,
                    "decode graph: a block table wider than the context"
                );
                p.extend_from_slice(row);
                p.extend(std::iter::repeat_n(u32::MAX, w - row.len()));
            }
            for _ in n..b {
                p.extend(std::iter::repeat_n(PAD_BLOCK, w));
            }
        }
        p.extend((0..=b as u32).map(|s| s * q as u32)); // cu_q: q queries a sequence
        p.extend(chunks.iter().map(|c| c.start as u32));
        p.extend(std::iter::repeat_n(0, b - n));
        p.extend(0..(b * q) as u32); // every row's logits
        p.push((n * q) as u32); // the padding sequences' rows come last
        if let Some(d) = draws {
            anyhow::ensure!(d.len() == n * q, "decode graph: one draw per row");
            let padded: Vec<(f32, u64)> =
                d.iter().copied().chain(std::iter::repeat_n((0.0, 0), pad_rows)).collect();
            p.extend(crate::kernels::draw_words(&padded));
        }
        anyhow::ensure!(p.len() == self.packed_len, "decode graph: inputs of another size");
        let host = crate::kernels::upload_u32(&p, self.packed.device())?;
        Ok(self.packed.slice_set(&host, 0, 0)?)
    }

    fn run_into_buffer(&mut self, model: &dyn BatchModel, pool: &KvPool) -> anyhow::Result<()> {
        let _uploads = keep_uploads(model.device());
        let (logits, taps) = model.forward_taps(&self.input, pool, &self.tap_ids)?;
        if let Some(t) = taps {
            if self.taps.is_none() {
                self.taps = Some(Tensor::zeros(t.dims(), DType::F32, t.device())?);
            }
            if let Some(buf) = &self.taps {
                buf.slice_set(&t, 0, 0)?;
            }
        }
        match &self.out {
            Out::Logits(buf) => buf.slice_set(&logits, 0, 0)?,
            Out::Ids { draws, ids } => {
                ids.slice_set(&draw_on_ranks(model, &logits, draws)?, 0, 0)?
            }
        }
        Ok(())
    }

    fn replay(&mut self, model: &dyn BatchModel, pool: &KvPool) -> anyhow::Result<()> {
        match &self.state {
            #[cfg(feature = "cuda")]
            State::Ready(graph) => {
                use candle_core::cuda_backend::WrapErr;
                graph.launch().w()?;
                Ok(())
            }
            _ => self.run_into_buffer(model, pool),
        }
    }

    #[cfg(feature = "cuda")]
    fn capture(&mut self, model: &dyn BatchModel, pool: &KvPool) -> anyhow::Result<()> {
        use candle_core::cuda_backend::cudarc::driver::sys::{
            CUgraphInstantiate_flags, CUstreamCaptureMode,
        };
        let Device::Cuda(cuda) = model.device().clone() else {
            anyhow::bail!("CUDA graphs need a CUDA device")
        };
        let stream = cuda.cuda_stream();
        // The step's own allocations come from the arena, not graph memory nodes (twice the
        // warm-up's peak, as arena.rs says; without it, the graph allocates as it always could).
        let arena = &self.arena.arena;
        let reserved = arena.reserve(stream.context(), 2 * self.arena_bytes + (4 << 20));
        let _arena = reserved.is_ok().then(|| arena.serve(stream.cu_stream()));
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        // Everything the step allocates is freed before the capture ends (the graph owns those
        // allocations); only the fixed output buffers are written.
        let recorded = self.run_into_buffer(model, pool);
        // Always end the capture, or the stream stays in capture mode.
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        drop(_arena);
        self.state = match (recorded, graph) {
            (Ok(()), Ok(Some(graph))) => {
                if crate::switches::graph_stats() {
                    let replay = replay_time(&graph, &stream)?;
                    let nodes = node_stats(&graph);
                    let (chunks, lent) = self.arena.arena.usage();
                    eprintln!(
                        "inferno: decode graph, batch {} × {} rows: {nodes}; replay {replay:.1} µs; \
                         warm-up peak {} B, arena {chunks} B ({lent} B lent; {reserved:?})",
                        self.size, self.q, self.arena_bytes
                    );
                }
                State::Ready(graph)
            }
            (recorded, graph) => {
                let why = match (recorded, graph) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => "the capture was empty".to_string(),
                };
                eprintln!(
                    "inferno: CUDA graph capture failed for batch {} × {} rows ({}); decoding without graphs",
                    self.size,
                    self.q,
                    why.lines().next().unwrap_or("")
                );
                State::Eager
            }
        };
        Ok(())
    }

    #[cfg(not(feature = "cuda"))]
    fn capture(&mut self, _model: &dyn BatchModel, _pool: &KvPool) -> anyhow::Result<()> {
        self.state = State::Eager;
        Ok(())
    }
}

/// The peak of allocations on `device`'s stream is recorded while this lives.
fn arena_measure(device: &Device) -> Option<Box<dyn std::any::Any>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => {
            Some(Box::new(crate::gpu::arena::measure(cuda.cuda_stream().cu_stream())))
        }
        _ => None,
    }
}

/// What the last [`arena_measure`] saw at its peak (0 without CUDA).
fn arena_peak() -> u64 {
    #[cfg(feature = "cuda")]
    return crate::gpu::arena::measured_peak();
    #[cfg(not(feature = "cuda"))]
    0
}

/// "N nodes: K kernels, …" of a captured graph (`INFERNO_GRAPH_STATS`, for performance work:
/// memory nodes between kernels cancel Programmatic Dependent Launch).
#[cfg(feature = "cuda")]
fn node_stats(graph: &candle_core::cuda_backend::cudarc::driver::CudaGraph) -> String {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let mut count = 0usize;
    // SAFETY: a count query (null array), then at most `count` handles into a vector that long.
    let mut nodes = Vec::new();
    unsafe {
        if sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut count)
            != sys::CUresult::CUDA_SUCCESS
        {
            return "node count unavailable".into();
        }
        nodes.resize(count, std::ptr::null_mut());
        if sys::cuGraphGetNodes(graph.cu_graph(), nodes.as_mut_ptr(), &mut count)
            != sys::CUresult::CUDA_SUCCESS
        {
            return format!("{count} nodes");
        }
    }
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for &node in &nodes[..count] {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` belongs to the graph; writes one enum.
        let ok = unsafe { sys::cuGraphNodeGetType(node, &mut kind) } == sys::CUresult::CUDA_SUCCESS;
        let name = if ok { format!("{kind:?}") } else { "unknown".into() };
        *kinds.entry(name.trim_start_matches("CU_GRAPH_NODE_TYPE_").to_lowercase()).or_default() +=
            1;
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!("{count} nodes: {}", parts.join(", "))
}

/// The GPU time of one replay, in µs: 50 replays back to back (the same inputs, so the same
/// KV writes and logits), after one to warm up.
#[cfg(feature = "cuda")]
fn replay_time(
    graph: &candle_core::cuda_backend::cudarc::driver::CudaGraph,
    stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> anyhow::Result<f64> {
    graph.launch()?;
    stream.synchronize()?;
    let t = std::time::Instant::now();
    for _ in 0..50 {
        graph.launch()?;
    }
    stream.synchronize()?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / 50.0)
}

/// candle uploads the dims and strides of some kernels on every call (a blocking copy each);
/// a decode step's shapes repeat, so let candle keep those uploads (graph capture needs that).
fn keep_uploads(device: &Device) -> Option<Box<dyn std::any::Any>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => Some(Box::new(cuda.enable_cuda_graph_htod_cache())),
        _ => None,
    }
}
