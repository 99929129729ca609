//! The GPU side: the NVIDIA driver, the CUDA libraries the binary opens at run time (with where
//! they were found), each GPU with its compute capability and free memory, and whether this
//! binary's kernels were compiled for it. Nothing here can stop the process: every failure is a
//! finding.

use std::path::PathBuf;

use serde::Serialize;

use super::Problem;
use super::render::Line;
use crate::gpu::probe;
use crate::util::human_bytes_iec as iec;

/// The GPU targets the kernels were compiled for (`sm_80,…,compute_120`); `None` in a build
/// without CUDA.
pub const KERNELS_FOR: Option<&str> = crate::gpu::BUILT_FOR;

#[derive(Debug, Serialize)]
pub struct GpuReport {
    /// The NVIDIA kernel module's version (`/proc/driver/nvidia/version`).
    pub driver_version: Option<String>,
    /// The newest CUDA version the driver supports.
    pub cuda_version: Option<String>,
    pub driver_path: Option<PathBuf>,
    /// Why the driver is unusable, if it is.
    pub driver_error: Option<String>,
    pub libraries: Vec<LibraryReport>,
    /// Where the loader looks for them (besides ld.so.cache).
    pub search_dirs: Vec<PathBuf>,
    /// The targets the kernels were built for (`sm_XY` machine code, `compute_XY` PTX); `None`:
    /// a build without CUDA.
    pub kernels_built_for: Option<String>,
    pub devices: Vec<DeviceReport>,
    /// GPUs the driver lists that could not be opened.
    pub device_errors: Vec<String>,
    /// With several GPUs: NCCL's version (for `--tp`), or why it cannot be opened.
    pub nccl: Option<Result<String, String>>,
    /// With several GPUs: how each pair is linked, as `nvidia-smi topo -m` says (`NV18`: NVLink,
    /// `PIX`/`PXB`/`PHB`/`NODE`/`SYS`: PCIe paths).
    pub links: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct LibraryReport {
    pub name: &'static str,
    pub soname: &'static str,
    pub required: bool,
    pub path: Option<PathBuf>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Whether this binary's kernels run on this GPU.
    pub kernels_match: bool,
    /// The code it runs (`sm_86`: machine code; `compute_120`: PTX the driver compiles), or why
    /// none does.
    pub kernels: String,
    /// Shared memory a block may take, bytes (what sizes the kernels' launches).
    pub shared_per_block: usize,
}

pub fn check() -> GpuReport {
    let libraries: Vec<LibraryReport> = crate::gpu::libraries()
        .into_iter()
        .map(|l| LibraryReport {
            name: l.name,
            soname: l.soname,
            required: probe::REQUIRED.contains(&l.name),
            path: l.path,
            error: l.error,
        })
        .collect();
    let mut report = GpuReport {
        driver_version: kernel_module_version(),
        cuda_version: None,
        driver_path: None,
        driver_error: None,
        search_dirs: probe::search_dirs(),
        kernels_built_for: KERNELS_FOR.map(str::to_string),
        devices: Vec::new(),
        device_errors: Vec::new(),
        nccl: None,
        links: Vec::new(),
        libraries,
    };
    match probe::driver() {
        Ok(d) => {
            report.cuda_version = Some(d.cuda.to_string());
            report.driver_path = d.path;
            if report.libraries.iter().all(|l| !l.required || l.error.is_none()) {
                open_devices(&mut report, d.devices);
            }
            if d.devices > 1 {
                report.nccl = Some(nccl_version());
                report.links = gpu_links();
            }
        }
        Err(e) => report.driver_error = Some(format!("{e:#}")),
    }
    report
}

fn open_devices(report: &mut GpuReport, count: usize) {
    for ordinal in 0..count {
        match crate::gpu::open_any(ordinal) {
            Ok((_, info)) => {
                let (major, minor) = info.compute_capability;
                let code = crate::gpu::kernels_for(&info.name, info.compute_capability);
                report.devices.push(DeviceReport {
                    ordinal,
                    name: info.name,
                    compute_capability: format!("{major}.{minor}"),
                    total_bytes: info.total_bytes,
                    free_bytes: info.free_bytes,
                    kernels_match: code.is_ok(),
                    kernels: match code {
                        Ok(t) if t.sass => format!("runs this binary's {} machine code", t.name()),
                        Ok(t) => format!(
                            "runs this binary's {} PTX, compiled by the driver at its first start",
                            t.name()
                        ),
                        Err(e) => e,
                    },
                    shared_per_block: info.shared_per_block,
                });
            }
            Err(e) => report.device_errors.push(format!("GPU {ordinal}: {e:#}")),
        }
    }
}

#[cfg(feature = "cuda")]
fn nccl_version() -> Result<String, String> {
    crate::dist::nccl::version().map_err(|e| crate::error::one_line(&e))
}

#[cfg(not(feature = "cuda"))]
fn nccl_version() -> Result<String, String> {
    Err("a build without CUDA".into())
}

/// "GPU0–GPU1: NV18" for each pair, from `nvidia-smi topo -m` (empty without nvidia-smi).
fn gpu_links() -> Vec<String> {
    let Ok(out) = std::process::Command::new("nvidia-smi").args(["topo", "-m"]).output() else {
        return Vec::new();
    };
    parse_topology(&String::from_utf8_lossy(&out.stdout))
}

fn is_gpu(word: &str) -> bool {
    word.strip_prefix("GPU").is_some_and(|n| n.parse::<usize>().is_ok())
}

/// The GPU-to-GPU cells of `nvidia-smi topo -m`'s matrix (colour codes stripped).
fn parse_topology(text: &str) -> Vec<String> {
    // SGR colour codes (ESC [ … m) around the header.
    let mut clean = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            clean.push(c);
        }
    }
    let rows: Vec<Vec<&str>> = clean
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        // A matrix row: `GPUn` then cells; the header's second word is a GPU too.
        .filter(|w| w.len() > 1 && is_gpu(w[0]) && !is_gpu(w[1]))
        .collect();
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        for (j, other) in rows.iter().enumerate().skip(i + 1) {
            if let Some(link) = row.get(1 + j) {
                out.push(format!("{}–{}: {link}", row[0], other[0]));
            }
        }
    }
    out
}

/// `580.159.04` out of "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Mon …".
fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_module_version(&text)
}

/// The first word that looks like a version after "Kernel Module" (the open module writes
/// "Open Kernel Module for x86_64  580.159.04").
fn parse_module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    let after = line.split("Kernel Module").nth(1)?;
    let is_version =
        |w: &&str| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.');
    after.split_whitespace().find(is_version).map(str::to_string)
}

impl GpuReport {
    pub fn lines(&self) -> Vec<Line> {
        let mut out = Vec::new();
        match (&self.driver_error, &self.cuda_version) {
            (Some(e), _) => out.push(Line::bad(e.clone())),
            (None, Some(cuda)) => out.push(Line::ok(format!(
                "NVIDIA driver {} (CUDA {cuda}){}",
                self.driver_version.as_deref().unwrap_or("(version unknown)"),
                self.driver_path.as_ref().map_or(String::new(), |p| format!(", {}", p.display()))
            ))),
            (None, None) => {}
        }
        // The driver's own library is covered by the driver line above.
        for l in self.libraries.iter().filter(|l| l.name != "cuda" || self.driver_error.is_none()) {
            let text = match (&l.path, &l.error) {
                (Some(p), _) => format!("{} at {}", l.soname, p.display()),
                (None, None) => format!("{} loaded", l.soname),
                (None, Some(_)) if !l.required => {
                    format!("{} not found (optional: not called by this build)", l.soname)
                }
                (None, Some(e)) => format!("{} not loaded: {e}", l.soname),
            };
            let fine = l.error.is_none() || !l.required;
            out.push(if fine { Line::ok(text) } else { Line::bad(text) });
        }
        for d in &self.devices {
            out.push(Line::ok(format!(
                "GPU {}: {}, compute capability {}, {} free of {}, {} KiB shared memory a block",
                d.ordinal,
                d.name,
                d.compute_capability,
                iec(d.free_bytes),
                iec(d.total_bytes),
                d.shared_per_block / 1024
            )));
            let built = self.kernels_built_for.as_deref().unwrap_or("no GPU");
            let text = format!("kernels built for {built}; GPU {} {}", d.ordinal, d.kernels);
            out.push(if d.kernels_match { Line::ok(text) } else { Line::bad(text) });
        }
        out.extend(self.device_errors.iter().map(|e| Line::bad(e.clone())));
        match &self.nccl {
            Some(Ok(v)) => out.push(Line::ok(format!("NCCL {v} (--tp)"))),
            Some(Err(e)) => {
                out.push(Line::ok(format!("NCCL not found, --tp above 1 unavailable ({e})")))
            }
            None => {}
        }
        if !self.links.is_empty() {
            out.push(Line::ok(format!("GPU links: {}", self.links.join(", "))));
        }
        if self.kernels_built_for.is_none() {
            out.push(Line::bad("this inferno was built without CUDA (CPU-only build)"));
        }
        out
    }

    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.kernels_built_for.is_none() {
            out.push(Problem {
                what: "this inferno was built without CUDA".into(),
                fix: "build it with `--features cuda`: bash scripts/install.sh".into(),
            });
            return out;
        }
        if let Some(e) = &self.driver_error {
            out.push(Problem {
                what: e.clone(),
                fix: "install or update the NVIDIA driver (CUDA 13.0 or newer); download, list \
                      and doctor work without it"
                    .into(),
            });
        }
        let missing = |l: &&LibraryReport| l.required && l.error.is_some() && l.name != "cuda";
        for l in self.libraries.iter().filter(missing) {
            let dirs: Vec<String> =
                self.search_dirs.iter().map(|d| d.display().to_string()).collect();
            out.push(Problem {
                what: format!(
                    "{} not found (searched {} and the ld.so cache)",
                    l.soname,
                    dirs.join(", ")
                ),
                fix: "run scripts/install.sh (it fetches the CUDA 13 libraries and records their \
                      folder in the binary), install the CUDA 13 toolkit, or add the folder \
                      holding them to LD_LIBRARY_PATH"
                    .into(),
            });
        }
        for d in self.devices.iter().filter(|d| !d.kernels_match) {
            let cap = d.compute_capability.replace('.', "");
            let old = cap.parse::<u32>().is_ok_and(|c| c < crate::gpu::targets::OLDEST);
            out.push(Problem {
                what: format!(
                    "GPU {} ({}) has compute capability {}; this binary's kernels were built for {}",
                    d.ordinal,
                    d.name,
                    d.compute_capability,
                    self.kernels_built_for.as_deref().unwrap_or("none")
                ),
                fix: if old {
                    "inferno needs compute capability 8.0 (Ampere) or newer: use another GPU \
                     (--gpu N)"
                        .into()
                } else {
                    format!(
                        "rebuild it: bash scripts/install.sh (every GPU since Ampere), or \
                         CUDA_COMPUTE_CAP={cap} bash scripts/install.sh"
                    )
                },
            });
        }
        for e in &self.device_errors {
            out.push(Problem {
                what: e.clone(),
                fix: "check `nvidia-smi`; another process may hold the GPU, or \
                      CUDA_VISIBLE_DEVICES hides it"
                    .into(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_links_come_from_the_topology_matrix() {
        let text = "\u{1b}[4mGPU0\tGPU1\tGPU2\tCPU Affinity\u{1b}[0m\nGPU0\t X \tNV18\tSYS\t0-31\nGPU1\tNV18\t X \tPIX\t0-31\nGPU2\tSYS\tPIX\t X \t0-31\n\nLegend:\n  X    = Self\n";
        assert_eq!(
            super::parse_topology(text),
            ["GPU0–GPU1: NV18", "GPU0–GPU2: SYS", "GPU1–GPU2: PIX"]
        );
        assert!(super::parse_topology("No devices were found").is_empty());
    }

    #[test]
    fn module_version_from_proc() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct  7 2025\n\
                    GCC version:  gcc version 12.2.0\n";
        assert_eq!(super::parse_module_version(text).as_deref(), Some("580.159.04"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release \
                    Build  (dvs-builder@U16-I3-B08-4-1)  Tue Oct  7 2025\n";
        assert_eq!(super::parse_module_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(super::parse_module_version("garbage"), None);
    }
}

#[cfg(test)]
mod report_tests {
    use super::{DeviceReport, GpuReport};

    fn report(built_for: Option<&str>, cap: &str, matches: bool) -> GpuReport {
        GpuReport {
            driver_version: Some("580.1".into()),
            cuda_version: Some("13.0".into()),
            driver_path: None,
            driver_error: None,
            libraries: Vec::new(),
            search_dirs: Vec::new(),
            kernels_built_for: built_for.map(str::to_string),
            devices: vec![DeviceReport {
                ordinal: 0,
                name: "NVIDIA L40S".into(),
                compute_capability: cap.into(),
                total_bytes: 48 << 30,
                free_bytes: 47 << 30,
                kernels_match: matches,
                kernels: String::new(),
                shared_per_block: 101_376,
            }],
            device_errors: Vec::new(),
            nccl: None,
            links: Vec::new(),
        }
    }

    #[test]
    fn kernels_for_another_gpu_are_a_problem_with_the_rebuild_command() {
        let problems = report(Some("sm_90"), "8.9", false).problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].what.contains("8.9") && problems[0].what.contains("sm_90"));
        assert!(problems[0].fix.contains("CUDA_COMPUTE_CAP=89"), "{:?}", problems[0]);
        assert!(problems[0].fix.contains("install.sh"), "{:?}", problems[0]);
        let old = report(Some("sm_80,compute_80"), "7.5", false).problems();
        assert!(old[0].fix.contains("8.0"), "{old:?}");
        assert!(report(Some("sm_90"), "9.0", true).problems().is_empty());
    }

    #[test]
    fn a_build_without_cuda_says_how_to_get_one() {
        let problems = report(None, "9.0", false).problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].fix.contains("install.sh"));
    }
}
