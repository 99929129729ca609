//! The CUDA launch of [`super::paged_attention`]: the attention kernel, then (with several key
//! splits) the combine kernel, on a grid from [`super::paged_launch`] alone.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig,
};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage, Tensor, bail};

use super::{Dims, PagedAttention, PagedKernel, WARPS};
use crate::kernels::cuda::{
    KernelFloat, allow_shared, cuda_view, fatbin, int, multiprocessors, output,
};
use crate::kernels::kv_fp8::Codes;
use crate::kernels::launch::Launch;
use crate::kernels::shared_memory;

/// The pools' device addresses (their first elements) and layout.
#[derive(Clone, Copy)]
pub(super) struct Pools<'a> {
    k: u64,
    v: u64,
    layout: &'a Layout,
    codes: Option<Codes>,
}

impl<'a> Pools<'a> {
    pub(super) fn new(
        dev: &CudaDevice,
        (k, kl): (&CudaStorage, &'a Layout),
        (v, vl): (&CudaStorage, &Layout),
    ) -> Result<Self> {
        let stream = dev.cuda_stream();
        let address = |s: &CudaStorage, l: &Layout, what: &str| -> Result<u64> {
            let (base, size) = match &s.slice {
                CudaStorageSlice::F32(x) => (x.device_ptr(&stream).0, 4),
                CudaStorageSlice::BF16(x) => (x.device_ptr(&stream).0, 2),
                CudaStorageSlice::F8E4M3(x) => (x.device_ptr(&stream).0, 1),
                CudaStorageSlice::U8(x) => (x.device_ptr(&stream).0, 1),
                _ => bail!("paged_attention: {what} must be f32, bf16, fp8 or int8 codes"),
            };
            check_aligned(l, size, what)?;
            Ok(base + (l.start_offset() * size) as u64)
        };
        let codes = Codes::of(k.dtype());
        Ok(Self { k: address(k, kl, "k_pool")?, v: address(v, vl, "v_pool")?, layout: kl, codes })
    }
}

/// The device address of a contiguous u8 tensor (the FP8 scales).
fn u8_address(t: &Tensor, dev: &CudaDevice) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("paged_attention: expected CUDA scales") };
    let CudaStorageSlice::U8(x) = &s.slice else { bail!("paged_attention: scales must be u8") };
    Ok(x.device_ptr(&dev.cuda_stream()).0 + layout.start_offset() as u64)
}

/// The attention kernel of a launch and its dynamic shared memory.
fn attention_func<T: KernelFloat>(
    dev: &CudaDevice,
    kernel: PagedKernel,
    d: usize,
    codes: Option<Codes>,
) -> Result<(CudaFunction, usize)> {
    Ok(match kernel {
        PagedKernel::Scalar { rows_per_warp } => {
            if T::BF16 || codes.is_some() {
                bail!(
                    "paged_attention: the scalar kernel takes f32 only (pools of codes need bf16 q)"
                );
            }
            let name = format!("paged_attention_{}_d{d}_r{rows_per_warp}", T::NAME);
            (fatbin::paged_attention::PAGED_ATTENTION.func(dev, &name)?, 0)
        }
        PagedKernel::Mma { .. } | PagedKernel::MmaSplitDims => {
            if !T::BF16 {
                bail!("paged_attention: the tensor-core kernel takes bf16 only");
            }
            let pools = match codes {
                Some(Codes::E4m3) => "_fp8",
                Some(Codes::Int8) => "_int8",
                None => "",
            };
            let name = match kernel {
                PagedKernel::Mma { warps } => format!("paged_attention_mma{pools}_d{d}_w{warps}"),
                _ => format!("paged_attention_mma{pools}_d{d}_w4_ds"),
            };
            let func = fatbin::paged_attention::PAGED_ATTENTION_MMA.func(dev, &name)?;
            let shared = shared_memory::paged_attention_mma(d, codes.is_some());
            allow_shared(dev, &func, &name, shared)?;
            (func, shared)
        }
    })
}

/// Mirrors `PagedAttnParams` in paged_attention.cu, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Params {
    num_slots: i64,
    tokens: i64,
    heads: i32,
    kv_heads: i32,
    max_blocks: i32,
    block_size: i32,
    window: i32,
    zs: i32,
    fixed_splits: i32,
    row_blocks: i32,
    num_seqs: i32,
    scale_log2: f32,
    release_first: i32,
}

// SAFETY: plain old data with the C layout the kernel expects.
unsafe impl DeviceRepr for Params {}

/// 16-byte alignment of a tensor's first row: the kernels read pool rows 16 bytes at a time and
/// the tensor-core one q in pairs (rows are d ≥ 64 elements, so every row is aligned when the
/// first is).
fn check_aligned(l: &Layout, size: usize, what: &str) -> Result<()> {
    if !(l.start_offset() * size).is_multiple_of(16) {
        bail!(
            "paged_attention: {what} must start on a 16-byte boundary (offset {})",
            l.start_offset()
        );
    }
    Ok(())
}

pub(super) fn launch<T: KernelFloat>(
    op: &PagedAttention,
    dev: &CudaDevice,
    (q, ql): (&CudaSlice<T>, &Layout),
    pools: Pools,
) -> Result<CudaSlice<T>> {
    let Dims { tokens, heads, kv_heads, d, num_slots } = Dims::new(ql, pools.layout)?;
    if !super::cuda_head_dim(d, T::BF16) {
        bail!(
            "paged_attention: the CUDA kernels take head_dim 64 and 128, and 256 in bf16, not {d} in {}",
            T::NAME
        );
    }
    if !ql.is_contiguous() {
        bail!("paged_attention: q must be contiguous");
    }
    let size = std::mem::size_of::<T>();
    check_aligned(ql, size, "q")?;
    let seqs = op.q_pos.dim(0)?;
    let max_blocks = op.tables.dim(1)?;
    let cfg = op.cfg;
    let plan = op.plan(tokens, multiprocessors(dev));
    int(plan.grid.0 as usize, "sequences × row tiles")?;
    let params = Params {
        num_slots: num_slots as i64,
        tokens: tokens as i64,
        heads: int(heads, "heads")?,
        kv_heads: int(kv_heads, "kv_heads")?,
        max_blocks: int(max_blocks, "max_blocks")?,
        block_size: int(cfg.block_size, "block_size")?,
        window: cfg.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
        zs: int(plan.splits, "splits")?,
        fixed_splits: int(plan.fixed_splits, "fixed splits")?,
        row_blocks: int(plan.grid.0 as usize / seqs, "row blocks")?,
        num_seqs: int(seqs, "sequences")?,
        scale_log2: cfg.scale * std::f32::consts::LOG2_E,
        release_first: i32::from(cfg.release_first),
    };

    let mut out = output::<T>(dev, tokens * heads * d, op.poison)?;
    let q = q.slice(ql.start_offset()..);
    let (k, v) = (pools.k, pools.v);
    // The tensor-core kernels' scale pointers (null for bf16 pools).
    let scales = match &op.scales {
        Some((ks, vs)) => Some((u8_address(ks, dev)?, u8_address(vs, dev)?)),
        None => None,
    };
    let mma = !matches!(plan.kernel, PagedKernel::Scalar { .. });
    let guards = [&op.cu_q, &op.q_pos, &op.tables].map(|t| t.storage_and_layout());
    let [cu_q, q_pos, tables] = [("cu_q", 0), ("q_pos", 1), ("tables", 2)]
        .map(|(what, i)| cuda_view::<u32>(&guards[i].0, guards[i].1, what));
    let (cu_q, q_pos, tables) = (cu_q?, q_pos?, tables?);
    // The kernels' sinks: the f32 heads, or a null pointer for the plain softmax.
    let sinks_guard = op.sinks.as_ref().map(|t| t.storage_and_layout());
    let sinks_view = match &sinks_guard {
        Some((s, l)) => Some(cuda_view::<f32>(s, l, "sinks")?),
        None => None,
    };
    let stream = dev.cuda_stream();
    let sinks_ptr: u64 = sinks_view.as_ref().map_or(0, |v| v.device_ptr(&stream).0);

    let (func, shared) = attention_func::<T>(dev, plan.kernel, d, pools.codes)?;
    let grid = LaunchConfig {
        grid_dim: plan.grid,
        block_dim: (plan.kernel.threads() as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    if plan.splits == 1 {
        let mut b = Launch::new(&stream, &func);
        b.ptr(&q).val(k).val(v);
        if mma {
            b.val(scales.map_or(0, |s| s.0)).val(scales.map_or(0, |s| s.1));
        }
        b.val(sinks_ptr).ptr(&cu_q).ptr(&q_pos).ptr(&tables);
        b.ptr_mut(&mut out).null().null().val(params);
        // SAFETY: the arguments match the kernel's signature; shapes were checked by the op, and
        // the kernel guards every block-table lookup against the table and the pool; it waits
        // (PDL) before any access.
        unsafe { b.launch(grid) }?;
        drop(b);
        return Ok(out);
    }
    // SAFETY: the combine reads, for each row, the partials of the fixed splits holding keys
    // the row sees, and the attention blocks write exactly those first.
    let parts = plan.fixed_splits * tokens * heads;
    let mut part_acc = unsafe { dev.alloc::<f32>(parts * d)? };
    let mut part_ml = unsafe { dev.alloc::<f32>(parts * 2)? };
    let mut b = Launch::new(&stream, &func);
    b.ptr(&q).val(k).val(v);
    if mma {
        b.val(scales.map_or(0, |s| s.0)).val(scales.map_or(0, |s| s.1));
    }
    b.val(sinks_ptr).ptr(&cu_q).ptr(&q_pos).ptr(&tables);
    b.ptr_mut(&mut out).ptr_mut(&mut part_acc).ptr_mut(&mut part_ml).val(params);
    // SAFETY: as above.
    unsafe { b.launch(grid) }?;
    drop(b);

    let name = format!("paged_combine_{}_d{d}", T::NAME);
    let combine = fatbin::paged_attention::PAGED_ATTENTION.func(dev, &name)?;
    let mut b = Launch::new(&stream, &combine);
    b.ptr(&part_acc).ptr(&part_ml).val(sinks_ptr).ptr(&cu_q).ptr(&q_pos).ptr_mut(&mut out);
    b.val(params);
    let grid = LaunchConfig {
        grid_dim: (int(plan.combine_blocks, "rows")? as u32, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match paged_combine's signature; it waits (PDL) before any access.
    unsafe { b.launch(grid) }?;
    drop(b);
    Ok(out)
}
