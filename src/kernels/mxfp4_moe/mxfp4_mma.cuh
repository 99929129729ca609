// Tensor-core helpers for MXFP4 weights shared by the per-slot decode kernels and their slot
// tiles (moe_slot_mma.cu) and the grouped GEMMs (moe_grouped.cu): FP4 E2M1 codes decoded straight
// into bf16 mma.sync fragments (m16n8k16, bf16 in, f32 accumulation), the weight rows as the
// 16-row A operand ("swap AB": the tokens or slots are B's columns).
//
// - In a quad (lanes 4g..4g+3), fragment row g is weight row 2g of the 16-row tile and fragment
//   row g + 8 is row 2g + 1 (so for gate_up a thread ends with the gate AND the up value of pair g:
//   SwiGLU in registers).
// - The dot product does not care in which order K is walked, as long as A and B agree: the two
//   k16 steps of a 32-value word take its nibbles as pairs (j, j + 4) (cheap to decode: one shift
//   apart in both halves of a 32-bit register) and x's values at the same positions (__byte_perm
//   of one 16-byte load of x: b_frag).
// - FP4 E2M1 -> bf16 by bits: sign to bit 15, the 3 magnitude bits to bits 6..8 gives FP4 * 2^-126
//   exactly (code 1, 0.5, lands on the bf16 subnormal 2^-127), then one bf16x2 multiply by
//   2^(s - 1) = 2^126 * 2^(s - 127) applies the E8M0 scale s exactly (s > 128 takes a second
//   multiply, as 2^(s-1) has no bf16; a warp takes that slower decode only for a batch where some
//   scale is 128 or more, which real checkpoints hardly have).
#pragma once

#include "activation.cuh"
#include "mma.cuh"

// a * b on bf16 pairs, rounded to nearest. Before sm_90 there is no mul.bf16x2; fma with an
// addend of -0 is the same operation on every input (x * y + -0 == x * y, also for x * y = +-0),
// one instruction as well (cuda_bf16.hpp lowers __hmul2 the same way there).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
    return d;
}

// Nibbles J and J + 4 of w as two bf16 (low half: nibble J), each FP4 * 2^-126
// (the top of this file says why the subnormal code 1 comes out exact). Shifting nibble J to
// bits 12..15 (and so J + 4 to 28..31) leaves sign and magnitude one mask and one shift from their
// places (Marlin's FP4 decode): three logic ops per pair after the shift, two fewer than masking
// each field at bit 0. The decode is most of these kernels' instructions.
template <int J>
__device__ __forceinline__ uint32_t fp4_pair_bits(uint32_t w) {
    const uint32_t q = w << (12 - 4 * J);
    return (q & 0x80008000u) | ((q & 0x70007000u) >> 6);
}

// The E8M0 scale s as the factor of the decode, f1 = 2^(min(s, 128) - 1) as bf16x2; s itself for
// the rare s > 128, whose second factor is 2^(s - 128). BIG: s may be 128 or more (else the
// factor is one multiply-add: bf16 exponent s + 126 in both halves).
struct Scale {
    uint32_t f1, s;
};
template <bool BIG>
__device__ __forceinline__ Scale scale_of(uint32_t s) {
    if (BIG) return Scale{((min(s, 128u) + 126u) << 7) * 0x10001u, s};
    return Scale{s * 0x00800080u + 0x3F003F00u, s};
}

template <int J, bool BIG>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w, const Scale& sc) {
    uint32_t v = bf16x2_mul(fp4_pair_bits<J>(w), sc.f1);
    if (BIG && sc.s > 128u) v = bf16x2_mul(v, ((sc.s - 1u) << 7) * 0x10001u);
    return v;
}

// x's values at the positions of fp4_pair<J> / fp4_pair<J + 1> of step st (x = 8 bf16 values of one
// lane: words u0 = (x0, x1), u1 = (x2, x3), u2 = (x4, x5), u3 = (x6, x7)): step 0 takes (x0, x4) and
// (x1, x5), step 1 (x2, x6) and (x3, x7).
__device__ __forceinline__ void b_frag(const uint4& u, int st, uint32_t& b0, uint32_t& b1) {
    const uint32_t lo = st == 0 ? u.x : u.y, hi = st == 0 ? u.z : u.w;
    b0 = __byte_perm(lo, hi, 0x5410);
    b1 = __byte_perm(lo, hi, 0x7632);
}

// The epilogues of the grouped GEMMs' "swap AB" tiles (moe_grouped.cu): acc[i][j] is the
// 16 x 8 product of weight rows r0 + 16 i .. (fragment row g = weight row r0 + 16 i + 2 g, row
// g + 8 the next one) with the tile's slots 8 j .. 8 j + 7 (columns 2 t, 2 t + 1: slots 8 j + 2 t
// + c). The tile is `count` slots from grouped position p0 of expert e.

// f(r, m, v0, v1) for each of this lane's output pairs: weight rows r (even) and r + 1, tile
// slot m, values v0 and v1; rows from n_rows on and slots from count on are skipped.
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_each_pair(const float (&acc)[MT][NT][4], int r0, int n_rows, int count, F f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const int r = r0 + 16 * i + 2 * g;
        if (r >= n_rows) continue;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int m = 8 * j + 2 * t + c;
                if (m < count) f(r, m, acc[i][j][c], acc[i][j][2 + c]);
            }
    }
}

// gate_up rows come in pairs (gate 2 j, up 2 j + 1): bias, clamped SwiGLU -> act column r / 2 of
// the slot's grouped row, as bf16 hi + lo (hi = bf16(a), lo = bf16(a - hi)).
template <int MT, int NT>
__device__ __forceinline__ void store_gate_up(const float (&acc)[MT][NT][4], int r0, int n_rows, int e, int p0,
                                              int count, const float* __restrict__ bias,
                                              __nv_bfloat16* __restrict__ act_hi, __nv_bfloat16* __restrict__ act_lo,
                                              int inter, float limit, float alpha) {
    const float* b = bias + (long long)e * n_rows;
    for_each_pair(acc, r0, n_rows, count, [&](int r, int m, float v_gate, float v_up) {
        const float a = swiglu_clamped(v_gate + b[r], v_up + b[r + 1], limit, alpha);
        const __nv_bfloat16 h = __float2bfloat16_rn(a);
        const long long at = (long long)(p0 + m) * inter + r / 2;
        act_hi[at] = h;
        act_lo[at] = bf16_lo(a, h);
    });
}

// down rows: part[slot, r] = weights[slot] * (dot + bias), f32, rows in slot order.
template <int MT, int NT>
__device__ __forceinline__ void store_down(const float (&acc)[MT][NT][4], int r0, int hidden, int e, int p0, int count,
                                           const int* __restrict__ sorted, const float* __restrict__ weights,
                                           const float* __restrict__ bias, float* __restrict__ part) {
    const float* b = bias + (long long)e * hidden;
    for_each_pair(acc, r0, hidden, count, [&](int r, int m, float v0, float v1) {
        const int slot = sorted[p0 + m];
        const float w = weights[slot];
        // Rows r and r + 1 are adjacent (H is even): one 8-byte store.
        *reinterpret_cast<float2*>(part + (long long)slot * hidden + r) = make_float2(w * (v0 + b[r]), w * (v1 + b[r + 1]));
    });
}
