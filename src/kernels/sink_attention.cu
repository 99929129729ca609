// Attention with per-head sinks, an optional sliding window and grouped-query heads (gpt-oss).
//
// o_i = sum_j e^{s_j - M} v_j / (e^{S_h - M} + sum_j e^{s_j - M}),  s_j = scale * q_i . k_j,
// M = max(S_h, max_j s_j). The sink S_h is not scaled, never masked and has no value. Everything
// runs in the log2 domain (scores times scale*log2 e, sink times log2 e) with f32 softmax and
// accumulators, whatever the input dtype. sink_attention.rs documents the layouts; this file
// follows it:
//   q [heads, q_len, D] and k, v [kv_heads, kv_len, D], with element strides for the first two
//   dimensions and the last one contiguous; out [heads, q_len, D] contiguous.
//   Slot j of the cache holds position j (linear), or in a ring buffer of kv_len slots the latest
//   position p <= last with p = j (mod kv_len), where last = start + q_len - 1 (p < 0: empty).
//   Key at position t is allowed for query position P iff t <= P and (no window or t > P - window).
//
// One block handles BQ = 4 warps * RPW query rows of one KV head (rows are (query, head-in-group)
// pairs, query-major, so a group's 64:8 heads share every K/V tile) over one split of the cache
// slots, in tiles of 32 keys: a lane scores one key per row, then the warp applies the online
// softmax and accumulates P.V with each lane owning D/32 output dimensions. With one split the
// block writes the output; with several it writes (m, l, acc) partials that sink_combine merges.

#include "common.cuh"

#define NW 4   // warps per block
#define BK 32  // keys per tile: one per lane
#define LOG2E 1.4426950408889634f
#define MAX_SPLITS 256  // splits of the cache sink_combine merges

// Mirrors SinkAttnParams in sink_attention.rs (repr(C)): keep the field order.
struct SinkAttnParams {
    long long q_s0, q_s1;  // q strides (elements): head, query
    long long k_s0, k_s1;  // k strides: kv head, slot
    long long v_s0, v_s1;  // v strides: kv head, slot
    long long start;       // absolute position of query 0
    long long key_lo;      // first slot of split 0
    int heads, kv_heads, q_len, kv_len;
    int window;          // 0: no window
    int ring;            // 1: the cache is a ring buffer of kv_len slots
    int splits;          // gridDim.z
    int keys_per_split;  // slots per split, a multiple of BK
    float scale_log2;    // scale * log2(e)
    int pad_;
};

// The position slot j holds (see the top of the file), or -1 for an empty slot or one past hi.
__device__ __forceinline__ long long slot_position(long long j, long long hi, long long last,
                                                   const SinkAttnParams& p) {
    if (j >= hi) return -1;
    if (!p.ring) return j;
    long long d = (last - j) % p.kv_len;
    if (d < 0) d += p.kv_len;
    return last - d < 0 ? -1 : last - d;
}

// A decode step whose position lives on the device (CUDA-graph replays): the host launched with
// the worst-case split layout for the whole cache; set start, and for a linear cache the first
// slot and the slots per split, from the real position (as the host computes them in
// sink_attention.rs). Splits past the visible slots see none and leave neutral partials.
__device__ __forceinline__ void resolve_start(SinkAttnParams& p, long long start) {
    p.start = start;
    if (p.ring) return;  // a ring's split layout covers all its slots, whatever the position
    const long long hi = min((long long)p.kv_len, start + p.q_len);
    const long long lo = p.window > 0 ? max(0LL, start - p.window + 1) : 0LL;
    const long long per = (max(hi - lo, 1LL) + p.splits - 1) / p.splits;
    p.key_lo = lo;
    p.keys_per_split = (int)((per + BK - 1) / BK * BK);
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
__device__ __forceinline__ void sink_attention_impl(const T* __restrict__ q, const T* __restrict__ k,
                                                    const T* __restrict__ v, const float* __restrict__ sinks,
                                                    T* __restrict__ out, float* __restrict__ part_acc,
                                                    float* __restrict__ part_ml, const SinkAttnParams& p) {
    constexpr int BQ = NW * RPW;
    constexpr int DC = D / 32;
    __shared__ __align__(16) float Qs[BQ][D];
    __shared__ float Ks[BK][D + 1];  // +1: lane j reads row j, conflict-free
    __shared__ float Vs[BK][D];
    __shared__ __align__(16) float Ps[NW][RPW][BK];
    __shared__ long long KP[BK];  // position held by each slot of the tile, -1 if none

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = p.heads / p.kv_heads;
    const int g = blockIdx.y;
    const int split = blockIdx.z;
    const int rows = G * p.q_len;
    const int row0 = blockIdx.x * BQ;

    float m[RPW], l[RPW], sink2[RPW], acc[RPW][DC];
    long long qpos[RPW];
    bool rvalid[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int R = row0 + warp * RPW + r;
        rvalid[r] = R < rows;
        const int qi = rvalid[r] ? R / G : 0;
        const int h = g * G + (rvalid[r] ? R % G : 0);
        qpos[r] = p.start + qi;
        sink2[r] = rvalid[r] ? sinks[h] * LOG2E : 0.f;
        m[r] = sink2[r];  // the running max starts at the sink: always finite
        l[r] = 0.f;
#pragma unroll
        for (int dc = 0; dc < DC; dc++) acc[r][dc] = 0.f;
    }

    // The slots this block visits: those its rows may see, within its split.
    const long long last = p.start + p.q_len - 1;
    long long lo = 0, hi = p.kv_len;
    if (!p.ring) {
        const int qi_lo = row0 / G;
        const int qi_hi = min(rows - 1, row0 + BQ - 1) / G;
        hi = min(hi, p.start + qi_hi + 1);
        if (p.window > 0) lo = max(0LL, p.start + qi_lo - p.window + 1);
    }
    const long long split_lo = p.key_lo + (long long)split * p.keys_per_split;
    lo = max(lo, split_lo);
    hi = min(hi, split_lo + p.keys_per_split);

    // K/V tiles go through registers: the next tile's 16-byte loads are in flight while the
    // current one is scored (the cache's rows must be 16-byte aligned: the Rust side ensures it).
    constexpr int N = 16 / sizeof(T);            // elements per 16-byte load
    constexpr int VPR = D / N;                   // loads per key row
    constexpr int LOADS = BK * VPR / (NW * 32);  // loads per thread per tile, of K and of V
    const T* kb = k + g * p.k_s0;
    const T* vb = v + g * p.v_s0;
    uint4 kr[LOADS], vr[LOADS];
    auto fetch = [&](long long t0) {
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int idx = threadIdx.x + i * NW * 32, jj = idx / VPR, c = (idx % VPR) * N;
            const long long j = t0 + jj;
            if (slot_position(j, hi, last, p) >= 0) {
                kr[i] = *reinterpret_cast<const uint4*>(kb + j * p.k_s1 + c);
                vr[i] = *reinterpret_cast<const uint4*>(vb + j * p.v_s1 + c);
            } else {  // empty slots read as zeros: never NaN garbage times p = 0
                kr[i] = make_uint4(0, 0, 0, 0);
                vr[i] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    if (lo < hi) fetch(lo);  // in flight while Q is staged
    for (int i = threadIdx.x; i < BQ * D; i += blockDim.x) {
        const int r = i / D, c = i % D, R = row0 + r;
        float x = 0.f;
        if (R < rows) {
            const int qi = R / G, h = g * G + R % G;
            x = to_f32(q[h * p.q_s0 + qi * p.q_s1 + c]);
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
        if (threadIdx.x < BK) KP[threadIdx.x] = slot_position(t0 + threadIdx.x, hi, last, p);
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
        // Online softmax: each lane keeps its own part of l; the warp shares m.
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const bool ok = rvalid[r] && kp >= 0 && kp <= qpos[r] && (p.window <= 0 || kp > qpos[r] - p.window);
            const float sc = ok ? s[r] * p.scale_log2 : -INFINITY;
            const float mn = fmaxf(m[r], warp_max(sc));
            const float alpha = exp2f(m[r] - mn);
            const float pj = exp2f(sc - mn);
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
        const int R = row0 + warp * RPW + r;
        const int qi = R / G, h = g * G + R % G;
        const long long orow = (long long)h * p.q_len + qi;
        if (p.splits == 1) {
            const float denom = lt + exp2f(sink2[r] - m[r]);
#pragma unroll
            for (int dc = 0; dc < DC; dc++) out[orow * D + lane + 32 * dc] = from_f32<T>(acc[r][dc] / denom);
        } else {
            const long long prow = (long long)split * p.heads * p.q_len + orow;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) part_acc[prow * D + lane + 32 * dc] = acc[r][dc];
            if (lane == 0) {
                part_ml[2 * prow] = m[r];
                part_ml[2 * prow + 1] = lt;
            }
        }
    }
}

// Merges the splits' partials: one warp per output row (head, query). The lanes read the
// splits' (m, l) in parallel; the accumulators' loads are independent across splits.
template <typename T, int D>
__device__ __forceinline__ void sink_combine_impl(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                  const float* __restrict__ sinks, T* __restrict__ out, int heads,
                                                  int q_len, int splits) {
    constexpr int DC = D / 32;
    __shared__ float wsh[NW][MAX_SPLITS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long rows = (long long)heads * q_len;
    const long long row = (long long)blockIdx.x * NW + warp;
    if (row >= rows) return;
    const float sink2 = sinks[row / q_len] * LOG2E;
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
    L = warp_sum(L) + exp2f(sink2 - M);
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

#define SINK_ATTENTION(NAME, T, D, RPW)                                                                  \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
        NAME(const T* q, const T* k, const T* v, const float* sinks, T* out, float* part_acc,           \
             float* part_ml, const long long* dyn_start, const SinkAttnParams p) {                      \
        SinkAttnParams pp = p;                                                                           \
        if (dyn_start) resolve_start(pp, *dyn_start);                                                    \
        sink_attention_impl<T, D, RPW>(q, k, v, sinks, out, part_acc, part_ml, pp);                      \
    }

#define SINK_COMBINE(NAME, T, D)                                                                         \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
        NAME(const float* part_acc, const float* part_ml, const float* sinks, T* out, int heads,         \
             int q_len, int splits) {                                                                    \
        sink_combine_impl<T, D>(part_acc, part_ml, sinks, out, heads, q_len, splits);                    \
    }

SINK_ATTENTION(sink_attention_f32_d64_r2, float, 64, 2)
SINK_ATTENTION(sink_attention_f32_d64_r4, float, 64, 4)
SINK_ATTENTION(sink_attention_bf16_d64_r2, __nv_bfloat16, 64, 2)
SINK_ATTENTION(sink_attention_bf16_d64_r4, __nv_bfloat16, 64, 4)
SINK_ATTENTION(sink_attention_f32_d128_r2, float, 128, 2)
SINK_ATTENTION(sink_attention_f32_d128_r4, float, 128, 4)
SINK_ATTENTION(sink_attention_bf16_d128_r2, __nv_bfloat16, 128, 2)
SINK_ATTENTION(sink_attention_bf16_d128_r4, __nv_bfloat16, 128, 4)

SINK_COMBINE(sink_combine_f32_d64, float, 64)
SINK_COMBINE(sink_combine_bf16_d64, __nv_bfloat16, 64)
SINK_COMBINE(sink_combine_f32_d128, float, 128)
SINK_COMBINE(sink_combine_bf16_d128, __nv_bfloat16, 128)
