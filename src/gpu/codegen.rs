//! Generates the lazy-binding trampolines of `lazy.rs` (read its header for why they exist) from
//! the functions the CUDA libraries export.
//!
//! Shared by `build.rs`, which writes `$OUT_DIR/cuda_symbols.rs` and `$OUT_DIR/cuda_lazy.s`, and
//! by the lib's unit tests. Everything here is a pure function of its inputs, except
//! [`find_library`], which looks at the file system.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;

/// The libraries cudarc 0.19 links for the features candle 0.11 turns on (driver, nvrtc, curand,
/// cublas, cublaslt), in the order its build script names them: a name two of them export binds
/// to the first, as it would in the linker.
pub const LINKED: [&str; 5] = ["cuda", "nvrtc", "curand", "cublas", "cublasLt"];

/// The environment variables cudarc's build script takes CUDA roots from.
pub const CUDA_ROOT_VARS: [&str; 5] =
    ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDNN_LIB"];

/// What decides where the linker finds `-lcuda`, `-lcublas`, …
#[derive(Debug, Default)]
pub struct LinkEnv {
    /// The values of [`CUDA_ROOT_VARS`] that are set, in that order.
    pub cuda_roots: Vec<PathBuf>,
    /// `CARGO_ENCODED_RUSTFLAGS` (flags separated by 0x1f).
    pub encoded_rustflags: String,
    /// `LIBRARY_PATH`.
    pub library_path: String,
    /// The Debian multiarch triple of the target, e.g. `x86_64-linux-gnu`.
    pub multiarch: String,
}

/// The folders the link searches for a `-l` library, in the order it searches them: cudarc's
/// `rustc-link-search` folders (derived from the CUDA roots exactly as cudarc 0.19's build.rs
/// does), then `-L` from RUSTFLAGS (cargo puts them after the build scripts'), then
/// `LIBRARY_PATH` (the compiler driver adds it after the command line's), then the system's.
/// A mismatch with the real linker is caught by `tests/no_cuda.rs`, which checks that the binary
/// needs no CUDA library.
pub fn search_dirs(env: &LinkEnv) -> Vec<PathBuf> {
    let typical = ["/usr", "/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda"];
    let roots: Vec<PathBuf> = if env.cuda_roots.is_empty() {
        typical.iter().map(PathBuf::from).collect()
    } else {
        env.cuda_roots.clone()
    };
    let subdirs = [
        "lib",
        "lib/stubs",
        "lib/x86_64",
        "lib/x86_64-linux-gnu",
        "lib64",
        "lib64/stubs",
        "targets/x86_64-linux",
        "targets/x86_64-linux/lib",
        "targets/x86_64-linux/lib/stubs",
    ];
    let mut dirs: Vec<PathBuf> =
        roots.iter().flat_map(|r| subdirs.iter().map(move |s| r.join(s))).collect();
    dirs.extend(rustflags_link_dirs(&env.encoded_rustflags));
    dirs.extend(env.library_path.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
    let m = &env.multiarch;
    for system in [
        format!("/usr/local/lib/{m}"),
        format!("/lib/{m}"),
        format!("/usr/lib/{m}"),
        "/usr/local/lib64".into(),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/usr/local/lib".into(),
        "/lib".into(),
        "/usr/lib".into(),
    ] {
        dirs.push(PathBuf::from(system));
    }
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The folders of `-L [KIND=]DIR` and `-LDIR` flags that the linker searches (not
/// `dependency=` or `crate=`, which only rustc uses).
fn rustflags_link_dirs(encoded: &str) -> Vec<PathBuf> {
    let flags: Vec<&str> = encoded.split('\x1f').collect();
    let mut dirs = Vec::new();
    let mut i = 0;
    while i < flags.len() {
        let value = match flags[i] {
            "-L" => {
                i += 1;
                flags.get(i).copied()
            }
            f => f.strip_prefix("-L"),
        };
        i += 1;
        let Some(value) = value else { continue };
        let dir = match value.split_once('=') {
            Some(("native" | "all" | "framework", dir)) => dir,
            Some(("dependency" | "crate", _)) => continue,
            _ => value,
        };
        if !dir.is_empty() {
            dirs.push(PathBuf::from(dir));
        }
    }
    dirs
}

/// The file `-l{link_name}` resolves to: the first `lib{link_name}.so` in `dirs`.
pub fn find_library(link_name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let file = format!("lib{link_name}.so");
    dirs.iter().map(|d| d.join(&file)).find(|p| p.is_file())
}

/// Names that get a trampoline: plain C identifiers. Names starting with `_` are left out: they
/// are toolchain internals (`_init`, `_fini`, `__nvrtcCPEx`) that no binding calls and that could
/// clash with the C runtime's own.
pub fn wants_trampoline(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Functions inferno defines itself, in front of the library's (`arena.rs`: decode graphs take
/// their allocations from an arena). Their trampolines are labelled [`label`]`(name)` instead,
/// and the definition calls the library through that label.
pub const INTERPOSED: [&str; 2] = ["cuMemAllocAsync", "cuMemFreeAsync"];

/// The assembly label of `name`'s trampoline: the name itself, or `inferno_real_{name}` for an
/// interposed one.
pub fn label(name: &str) -> String {
    if INTERPOSED.contains(&name) { format!("inferno_real_{name}") } else { name.to_string() }
}

/// One library as the build found it.
#[derive(Debug, Clone)]
pub struct Found {
    /// As in `-l`: `cuda`, `cublas`, …
    pub link_name: &'static str,
    /// Its `DT_SONAME` (`libcuda.so.1`), else `lib{link_name}.so`.
    pub soname: String,
    /// The exported functions.
    pub functions: Vec<String>,
}

/// Every trampoline as (index into `libs`, name): each name once, bound to the first library in
/// `libs` that exports it.
pub fn assign(libs: &[Found]) -> Vec<(usize, String)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (lib, found) in libs.iter().enumerate() {
        for name in found.functions.iter().filter(|n| wants_trampoline(n)) {
            if seen.insert(name.as_str()) {
                out.push((lib, name.clone()));
            }
        }
    }
    out
}

/// `cuda_symbols.rs`: the libraries and, by trampoline index, each function's library and name.
/// Included by `lazy.rs` and `libs.rs`, which define `Library`.
pub fn rust_tables(libs: &[Found], symbols: &[(usize, String)]) -> String {
    let mut out = String::from("// Generated by build.rs (src/gpu/codegen.rs). Do not edit.\n");
    let _ = writeln!(out, "pub(crate) const LIBRARIES: [Library; {}] = [", libs.len());
    for lib in libs {
        let _ = writeln!(
            out,
            "    Library {{ link_name: {:?}, soname: {:?} }},",
            lib.link_name, lib.soname
        );
    }
    out.push_str("];\n");
    let _ = writeln!(out, "pub(crate) static SYMBOLS: [(u8, &str); {}] = [", symbols.len());
    for (lib, name) in symbols {
        let _ = writeln!(out, "    ({lib}, {name:?}),");
    }
    out.push_str("];\n");
    out
}

/// The trampolines for `target_arch`, or `None` where there is no generator for it.
pub fn asm(target_arch: &str, symbols: &[(usize, String)]) -> Option<String> {
    let (common, per_symbol): (&str, fn(usize, &str) -> String) = match target_arch {
        "x86_64" => (X86_64_COMMON, x86_64_symbol),
        "aarch64" => (AARCH64_COMMON, aarch64_symbol),
        _ => return None,
    };
    let mut out = String::from(common);
    for (index, (_, name)) in symbols.iter().enumerate() {
        out.push_str(&per_symbol(index, &label(name)));
    }
    Some(out)
}

/// Section and symbol directives around one trampoline. Each symbol has sections of its own, so
/// that `--gc-sections` drops the trampolines nothing calls (most of cuBLAS's ~750).
fn open_symbol(name: &str, align: u32) -> String {
    format!(
        ".pushsection .text.inferno_cuda.{name},\"ax\",%progbits\n\
         .globl {name}\n.hidden {name}\n.type {name},%function\n.p2align {align}\n{name}:\n"
    )
}

fn slot(index: usize, name: &str, word: &str) -> String {
    format!(
        ".size {name}, .-{name}\n.popsection\n\
         .pushsection .data.inferno_cuda.{name},\"aw\",%progbits\n.p2align 3\n\
         inferno_cuda_slot_{index}:\n    {word} inferno_cuda_stub_{index}\n.popsection\n"
    )
}

/// `name` jumps through its slot. The slot starts at the stub, which passes the slot's address
/// (r11) and the index (pushed) to the common lazy path.
fn x86_64_symbol(index: usize, name: &str) -> String {
    let mut s = open_symbol(name, 4);
    let _ = write!(
        s,
        "    jmp *inferno_cuda_slot_{index}(%rip)\n\
         inferno_cuda_stub_{index}:\n\
         \x20   lea inferno_cuda_slot_{index}(%rip), %r11\n\
         \x20   push ${index}\n\
         \x20   jmp inferno_cuda_lazy\n"
    );
    s + &slot(index, name, ".quad")
}

/// Entered from a stub with the caller's arguments still in their registers, the index on the
/// stack and the slot's address in r11. Saves every argument register (rdi rsi rdx rcx r8 r9, rax
/// for variadic calls, xmm0-7), calls `inferno_cuda_resolve(index, slot)` on a 16-byte aligned
/// stack, restores them and jumps to the function it returned, so the function sees the original
/// call: same arguments, same stack, same return address.
const X86_64_COMMON: &str = "\
.pushsection .text.inferno_cuda_lazy,\"ax\",%progbits
.p2align 4
inferno_cuda_lazy:
    push %rbp
    mov %rsp, %rbp
    push %rdi
    push %rsi
    push %rdx
    push %rcx
    push %r8
    push %r9
    push %rax
    sub $128, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    mov 8(%rbp), %rdi
    mov %r11, %rsi
    call inferno_cuda_resolve
    mov %rax, %r11
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    add $128, %rsp
    pop %rax
    pop %r9
    pop %r8
    pop %rcx
    pop %rdx
    pop %rsi
    pop %rdi
    pop %rbp
    add $8, %rsp
    jmp *%r11
.popsection
";

/// As on x86-64, with x16 (slot) and x17 (index), the registers the AAPCS64 leaves to linker
/// veneers. `bti c` is a no-op where branch protection is off.
fn aarch64_symbol(index: usize, name: &str) -> String {
    let mut s = open_symbol(name, 2);
    let _ = write!(
        s,
        "    adrp x16, inferno_cuda_slot_{index}\n\
         \x20   ldr x16, [x16, :lo12:inferno_cuda_slot_{index}]\n\
         \x20   br x16\n\
         inferno_cuda_stub_{index}:\n\
         \x20   hint #34\n\
         \x20   adrp x16, inferno_cuda_slot_{index}\n\
         \x20   add x16, x16, :lo12:inferno_cuda_slot_{index}\n\
         \x20   mov x17, #{index}\n\
         \x20   b inferno_cuda_lazy\n"
    );
    s + &slot(index, name, ".xword")
}

/// Saves x0-x8 (x8: the address of a returned struct) and q0-q7 with the frame record, calls
/// `inferno_cuda_resolve(x17, x16)`, restores them and branches to the function with the
/// caller's link register in x30.
const AARCH64_COMMON: &str = "\
.pushsection .text.inferno_cuda_lazy,\"ax\",%progbits
.p2align 2
inferno_cuda_lazy:
    stp x29, x30, [sp, #-224]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    stp x2, x3, [sp, #32]
    stp x4, x5, [sp, #48]
    stp x6, x7, [sp, #64]
    str x8, [sp, #80]
    stp q0, q1, [sp, #96]
    stp q2, q3, [sp, #128]
    stp q4, q5, [sp, #160]
    stp q6, q7, [sp, #192]
    mov x0, x17
    mov x1, x16
    bl inferno_cuda_resolve
    mov x16, x0
    ldp q6, q7, [sp, #192]
    ldp q4, q5, [sp, #160]
    ldp q2, q3, [sp, #128]
    ldp q0, q1, [sp, #96]
    ldr x8, [sp, #80]
    ldp x6, x7, [sp, #64]
    ldp x4, x5, [sp, #48]
    ldp x2, x3, [sp, #32]
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #224
    br x16
.popsection
";

/// The Debian multiarch folder name for a target (`x86_64-linux-gnu`).
pub fn multiarch(target_arch: &str, target_env: &str) -> String {
    format!("{target_arch}-linux-{}", if target_env.is_empty() { "gnu" } else { target_env })
}

#[cfg(test)]
#[path = "codegen_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "codegen_harness_tests.rs"]
mod harness_tests;
