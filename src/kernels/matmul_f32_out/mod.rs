//! `x · wᵀ` for bf16 `x` and `w` with the result *kept* in f32: the LM head's product, and
//! the q/k/v and o projections' ([`crate::models::linear::Linear::matmul_f32`]).
//!
//! candle's bf16 matmul accumulates in f32 but rounds its output to bf16, and a logit near 10
//! then moves by up to 1/32 (bf16 keeps 8 significant bits). Logits closer than that tie or
//! swap, which flips greedy picks and skews sampling for no gain: the head's output is 201k
//! values per token, not a tensor anyone stores. On a 20b-shaped random gpt-oss checkpoint
//! (damped, 512 positions) this rounding cost 11 of the 14 bf16 top-1 misses
//! scripts/analysis/gpt_oss_precision.py counts. cuBLAS's GemmEx takes bf16 inputs and writes
//! f32; candle has no way to ask for it, so this op calls it on candle's cuBLAS handle and
//! stream. The few rows of a decode step take our tensor-core GEMV instead where it is faster
//! (`gemv_bf16.rs`).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::F32Reader;

/// `x` (`[m, k]`) times `w` (`[n, k]`) transposed: f32 `[m, n]`, from bf16 inputs with f32
/// accumulation and no rounding of the result.
pub fn matmul_f32_out(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (Ok((m, k)), Ok((n, kw))) = (x.dims2(), w.dims2()) else {
        bail!("matmul_f32_out: expected [m, k] and [n, k], got {:?} and {:?}", x.dims(), w.dims());
    };
    if k != kw || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 {
        bail!(
            "matmul_f32_out: expected bf16 [{m}, k] and [{n}, k] with equal k, got {:?} {:?} and {:?} {:?}",
            x.dtype(),
            x.dims(),
            w.dtype(),
            w.dims()
        );
    }
    x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &MatmulF32Out { route: Route::Auto })
}

/// `x · wᵀ` for f32 `x` (`[m, k]`) and bf16 `w` (`[n, k]`): f32 `[m, n]` with `x` carried as two
/// bf16 halves, `hi = bf16(x)` and `lo = bf16(x − hi)` (16 significant bits instead of 8), in
/// one GEMM of `2m` rows whose two halves are added. For the LM head: the final hidden state is
/// f32 and rounding it to bf16 alone flips a 20b-shaped random checkpoint's top-1 at ~1% of
/// positions (gpt_oss_precision.py, "only head_in"). A decode step's GEMM with two rows reads
/// the head's weights once, as with one: the cost is the split's launch and the final add.
pub fn matmul_hi_lo(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let m = x.dim(0)?;
    let y = matmul_f32_out(&hi_lo_split(x)?, w)?;
    y.narrow(0, 0, m)? + y.narrow(0, m, m)?
}

/// `[m, k]` values as bf16 `[2m, k]`: the rows of `hi = bf16(x)`, then those of `lo = bf16(x − hi)`
/// (round to nearest even, as `half` and `__float2bfloat16_rn` do).
pub fn hi_lo_split(x: &Tensor) -> Result<Tensor> {
    if x.rank() != 2 {
        bail!("hi_lo_split: expected [m, k], got {:?}", x.dims());
    }
    x.to_dtype(DType::F32)?.contiguous()?.apply_op1_no_bwd(&HiLoSplit)
}

struct HiLoSplit;

impl CustomOp1 for HiLoSplit {
    fn name(&self) -> &'static str {
        "hi_lo_split"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (m, k) = l.shape().dims2()?;
        let x = super::cpu_f32(s, l, "hi_lo_split")?;
        let hi: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let lo = x.iter().zip(&hi).map(|(&v, h)| bf16::from_f32(v - h.to_f32()));
        let out: Vec<bf16> = hi.iter().copied().chain(lo).collect();
        Ok((CpuStorage::BF16(out), Shape::from((2 * m, k))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

        use super::cuda::{HI_LO_PTX, int};

        let (m, k) = l.shape().dims2()?;
        let dev = s.device.clone();
        let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        let n = m * k;
        // SAFETY: the kernel writes all 2n elements.
        let mut out = unsafe { dev.alloc::<bf16>(2 * n)? };
        let n32 = int(n, "hi_lo_split elements")?;
        let func = dev.get_or_load_custom_func("hi_lo_split", "inferno_hi_lo", HI_LO_PTX)?;
        let mut b = func.builder();
        b.arg(&x).arg(&mut out).arg(&n32);
        let cfg = LaunchConfig::for_num_elems(n as u32);
        // SAFETY: the arguments match the kernel's signature; threads past n return.
        unsafe { b.launch(cfg) }.w()?;
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev },
            Shape::from((2 * m, k)),
        ))
    }
}

/// Which product [`MatmulF32Out`] runs on the GPU: the faster for the shape
/// ([`super::gemv_bf16::gemv_wins`]), or one of the two by force (tests and timings compare
/// them).
#[derive(Clone, Copy, PartialEq)]
// Only the GPU tests and timings force a route.
#[cfg_attr(any(not(feature = "cuda"), not(test)), allow(dead_code))]
enum Route {
    Auto,
    Cublas,
    /// Our GEMV, with U forced for up to 8 rows (`gemv_bf16::launch`'s `batch`).
    Gemv(Option<usize>),
}

struct MatmulF32Out {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    route: Route,
}

impl CustomOp2 for MatmulF32Out {
    fn name(&self) -> &'static str {
        "matmul_f32_out"
    }

    /// The reference: each output a plain f32 sum of exact bf16 products.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((m, k), (n, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let to_f32 = |s: &CpuStorage, l: &Layout, len: usize| -> Result<Vec<f32>> {
            let r = F32Reader::new(s, "matmul_f32_out")?;
            Ok((0..len).map(|i| r.get(l.start_offset() + i)).collect())
        };
        let (x, w) = (to_f32(s1, l1, m * k)?, to_f32(s2, l2, n * k)?);
        let mut out = Vec::with_capacity(m * n);
        for row in x.chunks_exact(k) {
            out.extend(
                w.chunks_exact(k).map(|col| row.iter().zip(col).map(|(a, b)| a * b).sum::<f32>()),
            );
        }
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice;
        use candle_core::cuda_backend::cudarc::cublas::{result::gemm_ex, sys};
        use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};

        use super::cuda::int;
        use super::gemv_bf16::{self, Epilogue};

        let ((m, k), (n, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let dev = s1.device.clone();
        let x = s1.as_cuda_slice::<bf16>()?.slice(l1.start_offset()..);
        let w = s2.as_cuda_slice::<bf16>()?.slice(l2.start_offset()..);
        // SAFETY: the GEMV or the GEMM below writes all m·n elements.
        let mut out = unsafe { dev.alloc::<f32>(m * n)? };
        let aligned = k.is_multiple_of(8)
            && l1.start_offset().is_multiple_of(8)
            && l2.start_offset().is_multiple_of(8);
        let gemv = match self.route {
            Route::Auto => gemv_bf16::gemv_wins(m, n),
            Route::Gemv(_) => m <= 64,
            Route::Cublas => false,
        };
        if aligned && gemv {
            let batch = match self.route {
                Route::Gemv(b) => b,
                _ => None,
            };
            gemv_bf16::launch(&dev, &x, &w, (&mut out, Epilogue::F32), (m, n, k), batch)?;
            return Ok((
                candle_core::CudaStorage { slice: CudaStorageSlice::F32(out), device: dev },
                Shape::from((m, n)),
            ));
        }
        let (m32, n32, k32) = (int(m, "rows")?, int(n, "outputs")?, int(k, "inner dim")?);
        let blas = dev.cublas_handle();
        let stream = dev.cuda_stream();
        let (alpha, beta) = (1f32, 0f32);
        {
            let (xp, _gx) = x.device_ptr(&stream);
            let (wp, _gw) = w.device_ptr(&stream);
            let (op, _go) = out.device_ptr_mut(&stream);
            // Column-major view: outᵀ (n × m) = w (read as k × n, transposed) · xᵀ (k × m).
            // SAFETY: the pointers hold k·n, k·m and n·m elements of the types named; the
            // handle is candle's, bound to the stream these buffers belong to.
            unsafe {
                gemm_ex(
                    *blas.handle(),
                    sys::cublasOperation_t::CUBLAS_OP_T,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    n32,
                    m32,
                    k32,
                    (&alpha) as *const f32 as *const _,
                    wp as *const _,
                    sys::cudaDataType_t::CUDA_R_16BF,
                    k32,
                    xp as *const _,
                    sys::cudaDataType_t::CUDA_R_16BF,
                    k32,
                    (&beta) as *const f32 as *const _,
                    op as *mut _,
                    sys::cudaDataType_t::CUDA_R_32F,
                    n32,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| candle_core::Error::Msg(format!("matmul_f32_out: cuBLAS: {e:?}")))?;
        }
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::F32(out), device: dev },
            Shape::from((m, n)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::kernels::testing::{rng, tensor, uniform, values};

    /// The reference against candle's f32 matmul of the same (bf16-exact) values.
    #[test]
    fn reference_is_the_f32_product_of_the_bf16_values() {
        let mut r = rng("matmul_f32_out reference");
        let (m, n, k) = (3, 17, 40);
        let x = tensor(uniform(&mut r, m * k, -2.0, 2.0), &[m, k], DType::BF16);
        let w = tensor(uniform(&mut r, n * k, -2.0, 2.0), &[n, k], DType::BF16);
        let got = values(&matmul_f32_out(&x, &w).expect("op"));
        let f = |t: &Tensor| t.to_dtype(DType::F32).expect("f32");
        let want = values(&f(&x).matmul(&f(&w).t().expect("t")).expect("matmul"));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }

    /// hi + lo keeps 16 significant bits of `x`: ~2^-17 relative error against the f32 product,
    /// where rounding `x` to bf16 gives ~2^-9.
    #[test]
    fn hi_lo_is_close_to_the_f32_product() {
        let mut r = rng("matmul_hi_lo");
        let (m, n, k) = (5, 33, 200);
        let x = tensor(uniform(&mut r, m * k, -3.0, 3.0), &[m, k], DType::F32);
        let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
        let want = values(
            &x.matmul(&w.to_dtype(DType::F32).expect("f32").t().expect("t")).expect("matmul"),
        );
        let hi_lo =
            crate::kernels::testing::rel_err(&values(&matmul_hi_lo(&x, &w).expect("hi lo")), &want);
        let bf16_only = matmul_f32_out(&x.to_dtype(DType::BF16).expect("bf16"), &w).expect("bf16");
        let bf16_only = crate::kernels::testing::rel_err(&values(&bf16_only), &want);
        eprintln!("relative error: hi + lo {hi_lo:.2e}, bf16 input {bf16_only:.2e}");
        assert!(
            hi_lo < 2e-5 && hi_lo < bf16_only / 30.0,
            "hi + lo {hi_lo:e}, bf16 input {bf16_only:e}"
        );
    }

    #[test]
    fn rejects_mismatched_inputs() {
        let x = Tensor::zeros((2, 8), DType::BF16, &Device::Cpu).expect("x");
        let w = Tensor::zeros((4, 9), DType::BF16, &Device::Cpu).expect("w");
        assert!(matmul_f32_out(&x, &w).is_err());
        assert!(matmul_f32_out(&x.to_dtype(DType::F32).expect("f32"), &x).is_err());
    }

    /// cuBLAS against the reference on fresh random shapes that are no multiples of anything
    /// (one row is a decode step), and the logits are not rounded: values that bf16 cannot
    /// hold come back.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_reference() {
        let dev = crate::kernels::testing::gpu();
        let mut r = rng("matmul_f32_out gpu");
        for (m, n, k) in [(1, 1001, 2880), (7, 333, 64), (130, 517, 96)] {
            let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
            let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
            let want = values(&matmul_f32_out(&x, &w).expect("cpu"));
            let got_t =
                matmul_f32_out(&x.to_device(&dev).expect("x"), &w.to_device(&dev).expect("w"))
                    .expect("gpu");
            assert_eq!(got_t.dtype(), DType::F32);
            let got = values(&got_t);
            crate::kernels::testing::assert_written_and_close(
                &format!("matmul_f32_out {m}x{n}x{k}"),
                &got,
                &want,
                1e-5,
            );
            let off_bf16 = got.iter().filter(|&&v| half::bf16::from_f32(v).to_f32() != v).count();
            assert!(
                off_bf16 > got.len() / 2,
                "{m}x{n}x{k}: only {off_bf16} of {} results are off the bf16 grid",
                got.len()
            );
        }
        // The GEMV's shapes: 1..=64 rows (n-tiles of 8), N not a multiple of 16, K a multiple
        // of 8 but not of 32 (partial groups), K short of one group per warp, long K, tall N
        // with few warps along K (2 and 4 weight tiles per warp).
        for (m, n, k) in [
            (1, 17, 8),
            (8, 33, 24),
            (9, 100, 200),
            (16, 5, 2888),
            (32, 300, 4096),
            (64, 301, 1000),
            (12, 20_001, 72),
            (24, 20_000, 264),
            (40, 20_007, 128),
            // Decode shapes whose launches pick different U on an H100 (gpt-oss's q/k/v: 2;
            // Llama-1B's down: 8).
            (2, 5120, 2880),
            (1, 2048, 8192),
        ] {
            check_gemv(&dev, &mut r, m, n, k);
        }
        for _ in 0..8 {
            use rand::Rng;
            let (m, n, k) =
                (r.random_range(1..=64), r.random_range(1..=700), 8 * r.random_range(1..=400));
            check_gemv(&dev, &mut r, m, n, k);
        }
        let x = tensor(uniform(&mut r, 5 * 999, -1e4, 1e4), &[5, 999], DType::F32);
        let want = values(&hi_lo_split(&x).expect("cpu"));
        let got = values(&hi_lo_split(&x.to_device(&dev).expect("x")).expect("gpu"));
        assert!(
            got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
            "hi_lo_split differs from its reference"
        );
        let (m, n, k) = (3, 2001, 2880);
        let x = tensor(uniform(&mut r, m * k, -3.0, 3.0), &[m, k], DType::F32);
        let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
        let want = values(&matmul_hi_lo(&x, &w).expect("cpu"));
        let got = values(
            &matmul_hi_lo(&x.to_device(&dev).expect("x"), &w.to_device(&dev).expect("w"))
                .expect("gpu"),
        );
        crate::kernels::testing::assert_written_and_close(
            "matmul_hi_lo 3x2001x2880",
            &got,
            &want,
            1e-5,
        );
    }

    /// The GEMV (taken by force) against the reference, and batch invariance: every row of an
    /// m-row product is bit for bit that row's product alone.
    #[cfg(feature = "cuda")]
    fn check_gemv(dev: &Device, r: &mut rand::rngs::StdRng, m: usize, n: usize, k: usize) {
        let x = tensor(uniform(r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
        let w = tensor(uniform(r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
        let want = values(&matmul_f32_out(&x, &w).expect("cpu"));
        let (xd, wd) = (x.to_device(dev).expect("x"), w.to_device(dev).expect("w"));
        let gemv = MatmulF32Out { route: Route::Gemv(None) };
        let got = values(&xd.apply_op2_no_bwd(&wd, &gemv).expect("gpu"));
        let name = format!("gemv {m}x{n}x{k}");
        crate::kernels::testing::assert_written_and_close(&name, &got, &want, 1e-5);
        // Up to 8 rows, every batch size U: the same bits as the one the launch picked.
        for u in crate::kernels::gemv_bf16::BATCHES.into_iter().filter(|_| m <= 8) {
            let op = MatmulF32Out { route: Route::Gemv(Some(u)) };
            let forced = values(&xd.apply_op2_no_bwd(&wd, &op).expect("gpu"));
            assert!(
                forced.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: U = {u} differs from the chosen U"
            );
        }
        for row in [0, m - 1] {
            let one = values(
                &xd.narrow(0, row, 1).expect("row").apply_op2_no_bwd(&wd, &gemv).expect("gpu"),
            );
            assert!(
                one.iter()
                    .zip(&got[row * n..(row + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: row {row} alone differs from the same row in the batch"
            );
        }
    }

    /// Not a check: our GEMV against cuBLAS at the decode shapes of gpt-oss-20b and Llama-3.2-1B.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_gemv_timing() {
        let dev = crate::kernels::testing::gpu();
        let mut r = rng("gemv timing");
        let shapes = [
            ("gpt-oss qkv", 5120, 2880),
            ("gpt-oss o", 2880, 4096),
            ("gpt-oss head", 201_088, 2880),
            ("llama qkv", 3072, 2048),
            ("llama o", 2048, 2048),
            ("llama gate+up", 16_384, 2048),
            ("llama down", 2048, 8192),
            ("llama head", 128_256, 2048),
        ];
        for (name, n, k) in shapes {
            let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16)
                .to_device(&dev)
                .expect("w");
            let mut line = format!("gemv timing: {name:<14} {n:>6}x{k:<5}");
            for m in [1, 2, 8, 16, 32, 64] {
                let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16)
                    .to_device(&dev)
                    .expect("x");
                let mut us = [0.0; 2];
                for (i, route) in [Route::Gemv(None), Route::Cublas].into_iter().enumerate() {
                    let op = MatmulF32Out { route };
                    us[i] = crate::kernels::testing::time_us(&dev, 50, || {
                        x.apply_op2_no_bwd(&w, &op).expect("matmul");
                    });
                }
                let gbs = (n * k * 2) as f64 / us[0] / 1e3;
                line += &format!(" | m{m} {:.1} us ({gbs:.0} GB/s) vs cuBLAS {:.1}", us[0], us[1]);
            }
            eprintln!("{line}");
        }
    }
}
