// A decode step's attention inputs in one launch, at a position read from the device (so a CUDA
// graph of the step replays at any position): the fused q/k/v projection's output plus its
// bias, split into heads, RoPE (half-split pairs, from the model's cos/sin tables) on q and k,
// q written out as [heads, 1, D] and k, v stored in the caches [kv_heads, capacity, D] at slot
// pos (linear; dropped past the capacity, which the host refuses first) or pos mod capacity
// (ring). Replaces a bias add, three copies, two RoPE launches and two cache writes.
// grid (heads + 2 kv_heads), block (D / 2): block b is q head b, then k heads, then v heads.

#include "common.cuh"

template <typename T>
__device__ __forceinline__ void qkv_rope_impl(const T* __restrict__ qkv, const T* __restrict__ bias,
                                              const T* __restrict__ cos, const T* __restrict__ sin,
                                              const long long* __restrict__ pos, T* __restrict__ q_out,
                                              T* __restrict__ k_cache, T* __restrict__ v_cache, int heads,
                                              int kv_heads, int d, int capacity, int ring) {
    const long long p = *pos;
    const int b = blockIdx.x, i = threadIdx.x, half = d / 2;
    // The same arithmetic as prefill's separate ops (candle's bias add, then its RoPE kernel,
    // both in T): a decode step then rounds exactly as a prefill of the same token would. In
    // bf16, rotating in f32 instead (one rounding, not three) drifted the tiny test model's
    // decoded logits 4x further from f32 than prefill's.
    const T x1 = from_f32<T>(to_f32(qkv[b * d + i]) + to_f32(bias[b * d + i]));
    const T x2 = from_f32<T>(to_f32(qkv[b * d + i + half]) + to_f32(bias[b * d + i + half]));
    T y1 = x1, y2 = x2;
    if (b < heads + kv_heads) {  // q and k: rotate
        const T c = cos[p * half + i], s = sin[p * half + i];
        y1 = x1 * c - x2 * s;
        y2 = x1 * s + x2 * c;
    }
    if (b < heads) {
        q_out[b * d + i] = y1;
        q_out[b * d + i + half] = y2;
        return;
    }
    if (p < 0 || (!ring && p >= capacity)) return;
    const long long slot = ring ? p % capacity : p;
    const bool is_k = b < heads + kv_heads;
    const int g = is_k ? b - heads : b - heads - kv_heads;
    T* cache = is_k ? k_cache : v_cache;
    cache[((long long)g * capacity + slot) * d + i] = y1;
    cache[((long long)g * capacity + slot) * d + i + half] = y2;
}

#define QKV_ROPE(NAME, T)                                                                                      \
    extern "C" __global__ void NAME(const T* qkv, const T* bias, const T* cos, const T* sin, const long long* pos, \
                                    T* q_out, T* k_cache, T* v_cache, int heads, int kv_heads, int d, int capacity, \
                                    int ring) {                                                                \
        qkv_rope_impl<T>(qkv, bias, cos, sin, pos, q_out, k_cache, v_cache, heads, kv_heads, d, capacity, ring); \
    }

QKV_ROPE(qkv_rope_store_f32, float)
QKV_ROPE(qkv_rope_store_bf16, __nv_bfloat16)
