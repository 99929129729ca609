// The int8 tensor-core GEMV machinery that ct_gemv.cu (compressed-tensors) and gguf_gemv.cu
// (GGUF block formats) share: ct_gemv.cu's header describes the design ("swap AB": 16 weight
// rows as mma's A operand, up to 8 rows of x as B's columns; WK warps along K adding their partial
// sums in warp order).
#pragma once

#include "common.cuh"

#define CT_MAX_WK 8
#define CT_MAX_ROWS 8

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weight rows of the warp's tiles: rows past N read row N − 1 (their results are not stored), so
// the mma needs no branch.
template <int MT>
__device__ __forceinline__ void tile_rows(const uint4* (&wr)[MT][2], const void* w, int row0, int N,
                                          int row_vecs) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wr[i][h] = reinterpret_cast<const uint4*>(w) + (long long)min(row0 + 16 * i + g + 8 * h, N - 1) * row_vecs;
}

// The warps' partial sums, 16 MT weight rows × 8 rows of x each, added in warp order: the order
// depends on WK alone. `finish` turns a row's sum into its output.
template <typename Acc, int MT, typename Finish>
__device__ __forceinline__ void reduce_store(Acc (&red)[CT_MAX_WK / MT][16 * MT][8], const Acc (&acc)[MT][4],
                                             float* __restrict__ y, int row0, int M, int N, Finish finish) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, wk = threadIdx.y, WK = blockDim.y;
    // Fragment: c0, c1 row g, columns 2t, 2t + 1; c2, c3 row g + 8.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) red[wk][16 * i + g + 8 * (c >> 1)][2 * t + (c & 1)] = acc[i][c];
    __syncthreads();
    for (int e = wk * 32 + lane; e < 16 * MT * 8; e += 32 * WK) {
        const int r = e / 8, m = e % 8;
        if (row0 + r >= N || m >= M) continue;
        Acc s = 0;
        for (int v = 0; v < WK; v++) s += red[v][r][m];
        y[(long long)m * N + row0 + r] = finish(s, m, row0 + r);
    }
}

// A 16-byte weight load the compiler may not move past a barrier: the first batches are issued
// before x is quantized (two barriers), so that memory works while the block does.
__device__ __forceinline__ uint4 ldg_pinned(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// The main loop of the GEMVs: batches p and n in flight from the start (loaded before), each one
// consumed (`mma(batch, q0)`) is reloaded (`load(batch, q0)`) with the batch after next; quad
// steps go wk, wk + WK, … in batches of `step` = U · WK.
template <typename Batch, typename Load, typename Mma>
__device__ __forceinline__ void double_buffered(Batch& p, Batch& n, int wk, int step, int groups, Load load, Mma mma) {
#pragma unroll 1
    for (int q0 = wk; q0 < groups; q0 += 2 * step) {
        mma(p, q0);
        if (q0 + step >= groups) break;
        if (q0 + 2 * step < groups) load(p, q0 + 2 * step);
        mma(n, q0 + step);
        if (q0 + 3 * step < groups) load(n, q0 + 3 * step);
    }
}

template <typename Acc, int MT>
__device__ __forceinline__ void zero_acc(Acc (&acc)[MT][4]) {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = 0;
}
