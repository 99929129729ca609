// The device sampler (mod.rs): every row of a batch's logits [rows, n] filtered exactly as the
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
// Batches whose sampling rows all have a small top-k take sample_topk.cu instead (two launches).
#include "sample.cuh"

// Each pass stores the state it derives, per row and stage, after d = 1..3 bytes (slots[d]:
// prefix, acc, target; prefix -1 when off), so the next pass starts from it and scans one
// histogram instead of all of them. Every block of the row computes and stores the same values.
#define SLOT 3
#define SLOTS_ROW (2 * DIGITS * SLOT)

__device__ __forceinline__ Chain load_chain(const double* __restrict__ slots, int d, double target) {
    if (d == 0) return chain_start(target);
    Chain s;
    const double* p = slots + d * SLOT;
    s.on = p[0] >= 0.0;
    s.prefix = s.on ? (uint32_t)p[0] : 0u;
    s.acc = p[1];
    s.target = p[2];
    return s;
}

// The state after byte d from the state before it and byte d's histogram (cnt, val: val null
// means the counts; the first byte of a relative selection scales the target by the total).
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
    const Chain s = advance(load_chain(slots, DIGITS - 1, target), cnt + (DIGITS - 1) * BUCKETS,
                            val ? val + (DIGITS - 1) * BUCKETS : nullptr, false, relative);
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
    pdl_wait();
    const int e = blockIdx.x * THREADS + threadIdx.x;
    if (e >= count) return;
    const uint32_t* p = entries + 4 * e;
    float* at = y + (long long)p[0] * n + p[1];
    *at = penalised(*at, p[2], p[3]);
}

// grid (parts, rows), block (THREADS): block b of a row covers [b * chunk, min(n, (b + 1) * chunk)).
// stage 0 is top-k (digit 0 also takes the row's maximum into rowmax, zeroed before), stage 1
// top-p; `digit` is the byte (0 = most significant) this pass histograms.
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_hist(const float* __restrict__ x, int n, int chunk, const uint32_t* __restrict__ params,
                uint32_t* __restrict__ rowmax, uint32_t* __restrict__ cnt, double* __restrict__ mass, int stage,
                int digit) {
    pdl_wait();
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
            s = advance(s, cnt + (digit - 1) * BUCKETS, nullptr, digit == 1, false);
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
            s = advance(s, tp_cnt + (digit - 1) * BUCKETS, mass + (digit - 1) * BUCKETS, digit == 1, true);
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
    pdl_wait();
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
