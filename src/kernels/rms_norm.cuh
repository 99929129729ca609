// The per-element steps of add_rms_norm_bf16 (layer_norm_act.cu), shared with the GEMV that runs
// the same norm as its prologue (gemv_bf16.cu, NORM): both must give a row the same bits, so
// both compute it from these functions in the same order (see add_rms_norm_bf16's header).
#pragma once

#include "common.cuh"

#define NORM_MAX_THREADS 1024
#define NORM_VEC 4  // float4s a thread keeps in registers: rows up to 16,384 wide take the fast path

// v = x + (delta + bias) at float4 i of a row (delta, bias optional: v = x + delta, or v = x).
__device__ __forceinline__ float4 norm_input(const float* __restrict__ x, const float* __restrict__ delta,
                                             const float* __restrict__ bias, long long row, int i) {
    float4 a = reinterpret_cast<const float4*>(x + row)[i];
    if (delta) {
        float4 d = reinterpret_cast<const float4*>(delta + row)[i];
        if (bias) {
            const float4 b = reinterpret_cast<const float4*>(bias)[i];
            d = make_float4(d.x + b.x, d.y + b.y, d.z + b.z, d.w + b.w);
        }
        a = make_float4(a.x + d.x, a.y + d.y, a.z + d.z, a.w + d.w);
    }
    return a;
}

// A thread's running sum of squares, one float4 more (fused multiply-adds, in order).
__device__ __forceinline__ float norm_square_sum(float s, const float4& a) {
    s = __fmaf_rn(a.x, a.x, s);
    s = __fmaf_rn(a.y, a.y, s);
    s = __fmaf_rn(a.z, a.z, s);
    return __fmaf_rn(a.w, a.w, s);
}

// 1 / rms from the row's sum of squares.
__device__ __forceinline__ float norm_inverse(float total, int n, float eps) { return rsqrtf(total / n + eps); }

// v / rms * w, unrounded.
__device__ __forceinline__ float4 norm_scale(const float4& v, float inv, const float4& g) {
    return make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
}

// Four bf16 values as 8 bytes.
__device__ __forceinline__ uint2 norm_pack_bf16(const float4& h) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(h.x, h.y), hi = __floats2bfloat162_rn(h.z, h.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    return packed;
}

// The threads add_rms_norm_bf16 runs a row of n with (layer_norm_act.rs launches it so): a thread
// per 4 values in whole warps, 32 to 1,024. Its fast path (float4s in registers) holds when
// n % 4 == 0 and n / 4 <= threads * NORM_VEC.
__host__ __device__ __forceinline__ int norm_threads(int n) {
    const int t = ((n + 3) / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : (t > NORM_MAX_THREADS ? NORM_MAX_THREADS : t);
}
