//! gpt-oss split over tensor-parallel ranks (docs/tensor-parallel.md, "The split"): rank r keeps
//! its query heads' rows of q and their key/value heads' rows of k and v (biases with them), the
//! matching sinks, and o_proj's columns for those heads (its bias whole: it is added after the
//! sum); of every expert, its intermediate columns in whole MXFP4 blocks of 32 (gate/up rows
//! `2·start..2·end`, interleaved as the checkpoint keeps them; down's blocks along its input), with
//! the down biases on rank 0 only, so the sum adds them once; and its rows of the vocabulary, of
//! the LM head and of the embedding (`models::embedding`). Norms and router stay whole on every
//! rank. Every rank takes a slice of every expert rather than whole experts (expert parallel): at
//! one stream a layer would wait for the rank holding more of the token's 4 experts (120b at
//! `--tp 2`: 1.17× one GPU against 1.36×), and at 64 streams the two read the same bytes
//! (docs/performance.md, "Experts split, not spread").

use candle_core::{Device, Tensor};

use super::config::GptOssConfig;
use super::model::{Attention, Layer, Weights};
use crate::dist::Shard;
use crate::kernels::Mxfp4Experts;
use crate::models::embedding::shard_ends;
use crate::models::linear::Linear;

/// The config of rank `shard`'s slice: its heads, key/value heads and intermediate columns (the
/// vocabulary stays the model's: the logits are gathered whole).
pub fn local_config(cfg: &GptOssConfig, shard: Shard) -> anyhow::Result<GptOssConfig> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    let cols = shard.blocks_of_32(cfg.intermediate_size)?;
    Ok(GptOssConfig {
        num_heads: q.len(),
        num_kv_heads: kv.len(),
        intermediate_size: cols.len(),
        ..cfg.clone()
    })
}

/// Rank `shard`'s slice of `w` (whole weights of `cfg`, anywhere), on `device`; the whole
/// embedding table too with `whole_embedding`.
pub fn shard_weights(
    w: &Weights,
    cfg: &GptOssConfig,
    shard: Shard,
    whole_embedding: bool,
    device: &Device,
) -> anyhow::Result<Weights> {
    let (q, kv) = shard.heads(cfg.num_heads, cfg.num_kv_heads)?;
    let cols = shard.blocks_of_32(cfg.intermediate_size)?;
    let d = cfg.head_dim;
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let put = |t: &Tensor| -> anyhow::Result<Tensor> { Ok(t.contiguous()?.to_device(device)?) };
    // Rows `range` (in heads) of a fused q|k|v tensor's part starting at row `at`.
    let rows = |t: &Tensor, at: usize, heads: &std::ops::Range<usize>| {
        t.narrow(0, at + heads.start * d, heads.len() * d)
    };
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in &w.layers {
        let Linear::Dense { weight, bias: Some(bias) } = &l.attn.qkv else {
            anyhow::bail!("gpt-oss: the fused q/k/v projection must be dense with a bias")
        };
        let qkv_part = |t: &Tensor| -> anyhow::Result<Tensor> {
            let parts = [rows(t, 0, &q)?, rows(t, qd, &kv)?, rows(t, qd + kvd, &kv)?];
            put(&Tensor::cat(&parts, 0)?)
        };
        let Linear::Dense { weight: o_w, bias: o_b } = &l.attn.o else {
            anyhow::bail!("gpt-oss: o_proj must be dense")
        };
        let attn = Attention {
            qkv: Linear::Dense { weight: qkv_part(weight)?, bias: Some(qkv_part(bias)?) },
            o: Linear::Dense {
                weight: put(&o_w.narrow(1, q.start * d, q.len() * d)?)?,
                bias: o_b.as_ref().map(put).transpose()?,
            },
            sinks: put(&l.attn.sinks.narrow(0, q.start, q.len())?)?,
        };
        layers.push(Layer {
            attn_norm: put(&l.attn_norm)?,
            attn,
            mlp_norm: put(&l.mlp_norm)?,
            router_w: put(&l.router_w)?,
            router_b: put(&l.router_b)?,
            experts: shard_experts(&l.experts, cols.clone(), shard.rank == 0, device)?,
        });
    }
    let (embed, head) = shard_ends(&w.embed, &w.head, shard, whole_embedding, device)?;
    Ok(Weights { embed, layers, head })
}

/// Intermediate columns `cols` (whole blocks of 32) of every expert.
fn shard_experts(
    x: &Mxfp4Experts,
    cols: std::ops::Range<usize>,
    keep_down_bias: bool,
    device: &Device,
) -> anyhow::Result<Mxfp4Experts> {
    let [gu_blocks, gu_scales, gu_bias, d_blocks, d_scales, d_bias] = x.tensors();
    let put = |t: Tensor| -> anyhow::Result<Tensor> { Ok(t.contiguous()?.to_device(device)?) };
    let (rows, n) = (2 * cols.start, 2 * cols.len());
    let (b0, nb) = (cols.start / 32, cols.len() / 32);
    let down_bias = if keep_down_bias { d_bias.clone() } else { d_bias.zeros_like()? };
    Ok(Mxfp4Experts::new(
        &put(gu_blocks.narrow(1, rows, n)?)?,
        &put(gu_scales.narrow(1, rows, n)?)?,
        &put(gu_bias.narrow(1, rows, n)?)?,
        &put(d_blocks.narrow(2, b0, nb)?)?,
        &put(d_scales.narrow(2, b0, nb)?)?,
        &put(down_bias)?,
    )?)
}
