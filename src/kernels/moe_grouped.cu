// The MXFP4 mixture of experts for many tokens at once (prefill), batched by expert, on tensor
// cores. Same maths as mxfp4_moe.cu (see mxfp4_moe.rs), bf16 activations only:
//
//   moe_group:         the (token, slot) pairs grouped by expert, stably (slot order within an
//                      expert), and cut into tiles of at most BM slots of one expert.
//   moe_grouped_gate_up: per tile and BN gate/up rows: [BM, H] x [H, BN] on tensor cores, bias and
//                      SwiGLU fused -> act [slots, I] as two bf16 arrays hi + lo (hi = bf16(act),
//                      lo = bf16(act - hi): 16 significant bits, so the down projection sees the
//                      activations almost as exactly as the f32 GEMV path), rows in grouped order.
//   moe_grouped_down:  per tile and BN down rows: [BM, I] x [I, BN] for hi and for lo, bias and
//                      routing weight fused -> part [slots, H] f32, rows in slot order;
//                      mxfp4_moe.cu's moe_sum then adds a token's k slots in order
//                      (deterministic, no atomics).
//
// Each expert's weights are read once per tile of its slots instead of once per slot, and each
// step of 32 along K dequantizes one MXFP4 block per weight row into shared memory as bf16 (exact:
// FP4 values times a power of two) for WMMA 16x16x16 with f32 accumulation. The grid is sized for
// the worst case (slots / BM + experts tiles); tiles past the real count exit at once, so the host
// never waits for the grouping.

#include <mma.h>

#include "common.cuh"
#include "mxfp4.cuh"

using namespace nvcuda;

#define BM 64             // slots per tile
#define BN 128            // weight rows per block (one per thread)
#define LDS 40            // shared row stride in bf16: 32 + 8 keeps WMMA pointers 32-byte aligned
#define LDC (BN + 4)      // shared row stride of the f32 result tile
#define THREADS 128       // 4 warps: 2 along M (32 slots each) x 2 along N (64 rows each)
#define MAX_EXPERTS 1024  // moe_group's shared counters

// Tile t of the grouping: tiles[3t] expert (-1: no tile), tiles[3t + 1] first grouped position,
// tiles[3t + 2] slot count (1..bm). sorted[p] is the slot at grouped position p. bm is the tile
// size: BM for this file's GEMMs, 8 or 16 for moe_expert_major.cu.
// One block of 1024 threads; each warp takes experts w, w + 32, ... and compacts their slots with
// ballots, so the order within an expert is the slot order.
extern "C" __global__ void __launch_bounds__(1024)
    moe_group(const uint32_t* __restrict__ ids, int slots, int n_experts, int* __restrict__ sorted,
              int* __restrict__ tiles, int max_tiles, int bm) {
    __shared__ int start[MAX_EXPERTS + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int e = warp; e < n_experts; e += nwarps) {
        int count = 0;
        for (int base = 0; base < slots; base += 32) {
            const int s = base + lane;
            count += __popc(__ballot_sync(FULL_MASK, s < slots && ids[s] == (uint32_t)e));
        }
        if (lane == 0) start[e] = count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int pos = 0, t = 0;
        for (int e = 0; e < n_experts; e++) {
            const int count = start[e];
            start[e] = pos;
            for (int m = 0; m < count && t < max_tiles; m += bm, t++) {
                tiles[3 * t] = e;
                tiles[3 * t + 1] = pos + m;
                tiles[3 * t + 2] = min(bm, count - m);
            }
            pos += count;
        }
        for (; t < max_tiles; t++) tiles[3 * t] = -1;
    }
    __syncthreads();
    for (int e = warp; e < n_experts; e += nwarps) {
        int pos = start[e];
        for (int base = 0; base < slots; base += 32) {
            const int s = base + lane;
            const bool hit = s < slots && ids[s] == (uint32_t)e;
            const uint32_t mask = __ballot_sync(FULL_MASK, hit);
            if (hit) sorted[pos + __popc(mask & ((1u << lane) - 1))] = s;
            pos += __popc(mask);
        }
    }
}

// Shared memory of a block: the A tiles (hi and, when split, lo) and the B tile of one K step,
// then (reused) the f32 result.
struct Tiles {
    __nv_bfloat16 a[2][BM][LDS];
    __nv_bfloat16 b[BN][LDS];
};
union __align__(128) GemmSmem {
    Tiles in;
    float c[BM][LDC];
};

// The block's result tile c[m][n] = sum_k A[m][k] * W[e][n0 + n][k] for the tile's slots, where
// A = hi (+ lo when SPLIT). This thread loads rows (tid / 4) and (tid / 4 + 32) of A: hi_rows[i]
// and lo_rows[i] (nullptr: zeros), K bf16 values each. W is the packed [E, n_rows, K/32, 16].
template <bool SPLIT>
__device__ __forceinline__ void gemm_tile(GemmSmem& sm, const __nv_bfloat16* const (&hi_rows)[2],
                                          const __nv_bfloat16* const (&lo_rows)[2], int e, int n0,
                                          const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                          int n_rows, int K) {
    constexpr int NA = SPLIT ? 2 : 1;
    __shared__ float lut[16];
    const int tid = threadIdx.x, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const int a_row = tid >> 2, a_chunk = tid & 3;  // A: rows a_row and a_row + 32, 8 values each
    const int kb = K / 32;
    const bool b_on = n0 + tid < n_rows;
    const long long w_row = (long long)e * n_rows + n0 + tid;
    if (tid < 16) lut[tid] = FP4_TABLE[tid];

    uint4 a_reg[NA][2], b_reg = make_uint4(0, 0, 0, 0);
    uint32_t s_reg = 127;
    auto load = [&](int g) {
#pragma unroll
        for (int h = 0; h < NA; h++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const __nv_bfloat16* row = h == 0 ? hi_rows[i] : lo_rows[i];
                a_reg[h][i] = row ? __ldg(reinterpret_cast<const uint4*>(row + 32 * g) + a_chunk) : make_uint4(0, 0, 0, 0);
            }
        if (b_on) {
            b_reg = __ldg(reinterpret_cast<const uint4*>(blocks) + w_row * kb + g);
            s_reg = __ldg(scales + w_row * kb + g);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) wmma::fill_fragment(acc[i][j], 0.f);

    load(0);
#pragma unroll 1
    for (int g = 0; g < kb; g++) {
        __syncthreads();  // the previous step's fragments are loaded; lut is set
#pragma unroll
        for (int h = 0; h < NA; h++)
#pragma unroll
            for (int i = 0; i < 2; i++) *reinterpret_cast<uint4*>(&sm.in.a[h][a_row + 32 * i][8 * a_chunk]) = a_reg[h][i];
        {
            const float scale = e8m0(s_reg);
            const uint32_t words[4] = {b_reg.x, b_reg.y, b_reg.z, b_reg.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t packed[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint32_t byte = (words[q] >> (8 * i)) & 0xFF;
                    const __nv_bfloat162 pair =
                        __floats2bfloat162_rn(lut[byte & 0xF] * scale, lut[byte >> 4] * scale);
                    packed[i] = *reinterpret_cast<const uint32_t*>(&pair);
                }
                *reinterpret_cast<uint4*>(&sm.in.b[tid][8 * q]) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            }
        }
        __syncthreads();
        if (g + 1 < kb) load(g + 1);
#pragma unroll
        for (int kk = 0; kk < 32; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[4];
#pragma unroll
            for (int j = 0; j < 4; j++) wmma::load_matrix_sync(fb[j], &sm.in.b[64 * wn + 16 * j][kk], LDS);
#pragma unroll
            for (int h = 0; h < NA; h++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
                for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sm.in.a[h][32 * wm + 16 * i][kk], LDS);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
        }
    }
    __syncthreads();  // done with the A/B tiles: the result tile reuses their memory
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            wmma::store_matrix_sync(&sm.c[32 * wm + 16 * i][64 * wn + 16 * j], acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
}

// grid (max_tiles, ceil(2I / BN)). x [tokens, H] bf16; act [slots, I] bf16 in grouped order.
extern "C" __global__ void __launch_bounds__(THREADS)
    moe_grouped_gate_up(const __nv_bfloat16* __restrict__ x, const int* __restrict__ sorted,
                        const int* __restrict__ tiles, const uint8_t* __restrict__ blocks,
                        const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                        __nv_bfloat16* __restrict__ act_hi, __nv_bfloat16* __restrict__ act_lo, int k, int hidden,
                        int inter, float limit, float alpha) {
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int n0 = blockIdx.y * BN, n_rows = 2 * inter;
    __shared__ GemmSmem sm;
    const __nv_bfloat16* rows[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int m = (threadIdx.x >> 2) + 32 * i;
        rows[i] = m < count ? x + (long long)(sorted[p0 + m] / k) * hidden : nullptr;
    }
    gemm_tile<false>(sm, rows, rows, e, n0, blocks, scales, n_rows, hidden);
    // Pairs (gate row 2j, up row 2j + 1) -> act column n0 / 2 + j.
    for (int idx = threadIdx.x; idx < BM * BN / 2; idx += THREADS) {
        const int m = idx / (BN / 2), j = idx % (BN / 2), n = n0 + 2 * j;
        if (m >= count || n >= n_rows) continue;
        const long long row = (long long)e * n_rows + n;
        const float gate = fminf(sm.c[m][2 * j] + bias[row], limit);
        const float up = fminf(fmaxf(sm.c[m][2 * j + 1] + bias[row + 1], -limit), limit);
        const float a = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        const __nv_bfloat16 hi = __float2bfloat16_rn(a);
        const long long at = (long long)(p0 + m) * inter + n / 2;
        act_hi[at] = hi;
        act_lo[at] = __float2bfloat16_rn(a - __bfloat162float(hi));
    }
}

// grid (max_tiles, ceil(H / BN)). act_hi/act_lo [slots, I] bf16 in grouped order; part [slots, H]
// f32 in slot order: part[slot, n] = weights[slot] * (dot + bias).
extern "C" __global__ void __launch_bounds__(THREADS)
    moe_grouped_down(const __nv_bfloat16* __restrict__ act_hi, const __nv_bfloat16* __restrict__ act_lo,
                     const int* __restrict__ sorted,
                     const int* __restrict__ tiles, const float* __restrict__ weights,
                     const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                     const float* __restrict__ bias, float* __restrict__ part, int hidden, int inter) {
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int n0 = blockIdx.y * BN;
    __shared__ GemmSmem sm;
    const __nv_bfloat16 *hi[2], *lo[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int m = (threadIdx.x >> 2) + 32 * i;
        hi[i] = m < count ? act_hi + (long long)(p0 + m) * inter : nullptr;
        lo[i] = m < count ? act_lo + (long long)(p0 + m) * inter : nullptr;
    }
    gemm_tile<true>(sm, hi, lo, e, n0, blocks, scales, hidden, inter);
    for (int idx = threadIdx.x; idx < BM * BN; idx += THREADS) {
        const int m = idx / BN, n = idx % BN;
        if (m >= count || n0 + n >= hidden) continue;
        const int slot = sorted[p0 + m];
        part[(long long)slot * hidden + n0 + n] = weights[slot] * (sm.c[m][n] + bias[(long long)e * hidden + n0 + n]);
    }
}
