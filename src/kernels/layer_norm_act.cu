// The elementwise steps between a Llama layer's products, each fused into one launch (a decode
// step runs them once or twice per layer; as candle ops they took 2 to 4 launches each, and every
// launch is a few microseconds of a ~1 ms step).
//
// add_rms_norm_bf16: the residual add in front of a norm and the norm itself, for f32 x [rows, n]
// and f32 w [n], one block per row:
//   v = x + (delta + bias)   (delta, bias optional: v = x + delta, or v = x; the unfused step
//                             added the product's bias first, then the residual)
//   x_out = v (only with delta), h16 = bf16(v / sqrt(mean(v^2) + eps) * w), and, when asked,
//   h32 = the same norm unrounded (gpt-oss's router reads the f32 norm, its experts the bf16).
// Four launches (bias add, residual add, RMSNorm, cast) become one. The sum of squares runs in a
// fixed order per row (thread-strided partial sums, then a fixed tree), so a row gives the same
// bits in any batch.
//
// silu_mul_bf16: out = bf16(silu(g) · u) for the fused gate/up product gu [rows, 2n] in f32
// (g = gu[:, :n], u = gu[:, n:]), the SwiGLU of Llama's MLP, rounded once as candle's bf16 path
// rounds the down projection's input.
#include "common.cuh"

#define NORM_THREADS 256

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    add_rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ delta, const float* __restrict__ bias,
                      const float* __restrict__ w, float* __restrict__ x_out, __nv_bfloat16* __restrict__ h16,
                      float* __restrict__ h32, int n, float eps) {
    __shared__ float partial[NORM_THREADS / 32];
    pdl_wait();
    pdl_launch_dependents();
    const long long row = (long long)blockIdx.x * n;
    const float* xr = x + row;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        float v = xr[i];
        if (delta) {
            v += bias ? delta[row + i] + bias[i] : delta[row + i];
            x_out[row + i] = v;
        }
        s += v * v;
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int v = 0; v < NORM_THREADS / 32; v++) total += partial[v];
    const float inv = rsqrtf(total / n + eps);
    // Each thread reads back only the values it wrote above.
    const float* vr = delta ? x_out + row : xr;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float h = vr[i] * inv * w[i];
        h16[row + i] = __float2bfloat16_rn(h);
        if (h32) h32[row + i] = h;
    }
}

extern "C" __global__ void silu_mul_bf16(const float* __restrict__ gu, __nv_bfloat16* __restrict__ out, int rows,
                                         int n) {
    pdl_wait();
    pdl_launch_dependents();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * n) return;
    const long long r = i / n, c = i % n;
    const float g = gu[r * 2 * n + c], u = gu[r * 2 * n + n + c];
    out[i] = __float2bfloat16_rn(g / (1.f + expf(-g)) * u);
}
