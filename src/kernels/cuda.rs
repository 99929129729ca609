//! What the ops' `cuda_fwd` share: the embedded PTX, typed access to candle's CUDA storage, output
//! buffers (NaN-poisoned on request, for tests) and the device's size.

use candle_core::cuda_backend::cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaView, DeviceRepr, PinnedHostSlice,
};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{CudaDevice, Layout, Result, Storage, bail};
use half::bf16;

/// PTX built by build.rs from `src/kernels/mxfp4_moe.cu`.
pub(super) const MXFP4_MOE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/mxfp4_moe.ptx"));
/// PTX built by build.rs from `src/kernels/mxfp4_ggml.cu`.
pub(super) const MXFP4_GGML_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/mxfp4_ggml.ptx"));
/// PTX built by build.rs from `src/kernels/argmax.cu`.
pub(super) const ARGMAX_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/argmax.ptx"));
/// PTX built by build.rs from `src/kernels/sample.cu`.
pub(super) const SAMPLE_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sample.ptx"));
/// PTX built by build.rs from `src/kernels/sample_topk.cu`.
pub(super) const SAMPLE_TOPK_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sample_topk.ptx"));
/// PTX built by build.rs from `src/kernels/router.cu`.
pub(super) const ROUTER_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/router.ptx"));
/// PTX built by build.rs from `src/kernels/moe_expert_major.cu`.
pub(super) const MOE_EXPERT_MAJOR_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/moe_expert_major.ptx"));
/// PTX built by build.rs from `src/kernels/moe_slot_mma.cu`.
pub(super) const MOE_SLOT_MMA_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/moe_slot_mma.ptx"));
/// PTX built by build.rs from `src/kernels/moe_grouped.cu`.
pub(super) const MOE_GROUPED_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/moe_grouped.ptx"));

/// PTX built by build.rs from `src/kernels/paged_attention.cu`.
pub(super) const PAGED_ATTENTION_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));
/// PTX built by build.rs from `src/kernels/paged_attention_mma.cu`.
pub(super) const PAGED_ATTENTION_MMA_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/paged_attention_mma.ptx"));
/// PTX built by build.rs from `src/kernels/qkv_rope_paged.cu`.
pub(super) const QKV_ROPE_PAGED_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/qkv_rope_paged.ptx"));

/// PTX built by build.rs from `src/kernels/hi_lo.cu`.
pub(super) const HI_LO_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/hi_lo.ptx"));

/// PTX built by build.rs from `src/kernels/layer_norm_act.cu`.
pub(super) const LAYER_NORM_ACT_PTX: &str =
    include_str!(concat!(env!("OUT_DIR"), "/layer_norm_act.ptx"));

/// PTX built by build.rs from `src/kernels/ct_quant.cu`.
pub(super) const CT_QUANT_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ct_quant.ptx"));

/// PTX built by build.rs from `src/kernels/ct_gemv.cu`.
pub(super) const CT_GEMV_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ct_gemv.ptx"));

/// PTX built by build.rs from `src/kernels/gguf_gemv.cu`.
pub(super) const GGUF_GEMV_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gguf_gemv.ptx"));

/// PTX built by build.rs from `src/kernels/gemv_bf16.cu`.
pub(super) const GEMV_BF16_PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gemv_bf16.ptx"));

/// The activation dtypes the kernels are instantiated for.
pub(super) trait KernelFloat: DeviceRepr + Copy + 'static {
    /// Kernel-name component: `f32` or `bf16`.
    const NAME: &'static str;
    /// Whether this is bf16 (the tensor-core kernels take bf16 only).
    const BF16: bool;
    const NAN: Self;
    fn wrap(slice: CudaSlice<Self>) -> CudaStorageSlice;
}

impl KernelFloat for f32 {
    const NAME: &'static str = "f32";
    const BF16: bool = false;
    const NAN: Self = f32::NAN;
    fn wrap(slice: CudaSlice<Self>) -> CudaStorageSlice {
        CudaStorageSlice::F32(slice)
    }
}

impl KernelFloat for bf16 {
    const NAME: &'static str = "bf16";
    const BF16: bool = true;
    const NAN: Self = bf16::NAN;
    fn wrap(slice: CudaSlice<Self>) -> CudaStorageSlice {
        CudaStorageSlice::BF16(slice)
    }
}

/// A new buffer of `n` elements for a kernel to fill. With `poison` it starts as NaN, so that a
/// test sees any element the kernel failed to write.
pub(super) fn output<T: KernelFloat>(
    dev: &CudaDevice,
    n: usize,
    poison: bool,
) -> Result<CudaSlice<T>> {
    if poison {
        dev.cuda_stream().clone_htod(&vec![T::NAN; n]).w()
    } else {
        // SAFETY: the caller's kernel writes all n elements before anyone reads them.
        unsafe { dev.alloc::<T>(n) }
    }
}

/// Streaming multiprocessors of the device (132 on an H100 SXM), to size split-K grids.
pub(super) fn multiprocessors(dev: &CudaDevice) -> usize {
    dev.cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_or(132, |n| n.max(1) as usize)
}

/// The device data of a tensor an op holds (sinks, expert weights), from its offset on, given the
/// storage guard of `tensor.storage_and_layout()`.
pub(super) fn cuda_view<'a, T: CudaDType>(
    storage: &'a Storage,
    layout: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match storage {
        Storage::Cuda(s) => Ok(s.as_cuda_slice::<T>()?.slice(layout.start_offset()..)),
        _ => bail!("{what}: expected a CUDA tensor like the op's inputs"),
    }
}

/// Dynamic shared memory a block gets without opting in.
const DEFAULT_SHARED: usize = 48 * 1024;

/// Lets `func` launch with `bytes` of dynamic shared memory where that is past the default. A
/// driver attribute, not a stream operation: also allowed while a graph is captured.
pub(super) fn allow_shared(func: &CudaFunction, bytes: usize) -> Result<()> {
    if bytes > DEFAULT_SHARED {
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            int(bytes, "shared memory")?,
        )
        .w()?;
    }
    Ok(())
}

/// A kernel dimension as the `int` the kernels take.
pub(super) fn int(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| {
        candle_core::Error::Msg(format!("{what} = {n} is too large for the CUDA kernel"))
    })
}

/// Page-locked staging for small per-call parameters (the samplers'). A copy from pageable
/// memory waits for the stream to drain first, so the launches after it could not be queued
/// behind the decode step's graph. A ring of buffers, each with an event recorded behind its
/// last copy: a buffer is written again only once that copy has run. (cudarc's pinned slice
/// records such an event only when it manages stream synchronization, which candle turns off;
/// with the pipelined decode the next step's parameters are written while the previous step's
/// copy may still wait in the stream.)
struct Staging {
    bufs: Vec<(PinnedHostSlice<u32>, Option<CudaEvent>)>,
    next: usize,
}

static STAGING: Mutex<Option<Staging>> = Mutex::new(None);

/// Buffers in the ring: more than the steps in flight at once (two).
const STAGING_RING: usize = 4;

/// `words` on the device (a buffer at least as long, the rest unspecified).
pub(super) fn upload(dev: &CudaDevice, words: &[u32]) -> Result<CudaSlice<u32>> {
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let mut staging = STAGING.lock().unwrap_or_else(|e| e.into_inner());
    let fits = staging.as_ref().is_some_and(|st| {
        st.bufs
            .iter()
            .all(|(b, _)| b.len() >= words.len() && std::sync::Arc::ptr_eq(b.context(), ctx))
    });
    if !fits {
        // The old buffers may still be read by copies in flight.
        for (_, ev) in staging.take().into_iter().flat_map(|st| st.bufs) {
            if let Some(ev) = ev {
                ev.synchronize().w()?;
            }
        }
        let len = words.len().next_power_of_two().max(4096);
        let bufs = (0..STAGING_RING)
            // SAFETY: each is written below before any copy reads it.
            .map(|_| unsafe { ctx.alloc_pinned::<u32>(len) }.map(|b| (b, None)))
            .collect::<std::result::Result<_, _>>()
            .w()?;
        *staging = Some(Staging { bufs, next: 0 });
    }
    let Some(st) = staging.as_mut() else { unreachable!("staging was just set") };
    let at = st.next;
    st.next = (at + 1) % st.bufs.len();
    let (buf, done) = &mut st.bufs[at];
    if let Some(ev) = done.take() {
        ev.synchronize().w()?;
    }
    buf.as_mut_slice().w()?[..words.len()].copy_from_slice(words);
    // SAFETY: the copy below fills all of it (the tail past `words` is never read).
    let mut out = unsafe { dev.alloc::<u32>(buf.len())? };
    stream.memcpy_htod(&*buf, &mut out).w()?;
    *done = Some(stream.record_event(None).w()?);
    Ok(out)
}

/// Counters in [`counters`]' set: moe_slot_mma.cu's down kernel takes one per (token, row tile
/// of 16 outputs), 180 per token for gpt-oss. Bigger grids take the separate moe_sum. A second
/// kernel that counts would need its own region of the set, so that two never share a counter.
pub(super) const COUNTERS: usize = 1 << 16;

/// The device address of zeroed counters for `dev`'s stream, for a kernel whose last block to
/// finish a piece of work does what a separate launch would (moe_slot_mma.cu's sum over the
/// slots). One set per stream: kernels of one stream run one after another, but two streams (two
/// engines in one process) would race on shared counters and fold each other's partials. candle's devices use the per-thread default stream, whose
/// handle is the same for every thread, so the set is per (device, handle, host thread).
/// Allocated on first use and kept for the process: captured graphs hold the address, and each
/// launch leaves every counter at zero. `None` while the stream captures a graph and none exist
/// yet (the allocation would belong to the graph): the separate kernel then.
pub(super) fn counters(dev: &CudaDevice) -> Option<u64> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::cuda_backend::cudarc::driver::sys::CUstreamCaptureStatus;
    type Key = (usize, usize, std::thread::ThreadId);
    type ByStream = std::sync::Mutex<std::collections::HashMap<Key, u64>>;
    static BY_STREAM: std::sync::OnceLock<ByStream> = std::sync::OnceLock::new();
    let mut map = BY_STREAM.get_or_init(Default::default).lock().ok()?;
    let stream = dev.cuda_stream();
    let key =
        (stream.context().ordinal(), stream.cu_stream() as usize, std::thread::current().id());
    if let Some(&ptr) = map.get(&key) {
        return Some(ptr);
    }
    let idle =
        matches!(stream.capture_status(), Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE));
    if !idle {
        return None;
    }
    let slice = stream.alloc_zeros::<u32>(COUNTERS).ok()?;
    let (ptr, guard) = slice.device_ptr(&stream);
    drop(guard);
    // Never freed: graphs captured with this address replay for the process's life.
    std::mem::forget(slice);
    map.insert(key, ptr);
    Some(ptr)
}
