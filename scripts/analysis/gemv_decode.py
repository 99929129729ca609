"""Checks and times the batch-1 bf16 GEMVs of a decode step on a GPU machine, as a chain of
launches with Programmatic Dependent Launch in one CUDA graph (as inferno's decode graphs run
them), at gpt-oss-20b and Llama-3.2-1B sizes.

    python3 scripts/analysis/gemv_decode.py [--reps 20] [--quick]

Builds src/kernels/gemv_bf16/gemv_bf16.cu and this folder's gemv_variants.cu (other batch sizes per warp,
a persistent grid, a flat read-only probe; also with up to 16 warps along K) with the machine's
nvcc; draws random bf16 weights for every layer (so a step's weights are not in L2); checks the
variants against gemv_bf16.cu bit for bit and gemv_bf16.cu against a float64 product; then times,
per model, each projection's chain over all layers (24 x q/k/v and o for gpt-oss, 16 x q/k/v, o,
gate/up and down for Llama, and the LM head once) for each launch configuration, and prints
microseconds per launch and the bandwidth that means. Needs cupy and numpy (the GPU machine's
image has both).
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import cupy as cp
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KDIR = os.path.join(ROOT, "src", "kernels", "gemv_bf16")
INCLUDE = os.path.join(ROOT, "src", "kernels", "include")
HERE = os.path.dirname(os.path.abspath(__file__))
SMS = 132

MODELS = {
    "gpt-oss-20b": dict(layers=24, proj=[("qkv", 5120, 2880), ("o", 2880, 4096)], head=(201088, 2880)),
    "llama-3.2-1b": dict(layers=16, proj=[("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048),
                                          ("down", 2048, 8192)], head=(128256, 2048)),
}


def build(max_wk):
    """gemv_variants.cu (which includes gemv_bf16.cu) with GEMV_MAX_WK = max_wk."""
    tmp = tempfile.mkdtemp()
    src = open(os.path.join(KDIR, "gemv_bf16.cu")).read()
    if "#define GEMV_MAX_WK 8" not in src:
        sys.exit("gemv_bf16.cu has no '#define GEMV_MAX_WK 8'")
    src = src.replace("#define GEMV_MAX_WK 8", f"#define GEMV_MAX_WK {max_wk}")
    if max_wk > 8:
        # Only the one-row kernel: the others' reduction buffers would outgrow static shared memory.
        src = "\n".join(l for l in src.splitlines() if not l.startswith("GEMV_VARIANT(") or l == "GEMV_VARIANT(1, 1, 4)")
    open(os.path.join(tmp, "gemv_bf16.cu"), "w").write(src)
    shutil.copy(os.path.join(HERE, "gemv_variants.cu"), tmp)
    cubin = os.path.join(tmp, "v.cubin")
    out = subprocess.run(["nvcc", "--cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v", "-I", KDIR, "-I", INCLUDE, "-o",
                          cubin, os.path.join(tmp, "gemv_variants.cu")], capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    regs, name = {}, None
    for line in out.stderr.splitlines():
        if "Compiling entry function" in line:
            name = line.split("'")[1]
        elif "Used" in line and name:
            regs[name] = line.split("Used ")[1].split(",")[0]
    return cp.RawModule(path=cubin), regs


# cuLaunchKernelEx with the programmatic-stream-serialization attribute (what src/kernels/launch.rs
# does), so that captured launches get programmatic edges.
class LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("nattrs", ctypes.c_uint)]


LIBCUDA = ctypes.CDLL("libcuda.so.1")
PDL_ATTR = LaunchAttr(id=6, value=(1).to_bytes(4, "little") + bytes(60))


def launch(fn, grid, block, args, stream, pdl=True):
    vals = []
    for a in args:
        if isinstance(a, cp.ndarray):
            vals.append(ctypes.c_void_p(a.data.ptr))
        elif isinstance(a, np.int64):
            vals.append(ctypes.c_longlong(int(a)))
        else:
            vals.append(ctypes.c_int(int(a)))
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    cfg = LaunchConfig(grid[0], 1, 1, block[0], block[1], 1, 0, stream.ptr,
                       ctypes.pointer(PDL_ATTR) if pdl else None, 1 if pdl else 0)
    err = LIBCUDA.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(getattr(fn, "kernel", fn).ptr), params, None)
    if err:
        sys.exit(f"cuLaunchKernelEx: error {err}")


def warps_along_k(n, k, target, max_wk):
    """src/kernels/gemv_bf16/mod.rs's choice, with its target and cap as parameters."""
    tiles = -(-n // 16)
    return min(max(1, min(max_wk, -(-target // tiles))), max(k // 64, 1))


def bf16_weights(n, k):
    w = cp.empty((n, k), cp.uint16)
    rows = max(1, (64 << 20) // (4 * k))
    for r in range(0, n, rows):
        f = cp.random.standard_normal((min(rows, n - r), k), dtype=cp.float32) * 0.05
        w[r:r + rows] = (f.view(cp.uint32) >> 16).astype(cp.uint16)
    return w


def bf16_val(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def time_chain(stream, run, reps):
    with stream:
        stream.begin_capture()
        run()
        g = stream.end_capture()
        for _ in range(3):
            g.launch(stream)
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            g.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="fewer configurations")
    args = ap.parse_args()
    mods = {8: build(8), 16: build(16)}
    for wk, (_, regs) in mods.items():
        print(f"registers (GEMV_MAX_WK {wk}):", " ".join(f"{k}={v}" for k, v in sorted(regs.items()) if "m1_n1" in k
                                                          or "_u" in k))
    cp.random.seed(7)
    stream = cp.cuda.Stream(non_blocking=True)
    sink = cp.zeros(1 << 16, cp.uint32)

    # Correctness: gemv_bf16 against float64, the variants against gemv_bf16 bit for bit.
    mod8 = mods[8][0]
    for (n, k) in [(5120, 2880), (2880, 4096), (1000, 2056), (37, 72)]:
        w = bf16_weights(n, k)
        x = bf16_weights(1, k)
        ref = bf16_val(cp.asnumpy(w)).astype(np.float64) @ bf16_val(cp.asnumpy(x))[0].astype(np.float64)
        outs = {}
        for name, grid_of in [("gemv_bf16_m1_n1", None), ("gemv_u4", None), ("gemv_p_u4", SMS * 2), ("gemv_p_u2", 7)]:
            wk = warps_along_k(n, k, 2048, 8)
            tiles = -(-n // 16)
            y = cp.full(n, cp.nan, cp.float32)
            launch(mod8.get_function(name), (grid_of and min(grid_of, tiles) or tiles,), (32, wk),
                   (x, w, y, 1, n, k), stream)
            stream.synchronize()
            outs[name] = cp.asnumpy(y)
        base = outs["gemv_bf16_m1_n1"]
        err = np.abs(base - ref).max() / np.abs(ref).max()
        same = {k2: bool(np.array_equal(v, base)) for k2, v in outs.items() if k2 != "gemv_bf16_m1_n1"}
        print(f"check n={n} k={k}: gemv_bf16 max rel err {err:.2e}; bit-equal: {same}")
        if err > 1e-5 or not all(same.values()):
            sys.exit("check failed")

    for model, spec in MODELS.items():
        layers = spec["layers"]
        projs = spec["proj"] + [("head", *spec["head"])]
        weights = {name: [bf16_weights(n, k) for _ in range(1 if name == "head" else layers)] for name, n, k in projs}
        xs = {name: bf16_weights(1, k) for name, n, k in projs}
        ys = {name: cp.empty(n, cp.float32) for name, n, k in projs}
        total = {}
        for name, n, k in projs:
            nbytes = n * k * 2
            tiles = -(-n // 16)
            results = []

            def chain(fn, grid, block, name=name, n=n, k=k):
                def run():
                    for w in weights[name]:
                        launch(fn, grid, block, (xs[name], w, ys[name], 1, n, k), stream)
                return run

            def flat_chain(name=name, n=n, k=k):
                fn = mod8.get_function("gemv_flat_read")

                def run():
                    for w in weights[name]:
                        launch(fn, (SMS * 8,), (256, 1), (w, np.int64(n * k // 8), sink), stream)
                return run

            count = len(weights[name])
            us = time_chain(stream, flat_chain(), args.reps) / count
            results.append((us, "flat read probe"))
            targets = [2048] if args.quick else [1024, 2048, 3072, 4096]
            for max_wk in (8, 16):
                mod = mods[max_wk][0]
                for target in targets:
                    wk = warps_along_k(n, k, target, max_wk)
                    for fname in (["gemv_u4"] if args.quick else ["gemv_u2", "gemv_u4", "gemv_u8"]):
                        us = time_chain(stream, chain(mod.get_function(fname), (tiles,), (32, wk)), args.reps) / count
                        results.append((us, f"{fname} wk={wk} (target {target}, max {max_wk}) blocks={tiles}"))
                    for fname in ["gemv_p_u2", "gemv_p_u4"]:
                        for per_sm in (1, 2, 3, 4):
                            grid = min(tiles, SMS * per_sm)
                            us = time_chain(stream, chain(mod.get_function(fname), (grid,), (32, wk)),
                                            args.reps) / count
                            results.append((us, f"{fname} wk={wk} (target {target}, max {max_wk}) grid={grid}"))
            inferno_wk = warps_along_k(n, k, 2048, 8)
            us_now = time_chain(stream, chain(mod8.get_function("gemv_bf16_m1_n1"), (tiles,), (32, inferno_wk)),
                                args.reps) / count
            results.sort()
            print(f"\n{model} {name} [{n} x {k}] x {count}: {nbytes / 1e6:.1f} MB per launch")
            print(f"  inferno now (gemv_bf16_m1_n1 wk={inferno_wk}): {us_now:7.2f} us  {nbytes / us_now / 1e3:6.0f} GB/s")
            for us, what in results[:8]:
                print(f"  {us:7.2f} us  {nbytes / us / 1e3:6.0f} GB/s  {what}")
            best = next(r for r in results if "probe" not in r[1])
            total[name] = (us_now * count, best[0] * count, best[1])
        now = sum(v[0] for v in total.values())
        best = sum(v[1] for v in total.values())
        print(f"\n{model}: GEMVs per step now {now:.0f} us, best configuration per projection {best:.0f} us")
        for name, (a, b, what) in total.items():
            print(f"  {name:<8} {a:7.0f} -> {b:7.0f} us  ({what})")
        del weights


if __name__ == "__main__":
    main()
