// Small device helpers shared by inferno's kernels.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

// Inclusive scan over the warp in lane order: lane l gets x_0 op ... op x_l, by log steps
// (x = op(x, the value o lanes below) for o = 1, 2, 4, ...).
template <typename T, typename Op>
__device__ __forceinline__ T warp_scan(T x, Op op) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x = op(x, y);
    }
    return x;
}

// What hi = bf16(v) leaves of v, rounded to bf16: hi + lo carries v to 16 significant bits.
__device__ __forceinline__ __nv_bfloat16 bf16_lo(float v, __nv_bfloat16 hi) {
    return __float2bfloat16_rn(v - __bfloat162float(hi));
}

// Programmatic Dependent Launch (src/kernels/launch.rs): a kernel launched with it may start
// before the previous kernel of the stream has finished. pdl_wait() returns once that kernel has
// completed and its writes are visible; call it before reading anything an earlier kernel wrote
// and before writing global memory (read-only inputs such as weights may be loaded before).
// pdl_launch_dependents() lets the next kernel start its own prologue. Both are no-ops in a
// launch without the attribute, and compiled out before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The wait and the release, the release first where the launch asks for it (the same results
// either way: a dependent's wait still waits for this grid; src/kernels/launch.rs says when it
// pays).
__device__ __forceinline__ void pdl_wait_release(bool release_first) {
    if (release_first) pdl_launch_dependents();
    pdl_wait();
    if (!release_first) pdl_launch_dependents();
}
