// The FP8 KV cache's format on the device (src/kernels/kv_fp8.rs has the definition and the
// argument): a (slot, kv head) row is d E4M3 codes and one E8M0 scale byte e, value
// E4M3[code] * 2^(e - 127), the scale the smallest power of two that fits the row's largest
// magnitude within 448. The CPU versions in kv_fp8.rs give the same bits.
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

// The scale byte of a row whose largest magnitude is amax (kv_fp8.rs: scale_byte).
__device__ __forceinline__ uint8_t fp8_scale_byte(float amax) {
    const uint32_t bits = __float_as_uint(fabsf(amax));
    int s = (int)(bits >> 23) - 127 - 8 + ((bits & 0x7fffff) > 0x600000 ? 1 : 0);
    s = min(max(s, -120), 120);
    return (uint8_t)(s + 127);
}

// 2^(byte - 127), exactly.
__device__ __forceinline__ float fp8_scale_value(uint8_t byte) { return __uint_as_float((uint32_t)byte << 23); }

// x * 2^-s (exact) as an E4M3 code, to nearest even, saturating at +-448.
__device__ __forceinline__ uint8_t fp8_quantize(float x, float inv_scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(__fmul_rn(x, inv_scale), __NV_SATFINITE, __NV_E4M3);
}

// Two codes (the lower-addressed in the low byte) times a scale, as a bf16 pair: exact (E4M3 to
// f16 and f16 to f32 are exact, the product is a power-of-two shift, and it fits bf16).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t codes, float scale) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
    return *reinterpret_cast<const uint32_t*>(&b);
}
