"""Times the batch-1 bf16 GEMV with warp chains of R contiguous quad steps (gemv_variants.cu's
gemv_r<R>_u<U>) against R = 1 (gemv_bf16.cu's order) and a flat read of the same bytes, at the
decode shapes of one GPU and of one rank under --tp: chains of PDL launches over every layer in
one CUDA graph, cold weights, as gemv_decode.py times them.

    python3 scripts/analysis/gemv_runs.py [--reps 20]
"""

import argparse
import sys

import cupy as cp
import numpy as np

import gemv_decode as gd

SHAPES = [
    # (what, layers, n, k)
    ("gpt-oss qkv", 36, 5120, 2880),
    ("gpt-oss o", 36, 2880, 4096),
    ("gpt-oss qkv /2", 36, 2560, 2880),
    ("gpt-oss o /2", 36, 2880, 2048),
    ("gpt-oss qkv /4", 36, 1280, 2880),
    ("gpt-oss o /4", 36, 2880, 1024),
    ("gpt-oss head", 1, 201088, 2880),
    ("gpt-oss head again", 1, 201088, 2880),
    ("gpt-oss head /2", 1, 100544, 2880),
    ("llama-1b qkv", 16, 3072, 2048),
    ("llama-1b o", 16, 2048, 2048),
    ("llama-1b gate_up", 16, 16384, 2048),
    ("llama-1b down", 16, 2048, 8192),
    ("llama-1b head", 1, 128256, 2048),
    ("70b/4 qkv", 40, 2560, 8192),
    ("70b/4 o", 40, 8192, 2048),
    ("70b/4 gate_up", 40, 14336, 8192),
    ("70b/4 down", 40, 8192, 7168),
]
# (kernel, run length as log2 for gemv_rr_u*, None for the template ones)
VARIANTS = [(f"gemv_r{r}_u{u}", None) for r in (1, 2, 4, 8) for u in (4, 8)] + [
    (f"gemv_rr_u{u}", lr) for u in (2, 4, 8) for lr in (0, 1, 2, 3)]


def args_of(lr, *a):
    return a if lr is None else (*a, lr)


def label(name, lr):
    return name[5:] if lr is None else f"{name[5:]}.r{1 << lr}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    mod, regs = gd.build(8)
    print("registers:", " ".join(f"{k}={v}" for k, v in sorted(regs.items()) if k.startswith("gemv_r")))
    cp.random.seed(11)
    stream = cp.cuda.Stream(non_blocking=True)
    sink = cp.zeros(1 << 16, cp.uint32)

    for (n, k) in [(5120, 2880), (2880, 4096), (1000, 2056), (37, 72), (2560, 8192)]:
        w, x = gd.bf16_weights(n, k), gd.bf16_weights(1, k)
        ref = gd.bf16_val(cp.asnumpy(w)).astype(np.float64) @ gd.bf16_val(cp.asnumpy(x))[0].astype(np.float64)
        wk = gd.warps_along_k(n, k, 2048, 8)
        outs = {}
        for name, lr in [("gemv_bf16_m1_n1", None)] + VARIANTS:
            y = cp.full(n, cp.nan, cp.float32)
            gd.launch(mod.get_function(name), (-(-n // 16),), (32, wk), args_of(lr, x, w, y, 1, n, k), stream)
            stream.synchronize()
            outs[label(name, lr)] = cp.asnumpy(y)
        base = outs["bf16_m1_n1"]
        errs = {name: float(np.abs(v - ref).max() / np.abs(ref).max()) for name, v in outs.items()}
        r1_same = all(np.array_equal(v, base) for name, v in outs.items() if name.startswith("r1_") or name.endswith(".r1"))
        runtime_same = all(np.array_equal(outs[f"rr_u{u}.r{r}"], outs[f"r{r}_u{uu}"])
                           for u in (2, 4, 8) for r in (1, 2, 4, 8) for uu in (4, 8))
        print(f"check n={n} k={k} wk={wk}: R = 1 bit-equal to gemv_bf16: {r1_same}; "
              f"run time R bit-equal to template R: {runtime_same}; max rel err {max(errs.values()):.2e}")
        if not r1_same or not runtime_same or max(errs.values()) > 1e-5:
            sys.exit("check failed")

    for what, layers, n, k in SHAPES:
        weights = [gd.bf16_weights(n, k) for _ in range(layers)]
        x = gd.bf16_weights(1, k)
        y = cp.empty(n, cp.float32)
        wk0 = gd.warps_along_k(n, k, 2048, 8)
        tiles = -(-n // 16)
        nbytes = n * k * 2

        def chain(fn, wk, lr=None):
            def run():
                for w in weights:
                    gd.launch(fn, (tiles,), (32, wk), args_of(lr, x, w, y, 1, n, k), stream)
            return run

        def flat():
            fn = mod.get_function("gemv_flat_read")

            def run():
                for w in weights:
                    gd.launch(fn, (gd.SMS * 8,), (256, 1), (w, np.int64(n * k // 8), sink), stream)
            return run

        # (label, run): inferno's kernels at each U, then the run-length variants, at inferno's
        # warps along K and (for long rows) at others.
        cases = [("flat", flat())]
        cases += [(f"now_u{u}", chain(mod.get_function(f"gemv_bf16_m1_n1{'' if u == 4 else f'_u{u}'}"), wk0))
                  for u in (2, 4, 8)]
        wks = [wk0] + ([w for w in (2, 3, 4, 6, 8) if w != wk0] if k >= 4096 and wk0 > 1 else [])
        for wk in wks:
            cases += [(f"wk{wk}.u{u}.r{1 << lr}", chain(mod.get_function(f"gemv_rr_u{u}"), wk, lr))
                      for u in (2, 4, 8) for lr in (0, 1, 2)]
        # Fresh weights read slowly for the first tens of milliseconds: warm up, then rounds.
        for _ in range(3):
            gd.time_chain(stream, cases[1][1], args.reps)
        times = {name: [] for name, _ in cases}
        for _ in range(3):
            for name, run in cases:
                times[name].append(gd.time_chain(stream, run, args.reps) / layers)
        med = {name: float(np.median(v)) for name, v in times.items()}
        spread = max((max(v) - min(v)) / min(v) for v in times.values())
        print(f"{what:<17} {n:>6}x{k:<5} wk={wk0} tiles={tiles:>5} ({nbytes / 1e6:.1f} MB; rounds spread "
              f"{100 * spread:.0f}%):", flush=True)
        best = sorted((v, name) for name, v in med.items() if name != "flat")
        print("   " + " ".join(f"{name} {med[name]:.2f}" for name, _ in cases[:4]))
        print("   best: " + " ".join(f"{name} {v:.2f} ({nbytes / v / 1e3:.0f} GB/s)" for v, name in best[:6]))
        print("   at wk0 R=1: " + " ".join(f"{name} {med[name]:.2f}" for name, _ in cases if name.startswith(f"wk{wk0}.") and name.endswith(".r1")), flush=True)
        del weights

if __name__ == "__main__":
    main()
