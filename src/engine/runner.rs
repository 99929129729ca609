//! One forward step for the whole batch: the scheduler's chunks become the model's
//! [`StepInput`] (token ids, positions, pool slots, block tables, as device tensors uploaded
//! once per step), the model runs, and each sampling sequence's next id is picked: greedy rows
//! by one argmax over all rows on the device, plain-temperature rows by a Gumbel draw on the
//! device, other settings on the host from the row's logits.

use candle_core::{Device, Tensor};

use super::graphs::{self, BucketGraph};
use super::kv::blocks::BlockManager;
use super::scheduler::Chunk;
use crate::generate::Sampler;
use crate::kernels::PagedBounds;
use crate::models::batch::{BatchModel, KvPool, KvShape, StepInput};

pub struct Runner {
    pub model: Box<dyn BatchModel>,
    pub pool: KvPool,
    pub shape: KvShape,
    /// Decode-step graphs by bucket size (empty on the CPU or with graphs off).
    pub graphs: std::collections::HashMap<usize, BucketGraph>,
}

/// What a sampling chunk needs to pick its token.
pub struct SampleSpec<'a> {
    pub sampler: &'a mut Sampler,
    /// The sequence so far (repetition penalties read it).
    pub history: &'a [u32],
}

impl Runner {
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
        let decode_only = !chunks.is_empty() && chunks.iter().all(|c| c.len == 1 && c.sample);
        if !decode_only || !graphs::enabled(self.model.device()) {
            return Ok(None);
        }
        let Some(size) = graphs::bucket(chunks.len()) else { return Ok(None) };
        if !self.graphs.contains_key(&size) {
            let groups = self.shape.group_windows.len();
            let g = BucketGraph::new(size, self.model.as_ref(), groups, self.pool.block_size)?;
            self.graphs.insert(size, g);
        }
        let ids: Vec<u32> = inputs.iter().map(|i| i[0]).collect();
        let Some(graph) = self.graphs.get_mut(&size) else { return Ok(None) };
        Ok(Some(graph.step(self.model.as_ref(), &self.pool, chunks, &ids, blocks)?))
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

/// The next id of each sampling row of `logits` (`[R, vocab]`, f32), by each row's sampler.
/// On a GPU, greedy and plain-temperature rows are drawn together in one launch pair (argmax, or
/// the Gumbel-max draw with the row's next seed); rows with other settings are copied to the
/// host and sampled there. On the CPU only greedy rows take the kernel.
pub fn sample_rows(logits: &Tensor, specs: &mut [SampleSpec]) -> anyhow::Result<Vec<u32>> {
    let cuda = logits.device().is_cuda();
    // Greedy with a penalty needs the penalised row: the host sampler does that.
    let on_device = |s: &SampleSpec| s.sampler.config().samples_on_device(cuda);
    let device_ids = if specs.iter().any(on_device) {
        let mut temps = Vec::with_capacity(specs.len());
        let mut seeds = Vec::with_capacity(specs.len());
        for s in specs.iter_mut() {
            if on_device(s) && !s.sampler.config().is_greedy() {
                temps.push(s.sampler.config().temperature);
                seeds.push(s.sampler.next_seed());
            } else {
                temps.push(0.0); // greedy (rows sampled on the host ignore this result)
                seeds.push(0);
            }
        }
        let ids = if temps.iter().all(|&t| t == 0.0) {
            crate::kernels::argmax_rows(logits)?
        } else {
            crate::kernels::sample_gumbel_rows(logits, &temps, &seeds)?
        };
        Some(ids.to_vec1::<u32>()?)
    } else {
        None
    };
    let mut out = Vec::with_capacity(specs.len());
    for (r, spec) in specs.iter_mut().enumerate() {
        let id = match &device_ids {
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
