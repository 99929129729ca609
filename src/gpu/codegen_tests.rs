use std::path::PathBuf;

use super::*;

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

#[test]
fn link_dirs_come_from_rustflags_in_order() {
    let flags = ["-L", "/a", "-Lnative=/b", "-L", "dependency=/c", "-Copt-level=3", "-Lall=/d"];
    assert_eq!(rustflags_link_dirs(&flags.join("\x1f")), [p("/a"), p("/b"), p("/d")]);
    assert!(rustflags_link_dirs("").is_empty());
    // A trailing `-L` with no value is ignored, not a panic.
    assert!(rustflags_link_dirs("-L").is_empty());
}

#[test]
fn search_order_is_cudarc_then_rustflags_then_library_path_then_system() {
    let env = LinkEnv {
        cuda_roots: vec![p("/cuda")],
        encoded_rustflags: "-L\x1f/stub\x1f-L\x1f/cuda/lib".into(),
        library_path: "/lp1::/lp2".into(),
        multiarch: "x86_64-linux-gnu".into(),
    };
    let dirs = search_dirs(&env);
    let at = |d: &str| dirs.iter().position(|x| x == &p(d)).unwrap_or_else(|| panic!("{d}"));
    assert_eq!(at("/cuda/lib"), 0);
    assert!(at("/cuda/lib64/stubs") < at("/stub"));
    assert!(at("/stub") < at("/lp1") && at("/lp1") < at("/lp2"));
    assert!(at("/lp2") < at("/usr/lib/x86_64-linux-gnu"));
    assert!(at("/usr/lib/x86_64-linux-gnu") < at("/usr/lib"));
    // /cuda/lib from RUSTFLAGS is not searched twice.
    assert_eq!(dirs.iter().filter(|d| *d == &p("/cuda/lib")).count(), 1);
    // Without CUDA roots, cudarc falls back to the usual install places.
    let dirs =
        search_dirs(&LinkEnv { multiarch: "aarch64-linux-gnu".into(), ..LinkEnv::default() });
    assert!(dirs.contains(&p("/usr/local/cuda/lib64")));
    assert!(dirs.contains(&p("/usr/lib/aarch64-linux-gnu")));
}

#[test]
fn the_first_folder_holding_the_library_wins() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    std::fs::write(b.path().join("libcublas.so"), b"").unwrap();
    std::fs::write(a.path().join("libcublas.so.13"), b"").unwrap();
    let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
    assert_eq!(find_library("cublas", &dirs), Some(b.path().join("libcublas.so")));
    std::fs::write(a.path().join("libcublas.so"), b"").unwrap();
    assert_eq!(find_library("cublas", &dirs), Some(a.path().join("libcublas.so")));
    assert_eq!(find_library("curand", &dirs), None);
}

#[test]
fn only_c_identifiers_get_trampolines() {
    for ok in ["cuInit", "cublasGemmEx", "cuMemAlloc_v2", "nvrtcVersion"] {
        assert!(wants_trampoline(ok), "{ok}");
    }
    for no in ["", "_init", "__nvrtcCPEx", "1x", "a.b", "_ZN3foo3barEv", "a-b"] {
        assert!(!wants_trampoline(no), "{no}");
    }
}

fn found(link_name: &'static str, functions: &[&str]) -> Found {
    Found {
        link_name,
        soname: format!("lib{link_name}.so.1"),
        functions: functions.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn a_name_exported_twice_binds_to_the_first_library() {
    let libs =
        [found("cuda", &["cuInit", "_fini"]), found("cublas", &["cublasCreate_v2", "cuInit"])];
    let symbols = assign(&libs);
    assert_eq!(symbols, [(0, "cuInit".to_string()), (1, "cublasCreate_v2".to_string())]);
    let rs = rust_tables(&libs, &symbols);
    assert!(rs.contains("pub(crate) const LIBRARIES: [Library; 2]"), "{rs}");
    assert!(rs.contains("Library { link_name: \"cuda\", soname: \"libcuda.so.1\" },"), "{rs}");
    assert!(rs.contains("pub(crate) static SYMBOLS: [(u8, &str); 2]"), "{rs}");
    assert!(rs.contains("(1, \"cublasCreate_v2\"),"), "{rs}");
}

#[test]
fn x86_64_trampolines_are_hidden_and_jump_through_their_slot() {
    let symbols = [(0, "cuInit".to_string()), (3, "cublasCreate_v2".to_string())];
    let asm = asm("x86_64", &symbols).unwrap();
    for line in [
        ".pushsection .text.inferno_cuda.cublasCreate_v2,\"ax\",%progbits",
        ".globl cublasCreate_v2",
        ".hidden cublasCreate_v2",
        "cublasCreate_v2:",
        "jmp *inferno_cuda_slot_1(%rip)",
        "inferno_cuda_stub_1:",
        "push $1",
        "inferno_cuda_slot_1:",
        ".quad inferno_cuda_stub_1",
        "call inferno_cuda_resolve",
    ] {
        assert!(asm.lines().any(|l| l.trim() == line), "{line} missing:\n{asm}");
    }
    assert_eq!(asm.matches(".pushsection").count(), asm.matches(".popsection").count());
    assert!(super::asm("riscv64", &symbols).is_none());
}

#[test]
fn interposed_functions_keep_their_binding_under_another_label() {
    let symbols = [(0, "cuMemAllocAsync".to_string()), (0, "cuMemAlloc_v2".to_string())];
    let asm = asm("x86_64", &symbols).unwrap();
    let labels: Vec<&str> = asm.lines().filter_map(|l| l.trim().strip_suffix(':')).collect();
    assert!(labels.contains(&"inferno_real_cuMemAllocAsync"), "{asm}");
    assert!(!labels.contains(&"cuMemAllocAsync"), "the interposed name must stay free:\n{asm}");
    assert!(labels.contains(&"cuMemAlloc_v2"), "{asm}");
    // dlsym still looks the library's own name up.
    let rs = rust_tables(&[], &symbols);
    assert!(rs.contains("(0, \"cuMemAllocAsync\"),"), "{rs}");
}

/// At a trampoline the stack is 8 mod 16 (the caller's return address). The stub pushes the
/// index, then the common path pushes rbp and the saved registers and reserves the xmm area:
/// the call to the resolver must leave from a 16-byte aligned stack, and every push must be
/// popped.
#[test]
fn x86_64_lazy_path_keeps_the_stack_aligned_and_balanced() {
    let pushes = X86_64_COMMON.matches("push %").count();
    let pops = X86_64_COMMON.matches("pop %").count();
    assert_eq!(pushes, pops);
    let reserved: usize = X86_64_COMMON
        .lines()
        .find_map(|l| l.trim().strip_prefix("sub $")?.strip_suffix(", %rsp")?.parse().ok())
        .unwrap();
    let depth_at_call = 8 + 8 + pushes * 8 + reserved; // return address + index + pushes + area
    assert_eq!(depth_at_call % 16, 0, "misaligned call: {depth_at_call}");
    assert!(X86_64_COMMON.contains(&format!("add ${reserved}, %rsp")));
    for i in 0..8 {
        assert!(X86_64_COMMON.contains(&format!("movdqu %xmm{i}, {}(%rsp)", i * 16)));
        assert!(X86_64_COMMON.contains(&format!("movdqu {}(%rsp), %xmm{i}", i * 16)));
    }
    for reg in ["rdi", "rsi", "rdx", "rcx", "r8", "r9", "rax"] {
        assert!(X86_64_COMMON.contains(&format!("push %{reg}\n")), "{reg} not saved");
        assert!(X86_64_COMMON.contains(&format!("pop %{reg}\n")), "{reg} not restored");
    }
}

#[test]
fn aarch64_trampolines_use_the_veneer_registers() {
    let asm = asm("aarch64", &[(0, "cuInit".to_string())]).unwrap();
    for line in [
        ".hidden cuInit",
        "adrp x16, inferno_cuda_slot_0",
        "ldr x16, [x16, :lo12:inferno_cuda_slot_0]",
        "br x16",
        "mov x17, #0",
        ".xword inferno_cuda_stub_0",
        "bl inferno_cuda_resolve",
    ] {
        assert!(asm.lines().any(|l| l.trim() == line), "{line} missing:\n{asm}");
    }
    // Saves and restores the same registers; the frame is a multiple of 16 bytes.
    let saves = AARCH64_COMMON.matches("stp ").count() + AARCH64_COMMON.matches("str ").count();
    let loads = AARCH64_COMMON.matches("ldp ").count() + AARCH64_COMMON.matches("ldr ").count();
    assert_eq!(saves, loads);
    assert!(AARCH64_COMMON.contains("[sp, #-224]!") && AARCH64_COMMON.contains("[sp], #224"));
}

#[test]
fn cudarcs_libraries_in_its_link_order() {
    // cudarc 0.19 build.rs, dynamic_linking(): driver, nvrtc, curand, cublas, cublasLt.
    assert_eq!(LINKED, ["cuda", "nvrtc", "curand", "cublas", "cublasLt"]);
}

#[test]
fn cuda_roots_are_cudarcs() {
    // cudarc 0.19 build.rs, TYPICAL_CUDA_PATH_ENV_VARS.
    assert_eq!(
        CUDA_ROOT_VARS,
        ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDNN_LIB"]
    );
}

#[test]
fn multiarch_names() {
    assert_eq!(multiarch("x86_64", "gnu"), "x86_64-linux-gnu");
    assert_eq!(multiarch("aarch64", ""), "aarch64-linux-gnu");
}
