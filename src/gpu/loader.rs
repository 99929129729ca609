//! Opening the CUDA libraries at run time, once each, the way the dynamic loader would have at
//! start-up: by SONAME, so `LD_LIBRARY_PATH`, the binary's run path (`scripts/install.sh`
//! records the PyPI library folder there; `dlopen` from the executable honours it), the
//! `ld.so.cache` and the system folders are searched in the loader's order.
//!
//! Both the probe (`probe.rs`, before any CUDA call) and the lazy trampolines (`lazy.rs`, at a
//! function's first call) go through [`open`], so a library is opened once and both agree on it.

use std::path::PathBuf;
use std::sync::OnceLock;

pub(crate) use super::dlinfo::search_dirs;

/// One CUDA library the binary calls into, as the build found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library {
    /// As in `-l`: `cuda`, `nvrtc`, `curand`, `cublas`, `cublasLt`.
    pub link_name: &'static str,
    /// What is opened: `libcuda.so.1`, `libcublas.so.13`, …
    pub soname: &'static str,
}

// LIBRARIES and SYMBOLS (trampoline index -> (library index, function name)), written by
// build.rs from the libraries the link used.
#[cfg(feature = "cuda")]
include!(concat!(env!("OUT_DIR"), "/cuda_symbols.rs"));
#[cfg(not(feature = "cuda"))]
pub(crate) const LIBRARIES: [Library; 0] = [];

/// A library opened for the rest of the process (never closed: CUDA keeps pointers into it).
pub(crate) struct Opened {
    pub lib: libloading::Library,
    /// Where the loader found it, when it says.
    pub path: Option<PathBuf>,
}

static OPENED: [OnceLock<Result<Opened, String>>; LIBRARIES.len()] =
    [const { OnceLock::new() }; LIBRARIES.len()];

/// `LIBRARIES[index]`, opened on first use; the loader's error text when it cannot be.
pub(crate) fn open(index: usize) -> Result<&'static Opened, &'static str> {
    let (Some(cell), Some(lib)) = (OPENED.get(index), LIBRARIES.get(index)) else {
        return Err("no such CUDA library");
    };
    cell.get_or_init(|| open_now(lib.soname)).as_ref().map_err(String::as_str)
}

/// The index in [`LIBRARIES`] of the library linked as `link_name`.
pub(crate) fn index_of(link_name: &str) -> Option<usize> {
    LIBRARIES.iter().position(|l| l.link_name == link_name)
}

/// Opens `name` now (uncached).
pub(crate) fn open_now(name: &str) -> Result<Opened, String> {
    // SAFETY: opening a library runs its initialisers; the CUDA libraries are made to be
    // dlopen'ed (cudarc's own dynamic-loading mode does the same). On unix this is
    // dlopen(RTLD_LAZY | RTLD_LOCAL): their symbols stay out of the global scope.
    let lib = unsafe { libloading::Library::new(name) }.map_err(|e| dl_error_text(&e))?;
    let (lib, path) = super::dlinfo::with_path(lib);
    Ok(Opened { lib, path })
}

/// The loader's own message (`libcublas.so.13: cannot open shared object file: …`), not
/// libloading's "dlopen failed".
pub(crate) fn dl_error_text(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_gives_the_loaders_message() {
        let err = open_now("libinferno-absent.so.13").err().unwrap();
        assert!(
            err.starts_with("libinferno-absent.so.13: cannot open shared object file"),
            "{err}"
        );
    }

    #[test]
    fn an_opened_library_knows_its_path() {
        let opened = open_now("libc.so.6").unwrap();
        let path = opened.path.unwrap();
        assert!(path.is_absolute() && path.exists(), "{}", path.display());
    }

    #[test]
    fn the_search_path_lists_ld_library_path_and_system_folders() {
        let dirs = search_dirs();
        assert!(!dirs.is_empty());
        // LD_LIBRARY_PATH is read at start-up; this process's value is what the loader uses.
        if let Ok(llp) = std::env::var("LD_LIBRARY_PATH") {
            for d in llp.split(':').filter(|d| !d.is_empty()) {
                let d = PathBuf::from(d.trim_end_matches('/'));
                assert!(dirs.iter().any(|x| x.starts_with(&d)), "{} not in {dirs:?}", d.display());
            }
        }
        assert!(
            dirs.iter().any(|d| d.starts_with("/usr/lib") || d.starts_with("/lib")),
            "{dirs:?}"
        );
    }

    #[test]
    fn unknown_indexes_are_errors() {
        assert!(open(usize::MAX).is_err());
        assert_eq!(index_of("nonesuch"), None);
    }
}
