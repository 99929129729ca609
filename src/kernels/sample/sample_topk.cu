// The device sampler for batches whose sampling rows all have a small top-k (mod.rs
// `TOPK_MAX`, the common setting: llama.cpp's default is 40): the same kept set and the same draw
// as sample.cu, in two launches instead of ten.
//
// Why: sample.cu's radix selection over the whole row takes a launch per byte per filter (and
// memsets between), ~70 us per decode step on an H100 at batch 1 for a common chat setting
// (temperature 1, top-k 40, top-p 0.9, min-p 0.05, repetition penalty 1.1), almost all of it launch
// latency and per-block scans, not bandwidth (gpt-oss's row is 0.8 MB). With a top-k of k,
// everything that can be kept is among each chunk's k largest logits, so:
//
//   sample_topk_local  grid (parts, rows), a chunk of CHUNK logits per block: the penalties
//                      (sparse list) applied in shared memory; the chunk's argmax (greedy rows,
//                      and rows without a finite maximum); the chunk's k-th largest key by radix
//                      selection; its k largest as candidates (key, id). A chunk with more ties
//                      at its k-th key than fit also lists all of those ties.
//   sample_topk_draw   grid (rows), one block per row: the row's argmax from the chunks'; top-k's
//                      threshold T_k by radix selection over the candidates (the k-th largest
//                      candidate is the k-th largest logit: every logit above it is among its
//                      chunk's k largest, and the chunks holding ties at it contribute enough);
//                      the kept-by-top-k set S (candidates >= T_k, with the tie lists of chunks cut
//                      at T_k) gathered into shared memory; top-p's threshold by radix selection
//                      over S's masses; min-p and the Gumbel-max draw over S.
//
// Deterministic: every position and every sum has a fixed order (a thread's elements, then the
// threads in order; per-warp mass histograms added in warp order), so a seed gives the same id.

#include "sample.cuh"

#define CHUNK 4096                // logits per block of sample_topk_local
#define PER (CHUNK / THREADS)     // per thread
#define GATHER 2048               // S held in shared memory up to this size (else re-read from global)
#define MAX_PARTS 1024            // chunks per row (mod.rs checks n <= CHUNK * MAX_PARTS)

// Exclusive prefix sum of one value per thread, in thread order, and the block's total.
__device__ __forceinline__ uint32_t block_scan(uint32_t v, uint32_t& total) {
    __shared__ uint32_t s_warp[THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t x = warp_scan(v, [](uint32_t a, uint32_t b) { return a + b; });
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    uint32_t base = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++) {
        if (w < warp) base += s_warp[w];
        total += s_warp[w];
    }
    __syncthreads();  // s_warp is reused by the next call
    return base + x - v;
}

// Adds one key per lane to a shared count histogram at the key's byte `shift` (bucket < 0: none);
// a warp's equal buckets summed first (logits crowd into few buckets of the first byte).
__device__ __forceinline__ void count_add(uint32_t* s_cnt, int bucket) {
    const unsigned peers = __match_any_sync(FULL_MASK, bucket);
    if (bucket >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(s_cnt + bucket, (uint32_t)__popc(peers));
}

// The bucket of `key` at byte d when it continues the prefix chosen so far, else -1. Key 0 is
// never kept (NaN, -inf, padding).
__device__ __forceinline__ int bucket_of(uint32_t key, int d, uint32_t prefix) {
    const int shift = 24 - 8 * d;
    if (key == 0 || (d > 0 && (key >> (shift + 8)) != prefix)) return -1;
    return (int)((key >> shift) & 0xff);
}

// grid (parts, rows), block THREADS. Per (row, part) p: part_v/part_i the chunk's argmax (penalised
// logits; NaN never, ties to the lower id); for a sampling row with top-k k: part_kth the chunk's
// k-th largest key (0 when it has fewer than k keepable logits), cand_key/cand_idx [k_stride] its
// k largest (key 0 past them), and when more ties at part_kth than fit, part_ties their count and
// ties [CHUNK] all their offsets in the chunk (else part_ties 0).
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_topk_local(const float* __restrict__ x, int n, int parts, const uint32_t* __restrict__ params, int rows,
                      int penalties, int k_stride, float* __restrict__ part_v, int* __restrict__ part_i,
                      uint32_t* __restrict__ part_kth, uint32_t* __restrict__ part_ties, uint32_t* __restrict__ cand_key,
                      int* __restrict__ cand_idx, uint16_t* __restrict__ ties) {
    pdl_wait();
    __shared__ float s_x[CHUNK];
    __shared__ uint32_t s_cnt[BUCKETS];
    const int row = blockIdx.y, part = blockIdx.x, t = threadIdx.x;
    const long long p = (long long)row * parts + part;
    const RowCfg c = row_cfg(params, row);
    const int lo = part * CHUNK, len = min(CHUNK, n - lo);
    x += (long long)row * n + lo;
#pragma unroll
    for (int q = 0; q < PER; q++) {
        const int e = t + q * THREADS;
        s_x[e] = e < len ? x[e] : __int_as_float(0x7fffffff);  // NaN padding: never kept
    }
    __syncthreads();
    const uint32_t* entries = params + (long long)rows * HEADER;
    for (int e = t; e < penalties; e += THREADS) {  // distinct (row, id): no two threads on one logit
        const uint32_t* pe = entries + 4 * e;
        const int j = (int)pe[1] - lo;
        if ((int)pe[0] == row && j >= 0 && j < len) s_x[j] = penalised(s_x[j], pe[2], pe[3]);
    }
    __syncthreads();
    // Thread t's elements: t + THREADS q (coalesced); their order for positions below: by thread,
    // then q.
    float v = -INFINITY;
    int vi = 0x7fffffff;
    uint32_t key[PER];
#pragma unroll
    for (int q = 0; q < PER; q++) {
        const int e = t + q * THREADS;
        const float l = s_x[e];
        if (!isnan(l)) better(v, vi, l, lo + e);
        key[q] = l > -INFINITY ? key_of(l) : 0u;  // NaN and -inf: 0, never kept
    }
    block_best(v, vi);
    if (t == 0) {
        part_v[p] = v;
        part_i[p] = vi;
    }
    const int k = c.inv_t > 0.f ? c.top_k : 0;
    if (k <= 0) return;  // an argmax row: the chunk's argmax is all it needs
    // The chunk's k-th largest key, a byte per pass (counts: exact, order-free).
    Chain s = chain_start((double)k);
    for (int d = 0; d < DIGITS && s.on; d++) {
        s_cnt[t] = 0;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER; q++) count_add(s_cnt, bucket_of(key[q], d, s.prefix));
        __syncthreads();
        s = advance(s, s_cnt, nullptr, d == 0, false);
    }
    // Off: fewer than k keepable logits, all of them candidates.
    const uint32_t kth = s.on ? s.prefix : 0u;
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int q = 0; q < PER; q++) {
        gt += key[q] != 0 && key[q] > kth;
        eq += key[q] != 0 && key[q] == kth;
    }
    uint32_t n_gt, n_eq;
    const uint32_t at_gt = block_scan(gt, n_gt), at_eq = block_scan(eq, n_eq);
    // n_gt < k when on; the ties fill the rest of the k slots, the later ones cut.
    const bool cut = n_gt + n_eq > (uint32_t)k;
    uint32_t* ck = cand_key + p * k_stride;
    int* ci = cand_idx + p * k_stride;
    uint16_t* tl = ties + p * CHUNK;
    uint32_t a = at_gt, b = at_eq;
#pragma unroll
    for (int q = 0; q < PER; q++) {
        const int id = lo + t + q * THREADS;
        if (key[q] != 0 && key[q] > kth) {
            ck[a] = key[q];
            ci[a] = id;
            a++;
        } else if (key[q] != 0 && key[q] == kth) {
            if (n_gt + b < (uint32_t)k) {
                ck[n_gt + b] = key[q];
                ci[n_gt + b] = id;
            }
            if (cut) tl[b] = (uint16_t)(id - lo);
            b++;
        }
    }
    for (uint32_t j = min(n_gt + n_eq, (uint32_t)k) + t; j < (uint32_t)k_stride; j += THREADS) ck[j] = 0;
    if (t == 0) {
        part_kth[p] = kth;
        part_ties[p] = cut ? n_eq : 0u;
    }
}

// The kept-by-top-k set S of one row: the candidates >= T_k, except those of chunks cut at T_k,
// whose tie lists stand in for them. Calls f(key, id, valid) with every thread of the block in
// step (valid false for padding), so f may use warp-wide operations.
struct TopkSet {
    const uint32_t* cand_key;  // the row's [parts][k_stride]
    const int* cand_idx;
    const uint32_t* part_ties;  // the row's [parts]
    const uint16_t* ties;       // the row's [parts][CHUNK]: offsets in the chunk
    long long slots;            // parts * k_stride
    int k_stride;
    uint32_t tk;
    const uint32_t* cut_at_tk;  // shared bitmap over parts: chunk cut at T_k
    const int* cut_list;        // shared: those chunks in order
    int n_cut;

    __device__ __forceinline__ bool is_cut(int part) const { return (cut_at_tk[part >> 5] >> (part & 31)) & 1u; }

    template <class F>
    __device__ __forceinline__ void each(F&& f) const {
        for (long long j0 = 0; j0 < slots; j0 += THREADS) {
            const long long j = j0 + threadIdx.x;
            const uint32_t key = j < slots ? cand_key[j] : 0u;
            const bool in = key != 0 && key >= tk && !(key == tk && is_cut((int)(j / k_stride)));
            f(key, in ? cand_idx[j] : 0, in);
        }
        for (int a = 0; a < n_cut; a++) {
            const int part = cut_list[a];
            const int count = (int)part_ties[part];
            for (int j0 = 0; j0 < count; j0 += THREADS) {
                const int j = j0 + threadIdx.x;
                const bool in = j < count;
                f(tk, in ? part * CHUNK + ties[(long long)part * CHUNK + j] : 0, in);
            }
        }
    }
};

// grid (rows), block THREADS. out[row]: the drawn id (mask null), or with mask (zeroed [rows, n]):
// 1 at every kept id of a sampling row.
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_topk_draw(int n, int parts, const uint32_t* __restrict__ params, int k_stride,
                     const float* __restrict__ part_v, const int* __restrict__ part_i,
                     const uint32_t* __restrict__ part_kth, const uint32_t* __restrict__ part_ties,
                     const uint32_t* __restrict__ cand_key, const int* __restrict__ cand_idx,
                     const uint16_t* __restrict__ ties, uint32_t* __restrict__ out, uint8_t* __restrict__ mask) {
    pdl_wait();
    __shared__ uint32_t s_cnt[BUCKETS];
    __shared__ double s_wmass[THREADS / 32][BUCKETS];
    __shared__ double s_mass[BUCKETS];
    __shared__ uint32_t s_cut[MAX_PARTS / 32];
    __shared__ int s_cut_list[MAX_PARTS];
    __shared__ uint32_t s_key[GATHER];
    __shared__ int s_idx[GATHER];
    __shared__ float s_best_v;
    __shared__ int s_best_i;
    const int row = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const RowCfg c = row_cfg(params, row);
    // The row's argmax: the greedy draw, and the maximum the weights are relative to.
    {
        float v = -INFINITY;
        int i = 0x7fffffff;
        for (int p = t; p < parts; p += THREADS) better(v, i, part_v[(long long)row * parts + p], part_i[(long long)row * parts + p]);
        block_best(v, i);
        if (t == 0) {
            s_best_v = v;
            s_best_i = i;
        }
        __syncthreads();
    }
    const float m = s_best_v;
    const bool sampling = c.inv_t > 0.f && s_best_i != 0x7fffffff && isfinite(m);
    if (!sampling) {
        if (t == 0 && !mask) out[row] = s_best_i == 0x7fffffff ? 0u : (uint32_t)s_best_i;  // all NaN: 0, as argmax.cu
        return;
    }
    const long long slots = (long long)parts * k_stride;
    TopkSet set;
    set.cand_key = cand_key + (long long)row * slots;
    set.cand_idx = cand_idx + (long long)row * slots;
    set.part_ties = part_ties + (long long)row * parts;
    set.ties = ties + (long long)row * parts * CHUNK;
    set.slots = slots;
    set.k_stride = k_stride;
    // Top-k's threshold over all the candidates (counts).
    Chain s = chain_start((double)c.top_k);
    for (int d = 0; d < DIGITS && s.on; d++) {
        s_cnt[t] = 0;
        __syncthreads();
        for (long long j0 = 0; j0 < slots; j0 += THREADS) {
            const long long j = j0 + t;
            count_add(s_cnt, bucket_of(j < slots ? set.cand_key[j] : 0u, d, s.prefix));
        }
        __syncthreads();
        s = advance(s, s_cnt, nullptr, d == 0, false);
    }
    set.tk = s.on ? s.prefix : 0u;  // off: fewer than k keepable logits, all kept by top-k
    // The chunks cut at T_k (only possible when on), in order.
    uint32_t n_cut = 0;
    for (int p0 = 0; p0 < parts; p0 += THREADS) {
        const int p = p0 + t;
        const bool cut = s.on && p < parts && set.part_ties[p] > 0 && part_kth[(long long)row * parts + p] == set.tk;
        const unsigned ballot = __ballot_sync(FULL_MASK, cut);
        if (lane == 0) s_cut[p >> 5] = ballot;
        uint32_t total;
        const uint32_t at = block_scan(cut, total);
        if (cut) s_cut_list[n_cut + at] = p;
        n_cut += total;
    }
    __syncthreads();
    set.cut_at_tk = s_cut;
    set.cut_list = s_cut_list;
    set.n_cut = (int)n_cut;
    // S into shared memory, in the set's order, when it fits.
    uint32_t size = 0;
    set.each([&](uint32_t key, int id, bool in) {
        uint32_t total;
        const uint32_t at = block_scan(in, total);
        if (in && size + at < GATHER) {
            s_key[size + at] = key;
            s_idx[size + at] = id;
        }
        size += total;
    });
    __syncthreads();
    // Calls f over S, from shared memory when it was gathered.
    auto each = [&](auto&& f) {
        if (size <= GATHER) {
            for (uint32_t j0 = 0; j0 < size; j0 += THREADS) {
                const uint32_t j = j0 + t;
                const bool in = j < size;
                f(in ? s_key[j] : 0u, in ? s_idx[j] : 0, in);
            }
        } else {
            set.each(f);
        }
    };
    // Top-p's threshold over S: masses exp((l - max) / T) per byte bucket, summed per warp in lane
    // order and then over the warps in order.
    uint32_t tp = 0;
    if (c.top_p >= 0.0) {
        Chain h = chain_start(c.top_p);
        for (int d = 0; d < DIGITS && h.on; d++) {
            s_cnt[t] = 0;
#pragma unroll
            for (int w = 0; w < THREADS / 32; w++) s_wmass[w][t] = 0.0;
            __syncthreads();
            each([&](uint32_t key, int, bool in) {
                const int bucket = in ? bucket_of(key, d, h.prefix) : -1;
                const double wt = bucket >= 0 ? (double)weight_of(scaled(float_of(key), m, c.inv_t)) : 0.0;
                const unsigned peers = __match_any_sync(FULL_MASK, bucket);
                double sum = 0.0;
#pragma unroll
                for (int o = 0; o < 32; o++) {
                    const double y = __shfl_sync(FULL_MASK, wt, o);
                    if ((peers >> o) & 1) sum += y;
                }
                if (bucket >= 0 && lane == __ffs(peers) - 1) {
                    atomicAdd(s_cnt + bucket, (uint32_t)__popc(peers));
                    s_wmass[warp][bucket] += sum;  // this warp's row: one lane per bucket
                }
            });
            __syncthreads();
            double total = 0.0;
#pragma unroll
            for (int w = 0; w < THREADS / 32; w++) total += s_wmass[w][t];
            s_mass[t] = total;
            __syncthreads();
            h = advance(h, s_cnt, s_mass, d == 0, true);
        }
        tp = h.on ? h.prefix : 0u;
    }
    // min-p, and the Gumbel-max over what is kept.
    const uint32_t thr = max(set.tk, tp);
    float v = -INFINITY;
    int i = 0x7fffffff;
    each([&](uint32_t key, int id, bool in) {
        if (!in || key < thr) return;
        const float l = float_of(key);
        const float sc = scaled(l, m, c.inv_t);
        if (!(sc >= c.floor && weight_of(sc) > 0.f)) return;
        if (mask) mask[(long long)row * n + id] = 1;
        better(v, i, __fadd_rn(__fmul_rn(l, c.inv_t), gumbel(c.seed, id)), id);  // no FMA: as the reference
    });
    block_best(v, i);
    if (t == 0 && !mask) out[row] = (uint32_t)i;
}
