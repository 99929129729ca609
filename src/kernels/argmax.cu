// Index of the largest value of a long f32 row (a decode step's logits, 201,088 for gpt-oss):
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

// grid (blocks), block (THREADS): block b covers [b * chunk, min(n, (b + 1) * chunk)).
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_partial(const float* __restrict__ x, int n, int chunk, float* __restrict__ part_v, int* __restrict__ part_i) {
    const int lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
        const float xj = x[j];
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
