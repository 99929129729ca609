// Tensor-core helpers for MXFP4 weights shared by the expert-major (moe_expert_major.cu) and
// the per-slot decode (moe_slot_mma.cu) GEMVs: FP4 E2M1 codes decoded straight into bf16
// mma.sync fragments, the E8M0 scale applied by one bf16x2 multiply (see moe_expert_major.cu's
// top for why the order of K inside a block does not matter).
#pragma once

#include "common.cuh"

// c += A (16 x 16, row-major bf16) * B (16 x 8, column-major bf16), f32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Nibbles J and J + 4 of w as two bf16 (low half: nibble J), each FP4 * 2^-126
// (moe_expert_major.cu's top says why the subnormal code 1 comes out exact). Shifting nibble J to
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
