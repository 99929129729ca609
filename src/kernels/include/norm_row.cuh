// One row's RMSNorm whose values sit in registers, shared by add_rms_norm_bf16
// (layer_norm_act.cu) and the sum over ranks fused with it (all_reduce.cu): the same
// arithmetic in the same order, so the fused kernel gives the unfused pair's bits.
#pragma once

#include "common.cuh"

#define NORM_MAX_THREADS 1024
#define NORM_VEC 4  // float4s a thread keeps in registers: rows up to 16,384 wide take the fast path

// One row, sum of squares: per thread, then a fixed tree (warp shuffles, then the warps in order).
__device__ __forceinline__ float block_sum(float s, float* partial) {
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0.f;
    for (int v = 0; v < (int)(blockDim.x + 31) / 32; v++) total += partial[v];
    return total;
}

// x + (d + bias[i]): the residual add in front of a norm, the product's bias added to the
// product first (bias may be null).
__device__ __forceinline__ float4 add_residual(float4 x, float4 d, const float* __restrict__ bias,
                                               int i) {
    if (bias) {
        const float4 b = reinterpret_cast<const float4*>(bias)[i];
        d = make_float4(d.x + b.x, d.y + b.y, d.z + b.z, d.w + b.w);
    }
    return make_float4(x.x + d.x, x.y + d.y, x.z + d.z, x.w + d.w);
}

// A thread's share of the row's sum of squares, value by value.
__device__ __forceinline__ void add_squares(float4 a, float& s) {
    s += a.x * a.x;
    s += a.y * a.y;
    s += a.z * a.z;
    s += a.w * a.w;
}

// A row's float4s i = threadIdx.x + j · blockDim.x (j < NORM_VEC, i < n4) as `value(i)` gives
// them, into v, and their sum of squares in that order (what norm_row_vec takes).
template <typename Value>
__device__ __forceinline__ float gather_row(int n4, float4 (&v)[NORM_VEC], Value value) {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            v[j] = value(i);
            add_squares(v[j], s);
        }
    }
    return s;
}

// h16 = bf16(v / sqrt(mean(v²) + eps) · w) for the row at `row` (an element offset), and h32 the
// same unrounded when asked; this thread holds float4s i = threadIdx.x + j · blockDim.x
// (j < NORM_VEC, i < n / 4) in v, and s is their sum of squares taken with add_squares in j order.
__device__ __forceinline__ void norm_row_vec(const float4 (&v)[NORM_VEC], float s, int n,
                                             const float* __restrict__ w,
                                             __nv_bfloat16* __restrict__ h16,
                                             float* __restrict__ h32, long long row, float eps,
                                             float* partial) {
    const int n4 = n / 4;
    const float inv = rsqrtf(block_sum(s, partial) / n + eps);
#pragma unroll
    for (int j = 0; j < NORM_VEC; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < n4) {
            const float4 g = reinterpret_cast<const float4*>(w)[i];
            const float4 h = make_float4(v[j].x * inv * g.x, v[j].y * inv * g.y, v[j].z * inv * g.z,
                                         v[j].w * inv * g.w);
            const __nv_bfloat162 lo = __floats2bfloat162_rn(h.x, h.y), hi = __floats2bfloat162_rn(h.z, h.w);
            uint2 packed;
            packed.x = *reinterpret_cast<const uint32_t*>(&lo);
            packed.y = *reinterpret_cast<const uint32_t*>(&hi);
            reinterpret_cast<uint2*>(h16 + row)[i] = packed;
            if (h32) reinterpret_cast<float4*>(h32 + row)[i] = h;
        }
    }
}
