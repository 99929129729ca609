//! Gemma 3 over a batch of sequences (the engine's step, [`BatchModel`]), as transformers'
//! `modeling_gemma3.py` computes it. The residual stream is f32 and starts as the embedding
//! rows times √hidden. Per layer:
//! input norm → q/k/v product (f32) → RMSNorm of each q and k head over head_dim → RoPE
//! (the local base on sliding layers, the global base and scaling on the others) and the k/v
//! stores into the pool (one launch) → attention over each sequence's block table, scaled by
//! `query_pre_attn_scalar^-0.5`, sliding layers seeing keys `j` with `i − j < window` → o_proj →
//! post-attention norm → residual add with the pre-FFN norm (one launch) → gate/up product →
//! `gelu_tanh(gate) · up` → down → post-FFN norm, added to the stream by the next layer's input
//! norm. Then the final norm and the tied LM head. Every norm is a plain RMSNorm by weights
//! held as `1 + w` (`model.rs`); there are no softcaps.

use candle_core::{Device, Tensor};

use super::model::Gemma3;
use crate::dist::collective::sum_over;
use crate::kernels::{
    PagedAttnConfig, QkNorm, QkvHeads, RotaryPairs, add_rms_norm, paged_attention, qkv_rope_paged,
    rms_norm,
};
use crate::models::batch::{BatchModel, KvDtype, KvPool, KvShape, StepInput, Taps};

impl BatchModel for Gemma3 {
    fn kv_shape(&self) -> KvShape {
        super::memory::kv_shape(&self.cfg, self.kv_dtype.pool_dtype(self.dtype))
    }

    fn set_kv_dtype(&mut self, kv: KvDtype) {
        self.kv_dtype = kv;
    }

    fn forward_taps(
        &self,
        step: &StepInput,
        kv: &KvPool,
        taps: &[usize],
    ) -> anyhow::Result<(Tensor, Option<Tensor>)> {
        let mut taps = Taps::new(taps);
        let cfg = &self.cfg;
        let w = &self.w;
        let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let tokens = step.tokens.dim(0)?;
        let (eps, dtype) = (cfg.rms_norm_eps, self.dtype);
        let scale = (1.0 / cfg.query_pre_attn_scalar.sqrt()) as f32;
        let mut x = (w.embed.lookup(&step.tokens, self.comm())? * self.embed_scale)?;
        // The previous layer's MLP output after its post-FFN norm, added by this layer's
        // input norm.
        let mut ffn_out: Option<Tensor> = None;
        for (n, layer) in w.layers.iter().enumerate() {
            let g = super::memory::kv_group(cfg, n);
            let (k_pool, v_pool) = &kv.layers[n];
            let normed =
                add_rms_norm(&x, ffn_out.as_ref(), None, &layer.input_norm, eps, dtype, false)?;
            x = normed.x;
            taps.see(n, &x);
            let qkv = layer.qkv.forward_f32(&normed.h)?;
            let (cos, sin) = self.rope_of(n);
            let q = qkv_rope_paged(
                &qkv,
                None,
                Some(QkNorm { q: &layer.q_norm, k: &layer.k_norm, eps }),
                cos,
                sin,
                &step.positions,
                &step.slots[g],
                QkvHeads { heads, kv_heads, head_dim: d },
                RotaryPairs::HalfSplit,
                k_pool,
                v_pool,
                kv.scales(n),
                false,
            )?;
            let attn = PagedAttnConfig {
                block_size: kv.block_size,
                window: cfg.sliding[n].then_some(cfg.sliding_window),
                scale,
                release_first: false,
            };
            let o = paged_attention(
                &q,
                k_pool,
                v_pool,
                kv.scales(n),
                None,
                &step.cu_q,
                &step.q_pos,
                &step.tables[g],
                step.bounds,
                &attn,
            )?;
            // o_proj and the MLP keep their products in f32; the post norms apply to the
            // products summed over the ranks.
            let o = layer.o.matmul_f32(&o.reshape((tokens, heads * d))?)?;
            let o = rms_norm(&sum_over(self.comm(), o)?, &layer.post_attn_norm, eps)?;
            let normed = add_rms_norm(&x, Some(&o), None, &layer.pre_ffn_norm, eps, dtype, false)?;
            x = normed.x;
            let gu = layer.gate_up.forward_f32(&normed.h)?;
            let i = gu.dim(1)? / 2;
            let act = (gu.narrow(1, 0, i)?.gelu()? * gu.narrow(1, i, i)?)?.to_dtype(dtype)?;
            let down = sum_over(self.comm(), layer.down.matmul_f32(&act)?)?;
            ffn_out = Some(rms_norm(&down, &layer.post_ffn_norm, eps)?);
        }
        if let Some(f) = ffn_out {
            x = (x + f)?;
        }
        taps.see(w.layers.len(), &x);
        let last = x.index_select(&step.logit_rows, 0)?;
        let logits =
            w.head.gathered_logits(&last, self.comm(), cfg.vocab_size, step.local_logits)?;
        Ok((logits, taps.finish()?))
    }

    fn tap_layers(&self) -> usize {
        self.w.layers.len()
    }

    fn embedding(&self) -> Option<&Tensor> {
        self.w.embed.table()
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn invariant_rows(&self) -> usize {
        let w = &self.w;
        let dense = w.head.lm_head.is_dense_bf16()
            && w.layers.iter().all(|l| {
                let mut all = l.qkv.linears();
                all.extend(l.gate_up.linears());
                all.extend([&l.o, &l.down]);
                all.iter().all(|p| p.is_dense_bf16())
            });
        crate::kernels::invariance::invariant_rows(&self.device, self.dtype, false, dense)
    }

    fn max_positions(&self) -> usize {
        self.global_rope.0.dim(0).unwrap_or(0)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn collective(&self) -> Option<&std::sync::Arc<dyn crate::dist::Collective>> {
        self.comm()
    }

    fn allocated(&self) -> crate::models::memory::Allocated {
        crate::models::memory::Allocated {
            weights: self.weight_bytes(),
            rope_tables: self.rope_bytes(),
        }
    }
}
