//! What the glibc loader says about a library it opened and where it searches, through
//! `dlinfo` (a glibc extension). Elsewhere these know nothing: no path, no folders.

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
use std::path::PathBuf;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) use glibc::{search_dirs, with_path};

/// `lib` and where it was loaded from: unknown off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn with_path(lib: libloading::Library) -> (libloading::Library, Option<PathBuf>) {
    (lib, None)
}

/// The loader's search folders: unknown off glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn search_dirs() -> Vec<PathBuf> {
    Vec::new()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
    use std::path::PathBuf;

    /// `lib` and the file it was loaded from.
    pub(crate) fn with_path(lib: libloading::Library) -> (libloading::Library, Option<PathBuf>) {
        let raw = libloading::os::unix::Library::from(lib).into_raw();
        let path = loaded_path(raw);
        // SAFETY: `raw` came from `into_raw` just above and is used once.
        let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
        (lib.into(), path)
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
}
