//! Choosing the compute device. Users get a CUDA device or a clear error, never a silent CPU run;
//! the CPU is only for tests and an explicit debug flag.

use candle_core::Device;

use crate::error::{ErrorKind, fail};

/// What the banner and benchmarks report about the GPU.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// Opens CUDA device `ordinal` (the `--gpu N` flag).
#[cfg(feature = "cuda")]
pub fn open(ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    let device = Device::new_cuda(ordinal).map_err(|e| {
        fail(
            ErrorKind::NoDevice,
            format!("no CUDA device {ordinal} found ({e}); inferno needs an NVIDIA GPU and driver for CUDA 13"),
        )
    })?;
    let info = info(&device, ordinal)?;
    Ok((device, info))
}

#[cfg(feature = "cuda")]
fn info(device: &Device, ordinal: usize) -> anyhow::Result<GpuInfo> {
    let cuda = device.as_cuda_device()?;
    let ctx = cuda.cuda_stream().context().clone();
    let name = ctx.name().unwrap_or_else(|_| "unknown NVIDIA GPU".to_string());
    let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
    Ok(GpuInfo { ordinal, name, total_bytes: total as u64, free_bytes: free as u64 })
}

#[cfg(not(feature = "cuda"))]
pub fn open(_ordinal: usize) -> anyhow::Result<(Device, GpuInfo)> {
    Err(fail(ErrorKind::NoDevice, "this inferno was built without CUDA support (rebuild with the default features)"))
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
