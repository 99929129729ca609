//! gpt-oss over a batch of sequences (the engine's step, [`BatchModel`]): the layers of
//! docs/gpt-oss.md §4 on `model.rs`'s weights, with keys and values in the engine's paged pool. Per layer,
//! top to bottom:
//! the previous layer's expert output added to the f32 residual and RMSNorm (one launch) → q/k/v
//! product in f32 → bias, RoPE at each token's position and the k/v stores into the pool (one
//! launch) → sink attention over each sequence's block table (sliding layers with their window,
//! in their own group of blocks) → o_proj → its bias, the residual add and RMSNorm in f32 and
//! bf16 (one launch) → router (f32 norm) and MXFP4 experts (bf16 norm; routing sees tokens, not
//! sequences), added by the next layer's first norm.

use candle_core::{Device, Tensor};

use super::memory;
use super::model::{GptOss, moe};
use crate::dist::collective::{sum_add_norm, sum_over};
use crate::kernels::{
    AddNorm, PagedAttnConfig, QkvHeads, RotaryPairs, add_rms_norm, paged_attention, qkv_rope_paged,
};
use crate::models::batch::{BatchModel, KvDtype, KvPool, KvShape, StepInput, Taps};

impl BatchModel for GptOss {
    fn kv_shape(&self) -> KvShape {
        memory::kv_shape(self.config(), self.kv_pool_dtype())
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
        let (heads, kv_heads, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let tokens = step.tokens.dim(0)?;
        let (cos, sin) = self.rope_tables();
        let eps = cfg.rms_norm_eps;
        let scale = 1.0 / (d as f32).sqrt();
        let mut x = w.embed.lookup(&step.tokens, self.comm())?;
        // The previous layer's expert output, added to the stream by this layer's first norm.
        let mut mlp_out: Option<Tensor> = None;
        for (n, layer) in w.layers.iter().enumerate() {
            let g = memory::kv_group(cfg, n);
            let (k_pool, v_pool) = &kv.layers[n];
            // The previous layer's experts summed over the ranks, added and normed (one launch
            // for the three where the GPUs reach each other's memory).
            let normed = match mlp_out.take() {
                Some(m) => sum_add_norm(
                    self.comm(),
                    m,
                    &AddNorm {
                        x: &x,
                        bias: None,
                        w: &layer.attn_norm,
                        eps,
                        dtype: self.dtype(),
                        keep_f32: false,
                    },
                )?,
                None => add_rms_norm(&x, None, None, &layer.attn_norm, eps, self.dtype(), false)?,
            };
            x = normed.x;
            taps.see(n, &x);
            let h = normed.h;
            // q, k, v in one product kept in f32; bias, RoPE and the pool stores in one launch.
            let q = qkv_rope_paged(
                &layer.attn.qkv.matmul_f32(&h)?,
                layer.attn.qkv.bias(),
                None,
                cos,
                sin,
                &step.positions,
                &step.slots[g],
                QkvHeads { heads, kv_heads, head_dim: d },
                RotaryPairs::HalfSplit,
                k_pool,
                v_pool,
                kv.scales(n),
                true,
            )?;
            // Each sequence's queries over its own blocks; [T, heads, d] is already the layout
            // of the rows [T, heads·d] o_proj takes.
            let attn = PagedAttnConfig {
                block_size: kv.block_size,
                window: cfg.sliding[n].then_some(cfg.sliding_window),
                scale,
                release_first: true,
            };
            let o = paged_attention(
                &q,
                k_pool,
                v_pool,
                kv.scales(n),
                Some(&layer.attn.sinks),
                &step.cu_q,
                &step.q_pos,
                &step.tables[g],
                step.bounds,
                &attn,
            )?;
            let o = layer.attn.o.matmul_f32(&o.reshape((tokens, heads * d))?)?;
            let norm = AddNorm {
                x: &x,
                bias: layer.attn.o.bias(),
                w: &layer.mlp_norm,
                eps,
                dtype: self.dtype(),
                keep_f32: true,
            };
            let normed = sum_add_norm(self.comm(), o, &norm)?;
            x = normed.x;
            let Some(h32) = normed.h32 else { anyhow::bail!("gpt-oss: the f32 norm is missing") };
            // Summed over the ranks by the next layer's first norm, or below.
            mlp_out = Some(moe(cfg, layer, &h32, &normed.h, step.live_rows.as_ref())?);
        }
        if let Some(m) = mlp_out {
            x = (x + sum_over(self.comm(), m)?)?;
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
            && w.layers.iter().all(|l| l.attn.qkv.is_dense_bf16() && l.attn.o.is_dense_bf16());
        crate::kernels::invariance::invariant_rows(self.device(), self.dtype(), true, dense)
    }

    fn max_positions(&self) -> usize {
        self.rope_tables().0.dim(0).unwrap_or(0)
    }

    fn device(&self) -> &Device {
        GptOss::device(self)
    }

    fn collective(&self) -> Option<&std::sync::Arc<dyn crate::dist::Collective>> {
        self.comm()
    }

    fn step_cost(&self) -> crate::models::step_cost::StepCost {
        let cfg = self.config();
        let (experts, rest) = self.expert_bytes();
        let (e, k) = (cfg.num_experts, cfg.experts_per_token);
        // A one-row step reads every weight but the embedding's other rows, and k of the E
        // experts of each layer.
        let routed = experts as f64 * k as f64 / e.max(1) as f64;
        let bytes = routed + rest as f64;
        crate::models::step_cost::StepCost::moe(e, k, routed / bytes.max(1.0), bytes as u64)
    }

    fn allocated(&self) -> crate::models::memory::Allocated {
        crate::models::memory::Allocated {
            weights: self.weight_bytes(),
            rope_tables: self.rope_bytes() as u64,
        }
    }
}
