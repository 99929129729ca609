// f32 values as two bf16 halves for matmul_hi_lo (mod.rs): out[i] = hi = bf16(x[i]),
// out[n + i] = bf16(x[i] − hi), both rounded to nearest even. One launch where candle ops took
// six (round, widen, subtract, round, concatenate), which a decode step's head felt (~30 µs).
#include "common.cuh"

extern "C" __global__ void hi_lo_split(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int n) {
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    out[i] = hi;
    out[n + i] = bf16_lo(v, hi);
}
