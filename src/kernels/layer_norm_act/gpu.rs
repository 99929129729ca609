//! The launches of `layer_norm_act.cu`.

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{CudaStorage, Device, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::Normed;
use crate::kernels::cuda::{cuda_view, f32_aligned16, fatbin, int, tensor};
use crate::kernels::launch::Launch;

pub(super) fn add_rms_norm(
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
        bail!("add_rms_norm: x {:?}, delta, bias and weight {:?} do not fit", x.dims(), w.dims());
    }
    // Rows start 16-byte aligned, so that the kernel's path depends on n alone and a row gives
    // the same bits in any batch.
    let x = f32_aligned16(x)?;
    let delta = delta.map(f32_aligned16).transpose()?;
    let (bias, w) = (bias.map(f32_aligned16).transpose()?, f32_aligned16(w)?);
    let (xs, xl) = x.storage_and_layout();
    let ds = delta.as_ref().map(|t| t.storage_and_layout());
    let bs = bias.as_ref().map(|t| t.storage_and_layout());
    let (ws, wl) = w.storage_and_layout();
    let xv = cuda_view::<f32>(&xs, xl, "add_rms_norm x")?;
    let dv = ds.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "add_rms_norm delta")).transpose()?;
    let bv = bs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "add_rms_norm bias")).transpose()?;
    let wv = cuda_view::<f32>(&ws, wl, "add_rms_norm weight")?;
    // SAFETY: one block per row writes every element of each output it is given.
    let mut x_out = dv.as_ref().map(|_| unsafe { dev.alloc::<f32>(rows * n) }).transpose()?;
    let mut h16 = unsafe { dev.alloc::<bf16>(rows * n)? };
    let mut h32 = keep_f32.then(|| unsafe { dev.alloc::<f32>(rows * n) }).transpose()?;
    let func = fatbin::layer_norm_act::LAYER_NORM_ACT.func(dev, "add_rms_norm_bf16")?;
    let n32 = int(n, "add_rms_norm width")?;
    // Rows wider than its fast path holds take the kernel's strided loop.
    let threads = super::norm_threads(n);
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
        Some(s) => tensor(s, dev, &[rows, n]),
        None => x.clone(),
    };
    let h32 = h32.map(|s| tensor(s, dev, &[rows, n]));
    Ok(Normed { x: new_x, h: tensor(h16, dev, &[rows, n]), h32 })
}

/// `silu_mul_bf16`: bf16 `[rows, n]` from the f32 gate/up product `[rows, 2n]`.
pub(super) fn silu_mul_bf16(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (rows, n2) = l.shape().dims2()?;
    let n = n2 / 2;
    let dev = s.device.clone();
    let gu = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
    // SAFETY: one thread per output element writes it.
    let mut out = unsafe { dev.alloc::<bf16>(rows * n)? };
    let func = fatbin::layer_norm_act::LAYER_NORM_ACT.func(&dev, "silu_mul_bf16")?;
    let (r32, n32) = (int(rows, "silu_mul_bf16 rows")?, int(n, "silu_mul_bf16 width")?);
    let cfg = LaunchConfig::for_num_elems(int(rows * n, "silu_mul_bf16 elements")? as u32);
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&gu).ptr_mut(&mut out).val(r32).val(n32);
    // SAFETY: the arguments match the kernel's signature; gu holds rows·2n values; the
    // kernel waits (PDL) first.
    unsafe { b.launch(cfg) }?;
    drop(b);
    Ok((CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev }, Shape::from((rows, n))))
}
