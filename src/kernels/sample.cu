// The device sampler (sample.rs): every row of a batch's logits [rows, n] filtered exactly as the
// host sampler filters it (src/generate/sampler.rs, `keep`: top-k, top-p and min-p each keep the
// logits >= a threshold, ties at a boundary included) and drawn by the Gumbel-max trick over the
// kept set, each row with its own settings and seed.
//
// The thresholds are found by radix selection over the logits' order-preserving 32-bit keys, a
// byte per pass, without sorting or copying the row: a pass histograms (count, and for top-p the
// softmax mass) the elements that share the prefix chosen so far, and the next pass's blocks
// each re-derive the prefix from the finished histograms (256 buckets each, a block-wide scan),
// so passes need no grid-wide synchronisation beyond the launch boundary (each pass also stores
// the state it derived, so the next one scans only the newest histogram):
//   sample_penalise       the penalties (a sparse list) into a scratch copy of the logits;
//   sample_hist 0, 0      each row's maximum, and top-k's first byte (counts);
//   sample_hist 0, 1..3   top-k: the k-th largest logit's key, byte by byte;
//   sample_hist 1, 0..3   top-p: the largest logit whose head {l >= c} of the top-k set holds
//                         top_p of its mass (weights exp((l - max) / T) in double, as the host);
//   sample_draw           per chunk, the Gumbel-max of the kept elements (min-p is a per-element
//                         test); argmax.cu's argmax_rows_final reduces the chunks.
// Greedy rows (inv_t <= 0) and rows without a finite maximum take the plain argmax.

#include "argmax.cuh"

#define THREADS ARGMAX_THREADS  // one histogram bucket per thread in a scan
#define BUCKETS 256
#define DIGITS 4
#define HEADER 8  // u32 words of per-row settings (sample.rs `pack`)

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
    double x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
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

// Each pass stores the state it derives, per row and stage, after d = 1..3 bytes (slots[d]:
// prefix, acc, target; prefix -1 when off), so the next pass starts from it and scans one
// histogram instead of all of them. Every block of the row computes and stores the same values.
#define SLOT 3
#define SLOTS_ROW (2 * DIGITS * SLOT)

__device__ __forceinline__ Chain load_chain(const double* __restrict__ slots, int d, double target) {
    Chain s;
    if (d == 0) {
        s.prefix = 0;
        s.on = true;
        s.acc = 0.0;
        s.target = target;
        return s;
    }
    const double* p = slots + d * SLOT;
    s.on = p[0] >= 0.0;
    s.prefix = s.on ? (uint32_t)p[0] : 0u;
    s.acc = p[1];
    s.target = p[2];
    return s;
}

// The state after byte d from the state before it and byte d's histogram (cnt, val: val null
// means the counts; the first byte of a relative selection scales the target by the total).
__device__ Chain advance(Chain s, const uint32_t* __restrict__ cnt, const double* __restrict__ val, int d,
                         bool relative) {
    if (!s.on) return s;
    const Pick k = pick(cnt + d * BUCKETS, val ? val + d * BUCKETS : nullptr, s.acc, s.target, relative && d == 0);
    if (d == 0) {
        s.on = k.reached;
        s.target = k.target;
    }
    s.prefix = (s.prefix << 8) | (uint32_t)max(k.bucket, 0);
    s.acc += k.above;
    return s;
}

__device__ __forceinline__ void store_chain(double* __restrict__ slots, int d, const Chain& s) {
    if (threadIdx.x != 0) return;
    double* p = slots + d * SLOT;
    p[0] = s.on ? (double)s.prefix : -1.0;
    p[1] = s.acc;
    p[2] = s.target;
}

// A stage's full key (its last byte picked from the slot after 3 bytes), or 0, below every
// finite key, when the stage is off.
__device__ uint32_t stage_key(const uint32_t* __restrict__ cnt, const double* __restrict__ val,
                              const double* __restrict__ slots, double target, bool relative) {
    const Chain s = advance(load_chain(slots, DIGITS - 1, target), cnt, val, DIGITS - 1, relative);
    return s.on ? s.prefix : 0u;
}

// Adds one element per lane (bucket < 0: none) to a shared histogram, a warp's equal buckets
// summed first (logits crowd into few buckets; shared atomics on one address serialise).
__device__ __forceinline__ void hist_add(uint32_t* s_cnt, double* s_mass, int bucket, double w) {
    const unsigned peers = __match_any_sync(FULL_MASK, bucket);
    double sum = 0.0;
    if (s_mass) {
#pragma unroll
        for (int o = 0; o < 32; o++) {
            const double v = __shfl_sync(FULL_MASK, w, o);
            if ((peers >> o) & 1) sum += v;
        }
    }
    if (bucket >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) {
        atomicAdd(s_cnt + bucket, (uint32_t)__popc(peers));
        if (s_mass) atomicAdd(s_mass + bucket, sum);
    }
}

// Per-row histograms: cnt [rows][2][DIGITS][BUCKETS] (top-k, top-p); mass [rows] of
// [DIGITS][BUCKETS] top-p masses, then the two stages' slots.
#define CNT_ROW (2 * DIGITS * BUCKETS)
#define MASS_ROW (DIGITS * BUCKETS + SLOTS_ROW)

// grid (ceil(count / THREADS)): entries [count][4] = (row, id, factor bits, sub bits), distinct
// (row, id); y is the scratch copy of the logits. l -> (l > 0 ? l / factor : l * factor) - sub.
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_penalise(float* __restrict__ y, int n, const uint32_t* __restrict__ entries, int count) {
    const int e = blockIdx.x * THREADS + threadIdx.x;
    if (e >= count) return;
    const uint32_t* p = entries + 4 * e;
    float* at = y + (long long)p[0] * n + p[1];
    const float factor = __uint_as_float(p[2]), l = *at;
    *at = __fsub_rn(l > 0.f ? __fdiv_rn(l, factor) : __fmul_rn(l, factor), __uint_as_float(p[3]));
}

// grid (parts, rows), block (THREADS): block b of a row covers [b * chunk, min(n, (b + 1) * chunk)).
// stage 0 is top-k (digit 0 also takes the row's maximum into rowmax, zeroed before), stage 1
// top-p; `digit` is the byte (0 = most significant) this pass histograms.
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_hist(const float* __restrict__ x, int n, int chunk, const uint32_t* __restrict__ params,
                uint32_t* __restrict__ rowmax, uint32_t* __restrict__ cnt, double* __restrict__ mass, int stage,
                int digit) {
    __shared__ uint32_t s_cnt[BUCKETS];
    __shared__ double s_mass[BUCKETS];
    __shared__ uint32_t s_max[THREADS / 32];
    const int row = blockIdx.y;
    const RowCfg c = row_cfg(params, row);
    x += (long long)row * n;
    cnt += (long long)row * CNT_ROW;
    mass += (long long)row * MASS_ROW;
    const int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    if (stage == 0 && digit == 0) {
        uint32_t best = 0;  // below every key: a row of only NaN keeps 0
        for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
            const float l = x[j];
            if (!isnan(l)) best = max(best, key_of(l));
        }
        best = __reduce_max_sync(FULL_MASK, best);
        if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < THREADS / 32; w++) best = max(best, s_max[w]);
            atomicMax(rowmax + row, best);
        }
    }
    if (!(c.inv_t > 0.f)) return;  // greedy row
    double* slots = mass + DIGITS * BUCKETS;
    uint32_t prefix = 0, tk = 0;
    float m = 0.f;
    if (stage == 0) {
        if (c.top_k <= 0) return;
        Chain s = load_chain(slots, max(digit - 1, 0), (double)c.top_k);
        if (digit > 0) {
            s = advance(s, cnt, nullptr, digit - 1, false);
            store_chain(slots, digit, s);
        }
        if (!s.on) return;
        prefix = s.prefix;
    } else {
        const uint32_t mk = rowmax[row];
        m = float_of(mk);
        if (!(c.top_p >= 0.0) || mk == 0 || !isfinite(m)) return;
        if (c.top_k > 0) tk = stage_key(cnt, nullptr, slots, (double)c.top_k, false);
        double* tp_slots = slots + DIGITS * SLOT;
        const uint32_t* tp_cnt = cnt + DIGITS * BUCKETS;
        Chain s = load_chain(tp_slots, max(digit - 1, 0), c.top_p);
        if (digit > 0) {
            s = advance(s, tp_cnt, mass, digit - 1, true);
            store_chain(tp_slots, digit, s);
        }
        if (!s.on) return;
        prefix = s.prefix;
    }
    for (int t = threadIdx.x; t < BUCKETS; t += THREADS) {
        s_cnt[t] = 0;
        s_mass[t] = 0.0;
    }
    __syncthreads();
    const int shift = 24 - 8 * digit;
    for (int base = lo; base < hi; base += THREADS) {
        const int j = base + threadIdx.x;
        int bucket = -1;
        double w = 0.0;
        if (j < hi) {
            const float l = x[j];
            if (l > -INFINITY) {  // NaN and -inf are never kept
                const uint32_t k = key_of(l);
                if ((digit == 0 || (k >> (shift + 8)) == prefix) && k >= tk) {
                    bucket = (k >> shift) & 0xff;
                    if (stage == 1) w = (double)weight_of(scaled(l, m, c.inv_t));
                }
            }
        }
        hist_add(s_cnt, stage == 1 ? s_mass : nullptr, bucket, w);
    }
    __syncthreads();
    uint32_t* out_cnt = cnt + (stage * DIGITS + digit) * BUCKETS;
    for (int t = threadIdx.x; t < BUCKETS; t += THREADS) {
        if (s_cnt[t] == 0) continue;
        atomicAdd(out_cnt + t, s_cnt[t]);
        if (stage == 1) atomicAdd(mass + digit * BUCKETS + t, s_mass[t]);
    }
}

// grid (parts, rows), block (THREADS): each chunk's best kept element by x * inv_t + gumbel(seed,
// j) (plain values for an argmax row) into part_v/part_i [rows, parts]. A kept element: finite,
// key >= both thresholds, (l - max) / T >= floor, a weight above 0. With `mask` (tests), writes
// each element's kept flag (0 throughout an argmax row).
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_draw(const float* __restrict__ x, int n, int chunk, int parts, const uint32_t* __restrict__ params,
                const uint32_t* __restrict__ rowmax, const uint32_t* __restrict__ cnt, const double* mass,
                float* __restrict__ part_v, int* __restrict__ part_i, uint8_t* __restrict__ mask) {
    const int row = blockIdx.y;
    const RowCfg c = row_cfg(params, row);
    x += (long long)row * n;
    cnt += (long long)row * CNT_ROW;
    mass += (long long)row * MASS_ROW;
    const uint32_t mk = rowmax[row];
    const float m = float_of(mk);
    const bool sampling = c.inv_t > 0.f && mk != 0 && isfinite(m);
    uint32_t thr = 0;
    if (sampling) {
        const double* slots = mass + DIGITS * BUCKETS;
        if (c.top_k > 0) thr = stage_key(cnt, nullptr, slots, (double)c.top_k, false);
        if (c.top_p >= 0.0)
            thr = max(thr, stage_key(cnt + DIGITS * BUCKETS, mass, slots + DIGITS * SLOT, c.top_p, true));
    }
    const int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
        const float l = x[j];
        bool kept;
        float value = l;
        if (sampling) {
            const float s = scaled(l, m, c.inv_t);
            kept = l > -INFINITY && key_of(l) >= thr && s >= c.floor && weight_of(s) > 0.f;
            value = __fadd_rn(__fmul_rn(l, c.inv_t), gumbel(c.seed, j));  // no FMA: as the reference
        } else {
            kept = !isnan(l);
        }
        if (mask) mask[(long long)row * n + j] = sampling && kept;
        if (kept) better(v, i, value, j);
    }
    block_best(v, i);
    if (threadIdx.x == 0) {
        part_v[row * parts + blockIdx.x] = v;
        part_i[row * parts + blockIdx.x] = i;
    }
}
