//! Opening the CUDA libraries at run time, once each, the way the dynamic loader would have at
//! start-up: by SONAME, so `LD_LIBRARY_PATH`, the binary's run path (`scripts/install.sh`
//! records the PyPI library folder there; `dlopen` from the executable honours it), the
//! `ld.so.cache` and the system folders are searched in the loader's order.
//!
//! Both the probe (`probe.rs`, before any CUDA call) and the lazy trampolines (`lazy.rs`, at a
//! function's first call) go through [`open`], so a library is opened once and both agree on it.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

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
    pub lib: libloading::os::unix::Library,
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
    // dlopen'ed (cudarc's own dynamic-loading mode does the same).
    let lib = unsafe {
        libloading::os::unix::Library::open(Some(name), libc::RTLD_LAZY | libc::RTLD_LOCAL)
    }
    .map_err(|e| dl_error_text(&e))?;
    let raw = lib.into_raw();
    let path = loaded_path(raw);
    // SAFETY: `raw` came from `into_raw` just above and is used once.
    let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
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

/// The file a `dlopen` handle refers to, from its link map.
fn loaded_path(handle: *mut c_void) -> Option<PathBuf> {
    /// The documented head of glibc's `struct link_map`.
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const c_char,
    }
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes one pointer.
    let rc = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: the link map lives as long as the handle; l_name is a C string or null.
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: checked non-null just above; glibc keeps it nul-terminated.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    (!name.is_empty()).then(|| PathBuf::from(name))
}

/// The folders the loader searches for a library this executable opens, in its order:
/// `LD_LIBRARY_PATH`, the run path, then the system folders (`ld.so.cache` is consulted before
/// the system folders and is not listed). Empty when the loader does not say.
pub(crate) fn search_dirs() -> Vec<PathBuf> {
    #[repr(C)]
    struct SerPath {
        name: *const c_char,
        flags: c_uint,
    }
    #[repr(C)]
    struct SerInfo {
        size: usize,
        count: c_uint,
        paths: [SerPath; 0],
    }
    // SAFETY: dlopen(NULL) returns the main program's handle; it is never closed.
    let main = unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY) };
    if main.is_null() {
        return Vec::new();
    }
    let mut head = SerInfo { size: 0, count: 0, paths: [] };
    // SAFETY: RTLD_DI_SERINFOSIZE fills `size` and `count` of a Dl_serinfo.
    if unsafe { dlinfo_into(main, libc::RTLD_DI_SERINFOSIZE, &raw mut head) } != 0 {
        return Vec::new();
    }
    if head.size < size_of::<SerInfo>() {
        return Vec::new();
    }
    // 8-byte words so the buffer is aligned for the struct and its pointers.
    let mut buf = vec![0u64; head.size.div_ceil(8)];
    let info: *mut SerInfo = buf.as_mut_ptr().cast();
    // SAFETY: `buf` holds `head.size` bytes, as the protocol asks: size and count first, then
    // RTLD_DI_SERINFO fills the array and the strings after it inside the same buffer.
    unsafe {
        info.write(SerInfo { size: head.size, count: head.count, paths: [] });
        if dlinfo_into(main, libc::RTLD_DI_SERINFOSIZE, info) != 0
            || dlinfo_into(main, libc::RTLD_DI_SERINFO, info) != 0
        {
            return Vec::new();
        }
        let count = (*info).count as usize;
        let paths = (&raw const (*info).paths).cast::<SerPath>();
        (0..count)
            .map(|i| &*paths.add(i))
            .filter(|p| !p.name.is_null())
            .map(|p| PathBuf::from(CStr::from_ptr(p.name).to_string_lossy().into_owned()))
            .collect()
    }
}

/// `dlinfo(handle, request, info)`.
///
/// # Safety
/// `info` must point to what `request` expects, with the room it expects.
unsafe fn dlinfo_into<T>(handle: *mut c_void, request: c_int, info: *mut T) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { libc::dlinfo(handle, request, info.cast()) }
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
