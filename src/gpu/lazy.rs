//! Lazy-binding trampolines: the binary starts, and `download`, `list`, `--help` run, on a
//! machine without the NVIDIA driver or the CUDA libraries.
//!
//! # Why
//! candle-core 0.11 turns on cudarc's `dynamic-linking`, so cudarc declares every CUDA function
//! `extern "C"` and its build script links `-lcuda -lnvrtc -lcurand -lcublas -lcublasLt`. Linked
//! that way, the loader must find all five before `main` runs, or the process dies with "error
//! while loading shared libraries". cudarc's `dynamic-loading` mode would avoid that, but it
//! cannot be chosen: Cargo features only add up, and cudarc's build script refuses both modes
//! at once; cudarc declares no `links` key, so its link flags cannot be overridden from
//! `.cargo/config`; and patching candle or cudarc would mean carrying their source.
//!
//! # How
//! `build.rs` reads the exported functions of those five libraries, as the link will find them
//! (`codegen.rs`), and this module defines each name itself, in assembly: a trampoline that jumps
//! through a pointer slot. The linker binds cudarc's calls to these definitions, so no symbol
//! comes from the libraries and `--as-needed` (rustc's default) drops them from `DT_NEEDED`.
//! Each slot starts at a small stub that saves the argument registers, calls
//! [`inferno_cuda_resolve`] (which opens the library through `loader.rs` and looks the name up),
//! stores the real address in the slot and jumps there with the registers restored. Later calls
//! cost one indirect jump, as a call through the PLT does.
//!
//! The trampolines have hidden visibility. An executable's symbols may be exported for
//! interposition; a visible `cublasLt*` here would then capture libcublas's own calls into
//! libcublasLt, and those would resolve back to libcublasLt only by luck.
//!
//! The probe (`probe.rs`) checks the driver and opens the libraries the binary calls before the
//! first CUDA call, so a missing piece is reported as one line with exit code 8. Should a call
//! still reach a library or function that cannot be bound (say, a libcublas older than the one
//! built against), the stub cannot return an error of the function's type: the process prints
//! one line and exits with code 8.
//!
//! Each trampoline sits in sections of its own, so `--gc-sections` keeps only those called.
//!
//! The CUDA runtime (libcudart) gets no trampolines: candle-kernels links nvcc-built kernels
//! whose static constructors call it while the process starts, which would open it before
//! `main` on every machine. `build.rs` links the static runtime instead, as nvcc does by
//! default; it opens libcuda.so.1 itself at its first real call.

use std::ffi::c_void;
use std::io::Write as _;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::loader::{self, LIBRARIES, SYMBOLS};

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/cuda_lazy.s")), options(att_syntax));
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/cuda_lazy.s")));

/// Called by the lazy stub of trampoline `index` (see the module header): binds the function,
/// stores it in `slot` and returns it. Never returns when it cannot: one line, exit code 8.
///
/// `#[no_mangle]` also makes rustc keep the object that holds it, and with it the trampolines,
/// in every link of this crate, whatever the linker's archive rules.
#[unsafe(no_mangle)]
extern "C" fn inferno_cuda_resolve(index: usize, slot: *const AtomicPtr<c_void>) -> *mut c_void {
    match bind(index) {
        Ok(f) => {
            // SAFETY: `slot` is the trampoline's own slot (8 aligned bytes in .data), passed by
            // its stub. Racing threads store the same address.
            unsafe { (*slot).store(f, Ordering::Release) };
            f
        }
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "error: {message}");
            std::process::exit(8);
        }
    }
}

/// The address of trampoline `index`'s function, or why there is none.
fn bind(index: usize) -> Result<*mut c_void, String> {
    let &(lib, name) = SYMBOLS.get(index).ok_or("CUDA trampoline index out of range")?;
    let soname = LIBRARIES.get(usize::from(lib)).map_or("?", |l| l.soname);
    let opened = loader::open(usize::from(lib))
        .map_err(|e| format!("{name} needs {soname}, which could not be loaded: {e}"))?;
    // SAFETY: only the address is read; the caller's own declaration gives the signature.
    let symbol = unsafe { opened.lib.get::<*mut c_void>(name.as_bytes()) };
    match symbol {
        Ok(f) if !f.is_null() => Ok(*f),
        Ok(_) => Err(format!("{name} is null in {soname}")),
        Err(e) => {
            let path = opened.path.as_ref().map_or(soname.into(), |p| p.display().to_string());
            Err(format!(
                "{path} has no function {name} ({}): inferno was built against a newer {soname}",
                loader::dl_error_text(&e)
            ))
        }
    }
}

#[cfg(test)]
#[path = "lazy_tests.rs"]
mod tests;
