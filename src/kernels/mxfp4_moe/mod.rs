//! The gpt-oss mixture of experts on MXFP4 weights (docs/gpt-oss.md §3, §4.5), after routing.
//!
//! For token `t` routed to experts `e_1..e_k` with weights `w_1..w_k` (already softmaxed over the k):
//!
//! ```text
//! h      = W1[e]·x + b1[e]                  (2I rows: gate channel j = row 2j, up = row 2j+1)
//! act_j  = g·σ(alpha·g)·(u + 1),  g = min(h_2j, limit),  u = clamp(h_2j+1, −limit, limit)
//! out[t] = Σ_k w_k · (W2[e]·act + b2[e])
//! ```
//!
//! The weights stay packed as in the checkpoint (`[E, rows, K/32, 16]` FP4 codes plus
//! `[E, rows, K/32]` E8M0 scales, see [`super::mxfp4`]) and are decoded on the fly.
//!
//! CUDA, four paths that end alike (`gpu.rs`):
//! - Per slot on tensor cores (`moe_slot_mma.cu`), for bf16 batches below 8 tokens, or whose
//!   slots are fewer than half the experts (`gpu::slot_tiles_pay`): the same two GEMVs as the
//!   next path, K split over a block's warps, the FP4 codes decoded straight into bf16 mma
//!   fragments; the activations travel as bf16 hi + mid + lo (the f32 value exactly).
//! - Slot tiles (`moe_slot_mma.cu`), for the other bf16 batches below 128 tokens (batched
//!   decode): the slots grouped by expert on the device into tiles of up to 8, each expert's
//!   weight rows read once per tile, each slot a column of the same mma chain as alone: the same
//!   bits as the per-slot path, so a token's MoE does not depend on the batch below 128 tokens.
//! - Per slot (`mxfp4_moe.cu`), for f32: `moe_gate_up` (GEMV over the selected
//!   experts' gate/up rows, bias and SwiGLU fused, into an f32 scratch `[tokens·k, I]`) and
//!   `moe_down` (GEMV over the down rows, bias and routing weight fused, into an f32 scratch
//!   `[tokens·k, H]`). They read each expert's weights once per (token, expert), which is right
//!   for a token or two.
//! - By expert (`moe_grouped.cu`), for bf16 batches (prefill): the slots are grouped by expert on
//!   the device and each expert's weights are read once per tile of 64 of its slots, on tensor
//!   cores.
//!
//! The grouped GEMMs carry the activations between the projections as bf16 hi + lo (16
//! significant bits).
//!
//! Then `moe_sum` adds each token's k expert rows in order, so results are deterministic without
//! atomics. One op rather than several CustomOps because the intermediates never need to be
//! tensors. The GEMVs take widths (hidden and intermediate) up to 8192.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, bail};

use super::{F32Reader, cpu_f32, cpu_output, cpu_u8, mxfp4};

/// gpt-oss's clamped SwiGLU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwiGlu {
    /// Gate clamped above at `limit`, up clamped to `[−limit, limit]`.
    pub limit: f32,
    /// Sigmoid slope.
    pub alpha: f32,
}

impl SwiGlu {
    /// swiglu_limit 7.0 from the config, alpha 1.702 hard-coded in the reference.
    pub const GPT_OSS: SwiGlu = SwiGlu { limit: 7.0, alpha: 1.702 };

    /// `g·σ(alpha·g)·(u + 1)` with `g = min(gate, limit)` and `u = clamp(up, −limit, limit)`.
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        let gate = gate.min(self.limit);
        let up = up.max(-self.limit).min(self.limit);
        gate / (1.0 + (-self.alpha * gate).exp()) * (up + 1.0)
    }
}

/// One layer's experts, packed as in the checkpoint (`mlp.experts.*`).
#[derive(Debug, Clone)]
pub struct Mxfp4Experts {
    gate_up_blocks: Tensor,
    gate_up_scales: Tensor,
    gate_up_bias: Tensor,
    down_blocks: Tensor,
    down_scales: Tensor,
    down_bias: Tensor,
    experts: usize,
    hidden: usize,
    intermediate: usize,
}

impl Mxfp4Experts {
    /// From `gate_up_proj_blocks` u8 `[E, 2I, H/32, 16]`, `gate_up_proj_scales` u8 `[E, 2I, H/32]`,
    /// `gate_up_proj_bias` `[E, 2I]`, `down_proj_blocks` u8 `[E, H, I/32, 16]`, `down_proj_scales`
    /// u8 `[E, H, I/32]` and `down_proj_bias` `[E, H]`, all on one device. Biases may be bf16 or
    /// f32 (kept as f32); packed tensors are copied only if not contiguous and 16-byte aligned.
    pub fn new(
        gate_up_blocks: &Tensor,
        gate_up_scales: &Tensor,
        gate_up_bias: &Tensor,
        down_blocks: &Tensor,
        down_scales: &Tensor,
        down_bias: &Tensor,
    ) -> Result<Self> {
        let (experts, rows2, hb, sixteen) = gate_up_blocks.dims4()?;
        if sixteen != 16 || rows2 % 2 != 0 {
            bail!(
                "mxfp4_moe: gate_up blocks {:?} must be [E, 2I, H/32, 16]",
                gate_up_blocks.dims()
            );
        }
        let (hidden, intermediate) = (hb * 32, rows2 / 2);
        let ib = intermediate / 32;
        let expect = [
            ("gate_up scales", gate_up_scales, vec![experts, rows2, hb], Some(DType::U8)),
            ("gate_up bias", gate_up_bias, vec![experts, rows2], None),
            ("down blocks", down_blocks, vec![experts, hidden, ib, 16], Some(DType::U8)),
            ("down scales", down_scales, vec![experts, hidden, ib], Some(DType::U8)),
            ("down bias", down_bias, vec![experts, hidden], None),
        ];
        if intermediate % 32 != 0 || gate_up_blocks.dtype() != DType::U8 {
            bail!(
                "mxfp4_moe: gate_up blocks {:?} {:?} must be u8 [E, 2I, H/32, 16] with I a multiple of 32",
                gate_up_blocks.dtype(),
                gate_up_blocks.dims()
            );
        }
        for (what, t, dims, dtype) in expect {
            if t.dims() != dims.as_slice() || dtype.is_some_and(|d| d != t.dtype()) {
                bail!(
                    "mxfp4_moe: {what} is {:?} {:?}, expected {dims:?}{}",
                    t.dtype(),
                    t.dims(),
                    if dtype.is_some() { " u8" } else { "" }
                );
            }
            if !t.device().same_device(gate_up_blocks.device()) {
                bail!(
                    "mxfp4_moe: {what} is on {:?}, the gate_up blocks on {:?}",
                    t.device(),
                    gate_up_blocks.device()
                );
            }
        }
        let packed = |t: &Tensor| -> Result<Tensor> {
            if t.is_contiguous() && t.layout().start_offset().is_multiple_of(16) {
                Ok(t.clone())
            } else {
                t.force_contiguous()
            }
        };
        let bias = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
        Ok(Self {
            gate_up_blocks: packed(gate_up_blocks)?,
            gate_up_scales: packed(gate_up_scales)?,
            gate_up_bias: bias(gate_up_bias)?,
            down_blocks: packed(down_blocks)?,
            down_scales: packed(down_scales)?,
            down_bias: bias(down_bias)?,
            experts,
            hidden,
            intermediate,
        })
    }

    /// The six tensors it holds (for counting the model's bytes).
    pub fn tensors(&self) -> [&Tensor; 6] {
        [
            &self.gate_up_blocks,
            &self.gate_up_scales,
            &self.gate_up_bias,
            &self.down_blocks,
            &self.down_scales,
            &self.down_bias,
        ]
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.experts
    }

    /// Model width `H` (input and output of the MoE).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Per-expert FFN width `I`.
    pub fn intermediate(&self) -> usize {
        self.intermediate
    }
}

/// The routed experts' output for each token: `x` `[tokens, H]` (f32 or bf16), `expert_ids` u32
/// `[tokens, k]`, `weights` f32 `[tokens, k]` (softmaxed over the k). Returns `[tokens, H]` in
/// x's dtype, accumulated in f32. Ids must be below `E` (the CPU reference fails otherwise; the
/// CUDA kernels skip such a slot).
pub fn mxfp4_moe(
    x: &Tensor,
    experts: &Mxfp4Experts,
    expert_ids: &Tensor,
    weights: &Tensor,
    act: SwiGlu,
) -> Result<Tensor> {
    let op = Mxfp4Moe::new(x, experts, expert_ids, weights, act, false)?;
    x.contiguous()?.apply_op3_no_bwd(&expert_ids.contiguous()?, &weights.contiguous()?, &op)
}

/// The CustomOp: `x`, ids and weights are its arguments, the experts travel inside.
struct Mxfp4Moe {
    experts: Mxfp4Experts,
    act: SwiGlu,
    /// Tests: fill the CUDA output with NaN before the kernels run.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    poison: bool,
    /// Return f32 instead of x's dtype ([`mxfp4_moe_routed`]: the sum over the experts,
    /// accumulated in f32, goes into an f32 residual stream without a round trip through bf16).
    out_f32: bool,
    /// Tests and timings: take this CUDA path whatever the batch size (`None`: by batch size).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    force_path: Option<Path>,
    /// Tests and timings: the grouped kernels' variant `(MT, STAGES)` (gpu.rs's
    /// `GROUPED_VARIANTS`; `None`: gpu.rs's choice).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    grouped_variant: Option<(usize, usize)>,
    /// Tests: moe_sum's own launch after the per-slot tensor-core kernels, which otherwise add
    /// the slots in their last block.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    separate_sum: bool,
    /// Tests: one tile of 16 rows per warp in the slot kernels instead of two.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    one_tile: bool,
}

/// The CUDA paths (`gpu.rs` chooses by batch size).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// GEMVs per (token, slot), f32 sums of table-decoded weights: `mxfp4_moe.cu`.
    PerSlot,
    /// GEMVs per (token, slot) on tensor cores, K split over a block's warps (bf16 x):
    /// `moe_slot_mma.cu`.
    SlotMma,
    /// Slots grouped by expert in tiles of up to 8, each slot computed as [`Path::SlotMma`]
    /// computes it alone: `moe_slot_mma.cu`'s slot tiles.
    SlotTiles,
    /// Slots grouped by expert in tiles of 64, GEMMs on tensor cores: `moe_grouped.cu`.
    Grouped,
}

impl Mxfp4Moe {
    /// The op for `x` (checked against the experts); the caller checks the routing.
    fn for_x(x: &Tensor, experts: &Mxfp4Experts, act: SwiGlu) -> Result<Self> {
        let (tokens, hidden) = x.dims2()?;
        if hidden != experts.hidden || tokens == 0 || !matches!(x.dtype(), DType::F32 | DType::BF16)
        {
            bail!(
                "mxfp4_moe: x {:?} {:?} must be f32 or bf16 [tokens ≥ 1, {}]",
                x.dtype(),
                x.dims(),
                experts.hidden
            );
        }
        if !experts.gate_up_blocks.device().same_device(x.device()) {
            bail!(
                "mxfp4_moe: experts on {:?}, x on {:?}",
                experts.gate_up_blocks.device(),
                x.device()
            );
        }
        Ok(Self {
            experts: experts.clone(),
            act,
            poison: false,
            out_f32: false,
            force_path: None,
            grouped_variant: None,
            separate_sum: false,
            one_tile: false,
        })
    }

    fn new(
        x: &Tensor,
        experts: &Mxfp4Experts,
        ids: &Tensor,
        weights: &Tensor,
        act: SwiGlu,
        poison: bool,
    ) -> Result<Self> {
        let mut op = Self::for_x(x, experts, act)?;
        op.poison = poison;
        let tokens = x.dim(0)?;
        let (it, k) = ids.dims2()?;
        if it != tokens || k == 0 || ids.dtype() != DType::U32 {
            bail!(
                "mxfp4_moe: expert ids {:?} {:?} must be u32 [{tokens}, k ≥ 1]",
                ids.dtype(),
                ids.dims()
            );
        }
        if weights.dims() != ids.dims() || weights.dtype() != DType::F32 {
            bail!(
                "mxfp4_moe: routing weights {:?} {:?} must be f32 {:?}",
                weights.dtype(),
                weights.dims(),
                ids.dims()
            );
        }
        for (what, t) in [("expert ids", ids), ("routing weights", weights)] {
            if !t.device().same_device(x.device()) {
                bail!("mxfp4_moe: {what} on {:?}, x on {:?}", t.device(), x.device());
            }
        }
        Ok(op)
    }

    /// The reference, per token and selected expert: dequantize each gate/up row, dot with x, add
    /// the bias, SwiGLU; then each down row against the activations, plus bias, times the routing
    /// weight, summed over the experts. f32 throughout.
    fn reference(
        &self,
        x: F32Reader,
        xl: &Layout,
        ids: &[u32],
        weights: &[f32],
    ) -> Result<Vec<f32>> {
        let e = &self.experts;
        let (tokens, h) = xl.shape().dims2()?;
        let (i, k) = (e.intermediate, ids.len() / tokens);
        let (hb, ib) = (h / 32, i / 32);
        let storages = [
            &e.gate_up_blocks,
            &e.gate_up_scales,
            &e.gate_up_bias,
            &e.down_blocks,
            &e.down_scales,
            &e.down_bias,
        ]
        .map(|t| t.storage_and_layout());
        let cpu = |n: usize| match &*storages[n].0 {
            Storage::Cpu(s) => Ok((s, storages[n].1)),
            _ => bail!("mxfp4_moe: experts must be on the CPU like x"),
        };
        let (s, l) = cpu(0)?;
        let gu_blocks = cpu_u8(s, l, "gate_up blocks")?;
        let (s, l) = cpu(1)?;
        let gu_scales = cpu_u8(s, l, "gate_up scales")?;
        let (s, l) = cpu(2)?;
        let gu_bias = cpu_f32(s, l, "gate_up bias")?;
        let (s, l) = cpu(3)?;
        let d_blocks = cpu_u8(s, l, "down blocks")?;
        let (s, l) = cpu(4)?;
        let d_scales = cpu_u8(s, l, "down scales")?;
        let (s, l) = cpu(5)?;
        let d_bias = cpu_f32(s, l, "down bias")?;

        let mut out = vec![0f32; tokens * h];
        let mut xt = vec![0f32; h];
        let mut act = vec![0f32; i];
        let mut row = vec![0f32; h.max(i)];
        for (t, o) in out.chunks_exact_mut(h).enumerate() {
            for (c, v) in xt.iter_mut().enumerate() {
                *v = x.get(xl.start_offset() + t * xl.stride()[0] + c * xl.stride()[1]);
            }
            for slot in t * k..(t + 1) * k {
                let (ex, w) = (ids[slot] as usize, weights[slot]);
                if ex >= e.experts {
                    bail!("mxfp4_moe: token {t} routed to expert {ex} of {}", e.experts);
                }
                for (j, a) in act.iter_mut().enumerate() {
                    let gate_row = ex * 2 * i + 2 * j;
                    let gate = packed_dot(gu_blocks, gu_scales, gate_row, hb, &xt, &mut row)
                        + gu_bias[gate_row];
                    let up = packed_dot(gu_blocks, gu_scales, gate_row + 1, hb, &xt, &mut row)
                        + gu_bias[gate_row + 1];
                    *a = self.act.apply(gate, up);
                }
                for (r, y) in o.iter_mut().enumerate() {
                    let down_row = ex * h + r;
                    *y += w
                        * (packed_dot(d_blocks, d_scales, down_row, ib, &act, &mut row)
                            + d_bias[down_row]);
                }
            }
        }
        Ok(out)
    }
}

/// Row `row` of a packed `[rows, n_blocks, 16]` matrix, dequantized into `buf`, dot `x`.
fn packed_dot(
    blocks: &[u8],
    scales: &[u8],
    row: usize,
    n_blocks: usize,
    x: &[f32],
    buf: &mut [f32],
) -> f32 {
    let buf = &mut buf[..n_blocks * 32];
    mxfp4::dequantize_row(
        &blocks[row * n_blocks * 16..][..n_blocks * 16],
        &scales[row * n_blocks..][..n_blocks],
        buf,
    );
    buf.iter().zip(x).map(|(w, x)| w * x).sum()
}

impl CustomOp3 for Mxfp4Moe {
    fn name(&self) -> &'static str {
        "mxfp4_moe"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        is: &CpuStorage,
        il: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = F32Reader::new(xs, "x")?;
        let ids = match (is, il.contiguous_offsets()) {
            (CpuStorage::U32(v), Some((a, b))) => &v[a..b],
            _ => bail!("mxfp4_moe: expert ids must be contiguous u32"),
        };
        let weights = cpu_f32(ws, wl, "routing weights")?;
        let out = self.reference(x, xl, ids, weights)?;
        let dtype = if self.out_f32 { DType::F32 } else { xs.dtype() };
        Ok((cpu_output(out, dtype)?, xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        is: &candle_core::CudaStorage,
        il: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice;
        let dev = xs.device.clone();
        let slice = super::float_dispatch!(
            CudaStorageSlice,
            "mxfp4_moe: x must be f32 or bf16",
            (&xs.slice => x),
            gpu::launch(self, &dev, (x, xl), (is, il), (ws, wl))?
        );
        Ok((candle_core::CudaStorage { slice, device: dev }, xl.shape().clone()))
    }
}

#[cfg(feature = "cuda")]
mod gpu;
mod routed;

#[cfg(feature = "cuda")]
pub(crate) use gpu::GROUPED_MIN_TOKENS;

pub use routed::{mxfp4_moe_routed, route};

#[cfg(test)]
mod tests;
