// The gpt-oss router's logits h · wᵀ in f32 (mod.rs says why not cuBLAS): h [tokens, hidden],
// w [experts, hidden] (contiguous, rows 16-byte aligned, hidden % 4 == 0) -> out [tokens,
// experts]. Batch invariant: each (token, expert) dot is summed in one fixed order whatever the
// token count (thread i of the block takes the float4 chunks i, i + RK, ... in order; then each
// warp's fixed butterfly, then the warps in order), unlike a GEMM library that picks its
// reduction by shape. A block computes RT tokens × RE experts, so each chunk a thread loads
// serves several products; the RK threads along K keep enough loads in flight for a single
// token. Two tiles, the same sums: 4 × 4 (router_logits_f32), and 8 × 8 for many tokens
// (router_logits_f32_t8), where the 4 × 4 blocks would read h and w from L2 twice as often (at
// 64 tokens of 128 experts, 47 MB against 24). grid (ceil(tokens / RT) · ceil(experts / RE)),
// block (RK). Launched with Programmatic Dependent Launch (launch.rs).

#include "common.cuh"

#define RK 256

template <int RT, int RE>
__device__ __forceinline__ void router_logits(const float* __restrict__ h, const float* __restrict__ w,
                                              float* __restrict__ out, int tokens, int experts, int hidden) {
    __shared__ float red[RK / 32][RT][RE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int egroups = (experts + RE - 1) / RE;
    const long long t0 = (long long)(blockIdx.x / egroups) * RT;
    const int e0 = (int)(blockIdx.x % egroups) * RE;
    const int n4 = hidden / 4;
    const float4* hr[RT];
    const float4* wr[RE];
#pragma unroll
    for (int r = 0; r < RT; r++) hr[r] = reinterpret_cast<const float4*>(h + min(t0 + r, (long long)tokens - 1) * hidden);
#pragma unroll
    for (int c = 0; c < RE; c++) wr[c] = reinterpret_cast<const float4*>(w + (long long)min(e0 + c, experts - 1) * hidden);
    // The weights are read-only: on their way to L2 while the norm before this kernel finishes
    // (h is its output, read after the wait).
    for (int i = threadIdx.x; i < n4; i += RK)
#pragma unroll
        for (int c = 0; c < RE; c++) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[c] + i));
    pdl_launch_dependents();
    pdl_wait();
    float acc[RT][RE];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int c = 0; c < RE; c++) acc[r][c] = 0.f;
#pragma unroll 2
    for (int i = threadIdx.x; i < n4; i += RK) {
        float4 hv[RT], wv[RE];
#pragma unroll
        for (int r = 0; r < RT; r++) hv[r] = hr[r][i];
#pragma unroll
        for (int c = 0; c < RE; c++) wv[c] = wr[c][i];
#pragma unroll
        for (int r = 0; r < RT; r++)
#pragma unroll
            for (int c = 0; c < RE; c++) {
                float a = acc[r][c];
                a = fmaf(hv[r].x, wv[c].x, a);
                a = fmaf(hv[r].y, wv[c].y, a);
                a = fmaf(hv[r].z, wv[c].z, a);
                acc[r][c] = fmaf(hv[r].w, wv[c].w, a);
            }
    }
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int c = 0; c < RE; c++) {
            const float s = warp_sum(acc[r][c]);
            if (lane == 0) red[warp][r][c] = s;
        }
    __syncthreads();
    if (threadIdx.x < RT * RE) {
        const int r = threadIdx.x / RE, c = threadIdx.x % RE;
        float s = 0.f;
#pragma unroll
        for (int v = 0; v < RK / 32; v++) s += red[v][r][c];
        if (t0 + r < tokens && e0 + c < experts) out[(t0 + r) * experts + e0 + c] = s;
    }
}

extern "C" __global__ void __launch_bounds__(RK)
    router_logits_f32(const float* __restrict__ h, const float* __restrict__ w, float* __restrict__ out, int tokens,
                      int experts, int hidden) {
    router_logits<4, 4>(h, w, out, tokens, experts, hidden);
}

extern "C" __global__ void __launch_bounds__(RK)
    router_logits_f32_t8(const float* __restrict__ h, const float* __restrict__ w, float* __restrict__ out,
                         int tokens, int experts, int hidden) {
    router_logits<8, 8>(h, w, out, tokens, experts, hidden);
}
