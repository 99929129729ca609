// y = x · wᵀ for the rows of decode and verify steps (1 to 64 rows a launch here, any number in
// the rows kernel at the end), bf16 in, f32 out, on tensor cores.
//
// Why not cuBLAS: at 1 to 8 rows its GEMMs read the weights at well under the GPU's bandwidth,
// and a decode step is nothing but weight reads (gpt-oss's attention projections and LM head, every
// Llama projection). Here each weight byte is loaded once with 16-byte loads, many in flight, and
// nothing else is done per byte but the tensor-core product.
//
// Layout ("swap AB", as the MXFP4 kernels: mxfp4_moe/mxfp4_mma.cuh): the 16 weight rows of a block are mma.sync's A
// operand (m16n8k16, bf16, f32 accumulation), x's rows the 8 columns of B (NT tiles of 8 for more
// rows). The dot product does not care in which order K is walked as long as A and B agree, so lane
// (g, t) of a quad loads whole 16-byte chunks: chunk 4q + t of weight rows g and g + 8 and of x row
// g of each n-tile, and feeds them to two k16 steps (values 0..3, then 4..7 of the chunk: each
// lane's a0/a2 and b0/b1 pairs sit at the same K positions).
//
// MT tiles per warp: a warp takes MT tiles of 16 weight rows and reuses each x fragment for all
// of them. With many rows of x (NT = 4, 8) and a tall weight (an LM head), one tile per warp
// reads x from L2 twice as often as it reads weights, and that, not HBM, sets the time.
//
// Split K: the block's WK warps take groups of 4 chunks (32 values) q = wk, wk + WK, ... and add
// their 16 × 8NT partial sums in shared memory in warp order. The order of every sum depends on K,
// N and WK only (WK is chosen from N), never on how many rows x has: a row's result is the same
// bits at batch 1 and at batch 32.

#include "activation.cuh"
#include "gemv.cuh"
#include "mma.cuh"

#define GEMV_MAX_WK 8

// U groups of this lane's chunks: weight rows g and g + 8 of each of the MT tiles, x rows of
// each n-tile.
template <int MT, int NT, int U>
struct GemvBatch {
    uint4 a[U][MT][2], b[U][NT];
};

// The weight part of a batch: read-only, so it may be loaded before pdl_wait().
template <int MT, int NT, int U>
__device__ __forceinline__ void gemv_load_w(GemvBatch<MT, NT, U>& bt, int q0, int stride, int groups, int chunks,
                                            const uint4* const (&wr)[MT][2]) {
    load_w_chunks(bt.a, q0, stride, groups, chunks, wr);
}

// The x part of a batch: written by the previous kernel, so only after pdl_wait().
template <int MT, int NT, int U>
__device__ __forceinline__ void gemv_load_x(GemvBatch<MT, NT, U>& bt, int q0, int stride, int groups, int chunks,
                                            const uint4* const (&xr)[NT]) {
    const int t = threadIdx.x & 3;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride, c = 4 * q + t;
        const bool in = q < groups && c < chunks;
#pragma unroll
        for (int j = 0; j < NT; j++) bt.b[u][j] = in && xr[j] ? __ldg(xr[j] + c) : z;
    }
}

template <int MT, int NT, int U>
__device__ __forceinline__ void gemv_mma_batch(float (&acc)[MT][NT][4], const GemvBatch<MT, NT, U>& bt) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const uint4 &r0 = bt.a[u][i][0], &r1 = bt.a[u][i][1];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint4& x = bt.b[u][j];
                mma_bf16(acc[i][j], r0.x, r1.x, r0.y, r1.y, x.x, x.y);  // chunk values 0..3
                mma_bf16(acc[i][j], r0.z, r1.z, r0.w, r1.w, x.z, x.w);  // chunk values 4..7
            }
        }
}

// Chain v of a K split over WK: the quad steps q = v, v + WK, ... added into acc in order, in
// batches of U groups (which only group the loads). Two batches in flight: the next one's loads
// are issued before this one's products. The first two batches' weights (all of them for
// K <= 2048 at 8 warps along K) are loaded before pdl_wait(), while the kernel before this one
// finishes. The GEMV and its rows kernel both sum through here: one order for a row's sums.
template <int MT, int NT, int U>
__device__ __forceinline__ void gemv_chain(float (&acc)[MT][NT][4], int v, int WK, int groups, int chunks,
                                           const uint4* const (&wr)[MT][2], const uint4* const (&xr)[NT]) {
    GemvBatch<MT, NT, U> p, n;
    const int step = U * WK;
    gemv_load_w(p, v, WK, groups, chunks, wr);
    gemv_load_w(n, v + step, WK, groups, chunks, wr);
    pdl_wait();
    pdl_launch_dependents();
    gemv_load_x(p, v, WK, groups, chunks, xr);
#pragma unroll 1
    for (int q0 = v; q0 < groups; q0 += 2 * step) {
        if (q0 != v) gemv_load_w(n, q0 + step, WK, groups, chunks, wr);
        gemv_load_x(n, q0 + step, WK, groups, chunks, xr);
        gemv_mma_batch(acc, p);
        if (q0 + step >= groups) break;
        if (q0 + 2 * step < groups) {
            gemv_load_w(p, q0 + 2 * step, WK, groups, chunks, wr);
            gemv_load_x(p, q0 + 2 * step, WK, groups, chunks, xr);
        }
        gemv_mma_batch(acc, n);
    }
}

// grid (ceil(N / (16 MT))), block (32, WK), WK · MT <= GEMV_MAX_WK. x [M, K] bf16 (M <= 8 NT),
// w [N, K] bf16, y [M, N] f32. K % 8 == 0 and 16-byte aligned rows (checked by the caller).
//
// SWIGLU (Llama's MLP: w is the fused gate/up weight, gate rows first, N = 2n): a tile's rows
// g are gate rows 8T + g and its rows g + 8 the up rows n + 8T + g, so the block holds both
// halves of 8 outputs, and y is bf16 [M, n]: silu(gate) · up rounded once, silu_mul_bf16's
// formula. Every gate or up sum is the plain GEMV's (same K order, same WK for the same N), so
// the result is that of the GEMV followed by silu_mul_bf16, bit for bit, without the launch
// between them. grid (ceil(n / (8 MT))).
template <int MT, int NT, int U, bool SWIGLU = false>
__device__ __forceinline__ void gemv_bf16_impl(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                               void* __restrict__ out, int M, int N, int K) {
    // Partial sums of every warp along K: at most GEMV_MAX_WK · 16 rows of weights (WK · MT).
    __shared__ float red[GEMV_MAX_WK / MT][16 * MT][8 * NT];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, wk = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16 * MT, chunks = K / 8, groups = (chunks + 3) / 4;
    // Rows past N read row N - 1 (their results are not stored): no branch around the mma.
    const int half = N / 2;
    const uint4* wr[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = SWIGLU ? min(8 * (blockIdx.x * MT + i) + g, half - 1) + h * half
                                   : min(row0 + 16 * i + g + 8 * h, N - 1);
            wr[i][h] = reinterpret_cast<const uint4*>(w) + (long long)row * chunks;
        }
    const uint4* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = 8 * j + g < M ? reinterpret_cast<const uint4*>(x) + (long long)(8 * j + g) * chunks : nullptr;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    gemv_chain<MT, NT, U>(acc, wk, WK, groups, chunks, wr, xr);

    // Fragment: c0, c1 row g, columns 2t, 2t + 1 of the n-tile; c2, c3 row g + 8.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) red[wk][16 * i + g + 8 * (c >> 1)][8 * j + 2 * t + (c & 1)] = acc[i][j][c];
    __syncthreads();
    if (SWIGLU) {
        __nv_bfloat16* act = static_cast<__nv_bfloat16*>(out);
        for (int e = wk * 32 + lane; e < 8 * MT * 8 * NT; e += 32 * WK) {
            const int r = e / (8 * NT), m = e % (8 * NT), i = r / 8, c = 8 * (blockIdx.x * MT + i) + r % 8;
            if (c >= half || m >= M) continue;
            float gate = 0.f, up = 0.f;
            for (int v = 0; v < WK; v++) {
                gate += red[v][16 * i + r % 8][m];
                up += red[v][16 * i + r % 8 + 8][m];
            }
            act[(long long)m * half + c] = __float2bfloat16_rn(silu_mul(gate, up));
        }
        return;
    }
    float* y = static_cast<float*>(out);
    for (int e = wk * 32 + lane; e < 16 * MT * 8 * NT; e += 32 * WK) {
        const int r = e / (8 * NT), m = e % (8 * NT);
        if (row0 + r >= N || m >= M) continue;
        float s = 0.f;
        for (int v = 0; v < WK; v++) s += red[v][r][m];
        y[(long long)m * N + row0 + r] = s;
    }
}

#define GEMV_KERNEL(NAME, MT, NT, U, SWIGLU)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MAX_WK)                                          \
        NAME(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, int M, int N, int K) {                  \
        gemv_bf16_impl<MT, NT, U, SWIGLU>(x, w, y, M, N, K);                                                 \
    }
#define GEMV_VARIANT(MT, NT, U) GEMV_KERNEL(gemv_bf16_m##MT##_n##NT, MT, NT, U, false)

// Rows of x up to 8, 16, 32, 64 (NT); more weight tiles per warp (MT) where the launch allows it;
// fewer groups per batch (U) as the tiles take more registers.
GEMV_VARIANT(1, 1, 4)
GEMV_VARIANT(1, 2, 2)
GEMV_VARIANT(2, 2, 2)
GEMV_VARIANT(1, 4, 1)
GEMV_VARIANT(2, 4, 1)
GEMV_VARIANT(4, 4, 1)
GEMV_VARIANT(1, 8, 1)
GEMV_VARIANT(2, 8, 1)

// Up to 8 rows of x with 2 and 8 groups per batch (U; the same sums in the same order as U = 4:
// U only groups the loads). Registers bound how many warps a multiprocessor holds (on sm_90 U = 8
// takes ~226 per thread, 4 ~124, 2 ~72), and a launch whose blocks do not all fit at once runs
// a second, mostly idle wave: mod.rs takes the largest U whose blocks all fit, and
// U = 8 for launches of many waves. Measured on an H100 (scripts/analysis/gemv_decode.py, chains
// of PDL launches in a graph, U = 4 against the best U): gpt-oss's q/k/v (320 blocks of 7 warps,
// two waves at U = 4) 14.4 -> 12.3 us with U = 2 (at 8 warps); Llama-1B's down (128 blocks of 8
// warps, one per multiprocessor) 14.6 -> 13.1 us and o 4.7 -> 4.3 us, the LM heads 2-3% faster,
// with U = 8.
GEMV_KERNEL(gemv_bf16_m1_n1_u2, 1, 1, 2, false)
GEMV_KERNEL(gemv_bf16_m1_n1_u8, 1, 1, 8, false)

// The SwiGLU epilogue (see gemv_bf16_impl) for up to 16 rows of x: the decode steps that take
// the GEMV for Llama's gate/up product (swiglu_gemv/mod.rs).
GEMV_KERNEL(gemv_swiglu_m1_n1, 1, 1, 4, true)
GEMV_KERNEL(gemv_swiglu_m1_n1_u2, 1, 1, 2, true)
GEMV_KERNEL(gemv_swiglu_m1_n1_u8, 1, 1, 8, true)
GEMV_KERNEL(gemv_swiglu_m1_n2, 1, 2, 2, true)
GEMV_KERNEL(gemv_swiglu_m2_n2, 2, 2, 2, true)

// Many rows of x (verify steps and decode batches past 16 rows), the same bits as the kernels
// above give each row: a row's result does not depend on how many rows share its launch.
//
// Those kernels split K over the WK warps of a block (WK chosen from N and K only): warp v sums
// the quad steps q = v, v + WK, ... from zero, in order, and the block adds the WK partial sums
// from zero in v order. With many rows that layout reads x from L2 once per 16 weight rows (at
// 64 rows of x, four times the weights' bytes). Here block (·, ·, v) computes chain v with the
// same loads and products (U groups of a chain per batch only group the loads), for 8 NT rows
// of x and WN · MT tiles of 16 weight rows: its WN warps walk the same quad steps of the same x
// rows together, so L1 serves x to all but the first. With WK > 1 the chains' sums go to
// `part` [WK, M, N] and gemv_rows_sum adds them from zero in v order: every output gets exactly
// the GEMV's sums. Blocks of the same weight tiles (x's row blocks, gridDim.x) run next to each
// other and find the weights in L2.
//
// grid (ceil(M / (8 NT)), ceil(N / (16 MT WN)), WK), block (32, WN), WN <= GEMV_ROWS_MAX_WN.
#define GEMV_ROWS_MAX_WN 4
template <int MT, int NT, int U>
__device__ __forceinline__ void gemv_bf16_rows_impl(const __nv_bfloat16* __restrict__ x,
                                                    const __nv_bfloat16* __restrict__ w, float* __restrict__ out,
                                                    int M, int N, int K) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, v = blockIdx.z, WK = gridDim.z;
    const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * 16 * MT, m0 = blockIdx.x * 8 * NT;
    const int chunks = K / 8, groups = (chunks + 3) / 4;
    const uint4* wr[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wr[i][h] = reinterpret_cast<const uint4*>(w) + (long long)min(row0 + 16 * i + g + 8 * h, N - 1) * chunks;
    const uint4* xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = m0 + 8 * j + g < M ? reinterpret_cast<const uint4*>(x) + (long long)(m0 + 8 * j + g) * chunks : nullptr;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    // Warp v's chain of the GEMV, as it runs there.
    gemv_chain<MT, NT, U>(acc, v, WK, groups, chunks, wr, xr);
    if (row0 >= N) return;
    // One chain: the result is 0 + acc, as the GEMV's epilogue adds it.
    float* dst = out + (long long)v * M * N;
    // Fragment: c0, c1 row g, columns 2t, 2t + 1 of the n-tile; c2, c3 row g + 8.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = row0 + 16 * i + g + 8 * (c >> 1), m = m0 + 8 * j + 2 * t + (c & 1);
                if (r < N && m < M) dst[(long long)m * N + r] = WK == 1 ? 0.f + acc[i][j][c] : acc[i][j][c];
            }
}

#define GEMV_ROWS_KERNEL(MT, NT, U)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_ROWS_MAX_WN)                                     \
        gemv_bf16_rows_m##MT##_n##NT(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int M, int N, \
                                     int K) {                                                                \
        gemv_bf16_rows_impl<MT, NT, U>(x, w, out, M, N, K);                                                  \
    }

GEMV_ROWS_KERNEL(1, 4, 1)
GEMV_ROWS_KERNEL(2, 4, 1)
GEMV_ROWS_KERNEL(1, 8, 1)
GEMV_ROWS_KERNEL(2, 8, 1)

// y [len] = the WK chains' sums part [WK, len] added from zero in chain order, as the GEMV's
// epilogue adds its warps' partial sums.
extern "C" __global__ void gemv_rows_sum(const float* __restrict__ part, float* __restrict__ y, long long len,
                                         int WK) {
    pdl_wait();
    pdl_launch_dependents();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < len; i += (long long)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int v = 0; v < WK; v++) s += part[v * len + i];
        y[i] = s;
    }
}
