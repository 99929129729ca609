//! The gpt-oss forward pass (docs/gpt-oss.md §4). Attention and the experts are inferno's own ops
//! (`crate::kernels`: CUDA kernels on a GPU, their plain-loop references on the CPU); the rest
//! is candle tensor ops. Routing stays on the device: no host round-trip inside a step. The
//! layers run in `batched.rs` (the engine's step). Per layer: RMSNorm → attention (q/k/v/o with biases, YaRN RoPE on
//! half-split pairs, GQA, one learned sink logit per query head in the softmax denominator, a
//! 128-key sliding window on sliding layers) → residual → RMSNorm → router (top-k on the raw
//! logits, softmax over those k) → experts (MXFP4, interleaved gate/up, clamped SwiGLU with the
//! +1, per-expert biases) → weighted sum → residual. The residual stream is f32.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::config::GptOssConfig;
use super::memory;
use crate::dist::Collective;
use crate::kernels::{Mxfp4Experts, SwiGlu};
use crate::models::batch::KvDtype;
use crate::models::embedding::Embedding;
use crate::models::head::Head;
use crate::models::linear::Linear;
use crate::models::rope;

pub struct Attention {
    /// q, k and v projections as one (rows q then k then v): one GEMM and one bias add where
    /// there were three of each, which a decode step feels.
    pub qkv: Linear,
    pub o: Linear,
    /// `[heads]`, f32.
    pub sinks: Tensor,
}

impl Attention {
    /// From the checkpoint's separate dense projections (with biases).
    pub fn new(
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        sinks: Tensor,
    ) -> anyhow::Result<Attention> {
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        for p in [q, k, v] {
            match p {
                Linear::Dense { weight, bias: Some(bias) } => {
                    weights.push(weight);
                    biases.push(bias);
                }
                _ => anyhow::bail!("gpt-oss attention projections must be dense with biases"),
            }
        }
        // Biases in f32: the projections' products stay f32 (Linear::forward_f32) until RoPE
        // has run, and converting them on every call would be a launch each.
        let f32_bias = |b: &Tensor| b.to_dtype(DType::F32);
        let qkv = Linear::Dense {
            weight: Tensor::cat(&weights, 0)?,
            bias: Some(f32_bias(&Tensor::cat(&biases, 0)?)?),
        };
        let o = match o {
            Linear::Dense { weight, bias } => {
                Linear::Dense { weight, bias: bias.as_ref().map(f32_bias).transpose()? }
            }
            _ => anyhow::bail!("gpt-oss o_proj must be dense"),
        };
        Ok(Attention { qkv, o, sinks })
    }
}

pub struct Layer {
    pub attn_norm: Tensor,
    pub attn: Attention,
    pub mlp_norm: Tensor,
    /// Router weight `[experts, hidden]` and bias `[experts]`, f32 (docs/gpt-oss.md pitfall #5:
    /// near-ties).
    pub router_w: Tensor,
    pub router_b: Tensor,
    /// Packed MXFP4 weights and biases of every expert.
    pub experts: Mxfp4Experts,
}

pub struct Weights {
    pub embed: Embedding,
    pub layers: Vec<Layer>,
    /// Final norm and LM head.
    pub head: Head,
}

/// The weights and RoPE tables; keys and values live in the engine's paged pool.
pub struct GptOss {
    cfg: GptOssConfig,
    w: Weights,
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    /// How the engine's KV pool stores keys and values.
    kv_dtype: KvDtype,
    device: Device,
    /// The other ranks, when this is one rank's slice of the model (`shard.rs`).
    comm: Option<Arc<dyn Collective>>,
}

impl GptOss {
    /// The model around loaded weights, with RoPE tables for `context` positions.
    pub fn new(
        cfg: GptOssConfig,
        w: Weights,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<GptOss> {
        let inv_freq = rope::inv_freq(&cfg.rope, cfg.rope_theta, cfg.head_dim, 0);
        let (cos, sin) = rope::scaled_tables(
            &inv_freq,
            cfg.rope.attention_scaling(),
            0,
            context,
            memory::ROPE_DTYPE,
            device,
        )?;
        let kv_dtype = KvDtype::Compute;
        Ok(GptOss { cfg, w, cos, sin, dtype, kv_dtype, device: device.clone(), comm: None })
    }

    /// Rank `comm.shard()`'s slice of this model (whole, anywhere: loaded on the CPU), on
    /// `device`, with its RoPE tables' positions and its dtype: tensor parallelism (`shard.rs`);
    /// with `whole_embedding` the rank keeps the whole embedding table too (an EAGLE-3 head reads
    /// it).
    pub fn sharded(
        &self,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
        device: &Device,
    ) -> anyhow::Result<GptOss> {
        let shard = comm.shard();
        let local = super::shard::local_config(&self.cfg, shard)?;
        let w = super::shard::shard_weights(&self.w, &self.cfg, shard, whole_embedding, device)?;
        let context = self.cos.dim(0)?;
        Ok(GptOss::new(local, w, context, self.dtype, device)?.with_comm(comm))
    }

    /// This model as rank `comm.shard()` of a sharded one (its weights already its slice).
    pub fn with_comm(self, comm: Arc<dyn Collective>) -> GptOss {
        GptOss { comm: Some(comm), ..self }
    }

    /// The other ranks of a sharded model.
    pub fn comm(&self) -> Option<&Arc<dyn Collective>> {
        self.comm.as_ref()
    }

    /// Bytes of the RoPE tables.
    pub fn rope_bytes(&self) -> usize {
        [&self.cos, &self.sin].iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    /// Bytes of the weights, each tensor once (a tied LM head is the embedding).
    pub fn weight_bytes(&self) -> u64 {
        let mut m = crate::models::memory::Measured::default();
        self.w.embed.measure(&mut m);
        for l in &self.w.layers {
            for t in [&l.attn_norm, &l.mlp_norm, &l.router_w, &l.router_b, &l.attn.sinks] {
                m.tensor(t);
            }
            m.linear(&l.attn.qkv);
            m.linear(&l.attn.o);
            l.experts.tensors().into_iter().for_each(|t| m.tensor(t));
        }
        m.tensor(&self.w.head.norm);
        m.linear(&self.w.head.lm_head);
        m.total
    }

    /// The bytes of the experts' weights, and of the other weights a one-token step reads
    /// (all but the embedding table, of which it reads one row, unless it is also the LM head).
    pub fn expert_bytes(&self) -> (u64, u64) {
        let mut experts = crate::models::memory::Measured::default();
        for l in &self.w.layers {
            l.experts.tensors().into_iter().for_each(|t| experts.tensor(t));
        }
        let mut embed = crate::models::memory::Measured::default();
        if !self.w.embed.is_head(&self.w.head.lm_head) {
            self.w.embed.measure(&mut embed);
        }
        let row = if embed.total > 0 { self.w.embed.row_bytes() } else { 0 };
        let rest = self.weight_bytes().saturating_sub(experts.total + embed.total) + row;
        (experts.total, rest)
    }

    pub fn config(&self) -> &GptOssConfig {
        &self.cfg
    }

    pub(super) fn device(&self) -> &Device {
        &self.device
    }

    pub(super) fn weights(&self) -> &Weights {
        &self.w
    }

    /// The KV pool's dtype.
    pub(super) fn kv_pool_dtype(&self) -> DType {
        self.kv_dtype.pool_dtype(self.dtype)
    }

    pub(super) fn set_kv(&mut self, kv: KvDtype) {
        self.kv_dtype = kv;
    }

    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The f32 RoPE tables `[positions, d/2]`.
    pub(super) fn rope_tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }
}

/// Router and experts for `h` (`[seq, hidden]`, f32) and `h_experts`, the same rounded to the
/// compute dtype; returns the f32 MoE output (zero on rows from `live_rows` on: padding). The
/// router runs in f32 on the f32 normed residual (docs/gpt-oss.md pitfall #5: near-ties);
/// routing (top-k, softmax over the k) is fused into the experts' op.
pub(super) fn moe(
    cfg: &GptOssConfig,
    layer: &Layer,
    h: &Tensor,
    h_experts: &Tensor,
    live_rows: Option<&Tensor>,
) -> anyhow::Result<Tensor> {
    let logits = crate::kernels::router_logits(h, &layer.router_w)?;
    let act = SwiGlu { limit: cfg.swiglu_limit, alpha: cfg.swiglu_alpha };
    Ok(crate::kernels::mxfp4_moe_routed(
        h_experts,
        &layer.experts,
        &logits,
        &layer.router_b,
        cfg.experts_per_token,
        act,
        live_rows,
    )?)
}
