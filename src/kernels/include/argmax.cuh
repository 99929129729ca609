// The pieces of argmax.cu that the device sampler (sample.cu) shares: (value, index) block
// reductions (NaN never wins, ties to the lower index) and the Gumbel noise of a draw.
#pragma once

#include "common.cuh"

#define ARGMAX_THREADS 256

// (value, index) pairs: the better of two.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

// The warp's best pair, in every lane.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) better(v, i, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, i, o));
}

__device__ __forceinline__ void block_best(float& v, int& i) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    warp_best(v, i);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < ARGMAX_THREADS / 32 ? sv[lane] : -INFINITY;
        i = lane < ARGMAX_THREADS / 32 ? si[lane] : 0x7fffffff;
        warp_best(v, i);
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

