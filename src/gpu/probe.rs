//! Is CUDA usable on this machine, and if not, what exactly is missing?
//!
//! [`check`] runs before the first CUDA call (`gpu::open` calls it), so that `play`, `bench` and
//! `serve` stop with one line naming the problem (exit 8) instead of reaching a lazy trampoline
//! that cannot bind. Checked in this order: the driver library (`libcuda.so.1`); the driver
//! itself (not a stub, new enough, initialises, has GPUs, `--gpu N` exists); then the CUDA
//! libraries the binary calls ([`REQUIRED`]), naming the folders searched.
//!
//! [`libraries`], [`driver`] and [`search_dirs`] are the pieces, for a report such as
//! `inferno doctor`: they never fail the process.

use std::ffi::{c_char, c_int, c_uint};
use std::fmt;
use std::path::PathBuf;

use super::loader::{self, LIBRARIES, Opened};
use crate::error::{ErrorKind, fail};

/// The oldest CUDA version the driver must support: the CUDA libraries and our PTX are CUDA 13.
pub const MIN_CUDA: CudaVersion = CudaVersion { major: 13, minor: 0 };

/// The libraries [`check`] requires, in the order it checks them: those the binary calls into
/// (the driver, cuBLAS for matmuls, cuRAND for random tensors), the ones the loader required
/// before they were opened lazily. NVRTC is not called (candle's kernels are compiled when the
/// binary is built) and cuBLASLt only through libcublas, which loads it itself; a call that did
/// reach a missing one would stop the process with one line from its trampoline.
/// `tests/no_cuda.rs` checks that every library with a trampoline in the binary is listed here.
pub const REQUIRED: [&str; 3] = ["cuda", "cublas", "curand"];

/// One CUDA library, found or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibStatus {
    /// The library as linked: `cuda` (the driver), `nvrtc`, `curand`, `cublas`, `cublasLt`.
    pub name: &'static str,
    /// The file name the loader looks for (`libcublas.so.13`).
    pub soname: &'static str,
    /// Where it was loaded from.
    pub path: Option<PathBuf>,
    /// The loader's message when it could not be loaded.
    pub error: Option<String>,
    /// Whether GPU commands need it (see [`REQUIRED`]).
    pub required: bool,
}

/// Every CUDA library the binary uses, driver first, each opened if it can be (a library that
/// opens stays open for the process). Empty in a build without the `cuda` feature.
pub fn libraries() -> Vec<LibStatus> {
    LIBRARIES
        .iter()
        .enumerate()
        .map(|(i, lib)| {
            let (path, error) = match loader::open(i) {
                Ok(opened) => (opened.path.clone(), None),
                Err(e) => (None, Some(e.to_string())),
            };
            let required = REQUIRED.contains(&lib.link_name);
            LibStatus { name: lib.link_name, soname: lib.soname, path, error, required }
        })
        .collect()
}

/// The folders the loader searches for the CUDA libraries, in its order (`LD_LIBRARY_PATH`, the
/// binary's run path, the system folders); the `ld.so.cache` is searched too and not listed.
pub fn search_dirs() -> Vec<PathBuf> {
    loader::search_dirs()
}

/// A CUDA version as the driver reports it (13000 is 13.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub(crate) fn from_driver(v: c_int) -> CudaVersion {
        let v = v.max(0) as u32;
        CudaVersion { major: v / 1000, minor: v % 1000 / 10 }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A working NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// Where `libcuda.so.1` was loaded from.
    pub path: Option<PathBuf>,
    /// The newest CUDA version the driver supports (`cuDriverGetVersion`).
    pub cuda: CudaVersion,
    /// How many GPUs it sees (after `CUDA_VISIBLE_DEVICES`).
    pub devices: usize,
}

/// Loads and initialises the driver. The error (kind `NoDevice`) is one line saying what is
/// wrong: no driver, a stub, too old, failed to start, or no GPU.
pub fn driver() -> anyhow::Result<Driver> {
    let Some(index) = loader::index_of("cuda") else {
        return Err(fail(ErrorKind::NoDevice, "this inferno was built without CUDA support"));
    };
    let soname = LIBRARIES[index].soname;
    let opened = loader::open(index).map_err(|e| no_device(driver_missing(soname, e)))?;
    let api = DriverApi::bind(opened).map_err(no_device)?;
    let shown = opened.path.as_ref().map_or(soname.to_string(), |p| p.display().to_string());
    let cuda = api.version().map_err(|code| no_device(driver_error(&api, &shown, code)))?;
    if cuda < MIN_CUDA {
        return Err(no_device(format!(
            "the NVIDIA driver supports CUDA {cuda}; inferno needs CUDA {MIN_CUDA} or newer: \
             update the NVIDIA driver"
        )));
    }
    let devices = match api.init_and_count() {
        Ok(n) => n,
        Err(NO_DEVICE) => 0,
        Err(code) => return Err(no_device(driver_error(&api, &shown, code))),
    };
    if devices == 0 {
        return Err(no_device(no_gpu(&shown, cuda)));
    }
    Ok(Driver { path: opened.path.clone(), cuda, devices })
}

/// Everything device `ordinal` needs, checked before any CUDA call: the driver, the GPU, then
/// the [`REQUIRED`] libraries. The error is one line (kind `NoDevice`, exit 8).
pub fn check(ordinal: usize) -> anyhow::Result<Driver> {
    let driver = driver()?;
    if ordinal >= driver.devices {
        let n = driver.devices;
        return Err(no_device(format!(
            "no CUDA device {ordinal}: the NVIDIA driver sees {n} GPU{} (use --gpu 0{})",
            if n == 1 { "" } else { "s" },
            if n > 1 { format!("…{}", n - 1) } else { String::new() }
        )));
    }
    let libraries = REQUIRED.iter().filter(|name| **name != "cuda");
    for index in libraries.filter_map(|name| loader::index_of(name)) {
        if let Err(e) = loader::open(index) {
            let soname = LIBRARIES[index].soname;
            return Err(no_device(library_missing(soname, e, &search_dirs())));
        }
    }
    Ok(driver)
}

fn no_device(message: String) -> anyhow::Error {
    fail(ErrorKind::NoDevice, message)
}

/// Whether the loader's message says the file itself was not found (rather than, say, one of
/// its dependencies, or a file of the wrong architecture).
fn not_found(soname: &str, loader_error: &str) -> bool {
    loader_error.starts_with(&format!("{soname}: cannot open shared object file"))
}

fn driver_missing(soname: &str, loader_error: &str) -> String {
    if not_found(soname, loader_error) {
        format!(
            "no NVIDIA driver: {soname} was not found; inferno needs an NVIDIA GPU with a CUDA \
             {} driver (download and list work without one)",
            MIN_CUDA.major
        )
    } else {
        format!("the NVIDIA driver library {soname} could not be loaded: {loader_error}")
    }
}

fn library_missing(soname: &str, loader_error: &str, searched: &[PathBuf]) -> String {
    if !not_found(soname, loader_error) {
        return format!("{soname} could not be loaded: {loader_error}");
    }
    let name = soname.split(".so").next().unwrap_or(soname);
    let dirs: Vec<String> = searched.iter().map(|d| d.display().to_string()).collect();
    format!(
        "no {name}: {soname} was not found in {} or the loader cache; run scripts/install.sh, or \
         add the folder holding CUDA {}'s libraries to LD_LIBRARY_PATH",
        if dirs.is_empty() { "the library path".to_string() } else { dirs.join(", ") },
        MIN_CUDA.major
    )
}

fn no_gpu(driver: &str, cuda: CudaVersion) -> String {
    let visible = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => format!(" with CUDA_VISIBLE_DEVICES={v:?}"),
        Err(_) => String::new(),
    };
    format!("no CUDA device: the NVIDIA driver ({driver}, CUDA {cuda}) finds no GPU{visible}")
}

/// CUDA_ERROR_STUB_LIBRARY: the toolkit's (or our build's) link-time stand-in for libcuda.
const STUB_LIBRARY: c_int = 34;
/// CUDA_ERROR_NO_DEVICE: cuInit's answer when the driver sees no GPU.
const NO_DEVICE: c_int = 100;

/// A driver call failed with `code`.
fn driver_error(api: &DriverApi, driver: &str, code: c_int) -> String {
    match code {
        STUB_LIBRARY => format!(
            "no NVIDIA driver: {driver} is a stub libcuda, not the driver; install the NVIDIA \
             driver, or take the stub's folder out of LD_LIBRARY_PATH"
        ),
        _ => format!("the NVIDIA driver ({driver}) failed to start: {}", api.error_name(code)),
    }
}

/// The few driver entry points the probe calls, bound from the opened library (not through the
/// trampolines, so the probe works whatever state they are in).
struct DriverApi {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    error_name: Option<unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int>,
}

impl DriverApi {
    fn bind(opened: &Opened) -> Result<DriverApi, String> {
        // SAFETY: the signatures are the CUDA driver API's (cuda.h).
        unsafe {
            Ok(DriverApi {
                get_version: symbol(opened, "cuDriverGetVersion")?,
                init: symbol(opened, "cuInit")?,
                device_count: symbol(opened, "cuDeviceGetCount")?,
                error_name: symbol(opened, "cuGetErrorName").ok(),
            })
        }
    }

    fn version(&self) -> Result<CudaVersion, c_int> {
        let mut v = 0;
        // SAFETY: writes one int.
        match unsafe { (self.get_version)(&mut v) } {
            0 => Ok(CudaVersion::from_driver(v)),
            code => Err(code),
        }
    }

    fn init_and_count(&self) -> Result<usize, c_int> {
        // SAFETY: cuInit takes flags (0) and may be called more than once.
        let code = unsafe { (self.init)(0) };
        if code != 0 {
            return Err(code);
        }
        let mut n = 0;
        // SAFETY: writes one int; the driver is initialised.
        match unsafe { (self.device_count)(&mut n) } {
            0 => Ok(n.max(0) as usize),
            code => Err(code),
        }
    }

    /// `CUDA_ERROR_…` for a code, or the number.
    fn error_name(&self, code: c_int) -> String {
        let mut name: *const c_char = std::ptr::null();
        let known = self.error_name.is_some_and(|f| {
            // SAFETY: writes a pointer to a static string, or fails for an unknown code.
            unsafe { f(code, &mut name) == 0 && !name.is_null() }
        });
        if known {
            // SAFETY: non-null, nul-terminated, static in the driver.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            format!("{} ({code})", name.to_string_lossy())
        } else {
            format!("CUDA error {code}")
        }
    }
}

/// A function pointer of type `F` for `name` in `opened`.
///
/// # Safety
/// `F` must be the function's true signature.
unsafe fn symbol<F: Copy>(opened: &Opened, name: &str) -> Result<F, String> {
    // SAFETY: forwarded to the caller.
    let f = unsafe { opened.lib.get::<F>(name.as_bytes()) };
    f.map(|s| *s).map_err(|e| {
        let shown = opened.path.as_ref().map_or(String::new(), |p| format!(" ({})", p.display()));
        format!("the NVIDIA driver{shown} has no {name}: {}", loader::dl_error_text(&e))
    })
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
