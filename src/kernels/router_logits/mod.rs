//! The gpt-oss router's logits `h · wᵀ` in f32 (`router.cu`'s `router_logits_f32` on the GPU).
//!
//! Why not candle's matmul: cuBLAS picks its kernel, and so its order of summation, by shape, so
//! a token's logits in a decode step of one row differ in the last bits from the same token's in
//! a prefill chunk. Routing weights feed every expert's output, so a prefix decoded token by
//! token and then reused from the cache would not equal a fresh prefill of it. This kernel sums
//! each (token, expert) dot in one fixed order whatever the batch. It also replaces cuBLAS's
//! two launches (GEMM and split-K reduction) by one.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};

/// `h` f32 `[tokens, hidden]` times `w` f32 `[experts, hidden]` transposed: f32
/// `[tokens, experts]`. On the GPU with `hidden % 4 == 0` the batch-invariant kernel; otherwise
/// candle's matmul.
pub fn router_logits(h: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, hidden) = h.dims2()?;
    let (_, wh) = w.dims2()?;
    if wh != hidden || h.dtype() != DType::F32 || w.dtype() != DType::F32 {
        bail!("router_logits: h {:?} {:?}, w {:?} {:?}", h.dtype(), h.dims(), w.dtype(), w.dims());
    }
    if h.device().is_cuda() && hidden.is_multiple_of(4) {
        return h.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &RouterLogits);
    }
    h.matmul(&w.t()?)
}

struct RouterLogits;

impl CustomOp2 for RouterLogits {
    fn name(&self) -> &'static str {
        "router_logits"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("router_logits: the CPU takes candle's matmul")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        hs: &candle_core::CudaStorage,
        hl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

        use crate::kernels::cuda::{ROUTER_PTX, int};
        use crate::kernels::launch::Launch;

        let dev = hs.device.clone();
        let (tokens, hidden) = hl.shape().dims2()?;
        let experts = wl.shape().dims2()?.0;
        if !hl.start_offset().is_multiple_of(4) || !wl.start_offset().is_multiple_of(4) {
            bail!("router_logits: h and w must start on a 16-byte boundary");
        }
        let h = hs.as_cuda_slice::<f32>()?.slice(hl.start_offset()..);
        let w = ws.as_cuda_slice::<f32>()?.slice(wl.start_offset()..);
        // SAFETY: every (token, expert) output is written by the block that computes it.
        let mut out = unsafe { dev.alloc::<f32>(tokens * experts)? };
        let func =
            dev.get_or_load_custom_func("router_logits_f32", "inferno_router", ROUTER_PTX)?;
        // One block per 4 tokens × 4 experts (RT × RE in the kernel).
        let blocks = tokens.div_ceil(4) * experts.div_ceil(4);
        let (t32, e32, h32) =
            (int(tokens, "tokens")?, int(experts, "experts")?, int(hidden, "hidden")?);
        let stream = dev.cuda_stream();
        let mut b = Launch::new(&stream, &func);
        b.ptr(&h).ptr(&w).ptr_mut(&mut out).val(t32).val(e32).val(h32);
        let cfg = LaunchConfig {
            grid_dim: (int(blocks, "blocks")? as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature; rows are contiguous, aligned and
        // a multiple of 4 floats long (checked above and in router_logits). Before its PDL wait
        // the kernel only prefetches the weights.
        unsafe { b.launch(cfg) }?;
        drop(b);
        let slice = candle_core::cuda_backend::CudaStorageSlice::F32(out);
        Ok((candle_core::CudaStorage { slice, device: dev }, Shape::from((tokens, experts))))
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use candle_core::DType;
    use rand::Rng;

    use super::router_logits;
    use crate::kernels::testing::{gpu, rel_err, rng, tensor, uniform, values};

    /// The kernel against an f64 reference on random shapes (token and expert counts that are
    /// not multiples of the warp's 4 × 4 tile), and each token alone equal bit for bit to the
    /// same token in the batch.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_reference_and_is_batch_invariant() {
        let dev = gpu();
        let mut r = rng("router logits");
        for (tokens, experts, hidden) in
            [(1, 32, 2880), (7, 32, 2880), (64, 32, 2880), (513, 32, 2880), (5, 33, 68), (3, 8, 64)]
        {
            let h = uniform(&mut r, tokens * hidden, -3.0, 3.0);
            let w = uniform(&mut r, experts * hidden, -0.1, 0.1);
            let want: Vec<f32> = (0..tokens * experts)
                .map(|i| {
                    let (t, e) = (i / experts, i % experts);
                    let hr = &h[t * hidden..][..hidden];
                    let wr = &w[e * hidden..][..hidden];
                    hr.iter().zip(wr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
                        as f32
                })
                .collect();
            let ht = tensor(h, &[tokens, hidden], DType::F32).to_device(&dev).unwrap();
            let wt = tensor(w, &[experts, hidden], DType::F32).to_device(&dev).unwrap();
            let got = values(&router_logits(&ht, &wt).unwrap());
            let err = rel_err(&got, &want);
            assert!(err < 1e-5, "{tokens}×{experts}×{hidden}: relative error {err:e}");
            let t = r.random_range(0..tokens);
            let alone = values(&router_logits(&ht.narrow(0, t, 1).unwrap(), &wt).unwrap());
            let row = &got[t * experts..][..experts];
            assert!(
                alone.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{tokens}×{experts}×{hidden}: token {t} alone differs from the batch"
            );
        }
    }
}
