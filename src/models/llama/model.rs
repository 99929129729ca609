//! The Llama forward pass: RMSNorm → GQA attention with RoPE and a preallocated KV cache →
//! RMSNorm → SwiGLU MLP, residuals around both; final norm and LM head on the last position.
//!
//! Shapes are for batch 1: hidden states are `[seq, hidden]`, per-head tensors `[heads, seq, d]`.
//! Grouped-query attention reshapes the queries to `[kv_heads, group·seq, d]` so each KV head is
//! used by its group without copying keys and values (`repeat_kv`).

use candle_core::{DType, Device, Tensor};

use super::config::LlamaConfig;
use super::fuse::{Fused, fuse_layer};
use super::memory;
use crate::models::head::{Decoder, Head, rms_norm};
use crate::models::kv_cache::KvCache;
use crate::models::linear::Linear;
use crate::models::rope;

/// How q/k pairs are rotated: HF checkpoints pair dim i with i + d/2; llama.cpp's converter
/// permutes q/k rows so GGUF files pair 2i with 2i+1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    HalfSplit,
    Interleaved,
}

#[derive(Clone)]
pub struct Layer {
    /// Norm weights are f32 (the norms run in f32).
    pub attn_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub mlp_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Clone)]
pub struct Weights {
    /// `[vocab, hidden]`, dense in the compute dtype.
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    /// Final norm and LM head.
    pub head: Head,
}

pub struct Llama {
    cfg: LlamaConfig,
    w: Weights,
    caches: Vec<KvCache>,
    rope_style: RopeStyle,
    inv_freq: Vec<f32>,
    /// cos/sin for every cached position (absent for dynamic NTK, which depends on length).
    rope_tables: Option<(Tensor, Tensor)>,
    dtype: DType,
    device: Device,
    /// f32 cos/sin for the batched path (built by `prepare_batched`).
    rope_f32: Option<(Tensor, Tensor)>,
    /// Each layer's fused products for the batched path (built by `prepare_batched`).
    fused: Vec<Fused>,
}

impl Llama {
    /// Builds the model around loaded weights with a KV cache of `context` positions.
    pub fn new(
        cfg: LlamaConfig,
        w: Weights,
        rope_style: RopeStyle,
        context: usize,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Llama> {
        let caches = (0..cfg.num_layers)
            .map(|_| KvCache::new(cfg.num_kv_heads, context, cfg.head_dim, dtype, device))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let inv_freq = rope::inv_freq(&cfg.rope, cfg.rope_theta, cfg.head_dim, 0);
        let w = f32_head(w, dtype)?;
        let rope_tables = if memory::has_rope_tables(&cfg) {
            let scale = cfg.rope.attention_scaling();
            Some(rope::scaled_tables(&inv_freq, scale, 0, context, dtype, device)?)
        } else {
            None
        };
        Ok(Llama {
            cfg,
            w,
            caches,
            rope_style,
            inv_freq,
            rope_tables,
            dtype,
            device: device.clone(),
            rope_f32: None,
            fused: Vec::new(),
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.caches.iter().map(KvCache::bytes).sum()
    }

    /// Bytes of the RoPE tables (none for dynamic NTK).
    pub fn rope_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        self.rope_tables.as_ref().map_or(0, |(cos, sin)| bytes(cos) + bytes(sin))
    }

    /// Bytes of the weights, each tensor once (a tied LM head is the embedding).
    pub fn weight_bytes(&self) -> u64 {
        let mut m = crate::models::memory::Measured::default();
        m.tensor(&self.w.embed);
        for l in &self.w.layers {
            m.tensor(&l.attn_norm);
            m.tensor(&l.mlp_norm);
            for p in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                m.linear(p);
            }
        }
        m.tensor(&self.w.head.norm);
        m.linear(&self.w.head.lm_head);
        m.total
    }

    /// The final hidden states `[seq, hidden]` (before the final norm) of one prefill chunk or
    /// decode step.
    fn forward_chunk(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let seq = tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        // The residual stream stays in f32 whatever the compute dtype: sums of many bf16
        // updates lose the small ones otherwise (more accurate than the bf16 reference, and
        // cheap: only `[seq, hidden]` per layer).
        let mut x = self.w.embed.index_select(&ids, 0)?.to_dtype(DType::F32)?;
        let (cos, sin) = self.rope_for(start, seq)?;
        let mask = causal_mask(seq, start, self.dtype, &self.device)?;
        let eps = self.cfg.rms_norm_eps;
        for (layer, cache) in self.w.layers.iter().zip(self.caches.iter_mut()) {
            let h = rms_norm(&x, &layer.attn_norm, eps)?.to_dtype(self.dtype)?;
            let a = attention(
                &self.cfg,
                layer,
                cache,
                &h,
                start,
                &cos,
                &sin,
                mask.as_ref(),
                self.rope_style,
            )?;
            x = (x + a.to_dtype(DType::F32)?)?;
            let h = rms_norm(&x, &layer.mlp_norm, eps)?.to_dtype(self.dtype)?;
            let gate = layer.gate.forward(&h)?.silu()?;
            let m = layer.down.forward(&(gate * layer.up.forward(&h)?)?)?;
            x = (x + m.to_dtype(DType::F32)?)?;
        }
        Ok(x)
    }

    fn rope_for(&self, start: usize, seq: usize) -> anyhow::Result<(Tensor, Tensor)> {
        match &self.rope_tables {
            Some((cos, sin)) => Ok((cos.narrow(0, start, seq)?, sin.narrow(0, start, seq)?)),
            None => {
                let f = rope::inv_freq(
                    &self.cfg.rope,
                    self.cfg.rope_theta,
                    self.cfg.head_dim,
                    start + seq,
                );
                rope::scaled_tables(
                    &f,
                    self.cfg.rope.attention_scaling(),
                    start,
                    seq,
                    self.dtype,
                    &self.device,
                )
            }
        }
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

    /// Layer `n`'s fused products (empty before `prepare_batched`).
    pub(super) fn fused(&self, n: usize) -> Option<&Fused> {
        self.fused.get(n)
    }

    pub(super) fn rope_f32(&self) -> Option<&(Tensor, Tensor)> {
        self.rope_f32.as_ref()
    }

    /// Drops the single-sequence caches and builds f32 RoPE tables for every position the
    /// caches held (the batched path rotates in f32, as gpt-oss does).
    pub(super) fn switch_to_batched(&mut self) -> anyhow::Result<()> {
        let context = self.cache_capacity();
        anyhow::ensure!(
            memory::has_rope_tables(&self.cfg),
            "dynamic NTK RoPE (angles that depend on the sequence length) is not supported by the batched engine"
        );
        let scale = self.cfg.rope.attention_scaling();
        let tables =
            rope::scaled_tables(&self.inv_freq, scale, 0, context, DType::F32, &self.device)?;
        self.rope_f32 = Some(tables);
        self.caches.clear();
        self.fused =
            self.w.layers.iter_mut().map(fuse_layer).collect::<candle_core::Result<_>>()?;
        Ok(())
    }

    /// The inverse frequencies in use (for tests).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }
}

impl Decoder for Llama {
    fn hidden_chunk(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        self.forward_chunk(tokens, start)
    }

    fn prefill_chunk(&self) -> usize {
        memory::PREFILL_CHUNK
    }

    fn head(&self) -> &Head {
        &self.w.head
    }

    fn into_batch(self: Box<Self>) -> Box<dyn crate::models::batch::BatchModel> {
        self
    }

    fn cache_capacity(&self) -> usize {
        self.caches.first().map(KvCache::capacity).unwrap_or(0)
    }

    fn vocab(&self) -> usize {
        self.cfg.vocab_size
    }

    fn allocated(&self) -> crate::models::memory::Allocated {
        crate::models::memory::Allocated {
            weights: self.weight_bytes(),
            kv_cache: self.kv_cache_bytes() as u64,
            rope_tables: self.rope_bytes() as u64,
        }
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

/// Additive mask `[seq, start+seq]`: 0 where query i may see key j (j ≤ start+i), −∞ elsewhere.
fn causal_mask(
    seq: usize,
    start: usize,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Option<Tensor>> {
    if seq == 1 {
        return Ok(None);
    }
    let total = start + seq;
    // Reserved fallibly: `[chunk, context]` can be large, and failing must be an error.
    let mut data: Vec<f32> = Vec::new();
    data.try_reserve_exact(seq * total).map_err(|_| {
        candle_core::Error::Msg(format!("no host memory for a {seq} × {total} attention mask"))
    })?;
    data.extend((0..seq).flat_map(|i| {
        (0..total).map(move |j| if j <= start + i { 0.0 } else { f32::NEG_INFINITY })
    }));
    Tensor::from_vec(data, (seq, total), device)?.to_dtype(dtype).map(Some)
}

#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &LlamaConfig,
    layer: &Layer,
    cache: &mut KvCache,
    x: &Tensor,
    start: usize,
    cos: &Tensor,
    sin: &Tensor,
    mask: Option<&Tensor>,
    style: RopeStyle,
) -> anyhow::Result<Tensor> {
    let seq = x.dim(0)?;
    let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let group = heads / kv_heads;
    let split = |t: Tensor, n: usize| -> candle_core::Result<Tensor> {
        t.reshape((seq, n, d))?.transpose(0, 1)?.contiguous()?.unsqueeze(0)
    };
    let q = split(layer.q.forward(x)?, heads)?;
    let k = split(layer.k.forward(x)?, kv_heads)?;
    let v = split(layer.v.forward(x)?, kv_heads)?.squeeze(0)?;
    let (q, k) = match style {
        RopeStyle::HalfSplit => {
            (candle_nn::rotary_emb::rope(&q, cos, sin)?, candle_nn::rotary_emb::rope(&k, cos, sin)?)
        }
        RopeStyle::Interleaved => (
            candle_nn::rotary_emb::rope_i(&q, cos, sin)?,
            candle_nn::rotary_emb::rope_i(&k, cos, sin)?,
        ),
    };
    let (k_all, v_all) = cache.append(&k.squeeze(0)?, &v, start)?;
    let total = start + seq;

    // [heads, seq, d] -> [kv_heads, group*seq, d]: query head h = g*group + r uses kv head g.
    let q = q.squeeze(0)?.reshape((kv_heads, group * seq, d))?;
    let scale = 1.0 / (d as f64).sqrt();
    let scores = (q.matmul(&k_all.t()?)? * scale)?;
    let scores = scores.to_dtype(DType::F32)?;
    let scores = match mask {
        Some(m) => scores
            .reshape((kv_heads, group, seq, total))?
            .broadcast_add(&m.to_dtype(DType::F32)?)?
            .reshape((kv_heads, group * seq, total))?,
        None => scores,
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v_all.dtype())?;
    let out = probs.matmul(&v_all.contiguous()?)?; // [kv_heads, group*seq, d]
    let out = out.reshape((heads, seq, d))?.transpose(0, 1)?.reshape((seq, heads * d))?;
    Ok(layer.o.forward(&out)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::models::CausalLm;

    #[test]
    fn chunked_prefill_matches_decoding_token_by_token() {
        // 600 positions run as chunks of 512 + 88; each row must be what decoding that token
        // alone after the others gives (f32 on the CPU: the same sums in another order).
        let cfg = LlamaConfig::from_hf_json(
            r#"{"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,
            "max_position_embeddings":1024}"#,
        )
        .unwrap();
        let w = super::super::dummy::random_weights(&cfg, DType::F32, &Device::Cpu).unwrap();
        let mut m =
            Llama::new(cfg, w, RopeStyle::HalfSplit, 700, DType::F32, &Device::Cpu).unwrap();
        let tokens: Vec<u32> = (0..600).map(|i| (i * 7 % 50) as u32).collect();
        let all = m.forward_all(&tokens, 0).unwrap();
        assert!(memory::PREFILL_CHUNK < tokens.len());
        for (i, &t) in tokens.iter().enumerate() {
            let step = m.forward_last(&[t], i).unwrap();
            if [0, 1, 511, 512, 513, 599].contains(&i) {
                let diff = (all.get(i).unwrap() - step).unwrap().abs().unwrap();
                let max = diff.max(0).unwrap().to_scalar::<f32>().unwrap();
                assert!(max < 1e-4, "position {i}: {max}");
            }
        }
    }
}
