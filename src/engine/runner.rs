//! One forward step for the whole batch: the scheduler's chunks become the model's
//! [`StepInput`] (token ids, positions, pool slots, block tables, as device tensors uploaded
//! once per step), the model runs, and each sampling sequence's next id is picked: on a GPU all
//! rows on the device in one chain of launches whatever their settings (argmax, a Gumbel draw, or
//! the full device sampler), on the CPU greedy rows by the argmax kernel and the rest on the host.
//! A model split by vocabulary over ranks whose step draws only greedy or plain-temperature rows
//! draws them on the ranks instead ([`Runner::forward_drawn`]): each rank's best candidates of its
//! own logits, gathered and picked, so that the logits never leave their GPUs.

use candle_core::{DType, Device, Tensor};

use super::graphs::{self, BucketGraph, GraphArena, StepIds};
use super::kv::blocks::{INVALID, SeqId, Tables};
use super::ranks::{self, Followers, StepOp, draw_on_ranks};
use super::scheduler::Chunk;
use crate::generate::{Sampler, SamplerConfig};
use crate::kernels::invariance;
use crate::kernels::{PagedBounds, RowSampling};
use crate::models::batch::{BatchModel, KvPool, KvShape, StepInput};

pub struct Runner {
    /// The other ranks of a tensor-parallel model, on rank 0: each step is sent to them before
    /// it runs ([`super::ranks`]). Fields drop in order: the ranks stop first, then the graphs
    /// (which may hold the model's collectives) go before the model.
    pub followers: Option<Box<dyn Followers>>,
    /// Decode-step graphs by (bucket size, rows per sequence, whether it taps) (empty on the
    /// CPU or with graphs off).
    pub graphs: std::collections::HashMap<GraphKey, BucketGraph>,
    pub model: Box<dyn BatchModel>,
    pub pool: KvPool,
    pub shape: KvShape,
    /// The memory the graphs' steps allocate from, this engine's own.
    pub arena: GraphArena,
    /// Layers whose entering residual stream each step keeps for an EAGLE-3 head (empty:
    /// none, and the forward pass keeps nothing).
    pub taps: Vec<usize>,
    /// Whether the next step keeps `taps`: not where none of its sequences is drafted for by
    /// the head, whose steps then run without (a graph of each kind).
    pub keep_taps: bool,
    /// The last step's taps, one row per token in chunk order ([`BatchModel::forward_taps`]);
    /// `None` without taps.
    pub last_taps: Option<Tensor>,
    /// Steps run so far, for `INFERNO_PROFILE_FROM_STEP`.
    steps: u64,
}

/// What a sampling chunk needs to pick its tokens: one row, or one per draft and one more.
pub struct SampleSpec<'a> {
    pub sampler: &'a mut Sampler,
    /// The sequence so far and then the drafts its rows verify (repetition penalties read it:
    /// row `j` sees everything before draft `j`).
    pub history: &'a [u32],
    /// Drafts at the end of `history`; the chunk samples `drafts + 1` rows.
    pub drafts: usize,
    /// Index in the reply of the token its first row draws ([`Sampler::seek`]): row `j` draws
    /// token `index + j`, as plain decoding would.
    pub index: u64,
}

impl<'a> SampleSpec<'a> {
    /// Row `j`'s history: the sequence and the drafts before row `j`'s.
    fn history_of(&self, j: usize) -> &'a [u32] {
        &self.history[..self.history.len() - self.drafts + j]
    }
}

/// What a step gives its sampling rows.
pub enum StepOut {
    /// f32 `[R, vocab]`, to be drawn from.
    Logits(Tensor),
    /// u32 `[R]`: the ids the ranks drew ([`draw_on_ranks`]).
    Ids(Tensor),
}

impl StepOut {
    /// The logits; an error for ids (a step asked for logits gets them).
    pub fn logits(self) -> anyhow::Result<Tensor> {
        match self {
            StepOut::Logits(l) => Ok(l),
            StepOut::Ids(_) => anyhow::bail!("runner: a step drawn on the ranks has no logits"),
        }
    }
}

/// Each row's `(1/T, seed)` (1/T = 0: greedy, the seed its sampler's at the row's token index)
/// where every row of `specs` is plain greedy or, on a GPU (`cuda`), plain temperature: the
/// Gumbel-max draw, which [`device_ids`] makes from these and which the ranks of a model split
/// by vocabulary make from their own logits alike (the CPU samples temperature rows on the host).
/// `None` where a row needs the whole logits (penalties, top-k, top-p, min-p).
pub fn plain_draws(specs: &mut [SampleSpec], cuda: bool) -> Option<Vec<(f32, u64)>> {
    let mut draws = Vec::new();
    for s in specs.iter_mut() {
        let c = s.sampler.config();
        let greedy = c.is_greedy() && c.is_unpenalised();
        let plain_temperature = cuda && c.is_plain_temperature() && c.filter().inv_t > 0.0;
        if !(greedy || plain_temperature) {
            return None;
        }
        for j in 0..=s.drafts {
            s.sampler.seek(s.index + j as u64);
            // As sample_gumbel_rows turns each row's temperature into 1/T.
            let inv_t = if greedy { 0.0 } else { 1.0 / s.sampler.config().temperature };
            draws.push((inv_t, if greedy { 0 } else { s.sampler.next_seed() }));
        }
    }
    Some(draws)
}

impl Runner {
    /// A runner with no decode graph captured yet.
    pub fn new(model: Box<dyn BatchModel>, pool: KvPool, shape: KvShape) -> Runner {
        Runner {
            model,
            pool,
            shape,
            graphs: Default::default(),
            arena: Default::default(),
            followers: None,
            taps: Vec::new(),
            keep_taps: true,
            last_taps: None,
            steps: 0,
        }
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Runs `chunks` (whose token ids are `inputs[i]`) and returns the logits of the sampling
    /// chunks' sampled rows ([`Chunk::sampled_rows`]), in chunk order (`None` when no chunk
    /// samples).
    pub fn forward<T: AsRef<[u32]>>(
        &mut self,
        chunks: &[Chunk],
        inputs: &[T],
        blocks: &dyn Tables,
    ) -> anyhow::Result<Option<Tensor>> {
        self.forward_drawn(chunks, inputs, blocks, None)?.map(StepOut::logits).transpose()
    }

    /// [`Runner::forward`], whose sampling rows are drawn on the ranks by `draws` (each row's
    /// `(1/T, seed)`, [`plain_draws`]) where the model is split over ranks; elsewhere `draws`
    /// is ignored and the step gives its logits.
    pub fn forward_drawn<T: AsRef<[u32]>>(
        &mut self,
        chunks: &[Chunk],
        inputs: &[T],
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<Option<StepOut>> {
        self.count_step();
        let trace = self.trace("forward", chunks);
        let draws = self.draws_here(chunks, draws)?;
        let out = self.forward_untraced(chunks, inputs, blocks, draws);
        self.traced(trace, out)
    }

    /// `draws` where this model draws on ranks (one per sampled row of `chunks`), else `None`.
    fn draws_here<'d>(
        &self,
        chunks: &[Chunk],
        draws: Option<&'d [(f32, u64)]>,
    ) -> anyhow::Result<Option<&'d [(f32, u64)]>> {
        let Some(d) = draws.filter(|_| self.model.collective().is_some()) else { return Ok(None) };
        let rows: usize = chunks.iter().filter(|c| c.sample).map(|c| c.sampled_rows()).sum();
        anyhow::ensure!(d.len() == rows, "runner: {} draws for {rows} sampled rows", d.len());
        Ok((rows > 0).then_some(d))
    }

    /// Counts a step, and starts the CUDA profiler before the one `INFERNO_PROFILE_FROM_STEP`
    /// names: a profiler that times each kernel alone then skips the loading, the prefill and the
    /// graphs' capture.
    fn count_step(&mut self) {
        self.steps += 1;
        if crate::switches::profile_from_step() == Some(self.steps) {
            crate::gpu::profiler_start(self.model.device());
        }
    }

    /// With `INFERNO_TP_TRACE`, on a sharded model: the step's number, said before it runs.
    fn trace(&self, kind: &str, chunks: &[Chunk]) -> Option<u64> {
        static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let c = self.model.collective().filter(|_| crate::switches::tp_trace())?;
        let n = STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let parts: Vec<String> =
            chunks.iter().map(|c| format!("{}@{}+{}", c.id, c.start, c.len)).collect();
        eprintln!("inferno tp rank {}: step {n} {kind} [{}]", c.shard().rank, parts.join(" "));
        Some(n)
    }

    /// The end of a traced step, once the GPU has run it.
    fn traced<R>(&self, step: Option<u64>, out: anyhow::Result<R>) -> anyhow::Result<R> {
        if let (Some(n), Some(c)) = (step, self.model.collective()) {
            let synced = self.model.device().synchronize();
            eprintln!("inferno tp rank {}: step {n} done ({:?})", c.shard().rank, synced.err());
        }
        out
    }

    fn forward_untraced<T: AsRef<[u32]>>(
        &mut self,
        chunks: &[Chunk],
        inputs: &[T],
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<Option<StepOut>> {
        if let Some(f) = &mut self.followers {
            let ids: Vec<&[u32]> = inputs.iter().map(|i| i.as_ref()).collect();
            let groups = self.shape.group_windows.len();
            f.send(ranks::encode(false, chunks, &ids, blocks, groups, draws))?;
        }
        // A step that verifies drafts gives each row its one-row bits (followers decide alike,
        // from the same chunks; a verify graph is captured and replayed under the same rule).
        let _verifying = invariance::Step::new(chunks.iter().any(|c| c.drafts > 0));
        if let Some(out) = self.decode_graph(chunks, inputs, blocks, draws)? {
            return Ok(Some(out));
        }
        let mut step = self.step_input(chunks, inputs, blocks)?;
        step.local_logits = draws.is_some();
        let any_sample = chunks.iter().any(|c| c.sample);
        self.last_taps = None;
        let logits = if self.step_taps().is_empty() {
            self.model.forward_batch(&step, &self.pool)?
        } else {
            let (logits, taps) = self.model.forward_taps(&step, &self.pool, &self.taps)?;
            self.last_taps = taps;
            logits
        };
        if let Some(d) = draws {
            let words = crate::kernels::upload_u32(&crate::kernels::draw_words(d), self.device())?;
            return Ok(Some(StepOut::Ids(draw_on_ranks(self.model.as_ref(), &logits, &words)?)));
        }
        Ok(any_sample.then_some(StepOut::Logits(logits)))
    }

    /// A step where every sequence decodes one token, or verifies the same number of drafts,
    /// runs as its bucket's CUDA graph.
    fn decode_graph<T: AsRef<[u32]>>(
        &mut self,
        chunks: &[Chunk],
        inputs: &[T],
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<Option<StepOut>> {
        if !graphs::enabled(self.model.device()) {
            return Ok(None);
        }
        let Some(key) = self.graph_key(chunks, draws.is_some()) else { return Ok(None) };
        if !self.graphs.contains_key(&key) {
            let groups = self.shape.group_windows.len();
            let g = BucketGraph::new(
                (key.0, key.1),
                key.3,
                self.model.as_ref(),
                groups,
                self.pool.block_size,
                &self.arena,
            )?
            .with_taps(self.step_taps());
            self.graphs.insert(key, g);
        }
        let ids: Vec<u32> = inputs.iter().flat_map(|i| i.as_ref().iter().copied()).collect();
        self.graph_step(key, chunks, StepIds::Host(&ids), blocks, draws).map(Some)
    }

    /// A decode step whose input ids are the previous step's sampled ids, still on the device
    /// (u32 `[chunks.len()]`): the logits of its rows, or with `draws` on a model split over
    /// ranks their ids ([`Runner::forward_drawn`]). `None` where no decode graph runs it.
    pub fn forward_after(
        &mut self,
        chunks: &[Chunk],
        ids: &Tensor,
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<Option<StepOut>> {
        let draws = self.draws_here(chunks, draws)?;
        let Some(key) = self
            .graph_key(chunks, draws.is_some())
            .filter(|k| k.1 == 1 && self.graphs.contains_key(k))
        else {
            return Ok(None);
        };
        if let Some(f) = &mut self.followers {
            let groups = self.shape.group_windows.len();
            f.send(ranks::encode(true, chunks, &[], blocks, groups, draws))?;
        }
        self.count_step();
        let trace = self.trace("forward_after", chunks);
        let out = self.graph_step(key, chunks, StepIds::Device(ids), blocks, draws).map(Some);
        self.traced(trace, out)
    }

    fn graph_step(
        &mut self,
        key: GraphKey,
        chunks: &[Chunk],
        ids: StepIds,
        blocks: &dyn Tables,
        draws: Option<&[(f32, u64)]>,
    ) -> anyhow::Result<StepOut> {
        let Some(graph) = self.graphs.get_mut(&key) else {
            anyhow::bail!("runner: no decode graph for {key:?}")
        };
        let out = graph.step(self.model.as_ref(), &self.pool, chunks, ids, blocks, draws)?;
        // A copy: the next replay rewrites the graph's buffer.
        let rows = chunks.len() * key.1;
        self.last_taps = graph.taps(rows).map(|t| t?.copy()).transpose()?;
        // A graph given draws draws its ids on the ranks (it refuses draws otherwise).
        Ok(if draws.is_some() { StepOut::Ids(out) } else { StepOut::Logits(out) })
    }

    /// Whether `chunks` run as a decode graph that exists already (the pipelined decode needs
    /// it: only a graph step takes its ids from the device), drawn on the ranks or not.
    pub fn has_graph_for(&self, chunks: &[Chunk], drawn: bool) -> bool {
        self.graph_key(chunks, drawn)
            .is_some_and(|key| key.1 == 1 && self.graphs.contains_key(&key))
    }

    /// Whether this model's steps may draw on its ranks ([`Runner::forward_drawn`]).
    pub fn draws_on_ranks(&self) -> bool {
        self.model.collective().is_some()
    }

    /// The layers this step taps: none unless it keeps its taps.
    fn step_taps(&self) -> &[usize] {
        if self.keep_taps { &self.taps } else { &[] }
    }

    /// The decode graph that runs `chunks` now ([`decode_bucket`]), tapping or not, drawing on
    /// the ranks or not.
    fn graph_key(&self, chunks: &[Chunk], drawn: bool) -> Option<GraphKey> {
        decode_bucket(chunks).map(|(b, q)| (b, q, !self.step_taps().is_empty(), drawn))
    }

    fn step_input<T: AsRef<[u32]>>(
        &self,
        chunks: &[Chunk],
        inputs: &[T],
        blocks: &dyn Tables,
    ) -> anyhow::Result<StepInput> {
        let dev = self.model.device();
        let groups = self.shape.group_windows.len();
        let total: usize = chunks.iter().map(|c| c.len).sum();
        let (mut tokens, mut positions) = (Vec::with_capacity(total), Vec::with_capacity(total));
        let mut slots = vec![Vec::with_capacity(total); groups];
        let (mut cu_q, mut q_pos, mut rows) = (vec![0u32], Vec::new(), Vec::new());
        let (mut max_q, mut max_ctx) = (0, 0);
        for (c, ids) in chunks.iter().zip(inputs) {
            let ids = ids.as_ref();
            anyhow::ensure!(
                ids.len() == c.len,
                "runner: chunk of {} tokens, {} ids",
                c.len,
                ids.len()
            );
            tokens.extend_from_slice(ids);
            for pos in c.start..c.start + c.len {
                positions.push(pos as u32);
                for (g, s) in slots.iter_mut().enumerate() {
                    s.push(blocks.slot(c.id, g, pos).ok_or_else(|| {
                        anyhow::anyhow!(
                            "runner: no KV slot for position {pos} of sequence {}",
                            c.id
                        )
                    })?);
                }
            }
            let end = tokens.len() as u32;
            rows.extend(end - c.sampled_rows() as u32..end);
            cu_q.push(end);
            q_pos.push(c.start as u32);
            max_q = max_q.max(c.len);
            max_ctx = max_ctx.max(c.start + c.len);
        }
        if rows.is_empty() {
            rows.push(0); // a row nobody reads: the head needs at least one
        }
        let ids: Vec<_> = chunks.iter().map(|c| c.id).collect();
        let tables = (0..groups)
            .map(|g| block_tables(blocks, &ids, g, dev))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let n = tokens.len();
        Ok(StepInput {
            tokens: Tensor::from_vec(tokens, n, dev)?,
            positions: Tensor::from_vec(positions, n, dev)?,
            slots: slots
                .into_iter()
                .map(|s| Tensor::from_vec(s, n, dev))
                .collect::<Result<_, _>>()?,
            tables,
            cu_q: Tensor::new(cu_q.as_slice(), dev)?,
            q_pos: Tensor::new(q_pos.as_slice(), dev)?,
            logit_rows: Tensor::new(rows.as_slice(), dev)?,
            live_rows: None,
            bounds: PagedBounds { max_q_len: max_q, max_context: max_ctx },
            local_logits: false,
        })
    }

    /// On a rank other than 0: runs each step rank 0 sends (`next` gives its words,
    /// [`ranks::encode`]) until the stop.
    pub fn follow(
        &mut self,
        mut next: impl FnMut() -> anyhow::Result<Vec<u32>>,
    ) -> anyhow::Result<()> {
        loop {
            match ranks::decode(&next()?)? {
                StepOp::Forward { chunks, inputs, tables, draws } => {
                    self.forward_drawn(&chunks, &inputs, &tables, draws.as_deref())?;
                }
                StepOp::ForwardAfter { chunks, tables, draws } => {
                    // Rank 0's ids overwrite these (the broadcast in front of the step).
                    let rows: usize = chunks.iter().map(|c| c.len).sum();
                    let ids = Tensor::zeros(rows, DType::U32, self.device())?;
                    let ran = self.forward_after(&chunks, &ids, &tables, draws.as_deref())?;
                    anyhow::ensure!(
                        ran.is_some(),
                        "rank: no decode graph for a step rank 0 ran as one"
                    );
                }
                StepOp::Stop => {
                    if crate::switches::tp_trace() {
                        eprintln!("inferno tp: a rank stops");
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// The block tables of sequences `ids` in group `g` as one u32 tensor `[ids.len(), width]`,
/// each row padded with [`INVALID`] to the longest (a step's `tables`).
pub(crate) fn block_tables(
    blocks: &dyn Tables,
    ids: &[SeqId],
    g: usize,
    dev: &Device,
) -> candle_core::Result<Tensor> {
    let width = ids.iter().map(|&id| blocks.table(id, g).len()).max().unwrap_or(0).max(1);
    let mut t = vec![INVALID; ids.len() * width];
    for (i, &id) in ids.iter().enumerate() {
        let row = blocks.table(id, g);
        t[i * width..i * width + row.len()].copy_from_slice(row);
    }
    Tensor::from_vec(t, (ids.len(), width), dev)
}

/// A decode graph's bucket size, rows per sequence, whether it taps, and whether it draws its
/// ids on the ranks.
type GraphKey = (usize, usize, bool, bool);

/// The decode graph of a step whose every chunk samples all its rows, and has as many as the
/// others (one token, or the last token and the same number of drafts): (bucket, rows per
/// sequence).
fn decode_bucket(chunks: &[Chunk]) -> Option<(usize, usize)> {
    let q = chunks.first()?.len;
    let uniform = chunks.iter().all(|c| c.len == q && c.sample && c.sampled_rows() == q);
    uniform.then(|| graphs::bucket(chunks.len(), q).map(|b| (b, q))).flatten()
}

/// The id each sampling row of `logits` (`[R, vocab]`, f32; `specs` in row order, each with its
/// `drafts + 1` rows) draws, by its chunk's sampler at the row's token index. On a GPU every row
/// is drawn on the device in one chain of launches: argmax when every row is plain greedy, the
/// Gumbel-max draw when every row is greedy or plain temperature, else the full device sampler
/// ([`crate::kernels::sample_rows`]: penalties, top-k, top-p, min-p). On the CPU greedy rows take
/// the argmax kernel and the others are sampled on the host.
pub fn sample_rows(logits: &Tensor, specs: &mut [SampleSpec]) -> anyhow::Result<Vec<u32>> {
    if logits.device().is_cuda() {
        return device_rows(logits, specs);
    }
    let on_device = |s: &SampleSpec| s.sampler.config().samples_on_device(false);
    let greedy = if specs.iter().any(on_device) {
        Some(crate::kernels::argmax_rows(logits)?.to_vec1::<u32>()?)
    } else {
        None
    };
    let mut out = Vec::with_capacity(logits.dim(0)?);
    for spec in specs.iter_mut() {
        for j in 0..=spec.drafts {
            let r = out.len();
            let id = match &greedy {
                Some(ids) if on_device(spec) => ids[r],
                _ => {
                    let mut host = logits.get(r)?.to_vec1::<f32>()?;
                    spec.sampler.seek(spec.index + j as u64);
                    let history = spec.history_of(j);
                    spec.sampler.sample(&mut host, history)
                }
            };
            out.push(id);
        }
    }
    Ok(out)
}

/// Every row on the device (see [`sample_rows`]).
fn device_rows(logits: &Tensor, specs: &mut [SampleSpec]) -> anyhow::Result<Vec<u32>> {
    Ok(device_ids(logits, specs)?.to_vec1::<u32>()?)
}

/// The ids [`sample_rows`] draws on a GPU, left on the device (u32 `[R]`).
pub fn device_ids(logits: &Tensor, specs: &mut [SampleSpec]) -> anyhow::Result<Tensor> {
    let plain_greedy = |c: &SamplerConfig| c.is_greedy() && c.is_unpenalised();
    if specs.iter().all(|s| plain_greedy(s.sampler.config())) {
        return Ok(crate::kernels::argmax_rows(logits)?);
    }
    if let Some(draws) = plain_draws(specs, true) {
        return Ok(crate::kernels::draw_rows(logits, &draws)?);
    }
    let vocab = logits.dim(1)?;
    let mut rows: Vec<RowSampling> = Vec::with_capacity(logits.dim(0)?);
    for s in specs.iter_mut() {
        for j in 0..=s.drafts {
            // The row's seed: its sampler's at the row's token index (0 for a greedy row).
            s.sampler.seek(s.index + j as u64);
            let greedy = s.sampler.config().is_greedy();
            let seed = if greedy { 0 } else { s.sampler.next_seed() };
            let filter = s.sampler.config().filter();
            let history = s.history_of(j);
            let penalties = s.sampler.penalties(history, vocab).to_vec();
            rows.push(RowSampling { filter, seed, penalties });
        }
    }
    Ok(crate::kernels::sample_rows(logits, &rows)?)
}
