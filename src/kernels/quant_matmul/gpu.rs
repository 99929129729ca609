//! The launches of `ct_quant.cu` and of `gguf_gemv.cu`'s dequantizers (see `mod.rs`).

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{CudaDevice, DType, Device, Result, Tensor, bail};
use half::bf16;

use super::GEMV_ROWS;
use crate::kernels::cuda::{cuda_view, fatbin, int, tensor};
use crate::kernels::launch::Launch;
use crate::kernels::matmul_f32_out;
use crate::quant::{ActQuant, QuantLinear, WeightFormat};

/// Which product runs: the one for the shape, or one by force (tests and timings).
#[derive(Clone, Copy, PartialEq)]
pub enum Route {
    Auto,
    #[cfg_attr(not(test), allow(dead_code))]
    Gemm,
    /// ct_gemv.cu with this many weight tiles per warp.
    #[cfg_attr(not(test), allow(dead_code))]
    GemvTiles(usize),
}

/// I32 tensors on `dev` stacked along their first dimension by device-to-device copies.
pub(super) fn stack_i32(ts: &[&Tensor], dev: &CudaDevice) -> Result<Tensor> {
    let Some(first) = ts.first() else { bail!("stack_i32: nothing to stack") };
    let mut shape = first.dims().to_vec();
    if shape.is_empty() || ts.iter().any(|t| t.rank() != shape.len() || t.dims()[1..] != shape[1..])
    {
        bail!("stack_i32: shapes differ past the first dimension");
    }
    shape[0] = ts.iter().map(|t| t.dim(0)).sum::<Result<usize>>()?;
    let total: usize = shape.iter().product();
    // SAFETY: the copies below write all `total` elements.
    let mut out = unsafe { dev.alloc::<i32>(total)? };
    let mut at = 0;
    for t in ts {
        let t = t.contiguous()?;
        let n = t.elem_count();
        let (s, l) = t.storage_and_layout();
        let src = cuda_view::<i32>(&s, l, "stacked part")?.slice(0..n);
        let mut dst = out.slice_mut(at..at + n);
        dev.cuda_stream().memcpy_dtod(&src, &mut dst).w()?;
        at += n;
    }
    Ok(tensor(out, dev, &shape))
}

fn act_code(act: ActQuant) -> i32 {
    match act {
        ActQuant::Int8Token => 1,
        ActQuant::Fp8Token => 2,
        // Per-block scales do not factor out of a GEMM: Q8_0 prefill multiplies bf16 x by the
        // dequantized weight (quant_matmul) and never quantizes x this way.
        ActQuant::None | ActQuant::Int8Block => 0,
    }
}

/// The rows of `x` (bf16 `[m, k]`) quantized per token: the quantized values (bf16, exact) and
/// each row's scale (f32 `[m]`).
pub fn act_quant(x: &Tensor, act: ActQuant) -> Result<(Tensor, Tensor)> {
    let (m, k) = x.dims2()?;
    let Device::Cuda(dev) = x.device() else { bail!("act_quant: x is not on the GPU") };
    let x = x.to_dtype(DType::BF16)?.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let xv = cuda_view::<bf16>(&xs, xl, "act_quant x")?;
    // SAFETY: one block per row writes all k values and the scale.
    let mut q = unsafe { dev.alloc::<bf16>(m * k)? };
    let mut s = unsafe { dev.alloc::<f32>(m)? };
    let func = fatbin::quant_matmul::CT_QUANT.func(dev, "ct_act_quant")?;
    let cfg = LaunchConfig {
        grid_dim: (int(m, "rows")? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let (k32, a) = (int(k, "inner dim")?, act_code(act));
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&xv).ptr_mut(&mut q).ptr_mut(&mut s).val(k32).val(a);
    // SAFETY: the arguments match ct_act_quant's signature and sizes; it waits (PDL) before
    // anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    drop(xs);
    Ok((tensor(q, dev, &[m, k]), tensor(s, dev, &[m])))
}

fn elementwise(n: usize) -> Result<LaunchConfig> {
    let blocks = n.div_ceil(256);
    Ok(LaunchConfig {
        grid_dim: (int(blocks, "blocks")? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The weight as bf16 `[out, in]`: the quantized values for compressed-tensors' 8-bit weights
/// (unscaled), the dequantized values for 4-bit ones and for GGUF's Q8_0 (its block scales do not
/// factor out of a GEMM; natural column order).
pub fn dequantize(w: &QuantLinear) -> Result<Tensor> {
    let Device::Cuda(dev) = w.q.device() else { bail!("dequantize: weight is not on the GPU") };
    let n = w.out * w.inp;
    // SAFETY: one thread per element writes all n.
    let mut out = unsafe { dev.alloc::<bf16>(n)? };
    let (qs, ql) = w.q.storage_and_layout();
    let stream = dev.cuda_stream();
    // Every kernel here waits (PDL) before anything else.
    match w.scheme.weight {
        WeightFormat::Int8 | WeightFormat::Fp8 => {
            let qv = cuda_view::<u8>(&qs, ql, "weight")?;
            let func = fatbin::quant_matmul::CT_QUANT.func(dev, "ct_dequant_8bit")?;
            let (n64, fp8) = (n as i64, i32::from(w.scheme.weight == WeightFormat::Fp8));
            let mut b = Launch::new(&stream, &func);
            b.ptr(&qv).ptr_mut(&mut out).val(n64).val(fp8);
            // SAFETY: q holds n bytes, out n values.
            unsafe { b.launch(elementwise(n)?) }?;
        }
        WeightFormat::Int4 { .. } => {
            let qv = cuda_view::<i32>(&qs, ql, "packed weight")?;
            let (ss, sl) = w.scale.storage_and_layout();
            let sv = cuda_view::<f32>(&ss, sl, "scale")?;
            let zs = w.zero.as_ref().map(|z| z.storage_and_layout());
            let zv = zs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "zero")).transpose()?;
            let gs = w.g_idx.as_ref().map(|g| g.storage_and_layout());
            let gv = gs.as_ref().map(|(s, l)| cuda_view::<u32>(s, l, "g_idx")).transpose()?;
            let func = fatbin::quant_matmul::CT_QUANT.func(dev, "ct_dequant_int4")?;
            let groups = w.scale.elem_count() / w.out;
            let (rows, inp) = (int(w.out, "rows")?, int(w.inp, "in")?);
            let (g32, group) = (int(groups, "groups")?, int(w.group, "group")?);
            let mut b = Launch::new(&stream, &func);
            b.ptr(&qv).ptr(&sv);
            match &zv {
                Some(v) => b.ptr(v),
                None => b.null(),
            };
            match &gv {
                Some(v) => b.ptr(v),
                None => b.null(),
            };
            b.ptr_mut(&mut out).val(rows).val(inp).val(g32).val(group);
            // SAFETY: the tensors hold what the kernel indexes (shapes checked at load).
            unsafe { b.launch(elementwise(n)?) }?;
        }
        WeightFormat::Q8Block | WeightFormat::Q4K | WeightFormat::Q6K => {
            let qv = cuda_view::<u8>(&qs, ql, "GGUF codes")?;
            let (ss, sl) = w.scale.storage_and_layout();
            let sv = cuda_view::<half::f16>(&ss, sl, "GGUF scales")?;
            let name = match w.scheme.weight {
                WeightFormat::Q8Block => "gguf_dequant_q80",
                _ => "gguf_dequant_kq",
            };
            let func = fatbin::quant_matmul::GGUF_GEMV.func(dev, name)?;
            let (rows, inp) = (int(w.out, "rows")?, int(w.inp, "in")?);
            let fmt = i32::from(w.scheme.weight == WeightFormat::Q6K);
            let mut b = Launch::new(&stream, &func);
            b.ptr(&qv).ptr(&sv).ptr_mut(&mut out).val(rows).val(inp);
            if w.scheme.weight != WeightFormat::Q8Block {
                b.val(fmt);
            }
            // SAFETY: the codes and scales in the format's layout (checked at load), one
            // thread per weight.
            unsafe { b.launch(elementwise(n)?) }?;
        }
    }
    drop(qs);
    Ok(tensor(out, dev, &[w.out, w.inp]))
}

/// Whether the older one-warp-per-row 4-bit GEMV takes `m` rows: what ct_gemv.cu leaves
/// (scale groups of 32 or 64 columns, which split a quad's 128 columns).
fn int4_gemv_fits(w: &QuantLinear, m: usize) -> bool {
    matches!(w.scheme.weight, WeightFormat::Int4 { .. })
        && m <= GEMV_ROWS
        && w.g_idx.is_none()
        && w.inp.is_multiple_of(32)
        && w.group.is_multiple_of(32)
}

pub fn quant_matmul(x: &Tensor, w: &QuantLinear, route: Route) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    if k != w.inp {
        bail!("quant_matmul: x {:?} against a [{}, {}] weight", x.dims(), w.out, w.inp);
    }
    match route {
        Route::GemvTiles(mt) => return super::gemv::launch(x, w, Some(mt)),
        Route::Auto if super::gemv::fits(w, m) => return super::gemv::launch(x, w, None),
        Route::Auto if int4_gemv_fits(w, m) => return gemv_int4(x, w),
        _ => {}
    }
    let weight = dequantize(w)?;
    match w.scheme.act {
        // Q8_0: the dequantized weight (bf16) times bf16 x; the GEMV's per-block quantization
        // of x has no GEMM form.
        ActQuant::Int8Block => matmul_f32_out(&x.to_dtype(DType::BF16)?, &weight),
        ActQuant::None => {
            // W8A16 keeps its scales out of the bf16 temporary: applied per output column.
            let y = matmul_f32_out(&x.to_dtype(DType::BF16)?, &weight)?;
            match w.scheme.weight {
                WeightFormat::Int4 { .. } => Ok(y),
                _ => y.broadcast_mul(&w.scale.unsqueeze(0)?),
            }
        }
        act => {
            let (xq, sx) = act_quant(x, act)?;
            let y = matmul_f32_out(&xq, &weight)?;
            y.broadcast_mul(&sx.unsqueeze(1)?)?.broadcast_mul(&w.scale.unsqueeze(0)?)
        }
    }
}

fn gemv_int4(x: &Tensor, w: &QuantLinear) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let Device::Cuda(dev) = x.device() else { bail!("quant_matmul: x is not on the GPU") };
    const WARPS: usize = 8;
    let cfg = LaunchConfig {
        grid_dim: (int(w.out.div_ceil(WARPS), "blocks")? as u32, 1, 1),
        block_dim: ((32 * WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (m32, n32, k32) = (int(m, "rows")?, int(w.out, "out")?, int(k, "in")?);
    // SAFETY: one warp per output column writes all m values of it.
    let mut y = unsafe { dev.alloc::<f32>(m * w.out)? };
    let (qs, ql) = w.q.storage_and_layout();
    let (ss, sl) = w.scale.storage_and_layout();
    let sv = cuda_view::<f32>(&ss, sl, "scale")?;
    let x = x.to_dtype(DType::BF16)?.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let xv = cuda_view::<bf16>(&xs, xl, "x")?;
    let qv = cuda_view::<i32>(&qs, ql, "packed weight")?;
    let zs = w.zero.as_ref().map(|z| z.storage_and_layout());
    let zv = zs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "zero")).transpose()?;
    let groups = int(w.scale.elem_count() / w.out, "groups")?;
    let group = int(w.group, "group")?;
    let func = fatbin::quant_matmul::CT_QUANT.func(dev, "ct_gemv_int4")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(&qv).ptr(&sv);
    match &zv {
        Some(v) => b.ptr(v),
        None => b.null(),
    };
    b.ptr(&xv).ptr_mut(&mut y).val(m32).val(n32).val(k32).val(groups).val(group);
    // SAFETY: k % 32 == 0 and group % 32 == 0 (int4_gemv_fits), sizes as named; it waits (PDL)
    // before anything else.
    unsafe { b.launch(cfg) }?;
    drop(b);
    drop((qs, ss, xs));
    Ok(tensor(y, dev, &[m, w.out]))
}
