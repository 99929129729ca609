use std::path::PathBuf;

use super::*;

const NOT_FOUND: &str =
    "libcublas.so.13: cannot open shared object file: No such file or directory";

#[test]
fn a_missing_library_names_the_folders_searched() {
    let dirs = [PathBuf::from("/opt/app/lib"), PathBuf::from("/usr/lib/x86_64-linux-gnu")];
    let msg = library_missing("libcublas.so.13", NOT_FOUND, &dirs);
    assert_eq!(
        msg,
        "no libcublas: libcublas.so.13 was not found in /opt/app/lib, /usr/lib/x86_64-linux-gnu \
         or the loader cache; run scripts/install.sh, or add the folder holding CUDA 13's \
         libraries to LD_LIBRARY_PATH"
    );
    assert!(
        library_missing("libcublas.so.13", NOT_FOUND, &[])
            .contains("not found in the library path")
    );
}

#[test]
fn a_library_that_is_there_but_broken_gets_the_loaders_reason() {
    let dep = "libcublasLt.so.13: cannot open shared object file: No such file or directory";
    assert_eq!(
        library_missing("libcublas.so.13", dep, &[]),
        format!("libcublas.so.13 could not be loaded: {dep}")
    );
}

#[test]
fn no_driver_says_so_and_what_still_works() {
    let err = "libcuda.so.1: cannot open shared object file: No such file or directory";
    let msg = driver_missing("libcuda.so.1", err);
    assert!(msg.starts_with("no NVIDIA driver: libcuda.so.1 was not found"), "{msg}");
    assert!(msg.contains("download and list work without one"), "{msg}");
    let msg = driver_missing("libcuda.so.1", "libcuda.so.1: wrong ELF class: ELFCLASS32");
    assert_eq!(
        msg,
        "the NVIDIA driver library libcuda.so.1 could not be loaded: libcuda.so.1: wrong ELF class: ELFCLASS32"
    );
}

#[test]
fn driver_versions_read_as_cuda_does() {
    assert_eq!(CudaVersion::from_driver(13000), CudaVersion { major: 13, minor: 0 });
    assert_eq!(CudaVersion::from_driver(12040).to_string(), "12.4");
    assert!(CudaVersion::from_driver(12090) < MIN_CUDA);
    assert!(CudaVersion::from_driver(13010) >= MIN_CUDA);
    assert_eq!(CudaVersion::from_driver(-1).to_string(), "0.0");
}

#[test]
fn messages_are_one_line() {
    let dirs = [PathBuf::from("/a")];
    for msg in [
        library_missing("libcurand.so.10", NOT_FOUND, &dirs),
        driver_missing("libcuda.so.1", NOT_FOUND),
        no_gpu("/usr/lib/libcuda.so.1", MIN_CUDA),
    ] {
        assert!(!msg.contains('\n'), "{msg}");
    }
}

#[cfg(feature = "cuda")]
#[test]
fn the_driver_comes_first_and_every_library_is_listed() {
    let libs = libraries();
    let names: Vec<&str> = libs.iter().map(|l| l.name).collect();
    assert_eq!(names, crate::gpu::codegen::LINKED);
    assert_eq!(libs[0].soname, "libcuda.so.1");
    for lib in &libs {
        assert!(lib.soname.starts_with(&format!("lib{}.so", lib.name)), "{lib:?}");
        assert!(lib.path.is_some() != lib.error.is_some(), "{lib:?}");
        assert_eq!(lib.required, REQUIRED.contains(&lib.name));
    }
    for name in REQUIRED {
        assert!(names.contains(&name), "{name} is not a library of the build");
    }
}
