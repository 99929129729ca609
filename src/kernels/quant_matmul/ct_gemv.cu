// Decode GEMVs straight off compressed-tensors weights (quant_matmul/gemv.rs): y [M, N] f32 =
// x [M, K] · wᵀ for M ≤ 8 rows of x, one launch per product, on gemv_bf16.cu's design:
//
// - "swap AB": 16 weight rows are mma.sync's A operand, the rows of x the 8 columns of B. Lane
//   (g, t) loads whole 16-byte chunks, chunk 4q + t of weight rows g and g + 8, and the matching
//   K positions of x row g; the mma does not care in which order K is walked as long as A and B
//   agree (see gemv_bf16.cu). MT tiles of 16 rows per warp, WK warps along K adding their
//   partial sums in shared memory in warp order, two batches of loads in flight per warp.
// - W8A8 int8: int8 × int8 on `mma.m16n8k32.s8.s8.s32`, exact int32 sums; both scales in the
//   epilogue. FP8: E4M3 × E4M3 on `mma.m16n8k32.e4m3.e4m3.f32` (sm_89 on; before, the codes decoded
//   to f16 for `mma.m16n8k16`, mma_e4m3). For both, the block
//   first quantizes the rows of x per token (compressed-tensors' dynamic `token` strategy,
//   numerics.rs: scale = max|x| / 127.5 or / 448, q = round(x / scale)) into shared memory, so a
//   product is one launch; the first weight loads are issued before that, to overlap it.
// - W4A16: int4 codes decoded to bf16 integers (q − zero, exact) and multiplied on bf16
//   `mma.m16n8k16` with f32 sums; each group's scale is applied to the group's partial sum
//   (the quad's 4 chunks span 128 K values: one group when group % 128 == 0).
//
// Batch invariance (the engine relies on it): each column of B is its own dot product in the
// mma, and every sum's order depends on K, N and WK only (WK comes from the shape), never on M.
// For int8 the sums are exact integers anyway.
//
// FP8 sums: Hopper's FP8 tensor cores keep fewer accumulator bits than f32 (DeepSeek-V3's report:
// about 14), so each quad step's partial sum (64 K values, two mmas from zero) is added to an f32
// accumulator by the ALU, as DeepSeek promotes them.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "common.cuh"
#include "gemv.cuh"
#include "int8_gemv.cuh"
#include "mma.cuh"


// Bytes 2H and 2H + 1 of four E4M3 codes as an f16 pair (the lower byte in the low half), exactly:
// a code's sign, exponent and mantissa moved into f16's fields read as code * 2^-8 (E4M3's
// subnormals land on f16 normals, its bias is 8 below f16's), and one multiply by 2^8 restores
// the value. The NaN code (0x7f) becomes 480 instead of NaN: the activations are quantized
// saturating, and a weight that is NaN is a broken checkpoint either way.
template <int H>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
    const uint32_t p = __byte_perm(w, 0u, H == 0 ? 0x1404 : 0x3424);  // each code in a half's top byte
    const uint32_t h = (p & 0x80008000u) | ((p >> 1) & 0x3f803f80u);
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h), __half2(__half(256.f), __half(256.f)));
    return *reinterpret_cast<const uint32_t*>(&v);
}

// c += A (16 x 32 E4M3) * B (32 x 8 E4M3) in m16n8k32's fragments, f32 sums. sm_89 on has the
// instruction (sm_90 itself assembles it to an E4M3 -> f16 unpack and two f16 mmas); before, the
// same decode by bit operations and two f16 m16n8k16 mmas. Lane (g, t) holds K positions
// 4t..4t+3 and 16+4t..16+4t+3 of A's rows g, g + 8 and B's column g; the first f16 mma takes
// 4t..4t+3 as its k slots 2t, 2t+1, 8+2t, 9+2t, for A and B alike, so every product pairs the same
// K position as the FP8 instruction's, and the sum over K is the same set of exact products.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    mma_f16(c, e4m3x2_to_f16x2<0>(a0), e4m3x2_to_f16x2<0>(a1), e4m3x2_to_f16x2<1>(a0), e4m3x2_to_f16x2<1>(a1),
            e4m3x2_to_f16x2<0>(b0), e4m3x2_to_f16x2<1>(b0));
    mma_f16(c, e4m3x2_to_f16x2<0>(a2), e4m3x2_to_f16x2<0>(a3), e4m3x2_to_f16x2<1>(a2), e4m3x2_to_f16x2<1>(a3),
            e4m3x2_to_f16x2<0>(b1), e4m3x2_to_f16x2<1>(b1));
#endif
}

// ---- 8-bit weights × per-token quantized activations ----------------------------------------

__device__ __forceinline__ uint32_t quantize_byte(float v, int fp8) {
    if (!fp8) return (uint32_t)(uint8_t)(int8_t)(int)rintf(fminf(fmaxf(v, -128.f), 127.f));
    return __nv_cvt_float_to_fp8(fminf(fmaxf(v, -448.f), 448.f), __NV_SATFINITE, __NV_E4M3);
}

// x / s as IEEE division rounds it, from r = 1 / s (correctly rounded) by one Markstein
// correction step: three FMA-unit operations instead of the division's subroutine (a batch of 8
// rows quantizes 8 K values per block). Equal to x / s wherever that is above 1e-4 in magnitude
// for s ≥ 1e-30 (numerics.rs checks it over every bf16 x); below, both quantize to 0. Tinier
// scales take the division.
__device__ __forceinline__ float quotient(float x, float s, float r) {
    if (s < 1e-30f) return x / s;
    const float q = __fmul_rn(x, r);
    return __fmaf_rn(__fmaf_rn(-q, s, x), r, q);
}

// The M rows of x (bf16 [M, K], K % 8 == 0) quantized per token into xq (row m at m · xstride)
// and their scales into xs, by the whole block; rows go in pairs (two loads in flight per
// thread, few registers while the first weight batches are in flight). Ends with a barrier.
template <int FP8>
__device__ __forceinline__ void quantize_rows(const __nv_bfloat16* __restrict__ x, int M, int K, int xstride,
                                              uint8_t* xq, float* xs, float (&smax)[CT_MAX_WK][CT_MAX_ROWS]) {
    const int lane = threadIdx.x, wk = threadIdx.y;
    const int tid = wk * 32 + lane, nthr = 32 * blockDim.y, vecs = K / 8;
    const uint4* xr = reinterpret_cast<const uint4*>(x);
    float amax[CT_MAX_ROWS];
#pragma unroll
    for (int m = 0; m < CT_MAX_ROWS; m++) amax[m] = 0.f;
#pragma unroll
    for (int m0 = 0; m0 < CT_MAX_ROWS; m0 += 2) {
        if (m0 >= M) break;
        for (int i = tid; i < vecs; i += nthr) {
            uint4 v[2];
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (m0 + j < M) v[j] = __ldg(xr + (long long)(m0 + j) * vecs + i);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (m0 + j >= M) continue;
                const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(h[e]);
                    amax[m0 + j] = fmaxf(amax[m0 + j], fmaxf(fabsf(f.x), fabsf(f.y)));
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < CT_MAX_ROWS; m++) amax[m] = warp_max(amax[m]);
    if (lane == 0)
#pragma unroll
        for (int m = 0; m < CT_MAX_ROWS; m++) smax[wk][m] = amax[m];
    __syncthreads();
    float sc[CT_MAX_ROWS], rc[CT_MAX_ROWS];
#pragma unroll
    for (int m = 0; m < CT_MAX_ROWS; m++) {
        sc[m] = rc[m] = 1.f;
        if (m >= M) continue;
        float v = 0.f;
        for (int w = 0; w < blockDim.y; w++) v = fmaxf(v, smax[w][m]);
        const float s = v / (FP8 ? 448.f : 127.5f);
        // compressed-tensors' calculate_qparams: the float epsilon instead of a zero scale.
        sc[m] = s == 0.f ? 1.1920929e-7f : s;
        rc[m] = __frcp_rn(sc[m]);
        if (tid == 0) xs[m] = sc[m];
    }
#pragma unroll
    for (int m0 = 0; m0 < CT_MAX_ROWS; m0 += 2) {
        if (m0 >= M) break;
        for (int i = tid; i < vecs; i += nthr) {
            uint4 v[2];
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (m0 + j < M) v[j] = __ldg(xr + (long long)(m0 + j) * vecs + i);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int m = m0 + j;
                if (m >= M) continue;
                const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v[j]);
                uint32_t lo = 0, hi = 0;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    lo |= quantize_byte(quotient(__bfloat162float(h[e]), sc[m], rc[m]), FP8) << (8 * e);
                    hi |= quantize_byte(quotient(__bfloat162float(h[4 + e]), sc[m], rc[m]), FP8) << (8 * e);
                }
                *reinterpret_cast<uint2*>(xq + (long long)m * xstride + 8 * i) = make_uint2(lo, hi);
            }
        }
    }
    __syncthreads();
}

template <int MT, int U>
struct Q8Batch {
    uint4 a[U][MT][2];
};


template <bool PINNED, int MT, int U>
__device__ __forceinline__ void q8_load(Q8Batch<MT, U>& bt, int q0, int stride, int groups, int chunks,
                                        const uint4* const (&wr)[MT][2]) {
    const int t = threadIdx.x & 3;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride, c = 4 * q + t;
        const bool in = q < groups && c < chunks;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                bt.a[u][i][h] = !in ? z : PINNED ? ldg_pinned(wr[i][h] + c) : __ldg(wr[i][h] + c);
    }
}

// Products of one batch; x row g's quantized chunk comes from shared memory (none for g ≥ M).
template <int FP8, int MT, int U, typename Acc>
__device__ __forceinline__ void q8_mma(Acc (&acc)[MT][4], const Q8Batch<MT, U>& bt, int q0, int stride, int groups,
                                       int chunks, const uint8_t* xrow) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride, c = 4 * q + t;
        const bool in = q < groups && c < chunks && xrow;
        const uint4 x = in ? *reinterpret_cast<const uint4*>(xrow + 16 * c) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const uint4 &r0 = bt.a[u][i][0], &r1 = bt.a[u][i][1];
            if constexpr (FP8) {
                float p[4] = {0.f, 0.f, 0.f, 0.f};
                mma_e4m3(p, r0.x, r1.x, r0.y, r1.y, x.x, x.y);  // chunk bytes 0..7
                mma_e4m3(p, r0.z, r1.z, r0.w, r1.w, x.z, x.w);  // chunk bytes 8..15
#pragma unroll
                for (int c4 = 0; c4 < 4; c4++) acc[i][c4] += p[c4];
            } else {
                mma_s8(acc[i], r0.x, r1.x, r0.y, r1.y, x.x, x.y);
                mma_s8(acc[i], r0.z, r1.z, r0.w, r1.w, x.z, x.w);
            }
        }
    }
}

// grid (ceil(N / 16 MT)), block (32, WK), WK · MT ≤ CT_MAX_WK, dynamic shared memory M · xstride
// bytes (xstride: K rounded up to 128, plus 64, so that the two rows a quarter-warp reads fall
// in different banks). w [N, K] bytes (int8 or E4M3), sw [N] f32, x [M, K] bf16, K % 16 == 0.
template <int FP8, int MT, int U>
__device__ __forceinline__ void gemv_q8_impl(const uint8_t* __restrict__ w, const float* __restrict__ sw,
                                             const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int M,
                                             int N, int K, int xstride) {
    pdl_wait();
    using Acc = typename std::conditional<FP8, float, int>::type;
    extern __shared__ __align__(16) uint8_t xq[];
    __shared__ Acc red[CT_MAX_WK / MT][16 * MT][8];
    __shared__ float smax[CT_MAX_WK][CT_MAX_ROWS];
    __shared__ float xs[CT_MAX_ROWS];
    const int g = threadIdx.x >> 2, wk = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16 * MT, chunks = K / 16, groups = (chunks + 3) / 4;
    const uint4* wr[MT][2];
    tile_rows<MT>(wr, w, row0, N, chunks);

    // Two batches in flight from the start (both issued before x is quantized); each one
    // consumed is reloaded with the batch after next.
    Q8Batch<MT, U> p, n;
    const int step = U * WK;
    q8_load<true>(p, wk, WK, groups, chunks, wr);
    q8_load<true>(n, wk + step, WK, groups, chunks, wr);
    quantize_rows<FP8>(x, M, K, xstride, xq, xs, smax);
    const uint8_t* xrow = g < M ? xq + g * xstride : nullptr;

    Acc acc[MT][4];
    zero_acc(acc);
    double_buffered(
        p, n, wk, step, groups,
        [&](Q8Batch<MT, U>& b, int q0) { q8_load<false>(b, q0, WK, groups, chunks, wr); },
        [&](const Q8Batch<MT, U>& b, int q0) { q8_mma<FP8>(acc, b, q0, WK, groups, chunks, xrow); });
    reduce_store<Acc, MT>(red, acc, y, row0, M, N,
                          [&](Acc s, int m, int r) { return (float)s * xs[m] * sw[r]; });
}

// ---- 4-bit weights × bf16 activations ---------------------------------------------------------

template <int MT, int U>
struct Q4Batch {
    uint4 a[U][MT][2];
};

// Word (8 codes, element i at bits 4i, stored as q + 8) → 4 bf16 pairs (elements (0, 4), (1, 5),
// (2, 6), (3, 7)) of q − zero: each nibble ORed into the mantissa of 128.0 (0x4300) is 128 + code,
// exact, and 128 + 8 + zero (an integer ≤ 143, exact in bf16) is subtracted.
__device__ __forceinline__ void decode4(uint32_t (&d)[4], uint32_t word, __nv_bfloat162 off) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t v = ((word >> (4 * j)) & 0x000f000fu) | 0x43004300u;
        __nv_bfloat162 h = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&v), off);
        d[j] = *reinterpret_cast<uint32_t*>(&h);
    }
}

// Weights only: x's chunk (64 bytes of bf16, from L1) is loaded when the batch is multiplied,
// which leaves the registers to more weight loads in flight.
template <int MT, int U>
__device__ __forceinline__ void q4_load(Q4Batch<MT, U>& bt, int q0, int stride, int groups, int chunks,
                                        const uint4* const (&wr)[MT][2]) {
    load_w_chunks(bt.a, q0, stride, groups, chunks, wr);
}

// One batch: per quad step q (128 K values, one scale group) the products from zero, then the
// group's scale times that partial sum added to acc.
template <int MT, int U>
__device__ __forceinline__ void q4_mma(float (&acc)[MT][4], const Q4Batch<MT, U>& bt, int q0, int stride, int groups,
                                       int chunks, const uint4* xr, int row0, int N, const float* __restrict__ scale,
                                       const float* __restrict__ zero, int ngroups, int group) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride;
        if (q >= groups) break;  // the same for the whole warp
        const int gi = ngroups == 1 ? 0 : 128 * q / group, c = 4 * q + t;
        uint4 xv[4];
#pragma unroll
        for (int p = 0; p < 4; p++) xv[p] = c < chunks && xr ? __ldg(xr + 4 * c + p) : make_uint4(0, 0, 0, 0);
        // x pairs matching decode4's element order: (0, 4), (1, 5), (2, 6), (3, 7) of each word.
        uint32_t xb[4][4];
#pragma unroll
        for (int p = 0; p < 4; p++) {
            const uint4& v = xv[p];
            xb[p][0] = __byte_perm(v.x, v.z, 0x5410);
            xb[p][1] = __byte_perm(v.x, v.z, 0x7632);
            xb[p][2] = __byte_perm(v.y, v.w, 0x5410);
            xb[p][3] = __byte_perm(v.y, v.w, 0x7632);
        }
#pragma unroll
        for (int i = 0; i < MT; i++) {
            float s[2];
            __nv_bfloat162 off[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long r = min(row0 + 16 * i + g + 8 * h, N - 1);
                s[h] = __ldg(scale + r * ngroups + gi);
                const float z = zero ? __ldg(zero + r * ngroups + gi) : 0.f;
                off[h] = __float2bfloat162_rn(136.f + z);
            }
            const uint32_t w0[4] = {bt.a[u][i][0].x, bt.a[u][i][0].y, bt.a[u][i][0].z, bt.a[u][i][0].w};
            const uint32_t w1[4] = {bt.a[u][i][1].x, bt.a[u][i][1].y, bt.a[u][i][1].z, bt.a[u][i][1].w};
            float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                uint32_t d0[4], d1[4];
                decode4(d0, w0[wd], off[0]);
                decode4(d1, w1[wd], off[1]);
                mma_bf16(p, d0[0], d1[0], d0[1], d1[1], xb[wd][0], xb[wd][1]);
                mma_bf16(p, d0[2], d1[2], d0[3], d1[3], xb[wd][2], xb[wd][3]);
            }
            acc[i][0] += p[0] * s[0];
            acc[i][1] += p[1] * s[0];
            acc[i][2] += p[2] * s[1];
            acc[i][3] += p[3] * s[1];
        }
    }
}

// grid (ceil(N / 16 MT)), block (32, WK). w [N, K / 8] int32 words, scale (and zero) [N, ngroups]
// f32, x [M, K] bf16; K % 32 == 0 and group % 128 == 0 or ngroups == 1.
template <int MT, int U>
__device__ __forceinline__ void gemv_q4_impl(const uint32_t* __restrict__ w, const float* __restrict__ scale,
                                             const float* __restrict__ zero, const __nv_bfloat16* __restrict__ x,
                                             float* __restrict__ y, int M, int N, int K, int ngroups, int group) {
    pdl_wait();
    __shared__ float red[CT_MAX_WK / MT][16 * MT][8];
    const int g = threadIdx.x >> 2, wk = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16 * MT, chunks = K / 32, groups = (chunks + 3) / 4;
    const uint4* wr[MT][2];
    tile_rows<MT>(wr, w, row0, N, chunks);
    const uint4* xr = g < M ? reinterpret_cast<const uint4*>(x + (long long)g * K) : nullptr;

    float acc[MT][4];
    zero_acc(acc);
    Q4Batch<MT, U> p, n;
    const int step = U * WK;
    q4_load(p, wk, WK, groups, chunks, wr);
#pragma unroll 1
    for (int q0 = wk; q0 < groups; q0 += 2 * step) {
        q4_load(n, q0 + step, WK, groups, chunks, wr);
        q4_mma(acc, p, q0, WK, groups, chunks, xr, row0, N, scale, zero, ngroups, group);
        if (q0 + step >= groups) break;
        if (q0 + 2 * step < groups) q4_load(p, q0 + 2 * step, WK, groups, chunks, wr);
        q4_mma(acc, n, q0 + step, WK, groups, chunks, xr, row0, N, scale, zero, ngroups, group);
    }
    reduce_store<float, MT>(red, acc, y, row0, M, N, [](float s, int, int) { return s; });
}

#define CT_GEMV_Q8(NAME, FP8, MT, U)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * CT_MAX_WK)                                                 \
        NAME##_m##MT(const uint8_t* w, const float* sw, const __nv_bfloat16* x, float* y, int M, int N, int K, \
                     int xstride) {                                                                              \
        gemv_q8_impl<FP8, MT, U>(w, sw, x, y, M, N, K, xstride);                                                 \
    }

#define CT_GEMV_Q4(MT, U)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * CT_MAX_WK)                                                 \
        ct_gemv_q4_m##MT(const uint32_t* w, const float* scale, const float* zero, const __nv_bfloat16* x,      \
                         float* y, int M, int N, int K, int ngroups, int group) {                               \
        gemv_q4_impl<MT, U>(w, scale, zero, x, y, M, N, K, ngroups, group);                                     \
    }

// MT weight tiles per warp (1 or 2); U quad steps per batch of loads.
CT_GEMV_Q8(ct_gemv_i8, 0, 1, 4)
CT_GEMV_Q8(ct_gemv_i8, 0, 2, 2)
CT_GEMV_Q8(ct_gemv_f8, 1, 1, 4)
CT_GEMV_Q8(ct_gemv_f8, 1, 2, 2)
CT_GEMV_Q4(1, 4)
CT_GEMV_Q4(2, 2)
