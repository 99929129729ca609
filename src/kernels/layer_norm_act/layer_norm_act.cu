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
#include "activation.cuh"
#include "norm_row.cuh"

__device__ __forceinline__ bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// Why the block is as wide as the row (up to 1,024 threads) and a thread's values stay in
// registers: at batch 1 this kernel is one block whose time is its chain of dependent loads. With
// 256 threads looping over a 2,880-wide row, loading, storing and loading again, it took 7.3 us
// per call on an H100 (48 calls per gpt-oss decode step); each thread now issues all its loads
// at once, 16 bytes each, and never reads back what it wrote.
extern "C" __global__ void __launch_bounds__(NORM_MAX_THREADS)
    add_rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ delta, const float* __restrict__ bias,
                      const float* __restrict__ w, float* __restrict__ x_out, __nv_bfloat16* __restrict__ h16,
                      float* __restrict__ h32, int n, float eps) {
    __shared__ float partial[NORM_MAX_THREADS / 32];
    pdl_wait();
    pdl_launch_dependents();
    const long long row = (long long)blockIdx.x * n;
    const bool vec = n % 4 == 0 && n / 4 <= (int)blockDim.x * NORM_VEC && aligned16(x) && aligned16(w) &&
                     (!delta || (aligned16(delta) && aligned16(x_out))) && (!bias || aligned16(bias)) &&
                     ((uintptr_t)h16 & 7) == 0 && (!h32 || aligned16(h32));
    if (vec) {
        float4 v[NORM_VEC];
        const float s = gather_row(n / 4, v, [&](int i) {
            float4 a = reinterpret_cast<const float4*>(x + row)[i];
            if (delta) {
                a = add_residual(a, reinterpret_cast<const float4*>(delta + row)[i], bias, i);
                reinterpret_cast<float4*>(x_out + row)[i] = a;
            }
            return a;
        });
        norm_row_vec(v, s, n, w, h16, h32, row, eps, partial);
        return;
    }
    // Any width or alignment: strided, reading back what it wrote.
    const float* xr = x + row;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (delta) {
            v += bias ? delta[row + i] + bias[i] : delta[row + i];
            x_out[row + i] = v;
        }
        s += v * v;
    }
    const float inv = rsqrtf(block_sum(s, partial) / n + eps);
    // Each thread reads back only the values it wrote above.
    const float* vr = delta ? x_out + row : xr;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
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
    out[i] = __float2bfloat16_rn(silu_mul(g, u));
}
