//! The elementwise steps around a Llama layer's products in one launch each
//! (`layer_norm_act.cu`): RMSNorm to the products' input dtype, and SwiGLU from the fused
//! gate/up product. bf16 outputs take the kernels; f32 outputs (CPU tests, f32 models) take
//! candle's ops, which compute the same values.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::cpu_f32;

/// RMSNorm of f32 `x` `[rows, n]` with f32 weight `w` `[n]`, in `dtype`: computed in f32,
/// rounded once.
pub fn rms_norm_to(x: &Tensor, w: &Tensor, eps: f64, dtype: DType) -> Result<Tensor> {
    if dtype != DType::BF16 || x.dtype() != DType::F32 || w.dtype() != DType::F32 {
        return crate::models::head::rms_norm(x, w, eps)?.to_dtype(dtype);
    }
    let n = x.dim(1)?;
    if w.dims() != [n] {
        bail!("rms_norm_to: weight {:?} for rows of {n}", w.dims());
    }
    x.contiguous()?.apply_op1_no_bwd(&RmsNormBf16 { w: w.contiguous()?, eps: eps as f32 })
}

/// `silu(g) · u` in `dtype` for the fused gate/up product `gu` (f32 `[rows, 2n]`, gate first).
pub fn silu_mul_to(gu: &Tensor, dtype: DType) -> Result<Tensor> {
    let n = gu.dim(1)? / 2;
    if dtype != DType::BF16 || gu.dtype() != DType::F32 {
        let act = (gu.narrow(1, 0, n)?.silu()? * gu.narrow(1, n, n)?)?;
        return act.to_dtype(dtype);
    }
    gu.contiguous()?.apply_op1_no_bwd(&SiluMulBf16)
}

struct RmsNormBf16 {
    w: Tensor,
    eps: f32,
}

impl CustomOp1 for RmsNormBf16 {
    fn name(&self) -> &'static str {
        "rms_norm_bf16"
    }

    /// The reference: a plain f32 sum of squares per row.
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, n) = l.shape().dims2()?;
        let x = cpu_f32(s, l, "rms_norm_bf16")?;
        let w = self.w.to_vec1::<f32>()?;
        let mut out = Vec::with_capacity(rows * n);
        for row in x.chunks_exact(n) {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / n as f32 + self.eps).sqrt();
            out.extend(row.iter().zip(&w).map(|(v, w)| bf16::from_f32(v * inv * w)));
        }
        Ok((CpuStorage::BF16(out), Shape::from((rows, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

        use super::cuda::{LAYER_NORM_ACT_PTX, cuda_view, int};

        let (rows, n) = l.shape().dims2()?;
        let dev = s.device.clone();
        let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        let (ws, wl) = self.w.storage_and_layout();
        let w = cuda_view::<f32>(&ws, wl, "rms_norm_bf16 weight")?;
        // SAFETY: one block per row writes all of it.
        let mut out = unsafe { dev.alloc::<bf16>(rows * n)? };
        let func = dev.get_or_load_custom_func(
            "rms_norm_bf16",
            "inferno_layer_norm_act",
            LAYER_NORM_ACT_PTX,
        )?;
        let n32 = int(n, "rms_norm_bf16 width")?;
        let cfg = LaunchConfig {
            grid_dim: (int(rows, "rms_norm_bf16 rows")? as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = func.builder();
        b.arg(&x).arg(&w).arg(&mut out).arg(&n32).arg(&self.eps);
        // SAFETY: the arguments match the kernel's signature; x holds rows·n values, w n.
        unsafe { b.launch(cfg) }.w()?;
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev },
            Shape::from((rows, n)),
        ))
    }
}

struct SiluMulBf16;

impl CustomOp1 for SiluMulBf16 {
    fn name(&self) -> &'static str {
        "silu_mul_bf16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, n2) = l.shape().dims2()?;
        let n = n2 / 2;
        let gu = cpu_f32(s, l, "silu_mul_bf16")?;
        let mut out = Vec::with_capacity(rows * n);
        for row in gu.chunks_exact(n2) {
            let (g, u) = row.split_at(n);
            out.extend(g.iter().zip(u).map(|(g, u)| bf16::from_f32(g / (1.0 + (-g).exp()) * u)));
        }
        Ok((CpuStorage::BF16(out), Shape::from((rows, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

        use super::cuda::{LAYER_NORM_ACT_PTX, int};

        let (rows, n2) = l.shape().dims2()?;
        let n = n2 / 2;
        let dev = s.device.clone();
        let gu = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        // SAFETY: one thread per output element writes it.
        let mut out = unsafe { dev.alloc::<bf16>(rows * n)? };
        let func = dev.get_or_load_custom_func(
            "silu_mul_bf16",
            "inferno_layer_norm_act",
            LAYER_NORM_ACT_PTX,
        )?;
        let (r32, n32) = (int(rows, "silu_mul_bf16 rows")?, int(n, "silu_mul_bf16 width")?);
        let cfg = LaunchConfig::for_num_elems(int(rows * n, "silu_mul_bf16 elements")? as u32);
        let mut b = func.builder();
        b.arg(&gu).arg(&mut out).arg(&r32).arg(&n32);
        // SAFETY: the arguments match the kernel's signature; gu holds rows·2n values.
        unsafe { b.launch(cfg) }.w()?;
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev },
            Shape::from((rows, n)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;
    use crate::kernels::testing::{rng, tensor, uniform, values};

    /// Within one bf16 rounding step of the f32 value (the two sides may round a value near a
    /// boundary apart).
    fn assert_bf16_close(name: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{name}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= w.abs() / 128.0 + 1e-6, "{name}[{i}]: {g} vs {w}");
        }
    }

    /// The bf16 references against candle's f32 ops (what the f32 path runs).
    #[test]
    fn references_match_candle_ops() {
        let mut r = rng("layer_norm_act reference");
        let (rows, n) = (3, 70);
        let x = tensor(uniform(&mut r, rows * n, -3.0, 3.0), &[rows, n], DType::F32);
        let w = tensor(uniform(&mut r, n, 0.5, 1.5), &[n], DType::F32);
        let got = values(&rms_norm_to(&x, &w, 1e-5, DType::BF16).expect("bf16"));
        let want = values(&rms_norm_to(&x, &w, 1e-5, DType::F32).expect("f32"));
        assert_bf16_close("rms_norm", &got, &want);
        let gu = tensor(uniform(&mut r, rows * 2 * n, -6.0, 6.0), &[rows, 2 * n], DType::F32);
        let got = values(&silu_mul_to(&gu, DType::BF16).expect("bf16"));
        let want = values(&silu_mul_to(&gu, DType::F32).expect("f32"));
        assert_bf16_close("silu_mul", &got, &want);
    }

    /// The kernels against the references on random shapes, and a row alone equals the same
    /// row in a batch bit for bit.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_reference() {
        use rand::Rng;
        let dev = crate::kernels::testing::gpu();
        let mut r = rng("layer_norm_act gpu");
        for _ in 0..6 {
            let (rows, n) = (r.random_range(1..=40), r.random_range(1..=3000));
            let x = tensor(uniform(&mut r, rows * n, -4.0, 4.0), &[rows, n], DType::F32);
            let w = tensor(uniform(&mut r, n, -1.5, 1.5), &[n], DType::F32);
            let want = values(&rms_norm_to(&x, &w, 1e-6, DType::BF16).expect("cpu"));
            let (xd, wd) = (x.to_device(&dev).expect("x"), w.to_device(&dev).expect("w"));
            let got = values(&rms_norm_to(&xd, &wd, 1e-6, DType::BF16).expect("gpu"));
            assert_bf16_close(&format!("rms_norm {rows}x{n}"), &got, &want);
            let last = xd.narrow(0, rows - 1, 1).expect("row");
            let one = values(&rms_norm_to(&last, &wd, 1e-6, DType::BF16).expect("gpu"));
            assert!(
                one.iter().zip(&got[(rows - 1) * n..]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "rms_norm {rows}x{n}: the last row alone differs"
            );
            let gu = tensor(uniform(&mut r, rows * 2 * n, -8.0, 8.0), &[rows, 2 * n], DType::F32);
            let want = values(&silu_mul_to(&gu, DType::BF16).expect("cpu"));
            let got =
                values(&silu_mul_to(&gu.to_device(&dev).expect("gu"), DType::BF16).expect("gpu"));
            assert_bf16_close(&format!("silu_mul {rows}x{n}"), &got, &want);
        }
    }
}
