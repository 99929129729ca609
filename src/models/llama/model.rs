//! The Llama model: its weights (q/k/v and gate/up fused, `fuse.rs`), RoPE tables and LM head.
//! The layers run in `batched.rs` (the engine's step): RMSNorm → GQA attention with RoPE over the
//! paged KV pool → RMSNorm → SwiGLU MLP, residuals around both; final norm and LM head on the
//! rows that sample.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::config::LlamaConfig;
use super::fuse::Fused;
use super::memory;
use crate::dist::Collective;
use crate::models::batch::KvDtype;
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::rope;

pub use super::config::RopeStyle;

#[derive(Clone)]
pub struct Layer {
    /// Norm weights are f32 (the norms run in f32).
    pub attn_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    /// q's and k's per-head RMSNorm weights `[head_dim]` (f32), where the variant has them.
    pub qk_norm: Option<(Tensor, Tensor)>,
    pub v: Linear,
    pub o: Linear,
    pub mlp_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    /// q/k/v and gate/up fused ([`Layer::fuse`]), the parts above then views into them.
    pub fused: Fused,
}

#[derive(Clone)]
pub struct Weights {
    /// `[vocab, hidden]` (a rank's rows of it), dense in the compute dtype.
    pub embed: Embedding,
    pub layers: Vec<Layer>,
    /// Final norm and LM head.
    pub head: Head,
}

/// The weights, their fused products and the RoPE tables; keys and values live in the engine's
/// paged pool.
pub struct Llama {
    cfg: LlamaConfig,
    w: Weights,
    rope_style: RopeStyle,
    inv_freq: Vec<f32>,
    /// f32 cos/sin for every position (the batched path rotates in f32, as gpt-oss does).
    rope: (Tensor, Tensor),
    dtype: DType,
    /// How the engine's KV pool stores keys and values.
    kv_dtype: KvDtype,
    device: Device,
    /// The other ranks, when this is one rank's slice of the model (`shard.rs`).
    comm: Option<Arc<dyn Collective>>,
}

impl Llama {
    /// Builds the model around loaded weights, with RoPE tables for `context` positions.
    pub fn new(
        cfg: LlamaConfig,
        w: Weights,
        rope_style: RopeStyle,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Llama> {
        anyhow::ensure!(
            memory::has_rope_tables(&cfg),
            "dynamic NTK RoPE (angles that depend on the sequence length) is not supported by the batched engine"
        );
        let inv_freq = rope::inv_freq(&cfg.rope, cfg.rope_theta, cfg.head_dim, 0);
        let w = f32_head(w, dtype)?;
        let scale = cfg.rope.attention_scaling();
        let rope = rope::scaled_tables(&inv_freq, scale, 0, context, memory::ROPE_DTYPE, device)?;
        let kv_dtype = KvDtype::Compute;
        Ok(Llama {
            cfg,
            w,
            rope_style,
            inv_freq,
            rope,
            dtype,
            kv_dtype,
            device: device.clone(),
            comm: None,
        })
    }

    /// Rank `comm.shard()`'s slice of this model (whole, anywhere: loaded on the CPU), on
    /// `device`, with its RoPE tables' positions, pairing and dtype: tensor parallelism
    /// (`shard.rs`); with `whole_embedding` the rank keeps the whole embedding table too (an
    /// EAGLE-3 head reads it).
    pub fn sharded(
        &self,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
        device: &Device,
    ) -> anyhow::Result<Llama> {
        let shard = comm.shard();
        let local = super::shard::local_config(&self.cfg, shard)?;
        let w = super::shard::shard_weights(&self.w, &self.cfg, shard, whole_embedding, device)?;
        let (style, context) = (self.rope_style, self.rope.0.dim(0)?);
        Ok(Llama::new(local, w, style, context, self.dtype, device)?.with_comm(comm))
    }

    /// This model as rank `comm.shard()` of a sharded one (its weights already its slice).
    pub fn with_comm(self, comm: Arc<dyn Collective>) -> Llama {
        Llama { comm: Some(comm), ..self }
    }

    /// The other ranks of a sharded model.
    pub fn comm(&self) -> Option<&Arc<dyn Collective>> {
        self.comm.as_ref()
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The KV pool's dtype.
    pub fn kv_pool_dtype(&self) -> DType {
        self.kv_dtype.pool_dtype(self.dtype)
    }

    pub(super) fn set_kv(&mut self, kv: KvDtype) {
        self.kv_dtype = kv;
    }

    /// Bytes of the RoPE tables.
    pub fn rope_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        bytes(&self.rope.0) + bytes(&self.rope.1)
    }

    /// Bytes of the weights, each tensor once (a tied LM head is the embedding; the separate
    /// projections are views of the fused ones).
    pub fn weight_bytes(&self) -> u64 {
        let mut m = crate::models::memory::Measured::default();
        self.w.embed.measure(&mut m);
        for l in &self.w.layers {
            m.tensor(&l.attn_norm);
            m.tensor(&l.mlp_norm);
            if let Some((q, k)) = &l.qk_norm {
                m.tensor(q);
                m.tensor(k);
            }
            for p in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                m.linear(p);
            }
        }
        m.tensor(&self.w.head.norm);
        m.linear(&self.w.head.lm_head);
        m.total
    }

    pub(super) fn weights(&self) -> &Weights {
        &self.w
    }

    pub(super) fn rope_style(&self) -> RopeStyle {
        self.rope_style
    }

    pub(super) fn device_ref(&self) -> &Device {
        &self.device
    }

    /// Layer `n`'s fused products.
    pub(super) fn fused(&self, n: usize) -> Option<&Fused> {
        self.w.layers.get(n).map(|l| &l.fused)
    }

    /// The f32 RoPE tables `[positions, d/2]`.
    pub(super) fn rope_f32(&self) -> &(Tensor, Tensor) {
        &self.rope
    }

    /// The inverse frequencies in use (for tests).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }
}

/// Logits rounded to bf16 have a spacing of 0.125 at typical magnitudes (16–32), which turns
/// close calls into ties and costs top-1 agreement with the f32 reference (measured on SmolLM2:
/// 5% of positions have a reference margin below 0.125). A bf16 head has its f32-out product
/// (`Head::logits`); an f16 head keeps an f32 copy when it is small enough
/// ([`memory::keeps_f32_head`]).
fn f32_head(mut w: Weights, dtype: DType) -> anyhow::Result<Weights> {
    if let Linear::Dense { weight, bias } = &w.head.lm_head
        && memory::keeps_f32_head(weight.elem_count() as u64, dtype)
    {
        let weight = weight.to_dtype(DType::F32)?;
        let bias = bias.as_ref().map(|b| b.to_dtype(DType::F32)).transpose()?;
        w.head.lm_head = Linear::Dense { weight, bias };
    }
    Ok(w)
}
