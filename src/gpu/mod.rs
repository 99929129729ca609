//! Choosing the compute device. Users get a CUDA device or a clear error, never a silent CPU run;
//! the CPU is only for tests and an explicit debug flag.
//!
//! The CUDA driver and libraries are loaded at run time, not at program start (`lazy`), so the
//! binary runs without them; [`open`] checks first (`probe`) that everything is there.

use candle_core::Device;

use crate::error::{ErrorKind, fail};

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
}

/// Opens CUDA device `ordinal` (the `--gpu N` flag).
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
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
    Ok((device, info))
}

#[cfg(feature = "cuda")]
fn info(device: &Device, ordinal: usize) -> anyhow::Result<GpuInfo> {
    let cuda = device.as_cuda_device()?;
    let ctx = cuda.cuda_stream().context().clone();
    let name = ctx.name().unwrap_or_else(|_| "unknown NVIDIA GPU".to_string());
    let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
    let compute_capability = ctx.compute_capability().unwrap_or((0, 0));
    Ok(GpuInfo {
        ordinal,
        name,
        total_bytes: total as u64,
        free_bytes: free as u64,
        compute_capability,
    })
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
pub fn open(_ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    Err(fail(
        ErrorKind::NoDevice,
        "this inferno was built without CUDA support (rebuild with the default features)",
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

/// Memory that allocations on `device` can take now: the GPU's free memory, or the host's
/// `MemAvailable` for the CPU (`--cpu`). `None` when it cannot be read. What the loader's memory
/// plan and the engine's pool are held against.
pub fn available(device: &Device) -> Option<u64> {
    if !device.is_cuda() {
        return host_available();
    }
    // What the memory pool keeps for this process is free to it too (`mempool`).
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        let _ = mempool::trim(cuda.cuda_stream().context());
    }
    memory(device).map(|(free, _)| free)
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
