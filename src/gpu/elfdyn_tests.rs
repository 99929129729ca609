//! Tests of `elfdyn.rs` (kept apart so that `tests/no_cuda.rs` can include that file alone).

use std::path::PathBuf;

/// The C library this test process runs with, from its own memory map.
fn loaded_libc() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with("libc.so")))
        .map(PathBuf::from)
        .expect("libc is mapped")
}

#[test]
fn reads_the_c_library() {
    let libc = super::elfdyn::read(&loaded_libc()).unwrap();
    assert_eq!(libc.soname.as_deref(), Some("libc.so.6"));
    // Versioned in .dynsym (malloc@@GLIBC_2.2.5): the bare name is what the reader returns.
    for f in ["malloc", "dlopen", "qsort"] {
        assert!(libc.functions.iter().any(|n| n == f), "{f} missing");
    }
    // Data symbols are not functions.
    assert!(!libc.functions.iter().any(|n| n == "environ"));
}

#[test]
fn reads_needed_and_run_path_of_an_executable() {
    let me = super::elfdyn::read(&std::env::current_exe().unwrap()).unwrap();
    assert!(me.needed.iter().any(|n| n.starts_with("libc.so")), "{:?}", me.needed);
    assert_eq!(me.soname, None);
}

#[test]
fn a_file_that_is_not_elf_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libfake.so");
    std::fs::write(&path, b"/* GNU ld script */ INPUT(-lfoo)").unwrap();
    let err = super::elfdyn::read(&path).unwrap_err();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(super::elfdyn::read(&dir.path().join("absent.so")).is_err());
}
