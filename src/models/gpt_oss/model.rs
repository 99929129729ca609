//! The gpt-oss forward pass (gpt-oss.md §4), written with plain tensor ops: the reference path
//! that runs on any device. Per layer: RMSNorm → attention (q/k/v/o with biases, YaRN RoPE on
//! half-split pairs, GQA, one learned sink logit per query head in the softmax denominator, a
//! 128-key sliding window on sliding layers) → residual → RMSNorm → router (top-k on the raw
//! logits, softmax over those k) → experts (MXFP4, interleaved gate/up, clamped SwiGLU with the
//! +1, per-expert biases) → weighted sum → residual. The residual stream is f32.

use candle_core::{D, DType, Device, IndexOp, Tensor};

use super::config::GptOssConfig;
use super::mxfp4::Mxfp4Experts;
use crate::models::CausalLm;
use crate::models::kv_cache::KvCache;
use crate::models::linear::Linear;
use crate::models::rope;

pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// `[heads]`, f32.
    pub sinks: Tensor,
}

pub struct Experts {
    pub gate_up: Mxfp4Experts,
    /// `[experts, 2·intermediate]`, f32.
    pub gate_up_bias: Tensor,
    pub down: Mxfp4Experts,
    /// `[experts, hidden]`, f32.
    pub down_bias: Tensor,
}

pub struct Layer {
    pub attn_norm: Tensor,
    pub attn: Attention,
    pub mlp_norm: Tensor,
    /// Router weight `[experts, hidden]` and bias `[experts]`, f32 (pitfall #5: near-ties).
    pub router_w: Tensor,
    pub router_b: Tensor,
    pub experts: Experts,
}

pub struct Weights {
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub lm_head: Linear,
}

pub struct GptOss {
    cfg: GptOssConfig,
    w: Weights,
    caches: Vec<KvCache>,
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    device: Device,
}

impl GptOss {
    pub fn new(cfg: GptOssConfig, w: Weights, context: usize, dtype: DType, device: &Device) -> anyhow::Result<GptOss> {
        let caches = (0..cfg.num_layers)
            .map(|_| KvCache::new(cfg.num_kv_heads, context, cfg.head_dim, dtype, device))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let inv_freq = rope::inv_freq(&cfg.rope, cfg.rope_theta, cfg.head_dim, 0);
        let (cos, sin) = rope::scaled_tables(&inv_freq, cfg.rope.attention_scaling(), 0, context, dtype, device)?;
        Ok(GptOss { cfg, w, caches, cos, sin, dtype, device: device.clone() })
    }

    pub fn config(&self) -> &GptOssConfig {
        &self.cfg
    }

    fn hidden(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let seq = tokens.len();
        let capacity = self.context_length();
        anyhow::ensure!(seq > 0, "no tokens to run");
        anyhow::ensure!(start + seq <= capacity, "context full: {} positions requested, {capacity} available", start + seq);
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.w.embed.index_select(&ids, 0)?.to_dtype(DType::F32)?;
        let cos = self.cos.narrow(0, start, seq)?;
        let sin = self.sin.narrow(0, start, seq)?;
        let eps = self.cfg.rms_norm_eps;
        for (n, (layer, cache)) in self.w.layers.iter().zip(self.caches.iter_mut()).enumerate() {
            let window = self.cfg.sliding[n].then_some(self.cfg.sliding_window);
            let h = rms_norm(&x, &layer.attn_norm, eps)?.to_dtype(self.dtype)?;
            let a = attention(&self.cfg, &layer.attn, cache, &h, start, &cos, &sin, window)?;
            x = (x + a.to_dtype(DType::F32)?)?;
            let h = rms_norm(&x, &layer.mlp_norm, eps)?;
            let m = moe(&self.cfg, layer, &h, self.dtype)?;
            x = (x + m)?;
        }
        Ok(x)
    }

    fn logits(&self, hidden: &Tensor) -> anyhow::Result<Tensor> {
        let h = rms_norm(hidden, &self.w.norm, self.cfg.rms_norm_eps)?;
        let h = match &self.w.lm_head {
            Linear::Dense { weight, .. } => h.to_dtype(weight.dtype())?,
            Linear::Quantized { .. } => h,
        };
        Ok(self.w.lm_head.forward(&h)?.to_dtype(DType::F32)?)
    }
}

impl CausalLm for GptOss {
    fn forward_last(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let h = self.hidden(tokens, start)?;
        let last = h.narrow(0, tokens.len() - 1, 1)?;
        Ok(self.logits(&last)?.squeeze(0)?)
    }

    fn forward_all(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let h = self.hidden(tokens, start)?;
        self.logits(&h)
    }

    fn context_length(&self) -> usize {
        self.caches.first().map(KvCache::capacity).unwrap_or(0)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
}

/// RMSNorm in f32 (the weight is f32): `x / sqrt(mean(x²) + eps) · w`.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let xf = x.to_dtype(DType::F32)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    xf.broadcast_div(&(var + eps)?.sqrt()?)?.broadcast_mul(w)
}

/// Additive mask `[seq, start+seq]`: query i (position start+i) sees key j when j ≤ start+i
/// and, with a window, j > start+i−window (the window counts the current token).
fn mask(seq: usize, start: usize, window: Option<usize>, device: &Device) -> candle_core::Result<Tensor> {
    let total = start + seq;
    let data: Vec<f32> = (0..seq)
        .flat_map(|i| {
            let pos = start + i;
            (0..total).map(move |j| {
                let visible = j <= pos && window.is_none_or(|w| j + w > pos);
                if visible { 0.0 } else { f32::NEG_INFINITY }
            })
        })
        .collect();
    Tensor::from_vec(data, (seq, total), device)
}

#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &GptOssConfig,
    a: &Attention,
    cache: &mut KvCache,
    x: &Tensor,
    start: usize,
    cos: &Tensor,
    sin: &Tensor,
    window: Option<usize>,
) -> anyhow::Result<Tensor> {
    let seq = x.dim(0)?;
    let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let group = heads / kv_heads;
    let split = |t: Tensor, n: usize| -> candle_core::Result<Tensor> {
        t.reshape((seq, n, d))?.transpose(0, 1)?.contiguous()?.unsqueeze(0)
    };
    let q = candle_nn::rotary_emb::rope(&split(a.q.forward(x)?, heads)?, cos, sin)?.squeeze(0)?;
    let k = candle_nn::rotary_emb::rope(&split(a.k.forward(x)?, kv_heads)?, cos, sin)?.squeeze(0)?;
    let v = split(a.v.forward(x)?, kv_heads)?.squeeze(0)?;
    let (k_all, v_all) = cache.append(&k, &v, start)?;
    let total = start + seq;

    let scale = 1.0 / (d as f64).sqrt();
    let q = q.reshape((kv_heads, group * seq, d))?;
    let scores = (q.matmul(&k_all.t()?)?.to_dtype(DType::F32)? * scale)?;
    let scores = scores.reshape((heads, seq, total))?.broadcast_add(&mask(seq, start, window, &x.device().clone())?)?;
    // The sink is one more logit per head in the softmax denominator, with no value vector.
    let sinks = a.sinks.reshape((heads, 1, 1))?.broadcast_as((heads, seq, 1))?;
    let probs = candle_nn::ops::softmax_last_dim(&Tensor::cat(&[scores, sinks.contiguous()?], 2)?)?;
    let probs = probs.narrow(2, 0, total)?.to_dtype(v_all.dtype())?;
    let out = probs.reshape((kv_heads, group * seq, total))?.matmul(&v_all.contiguous()?)?;
    let out = out.reshape((heads, seq, d))?.transpose(0, 1)?.reshape((seq, heads * d))?;
    Ok(a.o.forward(&out)?)
}

/// Router and experts for `h` (`[seq, hidden]`, f32); returns the f32 MoE output.
fn moe(cfg: &GptOssConfig, layer: &Layer, h: &Tensor, dtype: DType) -> anyhow::Result<Tensor> {
    let (seq, hidden) = h.dims2()?;
    let logits = h.matmul(&layer.router_w.t()?)?.broadcast_add(&layer.router_b)?;
    let routes = route(&logits.to_vec2::<f32>()?, cfg.experts_per_token);
    let x = h.to_dtype(dtype)?;
    let mut out = Tensor::zeros((seq, hidden), DType::F32, h.device())?;
    for e in 0..cfg.num_experts {
        let picked: Vec<(u32, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(t, r)| r.iter().find(|(id, _)| *id == e).map(|(_, w)| (t as u32, *w)))
            .collect();
        if picked.is_empty() {
            continue;
        }
        let idx = Tensor::new(picked.iter().map(|p| p.0).collect::<Vec<_>>(), h.device())?;
        let weights = Tensor::new(picked.iter().map(|p| p.1).collect::<Vec<_>>(), h.device())?.unsqueeze(1)?;
        let y = expert(cfg, &layer.experts, e, &x.index_select(&idx, 0)?, dtype)?;
        out = out.index_add(&idx, &y.broadcast_mul(&weights)?, 0)?;
    }
    Ok(out)
}

/// Top-k of the raw logits, then a softmax over those k (pitfall #5); ties go to the lower id.
pub fn route(logits: &[Vec<f32>], k: usize) -> Vec<Vec<(usize, f32)>> {
    logits
        .iter()
        .map(|row| {
            let mut ids: Vec<usize> = (0..row.len()).collect();
            ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            ids.truncate(k);
            let max = ids.iter().map(|&i| row[i]).fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = ids.iter().map(|&i| (row[i] - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            ids.into_iter().zip(exps).map(|(i, e)| (i, e / sum)).collect()
        })
        .collect()
}

/// One expert on its tokens `x` (`[n, hidden]`): f32 `[n, hidden]`.
fn expert(cfg: &GptOssConfig, ex: &Experts, e: usize, x: &Tensor, dtype: DType) -> anyhow::Result<Tensor> {
    let n = x.dim(0)?;
    let inter = cfg.intermediate_size;
    let w1 = ex.gate_up.dequantize(e, dtype)?;
    let gu = x.matmul(&w1.t()?)?.to_dtype(DType::F32)?.broadcast_add(&ex.gate_up_bias.i(e)?)?;
    // Rows alternate gate, up (pitfall #6): gate = 0::2, up = 1::2.
    let gu = gu.reshape((n, inter, 2))?;
    let gate = gu.narrow(2, 0, 1)?.squeeze(2)?.clamp(f32::NEG_INFINITY, cfg.swiglu_limit)?;
    let up = gu.narrow(2, 1, 1)?.squeeze(2)?.clamp(-cfg.swiglu_limit, cfg.swiglu_limit)?;
    let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * cfg.swiglu_alpha as f64)?)?)?;
    let act = (glu * (up + 1.0)?)?.to_dtype(dtype)?;
    let w2 = ex.down.dequantize(e, dtype)?;
    Ok(act.matmul(&w2.t()?)?.to_dtype(DType::F32)?.broadcast_add(&ex.down_bias.i(e)?)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn routing_is_topk_then_softmax_over_k() {
        let r = super::route(&[vec![1.0, 3.0, 2.0, 3.0]], 2);
        assert_eq!(r[0].iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0][0].1 - 0.5).abs() < 1e-6 && (r[0][1].1 - 0.5).abs() < 1e-6);
        let r = super::route(&[vec![0.0, 1.0, -5.0]], 2);
        let e = 1f32.exp();
        assert!((r[0][0].1 - e / (1.0 + e)).abs() < 1e-6);
    }

    #[test]
    fn sliding_window_counts_the_current_token() {
        let m = super::mask(3, 4, Some(2), &candle_core::Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        // Query at position 4 sees keys 3, 4; position 6 sees 5, 6.
        let visible: Vec<Vec<usize>> = m.iter().map(|r| (0..r.len()).filter(|&j| r[j] == 0.0).collect()).collect();
        assert_eq!(visible, vec![vec![3, 4], vec![4, 5], vec![5, 6]]);
    }
}
