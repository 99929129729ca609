// The MXFP4 mixture of experts for small batches (a few to a few dozen tokens per decode step),
// expert-major: same maths as mxfp4_moe.cu (see mod.rs), bf16 x only.
//
// moe_group (moe_grouped.cu) sorts the (token, slot) pairs by expert and cuts them into tiles of
// at most 8 NT slots of one expert. Then, per (tile, block of weight rows), every weight row of the
// expert is read from memory once and dotted with all the tile's slots:
//
//   moe_em_gate_up: x rows of the tile's slots against the expert's gate/up rows, bias and clamped
//                   SwiGLU fused -> act [slots, I] as bf16 hi + lo (hi = bf16(a), lo = bf16(a - hi):
//                   16 significant bits, like moe_grouped.cu), rows in grouped order.
//   moe_em_down:    act rows (hi and lo) against the down rows, bias and routing weight fused ->
//                   part [slots, H] f32 in slot order; mxfp4_moe.cu's moe_sum adds a token's k
//                   slots in order (deterministic, no atomics).
//
// The products run on tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulation) with the weight
// rows as the 16-row A operand and the tile's slots as the 8 columns of B ("swap AB"): a warp owns
// MT tiles of 16 weight rows over all of K, so nothing is reduced across warps. The MXFP4 weights
// go straight from global memory into A fragments:
//
// - In a quad (lanes 4g..4g+3) lane t reads word t (values 8t..8t+7) of each 32-value block of its
//   two rows; fragment row g is weight row 2g of the 16-row tile and fragment row g + 8 is row 2g + 1
//   (so for gate_up a thread ends with the gate AND the up value of pair g: SwiGLU in registers).
// - The dot product does not care in which order K is walked, as long as A and B agree: the two
//   k16 steps of a block take the word's nibbles as pairs (j, j + 4) (cheap to decode: one shift
//   apart in both halves of a 32-bit register) and x's values at the same positions
//   (__byte_perm of one 16-byte load of x).
// - FP4 E2M1 -> bf16 by bits: sign to bit 15, the 3 magnitude bits to bits 6..8 gives FP4 * 2^-126
//   exactly (code 1, 0.5, lands on the bf16 subnormal 2^-127), then one bf16x2 multiply by
//   2^(s - 1) = 2^126 * 2^(s - 127) applies the E8M0 scale s exactly (s > 128 takes a second
//   multiply, as 2^(s-1) has no bf16; a warp takes that slower decode only for a batch where
//   some scale is 128 or more, which real checkpoints hardly have).
//
// No shared memory and no block-level sync. The grid is sized for the worst case (slots / (8 NT) +
// experts tiles); tiles past the real count exit at once, so the host never waits for the grouping
// and the launches can be captured in a CUDA graph.

#include "common.cuh"
#include "mxfp4_mma.cuh"

#define EM_WARPS 4  // warps per block (each MT tiles of 16 weight rows over all of K)


// One batch of U blocks of 32 along K: this lane's word of each of its 2 MT rows' blocks, their
// scales, and its 8 values of each block of its slot rows (hi, and lo with SPLIT).
template <int MT, int NT, int U, bool SPLIT>
struct Batch {
    uint32_t w[U][MT][2], s[U][MT][2];
    uint4 xh[U][NT], xl[U][SPLIT ? NT : 1];
};

// Blocks b0 .. b0 + U - 1; zeros past kb, for rows that are off (rv) and for absent slots.
// Narrow (WIDE false): lane t of a quad reads word t of each block b0 + u (4-byte loads; batch
// entry u is block b0 + u). WIDE (U a multiple of 4): lane t reads the whole block b0 + 4v + t of
// each of its rows with one 16-byte load, and batch entry u = 4v + q is that block's word q (x
// likewise at values 8q .. 8q + 7 of the lane's block). The dot product does not care: A and B
// walk K in the same permuted order, and each k16 step still pairs a lane's weights with its x.
// WIDE issues a quarter of the weight load instructions, each moving four times the bytes.
template <int MT, int NT, int U, bool SPLIT, bool WIDE>
__device__ __forceinline__ void load_batch(Batch<MT, NT, U, SPLIT>& bt, int b0, int kb, const uint32_t* const (&wp)[MT][2],
                                           const uint8_t* const (&sp)[MT][2], const bool (&rv)[MT][2],
                                           const __nv_bfloat16* const (&hi)[NT],
                                           const __nv_bfloat16* const (&lo)[NT]) {
    const int t = threadIdx.x & 3;
    const uint4 z = make_uint4(0, 0, 0, 0);
    if (WIDE) {
#pragma unroll
        for (int v = 0; v < U / 4; v++) {
            const int b = b0 + 4 * v + t;
            const bool in = b < kb;
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const bool on = in && rv[i][h];
                    // wp points at word t of the row's block 0: the row starts t words before.
                    const uint4 w = on ? __ldg(reinterpret_cast<const uint4*>(wp[i][h] - t) + b) : z;
                    const uint32_t s = on ? __ldg(sp[i][h] + b) : 127u;
                    bt.w[4 * v][i][h] = w.x;
                    bt.w[4 * v + 1][i][h] = w.y;
                    bt.w[4 * v + 2][i][h] = w.z;
                    bt.w[4 * v + 3][i][h] = w.w;
#pragma unroll
                    for (int q = 0; q < 4; q++) bt.s[4 * v + q][i][h] = s;
                }
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    bt.xh[4 * v + q][j] =
                        in && hi[j] ? __ldg(reinterpret_cast<const uint4*>(hi[j] + 32 * b + 8 * q)) : z;
                    if (SPLIT)
                        bt.xl[4 * v + q][j] =
                            in && lo[j] ? __ldg(reinterpret_cast<const uint4*>(lo[j] + 32 * b + 8 * q)) : z;
                }
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int b = b0 + u;
        const bool in = b < kb;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const bool on = in && rv[i][h];
                bt.w[u][i][h] = on ? __ldg(wp[i][h] + 4 * b) : 0u;
                bt.s[u][i][h] = on ? __ldg(sp[i][h] + b) : 127u;
            }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            bt.xh[u][j] = in && hi[j] ? __ldg(reinterpret_cast<const uint4*>(hi[j] + 32 * b + 8 * t)) : z;
            if (SPLIT) bt.xl[u][j] = in && lo[j] ? __ldg(reinterpret_cast<const uint4*>(lo[j] + 32 * b + 8 * t)) : z;
        }
    }
}

// acc += the batch's products (zeros contribute nothing). BIG: some scale of the batch may be 128
// or more (the slow decode).
template <bool BIG, int MT, int NT, int U, bool SPLIT>
__device__ __forceinline__ void mma_batch(float (&acc)[MT][NT][4], const Batch<MT, NT, U, SPLIT>& bt) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        Scale sc[MT][2];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) sc[i][h] = scale_of<BIG>(bt.s[u][i][h]);
#pragma unroll
        for (int st = 0; st < 2; st++) {
            uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                b_frag(bt.xh[u][j], st, bh[j][0], bh[j][1]);
                if (SPLIT) b_frag(bt.xl[u][j], st, bl[j][0], bl[j][1]);
            }
#pragma unroll
            for (int i = 0; i < MT; i++) {
                uint32_t a[4];
                if (st == 0) {
                    a[0] = fp4_pair<0, BIG>(bt.w[u][i][0], sc[i][0]);
                    a[1] = fp4_pair<0, BIG>(bt.w[u][i][1], sc[i][1]);
                    a[2] = fp4_pair<1, BIG>(bt.w[u][i][0], sc[i][0]);
                    a[3] = fp4_pair<1, BIG>(bt.w[u][i][1], sc[i][1]);
                } else {
                    a[0] = fp4_pair<2, BIG>(bt.w[u][i][0], sc[i][0]);
                    a[1] = fp4_pair<2, BIG>(bt.w[u][i][1], sc[i][1]);
                    a[2] = fp4_pair<3, BIG>(bt.w[u][i][0], sc[i][0]);
                    a[3] = fp4_pair<3, BIG>(bt.w[u][i][1], sc[i][1]);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16(acc[i][j], a, bh[j][0], bh[j][1]);
                    if (SPLIT) mma_bf16(acc[i][j], a, bl[j][0], bl[j][1]);
                }
            }
        }
    }
}

// Whether any lane of the warp has a scale of 128 or more in the batch (warp-uniform).
template <int MT, int NT, int U, bool SPLIT>
__device__ __forceinline__ bool batch_big(const Batch<MT, NT, U, SPLIT>& bt) {
    uint32_t any = 0;
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) any |= bt.s[u][i][h];
    return __any_sync(FULL_MASK, any & 0x80u);
}

// acc += the batch's products, by the fast decode unless a scale needs the slow one.
template <int MT, int NT, int U, bool SPLIT>
__device__ __forceinline__ void mma_batch_any(float (&acc)[MT][NT][4], const Batch<MT, NT, U, SPLIT>& bt) {
    if (batch_big(bt)) {
        mma_batch<true>(acc, bt);
    } else {
        mma_batch<false>(acc, bt);
    }
}

// One warp: acc[i][j] += rows (16 i .. 16 i + 15 of the warp's first row `row0`, of the packed
// [*, K/32, 16] matrix) dotted with the slots of n-tile j (hi[j]: this lane's slot row of K bf16
// values, nullptr for none; with SPLIT also lo[j], the low halves). rows_left: rows of the matrix
// from row0 on (rows past it read as zeros). kb = K / 32.
template <int MT, int NT, int U, bool SPLIT, bool WIDE>
__device__ __forceinline__ void em_rows(float (&acc)[MT][NT][4], const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, long long row0, int rows_left,
                                        int kb, const __nv_bfloat16* const (&hi)[NT],
                                        const __nv_bfloat16* const (&lo)[NT]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t* wp[MT][2];
    const uint8_t* sp[MT][2];
    bool rv[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * i + 2 * g + h;
            rv[i][h] = r < rows_left;
            const long long row = row0 + (rv[i][h] ? r : 0);
            wp[i][h] = reinterpret_cast<const uint32_t*>(blocks) + row * kb * 4 + t;
            sp[i][h] = scales + row * kb;
        }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;

    // Two batches of U blocks in flight: the next one's loads are issued before this one's
    // arithmetic. The loop stays rolled (two batches per turn, static buffers).
    Batch<MT, NT, U, SPLIT> p, q;
    load_batch<MT, NT, U, SPLIT, WIDE>(p, 0, kb, wp, sp, rv, hi, lo);
#pragma unroll 1
    for (int b0 = 0; b0 < kb; b0 += 2 * U) {
        load_batch<MT, NT, U, SPLIT, WIDE>(q, b0 + U, kb, wp, sp, rv, hi, lo);
        mma_batch_any(acc, p);
        if (b0 + U >= kb) break;
        if (b0 + 2 * U < kb) load_batch<MT, NT, U, SPLIT, WIDE>(p, b0 + 2 * U, kb, wp, sp, rv, hi, lo);
        mma_batch_any(acc, q);
    }
}

// grid (max_tiles, ceil(2I / (16 MT EM_WARPS))), block 32 EM_WARPS. x [tokens, H] bf16; act_hi/lo
// [slots, I] bf16 in grouped order. Tiles from moe_group with tile size 8 NT.
template <int MT, int NT, int U, bool WIDE>
__device__ __forceinline__ void em_gate_up(const __nv_bfloat16* __restrict__ x, const int* __restrict__ sorted,
                                           const int* __restrict__ tiles, const uint8_t* __restrict__ blocks,
                                           const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                           __nv_bfloat16* __restrict__ act_hi, __nv_bfloat16* __restrict__ act_lo,
                                           int k, int hidden, int inter, float limit, float alpha) {
    pdl_wait();
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int n_rows = 2 * inter;
    const int r0 = (blockIdx.y * EM_WARPS + (threadIdx.x >> 5)) * 16 * MT;
    if (r0 >= n_rows) return;  // whole warps: no block-level sync below
    const int g = (threadIdx.x & 31) >> 2;
    const __nv_bfloat16* rows[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int m = 8 * j + g;
        rows[j] = m < count ? x + (long long)(sorted[p0 + m] / k) * hidden : nullptr;
    }
    float acc[MT][NT][4];
    em_rows<MT, NT, U, false, WIDE>(acc, blocks, scales, (long long)e * n_rows + r0, n_rows - r0, hidden / 32, rows, rows);
    store_gate_up(acc, r0, n_rows, e, p0, count, bias, act_hi, act_lo, inter, limit, alpha);
}

// grid (max_tiles, ceil(H / (16 MT EM_WARPS))). part[slot, n] = weights[slot] * (dot + bias), f32,
// rows in slot order.
template <int MT, int NT, int U, bool WIDE>
__device__ __forceinline__ void em_down(const __nv_bfloat16* __restrict__ act_hi,
                                        const __nv_bfloat16* __restrict__ act_lo, const int* __restrict__ sorted,
                                        const int* __restrict__ tiles, const float* __restrict__ weights,
                                        const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                        const float* __restrict__ bias, float* __restrict__ part, int hidden,
                                        int inter) {
    pdl_wait();
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int r0 = (blockIdx.y * EM_WARPS + (threadIdx.x >> 5)) * 16 * MT;
    if (r0 >= hidden) return;
    const int g = (threadIdx.x & 31) >> 2;
    const __nv_bfloat16 *hi[NT], *lo[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int m = 8 * j + g;
        hi[j] = m < count ? act_hi + (long long)(p0 + m) * inter : nullptr;
        lo[j] = m < count ? act_lo + (long long)(p0 + m) * inter : nullptr;
    }
    float acc[MT][NT][4];
    em_rows<MT, NT, U, true, WIDE>(acc, blocks, scales, (long long)e * hidden + r0, hidden - r0, inter / 32, hi, lo);
    store_down(acc, r0, hidden, e, p0, count, sorted, weights, bias, part);
}

// Variants _m{MT}_n{NT}_u{U}: warps of MT tiles of 16 weight rows (blocks of 64 MT rows), tiles of
// 8 NT slots, batches of U blocks along K (two batches in flight per warp). gpu.rs picks one
// (EXPERT_MAJOR_DEFAULT): more loads in flight per warp against more registers (fewer warps per
// SM); fewer rows per warp give more blocks when few experts are in use, but read x more often.
#define EM_VARIANT(MT, NT, U, WIDE, SUF)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * EM_WARPS) moe_em_gate_up_m##MT##_n##NT##_u##U##SUF(                 \
        const __nv_bfloat16* x, const int* sorted, const int* tiles, const uint8_t* blocks,                  \
        const uint8_t* scales, const float* bias, __nv_bfloat16* act_hi, __nv_bfloat16* act_lo, int k,        \
        int hidden, int inter, float limit, float alpha) {                                                   \
        em_gate_up<MT, NT, U, WIDE>(x, sorted, tiles, blocks, scales, bias, act_hi, act_lo, k, hidden, inter,      \
                              limit, alpha);                                                                 \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * EM_WARPS) moe_em_down_m##MT##_n##NT##_u##U##SUF(                    \
        const __nv_bfloat16* act_hi, const __nv_bfloat16* act_lo, const int* sorted, const int* tiles,      \
        const float* weights, const uint8_t* blocks, const uint8_t* scales, const float* bias, float* part, \
        int hidden, int inter) {                                                                             \
        em_down<MT, NT, U, WIDE>(act_hi, act_lo, sorted, tiles, weights, blocks, scales, bias, part, hidden, inter); \
    }

EM_VARIANT(1, 1, 4, false, )
EM_VARIANT(2, 1, 2, false, )
EM_VARIANT(2, 1, 4, false, )
EM_VARIANT(2, 2, 1, false, )
EM_VARIANT(2, 2, 2, false, )
// 16-byte loads (WIDE): suffix w.
EM_VARIANT(1, 1, 4, true, w)
EM_VARIANT(2, 1, 4, true, w)
EM_VARIANT(1, 2, 4, true, w)
EM_VARIANT(2, 2, 4, true, w)
EM_VARIANT(1, 1, 8, true, w)
