// Index of the largest value of a long f32 row (a decode step's logits, 201,088 for gpt-oss),
// optionally after adding Gumbel noise (a temperature-sampling draw, see gumbel() below):
// candle's argmax reduces a row in one block, which took 156 us per token there. Two stages:
// argmax_partial: each of up to 256 blocks reduces a contiguous chunk to (value, index);
// argmax_final: one block reduces the partials. NaN is never the maximum; ties go to the lower
// index (the sampler's rule). A row of only NaN gives index 0.

#include "common.cuh"

#define THREADS 256

// (value, index) pairs: the better of two.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

__device__ __forceinline__ void block_best(float& v, int& i) {
    __shared__ float sv[THREADS / 32];
    __shared__ int si[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / 32 ? sv[lane] : -INFINITY;
        i = lane < THREADS / 32 ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
    }
}

// Gumbel noise for entry j of a draw with this seed: -log(-log(u)), u uniform in (0, 1) from a
// counter-based hash (splitmix64), in double and then rounded, so the Rust reference gets the
// same float. argmax(x / T + noise) is a draw from softmax(x / T) (the Gumbel-max trick): plain
// temperature sampling needs neither the softmax's sum nor the logits on the host.
__device__ __forceinline__ float gumbel(unsigned long long seed, int j) {
    unsigned long long z = seed + 0x9E3779B97F4A7C15ull * (unsigned long long)(j + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = ((double)(z >> 11) + 0.5) * 0x1p-53;
    return (float)(-log(-log(u)));
}

// grid (blocks), block (THREADS): block b covers [b * chunk, min(n, (b + 1) * chunk)). With
// sample != 0 the values are x * inv_t + gumbel(seed, j).
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_partial(const float* __restrict__ x, int n, int chunk, int sample, float inv_t, unsigned long long seed,
                   float* __restrict__ part_v, int* __restrict__ part_i) {
    const int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
        float xj = x[j];
        if (sample) xj = __fadd_rn(__fmul_rn(xj, inv_t), gumbel(seed, j));  // no FMA: as the reference
        if (!isnan(xj)) better(v, i, xj, j);
    }
    block_best(v, i);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = i;
    }
}

// grid (1), block (THREADS).
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_final(const float* __restrict__ part_v, const int* __restrict__ part_i, int parts, uint32_t* __restrict__ out) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += THREADS) better(v, i, part_v[p], part_i[p]);
    block_best(v, i);
    if (threadIdx.x == 0) *out = i == 0x7fffffff ? 0u : (uint32_t)i;
}
