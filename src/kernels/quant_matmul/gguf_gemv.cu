// Decode GEMVs straight off GGUF's block formats (quant_matmul/gemv.rs): y [M, N] f32 = x [M, K]
// · wᵀ for M ≤ 8 rows of x, one launch per product, on int8_gemv.cuh's tensor-core design. x is
// quantized per block of 32 inside the kernel as llama.cpp's quantize_q8_1 does it (d = max|x| /
// 127, q = round(x / d); numerics.rs is the reference), so each weight block's dot product is an
// exact int8 `mma` sum, times the block's scales. The weights are repacked at load
// (quant/gguf_q8.rs, gguf_k.rs) so that every lane loads whole 16-byte chunks and each
// `mma` sums exactly one block:
//
// - Q8_0: int8 codes, an f16 scale per 32 columns.
// - Q4_K: 4-bit codes, per 32 columns a 6-bit scale sc and min m, per 256 an f16 d and dmin:
//   w = d·sc·q − dmin·m. Per block: d·sc·xd·Σ q·xq − dmin·m·xd·Σ xq (the block sums of x's
//   codes come with the quantization).
// - Q6_K: 6-bit codes (a 4-bit plane and a 2-bit plane), per 16 columns an int8 scale, per 256
//   an f16 d: w = d·sc·(q − 32), one m16n8k16 `mma` per 16 columns.
//
// Launched with PDL: the first two batches of weights and scales are loaded before the wait.
// Batch invariance as in ct_gemv.cu: each column of B is its own dot product and every sum's order
// depends on the shape only.
#include <cuda_fp16.h>

#include "int8_gemv.cuh"

// The M rows of x (bf16 [M, K], K % 64 == 0) quantized per block of 32: codes into xq (row m at
// m · xstride; in Q8_0's column order, or in natural order for the k-quants), scales d into xd
// [M][K / 32] and, where xsum is given, each block's sum of codes into xsum [M][K / 32]. A thread
// quantizes 8 columns; the 4 lanes of a block find its max and sum by shuffles. Ends with a
// barrier.
template <bool Q80_ORDER>
__device__ __forceinline__ void quantize_blocks(const __nv_bfloat16* __restrict__ x, int M, int K, int xstride,
                                                uint8_t* xq, float* xd, int* xsum) {
    const int lane = threadIdx.x, nthr = 32 * blockDim.y, vecs = K / 8, nblk = K / 32;
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    for (int m = 0; m < M; m++) {
        // The bound is the warp's, so that every lane takes part in the shuffles.
        for (int base = 32 * threadIdx.y; base < vecs; base += nthr) {
            const int i = base + lane;
            const bool in = i < vecs;
            const uint4 v = in ? __ldg(xr + (long long)m * vecs + i) : make_uint4(0, 0, 0, 0);
            const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
            float f[8];
            float amax = 0.f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 p = __bfloat1622float2(h[e]);
                f[2 * e] = p.x;
                f[2 * e + 1] = p.y;
                amax = fmaxf(amax, fmaxf(fabsf(p.x), fabsf(p.y)));
            }
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
            const float d = amax / 127.f;
            const float id = d == 0.f ? 0.f : __frcp_rn(d);
            uint32_t lo = 0, hi = 0;
            int sum = 0;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int a = (int)roundf(__fmul_rn(f[e], id)), b = (int)roundf(__fmul_rn(f[4 + e], id));
                lo |= (uint32_t)(uint8_t)(int8_t)a << (8 * e);
                hi |= (uint32_t)(uint8_t)(int8_t)b << (8 * e);
                sum += a + b;
            }
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            if (!in) continue;
            // Q8_0's order: columns 8i..8i+7 go to group i / 8, block (i / 4) % 2 of it, lane i % 4.
            const int pos = Q80_ORDER ? 64 * (i / 8) + 16 * (i % 4) + 8 * ((i / 4) % 2) : 8 * i;
            *reinterpret_cast<uint2*>(xq + (long long)m * xstride + pos) = make_uint2(lo, hi);
            if (i % 4 == 0) {
                xd[m * nblk + i / 4] = d;
                if (xsum) xsum[m * nblk + i / 4] = sum;
            }
        }
    }
    __syncthreads();
}

// ---- GGUF Q8_0: int8 blocks of 32 with an f16 scale each × x quantized per block -------------
//
// The weight's columns are stored in the GEMV's order (quant/gguf_q8.rs): within every 64
// columns, lane t's 16-byte chunk holds columns 8t..8t+7 of the group's first block, then the
// same of its second. So the first `mma` of a chunk sums exactly the first block and the second
// the second: each integer sum takes its weight row's block scale and its x row's block scale
// (llama.cpp's mmvq computes the same sums with dp4a, on 34-byte blocks it reads 4 bytes at a
// time). x is quantized as llama.cpp's quantize_q8_1 does it (numerics.rs is the reference).

template <int MT, int U>
struct Q80Batch {
    uint4 a[U][MT][2];
    uint32_t s[U][MT][2];  // rows g and g + 8: the f16 scales of the group's two blocks
};

__device__ __forceinline__ uint32_t ldg_pinned_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <bool PINNED, int MT, int U>
__device__ __forceinline__ void q80_load(Q80Batch<MT, U>& bt, int q0, int stride, int groups,
                                         const uint4* const (&wr)[MT][2], const uint32_t* const (&sr)[MT][2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride, c = 4 * q + t;
        const bool in = q < groups;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                bt.a[u][i][h] = !in ? make_uint4(0, 0, 0, 0) : PINNED ? ldg_pinned(wr[i][h] + c) : __ldg(wr[i][h] + c);
                bt.s[u][i][h] = !in ? 0u : PINNED ? ldg_pinned_u32(sr[i][h] + q) : __ldg(sr[i][h] + q);
            }
    }
}

// One batch: per quad step q (blocks 2q and 2q + 1), two integer sums per tile, each times its
// weight row's and x row's block scales, added to acc in a fixed order.
template <int MT, int U>
__device__ __forceinline__ void q80_mma(float (&acc)[MT][4], const Q80Batch<MT, U>& bt, int q0, int stride,
                                        int groups, const uint8_t* xrow, const float* xd, int nblk, int M) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride;
        if (q >= groups) break;  // the same for the whole warp
        const uint4 x = xrow ? *reinterpret_cast<const uint4*>(xrow + 16 * (4 * q + t)) : make_uint4(0, 0, 0, 0);
        // The accumulators' columns are x rows 2t and 2t + 1.
        float xs[2][2];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int b = 0; b < 2; b++) xs[j][b] = 2 * t + j < M ? xd[(2 * t + j) * nblk + 2 * q + b] : 0.f;
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const uint4 &r0 = bt.a[u][i][0], &r1 = bt.a[u][i][1];
            int p[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
            mma_s8(p[0], r0.x, r1.x, r0.y, r1.y, x.x, x.y);  // the group's first block
            mma_s8(p[1], r0.z, r1.z, r0.w, r1.w, x.z, x.w);  // its second
            float ws[2][2];  // [row g, g + 8][block]
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t sv = bt.s[u][i][h];
                const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&sv));
                ws[h][0] = f.x;
                ws[h][1] = f.y;
            }
#pragma unroll
            for (int c = 0; c < 4; c++)
#pragma unroll
                for (int b = 0; b < 2; b++)
                    acc[i][c] = __fmaf_rn((float)p[b][c], __fmul_rn(ws[c >> 1][b], xs[c & 1][b]), acc[i][c]);
        }
    }
}

// grid (ceil(N / 16 MT)), block (32, WK), dynamic shared memory M · (xstride + K / 8) bytes (the
// codes, then the scales). w [N, K] int8 codes in the column order above, sw [N, K / 32] f16,
// x [M, K] bf16, K % 64 == 0. Launched with PDL: the first two batches of weights and scales
// are loaded before the wait.
template <int MT, int U>
__device__ __forceinline__ void gemv_q80_impl(const uint8_t* __restrict__ w, const __half* __restrict__ sw,
                                              const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int M,
                                              int N, int K, int xstride) {
    extern __shared__ __align__(16) uint8_t xq[];
    __shared__ float red[CT_MAX_WK / MT][16 * MT][8];
    float* xd = reinterpret_cast<float*>(xq + M * xstride);
    const int g = threadIdx.x >> 2, wk = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16 * MT, groups = K / 64, nblk = K / 32;
    const uint4* wr[MT][2];
    tile_rows<MT>(wr, w, row0, N, K / 16);
    const uint32_t* sr[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            sr[i][h] = reinterpret_cast<const uint32_t*>(sw) + (long long)min(row0 + 16 * i + g + 8 * h, N - 1) * groups;

    Q80Batch<MT, U> p, n;
    const int step = U * WK;
    q80_load<true>(p, wk, WK, groups, wr, sr);
    q80_load<true>(n, wk + step, WK, groups, wr, sr);
    pdl_wait();
    pdl_launch_dependents();
    quantize_blocks<true>(x, M, K, xstride, xq, xd, nullptr);
    const uint8_t* xrow = g < M ? xq + g * xstride : nullptr;

    float acc[MT][4];
    zero_acc(acc);
    double_buffered(
        p, n, wk, step, groups, [&](Q80Batch<MT, U>& b, int q0) { q80_load<false>(b, q0, WK, groups, wr, sr); },
        [&](const Q80Batch<MT, U>& b, int q0) { q80_mma(acc, b, q0, WK, groups, xrow, xd, nblk, M); });
    reduce_store<float, MT>(red, acc, y, row0, M, N, [](float s, int, int) { return s; });
}

#define CT_GEMV_Q80(MT, U)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * CT_MAX_WK)                                                 \
        ct_gemv_q80_m##MT(const uint8_t* w, const __half* sw, const __nv_bfloat16* x, float* y, int M, int N,  \
                          int K, int xstride) {                                                                  \
        gemv_q80_impl<MT, U>(w, sw, x, y, M, N, K, xstride);                                                     \
    }


// ---- Q4_K and Q6_K ----------------------------------------------------------------------------
//
// A weight row (bytes, K % 256 == 0) holds the codes, then (Q6_K) the 2-bit plane, then the
// per-block scales; the per-256 f16 scales are a separate [N, K / 256 · (2 or 1)] array. Quad step
// q covers columns 128q..128q+127 (4 blocks of 32, 8 sub-blocks of 16); lane t's 16 code bytes
// are at 64q + 16t:
// - Q4_K: word b of them holds block b's columns 4t..4t+3 in its low nibbles and 16+4t..16+4t+3
//   in its high nibbles (one m16n8k32 `mma` per block); sc and m of block 4q + b are bytes
//   K/2 + 2(4q + b) and + 1.
// - Q6_K: word b holds sub-block 2b's columns 4t..4t+3 in its low nibbles and sub-block 2b + 1's
//   in its high nibbles; the 2-bit plane (K/4 bytes at K/2) has 8 bytes per lane at 32q + 8t, word
//   s / 4, byte e, bits 2(s % 4) for sub-block s; the int8 scale of sub-block 8q + s is byte
//   3K/4 + 8q + s.
// x stays in natural column order here (a lane reads 4 bytes per 16 columns).

#define KQ_Q4K 0
#define KQ_Q6K 1

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

__device__ __forceinline__ uint2 ldg_pinned_v2(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

template <int MT, int U>
struct KBatch {
    uint4 a[U][MT][2];     // the codes (Q6_K: the 4-bit plane)
    uint2 hb[U][MT][2];    // Q6_K: the 2-bit plane
    uint2 s[U][MT][2];     // the block scales (Q4_K: sc, m per block; Q6_K: sc per sub-block)
    uint32_t d[U][MT][2];  // Q4_K: d, dmin; Q6_K: d
};

struct KRows {
    const uint8_t* row;  // the weight row
    const __half* sup;   // its per-256 scales: Q4_K (d, dmin) pairs, Q6_K d
};

__device__ __forceinline__ unsigned short ldg_pinned_u16(const unsigned short* p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
}

template <int FMT, bool PINNED, int MT, int U>
__device__ __forceinline__ void kq_load(KBatch<MT, U>& bt, int q0, int stride, int groups, int K,
                                        const KRows (&r)[MT][2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride;
        const bool in = q < groups;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t* row = r[i][h].row;
                const uint4* a = reinterpret_cast<const uint4*>(row + 64 * q + 16 * t);
                const int sat = FMT == KQ_Q4K ? K / 2 + 8 * q : 3 * K / 4 + 8 * q;
                const uint2* s = reinterpret_cast<const uint2*>(row + sat);
                // Q4_K: the (d, dmin) word of super-block q / 2; Q6_K: its d (low half of the word).
                const uint32_t* d2 = reinterpret_cast<const uint32_t*>(r[i][h].sup) + q / 2;
                const unsigned short* d1 = reinterpret_cast<const unsigned short*>(r[i][h].sup) + q / 2;
                bt.a[u][i][h] = !in ? make_uint4(0, 0, 0, 0) : PINNED ? ldg_pinned(a) : __ldg(a);
                bt.s[u][i][h] = !in ? make_uint2(0, 0) : PINNED ? ldg_pinned_v2(s) : __ldg(s);
                if (FMT == KQ_Q4K)
                    bt.d[u][i][h] = !in ? 0u : PINNED ? ldg_pinned_u32(d2) : __ldg(d2);
                else
                    bt.d[u][i][h] = !in ? 0u : PINNED ? ldg_pinned_u16(d1) : __ldg(d1);
                if (FMT == KQ_Q6K) {
                    const uint2* hp = reinterpret_cast<const uint2*>(row + K / 2 + 32 * q + 8 * t);
                    bt.hb[u][i][h] = !in ? make_uint2(0, 0) : PINNED ? ldg_pinned_v2(hp) : __ldg(hp);
                }
            }
    }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int b) {
    return b == 0 ? v.x : b == 1 ? v.y : b == 2 ? v.z : v.w;
}

__device__ __forceinline__ float half_lo(uint32_t w) {
    return __half2float(__ushort_as_half((unsigned short)(w & 0xffff)));
}

__device__ __forceinline__ float half_hi(uint32_t w) {
    return __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

// One batch of quad steps. xd / xsum: x's block scales and code sums, [M][K / 32].
template <int FMT, int MT, int U>
__device__ __forceinline__ void kq_mma(float (&acc)[MT][4], const KBatch<MT, U>& bt, int q0, int stride, int groups,
                                       const uint8_t* xrow, const float* xd, const int* xsum, int nblk, int M) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride;
        if (q >= groups) break;  // the same for the whole warp
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const int blk = 4 * q + b;
            // The accumulators' columns are x rows 2t and 2t + 1.
            float xs[2], xm[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const bool on = 2 * t + j < M;
                xs[j] = on ? xd[(2 * t + j) * nblk + blk] : 0.f;
                xm[j] = on && FMT == KQ_Q4K ? __fmul_rn((float)xsum[(2 * t + j) * nblk + blk], xs[j]) : 0.f;
            }
            if (FMT == KQ_Q4K) {
                const uint32_t xa = xrow ? *reinterpret_cast<const uint32_t*>(xrow + 128 * q + 32 * b + 4 * t) : 0u;
                const uint32_t xb =
                    xrow ? *reinterpret_cast<const uint32_t*>(xrow + 128 * q + 32 * b + 16 + 4 * t) : 0u;
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const uint32_t w0 = word_of(bt.a[u][i][0], b), w1 = word_of(bt.a[u][i][1], b);
                    int p[4] = {0, 0, 0, 0};
                    mma_s8(p, w0 & 0x0f0f0f0fu, w1 & 0x0f0f0f0fu, (w0 >> 4) & 0x0f0f0f0fu, (w1 >> 4) & 0x0f0f0f0fu,
                           xa, xb);
                    float ws[2], wm[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint2 s = bt.s[u][i][h];
                        const uint32_t sw = b < 2 ? s.x : s.y;
                        const int sh = 16 * (b & 1);
                        ws[h] = __fmul_rn(half_lo(bt.d[u][i][h]), (float)((sw >> sh) & 0xff));
                        wm[h] = __fmul_rn(half_hi(bt.d[u][i][h]), (float)((sw >> (sh + 8)) & 0xff));
                    }
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int h = c >> 1, j = c & 1;
                        acc[i][c] = __fmaf_rn((float)p[c], __fmul_rn(ws[h], xs[j]), acc[i][c]);
                        acc[i][c] = __fmaf_rn(-wm[h], xm[j], acc[i][c]);
                    }
                }
            } else {
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int s = 2 * b + half;  // sub-block of 16 within the quad step
                    const uint32_t xv = xrow ? *reinterpret_cast<const uint32_t*>(xrow + 128 * q + 16 * s + 4 * t) : 0u;
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        uint32_t code[2];
                        float ws[2];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const uint32_t lw = word_of(bt.a[u][i][h], b);
                            const uint32_t lo = (half ? lw >> 4 : lw) & 0x0f0f0f0fu;
                            const uint32_t hw = s < 4 ? bt.hb[u][i][h].x : bt.hb[u][i][h].y;
                            const uint32_t hi = (hw >> (2 * (s % 4))) & 0x03030303u;
                            code[h] = __vsub4(lo | (hi << 4), 0x20202020u);  // q − 32, per byte
                            const uint2 sv = bt.s[u][i][h];
                            const int sc = (int)(int8_t)(((s < 4 ? sv.x : sv.y) >> (8 * (s % 4))) & 0xff);
                            const uint32_t dw = bt.d[u][i][h];
                            ws[h] = __fmul_rn(half_lo(dw), (float)sc);
                        }
                        int p[4] = {0, 0, 0, 0};
                        mma_s8_k16(p, code[0], code[1], xv);
#pragma unroll
                        for (int c = 0; c < 4; c++)
                            acc[i][c] = __fmaf_rn((float)p[c], __fmul_rn(ws[c >> 1], xs[c & 1]), acc[i][c]);
                    }
                }
            }
        }
    }
}

// grid (ceil(N / 16 MT)), block (32, WK); dynamic shared memory M · (xstride + K / 16) bytes (the
// codes, then the scales, then the sums). w [N, row bytes], sup the per-256 scales, x [M, K] bf16,
// K % 256 == 0, xstride = K + 16 (lanes of different x rows in different banks).
template <int FMT, int MT, int U>
__device__ __forceinline__ void gemv_kq_impl(const uint8_t* __restrict__ w, const __half* __restrict__ sup,
                                             const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int M, int N,
                                             int K, int xstride) {
    extern __shared__ __align__(16) uint8_t xq[];
    __shared__ float red[CT_MAX_WK / MT][16 * MT][8];
    const int nblk = K / 32;
    float* xd = reinterpret_cast<float*>(xq + M * xstride);
    int* xsum = reinterpret_cast<int*>(xd + M * nblk);
    const int g = threadIdx.x >> 2, wk = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16 * MT, groups = K / 128;
    const long long row_bytes = FMT == KQ_Q4K ? 9LL * K / 16 : 13LL * K / 16;
    const int sup_per_row = FMT == KQ_Q4K ? 2 * (K / 256) : K / 256;
    KRows r[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long n = min(row0 + 16 * i + g + 8 * h, N - 1);
            r[i][h].row = w + n * row_bytes;
            r[i][h].sup = sup + n * sup_per_row;
        }

    KBatch<MT, U> p, n;
    const int step = U * WK;
    kq_load<FMT, true>(p, wk, WK, groups, K, r);
    kq_load<FMT, true>(n, wk + step, WK, groups, K, r);
    pdl_wait();
    pdl_launch_dependents();
    quantize_blocks<false>(x, M, K, xstride, xq, xd, FMT == KQ_Q4K ? xsum : nullptr);
    const uint8_t* xrow = g < M ? xq + g * xstride : nullptr;

    float acc[MT][4];
    zero_acc(acc);
    double_buffered(
        p, n, wk, step, groups, [&](KBatch<MT, U>& b, int q0) { kq_load<FMT, false>(b, q0, WK, groups, K, r); },
        [&](const KBatch<MT, U>& b, int q0) { kq_mma<FMT>(acc, b, q0, WK, groups, xrow, xd, xsum, nblk, M); });
    reduce_store<float, MT>(red, acc, y, row0, M, N, [](float s, int, int) { return s; });
}

#define GGUF_GEMV_KQ(NAME, FMT, MT, U)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * CT_MAX_WK)                                                 \
        NAME##_m##MT(const uint8_t* w, const __half* sup, const __nv_bfloat16* x, float* y, int M, int N, int K, \
                     int xstride) {                                                                              \
        gemv_kq_impl<FMT, MT, U>(w, sup, x, y, M, N, K, xstride);                                                \
    }

CT_GEMV_Q80(1, 4)
CT_GEMV_Q80(2, 2)
GGUF_GEMV_KQ(gguf_gemv_q4k, KQ_Q4K, 1, 2)
GGUF_GEMV_KQ(gguf_gemv_q6k, KQ_Q6K, 1, 2)

// ---- Dequantization for the prefill GEMMs: the weight as bf16 [rows, K], natural column order --

// grid (ceil(rows · K / 256)), block (256): one thread per weight. Q8_0's codes [rows, K] in the
// GEMV's order and f16 scales [rows, K / 32].
extern "C" __global__ void gguf_dequant_q80(const uint8_t* __restrict__ q, const __half* __restrict__ scale,
                                            __nv_bfloat16* __restrict__ out, int rows, int K) {
    pdl_wait();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)rows * K) return;
    const long long r = i / K;
    const int s = (int)(i % K), j = s % 64;
    const int c = s - j + 32 * ((j % 16) / 8) + 8 * (j / 16) + j % 8;
    const float d = __half2float(scale[r * (K / 32) + c / 32]);
    out[r * K + c] = __float2bfloat16((float)(int8_t)q[i] * d);
}

// Q4_K and Q6_K in the layouts above; thread i computes weight (row, natural column c).
extern "C" __global__ void gguf_dequant_kq(const uint8_t* __restrict__ w, const __half* __restrict__ sup,
                                           __nv_bfloat16* __restrict__ out, int rows, int K, int fmt) {
    pdl_wait();
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)rows * K) return;
    const long long r = i / K;
    const int c = (int)(i % K), q = c / 128, v = c % 128;
    float val;
    if (fmt == KQ_Q4K) {
        const uint8_t* row = w + r * (9LL * K / 16);
        const int b = v / 32, wc = v % 32, hi = wc / 16, u = wc % 16;
        const uint8_t byte = row[64 * q + 16 * (u / 4) + 4 * b + u % 4];
        const int code = hi ? byte >> 4 : byte & 15;
        const int blk = c / 32;
        const float d = __half2float(sup[r * (2 * (K / 256)) + 2 * (c / 256)]);
        const float dmin = __half2float(sup[r * (2 * (K / 256)) + 2 * (c / 256) + 1]);
        const float d1 = d * (float)row[K / 2 + 2 * blk], m1 = dmin * (float)row[K / 2 + 2 * blk + 1];
        val = d1 * (float)code - m1;
    } else {
        const uint8_t* row = w + r * (13LL * K / 16);
        const int s = v / 16, u = v % 16, t = u / 4, e = u % 4;
        const uint8_t lb = row[64 * q + 16 * t + 4 * (s / 2) + e];
        const uint8_t hb = row[K / 2 + 32 * q + 8 * t + 4 * (s / 4) + e];
        const int code = ((s % 2 ? lb >> 4 : lb & 15) | (((hb >> (2 * (s % 4))) & 3) << 4)) - 32;
        const float d = __half2float(sup[r * (K / 256) + c / 256]);
        val = d * (float)(int8_t)row[3 * K / 4 + c / 16] * (float)code;
    }
    out[r * K + c] = __float2bfloat16(val);
}
