// Attention over a paged KV pool for a varlen batch (continuous batching), with optional per-head
// sinks (gpt-oss), an optional sliding window and grouped-query heads. paged_attention.rs
// documents the layouts and the math; sink_attention.cu is the same design over one contiguous
// cache, and this file follows it:
//   q [T, heads, D] contiguous: sequence s owns rows cu_q[s]..cu_q[s+1], its first query at
//   position q_pos[s], the others at consecutive positions. k_pool, v_pool [num_slots, kv_heads, D]
//   contiguous; position t of sequence s lives in slot tables[s][t / block_size] * block_size +
//   t % block_size. out [T, heads, D] contiguous.
//   Key at position t is allowed for query position P iff t <= P and (no window or t > P - window).
//   With sinks: o = sum_j e^{s_j - M} v_j / (e^{S_h - M} + sum_j e^{s_j - M}); without, the plain
//   softmax (the sink taken as -inf). Log2 domain, f32 softmax and accumulators.
//
// Grid (num_seqs * row_blocks, kv_heads, splits), all from host-side bounds (so a CUDA graph
// replays with other metadata): block (s * row_blocks + tile, g, split) handles BQ = 4 warps * RPW
// query rows (query, head-in-group pairs, query-major) of sequence s and kv head g over one split
// of the keys the sequence sees. It reads the sequence's q_len and q_pos on the device and exits
// at once when its tile has no rows (short sequences, padding with q_len 0). The split's key
// range is resolved from the real position (as sink_attention.cu's resolve_start), so the splits
// always cover exactly the keys the sequence sees. Keys go in tiles of 32: a lane scores one key
// per row, the warp applies the online softmax, each lane accumulates D/32 output dimensions.
// Every key is loaded through the block table by the thread that loads it, so block_size is free;
// table entries outside the keys a tile's rows may see are never read (they may be garbage), and
// an entry that points past the pool is treated as a masked key instead of read.
// With one split the block writes the output; with several it writes (m, l, acc) partials
// [split][T][heads] that paged_combine merges.

#include "common.cuh"

#define NW 4   // warps per block
#define BK 32  // keys per tile: one per lane
#define LOG2E 1.4426950408889634f
#define MAX_SPLITS 256  // splits paged_combine merges

// Mirrors Params in paged_attention.rs (repr(C)): keep the field order.
struct PagedAttnParams {
    long long num_slots;  // pool slots
    long long tokens;     // T: the partials are [split][T][heads]
    int heads, kv_heads;
    int max_blocks;       // block-table row length
    int block_size;
    int window;           // 0: no window
    int splits;           // gridDim.z
    int row_blocks;       // row tiles per sequence
    float scale_log2;     // scale * log2(e)
};

// The pool slot of position t, or -1 when the table row does not reach it or its entry points
// past the pool (garbage, u32::MAX).
__device__ __forceinline__ long long paged_slot(const uint32_t* __restrict__ table, long long t,
                                                const PagedAttnParams& p) {
    if (t < 0 || t > 0xffffffffLL) return -1;
    const uint32_t u = (uint32_t)t, bs = (uint32_t)p.block_size;  // 32-bit division: cheaper
    const uint32_t b = u / bs;
    if (b >= (uint32_t)p.max_blocks) return -1;
    const long long slot = (long long)table[b] * bs + (u - b * bs);
    return slot < p.num_slots ? slot : -1;
}

// 16 bytes of T as floats: 4 f32 or 8 bf16.
template <typename T> __device__ __forceinline__ void unpack16(uint4 u, float* out);
template <> __device__ __forceinline__ void unpack16<float>(uint4 u, float* out) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
}
template <> __device__ __forceinline__ void unpack16<__nv_bfloat16>(uint4 u, float* out) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        out[2 * q] = __uint_as_float(w[q] << 16);  // the low half is the lower-addressed element
        out[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
    }
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

    const int seq = blockIdx.x / p.row_blocks, tile = blockIdx.x % p.row_blocks;
    const int g = blockIdx.y, split = blockIdx.z;
    const int G = p.heads / p.kv_heads;
    const long long tok0 = cu_q[seq];
    const long long q_len = (long long)cu_q[seq + 1] - tok0;
    const long long rows = G * q_len;
    const int row0 = tile * BQ;
    // Block-uniform: nothing to do for this tile (or q_len 0), or rows past T (bad cu_q).
    if (row0 >= rows || tok0 + q_len > p.tokens) return;
    const long long pos0 = q_pos[seq];
    const uint32_t* table = tables + (long long)seq * p.max_blocks;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float m[RPW], l[RPW], sink2[RPW], acc[RPW][DC];
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
#pragma unroll
        for (int dc = 0; dc < DC; dc++) acc[r][dc] = 0.f;
    }

    // The split layout over the keys the whole sequence sees, then the part of this split that
    // the tile's rows may see.
    const long long seq_lo = p.window > 0 ? max(0LL, pos0 - p.window + 1) : 0LL;
    const long long seq_hi = pos0 + q_len;
    const long long per = ((max(seq_hi - seq_lo, 1LL) + p.splits - 1) / p.splits + BK - 1) / BK * BK;
    const long long split_lo = seq_lo + (long long)split * per;
    const long long qi_lo = row0 / G;
    const long long qi_hi = min(rows - 1, (long long)row0 + BQ - 1) / G;
    long long lo = p.window > 0 ? max(0LL, pos0 + qi_lo - p.window + 1) : 0LL;
    long long hi = pos0 + qi_hi + 1;
    lo = max(lo, split_lo);
    hi = min(hi, split_lo + per);

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
            const long long slot = t < hi ? paged_slot(table, t, p) : -1;
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
    if (lo < hi) fetch(lo);  // in flight while Q is staged
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

    for (long long t0 = lo; t0 < hi; t0 += BK) {
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
            KP[threadIdx.x] = t < hi && paged_slot(table, t, p) >= 0 ? t : -1;
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

#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const float lt = warp_sum(l[r]);
        if (!rvalid[r]) continue;
        const long long R = row0 + warp * RPW + r;
        const long long tok = tok0 + R / G;
        const int h = g * G + (int)(R % G);
        const long long orow = tok * p.heads + h;
        if (p.splits == 1) {
            const float denom = lt + (sink2[r] == -INFINITY ? 0.f : exp2f(sink2[r] - m[r]));
#pragma unroll
            for (int dc = 0; dc < DC; dc++) out[orow * D + lane + 32 * dc] = from_f32<T>(acc[r][dc] / denom);
        } else {
            const long long prow = (long long)split * p.tokens * p.heads + orow;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) part_acc[prow * D + lane + 32 * dc] = acc[r][dc];
            if (lane == 0) {
                part_ml[2 * prow] = m[r];
                part_ml[2 * prow + 1] = lt;
            }
        }
    }
}

// Merges the splits' partials: one warp per output row (token, head). A split that saw no key
// left m = sink (or -inf) and l = 0, which weighs nothing.
template <typename T, int D>
__device__ __forceinline__ void paged_combine_impl(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                   const float* __restrict__ sinks, T* __restrict__ out, int heads,
                                                   long long tokens, int splits) {
    constexpr int DC = D / 32;
    __shared__ float wsh[NW][MAX_SPLITS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long rows = tokens * heads;
    const long long row = (long long)blockIdx.x * NW + warp;
    if (row >= rows) return;
    const float sink2 = sinks ? sinks[row % heads] * LOG2E : -INFINITY;
    float M = sink2;
    for (int s = lane; s < splits; s += 32) M = fmaxf(M, part_ml[2 * (s * rows + row)]);
    M = warp_max(M);
    float L = 0.f;
    for (int s = lane; s < splits; s += 32) {
        const long long prow = s * rows + row;
        const float w = exp2f(part_ml[2 * prow] - M);
        wsh[warp][s] = w;
        L = fmaf(part_ml[2 * prow + 1], w, L);
    }
    L = warp_sum(L) + (sink2 == -INFINITY ? 0.f : exp2f(sink2 - M));
    __syncwarp();
    float acc[DC];
#pragma unroll
    for (int dc = 0; dc < DC; dc++) acc[dc] = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; s++) {
        const float w = wsh[warp][s];
#pragma unroll
        for (int dc = 0; dc < DC; dc++) acc[dc] = fmaf(w, part_acc[(s * rows + row) * D + lane + 32 * dc], acc[dc]);
    }
#pragma unroll
    for (int dc = 0; dc < DC; dc++) out[row * D + lane + 32 * dc] = from_f32<T>(acc[dc] / L);
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
        NAME(const float* part_acc, const float* part_ml, const float* sinks, T* out, int heads,         \
             long long tokens, int splits) {                                                             \
        paged_combine_impl<T, D>(part_acc, part_ml, sinks, out, heads, tokens, splits);                  \
    }

PAGED_ATTENTION(paged_attention_f32_d64_r2, float, 64, 2)
PAGED_ATTENTION(paged_attention_f32_d64_r4, float, 64, 4)
PAGED_ATTENTION(paged_attention_bf16_d64_r2, __nv_bfloat16, 64, 2)
PAGED_ATTENTION(paged_attention_bf16_d64_r4, __nv_bfloat16, 64, 4)
PAGED_ATTENTION(paged_attention_f32_d128_r2, float, 128, 2)
PAGED_ATTENTION(paged_attention_f32_d128_r4, float, 128, 4)
PAGED_ATTENTION(paged_attention_bf16_d128_r2, __nv_bfloat16, 128, 2)
PAGED_ATTENTION(paged_attention_bf16_d128_r4, __nv_bfloat16, 128, 4)

PAGED_COMBINE(paged_combine_f32_d64, float, 64)
PAGED_COMBINE(paged_combine_bf16_d64, __nv_bfloat16, 64)
PAGED_COMBINE(paged_combine_f32_d128, float, 128)
PAGED_COMBINE(paged_combine_bf16_d128, __nv_bfloat16, 128)
