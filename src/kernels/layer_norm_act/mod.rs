//! The elementwise steps around a layer's products in one launch each (`layer_norm_act.cu`):
//! the residual add (with the product's bias) in front of an RMSNorm and the norm itself, to
//! the products' input dtype; and SwiGLU from the fused gate/up product. bf16 outputs of f32
//! inputs on the GPU take the kernels; everything else (CPU, f32 models) takes candle's ops,
//! the unfused steps computing the same values ([`rms_norm`]: candle-nn's fused norm, which the
//! models' final norm takes too).

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::cpu_f32;

/// RMSNorm of `x` computed in f32 (the weight is upcast): `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    // candle-nn's fused kernel: one launch instead of seven (square, sum, divide, add, sqrt,
    // divide, multiply), which matters in decode, where every launch costs host time.
    let xf = x.to_dtype(DType::F32)?.contiguous()?;
    candle_nn::ops::rms_norm(&xf, &w.to_dtype(DType::F32)?, eps as f32)
}

/// The residual stream after a layer's step and its RMSNorm: what [`add_rms_norm`] returns.
pub struct Normed {
    /// `x + (delta + bias)`, f32.
    pub x: Tensor,
    /// RMSNorm of `x` in the products' dtype: computed in f32, rounded once.
    pub h: Tensor,
    /// The same norm in f32, when asked for.
    pub h32: Option<Tensor>,
}

/// `x + (delta + bias)` (f32 `[rows, n]`, bias `[n]`; the bias only with a delta) and its
/// RMSNorm with weight `w` in `dtype`, in one launch on the GPU. With `keep_f32` the norm also
/// comes unrounded ([`Normed::h32`]), from the same launch: for a layer whose next step reads
/// both (gpt-oss: the router in f32, the experts in bf16).
pub fn add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    bias: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
    dtype: DType,
    keep_f32: bool,
) -> Result<Normed> {
    if bias.is_some() && delta.is_none() {
        bail!("add_rms_norm: a bias needs the product it belongs to");
    }
    #[cfg(feature = "cuda")]
    if dtype == DType::BF16
        && x.device().is_cuda()
        && [Some(x), delta, bias, Some(w)].into_iter().flatten().all(|t| t.dtype() == DType::F32)
    {
        return gpu::add_rms_norm(x, delta, bias, w, eps as f32, keep_f32);
    }
    let x = match (delta, bias) {
        (Some(d), Some(b)) => (x + d.broadcast_add(&b.to_dtype(DType::F32)?)?)?,
        (Some(d), None) => (x + d)?,
        _ => x.clone(),
    };
    let h32 = rms_norm(&x, w, eps)?;
    Ok(Normed { h: h32.to_dtype(dtype)?, h32: keep_f32.then_some(h32), x })
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

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, Device, Result, Storage, Tensor, bail};
    use half::bf16;

    use super::Normed;
    use crate::kernels::cuda::{LAYER_NORM_ACT_PTX, cuda_view, int};
    use crate::kernels::launch::Launch;

    fn wrap<T: candle_core::cuda_backend::CudaDType>(
        slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        dev: &candle_core::CudaDevice,
        shape: (usize, usize),
    ) -> Tensor {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
        Tensor::from_storage(storage, shape, BackpropOp::none(), false)
    }

    pub fn add_rms_norm(
        x: &Tensor,
        delta: Option<&Tensor>,
        bias: Option<&Tensor>,
        w: &Tensor,
        eps: f32,
        keep_f32: bool,
    ) -> Result<Normed> {
        let (rows, n) = x.dims2()?;
        let Device::Cuda(dev) = x.device() else { bail!("add_rms_norm: x is not on the GPU") };
        if delta.is_some_and(|d| d.dims() != [rows, n])
            || bias.is_some_and(|b| b.dims() != [n])
            || w.dims() != [n]
        {
            bail!(
                "add_rms_norm: x {:?}, delta, bias and weight {:?} do not fit",
                x.dims(),
                w.dims()
            );
        }
        // Rows start 16-byte aligned (candle's buffers are; a view's offset may not be), so that
        // the kernel's path depends on n alone and a row gives the same bits in any batch.
        let aligned = |t: &Tensor| -> Result<Tensor> {
            let t = t.contiguous()?;
            if t.layout().start_offset() % 4 == 0 { Ok(t) } else { t.force_contiguous() }
        };
        let x = aligned(x)?;
        let (delta, bias) = (delta.map(aligned).transpose()?, bias.map(aligned).transpose()?);
        let w = aligned(w)?;
        let (xs, xl) = x.storage_and_layout();
        let ds = delta.as_ref().map(|t| t.storage_and_layout());
        let bs = bias.as_ref().map(|t| t.storage_and_layout());
        let (ws, wl) = w.storage_and_layout();
        let xv = cuda_view::<f32>(&xs, xl, "add_rms_norm x")?;
        let dv =
            ds.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "add_rms_norm delta")).transpose()?;
        let bv =
            bs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "add_rms_norm bias")).transpose()?;
        let wv = cuda_view::<f32>(&ws, wl, "add_rms_norm weight")?;
        // SAFETY: one block per row writes every element of each output it is given.
        let mut x_out = dv.as_ref().map(|_| unsafe { dev.alloc::<f32>(rows * n) }).transpose()?;
        let mut h16 = unsafe { dev.alloc::<bf16>(rows * n)? };
        let mut h32 = keep_f32.then(|| unsafe { dev.alloc::<f32>(rows * n) }).transpose()?;
        let func = dev.get_or_load_custom_func(
            "add_rms_norm_bf16",
            "inferno_layer_norm_act",
            LAYER_NORM_ACT_PTX,
        )?;
        let n32 = int(n, "add_rms_norm width")?;
        // A thread per 4 values, in whole warps, up to 1,024 (the kernel's fast path holds a row
        // of up to 16 values per thread in registers; any other row takes its strided loop).
        let threads = n.div_ceil(4).next_multiple_of(32).clamp(32, 1024);
        let cfg = LaunchConfig {
            grid_dim: (int(rows, "add_rms_norm rows")? as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = dev.cuda_stream();
        let mut b = Launch::new(&stream, &func);
        b.ptr(&xv);
        match &dv {
            Some(v) => b.ptr(v),
            None => b.null(),
        };
        match &bv {
            Some(v) => b.ptr(v),
            None => b.null(),
        };
        b.ptr(&wv);
        match &mut x_out {
            Some(v) => b.ptr_mut(v),
            None => b.null(),
        };
        b.ptr_mut(&mut h16);
        match &mut h32 {
            Some(v) => b.ptr_mut(v),
            None => b.null(),
        };
        b.val(n32).val(eps);
        // SAFETY: the arguments match the kernel's signature; x and delta hold rows·n values,
        // bias and w n; x_out is given whenever delta is, h32 when asked for, each rows·n; the
        // kernel waits (PDL) first.
        unsafe { b.launch(cfg) }?;
        drop(b);
        let new_x = match x_out {
            Some(s) => wrap(s, dev, (rows, n)),
            None => x.clone(),
        };
        let h32 = h32.map(|s| wrap(s, dev, (rows, n)));
        Ok(Normed { x: new_x, h: wrap(h16, dev, (rows, n)), h32 })
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
        use candle_core::cuda_backend::CudaStorageSlice;
        use candle_core::cuda_backend::cudarc::driver::LaunchConfig;

        use super::cuda::{LAYER_NORM_ACT_PTX, int};
        use super::launch::Launch;

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
        let stream = dev.cuda_stream();
        let mut b = Launch::new(&stream, &func);
        b.ptr(&gu).ptr_mut(&mut out).val(r32).val(n32);
        // SAFETY: the arguments match the kernel's signature; gu holds rows·2n values; the
        // kernel waits (PDL) first.
        unsafe { b.launch(cfg) }?;
        drop(b);
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

    /// The kernel's reference: (`x + (delta + bias)`, its RMSNorm in f32) with a plain f32 sum of
    /// squares per row.
    fn add_rms_norm_reference(
        x: &[f32],
        delta: Option<&[f32]>,
        bias: Option<&[f32]>,
        w: &[f32],
        eps: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let n = w.len();
        let v: Vec<f32> = match delta {
            Some(d) => x
                .iter()
                .zip(d)
                .enumerate()
                .map(|(i, (x, d))| x + bias.map_or(*d, |b| d + b[i % n]))
                .collect(),
            None => x.to_vec(),
        };
        let mut h = Vec::with_capacity(v.len());
        for row in v.chunks_exact(n) {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / n as f32 + eps).sqrt();
            h.extend(row.iter().zip(w).map(|(v, w)| v * inv * w));
        }
        (v, h)
    }

    /// Within one bf16 rounding step of the f32 value (the two sides may round a value near a
    /// boundary apart).
    fn assert_bf16_close(name: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{name}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= w.abs() / 128.0 + 1e-6, "{name}[{i}]: {g} vs {w}");
        }
    }

    /// The f32 values within `tol` of the reference's, relative to the row's largest.
    fn assert_f32_close(name: &str, got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{name}: lengths");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * scale, "{name}[{i}]: {g} vs {w}");
        }
    }

    /// Random f32 inputs of add_rms_norm: x, delta, bias, w.
    fn norm_inputs(r: &mut rand::rngs::StdRng, rows: usize, n: usize) -> [Tensor; 4] {
        [
            tensor(uniform(r, rows * n, -4.0, 4.0), &[rows, n], DType::F32),
            tensor(uniform(r, rows * n, -2.0, 2.0), &[rows, n], DType::F32),
            tensor(uniform(r, n, -1.0, 1.0), &[n], DType::F32),
            tensor(uniform(r, n, -1.5, 1.5), &[n], DType::F32),
        ]
    }

    /// The reference against candle's unfused ops (what CPU and f32 models run), with and
    /// without a delta and a bias; and the bf16 SwiGLU against the f32 one.
    #[test]
    fn references_match_candle_ops() {
        let mut r = rng("layer_norm_act reference");
        let (rows, n) = (3, 70);
        let [x, d, b, w] = norm_inputs(&mut r, rows, n);
        for (delta, bias) in [(None, None), (Some(&d), None), (Some(&d), Some(&b))] {
            let got = add_rms_norm(&x, delta, bias, &w, 1e-5, DType::F32, false).expect("ops");
            let (v, h) = add_rms_norm_reference(
                &values(&x),
                delta.map(values).as_deref(),
                bias.map(values).as_deref(),
                &values(&w),
                1e-5,
            );
            let name = format!("delta {} bias {}", delta.is_some(), bias.is_some());
            assert_eq!(values(&got.x), v, "{name}: the residual stream");
            assert_f32_close(&name, &values(&got.h), &h, 1e-5);
            let both = add_rms_norm(&x, delta, bias, &w, 1e-5, DType::BF16, true).expect("ops");
            let h32 = both.h32.expect("the f32 norm");
            assert_f32_close(&name, &values(&h32), &h, 1e-5);
            assert_eq!(values(&both.h), values(&h32.to_dtype(DType::BF16).expect("bf16")));
        }
        assert!(add_rms_norm(&x, None, Some(&b), &w, 1e-5, DType::F32, false).is_err());
        let gu = tensor(uniform(&mut r, rows * 2 * n, -6.0, 6.0), &[rows, 2 * n], DType::F32);
        let got = values(&silu_mul_to(&gu, DType::BF16).expect("bf16"));
        let want = values(&silu_mul_to(&gu, DType::F32).expect("f32"));
        assert_bf16_close("silu_mul", &got, &want);
    }

    /// The kernels against the references on random shapes (the residual stream bit for bit,
    /// the norm in f32 and bf16), and a row alone equals the same row in a batch bit for bit.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_reference() {
        use rand::Rng;
        let dev = crate::kernels::testing::gpu();
        let mut r = rng("layer_norm_act gpu");
        // Widths that are multiples of 4 take the kernel's registers path (gpt-oss's 2880 and
        // Llama's 2048 among them), the others its strided loop.
        for case in 0..15 {
            let n = match case {
                0 => 2880,
                1 => 2048,
                2..=7 => 4 * r.random_range(1..=1500),
                _ => r.random_range(1..=3000),
            };
            let rows = r.random_range(1..=40);
            let cpu = norm_inputs(&mut r, rows, n);
            let [x, d, b, w] = cpu.clone().map(|t| t.to_device(&dev).expect("to GPU"));
            let (delta, bias) = match case % 3 {
                0 => (None, None),
                1 => (Some(&d), None),
                _ => (Some(&d), Some(&b)),
            };
            let name = format!("add_rms_norm {rows}x{n} case {}", case % 3);
            let (v, h) = add_rms_norm_reference(
                &values(&cpu[0]),
                delta.map(|_| values(&cpu[1])).as_deref(),
                bias.map(|_| values(&cpu[2])).as_deref(),
                &values(&cpu[3]),
                1e-6,
            );
            let got = add_rms_norm(&x, delta, bias, &w, 1e-6, DType::BF16, true).expect("gpu");
            assert_eq!(values(&got.x), v, "{name}: the residual stream");
            assert_bf16_close(&name, &values(&got.h), &h);
            let h32 = values(got.h32.as_ref().expect("the f32 norm"));
            assert_f32_close(&format!("{name} f32"), &h32, &h, 1e-5);
            // The bf16 output is the f32 one rounded once.
            let rounded: Vec<f32> = h32.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
            assert_eq!(values(&got.h), rounded, "{name}: bf16 = round(f32)");
            let row = |t: &Tensor| t.narrow(0, rows - 1, 1).expect("row");
            let one =
                add_rms_norm(&row(&x), delta.map(row).as_ref(), bias, &w, 1e-6, DType::BF16, false)
                    .expect("gpu");
            let all = values(&got.h);
            assert!(
                values(&one.h)
                    .iter()
                    .zip(&all[(rows - 1) * n..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: the last row alone differs"
            );
            let gu = tensor(uniform(&mut r, rows * 2 * n, -8.0, 8.0), &[rows, 2 * n], DType::F32);
            let want = values(&silu_mul_to(&gu, DType::BF16).expect("cpu"));
            let got =
                values(&silu_mul_to(&gu.to_device(&dev).expect("gu"), DType::BF16).expect("gpu"));
            assert_bf16_close(&format!("silu_mul {rows}x{n}"), &got, &want);
        }
    }
}
