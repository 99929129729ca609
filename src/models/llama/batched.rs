//! Llama over a batch of sequences (the engine's step, [`BatchModel`]): the layers on
//! `model.rs`'s weights, with keys and values in the engine's paged pool, one group of blocks. Per layer:
//! residual add + RMSNorm (one launch) → the fused q/k/v product in f32 → q's and k's
//! per-head RMSNorm where the variant has one (Qwen3) → RoPE at each token's
//! position and the k/v stores into the pool (one launch) → causal attention over each
//! sequence's block table → o_proj → its bias, the residual add and RMSNorm (one launch) →
//! fused gate/up product and SwiGLU (one launch at decode for bf16) → down (added to the stream
//! by the next layer's norm).

use candle_core::{DType, Device, Tensor};

use super::model::{Llama, RopeStyle};
use crate::dist::collective::{sum_add_norm, sum_over};
use crate::kernels::{
    AddNorm, PagedAttnConfig, QkNorm, QkvHeads, RotaryPairs, add_rms_norm, matmul_swiglu_bf16,
    paged_attention, qkv_rope_paged, silu_mul_to,
};
use crate::models::batch::{BatchModel, KvDtype, KvPool, KvShape, StepInput, Taps};
use crate::models::linear::Linear;

impl BatchModel for Llama {
    fn kv_shape(&self) -> KvShape {
        super::memory::kv_shape(self.config(), self.kv_pool_dtype())
    }

    fn set_kv_dtype(&mut self, kv: KvDtype) {
        self.set_kv(kv);
    }

    fn forward_taps(
        &self,
        step: &StepInput,
        kv: &KvPool,
        taps: &[usize],
    ) -> anyhow::Result<(Tensor, Option<Tensor>)> {
        let mut taps = Taps::new(taps);
        let cfg = self.config();
        let w = self.weights();
        let (cos, sin) = self.rope_f32();
        let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let tokens = step.tokens.dim(0)?;
        let pairs = match self.rope_style() {
            RopeStyle::HalfSplit => RotaryPairs::HalfSplit,
            RopeStyle::Interleaved => RotaryPairs::Interleaved,
        };
        let attn = PagedAttnConfig {
            block_size: kv.block_size,
            window: cfg.sliding_window,
            scale: 1.0 / (d as f32).sqrt(),
            release_first: false,
        };
        let eps = cfg.rms_norm_eps;
        // The residual stream stays in f32 (see model.rs).
        let mut x = w.embed.lookup(&step.tokens, self.comm())?;
        // The previous layer's MLP output (this rank's piece) and its bias, summed over the
        // ranks and added to the stream by this layer's first norm.
        let mut mlp_out: Option<(Tensor, Option<&Tensor>)> = None;
        // The residual add in front of a norm (of a row-parallel product's output, summed over
        // the ranks first) and the norm, to the products' dtype: one launch each.
        let dtype = self.dtype();
        for (n, layer) in w.layers.iter().enumerate() {
            let (k_pool, v_pool) = &kv.layers[n];
            let fused = self.fused(n);
            let normed = match mlp_out.take() {
                Some((m, bias)) => {
                    let w_norm = &layer.attn_norm;
                    let norm = AddNorm { x: &x, bias, w: w_norm, eps, dtype, keep_f32: false };
                    sum_add_norm(self.comm(), m, &norm)?
                }
                None => add_rms_norm(&x, None, None, &layer.attn_norm, eps, dtype, false)?,
            };
            let h = normed.h;
            x = normed.x;
            taps.see(n, &x);
            // q, k, v in f32 with their biases (Llama has none; some derivatives do): one
            // product where the weights could be fused.
            let qkv = match fused.and_then(|f| f.qkv.as_ref()) {
                Some(qkv) => qkv.forward_f32(&h)?,
                None => Tensor::cat(
                    &[layer.q.forward_f32(&h)?, layer.k.forward_f32(&h)?, layer.v.forward_f32(&h)?],
                    1,
                )?,
            };
            let norm = layer.qk_norm.as_ref().map(|(q, k)| QkNorm { q, k, eps });
            let q = qkv_rope_paged(
                &qkv,
                None,
                norm,
                cos,
                sin,
                &step.positions,
                &step.slots[0],
                QkvHeads { heads, kv_heads, head_dim: d },
                pairs,
                k_pool,
                v_pool,
                kv.scales(n),
                false,
            )?;
            let o = paged_attention(
                &q,
                k_pool,
                v_pool,
                kv.scales(n),
                None,
                &step.cu_q,
                &step.q_pos,
                &step.tables[0],
                step.bounds,
                &attn,
            )?;
            // o_proj and the MLP keep their products in f32 (bf16 weights, f32 accumulators
            // and results): each bf16 rounding of a product's output is noise that depends on
            // how the GEMM splits its sums, which differs between batch sizes. The SwiGLU's
            // output is rounded once, as the products' input (an elementwise rounding, the same
            // in any batch).
            let o = layer.o.matmul_f32(&o.reshape((tokens, heads * d))?)?;
            let (bias, w_norm) = (layer.o.bias(), &layer.mlp_norm);
            let norm = AddNorm { x: &x, bias, w: w_norm, eps, dtype, keep_f32: false };
            let normed = sum_add_norm(self.comm(), o, &norm)?;
            let h = normed.h;
            x = normed.x;
            let act = match fused.and_then(|f| f.gate_up.as_ref()) {
                // bf16 weights without a bias: the product and the SwiGLU in one launch where
                // our GEMV takes it (decode), the same bits as the two ops below.
                Some(Linear::Dense { weight, bias: None })
                    if weight.dtype() == DType::BF16 && self.dtype() == DType::BF16 =>
                {
                    matmul_swiglu_bf16(&h, weight)?
                }
                Some(gate_up) => silu_mul_to(&gate_up.forward_f32(&h)?, self.dtype())?,
                None => silu_mul_to(
                    &Tensor::cat(&[layer.gate.forward_f32(&h)?, layer.up.forward_f32(&h)?], 1)?,
                    self.dtype(),
                )?,
            };
            // The bias after the sum over ranks (once): the same ops as `forward_f32` on one.
            mlp_out = Some((layer.down.matmul_f32(&act)?, layer.down.bias()));
        }
        if let (Some((m, _)), Some(last)) = (mlp_out, w.layers.last()) {
            x = (x + last.down.add_bias_f32(sum_over(self.comm(), m)?)?)?;
        }
        taps.see(w.layers.len(), &x);
        let last = x.index_select(&step.logit_rows, 0)?;
        let logits =
            w.head.gathered_logits(&last, self.comm(), cfg.vocab_size, step.local_logits)?;
        Ok((logits, taps.finish()?))
    }

    fn tap_layers(&self) -> usize {
        self.weights().layers.len()
    }

    fn embedding(&self) -> Option<&Tensor> {
        self.weights().embed.table()
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.config().hidden_size
    }

    fn invariant_rows(&self) -> usize {
        let w = self.weights();
        let dense = w.head.lm_head.is_dense_bf16()
            && w.layers.iter().all(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].iter().all(|p| p.is_dense_bf16())
            });
        crate::kernels::invariance::invariant_rows(self.device(), self.dtype(), false, dense)
    }

    fn max_positions(&self) -> usize {
        self.rope_f32().0.dim(0).unwrap_or(0)
    }

    fn device(&self) -> &Device {
        self.device_ref()
    }

    fn collective(&self) -> Option<&std::sync::Arc<dyn crate::dist::Collective>> {
        self.comm()
    }

    fn allocated(&self) -> crate::models::memory::Allocated {
        crate::models::memory::Allocated {
            weights: self.weight_bytes(),
            rope_tables: self.rope_bytes() as u64,
        }
    }
}
