// One position's keys or values into a preallocated cache [kv_heads, capacity, D], at a position
// read from device memory, so that a decode step captured in a CUDA graph writes the right slot
// at every replay. Linear caches: slot = pos (positions past the capacity are dropped: the host
// refuses them before the step); ring caches: slot = pos mod capacity.
// grid (kv_heads), block (min(D, 1024)); src [kv_heads, D] contiguous.

#include "common.cuh"

template <typename T>
__device__ __forceinline__ void kv_write_impl(T* __restrict__ cache, const T* __restrict__ src,
                                              const long long* __restrict__ pos, int capacity, int d, int ring) {
    const long long p = *pos;
    if (p < 0 || (!ring && p >= capacity)) return;
    const long long slot = ring ? p % capacity : p;
    const int h = blockIdx.x;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        cache[((long long)h * capacity + slot) * d + c] = src[(long long)h * d + c];
    }
}

extern "C" __global__ void kv_write_f32(float* cache, const float* src, const long long* pos, int capacity, int d,
                                        int ring) {
    kv_write_impl(cache, src, pos, capacity, d, ring);
}

extern "C" __global__ void kv_write_bf16(__nv_bfloat16* cache, const __nv_bfloat16* src, const long long* pos,
                                         int capacity, int d, int ring) {
    kv_write_impl(cache, src, pos, capacity, d, ring);
}
