// An experiment kept for scripts/analysis/moe_decode_kernels.py (not built into inferno): the
// MXFP4 experts for single-token decode, per (token, slot) like mxfp4_moe.cu's GEMVs (same
// maths, see mxfp4_moe.rs), on integer dot products.
//
// Result on an H100 (moe_decode_kernels.py): 36.4 us per layer against moe_slot_mma.cu's 33, so
// it stays out of inferno. The idea was that those GEMVs are bound by instruction issue; taking
// moe_slot_mma.cu apart later showed its loads alone take its whole time. Decoding FP4 into bf16 tensor-core fragments costs ~3.6 instructions per weight; here
// 8 codes become 8 int8 (2 x E2M1, exact: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) with 5 byte permutes
// from a 16-entry table held in 4 registers, and dp4a multiplies 4 of them by 4 int8 inputs at
// once: ~2 instructions per weight.
//
// The inputs become int8 for that, per block of 32 values (the blocks the weights' scales cover):
// v ~ d1 q1 + d2 q2 [+ d3 q3], d1 = max|v| / 127, each next piece quantizing what the ones before
// left with d / 254. Two pieces keep an error under max|v| / 64,516 per value (16 bits against
// the block's largest value, more than the 8 bits of a bf16 input carry); three under
// max|v| / 16.4 M, about f32's rounding. Products and sums within a block are exact in int32;
// the block's sum is scaled in f32.
//
// Layout as mxfp4_moe.cu's GEMVs: a block (CUDA's) has WK = ceil(K / 1024) warps along K, lane
// l of warp y owns the 32-value block g = 32 y + l of K and keeps its quantized inputs in
// registers; each row's block g is one 16-byte load (a warp reads 512 contiguous bytes of a
// row). RG groups of warps take the block's rows in turns, RSTEP rows at a time with the next
// step's loads issued before this step's arithmetic.
//
//   moe_dp_gate_up: 64 gate_up rows (32 gate/up pairs) per block: bias, clamped SwiGLU, and the
//                   32 activations, one block of the down projection's input, quantized into
//                   act_q [slots, I/32, 3, 32] int8 + act_d [slots, I/32, 3] f32.
//   moe_dp_down:    32 down rows per block, bias, routing weight -> part [slots, H] f32, which
//                   mxfp4_moe.cu's moe_sum adds in slot order.

#include "common.cuh"
#include "mxfp4.cuh"

#define DP_MAX_WK 8  // warps along K: K <= 8192
#define DP_ACT_PIECES 3

// 8 FP4 codes (low nibble first) -> 8 int8 = 2 x E2M1, in order: v0 holds values 0..3, v1 4..7.
// prmt picks bytes by 3-bit index (bit 3 of a selector nibble means sign replication, so the
// codes are masked): codes 0..7 from the positive half of the table, 8..15 from the negative one,
// then the sign bit chooses between the two, byte by byte.
__device__ __forceinline__ void fp4x8_to_i8(uint32_t q, int& v0, int& v1) {
    constexpr uint32_t P0 = 0x03020100u, P1 = 0x0C080604u;  // 0, 1, 2, 3 | 4, 6, 8, 12
    constexpr uint32_t N0 = 0xFDFEFF00u, N1 = 0xF4F8FAFCu;  // 0, -1, -2, -3 | -4, -6, -8, -12
    const uint32_t m = q & 0x77777777u;
    const uint32_t sel = ((q >> 1) & 0x44444444u) | 0x32103210u;  // byte k: k, or k + 4 if negative
    v0 = (int)__byte_perm(__byte_perm(P0, P1, m), __byte_perm(N0, N1, m), sel);
    v1 = (int)__byte_perm(__byte_perm(P0, P1, m >> 16), __byte_perm(N0, N1, m >> 16), sel >> 16);
}

// One 32-value block of inputs as NP int8 pieces: q[p][j] holds values 4j..4j+3 of piece p, the
// value is sum_p d[p] q[p]. NaN or infinite inputs make d[0] NaN (the block's sums then are NaN).
template <int NP>
__device__ __forceinline__ void quantize32(float (&v)[32], int (&q)[NP][8], float (&d)[NP]) {
    float amax = 0.f;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        amax = fmaxf(amax, fabsf(v[i]));
        finite = finite && isfinite(v[i]);
    }
    float dp = amax / 127.f;
#pragma unroll
    for (int p = 0; p < NP; p++) {
        d[p] = dp;
        const float inv = dp > 0.f ? 1.f / dp : 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t packed = 0;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int qi = max(-127, min(127, __float2int_rn(v[4 * j + u] * inv)));
                v[4 * j + u] = fmaf(-(float)qi, dp, v[4 * j + u]);
                packed |= ((uint32_t)qi & 0xFFu) << (8 * u);
            }
            q[p][j] = (int)packed;
        }
        dp *= 1.f / 254.f;
    }
    if (!finite) d[0] = __int_as_float(0x7FC00000);
}

// The row's block (16 bytes of codes, E8M0 scale s) times the lane's quantized inputs.
template <int NP>
__device__ __forceinline__ float dp_row(const uint4& w, uint32_t s, const int (&q)[NP][8], const float (&d)[NP]) {
    int v[8];
    fp4x8_to_i8(w.x, v[0], v[1]);
    fp4x8_to_i8(w.y, v[2], v[3]);
    fp4x8_to_i8(w.z, v[4], v[5]);
    fp4x8_to_i8(w.w, v[6], v[7]);
    float sum = 0.f;
#pragma unroll
    for (int p = 0; p < NP; p++) {
        int acc = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) acc = __dp4a(v[j], q[p][j], acc);
        sum = fmaf(d[p], (float)acc, sum);
    }
    return sum * (0.5f * e8m0(s));  // the table holds 2 x E2M1
}

template <int RSTEP>
struct DpStep {
    uint4 w[RSTEP];
    uint32_t s[RSTEP];
};

// Rows row0 .. row0 + RSTEP - 1, this lane's block g; zeros past kb (code 0 is +0).
template <int RSTEP>
__device__ __forceinline__ void dp_load(DpStep<RSTEP>& st, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, long long row0, int kb, int g, bool on) {
#pragma unroll
    for (int r = 0; r < RSTEP; r++) {
        const bool in = on && g < kb;
        st.w[r] = in ? __ldg(reinterpret_cast<const uint4*>(blocks) + (row0 + r) * kb + g) : make_uint4(0, 0, 0, 0);
        st.s[r] = in ? __ldg(scales + (row0 + r) * kb + g) : 127u;
    }
}

// The block's ROWS rows from row0 dotted with the lane's inputs: red[z][y][r] for row group z
// (threadIdx.z), warp y along K and row r of the block (only the rows of group z: r = z, z + RG,
// ... in steps of RSTEP). Ends with a block-level sync.
template <int NP, int ROWS, int RSTEP, int RG>
__device__ __forceinline__ void dp_rows(float (&red)[DP_MAX_WK][ROWS], const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, long long row0, int kb,
                                        const int (&q)[NP][8], const float (&d)[NP], bool on, DpStep<RSTEP>& a) {
    constexpr int PER_GROUP = ROWS / RG;  // rows of one group, RSTEP at a time
    const int lane = threadIdx.x, y = threadIdx.y, z = threadIdx.z, g = 32 * y + lane;
    const long long base = row0 + (long long)z * PER_GROUP;
    DpStep<RSTEP> b;
#pragma unroll 1
    for (int r0 = 0; r0 < PER_GROUP; r0 += 2 * RSTEP) {
        dp_load(b, blocks, scales, base + r0 + RSTEP, kb, g, on && r0 + RSTEP < PER_GROUP);
#pragma unroll
        for (int r = 0; r < RSTEP; r++) {
            const float s = warp_sum(dp_row<NP>(a.w[r], a.s[r], q, d));
            if (lane == 0) red[y][z * PER_GROUP + r0 + r] = s;
        }
        if (r0 + RSTEP >= PER_GROUP) break;
        if (r0 + 2 * RSTEP < PER_GROUP) dp_load(a, blocks, scales, base + r0 + 2 * RSTEP, kb, g, on);
#pragma unroll
        for (int r = 0; r < RSTEP; r++) {
            const float s = warp_sum(dp_row<NP>(b.w[r], b.s[r], q, d));
            if (lane == 0) red[y][z * PER_GROUP + r0 + RSTEP + r] = s;
        }
    }
    __syncthreads();
}

// grid (tokens * k, 2I / 64), block (32, WK, RG). x [tokens, H] bf16 -> act_q, act_d (see the top).
template <int NPX, int RSTEP, int RG>
__device__ __forceinline__ void dp_gate_up(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ ids,
                                           const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                           const float* __restrict__ bias, int8_t* __restrict__ act_q,
                                           float* __restrict__ act_d, int k, int n_experts, int hidden, int inter,
                                           float limit, float alpha) {
    __shared__ float red[DP_MAX_WK][64];
    const int lane = threadIdx.x, y = threadIdx.y, g = 32 * y + lane, kb = hidden / 32;
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    const bool on = e < (uint32_t)n_experts;  // off: no contribution (the CPU reference errors)
    const long long row0 = (long long)(on ? e : 0) * 2 * inter + 64 * blockIdx.y;
    DpStep<RSTEP> a;
    dp_load(a, blocks, scales, row0 + (long long)threadIdx.z * (64 / RG), kb, g, on);
    // This lane's block of x, quantized, while the first weights are on their way.
    int q[NPX][8];
    float d[NPX];
    {
        float v[32];
        const __nv_bfloat16* xb = x + (long long)(slot / k) * hidden + 32 * g;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 u = g < kb ? __ldg(reinterpret_cast<const uint4*>(xb) + i) : make_uint4(0, 0, 0, 0);
            const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                v[8 * i + 2 * j] = __uint_as_float(w4[j] << 16);
                v[8 * i + 2 * j + 1] = __uint_as_float(w4[j] & 0xFFFF0000u);
            }
        }
        quantize32<NPX>(v, q, d);
    }
    dp_rows<NPX, 64, RSTEP, RG>(red, blocks, scales, row0, kb, q, d, on, a);
    // Warp (0, 0): lane j is pair j (rows 2j, 2j + 1): its activation, then the block's 32
    // activations quantized like an input block.
    if (y == 0 && threadIdx.z == 0) {
        float act = 0.f;
        if (on) {
            float gs = 0.f, us = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) {
                gs += red[w][2 * lane];
                us += red[w][2 * lane + 1];
            }
            const float gate = fminf(gs + bias[row0 + 2 * lane], limit);
            const float up = fminf(fmaxf(us + bias[row0 + 2 * lane + 1], -limit), limit);
            act = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        }
        const float amax = warp_max(fabsf(act));
        const bool finite = __all_sync(FULL_MASK, isfinite(act));
        const long long blk = (long long)slot * (inter / 32) + blockIdx.y;
        float dp = amax / 127.f;
#pragma unroll
        for (int p = 0; p < DP_ACT_PIECES; p++) {
            const float inv = dp > 0.f ? 1.f / dp : 0.f;
            const int qi = max(-127, min(127, __float2int_rn(act * inv)));
            act = fmaf(-(float)qi, dp, act);
            act_q[(blk * DP_ACT_PIECES + p) * 32 + lane] = (int8_t)qi;
            if (lane == 0) act_d[blk * DP_ACT_PIECES + p] = p == 0 && !finite ? __int_as_float(0x7FC00000) : dp;
            dp *= 1.f / 254.f;
        }
    }
}

// grid (tokens * k, H / 32), block (32, WK, RG). part[slot, r] = weights[slot] * (dot + bias), f32.
template <int RSTEP, int RG>
__device__ __forceinline__ void dp_down(const int8_t* __restrict__ act_q, const float* __restrict__ act_d,
                                        const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                                        const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                        const float* __restrict__ bias, float* __restrict__ part, int n_experts,
                                        int hidden, int inter) {
    __shared__ float red[DP_MAX_WK][32];
    const int lane = threadIdx.x, y = threadIdx.y, g = 32 * y + lane, kb = inter / 32;
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    const bool on = e < (uint32_t)n_experts;
    const long long row0 = (long long)(on ? e : 0) * hidden + 32 * blockIdx.y;
    DpStep<RSTEP> a;
    dp_load(a, blocks, scales, row0 + (long long)threadIdx.z * (32 / RG), kb, g, on);
    int q[DP_ACT_PIECES][8];
    float d[DP_ACT_PIECES];
    const long long blk = (long long)slot * kb + g;
#pragma unroll
    for (int p = 0; p < DP_ACT_PIECES; p++) {
        const bool in = on && g < kb;
        const uint4* src = reinterpret_cast<const uint4*>(act_q + (blk * DP_ACT_PIECES + p) * 32);
        const uint4 u0 = in ? __ldg(src) : make_uint4(0, 0, 0, 0), u1 = in ? __ldg(src + 1) : make_uint4(0, 0, 0, 0);
        q[p][0] = (int)u0.x, q[p][1] = (int)u0.y, q[p][2] = (int)u0.z, q[p][3] = (int)u0.w;
        q[p][4] = (int)u1.x, q[p][5] = (int)u1.y, q[p][6] = (int)u1.z, q[p][7] = (int)u1.w;
        d[p] = in ? act_d[blk * DP_ACT_PIECES + p] : 0.f;
    }
    dp_rows<DP_ACT_PIECES, 32, RSTEP, RG>(red, blocks, scales, row0, kb, q, d, on, a);
    const int r = threadIdx.z * 32 * (int)blockDim.y + y * 32 + lane;
    if (r < 32) {
        float out = 0.f;
        if (on) {
            float dot = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) dot += red[w][r];
            out = weights[slot] * (dot + bias[row0 + r]);
        }
        part[(long long)slot * hidden + 32 * blockIdx.y + r] = out;
    }
}

// Variants: _x{NPX} input pieces of x, _r{RSTEP} rows per step, _g{RG} row groups.
#define DP_VARIANT(NPX, RSTEP, RG)                                                                          \
    extern "C" __global__ void moe_dp_gate_up_x##NPX##_r##RSTEP##_g##RG( \
        const __nv_bfloat16* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales,           \
        const float* bias, int8_t* act_q, float* act_d, int k, int n_experts, int hidden, int inter,         \
        float limit, float alpha) {                                                                          \
        dp_gate_up<NPX, RSTEP, RG>(x, ids, blocks, scales, bias, act_q, act_d, k, n_experts, hidden, inter,  \
                                   limit, alpha);                                                           \
    }
#define DP_DOWN_VARIANT(RSTEP, RG)                                                                          \
    extern "C" __global__ void moe_dp_down_r##RSTEP##_g##RG(          \
        const int8_t* act_q, const float* act_d, const uint32_t* ids, const float* weights,                  \
        const uint8_t* blocks, const uint8_t* scales, const float* bias, float* part, int n_experts,         \
        int hidden, int inter) {                                                                             \
        dp_down<RSTEP, RG>(act_q, act_d, ids, weights, blocks, scales, bias, part, n_experts, hidden, inter); \
    }

DP_VARIANT(2, 2, 2)
DP_VARIANT(2, 2, 4)
DP_VARIANT(2, 4, 2)
DP_VARIANT(3, 2, 2)
DP_VARIANT(3, 2, 4)
DP_DOWN_VARIANT(2, 1)
DP_DOWN_VARIANT(2, 2)
DP_DOWN_VARIANT(4, 1)
DP_DOWN_VARIANT(2, 4)
