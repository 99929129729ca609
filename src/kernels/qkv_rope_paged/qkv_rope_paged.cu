// A varlen batch's attention inputs in one launch (continuous batching): the fused q/k/v
// projection's f32 output [T, (heads + 2 kv_heads) * D] plus an optional f32 bias, split into
// heads, q and k optionally RMSNormed per head by one f32 [D] weight each (Qwen3, Gemma 3:
// head_rms below; five launches a layer on their own), RoPE on q and k from the model's f32 cos/sin tables [positions, D/2] at each token's own
// row positions[t], q written out as [T, heads, D] and k, v stored in the paged pools
// [num_slots, kv_heads, D] at slot slots[t] (a slot past the pool, u32::MAX for padding, stores
// nothing). Pairs: HF's half-split (i, i + D/2) or GGUF's interleaved (2i, 2i + 1), both rotated
// by angle i. All arithmetic in f32, one rounding to T at the store. A position past the tables
// rotates by NaN (visible) rather than reading outside them.
// grid (T, ceil((heads + 2 kv_heads) / HB)), block (D / 2, HB): thread (i, y) of block (t, z)
// handles pair i of token t's head b = z HB + y: its q heads, then its k heads, then its v heads.
// Several heads per block: with one (32 threads at D = 64) a 512-token prompt took 40,960 blocks
// and 52 us for 10 MB.

#include "common.cuh"
#include "fp8.cuh"

// sqrt(mean(x^2) + eps) over this thread's head (q/k RMSNorm, Qwen3 and Gemma 3), whose d/2
// threads hold it as pairs (x1, x2); d is a power of two (the launcher checks). Each thread's two
// squares, then a fixed tree over the head's threads: xor shuffles within a warp (a head of
// fewer than 32 threads is an aligned group of lanes), then the head's warps in order through
// shared memory. The same bits in any launch. Every thread of the block calls it (it shuffles and
// waits), live or not; warp_sums holds one float per warp of the block.
__device__ __forceinline__ float head_rms(float x1, float x2, int half, int d, float eps, float* warp_sums) {
    float ss = __fadd_rn(__fmul_rn(x1, x1), __fmul_rn(x2, x2));
    for (int m = 1; m < min(half, 32); m *= 2) ss = __fadd_rn(ss, __shfl_xor_sync(FULL_MASK, ss, m));
    if (half > 32) {
        const int tid = threadIdx.y * half + threadIdx.x, per_head = half >> 5;
        if ((tid & 31) == 0) warp_sums[tid >> 5] = ss;
        __syncthreads();
        const float* mine = warp_sums + threadIdx.y * per_head;
        ss = mine[0];
        for (int w = 1; w < per_head; w++) ss = __fadd_rn(ss, mine[w]);
    }
    return sqrtf(__fadd_rn(__fdiv_rn(ss, (float)d), eps));
}

// x / rms * w, the norm's two roundings in the CPU reference's order.
__device__ __forceinline__ float rms_scaled(float x, float rms, float w) { return __fmul_rn(__fdiv_rn(x, rms), w); }

template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void qkv_rope_paged_impl(const float* __restrict__ qkv, const float* __restrict__ bias,
                                                    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                                    float eps, const float* __restrict__ cos, const float* __restrict__ sin,
                                                    const uint32_t* __restrict__ positions,
                                                    const uint32_t* __restrict__ slots, T* __restrict__ q_out,
                                                    T* __restrict__ k_pool, T* __restrict__ v_pool, int heads,
                                                    int kv_heads, int d, int n_positions, long long num_slots,
                                                    int release_first) {
    __shared__ float warp_sums[32];
    pdl_wait_release(release_first);
    const long long t = blockIdx.x;
    const int b = blockIdx.y * blockDim.y + threadIdx.y, i = threadIdx.x, half = d / 2;
    const bool live = b < heads + 2 * kv_heads;
    const int i1 = INTERLEAVED ? 2 * i : i, i2 = INTERLEAVED ? 2 * i + 1 : i + half;
    float x1 = 0.f, x2 = 0.f;
    if (live) {
        const float* row = qkv + t * (heads + 2 * kv_heads) * d + b * d;
        x1 = row[i1];
        x2 = row[i2];
        if (bias) {
            x1 += bias[b * d + i1];
            x2 += bias[b * d + i2];
        }
    }
    if (q_norm) {  // the same for every thread of the launch
        const float rms = head_rms(x1, x2, half, d, eps, warp_sums);
        if (live && b < heads + kv_heads) {
            const float* w = b < heads ? q_norm : k_norm;
            x1 = rms_scaled(x1, rms, w[i1]);
            x2 = rms_scaled(x2, rms, w[i2]);
        }
    }
    if (!live) return;
    float y1 = x1, y2 = x2;
    if (b < heads + kv_heads) {  // q and k: rotate
        const uint32_t p = positions[t];
        const bool ok = p < (uint32_t)n_positions;
        const float c = ok ? cos[(long long)p * half + i] : __int_as_float(0x7fffffff);
        const float s = ok ? sin[(long long)p * half + i] : __int_as_float(0x7fffffff);
        y1 = x1 * c - x2 * s;
        y2 = x1 * s + x2 * c;
    }
    if (b < heads) {
        q_out[(t * heads + b) * d + i1] = from_f32<T>(y1);
        q_out[(t * heads + b) * d + i2] = from_f32<T>(y2);
        return;
    }
    const long long slot = slots[t];
    if (slot >= num_slots) return;  // padding (u32::MAX): nothing stored
    const bool is_k = b < heads + kv_heads;
    const int g = is_k ? b - heads : b - heads - kv_heads;
    T* pool = (is_k ? k_pool : v_pool) + (slot * kv_heads + g) * d;
    pool[i1] = from_f32<T>(y1);
    pool[i2] = from_f32<T>(y2);
}

#define QKV_ROPE_PAGED(NAME, T, INTERLEAVED)                                                                   \
    extern "C" __global__ void NAME(const float* qkv, const float* bias, const float* q_norm,                  \
                                    const float* k_norm, float eps, const float* cos, const float* sin,        \
                                    const uint32_t* positions, const uint32_t* slots, T* q_out, T* k_pool,     \
                                    T* v_pool, int heads, int kv_heads, int d, int n_positions,                \
                                    long long num_slots, int release_first) {                                  \
        qkv_rope_paged_impl<T, INTERLEAVED>(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slots, q_out, \
                                            k_pool, v_pool, heads, kv_heads, d, n_positions, num_slots,        \
                                            release_first);                                                    \
    }

QKV_ROPE_PAGED(qkv_rope_paged_half_f32, float, false)
QKV_ROPE_PAGED(qkv_rope_paged_half_bf16, __nv_bfloat16, false)
QKV_ROPE_PAGED(qkv_rope_paged_interleaved_f32, float, true)
QKV_ROPE_PAGED(qkv_rope_paged_interleaved_bf16, __nv_bfloat16, true)

// Pools of codes (include/fp8.cuh; E4M3, or INT8 with INT8): q as bf16, each stored (token, kv
// head) row as codes under the power-of-two scale of its largest magnitude, the scale byte beside it in
// [num_slots, kv_heads]; q and the keys rotated first where d is a power of two from 16 to 256.
// The row's magnitudes meet in shared memory (a head's D/2 threads may span two warps). RoPE's products and sums are rounded one by one (__fmul_rn, no contraction),
// as the CPU reference computes them: a fused multiply-add that moved a value across an E4M3
// rounding boundary would be a whole code (1/16) off, where in bf16 it is one ulp.
template <bool INT8>
__device__ __forceinline__ void qkv_rope_paged_fp8_impl(
    const float* __restrict__ qkv, const float* __restrict__ bias, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const float* __restrict__ cos,
    const float* __restrict__ sin, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ slots,
    __nv_bfloat16* __restrict__ q_out, uint8_t* __restrict__ k_pool, uint8_t* __restrict__ v_pool,
    uint8_t* __restrict__ k_scale, uint8_t* __restrict__ v_scale, int heads, int kv_heads, int d, int n_positions,
    long long num_slots, bool interleaved, int release_first) {
    __shared__ uint32_t amax_bits[256];  // per head of the block (blockDim.y <= 256)
    __shared__ float2 swap[256];         // a thread's pair, exchanged across warps while heads rotate
    __shared__ float warp_sums[32];      // the q/k norm's sums of squares, a float a warp
    pdl_wait_release(release_first);
    const long long t = blockIdx.x;
    const int y = threadIdx.y, b = blockIdx.y * blockDim.y + y, i = threadIdx.x, half = d / 2;
    const bool live = b < heads + 2 * kv_heads;
    const int i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
    if (i == 0) amax_bits[y] = 0;
    float x1 = 0.f, x2 = 0.f;
    if (live) {
        const float* row = qkv + t * (heads + 2 * kv_heads) * d + b * d;
        x1 = row[i1];
        x2 = row[i2];
        if (bias) {
            x1 = __fadd_rn(x1, bias[b * d + i1]);
            x2 = __fadd_rn(x2, bias[b * d + i2]);
        }
    }
    if (q_norm) {  // the same for every thread of the launch
        const float rms = head_rms(x1, x2, half, d, eps, warp_sums);
        if (live && b < heads + kv_heads) {
            const float* w = b < heads ? q_norm : k_norm;
            x1 = rms_scaled(x1, rms, w[i1]);
            x2 = rms_scaled(x2, rms, w[i2]);
        }
    }
    float y1 = x1, y2 = x2;
    if (live) {
        if (b < heads + kv_heads) {
            const uint32_t p = positions[t];
            const bool ok = p < (uint32_t)n_positions;
            const float c = ok ? cos[(long long)p * half + i] : __int_as_float(0x7fffffff);
            const float s = ok ? sin[(long long)p * half + i] : __int_as_float(0x7fffffff);
            y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
            y2 = __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
        }
    }
    // Keys and queries rotated (kv_fp8.rs's header): H x butterfly by butterfly as
    // kv_fp8::rotate (stages of distance 1, 2, 4, ... in that order; a butterfly's sum and
    // difference are single f32 operations), then the exact power-of-two scale. Thread i holds
    // elements i1 and i2: the stage that pairs those two (distance d / 2 for half-split pairs,
    // 1 for interleaved ones) is local, and every other stage pairs thread i with thread i ^ m,
    // by a shuffle within a warp (m < 32) and through shared memory across the warps of a head
    // of d >= 128. d is uniform, so every thread takes the same branches and meets every shuffle
    // and barrier. A barrier for every stage cost the gpt-oss-20b layout 2.5% of its decode at 1k.
    if ((d & (d - 1)) == 0 && d >= 16 && d <= 256) {
        const bool turns = live && b < heads + kv_heads;
        float r1 = y1, r2 = y2;  // every thread takes part in the exchanges; only q and k keep the result
        const auto local = [&]() {
            const float a = r1, c = r2;
            r1 = __fadd_rn(a, c);
            r2 = __fsub_rn(a, c);
        };
        const int tid = y * half + i;
        const auto across = [&](int m) {
            float p1, p2;
            if (m < 32) {
                p1 = __shfl_xor_sync(0xffffffffu, r1, m);
                p2 = __shfl_xor_sync(0xffffffffu, r2, m);
            } else {
                swap[tid] = make_float2(r1, r2);
                __syncthreads();
                const float2 p = swap[tid ^ m];
                __syncthreads();  // read before the next stage writes
                p1 = p.x;
                p2 = p.y;
            }
            const bool low = (i & m) == 0;
            r1 = low ? __fadd_rn(r1, p1) : __fsub_rn(p1, r1);
            r2 = low ? __fadd_rn(r2, p2) : __fsub_rn(p2, r2);
        };
        if (interleaved) local();
        for (int m = 1; m < half; m *= 2) across(m);
        if (!interleaved) local();
        if (turns) {
            const int lg = 31 - __clz(d), shift = b >= heads ? lg / 2 : lg - lg / 2;
            const float f = __uint_as_float((uint32_t)(127 - shift) << 23);
            y1 = __fmul_rn(r1, f);
            y2 = __fmul_rn(r2, f);
        }
    }
    __syncthreads();  // amax_bits cleared
    const long long slot = slots[t];
    const bool store = live && b >= heads && slot < num_slots;
    // Non-negative floats order as their bits; NaN's bits are above infinity's.
    if (store) atomicMax(&amax_bits[y], max(__float_as_uint(fabsf(y1)), __float_as_uint(fabsf(y2))));
    __syncthreads();
    if (live && b < heads) {
        q_out[(t * heads + b) * d + i1] = __float2bfloat16_rn(y1);
        q_out[(t * heads + b) * d + i2] = __float2bfloat16_rn(y2);
    }
    if (!store) return;
    const bool is_k = b < heads + kv_heads;
    const int g = is_k ? b - heads : b - heads - kv_heads;
    const uint8_t sb = kv_scale_byte<INT8>(__uint_as_float(amax_bits[y]));
    const float inv = fp8_scale_value((uint8_t)(254 - sb));
    uint8_t* pool = (is_k ? k_pool : v_pool) + (slot * kv_heads + g) * d;
    pool[i1] = kv_quantize<INT8>(y1, inv);
    pool[i2] = kv_quantize<INT8>(y2, inv);
    if (i == 0) (is_k ? k_scale : v_scale)[slot * kv_heads + g] = sb;
}

#define QKV_ROPE_PAGED_FP8(NAME, INTERLEAVED, INT8)                                                                \
    extern "C" __global__ void NAME(const float* qkv, const float* bias, const float* q_norm,                  \
                                    const float* k_norm, float eps, const float* cos, const float* sin,        \
                                    const uint32_t* positions, const uint32_t* slots, __nv_bfloat16* q_out,    \
                                    uint8_t* k_pool, uint8_t* v_pool, uint8_t* k_scale, uint8_t* v_scale,      \
                                    int heads, int kv_heads, int d, int n_positions, long long num_slots,      \
                                    int release_first) {                                                       \
        qkv_rope_paged_fp8_impl<INT8>(qkv, bias, q_norm, k_norm, eps, cos, sin, positions, slots, q_out, k_pool,      \
                                      v_pool, k_scale, v_scale,                                                \
                                heads, kv_heads, d, n_positions, num_slots, INTERLEAVED, release_first);       \
    }

QKV_ROPE_PAGED_FP8(qkv_rope_paged_half_fp8, false, false)
QKV_ROPE_PAGED_FP8(qkv_rope_paged_interleaved_fp8, true, false)
QKV_ROPE_PAGED_FP8(qkv_rope_paged_half_int8, false, true)
QKV_ROPE_PAGED_FP8(qkv_rope_paged_interleaved_int8, true, true)
