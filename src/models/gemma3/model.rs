//! The Gemma 3 model: its weights (q/k/v and gate/up fused where the formats allow), the two
//! RoPE tables (global base with its scaling, local base) and the LM head. The layers run in
//! `batched.rs` (the engine's step).
//!
//! Every norm weight is held as `1 + w` in f32, computed once at load from an HF checkpoint
//! (transformers' `Gemma3RMSNorm` multiplies by `1 + w` in f32) and taken as it is from a GGUF,
//! whose converter added the 1 already: the norms are then plain RMSNorms, the kernels' own.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::config::Gemma3Config;
use super::memory;
use crate::dist::Collective;
use crate::kernels::stack_quant;
use crate::models::batch::KvDtype;
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::memory::Measured;
use crate::models::rope;

/// Products that run together on one input: one fused weight (dense, or our GEMVs' blocks
/// stacked), or the parts side by side where they cannot be fused (candle's quantized
/// tensors).
#[derive(Clone)]
pub enum Fused {
    One(Linear),
    Parts(Vec<Linear>),
}

impl Fused {
    /// The parts fused where they can be.
    pub fn new(parts: Vec<Linear>) -> candle_core::Result<Fused> {
        let dense: Option<Vec<&Tensor>> = parts
            .iter()
            .map(|p| match p {
                Linear::Dense { weight, bias: None } => Some(weight),
                _ => None,
            })
            .collect();
        if let Some(w) = dense.filter(|w| w.iter().all(|t| t.dtype() == w[0].dtype())) {
            let weight = Tensor::cat(&w, 0)?;
            return Ok(Fused::One(Linear::Dense { weight, bias: None }));
        }
        let quant: Option<Vec<_>> = parts
            .iter()
            .map(|p| match p {
                Linear::Ct { weight, bias: None } => Some(weight.as_ref()),
                _ => None,
            })
            .collect();
        if let Some((all, _)) = quant.map(|q| stack_quant(&q)).transpose()?.flatten() {
            return Ok(Fused::One(Linear::Ct { weight: Arc::new(all), bias: None }));
        }
        Ok(Fused::Parts(parts))
    }

    /// The products side by side, f32 `[rows, Σ out]`.
    pub fn forward_f32(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Fused::One(l) => l.matmul_f32(x),
            Fused::Parts(parts) => {
                let outs = parts.iter().map(|p| p.matmul_f32(x)).collect::<Result<Vec<_>, _>>()?;
                Tensor::cat(&outs, 1)
            }
        }
    }

    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Fused::One(l) => vec![l],
            Fused::Parts(parts) => parts.iter().collect(),
        }
    }
}

#[derive(Clone)]
pub struct Layer {
    /// The four norms' `1 + w`, f32 `[hidden]`: input, post-attention, pre- and post-FFN.
    pub input_norm: Tensor,
    pub post_attn_norm: Tensor,
    pub pre_ffn_norm: Tensor,
    pub post_ffn_norm: Tensor,
    /// The q and k norms' `1 + w`, f32 `[head_dim]`, shared by the heads.
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    /// q, k, v: `[(heads + 2 kv_heads) · head_dim, hidden]`.
    pub qkv: Fused,
    pub o: Linear,
    /// gate, up: `[2 intermediate, hidden]`.
    pub gate_up: Fused,
    pub down: Linear,
}

#[derive(Clone)]
pub struct Weights {
    /// `[vocab, hidden]` (a rank's rows of it).
    pub embed: Embedding,
    /// The embedding table's dtype (the scale is rounded to it).
    pub embed_dtype: DType,
    pub layers: Vec<Layer>,
    /// The final norm (`1 + w`) and the LM head (the embedding's table when tied).
    pub head: Head,
}

/// The weights, the RoPE tables and the embedding's scale; keys and values live in the
/// engine's paged pool.
pub struct Gemma3 {
    pub(super) cfg: Gemma3Config,
    pub(super) w: Weights,
    /// f32 cos/sin `[positions, d/2]` of the global layers (base and scaling) and of the
    /// sliding ones (the local base), the same tensors when no layer slides.
    pub(super) global_rope: (Tensor, Tensor),
    pub(super) local_rope: (Tensor, Tensor),
    /// √hidden rounded to the embedding table's dtype, as transformers casts it
    /// (`Gemma3TextScaledWordEmbedding`): 34.0, not 33.94, for gemma-3-1b in bf16.
    pub(super) embed_scale: f64,
    pub(super) dtype: DType,
    pub(super) kv_dtype: KvDtype,
    pub(super) device: Device,
    pub(super) comm: Option<Arc<dyn Collective>>,
}

impl Gemma3 {
    /// Builds the model around loaded weights, with RoPE tables for `context` positions.
    pub fn new(
        cfg: Gemma3Config,
        w: Weights,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Gemma3> {
        let d = cfg.head_dim;
        let global = rope::inv_freq(&cfg.rope, cfg.rope_theta, d, 0);
        let global_rope = rope::tables(&global, 0, context, memory::ROPE_DTYPE, device)?;
        let local_rope = match cfg.has_sliding() {
            true => {
                let local = rope::inv_freq(&rope::RopeKind::Default, cfg.rope_local_theta, d, 0);
                rope::tables(&local, 0, context, memory::ROPE_DTYPE, device)?
            }
            false => global_rope.clone(),
        };
        let table_dtype = w.embed_dtype;
        let root = (cfg.hidden_size as f64).sqrt();
        let embed_scale = Tensor::new(&[root as f32], &Device::Cpu)?
            .to_dtype(table_dtype)?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?[0] as f64;
        Ok(Gemma3 {
            cfg,
            w,
            global_rope,
            local_rope,
            embed_scale,
            dtype,
            kv_dtype: KvDtype::Compute,
            device: device.clone(),
            comm: None,
        })
    }

    /// This model as rank `comm.shard()` of a sharded one (its weights already its slice).
    pub fn with_comm(self, comm: Arc<dyn Collective>) -> Gemma3 {
        Gemma3 { comm: Some(comm), ..self }
    }

    pub fn config(&self) -> &Gemma3Config {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The embedding's scale as applied (√hidden in the table's dtype).
    pub fn embed_scale(&self) -> f64 {
        self.embed_scale
    }

    pub(super) fn comm(&self) -> Option<&Arc<dyn Collective>> {
        self.comm.as_ref()
    }

    /// Layer `n`'s RoPE tables.
    pub(super) fn rope_of(&self, n: usize) -> &(Tensor, Tensor) {
        if self.cfg.sliding[n] { &self.local_rope } else { &self.global_rope }
    }

    /// Bytes of the RoPE tables (one pair when the layers share it).
    pub fn rope_bytes(&self) -> u64 {
        let mut m = Measured::default();
        for t in [&self.global_rope.0, &self.global_rope.1, &self.local_rope.0, &self.local_rope.1]
        {
            m.tensor(t);
        }
        m.total
    }

    /// Bytes of the weights, each tensor once (a tied LM head is the embedding).
    pub fn weight_bytes(&self) -> u64 {
        let mut m = Measured::default();
        self.w.embed.measure(&mut m);
        for l in &self.w.layers {
            let norms = [&l.input_norm, &l.post_attn_norm, &l.pre_ffn_norm, &l.post_ffn_norm];
            for t in norms.into_iter().chain([&l.q_norm, &l.k_norm]) {
                m.tensor(t);
            }
            for p in l.qkv.linears().into_iter().chain(l.gate_up.linears()) {
                m.linear(p);
            }
            m.linear(&l.o);
            m.linear(&l.down);
        }
        m.tensor(&self.w.head.norm);
        m.linear(&self.w.head.lm_head);
        m.total
    }
}
