//! One forward step for the whole batch: the scheduler's chunks become the model's
//! [`StepInput`] (token ids, positions, pool slots, block tables, as device tensors uploaded
//! once per step), the model runs, and each sampling sequence's next id is picked: on a GPU all
//! rows on the device in one chain of launches whatever their settings (argmax, a Gumbel draw, or
//! the full device sampler), on the CPU greedy rows by the argmax kernel and the rest on the host.

use candle_core::{Device, Tensor};

use super::graphs::{self, BucketGraph, GraphArena, StepIds};
use super::kv::blocks::BlockManager;
use super::scheduler::Chunk;
use crate::generate::{Sampler, SamplerConfig};
use crate::kernels::{PagedBounds, RowSampling};
use crate::models::batch::{BatchModel, KvPool, KvShape, StepInput};

pub struct Runner {
    pub model: Box<dyn BatchModel>,
    pub pool: KvPool,
    pub shape: KvShape,
    /// Decode-step graphs by bucket size (empty on the CPU or with graphs off).
    pub graphs: std::collections::HashMap<usize, BucketGraph>,
    /// The memory the graphs' steps allocate from, this engine's own.
    pub arena: GraphArena,
}

/// What a sampling chunk needs to pick its token.
pub struct SampleSpec<'a> {
    pub sampler: &'a mut Sampler,
    /// The sequence so far (repetition penalties read it).
    pub history: &'a [u32],
}

impl Runner {
    /// A runner with no decode graph captured yet.
    pub fn new(model: Box<dyn BatchModel>, pool: KvPool, shape: KvShape) -> Runner {
        Runner { model, pool, shape, graphs: Default::default(), arena: Default::default() }
    }

    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// Runs `chunks` (whose token ids are `inputs[i]`) and returns the logits of the sampling
    /// chunks' last rows, in chunk order (`None` when no chunk samples).
    pub fn forward(
        &mut self,
        chunks: &[Chunk],
        inputs: &[&[u32]],
        blocks: &BlockManager,
    ) -> anyhow::Result<Option<Tensor>> {
        if let Some(logits) = self.decode_graph(chunks, inputs, blocks)? {
            return Ok(Some(logits));
        }
        let step = self.step_input(chunks, inputs, blocks)?;
        let any_sample = chunks.iter().any(|c| c.sample);
        let logits = self.model.forward_batch(&step, &self.pool)?;
        Ok(any_sample.then_some(logits))
    }

    /// A step where every sequence decodes one token runs as its bucket's CUDA graph.
    fn decode_graph(
        &mut self,
        chunks: &[Chunk],
        inputs: &[&[u32]],
        blocks: &BlockManager,
    ) -> anyhow::Result<Option<Tensor>> {
        if !graphs::enabled(self.model.device()) {
            return Ok(None);
        }
        let Some(size) = decode_bucket(chunks) else { return Ok(None) };
        if !self.graphs.contains_key(&size) {
            let groups = self.shape.group_windows.len();
            let g = BucketGraph::new(
                size,
                self.model.as_ref(),
                groups,
                self.pool.block_size,
                &self.arena,
            )?;
            self.graphs.insert(size, g);
        }
        let ids: Vec<u32> = inputs.iter().map(|i| i[0]).collect();
        self.graph_step(size, chunks, StepIds::Host(&ids), blocks).map(Some)
    }

    /// A decode step whose input ids are the previous step's sampled ids, still on the device
    /// (u32 `[chunks.len()]`): the logits of its rows. `None` where no decode graph runs it.
    pub fn forward_after(
        &mut self,
        chunks: &[Chunk],
        ids: &Tensor,
        blocks: &BlockManager,
    ) -> anyhow::Result<Option<Tensor>> {
        match decode_bucket(chunks).filter(|size| self.graphs.contains_key(size)) {
            Some(size) => self.graph_step(size, chunks, StepIds::Device(ids), blocks).map(Some),
            None => Ok(None),
        }
    }

    fn graph_step(
        &mut self,
        size: usize,
        chunks: &[Chunk],
        ids: StepIds,
        blocks: &BlockManager,
    ) -> anyhow::Result<Tensor> {
        let Some(graph) = self.graphs.get_mut(&size) else {
            anyhow::bail!("runner: no decode graph for {size} rows")
        };
        graph.step(self.model.as_ref(), &self.pool, chunks, ids, blocks)
    }

    /// Whether `chunks` run as a decode graph that exists already (the pipelined decode needs
    /// it: only a graph step takes its ids from the device).
    pub fn has_graph_for(&self, chunks: &[Chunk]) -> bool {
        decode_bucket(chunks).is_some_and(|size| self.graphs.contains_key(&size))
    }

    fn step_input(
        &self,
        chunks: &[Chunk],
        inputs: &[&[u32]],
        blocks: &BlockManager,
    ) -> anyhow::Result<StepInput> {
        let dev = self.model.device();
        let groups = self.shape.group_windows.len();
        let total: usize = chunks.iter().map(|c| c.len).sum();
        let (mut tokens, mut positions) = (Vec::with_capacity(total), Vec::with_capacity(total));
        let mut slots = vec![Vec::with_capacity(total); groups];
        let (mut cu_q, mut q_pos, mut rows) = (vec![0u32], Vec::new(), Vec::new());
        let (mut max_q, mut max_ctx) = (0, 0);
        for (c, ids) in chunks.iter().zip(inputs) {
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
            if c.sample {
                rows.push(end - 1);
            }
            cu_q.push(end);
            q_pos.push(c.start as u32);
            max_q = max_q.max(c.len);
            max_ctx = max_ctx.max(c.start + c.len);
        }
        if rows.is_empty() {
            rows.push(0); // a row nobody reads: the head needs at least one
        }
        let mut tables = Vec::with_capacity(groups);
        for g in 0..groups {
            let width =
                chunks.iter().map(|c| blocks.table(c.id, g).len()).max().unwrap_or(0).max(1);
            let mut t = vec![u32::MAX; chunks.len() * width];
            for (i, c) in chunks.iter().enumerate() {
                let row = blocks.table(c.id, g);
                t[i * width..i * width + row.len()].copy_from_slice(row);
            }
            tables.push(Tensor::from_vec(t, (chunks.len(), width), dev)?);
        }
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
            bounds: PagedBounds { max_q_len: max_q, max_context: max_ctx },
        })
    }
}

/// The decode graph bucket of a step whose every chunk decodes one token and samples.
fn decode_bucket(chunks: &[Chunk]) -> Option<usize> {
    let decode_only = !chunks.is_empty() && chunks.iter().all(|c| c.len == 1 && c.sample);
    decode_only.then(|| graphs::bucket(chunks.len())).flatten()
}

/// The next id of each sampling row of `logits` (`[R, vocab]`, f32), by each row's sampler.
/// On a GPU every row is drawn on the device in one chain of launches: argmax when every row is
/// plain greedy, the Gumbel-max draw when every row is greedy or plain temperature, else the full
/// device sampler ([`crate::kernels::sample_rows`]: penalties, top-k, top-p, min-p), each row with
/// its sampler's next seed. On the CPU greedy rows take the argmax kernel and the others are
/// sampled on the host.
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
    let mut out = Vec::with_capacity(specs.len());
    for (r, spec) in specs.iter_mut().enumerate() {
        let id = match &greedy {
            Some(ids) if on_device(spec) => ids[r],
            _ => {
                let mut host = logits.get(r)?.to_vec1::<f32>()?;
                spec.sampler.sample(&mut host, spec.history)
            }
        };
        out.push(id);
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
    let ids = if specs.iter().all(|s| plain_greedy(s.sampler.config())) {
        crate::kernels::argmax_rows(logits)?
    } else if specs.iter().all(|s| {
        let c = s.sampler.config();
        plain_greedy(c) || (c.is_plain_temperature() && c.filter().inv_t > 0.0)
    }) {
        let mut temps = Vec::with_capacity(specs.len());
        let mut seeds = Vec::with_capacity(specs.len());
        for s in specs.iter_mut() {
            let greedy = s.sampler.config().is_greedy();
            temps.push(if greedy { 0.0 } else { s.sampler.config().temperature });
            seeds.push(if greedy { 0 } else { s.sampler.next_seed() });
        }
        crate::kernels::sample_gumbel_rows(logits, &temps, &seeds)?
    } else {
        let vocab = logits.dim(1)?;
        let rows: Vec<RowSampling> = specs
            .iter_mut()
            .map(|s| {
                let filter = s.sampler.config().filter();
                let seed = if s.sampler.config().is_greedy() { 0 } else { s.sampler.next_seed() };
                let penalties = s.sampler.penalties(s.history, vocab).to_vec();
                RowSampling { filter, seed, penalties }
            })
            .collect();
        crate::kernels::sample_rows(logits, &rows)?
    };
    Ok(ids)
}
