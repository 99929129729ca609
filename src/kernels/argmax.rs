//! Greedy decoding's argmax over one logits row ([`argmax`]). candle reduces a row in a single
//! block, 156 µs for gpt-oss's 201,088 logits on an H200, a twentieth of a decode step; the
//! CUDA version here (`argmax.cu`) spreads the row over up to 256 blocks, then reduces those.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};

use super::cpu_f32;
// The reference: the sampler's host argmax, whose rules the kernel follows.
use crate::generate::sampler::argmax as argmax_slice;

/// Index (u32, rank 0) of the largest value of `logits` (f32 `[n]`), by the sampler's rules
/// ([`crate::generate::sampler::argmax`]): NaN never wins, ties go to the lower index, a row of
/// only NaN gives 0.
pub fn argmax(logits: &Tensor) -> Result<Tensor> {
    if logits.rank() != 1 || logits.dtype() != DType::F32 || logits.elem_count() == 0 {
        bail!("argmax: expected non-empty f32 [n] logits, got {:?} {:?}", logits.dtype(), logits.dims());
    }
    logits.contiguous()?.apply_op1_no_bwd(&Argmax)
}

struct Argmax;

impl CustomOp1 for Argmax {
    fn name(&self) -> &'static str {
        "argmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = cpu_f32(s, l, "argmax")?;
        Ok((CpuStorage::U32(vec![argmax_slice(values)]), Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

        use super::cuda::{ARGMAX_PTX, int};

        const BLOCKS: usize = 256;
        const THREADS: u32 = 256;
        let dev = s.device.clone();
        let n = l.shape().elem_count();
        let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        let chunk = n.div_ceil(BLOCKS).max(1);
        let parts = n.div_ceil(chunk);
        // SAFETY (all three): argmax_partial writes every partial, argmax_final the output.
        let mut part_v = unsafe { dev.alloc::<f32>(parts)? };
        let mut part_i = unsafe { dev.alloc::<i32>(parts)? };
        let mut out = unsafe { dev.alloc::<u32>(1)? };
        let (n32, chunk32, parts32) = (int(n, "logits")?, int(chunk, "chunk")?, int(parts, "parts")?);
        let func = dev.get_or_load_custom_func("argmax_partial", "inferno_argmax", ARGMAX_PTX)?;
        let mut b = func.builder();
        b.arg(&x).arg(&n32).arg(&chunk32).arg(&mut part_v).arg(&mut part_i);
        let cfg = LaunchConfig { grid_dim: (parts as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the kernel's signature; blocks stay inside [0, n).
        unsafe { b.launch(cfg) }.w()?;
        let func = dev.get_or_load_custom_func("argmax_final", "inferno_argmax", ARGMAX_PTX)?;
        let mut b = func.builder();
        b.arg(&part_v).arg(&part_i).arg(&parts32).arg(&mut out);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: as above; it reads the `parts` partials just written.
        unsafe { b.launch(cfg) }.w()?;
        Ok((candle_core::CudaStorage { slice: CudaStorageSlice::U32(out), device: dev }, Shape::from(())))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::kernels::testing::{rng, uniform};

    /// Random rows with planted ties (the maximum twice), NaNs, and an all-NaN row.
    fn rows() -> Vec<Vec<f32>> {
        let mut r = rng("argmax");
        let mut out = Vec::new();
        for n in [1usize, 7, 256, 1000, 65_537, 201_088] {
            let mut v = uniform(&mut r, n, -30.0, 30.0);
            if n > 10 {
                v[n / 3] = 31.0;
                v[n - 2] = 31.0; // tie: n / 3 must win
                v[n / 5] = f32::NAN;
            }
            out.push(v);
        }
        out.push(vec![f32::NAN; 300]);
        out.push(vec![f32::NEG_INFINITY; 300]);
        out
    }

    #[test]
    fn reference_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax_slice(&[1.0, 3.0, f32::NAN, 3.0]), 1);
        assert_eq!(argmax_slice(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax_slice(&[f32::NAN]), 0);
        for v in rows() {
            let t = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
            assert_eq!(argmax(&t).unwrap().to_scalar::<u32>().unwrap(), argmax_slice(&v));
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_argmax_matches_cpu() {
        let dev = crate::kernels::testing::gpu();
        for v in rows() {
            let t = Tensor::new(v.as_slice(), &dev).unwrap();
            assert_eq!(argmax(&t).unwrap().to_scalar::<u32>().unwrap(), argmax_slice(&v), "row of {}", v.len());
        }
    }
}
