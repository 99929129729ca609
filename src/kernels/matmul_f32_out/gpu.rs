//! The CUDA side of [`super::matmul_f32_out`] (our GEMV or cuBLAS's GemmEx) and of
//! [`super::hi_lo_split`] (`hi_lo.cu`).

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::cublas::{result::gemm_ex, sys};
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};
use candle_core::{CudaStorage, Layout, Result, Shape};
use half::bf16;

use super::Route;
use crate::kernels::cuda::{fatbin, int};
use crate::kernels::gemv_bf16::{self, Epilogue, Kernel};
use crate::kernels::launch::Launch;

/// f32 `[m, k]` to bf16 `[2m, k]`: the rows of hi, then those of lo.
pub(super) fn hi_lo_split(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (m, k) = l.shape().dims2()?;
    let dev = s.device.clone();
    let x = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    let n = m * k;
    // SAFETY: the kernel writes all 2n elements.
    let mut out = unsafe { dev.alloc::<bf16>(2 * n)? };
    let n32 = int(n, "hi_lo_split elements")?;
    let func = fatbin::matmul_f32_out::HI_LO.func(&dev, "hi_lo_split")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&x).ptr_mut(&mut out).val(n32);
    let cfg = LaunchConfig::for_num_elems(n as u32);
    // SAFETY: the arguments match the kernel's signature; threads past n return. It waits (PDL)
    // before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok((CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev }, Shape::from((2 * m, k))))
}

/// `x · wᵀ` with an f32 result: one of our kernels where `route` (or, for [`Route::Auto`],
/// [`gemv_bf16::kernel_for`]) takes it and the rows are aligned, else cuBLAS.
pub(super) fn matmul(
    route: Route,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let ((m, k), (n, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
    let dev = s1.device.clone();
    let x = s1.as_cuda_slice::<bf16>()?.slice(l1.start_offset()..);
    let w = s2.as_cuda_slice::<bf16>()?.slice(l2.start_offset()..);
    // SAFETY: the GEMV or the GEMM below writes all m·n elements.
    let mut out = unsafe { dev.alloc::<f32>(m * n)? };
    let aligned = k.is_multiple_of(8)
        && l1.start_offset().is_multiple_of(8)
        && l2.start_offset().is_multiple_of(8);
    let kernel = match route {
        Route::Auto => gemv_bf16::kernel_for(m, n),
        Route::Gemv(_) => Some(Kernel::Split),
        Route::Rows(_) => Some(Kernel::Rows),
        Route::Cublas => None,
    };
    let done = |out| {
        Ok((
            CudaStorage { slice: CudaStorageSlice::F32(out), device: dev.clone() },
            Shape::from((m, n)),
        ))
    };
    match kernel {
        Some(Kernel::Split) if aligned => {
            let batch = match route {
                Route::Gemv(b) => b,
                _ => None,
            };
            // The GEMV takes up to 64 rows a launch; more (forced: tests, timings) take several.
            for r0 in (0..m).step_by(64) {
                let rows = (m - r0).min(64);
                let mut o = out.slice_mut(r0 * n..(r0 + rows) * n);
                let xs = x.slice(r0 * k..(r0 + rows) * k);
                gemv_bf16::launch(&dev, &xs, &w, (&mut o, Epilogue::F32), (rows, n, k), batch)?;
            }
            return done(out);
        }
        Some(Kernel::Rows) if aligned => {
            let mt = match route {
                Route::Rows(mt) => mt,
                _ => None,
            };
            gemv_bf16::launch_rows(&dev, &x, &w, &mut out, (m, n, k), mt)?;
            return done(out);
        }
        _ => {}
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
    Ok((CudaStorage { slice: CudaStorageSlice::F32(out), device: dev }, Shape::from((m, n))))
}
