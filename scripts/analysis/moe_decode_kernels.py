"""Checks and times the single-token MXFP4 MoE kernels on a GPU machine, at gpt-oss-20b sizes.

    python3 scripts/analysis/moe_decode_kernels.py [--layers 24] [--reps 20]

Builds src/kernels/mxfp4_moe/mxfp4_moe.cu (the f32-table GEMVs), src/kernels/mxfp4_moe/moe_slot_mma.cu (the
tensor-core split-K GEMVs, also taken apart: its loads alone, its arithmetic alone, capped at 42
registers) and this folder's experiments, moe_slot_dp4a.cu (the same on integer dot products),
moe_slot_persistent.cu (the same with a persistent grid; its parts must equal moe_slot_mma.cu's
bit for bit) and moe_read_probe.cu (read-only kernels, with --probes) with the machine's nvcc, draws random packed experts (32 experts,
hidden = intermediate = 2880, top-4) for several layers so that a step's weights are not in L2,
checks every variant's output against a float64 reference (numpy, one layer), then times each
variant as a CUDA graph of gate_up, down and the ordered sum over `--layers` layers, as a decode
step runs them. Prints one line per variant: microseconds per layer and the bandwidth that
means, against the 52.6 MB a layer's 4 experts hold. Needs cupy and numpy (the GPU machine's
image has both). It times moe_slot_mma.cu's one-tile kernels (moe_sm_*_w8); the engine launches
the two-tile ones (SM_GATE_UP_TWO_TILES, SM_DOWN_TWO_TILES: the same bits, in fewer waves; measured
through `inferno bench`, docs/performance.md).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import cupy as cp
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KDIR = os.path.join(ROOT, "src", "kernels", "mxfp4_moe")
INCLUDE = os.path.join(ROOT, "src", "kernels", "include")
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)
LIMIT, ALPHA = 7.0, 1.702


def build(name, tmp, subs=(), folder=KDIR):
    """Compiles FOLDER/NAME.cu, after replacing each (old, new) of `subs` in its text."""
    tag = f"{name}{len(os.listdir(tmp))}"
    src = open(os.path.join(folder, name + ".cu")).read()
    for old, new in subs:
        if old not in src:
            sys.exit(f"{name}.cu has no {old!r}")
        src = src.replace(old, new)
    path = os.path.join(tmp, tag + ".cu")
    open(path, "w").write(src)
    cubin = os.path.join(tmp, tag + ".cubin")
    out = subprocess.run(
        ["nvcc", "--cubin", "-arch=sm_90", "-O3", "-std=c++17", "--expt-relaxed-constexpr",
         "-Xptxas", "-v", "-I", KDIR, "-I", INCLUDE, "-o", cubin, path],
        capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    regs = [l.split("Used ")[1].split(",")[0] for l in out.stderr.splitlines() if "Used" in l]
    return cp.RawModule(path=cubin), regs


def bf16_bits(a):
    """float32 -> bf16 bit patterns (round to nearest even), as uint16."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_val(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def dequant(blocks, scales):
    """[rows, kb, 16] u8 + [rows, kb] u8 -> [rows, 32 kb] float64."""
    lo, hi = FP4[blocks & 15], FP4[blocks >> 4]
    v = np.stack([lo, hi], -1).reshape(blocks.shape[0], blocks.shape[1], 32)
    return (v * np.exp2(scales.astype(np.float64) - 127)[..., None]).reshape(blocks.shape[0], -1)


def swiglu(g, u):
    g = np.minimum(g, LIMIT)
    u = np.clip(u, -LIMIT, LIMIT)
    return g / (1 + np.exp(-ALPHA * g)) * (u + 1)


class Layer:
    def __init__(self, rng, E, H, I, wild=False):
        kh, ki = H // 32, I // 32
        self.gu_b = cp.random.randint(0, 256, (E, 2 * I, kh, 16), dtype=cp.uint8)
        self.d_b = cp.random.randint(0, 256, (E, H, ki, 16), dtype=cp.uint8)
        self.gu_s = self.scales(rng, (E, 2 * I, kh), wild)
        self.d_s = self.scales(rng, (E, H, ki), wild)
        self.gu_bias = cp.asarray(rng.standard_normal((E, 2 * I)).astype(np.float32) * 0.1)
        self.d_bias = cp.asarray(rng.standard_normal((E, H)).astype(np.float32) * 0.1)


    @staticmethod
    def scales(rng, shape, wild):
        """E8M0 scales near 2^-8; with `wild`, an eighth of them extreme (2^-127, 2^-126, 2^2,
        2^3: bytes 0, 1, 129, 130, which take the kernels' slow decode)."""
        s = rng.integers(116, 124, shape).astype(np.uint8)
        if wild:
            pick = rng.random(shape) < 0.125
            s[pick] = rng.choice(np.array([0, 1, 129, 130], np.uint8), pick.sum())
        return cp.asarray(s)


def reference(layer, x_bits, ids, wts, H, I):
    x = bf16_val(x_bits).astype(np.float64)
    out = np.zeros(H)
    for e, w in zip(ids, wts):
        gu = dequant(cp.asnumpy(layer.gu_b[e]), cp.asnumpy(layer.gu_s[e])) @ x + cp.asnumpy(layer.gu_bias[e])
        act = swiglu(gu[0::2], gu[1::2])
        d = dequant(cp.asnumpy(layer.d_b[e]), cp.asnumpy(layer.d_s[e])) @ act + cp.asnumpy(layer.d_bias[e])
        out += w * d
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--distinct", type=int, default=8, help="layers of distinct weights")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--probes", action="store_true", help="also time moe_read_probe.cu's read-only kernels")
    args = ap.parse_args()
    E, H, I, K = 32, 2880, 2880, 4
    tmp = tempfile.mkdtemp()
    old, old_regs = build("mxfp4_moe", tmp)
    # inferno builds gate_up at 8 warps only (down at 4 too, for short K); 4 for comparison.
    w4 = ("SM_VARIANT(8)", "SM_GATE_UP(4)\nSM_VARIANT(8)")
    new, new_regs = build("moe_slot_mma", tmp, [w4])
    here = os.path.dirname(os.path.abspath(__file__))
    dp, dp_regs = build("moe_slot_dp4a", tmp, folder=here)
    # moe_slot_mma.cu taken apart: its arithmetic on the first quad's data only (no loads in the
    # loop), and its loads with the arithmetic replaced by a fold of the loaded words; and capped
    # at 42 registers (6 blocks of 8 warps per multiprocessor).
    compute_only, _ = build("moe_slot_mma", tmp, [
        ("if (Q != w) sm_load_w(p, 4 * Q + t, kb, row_w, row_s, on);", ""),
        ("sm_load_x(qd, 4 * Q + t, kb, xg, on);", "if (Q == w) sm_load_x(qd, 4 * Q + t, kb, xg, on);")])
    loads_only, _ = build("moe_slot_mma", tmp, [(
        "if (__any_sync(FULL_MASK, big & 0x80u)) {",
        "acc[0][0] += __uint_as_float((qd.w[0][0].x ^ qd.w[0][0].y ^ qd.w[0][0].z ^ qd.w[0][0].w ^ qd.w[0][1].x"
        " ^ qd.w[0][1].y ^ qd.w[0][1].z ^ qd.w[0][1].w ^ qd.x[0].x ^ qd.x[1].y ^ qd.x[2].z ^ qd.x[3].w ^ big)"
        " & 0x3F00FFFFu); if (acc[0][0] == 1.2345f) {")])
    capped, _ = build("moe_slot_mma", tmp, [w4, ("__launch_bounds__(32 * W)", "__launch_bounds__(32 * W, 48 / W)")])
    probe, _ = build("moe_read_probe", tmp, folder=here)
    persistent, sp_regs = build("moe_slot_persistent", tmp, folder=here)
    print("registers: moe_slot_persistent", " ".join(sp_regs[-4:]))
    print("registers: moe_slot_dp4a", " ".join(dp_regs))
    print("registers: mxfp4_moe", " ".join(old_regs), "| moe_slot_mma", " ".join(new_regs))
    rng = np.random.default_rng(7)
    cp.random.seed(7)
    layers = [Layer(rng, E, H, I) for _ in range(args.distinct)]
    steps = []
    for l in range(args.layers):
        ids = rng.choice(E, K, replace=False).astype(np.uint32)
        w = rng.random(K).astype(np.float32)
        w /= w.sum()
        x_bits = bf16_bits(rng.standard_normal(H).astype(np.float32))
        steps.append(dict(layer=layers[l % args.distinct], ids=cp.asarray(ids), w=cp.asarray(w),
                          x=cp.asarray(x_bits), ids_h=ids, w_h=w, x_h=x_bits))
    act_f32 = cp.empty(K * I, cp.float32)
    act3 = cp.empty(3 * K * I, cp.uint16)
    part = cp.empty(K * H, cp.float32)
    out = cp.empty(H, cp.uint16)
    i32, f32 = np.int32, np.float32

    old_fns = {n: old.get_function(n) for n in ("moe_gate_up_bf16_r16", "moe_down_r16", "moe_sum_bf16")}

    def old_gu(st):
        L = st["layer"]
        old_fns["moe_gate_up_bf16_r16"](
            (K, 2 * I // 16), (32, -(-H // 1024)),
            (st["x"], st["ids"], L.gu_b, L.gu_s, L.gu_bias, act_f32, i32(K), i32(E), i32(H), i32(I),
             f32(LIMIT), f32(ALPHA)), shared_mem=(H // 32) * 36 * 4)

    def old_dn(st):
        L = st["layer"]
        old_fns["moe_down_r16"](
            (K, H // 16), (32, -(-I // 1024)),
            (act_f32, st["ids"], st["w"], L.d_b, L.d_s, L.d_bias, part, i32(E), i32(H), i32(I)),
            shared_mem=(I // 32) * 36 * 4)

    def run_old(st, what="all"):
        if what != "dn":
            old_gu(st)
        if what != "gu":
            old_dn(st)
        if what == "all":
            summ(st)

    def summ(st):
        old_fns["moe_sum_bf16"]((-(-H // 256),), (256,), (part, st["ids"], out, i32(1), i32(K), i32(H), i32(E)))

    def run_new(W, suf, mod=new):
        gu = mod.get_function(f"moe_sm_gate_up_w{W}{suf}")
        dn = mod.get_function(f"moe_sm_down_w{W}{suf}")
        smem_gu = smem_dn = 0

        def run(st, what="all"):
            L = st["layer"]
            if what != "dn":
                gu((K, 2 * I // 16), (32 * W,), (st["x"], st["ids"], L.gu_b, L.gu_s, L.gu_bias, act3, i32(K),
                                                i32(E), i32(H), i32(I), f32(LIMIT), f32(ALPHA)),
                   shared_mem=smem_gu)
            if what != "gu":
                # k, then no out and no counters: part only (moe_sum adds it).
                dn((K, H // 16), (32 * W,), (act3, st["ids"], st["w"], L.d_b, L.d_s, L.d_bias, part, i32(E),
                                            i32(H), i32(I), i32(K), np.uint64(0), i32(0), np.uint64(0)),
                   shared_mem=smem_dn)
            if what == "all":
                summ(st)
        return run

    def run_sp(W, blocks):
        gu = persistent.get_function(f"moe_sp_gate_up_w{W}")
        dn = persistent.get_function(f"moe_sp_down_w{W}")

        def run(st, what="all"):
            L = st["layer"]
            if what != "dn":
                gu((blocks,), (32 * W,), (st["x"], st["ids"], L.gu_b, L.gu_s, L.gu_bias, act3, i32(K), i32(E), i32(H),
                                         i32(I), f32(LIMIT), f32(ALPHA), i32(K)))
            if what != "gu":
                dn((blocks,), (32 * W,), (act3, st["ids"], st["w"], L.d_b, L.d_s, L.d_bias, part, i32(E), i32(H),
                                         i32(I), i32(K)))
            if what == "all":
                summ(st)
        return run

    act_q = cp.empty(K * I * 3, cp.int8)
    act_d = cp.empty(K * (I // 32) * 3, cp.float32)

    def run_dp(gu_name, dn_name):
        gu = dp.get_function(f"moe_dp_gate_up_{gu_name}")
        dn = dp.get_function(f"moe_dp_down_{dn_name}")
        rg_gu, rg_dn = int(gu_name[-1]), int(dn_name[-1])

        def run(st, what="all"):
            L = st["layer"]
            if what != "dn":
                gu((K, 2 * I // 64), (32, -(-H // 1024), rg_gu), (st["x"], st["ids"], L.gu_b, L.gu_s, L.gu_bias, act_q,
                                                                 act_d, i32(K), i32(E), i32(H), i32(I), f32(LIMIT),
                                                                 f32(ALPHA)))
            if what != "gu":
                dn((K, H // 32), (32, -(-I // 1024), rg_dn), (act_q, act_d, st["ids"], st["w"], L.d_b, L.d_s, L.d_bias,
                                                             part, i32(E), i32(H), i32(I)))
            if what == "all":
                summ(st)
        return run

    variants = [("table r16 (mxfp4_moe.cu)", run_old)]
    for gu_name, dn_name in [("x2_r2_g4", "r2_g2")]:
        variants.append((f"dp4a {gu_name} {dn_name}", run_dp(gu_name, dn_name)))
    for W in (4, 8):
        variants.append((f"mma w{W}", run_new(W, "")))
        variants.append((f"mma w{W} capped", run_new(W, "", capped)))
    for W, per_sm in ((8, 2), (8, 3), (4, 4), (4, 6)):
        variants.append((f"persistent w{W} {per_sm}/SM", run_sp(W, 132 * per_sm)))
    variants.append(("mma w8 compute only", run_new(8, "", compute_only)))
    variants.append(("mma w8 loads only", run_new(8, "", loads_only)))

    # Correctness: one step, every variant, against float64.
    st = steps[0]
    ref = reference(st["layer"], st["x_h"], st["ids_h"], st["w_h"], H, I)
    parts = {}
    for name, run in variants:
        if "only" in name:
            continue
        out.fill(0xFFFF)  # NaN
        run(st)
        cp.cuda.runtime.deviceSynchronize()
        got = bf16_val(cp.asnumpy(out)).astype(np.float64)
        pf = cp.asnumpy(part).reshape(K, H).astype(np.float64).sum(0)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        err_f32 = np.linalg.norm(pf - ref) / np.linalg.norm(ref)
        print(f"check {name:<26} bf16 out rel err {err:.2e}  f32 parts {err_f32:.2e}  nan {np.isnan(got).sum()}")
        parts[name] = cp.asnumpy(part).copy()
        same = {"persistent w8": "mma w8", "persistent w4": "mma w4"}.get(" ".join(name.split()[:2]))
        if same in parts:
            print(f"check {name:<26} parts equal to {same}'s bit for bit: {np.array_equal(parts[name], parts[same])}")

    # Wild scales (E8M0 anywhere in 0..254) on a small layer: the slow decode path.
    Ew, Hw, Iw = 4, 256, 128
    wl = Layer(rng, Ew, Hw, Iw, wild=True)
    ids = np.array([0, 1, 2, 3], np.uint32)
    w = np.full(4, 0.25, np.float32)
    xb = bf16_bits(rng.standard_normal(Hw).astype(np.float32))
    refw = reference(wl, xb, ids, w, Hw, Iw)
    for W, suf in [(4, ""), (8, "")]:
        partw = cp.empty(4 * Hw, cp.float32)
        a3 = cp.empty(3 * 4 * Iw, cp.uint16)
        new.get_function(f"moe_sm_gate_up_w{W}{suf}")((4, 2 * Iw // 16), (32 * W,), (
            cp.asarray(xb), cp.asarray(ids), wl.gu_b, wl.gu_s, wl.gu_bias, a3, i32(4), i32(Ew), i32(Hw), i32(Iw),
            f32(LIMIT), f32(ALPHA)))
        new.get_function(f"moe_sm_down_w{W}{suf}")((4, Hw // 16), (32 * W,), (
            a3, cp.asarray(ids), cp.asarray(w), wl.d_b, wl.d_s, wl.d_bias, partw, i32(Ew), i32(Hw), i32(Iw), i32(4),
            np.uint64(0), i32(0), np.uint64(0)))
        got = cp.asnumpy(partw).reshape(4, Hw).astype(np.float64).sum(0)
        err = np.linalg.norm(got - refw) / np.linalg.norm(refw)
        print(f"check wild scales mma w{W}{suf}: rel err {err:.2e}")

    # Timing: a graph of all layers, replayed.
    stream = cp.cuda.Stream(non_blocking=True)
    bytes_layer = K * 3 * H * I * 17 / 32
    copy_src = cp.empty(2 << 30, cp.uint8)
    copy_dst = cp.empty_like(copy_src)
    with stream:
        for _ in range(3):
            cp.copyto(copy_dst, copy_src)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(5):
            cp.copyto(copy_dst, copy_src)
        e1.record()
        e1.synchronize()
    ms = cp.cuda.get_elapsed_time(e0, e1) / 5
    print(f"device copy: {2 * copy_src.nbytes / ms / 1e6:.0f} GB/s (read + write)")
    del copy_src, copy_dst
    # Read-only probes over the gate_up weights (moe_read_probe.cu): the memory side's ceilings.
    sink = cp.empty(1 << 20, cp.uint32)
    gu_bytes = K * 2 * I * H * 17 / 32
    probes = [("frag", (K, 2 * I // 16), (256,)), ("rows_", (K, 2 * I // 16), (32, -(-H // 1024))),
              ("flat", (264, K), (256,))]
    for kind, grid, block in probes if args.probes else []:
        for P in ((1, 2, 4) if kind != "flat" else (2, 4, 8)):
            f = probe.get_function(f"probe_{kind}_p{P}")

            def run(st, f=f, grid=grid, block=block):
                L = st["layer"]
                f(grid, block, (L.gu_b, L.gu_s, st["ids"], sink, i32(2 * I), i32(H // 32)))
            us = time_graph(stream, steps, run, args.reps, args.layers)
            print(f"probe {kind:<5} P={P}: {us:6.1f} us/layer  {gu_bytes / us / 1e3:6.0f} GB/s (gate_up weights only)")
    for (name, run), what in [(v, w) for v in variants for w in ("gu", "dn", "all")]:
        with stream:
            stream.begin_capture()
            for st in steps:
                run(st, what)
            g = stream.end_capture()
            for _ in range(3):
                g.launch(stream)
            times = []
            for _ in range(args.reps):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(stream)
                g.launch(stream)
                e1.record(stream)
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / args.layers)
        us = float(np.median(times))
        nbytes = bytes_layer * {"gu": 2 / 3, "dn": 1 / 3, "all": 1}[what]
        print(f"time {name:<26} {what:<3} {us:7.1f} us/layer  {nbytes / us / 1e3:6.0f} GB/s  "
              f"(x24 layers: {24 * us / 1e3:.2f} ms)")


def time_graph(stream, steps, run, reps, layers):
    with stream:
        stream.begin_capture()
        for st in steps:
            run(st)
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
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / layers)
    return float(np.median(times))


if __name__ == "__main__":
    main()
