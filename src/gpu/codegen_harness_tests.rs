//! Runs the generated trampolines in a C program whose resolver clobbers every argument
//! register: ten integer arguments (two on the stack), nine doubles and an int, and a struct
//! returned through memory must all reach the real function, and each is resolved once. Natively
//! with `cc`; the aarch64 variant too where a cross compiler and qemu are installed
//! (`aarch64-linux-gnu-gcc`, `qemu-aarch64`).

use std::path::Path;
use std::process::Command;

const HARNESS: &str = r#"
#include <stdio.h>
#include <stddef.h>
struct big { long a, b, c, d; };
long real_ints(long a, long b, long c, long d, long e, long f, long g, long h, long i, long j) {
    return a + 2*b + 3*c + 4*d + 5*e + 6*f + 7*g + 8*h + 9*i + 10*j;
}
double real_floats(double a, double b, double c, double d, double e, double f, double g,
                   double h, double i, int k) {
    return a + 2*b + 3*c + 4*d + 5*e + 6*f + 7*g + 8*h + 9*i + 10*k;
}
struct big real_big(long x, double y) { struct big r = {x, (long)(y * 2), x * 3, x * 4}; return r; }
__attribute__((noinline)) double clobber(double a, double b, double c, double d, double e,
    double f, double g, double h, long i, long j, long k, long l, long m, long n, long o, long p) {
    return a + b + c + d + e + f + g + h + i + j + k + l + m + n + o + p;
}
volatile double sink;
int resolves;
void *inferno_cuda_resolve(size_t index, void **slot) {
    sink = clobber(-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12, -13, -14, -15, -16);
    void *table[] = {(void *)real_ints, (void *)real_floats, (void *)real_big};
    resolves++;
    *slot = table[index];
    return table[index];
}
long t_ints(long, long, long, long, long, long, long, long, long, long);
double t_floats(double, double, double, double, double, double, double, double, double, int);
struct big t_big(long, double);
int main(void) {
    int bad = 0;
    for (int round = 0; round < 2; round++) {
        bad |= t_ints(1, 2, 3, 4, 5, 6, 7, 8, 9, 10) != real_ints(1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
        bad |= t_floats(.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 3)
            != real_floats(.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 3);
        struct big c = t_big(7, 2.25), e = real_big(7, 2.25);
        bad |= c.a != e.a || c.b != e.b || c.c != e.c || c.d != e.d;
    }
    printf("bad %d resolves %d\n", bad, resolves);
    return bad || resolves != 3;
}
"#;

/// Builds the harness with the trampolines for `arch` using `cc` and runs it with `run` (empty
/// for a native run). Returns false when a tool is missing.
fn run_harness(arch: &str, cc: &str, run: &[&str]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let symbols: Vec<(usize, String)> =
        ["t_ints", "t_floats", "t_big"].iter().map(|s| (0, s.to_string())).collect();
    std::fs::write(dir.path().join("t.s"), super::asm(arch, &symbols).unwrap()).unwrap();
    std::fs::write(dir.path().join("h.c"), HARNESS).unwrap();
    let exe = dir.path().join("h");
    let built = Command::new(cc)
        .current_dir(dir.path())
        .args(["-O2", "-static", "-Wl,-z,noexecstack", "h.c", "t.s", "-o"])
        .arg(&exe)
        .output();
    let Ok(built) = built else { return false };
    assert!(built.status.success(), "{cc}: {}", String::from_utf8_lossy(&built.stderr));
    let out = match run.split_first() {
        Some((tool, args)) => Command::new(tool).args(args).arg(&exe).output(),
        None => Command::new(&exe).output(),
    };
    let Ok(out) = out else { return false };
    assert!(out.status.success(), "{arch}: {}", String::from_utf8_lossy(&out.stdout));
    true
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| Path::new(&d).join(tool).is_file()))
}

#[test]
fn trampolines_pass_every_argument_through_a_clobbering_resolver() {
    let native = std::env::consts::ARCH;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    assert!(run_harness(native, &cc, &[]), "no C compiler ({cc}) for the {native} harness");
    if native != "aarch64" {
        if have("aarch64-linux-gnu-gcc") && have("qemu-aarch64") {
            assert!(run_harness("aarch64", "aarch64-linux-gnu-gcc", &["qemu-aarch64"]));
        } else {
            eprintln!("aarch64 harness skipped: no aarch64-linux-gnu-gcc and qemu-aarch64");
        }
    }
}
