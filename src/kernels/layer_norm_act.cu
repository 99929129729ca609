// The elementwise steps between a Llama layer's products, each fused into one launch (a decode
// step runs them 32 times; as candle ops they took 2 and 3 launches, and every launch is a few
// microseconds of a ~1 ms step).
//
// rms_norm_bf16: out = bf16(x / sqrt(mean(x²) + eps) · w) for f32 x [rows, n] and f32 w [n], one
// block per row. The sum of squares runs in a fixed order per row (thread-strided partial sums,
// then a fixed tree), so a row gives the same bits in any batch.
//
// silu_mul_bf16: out = bf16(silu(g) · u) for the fused gate/up product gu [rows, 2n] in f32
// (g = gu[:, :n], u = gu[:, n:]), the SwiGLU of Llama's MLP, rounded once as candle's bf16 path
// rounds the down projection's input.
#include "common.cuh"

#define NORM_THREADS 256

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ w, __nv_bfloat16* __restrict__ out, int n,
                  float eps) {
    __shared__ float partial[NORM_THREADS / 32];
    const float* xr = x + (long long)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) s += xr[i] * xr[i];
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int v = 0; v < NORM_THREADS / 32; v++) total += partial[v];
    const float inv = rsqrtf(total / n + eps);
    __nv_bfloat16* o = out + (long long)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) o[i] = __float2bfloat16_rn(xr[i] * inv * w[i]);
}

extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gu, __nv_bfloat16* __restrict__ out, int rows,
                                         int n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * n) return;
    const long long r = i / n, c = i % n;
    const float g = gu[r * 2 * n + c], u = gu[r * 2 * n + n + c];
    out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}
