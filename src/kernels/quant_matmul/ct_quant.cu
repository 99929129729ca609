// compressed-tensors projections on the GPU (mod.rs): per-token activation quantization
// and dequantization for the prefill GEMMs, and the 4-bit decode GEMV for scale groups that
// ct_gemv.cu does not take (32 or 64 columns). The decode GEMVs proper are in ct_gemv.cu.
//
// Values: int8 weights are bytes read as int8; FP8 weights are E4M3 bytes; 4-bit weights are
// int32 words, element i at bits 4 (i % 8) of word i / 8, stored as q + 8. Activations are
// quantized per row with scale = max|x| / 127.5 (int8) or / 448 (FP8), compressed-tensors'
// dynamic `token` strategy (numerics.rs is the reference); the quantized values are integers or
// E4M3 values, exact in bf16, so a bf16 GEMM of quantized values times both scales afterwards is
// the int8 / FP8 product (f32 accumulation).
#include <cuda_fp8.h>

#include "common.cuh"

#define ACT_INT8 1
#define ACT_FP8 2

__device__ __forceinline__ float fp8_value(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

__device__ __forceinline__ float quantize_one(float v, int act) {
    if (act == ACT_INT8) return rintf(fminf(fmaxf(v, -128.f), 127.f));
    const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(fminf(fmaxf(v, -448.f), 448.f), __NV_SATFINITE, __NV_E4M3);
    return fp8_value(q);
}

// grid (rows), block (256). x [rows, k] bf16 → q [rows, k] bf16 (the quantized values), s [rows].
extern "C" __global__ void ct_act_quant(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ q,
                                        float* __restrict__ s, int k, int act) {
    pdl_wait();
    __shared__ float red[32];
    const long long row = blockIdx.x;
    const __nv_bfloat16* xr = x + row * k;
    float m = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(xr[i])));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
        v = warp_max(v);
        if (threadIdx.x == 0) {
            float sc = v / (act == ACT_INT8 ? 127.5f : 448.f);
            red[0] = sc == 0.f ? 1.1920929e-7f : sc;
        }
    }
    __syncthreads();
    const float sc = red[0];
    if (threadIdx.x == 0) s[row] = sc;
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        q[row * k + i] = __float2bfloat16_rn(quantize_one(__bfloat162float(xr[i]) / sc, act));
}

// n = out · in bytes → bf16 values, unscaled (int8, or E4M3 when fp8 != 0).
extern "C" __global__ void ct_dequant_8bit(const uint8_t* __restrict__ w, __nv_bfloat16* __restrict__ out,
                                           long long n, int fp8) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint8_t b = w[i];
    out[i] = __float2bfloat16_rn(fp8 ? fp8_value(b) : (float)(int8_t)b);
}

// Scale group of input column c (activation order: g_idx; else c / group).
__device__ __forceinline__ int group_of(int c, int group, const uint32_t* g_idx) {
    return g_idx ? (int)g_idx[c] : c / group;
}

// out [rows, in] bf16 = (q − zero) · scale, each product rounded to bf16 as a bf16 reference
// dequantizes (the f32 product of a 4-bit integer and a scale is exact before the rounding).
extern "C" __global__ void ct_dequant_int4(const uint32_t* __restrict__ w, const float* __restrict__ scale,
                                           const float* __restrict__ zero, const uint32_t* __restrict__ g_idx,
                                           __nv_bfloat16* __restrict__ out, int rows, int in, int groups,
                                           int group) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * in) return;
    const int r = i / in, c = i % in, wpr = (in + 7) / 8;
    const int q = (int)((w[(long long)r * wpr + c / 8] >> (4 * (c % 8))) & 15u) - 8;
    const int g = group_of(c, group, g_idx);
    const float zp = zero ? zero[r * groups + g] : 0.f;
    out[i] = __float2bfloat16_rn(((float)q - zp) * scale[(long long)r * groups + g]);
}

// Decode GEMV for 4-bit weights (no activation order, groups of 32 or 64 columns; ct_gemv.cu
// takes the others): y [M, N] f32 = x · dequant(w)ᵀ, M ≤ 8,
// the weights dequantized to bf16 values as ct_dequant_int4 does. One warp per weight row, a
// lane reads 16 bytes (32 values) at a time. K % 32 == 0 and group % 32 == 0 (one scale per load).
extern "C" __global__ void ct_gemv_int4(const uint32_t* __restrict__ w, const float* __restrict__ scale,
                                        const float* __restrict__ zero, const __nv_bfloat16* __restrict__ x,
                                        float* __restrict__ y, int M, int N, int K, int groups, int group) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const uint4* wr = reinterpret_cast<const uint4*>(w + (long long)n * (K / 8));
    for (int c = lane; c < K / 32; c += 32) {
        const uint4 v = __ldg(wr + c);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        const int g = (32 * c) / group;
        const float sc = scale[(long long)n * groups + g], zp = zero ? zero[(long long)n * groups + g] : 0.f;
        float wf[32];
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int q = (int)((words[j / 8] >> (4 * (j % 8))) & 15u) - 8;
            wf[j] = __bfloat162float(__float2bfloat16_rn(((float)q - zp) * sc));
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            if (m >= M) break;
            const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)m * K + 32 * c);
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const uint4 xv = xr[p];
                const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 a = __bfloat1622float2(h[j]);
                    acc[m] += wf[8 * p + 2 * j] * a.x + wf[8 * p + 2 * j + 1] * a.y;
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 8; m++) {
        if (m >= M) break;
        const float s = warp_sum(acc[m]);
        if (lane == 0) y[(long long)m * N + n] = s;
    }
}

