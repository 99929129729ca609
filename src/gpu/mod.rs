//! Choosing the compute device. Users get a CUDA device or a clear error, never a silent CPU run;
//! the CPU is only for tests and an explicit debug flag.
//!
//! The CUDA driver and libraries are loaded at run time, not at program start (`lazy`), so the
//! binary runs without them; [`open`] checks first (`probe`) that everything is there.

use candle_core::Device;

use crate::error::{ErrorKind, fail};
use targets::Target;

#[cfg(all(
    feature = "cuda",
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod arena;
#[cfg(any(test, feature = "cuda"))]
mod arena_blocks;
#[cfg(test)]
mod codegen;
mod dlinfo;
#[cfg(test)]
mod elfdyn;
#[cfg(test)]
mod elfdyn_tests;
#[cfg(all(
    feature = "cuda",
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod lazy;
pub(crate) mod loader;
#[cfg(feature = "cuda")]
pub mod mempool;
pub mod probe;
pub mod targets;

pub use probe::{LibStatus, libraries};

/// What the banner and benchmarks report about the GPU.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// (major, minor); (0, 0) when the driver would not say.
    pub compute_capability: (i32, i32),
    /// Shared memory a block may take after opting in, bytes (0 when the driver would not say).
    pub shared_per_block: usize,
}

/// The GPU architectures this binary holds kernels for (build.rs: `src/gpu/targets.rs`);
/// `None` in a build without CUDA.
pub const BUILT_FOR: Option<&str> = option_env!("INFERNO_CUDA_ARCHS");

/// Which of this binary's kernels a GPU of compute capability `cap` runs: machine code of its
/// architecture or PTX the driver compiles; `Err` with one line when none does or the GPU is
/// older than Ampere.
pub fn kernels_for(name: &str, cap: (i32, i32)) -> Result<Target, String> {
    code_for(BUILT_FOR, name, cap)
}

/// [`kernels_for`] of a binary built for `built`.
fn code_for(built: Option<&str>, name: &str, cap: (i32, i32)) -> Result<Target, String> {
    let cc = (cap.0.max(0) * 10 + cap.1.max(0)) as u32;
    if cc < targets::OLDEST {
        return Err(format!(
            "{name} is compute capability {}.{}; inferno needs an NVIDIA GPU of compute \
             capability 8.0 (Ampere: RTX 30, A100) or newer",
            cap.0, cap.1
        ));
    }
    let built = built.ok_or_else(|| "this inferno was built without CUDA".to_string())?;
    let list = targets::parse(built).map_err(|e| format!("this binary's GPU targets: {e}"))?;
    targets::chosen(&list, cc).ok_or_else(|| {
        format!(
            "this inferno holds GPU code for {built} only, none of which runs on {name} (compute \
             capability {}.{}): rebuild it with `bash scripts/install.sh` (every GPU since \
             Ampere) or CUDA_COMPUTE_CAP={cc}",
            cap.0, cap.1
        )
    })
}

/// Opens CUDA device `ordinal` (the `--gpu N` flag), refusing in one line a GPU this binary has
/// no kernels for.
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    let (device, info) = open_any(ordinal)?;
    let name = format!("GPU {ordinal} ({})", info.name);
    kernels_for(&name, info.compute_capability).map_err(|e| fail(ErrorKind::NoDevice, e))?;
    Ok((device, info))
}

/// Opens CUDA device `ordinal` whatever its architecture (`doctor` reports on any GPU).
#[cfg(feature = "cuda")]
pub fn open_any(ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    // Before the first CUDA call: a missing driver, library or device is one precise line here,
    // not an exit from inside a lazy trampoline.
    probe::check(ordinal)?;
    let device = Device::new_cuda(ordinal).map_err(|e| {
        fail(
            ErrorKind::NoDevice,
            format!(
                "no CUDA device {ordinal} ({}): inferno needs an NVIDIA GPU with a CUDA 13 driver",
                short_cuda_error(&e.to_string())
            ),
        )
    })?;
    // SAFETY: inferno runs all GPU work on the device's one stream, so cudarc's cross-stream
    // event tracking (two events created and recorded per allocation, ~1000 allocations per
    // decoded token) protects nothing and only costs host time.
    unsafe { device.as_cuda_device()?.disable_event_tracking() };
    // A device without memory pools (candle then allocates without them) runs as before.
    let context = device.as_cuda_device()?.cuda_stream().context().clone();
    if let Err(e) = mempool::keep_freed(&context) {
        tracing::debug!("device {ordinal}'s memory pool gives freed memory back: {e}");
    }
    let info = info(&device, ordinal)?;
    if let Some(cap) = MEMORY_CAP.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        cap.free_at_open = Some(info.free_bytes);
    }
    Ok((device, info))
}

#[cfg(feature = "cuda")]
fn info(device: &Device, ordinal: usize) -> anyhow::Result<GpuInfo> {
    let cuda = device.as_cuda_device()?;
    let ctx = cuda.cuda_stream().context().clone();
    let name = ctx.name().unwrap_or_else(|_| "unknown NVIDIA GPU".to_string());
    let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
    let compute_capability = ctx.compute_capability().unwrap_or((0, 0));
    let shared_per_block = shared_per_block(&ctx);
    Ok(GpuInfo {
        ordinal,
        name,
        total_bytes: total as u64,
        free_bytes: free as u64,
        compute_capability,
        shared_per_block,
    })
}

/// Shared memory a block may take on the context's GPU, static and dynamic together, after
/// opting in; read from the driver once per GPU (the kernels' launches ask for it). Some early
/// RTX 50 drivers report 0 or a wrapped value for it (llama.cpp #23385): then the
/// multiprocessor's memory less the 1 KiB the system keeps for each block.
#[cfg(feature = "cuda")]
pub fn shared_per_block(
    ctx: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>,
) -> usize {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute as A;
    static BY_GPU: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    let mut known = BY_GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, bytes)) = known.iter().find(|(gpu, _)| *gpu == ctx.ordinal()) {
        return bytes;
    }
    let get = |a| ctx.attribute(a).ok().filter(|&n| n > 0).map(|n| n as usize);
    let per_sm = get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    let bytes = match (get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), per_sm) {
        (Some(block), Some(sm)) if block <= sm => block,
        (_, Some(sm)) => sm.saturating_sub(1024),
        (Some(block), None) => block,
        // The least a block may take on any GPU.
        (None, None) => 48 * 1024,
    };
    known.push((ctx.ordinal(), bytes));
    bytes
}

/// The driver's error code out of candle's error text (which may carry a backtrace).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn short_cuda_error(text: &str) -> String {
    if text.contains("CUDA_ERROR_STUB_LIBRARY") || text.contains("CUDA_ERROR_NO_DEVICE") {
        return "no NVIDIA driver or GPU found".to_string();
    }
    if let Some(code) = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("CUDA_ERROR_"))
    {
        return code.to_string();
    }
    text.lines().next().unwrap_or("unknown error").trim().to_string()
}

#[cfg(not(feature = "cuda"))]
pub fn open_any(ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    open(ordinal)
}

#[cfg(not(feature = "cuda"))]
pub fn open(_ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    Err(fail(
        ErrorKind::NoDevice,
        "this inferno was built without CUDA support (rebuild with `--features cuda`)",
    ))
}

/// Free and total device memory now, for "memory used" reports.
#[cfg(feature = "cuda")]
pub fn memory(device: &Device) -> Option<(u64, u64)> {
    let cuda = device.as_cuda_device().ok()?;
    let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
    Some((free as u64, total as u64))
}

#[cfg(not(feature = "cuda"))]
pub fn memory(_device: &Device) -> Option<(u64, u64)> {
    None
}

/// Starts the CUDA profiler's collection on `device`'s context (a profiler started with
/// collection off waits for this); one warning line if the driver refuses.
#[cfg(feature = "cuda")]
pub fn profiler_start(device: &Device) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let Ok(cuda) = device.as_cuda_device() else { return };
    if let Err(e) = cuda.cuda_stream().context().bind_to_thread() {
        eprintln!("inferno: cannot start the CUDA profiler: {e}");
        return;
    }
    // SAFETY: the context is bound to this thread; the call takes no arguments.
    let r = unsafe { sys::cuProfilerStart() };
    if r != sys::CUresult::CUDA_SUCCESS {
        eprintln!("inferno: cannot start the CUDA profiler: {r:?}");
    }
}

#[cfg(not(feature = "cuda"))]
pub fn profiler_start(_device: &Device) {}

/// `--gpu-memory`: the most GPU memory this process may take, and the GPU's free memory when it
/// was opened (what the process has taken since is the difference).
#[derive(Debug, Clone, Copy)]
struct Cap {
    limit: u64,
    free_at_open: Option<u64>,
}

static MEMORY_CAP: std::sync::Mutex<Option<Cap>> = std::sync::Mutex::new(None);

/// Caps the GPU memory this process takes at `limit` bytes, counted from when it opens the GPU
/// (the CUDA context's own few hundred MiB are not counted; the plan's runtime allowance is).
/// Call before [`open`]. For sharing a GPU, and for trying what fits a smaller card.
pub fn cap_memory(limit: Option<u64>) {
    *MEMORY_CAP.lock().unwrap_or_else(|e| e.into_inner()) =
        limit.map(|limit| Cap { limit, free_at_open: None });
}

/// The cap of [`cap_memory`], if any.
pub fn memory_cap() -> Option<u64> {
    MEMORY_CAP.lock().unwrap_or_else(|e| e.into_inner()).map(|c| c.limit)
}

/// Memory that allocations on `device` can take now: the GPU's free memory (within
/// `--gpu-memory`), or the host's `MemAvailable` for the CPU (`--cpu`). `None` when it cannot be
/// read. What the loader's memory plan and the engine's pool are held against.
pub fn available(device: &Device) -> Option<u64> {
    if !device.is_cuda() {
        return host_available();
    }
    // What the memory pool keeps for this process is free to it too (`mempool`).
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        let _ = mempool::trim(cuda.cuda_stream().context());
    }
    let free = memory(device).map(|(free, _)| free)?;
    let cap = *MEMORY_CAP.lock().unwrap_or_else(|e| e.into_inner());
    Some(match cap {
        Some(Cap { limit, free_at_open: Some(at_open) }) => {
            free.min(limit.saturating_sub(at_open.saturating_sub(free)))
        }
        _ => free,
    })
}

/// `MemAvailable` of `/proc/meminfo`: what can be allocated without swapping (free memory plus
/// reclaimable caches, which include the pages of memory-mapped weight files).
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&text)
}

fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gpu_without_code_or_older_than_ampere_is_one_line() {
        let all = Some("sm_80,sm_86,sm_89,sm_90,sm_100,sm_120,compute_120");
        let ok = |built, cap| super::code_for(built, "GPU 0 (X)", cap).map(|t| t.name());
        assert_eq!(ok(all, (8, 6)).as_deref(), Ok("sm_86"));
        assert_eq!(ok(Some("compute_80"), (9, 0)).as_deref(), Ok("compute_80"));
        let t4 = ok(all, (7, 5)).unwrap_err();
        assert!(t4.contains("7.5") && t4.contains("8.0 (Ampere"), "{t4}");
        let hopper_only = ok(Some("sm_90,compute_90"), (8, 6)).unwrap_err();
        assert!(hopper_only.contains("sm_90,compute_90 only") && hopper_only.contains("8.6"));
        assert!(hopper_only.contains("scripts/install.sh") && !hopper_only.contains('\n'));
        assert!(ok(None, (9, 0)).unwrap_err().contains("without CUDA"));
    }

    #[test]
    fn cuda_errors_are_short() {
        let text =
            "DriverError(CUDA_ERROR_STUB_LIBRARY, \"x\")\n   0: candle_core::error::Error::bt";
        assert_eq!(super::short_cuda_error(text), "no NVIDIA driver or GPU found");
        assert_eq!(
            super::short_cuda_error("DriverError(CUDA_ERROR_INVALID_DEVICE, \"\")\n bt"),
            "CUDA_ERROR_INVALID_DEVICE"
        );
        assert_eq!(super::short_cuda_error("odd\nmore"), "odd");
    }

    #[test]
    fn meminfo() {
        let text = "MemTotal:       32594000 kB\nMemFree:          845000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(super::meminfo_available(text), Some(20_000_000 * 1024));
        assert_eq!(super::meminfo_available("MemTotal: 1 kB\n"), None);
        assert!(super::host_available().is_some(), "Linux has /proc/meminfo");
    }
}
