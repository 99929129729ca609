//! The GPU architectures a build holds code for, and what each one allows a block. build.rs
//! includes this file (`#[path]`) to choose nvcc's targets and to check every kernel against
//! their limits; the binary reads the same list back (`BUILT`) to tell, before the first kernel
//! launch, whether it can run on the GPU at hand.
//!
//! A target is machine code (`sm_XY`, run by GPUs of compute capability X.Z with Z ≥ Y) or PTX
//! (`compute_XY`, compiled by the driver for any GPU of capability X.Y or newer). The default set
//! is machine code for every architecture from Ampere on that CUDA 13.0 builds (sm_80 A100,
//! sm_86 RTX 30 / A10 / A6000, sm_89 RTX 40 / L4 / L40S, sm_90 H100 / H200, sm_100 B200, sm_120
//! RTX 50) and PTX for the newest, which a later GPU compiles at its first start.
//!
//! Binary compatibility covers the rest: sm_80 code also runs on 8.6, 8.7 and 8.9, sm_100 code on
//! 10.3, sm_120 code on 12.1. sm_86 and sm_89 are still built apart: sm_89 has the FP8 tensor-core
//! instructions (`__CUDA_ARCH__` 890 selects them), and each is scheduled for its own SMs.
//! Jetson Thor (11.0) is the one Ampere-or-later GPU the default misses: no sm_100 code runs there
//! and compute_120 PTX is too new for it; `CUDA_COMPUTE_CAP=110` builds for it.

/// Compute capabilities below this have no bf16 tensor cores, which every model's kernels use.
pub const OLDEST: u32 = 80;

/// `CUDA_COMPUTE_CAP` when unset: every Ampere-or-later architecture, PTX for the newest.
pub const DEFAULT: &str = "80,86,89,90,100,120";

/// One `-gencode` of the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    /// Compute capability as 10 · major + minor (86 for 8.6).
    pub cap: u32,
    /// Machine code (`sm_XY`); otherwise PTX (`compute_XY`).
    pub sass: bool,
}

impl Target {
    /// `sm_86` or `compute_86`.
    pub fn name(self) -> String {
        format!("{}_{}", if self.sass { "sm" } else { "compute" }, self.cap)
    }

    /// Whether a GPU of capability `cap` runs this code.
    pub fn runs_on(self, cap: u32) -> bool {
        if self.sass { cap / 10 == self.cap / 10 && cap >= self.cap } else { cap >= self.cap }
    }
}

/// The targets of a `CUDA_COMPUTE_CAP` value: capabilities separated by commas, spaces or
/// semicolons, each `86`, `8.6` or `sm_86` (machine code) or `compute_86` (PTX alone), or `all`
/// for [`DEFAULT`]. Unless the list names PTX itself, the newest machine code also gets its PTX,
/// as `-arch=sm_XY` does. Sorted, without repeats.
pub fn parse(spec: &str) -> Result<Vec<Target>, String> {
    let mut out = Vec::new();
    let mut explicit_ptx = false;
    for word in spec.split([',', ' ', ';']).map(str::trim).filter(|w| !w.is_empty()) {
        if word.eq_ignore_ascii_case("all") {
            out.extend(parse(DEFAULT)?);
            continue;
        }
        let (sass, digits) = match word.strip_prefix("compute_") {
            Some(rest) => (false, rest),
            None => (true, word.strip_prefix("sm_").unwrap_or(word)),
        };
        let cap = match digits.split_once('.') {
            Some((major, minor)) if minor.len() == 1 => format!("{major}{minor}"),
            _ => digits.to_string(),
        };
        let cap: u32 = cap.parse().ok().filter(|c| (10..=999).contains(c)).ok_or_else(|| {
            format!("`{word}` is not a compute capability (like 86, 8.6, sm_86 or compute_86)")
        })?;
        if cap < OLDEST {
            return Err(format!(
                "compute capability {}.{} is older than Ampere (8.0), which inferno needs",
                cap / 10,
                cap % 10
            ));
        }
        explicit_ptx |= !sass;
        out.push(Target { cap, sass });
    }
    if out.is_empty() {
        return Err("no compute capability given".into());
    }
    if !explicit_ptx && let Some(newest) = out.iter().map(|t| t.cap).max() {
        out.push(Target { cap: newest, sass: false });
    }
    out.sort_by_key(|t| (t.cap, !t.sass));
    out.dedup();
    Ok(out)
}

/// The list as build.rs records it for the binary: `sm_80,…,compute_120`.
pub fn encode(targets: &[Target]) -> String {
    targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(",")
}

/// Which of `targets` a GPU of capability `cap` runs, as the driver chooses: machine code for its
/// own architecture first, else the newest PTX it can compile; `None` when no code fits.
pub fn chosen(targets: &[Target], cap: u32) -> Option<Target> {
    let best = |sass: bool| {
        targets.iter().copied().filter(|t| t.sass == sass && t.runs_on(cap)).max_by_key(|t| t.cap)
    };
    best(true).or_else(|| best(false))
}

/// The most shared memory a block may take on a GPU of capability `cap` (static and dynamic
/// together, after opting in with `cudaFuncAttributeMaxDynamicSharedMemorySize`), in bytes. From
/// the CUDA programming guide's table of compute capabilities; 9.0 measured on an H200. An
/// unknown later architecture gets the smallest of its generation's relatives, 99 KiB.
pub fn shared_per_block(cap: u32) -> usize {
    match cap {
        80 | 87 => 166_912,
        90 | 100 | 103 | 110 => 232_448,
        _ => 101_376,
    }
}

/// Registers a thread may hold on every architecture from sm_80 on.
pub const MAX_REGISTERS: u32 = 255;

#[cfg(test)]
mod tests {
    use super::{Target, chosen, encode, parse};

    fn names(spec: &str) -> String {
        encode(&parse(spec).unwrap())
    }

    #[test]
    fn the_default_is_every_architecture_since_ampere_and_ptx_for_the_newest() {
        assert_eq!(names("all"), "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120,compute_120");
        assert_eq!(names("8.6"), "sm_86,compute_86");
        assert_eq!(names("sm_90, 80"), "sm_80,sm_90,compute_90");
        assert_eq!(names("compute_80"), "compute_80");
        assert_eq!(names("89;compute_89"), "sm_89,compute_89");
        for bad in ["", "75", "7.5", "sm_ninety", "compute_", "1000"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn machine_code_runs_within_its_major_version_and_ptx_on_anything_newer() {
        let all = parse("all").unwrap();
        let pick = |cap| chosen(&all, cap).map(|t: Target| t.name());
        assert_eq!(pick(80).as_deref(), Some("sm_80"));
        assert_eq!(pick(87).as_deref(), Some("sm_86"));
        assert_eq!(pick(89).as_deref(), Some("sm_89"));
        assert_eq!(pick(90).as_deref(), Some("sm_90"));
        assert_eq!(pick(103).as_deref(), Some("sm_100"));
        assert_eq!(pick(121).as_deref(), Some("sm_120"));
        assert_eq!(pick(130).as_deref(), Some("compute_120"));
        assert_eq!(pick(110), None, "Jetson Thor: no sm_100 code runs there, compute_120 is newer");
        let hopper = parse("90").unwrap();
        assert_eq!(chosen(&hopper, 86), None);
        assert_eq!(chosen(&hopper, 100).map(|t| t.name()).as_deref(), Some("compute_90"));
        let ptx = parse("compute_80").unwrap();
        assert_eq!(chosen(&ptx, 90).map(|t| t.name()).as_deref(), Some("compute_80"));
    }
}
