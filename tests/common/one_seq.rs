//! One sequence through a model's batched forward pass, as the engine runs it: its keys and
//! values in a paged pool through a block table ([`BlockManager`]), each call one step of the
//! engine's [`Runner`] (on a GPU a decode step replays the runner's CUDA graph), or one
//! [`BatchModel::forward_batch`] with every row's logits (teacher-forced evaluation). The
//! reference tests drive the models through this, with no scheduler in between.

use candle_core::{Device, Tensor};
use inferno::engine::core::EngineConfig;
use inferno::engine::kv::blocks::{BlockConfig, BlockManager, GroupSpec};
use inferno::engine::pool::{BLOCK_SIZE, pool_groups};
use inferno::engine::runner::Runner;
use inferno::engine::scheduler::Chunk;
use inferno::kernels::PagedBounds;
use inferno::models::batch::{BatchModel, KvPool, StepInput};

/// The sequence's id in the block manager.
const ID: u64 = 0;

pub struct OneSeq {
    pub runner: Runner,
    blocks: BlockManager,
    /// The longest step: longer inputs run in steps of this many tokens (the engine's token
    /// budget does the same to a long prompt).
    pub chunk: usize,
}

impl OneSeq {
    /// The pool an engine of one sequence as long as the model's RoPE tables allocates (what
    /// the memory plan counts).
    pub fn new(model: Box<dyn BatchModel>) -> OneSeq {
        let shape = model.kv_shape();
        let groups: Vec<GroupSpec> =
            pool_groups(&shape, &EngineConfig::single(model.max_positions()).pool());
        let per_group: Vec<usize> = groups.iter().map(|g| g.blocks).collect();
        let pool = KvPool::new(&shape, BLOCK_SIZE, &per_group, model.device()).expect("KV pool");
        let mut manager =
            BlockManager::new(BlockConfig { block_size: BLOCK_SIZE, groups }).expect("blocks");
        assert_eq!(manager.add_sequence(ID, &[]), 0);
        let runner = Runner::new(model, pool, shape);
        OneSeq { runner, blocks: manager, chunk: inferno::engine::core::DEFAULT_TOKEN_BUDGET }
    }

    pub fn model(&self) -> &dyn BatchModel {
        self.runner.model.as_ref()
    }

    pub fn device(&self) -> &Device {
        self.runner.device()
    }

    /// Runs `tokens` at positions `start..` (everything before `start` already run; 0 starts
    /// the sequence afresh) through the runner, as the engine does; the f32 logits of the last
    /// position, `[vocab]`.
    pub fn forward_last(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let mut logits = None;
        for (i, piece) in tokens.chunks(self.chunk).enumerate() {
            let at = start + i * self.chunk;
            self.before(at, piece.len())?;
            let c = Chunk { id: ID, start: at, len: piece.len(), sample: true, drafts: 0 };
            logits = self.runner.forward(&[c], &[piece], &self.blocks)?;
        }
        let Some(logits) = logits else { anyhow::bail!("no tokens to run") };
        // A decode step's logits are a view of the CUDA graph's output buffer, which the next
        // replay overwrites (the engine samples before then); callers here keep them.
        Ok(logits.squeeze(0)?.copy()?)
    }

    /// [`OneSeq::forward_last`] by the model's own per-op step (never a CUDA graph).
    pub fn forward_last_plain(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let all = self.steps(tokens, start, false)?;
        Ok(all.squeeze(0)?)
    }

    /// The f32 logits of every position of `tokens`, `[len, vocab]`.
    pub fn forward_all(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        self.steps(tokens, start, true)
    }

    fn steps(&mut self, tokens: &[u32], start: usize, every_row: bool) -> anyhow::Result<Tensor> {
        anyhow::ensure!(!tokens.is_empty(), "no tokens to run");
        let mut out = Vec::new();
        for (i, piece) in tokens.chunks(self.chunk).enumerate() {
            let at = start + i * self.chunk;
            self.before(at, piece.len())?;
            let step = self.step_input(piece, at, every_row)?;
            out.push(self.runner.model.forward_batch(&step, &self.runner.pool)?);
        }
        if !every_row {
            return Ok(out.pop().expect("one step at least"));
        }
        Ok(Tensor::cat(&out, 0)?)
    }

    /// Slots for positions `at..at + len`, as the scheduler gets them: blocks no query from
    /// `at` on can see are released first (sliding groups), and a sequence starting again at 0
    /// starts afresh.
    fn before(&mut self, at: usize, len: usize) -> anyhow::Result<()> {
        if at == 0 {
            self.blocks.add_sequence(ID, &[]);
        }
        self.blocks.release_out_of_window(ID, at);
        Ok(self.blocks.ensure(ID, at, at + len)?)
    }

    /// One step of `tokens` at `start`: the last row's logits, or every row's.
    fn step_input(
        &self,
        tokens: &[u32],
        start: usize,
        every_row: bool,
    ) -> anyhow::Result<StepInput> {
        let dev = self.device().clone();
        let n = tokens.len();
        let groups = self.runner.shape.group_windows.len();
        let positions: Vec<u32> = (start..start + n).map(|p| p as u32).collect();
        let slots = (0..groups)
            .map(|g| {
                let s: Vec<u32> = (start..start + n)
                    .map(|p| self.blocks.slot(ID, g, p).expect("a slot"))
                    .collect();
                Tensor::from_vec(s, n, &dev)
            })
            .collect::<Result<_, _>>()?;
        let tables = (0..groups)
            .map(|g| {
                let t = self.blocks.table(ID, g).to_vec();
                let len = t.len();
                Tensor::from_vec(t, (1, len), &dev)
            })
            .collect::<Result<_, _>>()?;
        let rows: Vec<u32> = if every_row { (0..n as u32).collect() } else { vec![n as u32 - 1] };
        Ok(StepInput {
            tokens: Tensor::new(tokens, &dev)?,
            positions: Tensor::from_vec(positions, n, &dev)?,
            slots,
            tables,
            cu_q: Tensor::new(&[0u32, n as u32], &dev)?,
            q_pos: Tensor::new(&[start as u32], &dev)?,
            logit_rows: Tensor::new(rows.as_slice(), &dev)?,
            live_rows: None,
            bounds: PagedBounds { max_q_len: n, max_context: start + n },
            local_logits: false,
        })
    }
}
