// MXFP4 decoding shared by the MoE kernels (docs/gpt-oss.md §3): FP4 E2M1 codes, low nibble
// first, and E8M0 block scales.
#pragma once

#include <stdint.h>

__constant__ float FP4_TABLE[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                    -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// 2^(s - 127), exact: byte 0 is the subnormal 2^-127 (no flush-to-zero in these kernels).
__device__ __forceinline__ float e8m0(uint32_t s) {
    return s == 0 ? 0x1p-127f : __uint_as_float(s << 23);
}
