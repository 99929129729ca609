// Attention over a paged KV pool for a varlen batch (continuous batching), with optional per-head
// sinks (gpt-oss), an optional sliding window and grouped-query heads. mod.rs
// documents the layouts and the math:
//   q [T, heads, D] contiguous: sequence s owns rows cu_q[s]..cu_q[s+1], its first query at
//   position q_pos[s], the others at consecutive positions. k_pool, v_pool [num_slots, kv_heads, D]
//   contiguous; position t of sequence s lives in slot tables[s][t / block_size] * block_size +
//   t % block_size. out [T, heads, D] contiguous.
//   Key at position t is allowed for query position P iff t <= P and (no window or t > P - window).
//   With sinks: o = sum_j e^{s_j - M} v_j / (e^{S_h - M} + sum_j e^{s_j - M}); without, the plain
//   softmax (the sink taken as -inf). Log2 domain, f32 softmax and accumulators.
//
// Batch invariance: a query row's output is bit for bit the same whatever else is in the launch
// (a decode step of one sequence, a prefill chunk of many, any grid). So a prefix computed in
// decode steps and reused from the cache equals what a fresh prefill of it computes. The keys are
// cut into fixed splits of SK positions (absolute: split f holds positions [f*SK, (f+1)*SK)), and
// keys go in tiles of BK aligned to absolute positions too, so every key always meets the same
// lane and tile. Each split runs its own online softmax (m from the sink, l, acc), and the splits
// are folded in position order by fold() below, the one formula both paths use. Tiles or splits
// a row cannot see leave its state bit for bit unchanged (shown at fold()).
//
// Grid (num_seqs * row_blocks, kv_heads, zs), all from host-side bounds (so a CUDA graph replays
// with other metadata): block (s * row_blocks + tile, g, z) handles BQ = 4 warps * RPW query rows
// (query, head-in-group pairs, query-major) of sequence s and kv head g over the fixed splits it
// owns: the tile's fixed splits, from the one holding the sequence's first visible key to the one
// holding its last row's position, shared out in contiguous runs of ceil(splits / zs) (the
// device knows the context; the host only its bound). It reads the sequence's q_len and q_pos on the
// device and exits at once when its tile has no rows (short sequences, padding with q_len 0).
// A lane scores one key per row, the warp applies the online softmax, each lane accumulates
// D/32 output dimensions. Every key is loaded through the block table by the thread that loads
// it, so block_size is free; table entries outside the keys a tile's rows may see are never read
// (they may be garbage), and an entry that points past the pool is treated as a masked key
// instead of read.
// With zs = 1 the block folds its splits as it goes and writes the output; with several it
// writes each split's (m, l, acc) [split - first split][T][heads], and paged_combine folds them
// per row in order, a warp per row, with the same fold() (so the bits are the same). Folding in
// the tile's last block instead (after an atomic count) was slower: its 4 warps fold a decode
// step's 8 rows two each, after the block's atomics, longer than a combine launch that PDL
// starts early (H100, gpt-oss-20b decode: 426.1 against 435.3 tok/s at 1k).

#include "paged_attention.cuh"

#define NW 4   // warps per block
#define BK 32  // keys per tile: one per lane

// 16 bytes of T as floats. Only f32 is instantiated: bf16 calls take the tensor-core kernel
// (paged_attention_mma.cu); the combine below serves both.
template <typename T> __device__ __forceinline__ void unpack16(uint4 u, float* out);
template <> __device__ __forceinline__ void unpack16<float>(uint4 u, float* out) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
}

template <typename T, int D, int RPW>
__device__ __forceinline__ void paged_attention_impl(
    const T* __restrict__ q, const T* __restrict__ k_pool, const T* __restrict__ v_pool,
    const float* __restrict__ sinks, const uint32_t* __restrict__ cu_q, const uint32_t* __restrict__ q_pos,
    const uint32_t* __restrict__ tables, T* __restrict__ out, float* __restrict__ part_acc,
    float* __restrict__ part_ml, const PagedAttnParams& p) {
    constexpr int BQ = NW * RPW;
    constexpr int DC = D / 32;
    __shared__ __align__(16) float Qs[BQ][D];
    __shared__ float Ks[BK][D + 1];  // +1: lane j reads row j, conflict-free
    __shared__ float Vs[BK][D];
    __shared__ __align__(16) float Ps[NW][RPW][BK];
    __shared__ long long KP[BK];  // position of each key of the tile, -1 if none
    // Before pdl_wait(): the step's metadata (cu_q, q_pos, tables: copied in before the step's
    // first kernel) and keys and values of positions before the step's own (written by earlier
    // steps). The kernel before this one (the q/k/v stores) writes q and the step's positions.

    PagedTile tl;
    if (!paged_tile<BQ, false>(tl, cu_q, q_pos, tables, p)) return;
    const int g = tl.g, G = tl.G, row0 = tl.row0;
    const long long tok0 = tl.tok0, rows = tl.rows, pos0 = tl.pos0, f_base = tl.f_base, lo = tl.lo, hi = tl.hi;
    const uint32_t* table = tl.table;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // Per row: the current split's state (m, l per lane, acc) and, with zs = 1, the folded state.
    float m[RPW], l[RPW], sink2[RPW], acc[RPW][DC];
    float Mt[RPW], Lt[RPW], At[RPW][DC];
    long long qpos[RPW];
    bool rvalid[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const long long R = row0 + warp * RPW + r;
        rvalid[r] = R < rows;
        const long long qi = rvalid[r] ? R / G : 0;
        const int h = g * G + (rvalid[r] ? (int)(R % G) : 0);
        qpos[r] = pos0 + qi;
        sink2[r] = sinks ? sinks[h] * LOG2E : -INFINITY;
        m[r] = sink2[r];  // the running max starts at the sink (-inf without sinks)
        l[r] = 0.f;
        Mt[r] = sink2[r];
        Lt[r] = 0.f;
#pragma unroll
        for (int dc = 0; dc < DC; dc++) acc[r][dc] = At[r][dc] = 0.f;
    }

    const long long start = lo / BK * BK;  // tiles at absolute multiples of BK

    // Ends fixed split f for every row: folds it (zs = 1) or writes it as a partial, and starts
    // the next split's state.
    auto close_split = [&](long long f) {
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const float lt = warp_sum(l[r]);
            if (p.zs == 1) {
                fold<DC>(Mt[r], Lt[r], At[r], m[r], lt, acc[r]);
            } else if (rvalid[r] && f - f_base < p.fixed_splits) {
                const long long R = row0 + warp * RPW + r;
                const long long orow = (tok0 + R / G) * p.heads + g * G + (int)(R % G);
                const long long prow = (f - f_base) * p.tokens * p.heads + orow;
#pragma unroll
                for (int dc = 0; dc < DC; dc++) part_acc[prow * D + lane + 32 * dc] = acc[r][dc];
                if (lane == 0) {
                    part_ml[2 * prow] = m[r];
                    part_ml[2 * prow + 1] = lt;
                }
            }
            m[r] = sink2[r];
            l[r] = 0.f;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) acc[r][dc] = 0.f;
        }
    };

    // K/V tiles go through registers: the next tile's 16-byte loads are in flight while the
    // current one is scored. Each thread finds its keys' slots in the block table itself.
    constexpr int N = 16 / sizeof(T);            // elements per 16-byte load
    constexpr int VPR = D / N;                   // loads per key row
    constexpr int LOADS = BK * VPR / (NW * 32);  // loads per thread per tile, of K and of V
    const long long row_stride = (long long)p.kv_heads * D;
    uint4 kr[LOADS], vr[LOADS];
    auto fetch = [&](long long t0) {
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int idx = threadIdx.x + i * NW * 32, jj = idx / VPR, c = (idx % VPR) * N;
            const long long t = t0 + jj;
            const long long slot = t >= lo && t < hi ? paged_slot(table, t, p) : -1;
            if (slot >= 0) {
                const long long at = slot * row_stride + (long long)g * D + c;
                kr[i] = *reinterpret_cast<const uint4*>(k_pool + at);
                vr[i] = *reinterpret_cast<const uint4*>(v_pool + at);
            } else {  // keys outside the range read as zeros: never NaN garbage times p = 0
                kr[i] = make_uint4(0, 0, 0, 0);
                vr[i] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    // The first tile's loads in flight while the q/k/v kernel finishes (when the tile ends before
    // the step's first position) or while Q is staged.
    const bool early = lo < hi && start + BK <= pos0;
    if (early) fetch(start);
    pdl_wait_release(p.release_first);
    if (lo < hi && !early) fetch(start);
    for (int i = threadIdx.x; i < BQ * D; i += blockDim.x) {
        const int r = i / D, c = i % D;
        const long long R = row0 + r;
        float x = 0.f;
        if (R < rows) {
            const long long tok = tok0 + R / G;
            const int h = g * G + (int)(R % G);
            x = to_f32(q[(tok * p.heads + h) * D + c]);
        }
        Qs[r][c] = x;
    }

    for (long long t0 = start; t0 < hi; t0 += BK) {
        if (t0 > start && t0 % SK == 0) close_split(t0 / SK - 1);
        __syncthreads();  // the previous tile is consumed (and Qs is written)
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int idx = threadIdx.x + i * NW * 32, jj = idx / VPR, c = (idx % VPR) * N;
            float kf[N], vf[N];
            unpack16<T>(kr[i], kf);
            unpack16<T>(vr[i], vf);
#pragma unroll
            for (int e = 0; e < N; e++) {
                Ks[jj][c + e] = kf[e];
                Vs[jj][c + e] = vf[e];
            }
        }
        if (threadIdx.x < BK) {
            const long long t = t0 + threadIdx.x;
            KP[threadIdx.x] = t >= lo && t < hi && paged_slot(table, t, p) >= 0 ? t : -1;
        }
        __syncthreads();
        if (t0 + BK < hi) fetch(t0 + BK);

        // Scores: lane = key, for each of the warp's rows.
        const long long kp = KP[lane];
        float s[RPW];
#pragma unroll
        for (int r = 0; r < RPW; r++) s[r] = 0.f;
#pragma unroll 4
        for (int c = 0; c < D; c += 4) {
            const float k0 = Ks[lane][c], k1 = Ks[lane][c + 1], k2 = Ks[lane][c + 2], k3 = Ks[lane][c + 3];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const float4 qv = *reinterpret_cast<const float4*>(&Qs[warp * RPW + r][c]);
                s[r] = fmaf(qv.x, k0, s[r]);
                s[r] = fmaf(qv.y, k1, s[r]);
                s[r] = fmaf(qv.z, k2, s[r]);
                s[r] = fmaf(qv.w, k3, s[r]);
            }
        }
        // Online softmax: each lane keeps its own part of l; the warp shares m. Without sinks m
        // may still be -inf (nothing seen yet): exponents are then taken against 0 instead.
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const bool ok = rvalid[r] && kp >= 0 && kp <= qpos[r] && (p.window <= 0 || kp > qpos[r] - p.window);
            const float sc = ok ? s[r] * p.scale_log2 : -INFINITY;
            const float mn = fmaxf(m[r], warp_max(sc));
            const float base = mn == -INFINITY ? 0.f : mn;
            const float alpha = exp2f(m[r] - base);
            const float pj = exp2f(sc - base);
            l[r] = l[r] * alpha + pj;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) acc[r][dc] *= alpha;
            m[r] = mn;
            Ps[warp][r][lane] = pj;
        }
        __syncwarp();
        // P.V: lane owns dimensions lane + 32 dc.
#pragma unroll 2
        for (int jj = 0; jj < BK; jj += 4) {
            float pr[RPW][4];
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const float4 t = *reinterpret_cast<const float4*>(&Ps[warp][r][jj]);
                pr[r][0] = t.x;
                pr[r][1] = t.y;
                pr[r][2] = t.z;
                pr[r][3] = t.w;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int dc = 0; dc < DC; dc++) {
                    const float vv = Vs[jj + u][lane + 32 * dc];
#pragma unroll
                    for (int r = 0; r < RPW; r++) acc[r][dc] = fmaf(pr[r][u], vv, acc[r][dc]);
                }
            }
        }
    }

    if (lo < hi) close_split((hi - 1) / SK);
    // With splits the partials are written (or, with no key, none the combine reads): the
    // combine kernel folds them.
    if (p.zs > 1) return;
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        if (!rvalid[r]) continue;
        const long long R = row0 + warp * RPW + r;
        const long long orow = (tok0 + R / G) * p.heads + g * G + (int)(R % G);
        const float denom = finish_denom(Mt[r], Lt[r], sink2[r]);
#pragma unroll
        for (int dc = 0; dc < DC; dc++) out[orow * D + lane + 32 * dc] = from_f32<T>(At[r][dc] / denom);
    }
}

// The combine of the split partials: one warp per output row.
template <typename T, int D>
__device__ __forceinline__ void paged_combine_impl(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                   const float* __restrict__ sinks, const uint32_t* __restrict__ cu_q,
                                                   const uint32_t* __restrict__ q_pos, T* __restrict__ out,
                                                   const PagedAttnParams& p) {
    pdl_wait_release(p.release_first);
    const int warp = threadIdx.x >> 5;
    const long long rows = p.tokens * p.heads;
    const long long row = (long long)blockIdx.x * NW + warp;
    if (row >= rows) return;
    const long long tok = row / p.heads;
    // The row's sequence: the last s with cu_q[s] <= tok (cu_q is non-decreasing).
    int a = 0, b = p.num_seqs - 1;
    while (a < b) {
        const int mid = (a + b + 1) / 2;
        if ((long long)cu_q[mid] <= tok) a = mid; else b = mid - 1;
    }
    const long long pos0 = q_pos[a];
    const long long P = pos0 + tok - cu_q[a];
    const float sink2 = sinks ? sinks[row % p.heads] * LOG2E : -INFINITY;
    combine_row<T, D>(part_acc, part_ml, row, pos0, P, sink2, out, p);
}

#define PAGED_ATTENTION(NAME, T, D, RPW)                                                                 \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
        NAME(const T* q, const T* k_pool, const T* v_pool, const float* sinks, const uint32_t* cu_q,     \
             const uint32_t* q_pos, const uint32_t* tables, T* out, float* part_acc, float* part_ml,     \
             const PagedAttnParams p) {                                                                   \
        paged_attention_impl<T, D, RPW>(q, k_pool, v_pool, sinks, cu_q, q_pos, tables, out, part_acc,     \
                                        part_ml, p);                                                      \
    }

#define PAGED_COMBINE(NAME, T, D)                                                                        \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
        NAME(const float* part_acc, const float* part_ml, const float* sinks, const uint32_t* cu_q,      \
             const uint32_t* q_pos, T* out, const PagedAttnParams p) {                                   \
        paged_combine_impl<T, D>(part_acc, part_ml, sinks, cu_q, q_pos, out, p);                         \
    }

PAGED_ATTENTION(paged_attention_f32_d64_r2, float, 64, 2)
PAGED_ATTENTION(paged_attention_f32_d64_r4, float, 64, 4)
PAGED_ATTENTION(paged_attention_f32_d128_r2, float, 128, 2)
PAGED_ATTENTION(paged_attention_f32_d128_r4, float, 128, 4)

PAGED_COMBINE(paged_combine_f32_d64, float, 64)
PAGED_COMBINE(paged_combine_bf16_d64, __nv_bfloat16, 64)
PAGED_COMBINE(paged_combine_f32_d128, float, 128)
PAGED_COMBINE(paged_combine_bf16_d128, __nv_bfloat16, 128)
PAGED_COMBINE(paged_combine_bf16_d256, __nv_bfloat16, 256)
