//! Gemma 3 split over tensor-parallel ranks in the Megatron layout (docs/tensor-parallel.md, "The
//! split"), as Llama is: rank r keeps its query heads' rows of q and their key/value heads' rows of
//! k and v, o_proj's columns for those heads, its slice of gate and up's rows and down's matching
//! columns, and its rows of the vocabulary (the embedding, and the tied head with it). The q/k
//! norms act per head and stay whole, as do the four layer norms; the post-attention and post-FFN
//! norms apply to o's and down's outputs summed over the ranks (`batched.rs`), which is why Gemma
//! needs the sum before its norm where Llama adds it to the stream. The score scale
//! (`query_pre_attn_scalar`) does not depend on the heads a rank keeps.
//! Dense weights only: a GGUF's blocks run along the inputs that o and down would split.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::config::Gemma3Config;
use super::model::{Fused, Gemma3, Layer, Weights};
use crate::dist::{Collective, Shard};
use crate::error::{ErrorKind, fail};
use crate::models::embedding::shard_ends;
use crate::models::linear::Linear;

/// The config of rank `shard`'s slice: its heads, key/value heads and intermediate rows.
pub fn local_config(cfg: &Gemma3Config, shard: Shard) -> anyhow::Result<Gemma3Config> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    Ok(Gemma3Config {
        num_heads: q.len(),
        num_kv_heads: kv.len(),
        intermediate_size: intermediate(cfg, shard)?.len(),
        ..cfg.clone()
    })
}

/// Rank `shard`'s rows of the intermediate dimension, balanced in units of up to 64.
fn intermediate(cfg: &Gemma3Config, shard: Shard) -> anyhow::Result<Range<usize>> {
    let i = cfg.intermediate_size;
    let unit = [64, 32, 16, 8, 1]
        .into_iter()
        .find(|&u| i.is_multiple_of(u) && i / u >= shard.world)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--tp {}: the intermediate size {i} is smaller than the ranks",
                shard.world
            )
        })?;
    let r = shard.balanced(i / unit);
    Ok(r.start * unit..r.end * unit)
}

impl Gemma3 {
    /// Rank `comm.shard()`'s slice of this model (whole, anywhere: loaded on the CPU), on
    /// `device`, with RoPE tables for as many positions; the whole embedding table too with
    /// `whole_embedding`.
    pub fn sharded(
        &self,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
        device: &Device,
    ) -> anyhow::Result<Gemma3> {
        let shard = comm.shard();
        let local = local_config(&self.cfg, shard)?;
        let w = shard_weights(&self.w, &self.cfg, shard, whole_embedding, device)?;
        let context = self.global_rope.0.dim(0)?;
        Ok(Gemma3::new(local, w, context, self.dtype, device)?.with_comm(comm))
    }
}

/// Rank `shard`'s slice of `w` (whole dense weights of `cfg`), on `device`.
pub fn shard_weights(
    w: &Weights,
    cfg: &Gemma3Config,
    shard: Shard,
    whole_embedding: bool,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    let mid = intermediate(cfg, shard)?;
    let (d, i) = (cfg.head_dim, cfg.intermediate_size);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let put = |t: Tensor| -> anyhow::Result<Tensor> { Ok(t.contiguous()?.to_device(device)?) };
    let heads = |r: &Range<usize>, at: usize| at + r.start * d..at + r.end * d;
    let rows = |t: &Tensor, r: Range<usize>| -> anyhow::Result<Linear> {
        Ok(Linear::Dense { weight: put(t.narrow(0, r.start, r.len())?)?, bias: None })
    };
    let cols = |l: &Linear, r: Range<usize>| -> anyhow::Result<Linear> {
        let weight = dense(l)?;
        Ok(Linear::Dense { weight: put(weight.narrow(1, r.start, r.len())?)?, bias: None })
    };
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in &w.layers {
        let qkv = fused(&l.qkv)?;
        let gate_up = fused(&l.gate_up)?;
        let shifted = |r: &Range<usize>| i + r.start..i + r.end;
        layers.push(Layer {
            input_norm: put(l.input_norm.clone())?,
            post_attn_norm: put(l.post_attn_norm.clone())?,
            pre_ffn_norm: put(l.pre_ffn_norm.clone())?,
            post_ffn_norm: put(l.post_ffn_norm.clone())?,
            q_norm: put(l.q_norm.clone())?,
            k_norm: put(l.k_norm.clone())?,
            qkv: Fused::new(vec![
                rows(&qkv, heads(&q, 0))?,
                rows(&qkv, heads(&kv, qd))?,
                rows(&qkv, heads(&kv, qd + kvd))?,
            ])?,
            o: cols(&l.o, heads(&q, 0))?,
            gate_up: Fused::new(vec![
                rows(&gate_up, mid.clone())?,
                rows(&gate_up, shifted(&mid))?,
            ])?,
            down: cols(&l.down, mid.clone())?,
        });
    }
    let (embed, head) = shard_ends(&w.embed, &w.head, shard, whole_embedding, device)?;
    Ok(Weights { embed, embed_dtype: w.embed_dtype, layers, head })
}

/// The stacked weight of fused dense products (`[Σ out, in]`).
fn fused(f: &Fused) -> anyhow::Result<Tensor> {
    match f {
        Fused::One(l) => Ok(dense(l)?.clone()),
        Fused::Parts(parts) => {
            let ws = parts.iter().map(dense).collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Tensor::cat(&ws, 0)?)
        }
    }
}

fn dense(l: &Linear) -> anyhow::Result<&Tensor> {
    match l {
        Linear::Dense { weight, bias: None } => Ok(weight),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            "--tp above 1 takes dense (safetensors or float GGUF) Gemma 3 weights; this one is quantized",
        )),
    }
}
