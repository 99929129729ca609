//! Routing and experts in one op ([`mxfp4_moe_routed`]): from the router's raw logits to the
//! experts' f32 sum. On CUDA the routing is one kernel (`route.cu`: top-k of logits + bias,
//! softmax over the k) writing into scratch buffers the expert kernels read, instead of five
//! candle ops (bias add, sort, narrow, gather, softmax) and their tensors: in a decode step
//! every launch counts.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};

use super::{Mxfp4Experts, Mxfp4Moe, SwiGlu};
use crate::kernels::{F32Reader, cpu_f32, cpu_output};

/// gpt-oss routing of one token (docs/gpt-oss.md §4.5, pitfall #5): the `k` largest of
/// `logits + bias` (ties: the lower expert index), then a softmax over those k only. Returns
/// (ids, weights).
pub fn route(logits: &[f32], bias: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let scores: Vec<f32> = logits.iter().zip(bias).map(|(l, b)| l + b).collect();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a])); // stable: ties keep index order
    let top = &order[..k.min(order.len())];
    let exps: Vec<f32> = top.iter().map(|&e| (scores[e] - scores[top[0]]).exp()).collect();
    let total: f32 = exps.iter().sum();
    (top.iter().map(|&e| e as u32).collect(), exps.iter().map(|w| w / total).collect())
}

/// The experts' f32 output `[tokens, H]` for `x` `[tokens, H]` (f32 or bf16) routed by the
/// router's raw `logits` (f32 `[tokens, E]`, before the bias) and `bias` (f32 `[E]`): top `k`,
/// softmax over the k, then the experts as in [`super::mxfp4_moe`], with an f32 result.
///
/// `live` (u32 `[1]` on x's device, read there): tokens from this one on are padding, routed to
/// no expert, their rows zero. A decode graph pads its batch to a bucket with sequences nobody
/// reads ([`crate::models::batch::StepInput::live_rows`]); routed like the others, they would
/// read four more experts' weights a layer for nothing (on gpt-oss-120b at 6 streams padded to
/// 8, about a sixth of the step's expert reads).
pub fn mxfp4_moe_routed(
    x: &Tensor,
    experts: &Mxfp4Experts,
    logits: &Tensor,
    bias: &Tensor,
    k: usize,
    act: SwiGlu,
    live: Option<&Tensor>,
) -> Result<Tensor> {
    let (tokens, e) = logits.dims2()?;
    if e != experts.experts || tokens != x.dim(0)? || logits.dtype() != DType::F32 {
        bail!(
            "mxfp4_moe_routed: router logits {:?} {:?} must be f32 [{}, {}]",
            logits.dtype(),
            logits.dims(),
            x.dim(0)?,
            experts.experts
        );
    }
    if bias.dims() != [e] || bias.dtype() != DType::F32 {
        bail!(
            "mxfp4_moe_routed: router bias {:?} {:?} must be f32 [{e}]",
            bias.dtype(),
            bias.dims()
        );
    }
    if k == 0 || k > e || k > 32 || e > 256 {
        bail!("mxfp4_moe_routed: top-{k} of {e} experts is not supported (k ≤ 32, experts ≤ 256)");
    }
    let mut moe = Mxfp4Moe::for_x(x, experts, act)?;
    moe.out_f32 = true;
    for t in [logits, bias].into_iter().chain(live) {
        if !t.device().same_device(x.device()) {
            bail!("mxfp4_moe_routed: router tensors on {:?}, x on {:?}", t.device(), x.device());
        }
    }
    if let Some(l) = live
        && (l.dims() != [1] || l.dtype() != DType::U32)
    {
        bail!("mxfp4_moe_routed: live rows {:?} {:?} must be u32 [1]", l.dtype(), l.dims());
    }
    let live = live.map(Tensor::contiguous).transpose()?;
    x.contiguous()?.apply_op3_no_bwd(
        &logits.contiguous()?,
        &bias.contiguous()?,
        &Routed { moe, k, live },
    )
}

struct Routed {
    moe: Mxfp4Moe,
    k: usize,
    /// u32 `[1]`: tokens from it on are padding ([`mxfp4_moe_routed`]).
    live: Option<Tensor>,
}

impl CustomOp3 for Routed {
    fn name(&self) -> &'static str {
        "mxfp4_moe_routed"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ls: &CpuStorage,
        ll: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (logits, bias) = (cpu_f32(ls, ll, "router logits")?, cpu_f32(bs, bl, "router bias")?);
        let tokens = xl.shape().dims2()?.0;
        let live = match &self.live {
            Some(l) => (l.to_vec1::<u32>()?[0] as usize).min(tokens),
            None => tokens,
        };
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
        for row in logits.chunks_exact(bias.len()).take(live) {
            let (i, w) = route(row, bias, self.k);
            ids.extend(i);
            weights.extend(w);
        }
        let mut out = if live == 0 {
            Vec::new()
        } else {
            let live_x = xl.narrow(0, 0, live)?;
            self.moe.reference(F32Reader::new(xs, "x")?, &live_x, &ids, &weights)?
        };
        out.resize(xl.shape().elem_count(), 0.0); // padding rows: zero
        Ok((cpu_output(out, DType::F32)?, xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ls: &candle_core::CudaStorage,
        ll: &Layout,
        bs: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice;
        use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

        use crate::kernels::cuda::{cuda_view, fatbin, int};
        use crate::kernels::launch::Launch;

        let dev = xs.device.clone();
        let (tokens, experts) = ll.shape().dims2()?;
        let logits = ls.as_cuda_slice::<f32>()?.slice(ll.start_offset()..);
        let bias = bs.as_cuda_slice::<f32>()?.slice(bl.start_offset()..);
        // SAFETY: route_topk_softmax writes all k ids and weights of every token.
        let mut ids = unsafe { dev.alloc::<u32>(tokens * self.k)? };
        let mut weights = unsafe { dev.alloc::<f32>(tokens * self.k)? };
        let func = fatbin::mxfp4_moe::ROUTE.func(&dev, "route_topk_softmax")?;
        let (t32, e32, k32) = (int(tokens, "tokens")?, int(experts, "experts")?, int(self.k, "k")?);
        let stream = dev.cuda_stream();
        let live = self.live.as_ref().map(|l| l.storage_and_layout());
        let live = live
            .as_ref()
            .map(|(s, l)| cuda_view::<u32>(s, l, "mxfp4_moe_routed: live rows"))
            .transpose()?;
        let mut b = Launch::new(&stream, &func);
        b.ptr(&logits).ptr(&bias).ptr_mut(&mut ids).ptr_mut(&mut weights);
        b.val(t32).val(e32).val(k32);
        match &live {
            Some(l) => b.ptr(l),
            None => b.null(),
        };
        let cfg = LaunchConfig {
            grid_dim: (int(tokens.div_ceil(4), "blocks")? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature; experts ≤ 256 and k ≤ 32 were
        // checked in mxfp4_moe_routed, and live is null or one u32 (checked there too). It
        // waits (PDL) before reading anything.
        unsafe { b.launch(cfg) }?;
        drop(b);
        let (ids, weights) = (ids.slice(..), weights.slice(..));
        let slice = crate::kernels::float_dispatch!(
            CudaStorageSlice,
            "mxfp4_moe_routed: x must be f32 or bf16",
            (&xs.slice => x),
            super::gpu::launch_routed(&self.moe, &dev, (x, xl), &ids, &weights, self.k)?
        );
        Ok((candle_core::CudaStorage { slice, device: dev }, xl.shape().clone()))
    }
}
