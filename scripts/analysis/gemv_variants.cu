// Experiments for scripts/analysis/gemv_decode.py (not built into inferno): src/kernels/gemv_bf16.cu
// at one row of x, with other batch sizes per warp (U), a persistent grid, and a read-only probe.
//
//   gemv_u<U>:        gemv_bf16_impl<1, 1, U> (inferno builds U = 4 for one row of x).
//   gemv_p_u<U>:      the same tile loop with a persistent grid: block b takes output tiles b,
//                     b + gridDim.x, ...; the next tile's first two batches of weights are loaded
//                     before this tile's reduction, and the reduction buffer is double-buffered so
//                     one sync per tile suffices. Same order of every sum as gemv_bf16_impl (the
//                     results must be equal bit for bit).
//   gemv_flat_read:   reads the weights as one flat array (grid-stride, 4 loads of 16 bytes in
//                     flight per thread): what the memory side allows for the same bytes.

#include "gemv_bf16.cu"

#define U_VARIANT(U)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MAX_WK)                                          \
        gemv_u##U(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int M, int N, int K) {           \
        gemv_bf16_impl<1, 1, U>(x, w, y, M, N, K);                                                          \
    }

U_VARIANT(2)
U_VARIANT(4)
U_VARIANT(8)

__device__ __forceinline__ void gemv_p_rows(const uint4* (&wr)[1][2], const __nv_bfloat16* w, int tile, int N,
                                            int chunks) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int h = 0; h < 2; h++)
        wr[0][h] = reinterpret_cast<const uint4*>(w) + (long long)min(16 * tile + g + 8 * h, N - 1) * chunks;
}

template <int U>
__device__ __forceinline__ void gemv_p_impl(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                            float* __restrict__ y, int M, int N, int K) {
    __shared__ float red[2][GEMV_MAX_WK][16][8];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, wk = threadIdx.y, WK = blockDim.y;
    const int chunks = K / 8, groups = (chunks + 3) / 4, tiles = (N + 15) / 16;
    int tile = blockIdx.x;
    if (tile >= tiles) return;
    const uint4* wr[1][2];
    gemv_p_rows(wr, w, tile, N, chunks);
    const uint4* xr[1] = {g < M ? reinterpret_cast<const uint4*>(x) + (long long)g * chunks : nullptr};
    GemvBatch<1, 1, U> p, n;
    const int step = U * WK;
    gemv_load_w(p, wk, WK, groups, chunks, wr);
    gemv_load_w(n, wk + step, WK, groups, chunks, wr);
    pdl_wait();
    pdl_launch_dependents();
    for (int buf = 0;; buf ^= 1) {
        float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
        gemv_load_x(p, wk, WK, groups, chunks, xr);
#pragma unroll 1
        for (int q0 = wk; q0 < groups; q0 += 2 * step) {
            if (q0 != wk) gemv_load_w(n, q0 + step, WK, groups, chunks, wr);
            gemv_load_x(n, q0 + step, WK, groups, chunks, xr);
            gemv_mma_batch(acc, p);
            if (q0 + step >= groups) break;
            if (q0 + 2 * step < groups) {
                gemv_load_w(p, q0 + 2 * step, WK, groups, chunks, wr);
                gemv_load_x(p, q0 + 2 * step, WK, groups, chunks, xr);
            }
            gemv_mma_batch(acc, n);
        }
        const int next = tile + gridDim.x;
        if (next < tiles) {
            gemv_p_rows(wr, w, next, N, chunks);
            gemv_load_w(p, wk, WK, groups, chunks, wr);
            gemv_load_w(n, wk + step, WK, groups, chunks, wr);
        }
#pragma unroll
        for (int c = 0; c < 4; c++) red[buf][wk][g + 8 * (c >> 1)][2 * t + (c & 1)] = acc[0][0][c];
        __syncthreads();
        const int row0 = 16 * tile;
        for (int e = wk * 32 + lane; e < 16 * 8; e += 32 * WK) {
            const int r = e / 8, m = e % 8;
            if (row0 + r >= N || m >= M) continue;
            float s = 0.f;
            for (int v = 0; v < WK; v++) s += red[buf][v][r][m];
            y[(long long)m * N + row0 + r] = s;
        }
        if (next >= tiles) return;
        tile = next;
    }
}

#define P_VARIANT(U)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MAX_WK)                                          \
        gemv_p_u##U(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int M, int N, int K) {         \
        gemv_p_impl<U>(x, w, y, M, N, K);                                                                   \
    }

P_VARIANT(2)
P_VARIANT(4)

extern "C" __global__ void gemv_flat_read(const uint4* __restrict__ w, long long n16, uint32_t* sink) {
    pdl_launch_dependents();
    uint32_t acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x * 4;
    for (long long i = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x; i < n16; i += stride) {
        uint4 a[4];
#pragma unroll
        for (int p = 0; p < 4; p++) a[p] = i + p * blockDim.x < n16 ? __ldg(w + i + p * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int p = 0; p < 4; p++) acc ^= a[p].x ^ a[p].y ^ a[p].z ^ a[p].w;
    }
    pdl_wait();
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// gemv_r<R>_u<U>: gemv_bf16_impl<1, 1, U> with warp v's chain taking runs of R consecutive quad
// steps: its i-th step is ((i / R) * WK + v) * R + i % R (R = 1 is gemv_bf16.cu's q = v + i WK).
// A warp then reads 64 R contiguous bytes of each row per run where R = 1 reads 64 and leaves
// the next 64 to the next warp. Other sums than gemv_bf16.cu's for R > 1 (a row's order is
// still fixed by the shape), so the script checks these against float64, not bit for bit.
// R = 0: the run length is 1 << lr, known only at run time.
template <int R>
__device__ __forceinline__ int run_step(int i, int v, int WK, int lr = 0) {
    if (R == 0) return (((i >> lr) * WK + v) << lr) + (i & ((1 << lr) - 1));
    return ((i / R) * WK + v) * R + i % R;
}

template <int R, int U>
__device__ __forceinline__ void run_load_w(uint4 (&a)[U][2], int i0, int v, int WK, int groups, int chunks,
                                           const uint4* const (&wr)[2], int lr) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = run_step<R>(i0 + u, v, WK, lr), c = 4 * q + t;
        const bool in = q < groups && c < chunks;
        a[u][0] = in ? __ldg(wr[0] + c) : make_uint4(0, 0, 0, 0);
        a[u][1] = in ? __ldg(wr[1] + c) : make_uint4(0, 0, 0, 0);
    }
}

template <int R, int U>
__device__ __forceinline__ void run_load_x(uint4 (&b)[U], int i0, int v, int WK, int groups, int chunks,
                                           const uint4* xr, int lr) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = run_step<R>(i0 + u, v, WK, lr), c = 4 * q + t;
        b[u] = q < groups && c < chunks && xr ? __ldg(xr + c) : make_uint4(0, 0, 0, 0);
    }
}

template <int U>
__device__ __forceinline__ void run_mma(float (&acc)[4], const uint4 (&a)[U][2], const uint4 (&b)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint4 &r0 = a[u][0], &r1 = a[u][1], &x = b[u];
        mma_bf16(acc, r0.x, r1.x, r0.y, r1.y, x.x, x.y);
        mma_bf16(acc, r0.z, r1.z, r0.w, r1.w, x.z, x.w);
    }
}

template <int R, int U>
__device__ __forceinline__ void gemv_run_impl(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                              float* __restrict__ y, int M, int N, int K, int lr) {
    __shared__ float red[GEMV_MAX_WK][16][8];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, v = threadIdx.y, WK = blockDim.y;
    const int row0 = blockIdx.x * 16, chunks = K / 8, groups = (chunks + 3) / 4;
    const uint4* wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) wr[h] = reinterpret_cast<const uint4*>(w) + (long long)min(row0 + g + 8 * h, N - 1) * chunks;
    const uint4* xr = g < M ? reinterpret_cast<const uint4*>(x) + (long long)g * chunks : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 pa[U][2], na[U][2], pb[U], nb[U];
    run_load_w<R, U>(pa, 0, v, WK, groups, chunks, wr, lr);
    run_load_w<R, U>(na, U, v, WK, groups, chunks, wr, lr);
    pdl_wait();
    pdl_launch_dependents();
    run_load_x<R, U>(pb, 0, v, WK, groups, chunks, xr, lr);
#pragma unroll 1
    for (int i0 = 0; run_step<R>(i0, v, WK, lr) < groups; i0 += 2 * U) {
        if (i0 != 0) run_load_w<R, U>(na, i0 + U, v, WK, groups, chunks, wr, lr);
        run_load_x<R, U>(nb, i0 + U, v, WK, groups, chunks, xr, lr);
        run_mma<U>(acc, pa, pb);
        if (run_step<R>(i0 + U, v, WK, lr) >= groups) break;
        if (run_step<R>(i0 + 2 * U, v, WK, lr) < groups) {
            run_load_w<R, U>(pa, i0 + 2 * U, v, WK, groups, chunks, wr, lr);
            run_load_x<R, U>(pb, i0 + 2 * U, v, WK, groups, chunks, xr, lr);
        }
        run_mma<U>(acc, na, nb);
    }
#pragma unroll
    for (int c = 0; c < 4; c++) red[v][g + 8 * (c >> 1)][2 * t + (c & 1)] = acc[c];
    __syncthreads();
    for (int e = v * 32 + lane; e < 16 * 8; e += 32 * WK) {
        const int r = e / 8, m = e % 8;
        if (row0 + r >= N || m >= M) continue;
        float s = 0.f;
        for (int k = 0; k < WK; k++) s += red[k][r][m];
        y[(long long)m * N + row0 + r] = s;
    }
}

#define RUN_VARIANT(R, U)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MAX_WK)                                          \
        gemv_r##R##_u##U(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int M, int N, int K) {    \
        gemv_run_impl<R, U>(x, w, y, M, N, K, 0);                                                           \
    }
#define RUNTIME_VARIANT(U)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_MAX_WK)                                          \
        gemv_rr_u##U(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int M, int N, int K, int lr) { \
        gemv_run_impl<0, U>(x, w, y, M, N, K, lr);                                                          \
    }
RUNTIME_VARIANT(2)
RUNTIME_VARIANT(4)
RUNTIME_VARIANT(8)

RUN_VARIANT(1, 4)
RUN_VARIANT(1, 8)
RUN_VARIANT(2, 4)
RUN_VARIANT(2, 8)
RUN_VARIANT(4, 4)
RUN_VARIANT(4, 8)
RUN_VARIANT(8, 4)
RUN_VARIANT(8, 8)
