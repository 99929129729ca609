// The 8-bit KV caches' formats on the device (src/kernels/kv_fp8.rs has the definitions and the
// argument): a (slot, kv head) row is d codes and one E8M0 scale byte e, value
// code * 2^(e - 127), the scale the smallest power of two that fits the row's largest magnitude
// within the codes' largest (E4M3: 448; INT8: 127). The CPU versions in kv_fp8.rs give the same
// bits.
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

// The scale byte of a row whose largest magnitude is amax (kv_fp8.rs: Codes::scale_byte).
template <bool INT8>
__device__ __forceinline__ uint8_t kv_scale_byte(float amax) {
    const uint32_t bits = __float_as_uint(fabsf(amax));
    const int m = INT8 ? 6 : 8;
    const uint32_t g = INT8 ? 0x7e0000u : 0x600000u;
    int s = (int)(bits >> 23) - 127 - m + ((bits & 0x7fffff) > g ? 1 : 0);
    s = min(max(s, -120), 120);
    return (uint8_t)(s + 127);
}

// 2^(byte - 127), exactly.
__device__ __forceinline__ float fp8_scale_value(uint8_t byte) { return __uint_as_float((uint32_t)byte << 23); }

// x * 2^-s (exact) as a code, to nearest even, saturating (E4M3 at +-448; INT8 at +-127, NaN as 0).
template <bool INT8>
__device__ __forceinline__ uint8_t kv_quantize(float x, float inv_scale) {
    const float y = __fmul_rn(x, inv_scale);
    if (INT8) return isnan(y) ? 0 : (uint8_t)(int8_t)max(-127, min(127, __float2int_rn(y)));
    return (uint8_t)__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
}

// Two codes (the lower-addressed in the low byte) times a scale, as a bf16 pair: exact (E4M3 to
// f16 and f16 to f32 are exact, the product is a power-of-two shift, and it fits bf16).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t codes, float scale) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
    return *reinterpret_cast<const uint32_t*>(&b);
}

// The same for two INT8 codes (exact: up to 7 bits and a sign, a power-of-two scale).
__device__ __forceinline__ uint32_t int8x2_to_bf16x2(uint16_t codes, float scale) {
    const float lo = (float)(int8_t)(codes & 0xff), hi = (float)(int8_t)(codes >> 8);
    const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(lo, scale), __fmul_rn(hi, scale));
    return *reinterpret_cast<const uint32_t*>(&b);
}

template <bool INT8>
__device__ __forceinline__ uint32_t kv_codes_to_bf16x2(uint16_t codes, float scale) {
    return INT8 ? int8x2_to_bf16x2(codes, scale) : fp8x2_to_bf16x2(codes, scale);
}
