//! Llama split over tensor-parallel ranks in the Megatron layout (docs/tensor-parallel.md, "The
//! split"): rank r keeps its query heads' rows of q and their key/value heads' rows of k and v,
//! o_proj's columns for those heads, its slice of gate and up's rows (the intermediate dimension)
//! and down's matching columns, and its rows of the vocabulary, of the LM head and of the embedding
//! (`models::embedding`). Biases of q/k/v and gate/up go with their rows; o and down's are added
//! once, after the sum. Norms stay whole (q/k's per-head ones too).
//! Dense weights only: a quantized checkpoint's blocks run along the inputs that o and down
//! would split.

use candle_core::{Device, Tensor};

use super::config::LlamaConfig;
use super::model::{Layer, Weights};
use crate::dist::Shard;
use crate::models::embedding::shard_ends;
use crate::models::linear::Linear;

/// The config of rank `shard`'s slice: its heads, key/value heads and intermediate rows (the
/// vocabulary stays the model's: the logits are gathered whole).
pub fn local_config(cfg: &LlamaConfig, shard: Shard) -> anyhow::Result<LlamaConfig> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    Ok(LlamaConfig {
        num_heads: q.len(),
        num_kv_heads: kv.len(),
        intermediate_size: intermediate(cfg, shard)?.len(),
        ..cfg.clone()
    })
}

/// Rank `shard`'s rows of the intermediate dimension: balanced in units of up to 64, so each
/// slice keeps the alignment the products' vector loads like.
fn intermediate(cfg: &LlamaConfig, shard: Shard) -> anyhow::Result<std::ops::Range<usize>> {
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

/// Rank `shard`'s slice of `w` (whole dense weights of `cfg`, anywhere), on `device`; the whole
/// embedding table too with `whole_embedding`.
pub fn shard_weights(
    w: &Weights,
    cfg: &LlamaConfig,
    shard: Shard,
    whole_embedding: bool,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    let mid = intermediate(cfg, shard)?;
    let d = cfg.head_dim;
    let put = |t: Tensor| -> anyhow::Result<Tensor> { Ok(t.contiguous()?.to_device(device)?) };
    // Rows `r` of a projection (and of its bias).
    let rows = |l: &Linear, r: std::ops::Range<usize>| -> anyhow::Result<Linear> {
        let (weight, bias) = dense(l)?;
        Ok(Linear::Dense {
            weight: put(weight.narrow(0, r.start, r.len())?)?,
            bias: bias.map(|b| put(b.narrow(0, r.start, r.len())?)).transpose()?,
        })
    };
    // Columns `r` of a row-parallel projection; its bias whole (added after the sum).
    let cols = |l: &Linear, r: std::ops::Range<usize>| -> anyhow::Result<Linear> {
        let (weight, bias) = dense(l)?;
        Ok(Linear::Dense {
            weight: put(weight.narrow(1, r.start, r.len())?)?,
            bias: bias.cloned().map(put).transpose()?,
        })
    };
    let heads = |r: &std::ops::Range<usize>| r.start * d..r.end * d;
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in &w.layers {
        let layer = Layer {
            attn_norm: put(l.attn_norm.clone())?,
            q: rows(&l.q, heads(&q))?,
            k: rows(&l.k, heads(&kv))?,
            // One weight for every head: whole on each rank.
            qk_norm: match &l.qk_norm {
                Some((qn, kn)) => Some((put(qn.clone())?, put(kn.clone())?)),
                None => None,
            },
            v: rows(&l.v, heads(&kv))?,
            o: cols(&l.o, heads(&q))?,
            mlp_norm: put(l.mlp_norm.clone())?,
            gate: rows(&l.gate, mid.clone())?,
            up: rows(&l.up, mid.clone())?,
            down: cols(&l.down, mid.clone())?,
            fused: Default::default(),
        };
        layers.push(layer.fuse()?);
    }
    let (embed, head) = shard_ends(&w.embed, &w.head, shard, whole_embedding, device)?;
    Ok(Weights { embed, layers, head })
}

fn dense(l: &Linear) -> anyhow::Result<(&Tensor, Option<&Tensor>)> {
    match l {
        Linear::Dense { weight, bias } => Ok((weight, bias.as_ref())),
        _ => Err(crate::error::fail(
            crate::error::ErrorKind::InvalidInput,
            "--tp above 1 takes dense (safetensors or float GGUF) Llama weights; this checkpoint is quantized",
        )),
    }
}
