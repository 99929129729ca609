// A decode step's attention inputs in one launch, at a position read from the device (so a CUDA
// graph of the step replays at any position): the fused q/k/v projection's f32 output plus its
// f32 bias, split into heads, RoPE (half-split pairs, from the model's f32 cos/sin tables) on q
// and k, q written out as [heads, 1, D] and k, v stored in the caches [kv_heads, capacity, D]
// at slot pos (linear; dropped past the capacity, which the host refuses first) or
// pos mod capacity (ring). All arithmetic in f32, one rounding to T at the store: prefill does
// the same as f32 candle ops. Replaces a bias add, three copies, two RoPE launches and two
// cache writes.
// grid (heads + 2 kv_heads), block (D / 2): block b is q head b, then k heads, then v heads.

#include "common.cuh"

template <typename T>
__device__ __forceinline__ void qkv_rope_impl(const float* __restrict__ qkv, const float* __restrict__ bias,
                                              const float* __restrict__ cos, const float* __restrict__ sin,
                                              const long long* __restrict__ pos, T* __restrict__ q_out,
                                              T* __restrict__ k_cache, T* __restrict__ v_cache, int heads,
                                              int kv_heads, int d, int capacity, int ring) {
    const long long p = *pos;
    const int b = blockIdx.x, i = threadIdx.x, half = d / 2;
    const float x1 = qkv[b * d + i] + bias[b * d + i];
    const float x2 = qkv[b * d + i + half] + bias[b * d + i + half];
    float y1 = x1, y2 = x2;
    if (b < heads + kv_heads) {  // q and k: rotate
        const float c = cos[p * half + i], s = sin[p * half + i];
        y1 = x1 * c - x2 * s;
        y2 = x1 * s + x2 * c;
    }
    if (b < heads) {
        q_out[b * d + i] = from_f32<T>(y1);
        q_out[b * d + i + half] = from_f32<T>(y2);
        return;
    }
    if (p < 0 || (!ring && p >= capacity)) return;
    const long long slot = ring ? p % capacity : p;
    const bool is_k = b < heads + kv_heads;
    const int g = is_k ? b - heads : b - heads - kv_heads;
    T* cache = is_k ? k_cache : v_cache;
    cache[((long long)g * capacity + slot) * d + i] = from_f32<T>(y1);
    cache[((long long)g * capacity + slot) * d + i + half] = from_f32<T>(y2);
}

#define QKV_ROPE(NAME, T)                                                                                      \
    extern "C" __global__ void NAME(const float* qkv, const float* bias, const float* cos, const float* sin,   \
                                    const long long* pos, T* q_out, T* k_cache, T* v_cache, int heads,        \
                                    int kv_heads, int d, int capacity, int ring) {                             \
        qkv_rope_impl<T>(qkv, bias, cos, sin, pos, q_out, k_cache, v_cache, heads, kv_heads, d, capacity, ring); \
    }

QKV_ROPE(qkv_rope_store_f32, float)
QKV_ROPE(qkv_rope_store_bf16, __nv_bfloat16)
