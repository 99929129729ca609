// What the device samplers share: sample.cu (radix selection over the whole row) and
// sample_topk.cu (top-k first, then the other filters over the k candidates). See sample.cu's
// header for the filters' semantics.
#pragma once

#include "argmax.cuh"

#define THREADS ARGMAX_THREADS  // one histogram bucket per thread in a scan
#define BUCKETS 256
#define DIGITS 4
#define HEADER 8  // u32 words of per-row settings (mod.rs `pack`)

struct RowCfg {
    float inv_t, floor;
    double top_p;  // < 0: off
    int top_k;     // 0: off
    unsigned long long seed;
};

__device__ __forceinline__ RowCfg row_cfg(const uint32_t* __restrict__ params, int row) {
    const uint32_t* h = params + row * HEADER;
    RowCfg c;
    c.inv_t = __uint_as_float(h[0]);
    c.floor = __uint_as_float(h[1]);
    c.top_p = __hiloint2double((int)h[3], (int)h[2]);
    c.top_k = (int)h[4];
    c.seed = ((unsigned long long)h[6] << 32) | h[5];
    return c;
}

// Order-preserving key of a non-NaN float (-0 as +0, so equal floats have equal keys).
__device__ __forceinline__ uint32_t key_of(float f) {
    const uint32_t b = __float_as_uint(f == 0.f ? 0.f : f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float float_of(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// (l - max) / T and its weight, as the host computes them (no FMA; exp in double).
__device__ __forceinline__ float scaled(float l, float m, float inv_t) { return __fmul_rn(__fsub_rn(l, m), inv_t); }
__device__ __forceinline__ float weight_of(float s) { return (float)exp((double)s); }

struct Pick {
    int bucket;     // -1: every bucket empty
    bool reached;   // whether `bucket` reaches the target (else it is the lowest non-empty one)
    double above;   // the values of the buckets above `bucket`
    double target;  // the target used (frac * total for a relative one)
};

// Among 256 buckets (cnt, val; val null: the counts), the highest bucket b with cnt[b] > 0 and
// acc + sum_{b' >= b} val[b'] >= target (target = target * total when relative). When none
// reaches it, the lowest non-empty bucket (rounding: keep all of the prefix). Block-wide.
__device__ Pick pick(const uint32_t* __restrict__ cnt, const double* __restrict__ val, double acc, double target,
                     bool relative) {
    __shared__ double s_warp[THREADS / 32];
    __shared__ int s_best, s_low;
    __shared__ double s_above;
    const int t = threadIdx.x, b = BUCKETS - 1 - t, lane = t & 31, warp = t >> 5;
    const uint32_t c = cnt[b];
    const double v = val ? val[b] : (double)c;
    const double x = warp_scan(v, [](double a, double b) { return a + b; });
    double e = __shfl_up_sync(FULL_MASK, x, 1);
    if (lane == 0) e = 0.0;
    if (lane == 31) s_warp[warp] = x;
    if (t == 0) {
        s_best = BUCKETS;
        s_low = -1;
    }
    __syncthreads();
    double base = 0.0, total = 0.0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++) {
        if (w < warp) base += s_warp[w];
        total += s_warp[w];
    }
    const double tgt = relative ? target * total : target;
    if (c > 0 && acc + base + x >= tgt) atomicMin(&s_best, t);
    if (c > 0) atomicMax(&s_low, t);
    __syncthreads();
    Pick p;
    p.reached = s_best < BUCKETS;
    const int chosen = p.reached ? s_best : s_low;
    if (t == chosen) s_above = base + e;
    __syncthreads();
    p.bucket = chosen < 0 ? -1 : BUCKETS - 1 - chosen;
    p.above = s_above;
    p.target = tgt;
    __syncthreads();  // the shared words are reused by the next call
    return p;
}

// A selection's state after some bytes of the key: the prefix chosen so far, the value
// (count or mass) of the elements above the prefix's range, the target, and whether the filter
// is on (it is off when the first byte cannot reach the target: fewer than k finite logits, or a
// top-p mass short by rounding).
struct Chain {
    uint32_t prefix;
    bool on;
    double acc, target;
};

// The state after one more byte of the key, from the state before it and that byte's histogram
// (cnt, val: val null means the counts; the first byte of a relative selection scales the target
// by the total).
__device__ __forceinline__ Chain advance(Chain s, const uint32_t* __restrict__ cnt, const double* __restrict__ val,
                                         bool first, bool relative) {
    if (!s.on) return s;
    const Pick k = pick(cnt, val, s.acc, s.target, relative && first);
    if (first) {
        s.on = k.reached;
        s.target = k.target;
    }
    s.prefix = (s.prefix << 8) | (uint32_t)max(k.bucket, 0);
    s.acc += k.above;
    return s;
}

// A selection that starts at the key's first byte, towards `target`.
__device__ __forceinline__ Chain chain_start(double target) {
    Chain s;
    s.prefix = 0;
    s.on = true;
    s.acc = 0.0;
    s.target = target;
    return s;
}

// A penalty entry's effect on a logit (generate::sampler::apply_penalties):
// l -> (l > 0 ? l / factor : l * factor) - sub.
__device__ __forceinline__ float penalised(float l, uint32_t factor_bits, uint32_t sub_bits) {
    const float factor = __uint_as_float(factor_bits);
    return __fsub_rn(l > 0.f ? __fdiv_rn(l, factor) : __fmul_rn(l, factor), __uint_as_float(sub_bits));
}
