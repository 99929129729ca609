//! The batched forward pass every architecture offers the engine: the tokens of several
//! sequences packed in one step (prefill chunks and decode tokens mixed), their keys and values
//! in a paged pool owned outside the model. The model knows nothing of requests: it gets
//! positions, pool slots and block tables as device tensors and returns the logits of the rows
//! asked for. Nothing about a step's launches depends on data held on the device, so a step of a
//! fixed shape can be captured in a CUDA graph and replayed with other contents.

use candle_core::{DType, Device, Tensor};

use crate::kernels::PagedBounds;

/// How the KV cache stores keys and values (`--kv-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum KvDtype {
    /// The compute dtype's (bf16; f32 where the model computes in f32).
    #[default]
    Compute,
    /// E4M3 codes with one power-of-two scale per (token, kv head) ([`crate::kernels::kv_fp8`]):
    /// about half the bytes, so about twice the tokens.
    Fp8,
    /// INT8 codes, the same layout and scales: the same bytes, closer to bf16.
    Int8,
}

impl KvDtype {
    /// `bf16` (the compute dtype's), `fp8` or `int8`; one line for anything else.
    pub fn parse(s: &str) -> anyhow::Result<KvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(KvDtype::Compute),
            "fp8" => Ok(KvDtype::Fp8),
            "int8" => Ok(KvDtype::Int8),
            other => Err(crate::error::fail(
                crate::error::ErrorKind::InvalidInput,
                format!("unknown KV dtype {other:?} (use bf16, fp8 or int8)"),
            )),
        }
    }

    /// The pools' dtype for a model computing in `compute`.
    pub fn pool_dtype(self, compute: DType) -> DType {
        match self {
            KvDtype::Compute => compute,
            KvDtype::Fp8 => DType::F8E4M3,
            KvDtype::Int8 => DType::U8,
        }
    }
}

/// How a model's attention layers share KV block tables: one group per kind of layer (gpt-oss:
/// full and sliding-window layers; Llama: one group), each with its own pool and tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvShape {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
    /// Per group: the sliding window (keys `t > P − W`), `None` for full attention.
    pub group_windows: Vec<Option<usize>>,
    /// Per layer: its group.
    pub layer_group: Vec<usize>,
}

impl KvShape {
    /// Bytes one token's keys and values take in one layer (codes: and a scale byte per kv
    /// head).
    pub fn bytes_per_token_layer(&self) -> u64 {
        let scale = usize::from(self.coded());
        2 * (self.kv_heads * (self.head_dim * self.dtype.size_in_bytes() + scale)) as u64
    }

    /// Whether the pools hold 8-bit codes with scales (fp8, int8).
    pub fn coded(&self) -> bool {
        crate::kernels::kv_fp8::Codes::of(self.dtype).is_some()
    }

    /// Layers in group `g`.
    pub fn layers_in(&self, g: usize) -> usize {
        self.layer_group.iter().filter(|&&x| x == g).count()
    }

    /// Bytes of a pool of `blocks[g]` blocks of `block_size` tokens for each group (what
    /// [`KvPool::new`] allocates), saturating.
    pub fn pool_bytes(&self, block_size: usize, blocks: &[usize]) -> u64 {
        let per_token = self.bytes_per_token_layer();
        super::memory::sum(blocks.iter().enumerate().map(|(g, &n)| {
            let tokens = (n as u64).saturating_mul(block_size as u64);
            tokens.saturating_mul(per_token).saturating_mul(self.layers_in(g) as u64)
        }))
    }
}

/// The device KV memory: per layer, keys and values `[slots, kv_heads, d]`, where slot
/// `block · block_size + offset` holds one token. Layers of one group have the same slot count.
/// A slot's scales live in the same slot of the scale tensors, so a block of the prefix cache
/// carries them.
pub struct KvPool {
    pub block_size: usize,
    /// Per layer (keys, values).
    pub layers: Vec<(Tensor, Tensor)>,
    /// Pools of codes (fp8, int8): per layer, the keys' and values' scales `[slots, kv_heads]`
    /// (u8). Empty otherwise.
    pub scales: Vec<(Tensor, Tensor)>,
}

impl KvPool {
    /// Allocates `blocks[g]` blocks for each group's layers (zeroed: a slot never written holds
    /// finite values, though no query reads one).
    pub fn new(
        shape: &KvShape,
        block_size: usize,
        blocks: &[usize],
        device: &Device,
    ) -> anyhow::Result<KvPool> {
        anyhow::ensure!(
            blocks.len() == shape.group_windows.len(),
            "KV pool: {} group sizes for {} groups",
            blocks.len(),
            shape.group_windows.len()
        );
        let mut layers = Vec::with_capacity(shape.layer_group.len());
        let mut scales = Vec::new();
        for &g in &shape.layer_group {
            let dims = (blocks[g] * block_size, shape.kv_heads, shape.head_dim);
            let k = Tensor::zeros(dims, shape.dtype, device)?;
            let v = Tensor::zeros(dims, shape.dtype, device)?;
            layers.push((k, v));
            if shape.coded() {
                let dims = (dims.0, dims.1);
                scales.push((
                    Tensor::zeros(dims, DType::U8, device)?,
                    Tensor::zeros(dims, DType::U8, device)?,
                ));
            }
        }
        Ok(KvPool { block_size, layers, scales })
    }

    /// Layer `n`'s scales, for pools of codes.
    pub fn scales(&self, n: usize) -> Option<(&Tensor, &Tensor)> {
        self.scales.get(n).map(|(k, v)| (k, v))
    }

    /// Bytes the pool holds on the device.
    pub fn bytes(&self) -> u64 {
        let bytes = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let pairs = self.layers.iter().chain(&self.scales);
        pairs.map(|(k, v)| bytes(k) + bytes(v)).sum()
    }
}

/// One step's inputs, on the model's device. `T` tokens of `S` sequences: sequence `s` owns
/// rows `cu_q[s]..cu_q[s + 1]`, its first at position `q_pos[s]`, the rest consecutive.
pub struct StepInput {
    /// u32 `[T]`.
    pub tokens: Tensor,
    /// u32 `[T]`: each token's position (its RoPE row).
    pub positions: Tensor,
    /// Per group, u32 `[T]`: the pool slot each token's key and value go to (`u32::MAX`: none,
    /// a padding row).
    pub slots: Vec<Tensor>,
    /// Per group, u32 `[S, max_blocks]`: each sequence's block table.
    pub tables: Vec<Tensor>,
    /// u32 `[S + 1]`.
    pub cu_q: Tensor,
    /// u32 `[S]`.
    pub q_pos: Tensor,
    /// u32 `[R]`: the rows whose logits are wanted (each sequence's last, when it samples).
    pub logit_rows: Tensor,
    /// u32 `[1]`, on the device: rows from this one on belong to a decode graph's padding
    /// sequences, whose outputs nobody reads; a model may skip work for them that costs
    /// bytes (gpt-oss routes them to no expert). `None`: every row is live.
    pub live_rows: Option<Tensor>,
    /// Host-side bounds that fix the attention launches.
    pub bounds: PagedBounds,
    /// A model split by vocabulary returns its own piece of the logits, `[R, ceil(vocab /
    /// world)]`, not gathered: the ranks draw the step's ids themselves
    /// (`engine::ranks::draw_on_ranks`). Ignored by a model on one rank.
    pub local_logits: bool,
}

/// A model the engine can batch.
pub trait BatchModel {
    /// The KV layout the pool must have.
    fn kv_shape(&self) -> KvShape;
    /// Runs the step (writing its keys and values into `kv`) and returns the f32 logits of
    /// `step.logit_rows`, `[R, vocab]`.
    fn forward_batch(&self, step: &StepInput, kv: &KvPool) -> anyhow::Result<Tensor> {
        Ok(self.forward_taps(step, kv, &[])?.0)
    }
    /// [`BatchModel::forward_batch`] that also returns, for every row of the step, the f32
    /// residual stream entering each layer of `taps` ([`BatchModel::tap_layers`]: the last
    /// layer's output, before the final norm), side by side: `[T, taps.len() · hidden]`, `None`
    /// when `taps` is empty. What an EAGLE-3 head reads, from the one forward pass: the logits
    /// are the same bits with taps or without.
    fn forward_taps(
        &self,
        step: &StepInput,
        kv: &KvPool,
        taps: &[usize],
    ) -> anyhow::Result<(Tensor, Option<Tensor>)>;
    fn vocab_size(&self) -> usize;
    /// The width of the hidden states (an EAGLE-3 head's input).
    fn hidden_size(&self) -> usize;
    /// Positions the RoPE tables cover: the longest sequence.
    fn max_positions(&self) -> usize;
    fn device(&self) -> &Device;
    /// Rows a step may hold with each row's logits the bits a one-row step gives it
    /// ([`crate::kernels::invariance`]): speculative decoding verifies within it.
    fn invariant_rows(&self) -> usize;
    /// The other ranks, when the model is one rank's slice (tensor parallelism): every rank
    /// runs the same steps, and a step's inputs that only rank 0 holds reach the others through
    /// it.
    fn collective(&self) -> Option<&std::sync::Arc<dyn crate::dist::Collective>> {
        None
    }
    /// Stores the KV cache as `kv` says (the pools [`BatchModel::kv_shape`] asks for).
    fn set_kv_dtype(&mut self, kv: KvDtype);
    /// The bytes its weights and RoPE tables hold (what memory plans predict; the KV pool is
    /// the engine's, [`KvShape::pool_bytes`]).
    fn allocated(&self) -> super::memory::Allocated;
    /// Its decoder layers, the taps [`BatchModel::forward_taps`] can take (`0..=tap_layers()`).
    fn tap_layers(&self) -> usize;
    /// The whole token embedding `[vocab, hidden]` (an EAGLE-3 head without its own shares it);
    /// `None` on a tensor-parallel rank that keeps only its rows.
    fn embedding(&self) -> Option<&Tensor>;
    /// What a step of several rows of one sequence costs against one row, for the length of
    /// its drafts ([`crate::engine::spec::length`]): a dense model reads its weights once for
    /// all rows, all of them a step (its embedding too, where one row of it is read: a draft
    /// model's cost errs high by that share).
    fn step_cost(&self) -> crate::models::step_cost::StepCost {
        crate::models::step_cost::StepCost::dense(self.allocated().weights)
    }
}

/// The residual streams a forward pass keeps for [`BatchModel::forward_taps`]: with no tap
/// asked for, [`Taps::see`] only scans an empty list.
pub struct Taps<'a> {
    ids: &'a [usize],
    found: Vec<Option<Tensor>>,
}

impl<'a> Taps<'a> {
    /// Keeps the streams entering layers `ids` (none: keeps nothing).
    pub fn new(ids: &'a [usize]) -> Taps<'a> {
        Taps { ids, found: vec![None; ids.len()] }
    }

    /// `x` is the stream entering layer `layer`.
    pub fn see(&mut self, layer: usize, x: &Tensor) {
        for (id, slot) in self.ids.iter().zip(&mut self.found) {
            if *id == layer {
                *slot = Some(x.clone());
            }
        }
    }

    /// The kept streams side by side (`None` when none was asked for); an error when a layer
    /// asked for was never seen.
    pub fn finish(self) -> anyhow::Result<Option<Tensor>> {
        if self.ids.is_empty() {
            return Ok(None);
        }
        let parts = self.found.into_iter().zip(self.ids).map(|(t, id)| {
            t.ok_or_else(|| anyhow::anyhow!("hidden-state tap: the model has no layer {id}"))
        });
        let parts = parts.collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some(Tensor::cat(&parts, 1)?))
    }
}
