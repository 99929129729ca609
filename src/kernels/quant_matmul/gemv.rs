//! The launches of `ct_gemv.cu`: decode GEMVs on tensor cores, one launch per product (the
//! activation quantization runs inside). See the kernel file's header for the design.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig};
use candle_core::{CudaDevice, DType, Device, Result, Tensor, bail};
use half::bf16;

use super::GEMV_ROWS;
use crate::kernels::cuda::{allow_shared, cuda_view, fatbin, int};
use crate::kernels::launch::Launch;
use crate::quant::{ActQuant, QuantLinear, WeightFormat};

/// ct_gemv.cu's largest block: CT_MAX_WK warps along K.
const MAX_WK: usize = 8;
/// Enough warps to keep every multiprocessor's loads in flight (as gemv_bf16's launch).
const TARGET_WARPS: usize = 2048;
/// Dynamic shared memory a launch of the 8-bit kernels may take for the quantized rows of x.
const MAX_X_BYTES: usize = crate::kernels::shared_memory::GEMV_X_BYTES;

/// K values one quad step of a warp covers: 4 lanes × a 16-byte chunk of weights.
fn quad_values(w: &QuantLinear) -> usize {
    match w.scheme.weight {
        WeightFormat::Int8 | WeightFormat::Fp8 | WeightFormat::Q8Block => 64,
        WeightFormat::Int4 { .. } | WeightFormat::Q4K | WeightFormat::Q6K => 128,
    }
}

/// Whether the GEMV takes `m` rows of `w`.
pub fn fits(w: &QuantLinear, m: usize) -> bool {
    if m == 0 || m > GEMV_ROWS {
        return false;
    }
    match w.scheme.weight {
        WeightFormat::Int8 | WeightFormat::Fp8 => {
            w.scheme.act != ActQuant::None
                && w.inp.is_multiple_of(16)
                && x_stride(w.inp) <= MAX_X_BYTES
        }
        WeightFormat::Int4 { .. } => {
            let groups = w.scale.elem_count() / w.out.max(1);
            w.g_idx.is_none()
                && w.inp.is_multiple_of(32)
                && (groups == 1 || w.group.is_multiple_of(128))
        }
        WeightFormat::Q8Block => {
            crate::quant::gguf_q8::fits(w.inp) && x_row_bytes(w) <= MAX_X_BYTES
        }
        WeightFormat::Q4K | WeightFormat::Q6K => {
            crate::quant::gguf_k::fits(w.inp) && x_row_bytes(w) <= MAX_X_BYTES
        }
    }
}

/// GGUF's k-quants, whose kernels keep x in natural column order.
fn k_quant(w: &QuantLinear) -> bool {
    matches!(w.scheme.weight, WeightFormat::Q4K | WeightFormat::Q6K)
}

/// Shared memory per row of x for the kernels that quantize it: the codes, and for the GGUF
/// formats each block's f32 scale (and for the k-quants its code sum) after them.
fn x_row_bytes(w: &QuantLinear) -> usize {
    match w.scheme.weight {
        WeightFormat::Q8Block => x_stride(w.inp) + w.inp / 8,
        WeightFormat::Q4K | WeightFormat::Q6K => k_stride(w.inp) + w.inp / 4,
        _ => x_stride(w.inp),
    }
}

/// The k-quant kernels' x rows: natural order, 16 bytes apart beyond K so that the 8 rows' lanes
/// read different banks.
fn k_stride(k: usize) -> usize {
    k + 16
}

/// Bytes between the quantized rows of x in shared memory: K rounded up to 128, plus 64, so
/// that the two rows a quarter-warp reads lie in different banks.
fn x_stride(k: usize) -> usize {
    k.next_multiple_of(128) + 64
}

/// Warps along K for `n` outputs: from the shape only, so that a row's sums run in the same
/// order whatever the batch.
pub fn warps_along_k(n: usize, k: usize, quad: usize) -> usize {
    let tiles = n.div_ceil(16);
    // At least two quad steps per warp.
    let by_k = (k / (2 * quad)).max(1);
    TARGET_WARPS.div_ceil(tiles).clamp(1, MAX_WK).min(by_k)
}

/// Whether `mt` weight tiles per warp fit the block for `w`'s shape.
pub fn tiles_allowed(w: &QuantLinear, mt: usize) -> bool {
    mt == 1 || mt == 2 && !k_quant(w) && 2 * warps_along_k(w.out, w.inp, quad_values(w)) <= MAX_WK
}

/// Weight tiles per warp: two for tall 4-bit weights (at most 2 warps along K, i.e. 683+
/// tiles: the fused gate/up), where half the blocks with twice the loads in flight each measured
/// faster (H100, gate+up 16384 × 2048, one row: 12.8 against 14.2 µs; eight rows 13.5 against
/// 14.5). The 8-bit kernels measured faster with one (17.4 against 18.2 µs).
fn tiles_per_warp(w: &QuantLinear, wk: usize) -> usize {
    match w.scheme.weight {
        WeightFormat::Int4 { .. } if wk <= 2 => 2,
        _ => 1,
    }
}

/// y `[m, out]` f32 = `x` `[m, in]` times `w`'s weight; `mt` forces the tiles per warp (timings).
pub fn launch(x: &Tensor, w: &QuantLinear, mt: Option<usize>) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    if !fits(w, m) || k != w.inp {
        bail!("quant gemv: {m} rows of {k} against a [{}, {}] weight", w.out, w.inp);
    }
    let Device::Cuda(dev) = x.device() else { bail!("quant gemv: x is not on the GPU") };
    let x = x.to_dtype(DType::BF16)?.contiguous()?;
    let n = w.out;
    let wk = warps_along_k(n, k, quad_values(w));
    let mt = mt.unwrap_or_else(|| tiles_per_warp(w, wk));
    if !tiles_allowed(w, mt) {
        bail!("quant gemv: {mt} tiles per warp with {wk} warps along K");
    }
    // SAFETY: the launches below write all m · n outputs (every row < N of every tile).
    let mut y: CudaSlice<f32> = unsafe { dev.alloc::<f32>(m * n)? };
    // The 8-bit kernels hold their rows of x in shared memory: as many rows per launch as fit
    // (all 8 up to K = 11,000); each row's result does not depend on the others.
    let rows = match w.scheme.weight {
        WeightFormat::Int4 { .. } => m,
        _ => (MAX_X_BYTES / x_row_bytes(w)).min(m),
    };
    for r0 in (0..m).step_by(rows) {
        let r = rows.min(m - r0);
        let mut yv = y.slice_mut(r0 * n..(r0 + r) * n);
        launch_rows(dev, &x.narrow(0, r0, r)?, w, &mut yv, (wk, mt))?;
    }
    Ok(crate::kernels::cuda::tensor(y, dev, &[m, n]))
}

fn launch_rows(
    dev: &CudaDevice,
    x: &Tensor,
    w: &QuantLinear,
    y: &mut CudaViewMut<f32>,
    (wk, mt): (usize, usize),
) -> Result<()> {
    let (m, k) = x.dims2()?;
    let n = w.out;
    let int8 = w.scheme.weight == WeightFormat::Int8;
    let (name, smem) = match w.scheme.weight {
        WeightFormat::Int4 { .. } => (format!("ct_gemv_q4_m{mt}"), 0),
        WeightFormat::Q8Block => (format!("ct_gemv_q80_m{mt}"), m * x_row_bytes(w)),
        WeightFormat::Q4K => (format!("gguf_gemv_q4k_m{mt}"), m * x_row_bytes(w)),
        WeightFormat::Q6K => (format!("gguf_gemv_q6k_m{mt}"), m * x_row_bytes(w)),
        _ => (format!("ct_gemv_{}_m{mt}", if int8 { "i8" } else { "f8" }), m * x_stride(k)),
    };
    let gguf = matches!(w.scheme.weight, WeightFormat::Q8Block) || k_quant(w);
    let func = match gguf {
        true => fatbin::quant_matmul::GGUF_GEMV.func(dev, &name)?,
        false => fatbin::quant_matmul::CT_GEMV.func(dev, &name)?,
    };
    allow_shared(dev, &func, &name, smem)?;
    let cfg = LaunchConfig {
        grid_dim: (int(n.div_ceil(16 * mt), "output tiles")? as u32, 1, 1),
        block_dim: (32, wk as u32, 1),
        shared_mem_bytes: smem as u32,
    };
    let (m32, n32, k32) = (int(m, "rows")?, int(n, "out")?, int(k, "in")?);
    let (xs, xl) = x.storage_and_layout();
    let xv = cuda_view::<bf16>(&xs, xl, "x")?;
    let (qs, ql) = w.q.storage_and_layout();
    let (ss, sl) = w.scale.storage_and_layout();
    let stream = dev.cuda_stream();
    if gguf {
        let qv = cuda_view::<u8>(&qs, ql, "GGUF codes")?;
        let sv = cuda_view::<half::f16>(&ss, sl, "GGUF scales")?;
        let stride = int(if k_quant(w) { k_stride(k) } else { x_stride(k) }, "x stride")?;
        let mut b = Launch::new(&stream, &func);
        b.ptr(&qv).ptr(&sv).ptr(&xv).ptr_mut(y).val(m32).val(n32).val(k32).val(stride);
        // SAFETY: gguf_gemv.cu's kernels' signature; codes and scales in the format's layout
        // (gguf_q8.rs, gguf_k.rs; shapes checked at load), x [m, k] bf16 with k a multiple of
        // the format's group (fits), smem = m · x_row_bytes; the kernels read only the weights
        // before pdl_wait().
        return unsafe { b.launch(cfg) };
    }
    let sv = cuda_view::<f32>(&ss, sl, "scale")?;
    // ct_gemv.cu's kernels wait (PDL) before anything else.
    match w.scheme.weight {
        WeightFormat::Int8 | WeightFormat::Fp8 => {
            let qv = cuda_view::<u8>(&qs, ql, "weight")?;
            let stride = int(x_stride(k), "x stride")?;
            let mut b = Launch::new(&stream, &func);
            b.ptr(&qv).ptr(&sv).ptr(&xv).ptr_mut(y).val(m32).val(n32).val(k32).val(stride);
            // SAFETY: ct_gemv_{i8,f8}_m*'s signature; w [n, k] bytes, scale [n], x [m, k]
            // bf16, k % 16 == 0 (fits), 16-byte aligned rows, smem = m · stride bytes.
            unsafe { b.launch(cfg) }
        }
        WeightFormat::Int4 { .. } => {
            let qv = cuda_view::<i32>(&qs, ql, "packed weight")?;
            let zs = w.zero.as_ref().map(|z| z.storage_and_layout());
            let zv = zs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "zero")).transpose()?;
            let groups = int(w.scale.elem_count() / n, "groups")?;
            let group = int(w.group, "group")?;
            let mut b = Launch::new(&stream, &func);
            b.ptr(&qv).ptr(&sv);
            match &zv {
                Some(v) => b.ptr(v),
                None => b.null(),
            };
            b.ptr(&xv).ptr_mut(y).val(m32).val(n32).val(k32).val(groups).val(group);
            // SAFETY: ct_gemv_q4_m*'s signature; words [n, k / 8], scale (zero) [n, groups],
            // x [m, k] bf16, k % 32 == 0 and group % 128 == 0 or one group (fits).
            unsafe { b.launch(cfg) }
        }
        WeightFormat::Q8Block | WeightFormat::Q4K | WeightFormat::Q6K => {
            bail!("quant gemv: GGUF formats launch above")
        }
    }
}
