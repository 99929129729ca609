// Mixture of MXFP4 experts with gpt-oss's clamped SwiGLU, for the few-token (decode) case first.
//
// out[t] = sum_k w[t,k] * (down_e(act(gate_up_e(x[t]) + b1_e)) + b2_e),  e = ids[t,k]
// gate = row 2j, up = row 2j+1 of gate_up; gate = min(gate, limit); up = clamp(up, -limit, limit);
// act_j = gate * sigmoid(alpha * gate) * (up + 1).
//
// Two kernels, because every down row needs the whole activation vector of its (token, expert):
//   moe_gate_up: one (token, slot) per blockIdx.x; each warp computes PPW (gate, up) row pairs and
//                writes act[slot, j] (f32 scratch [tokens * k, I]).
//   moe_down:    one token per blockIdx.x; each warp computes RPW output rows, looping over the
//                token's k slots, so the routing weights and biases are applied without atomics
//                (deterministic) and out is written once.
// Both are GEMVs straight off the packed weights [E, rows, K/32, 16] (+ scales [E, rows, K/32]):
// lane l of a warp owns the blocks l, l+32, ... (NB of them) of the reduction dimension K, keeps
// its 32·NB input values in registers (loaded once per warp, reused by every row), reads each of
// its row blocks with one 16-byte load, decodes the FP4 codes through a 16-entry table in shared
// memory and applies the block scale to the block's partial sum. f32 accumulation throughout.

#include "common.cuh"

#define WARPS 4
#define PPW 2  // gate/up row pairs per warp
#define RPW 4  // down rows per warp

__constant__ float FP4_TABLE[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                    -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// 2^(s - 127), exact: byte 0 is the subnormal 2^-127 (no flush-to-zero in these kernels).
__device__ __forceinline__ float e8m0(uint8_t s) {
    return s == 0 ? 0x1p-127f : __uint_as_float((uint32_t)s << 23);
}

// Sum over one block of 32 elements of FP4[code] * x (unscaled).
__device__ __forceinline__ float block_dot(const uint4 w, const float* x, const float* lut) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            s0 = fmaf(lut[(words[q] >> (4 * i)) & 0xF], x[8 * q + i], s0);
            s1 = fmaf(lut[(words[q] >> (4 * i + 4)) & 0xF], x[8 * q + i + 1], s1);
        }
    }
    return s0 + s1;
}

// The lane's NB blocks of the input vector (zeros past the end), as f32.
template <typename T, int NB>
__device__ __forceinline__ void load_x(const T* __restrict__ x, int kb, int lane, float (&xr)[NB][32]) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const int g = lane + 32 * nb;
#pragma unroll
        for (int i = 0; i < 32; i++) xr[nb][i] = g < kb ? to_f32(x[32 * g + i]) : 0.f;
    }
}

// Dot product of one packed row with the lane's input blocks, reduced over the warp.
template <int NB>
__device__ __forceinline__ float row_dot(const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                         int kb, int lane, const float (&xr)[NB][32], const float* lut) {
    float acc = 0.f;
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const int g = lane + 32 * nb;
        if (g < kb) {
            const uint4 w = __ldg(reinterpret_cast<const uint4*>(blocks) + g);
            acc = fmaf(e8m0(__ldg(scales + g)), block_dot(w, xr[nb], lut), acc);
        }
    }
    return warp_sum(acc);
}

__device__ __forceinline__ void fill_lut(float* lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = FP4_TABLE[threadIdx.x];
    __syncthreads();
}

// grid (tokens * k, ceil(I / (WARPS * PPW))), block WARPS * 32: slots on x, which has no 65535 limit.
template <typename T, int NB>
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x, const uint32_t* __restrict__ ids,
                                                 const uint8_t* __restrict__ blocks,
                                                 const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                                 float* __restrict__ act, int k, int n_experts, int hidden,
                                                 int inter, float limit, float alpha) {
    __shared__ float lut[16];
    fill_lut(lut);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slot = blockIdx.x;
    const int t = slot / k;
    const uint32_t e = ids[slot];
    const int j0 = (blockIdx.y * WARPS + warp) * PPW;
    if (j0 >= inter) return;
    if (e >= (uint32_t)n_experts) {  // out of range: no contribution (the CPU reference errors)
        for (int j = j0 + lane; j < min(j0 + PPW, inter); j += 32) act[(long long)slot * inter + j] = 0.f;
        return;
    }
    const int kb = hidden / 32;
    float xr[NB][32];
    load_x<T, NB>(x + (long long)t * hidden, kb, lane, xr);
#pragma unroll
    for (int pp = 0; pp < PPW; pp++) {
        const int j = j0 + pp;
        if (j >= inter) break;
        const long long row = (long long)e * 2 * inter + 2 * j;  // gate row; up is row + 1
        const float g = row_dot<NB>(blocks + row * kb * 16, scales + row * kb, kb, lane, xr, lut);
        const float u = row_dot<NB>(blocks + (row + 1) * kb * 16, scales + (row + 1) * kb, kb, lane, xr, lut);
        if (lane == 0) {
            const float gate = fminf(g + bias[row], limit);
            const float up = fminf(fmaxf(u + bias[row + 1], -limit), limit);
            act[(long long)slot * inter + j] = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        }
    }
}

// grid (tokens, ceil(H / (WARPS * RPW))), block WARPS * 32.
template <typename T, int NB>
__device__ __forceinline__ void moe_down_impl(const float* __restrict__ act, const uint32_t* __restrict__ ids,
                                              const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                              const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                              T* __restrict__ out, int k, int n_experts, int hidden, int inter) {
    __shared__ float lut[16];
    fill_lut(lut);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x;
    const int r0 = (blockIdx.y * WARPS + warp) * RPW;
    if (r0 >= hidden) return;
    const int kb = inter / 32;
    float acc[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) acc[rr] = 0.f;
    for (int kk = 0; kk < k; kk++) {
        const int slot = t * k + kk;
        const uint32_t e = ids[slot];
        if (e >= (uint32_t)n_experts) continue;
        const float w = weights[slot];
        float xr[NB][32];
        load_x<float, NB>(act + (long long)slot * inter, kb, lane, xr);
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const int r = r0 + rr;
            if (r < hidden) {
                const long long row = (long long)e * hidden + r;
                const float d = row_dot<NB>(blocks + row * kb * 16, scales + row * kb, kb, lane, xr, lut);
                acc[rr] = fmaf(w, d + bias[row], acc[rr]);
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < RPW; rr++)
            if (r0 + rr < hidden) out[(long long)t * hidden + r0 + rr] = from_f32<T>(acc[rr]);
    }
}

#define MOE_GATE_UP(NAME, T, NB)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                             \
        NAME(const T* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales, const float* bias, \
             float* act, int k, int n_experts, int hidden, int inter, float limit, float alpha) {         \
        moe_gate_up_impl<T, NB>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha); \
    }

#define MOE_DOWN(NAME, T, NB)                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                             \
        NAME(const float* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,          \
             const uint8_t* scales, const float* bias, T* out, int k, int n_experts, int hidden, int inter) { \
        moe_down_impl<T, NB>(act, ids, weights, blocks, scales, bias, out, k, n_experts, hidden, inter);  \
    }

// NB = blocks of 32 per lane = ceil(K / 1024): K <= 1024, 2048, 3072 (gpt-oss: 2880), 4096.
MOE_GATE_UP(moe_gate_up_f32_nb1, float, 1)
MOE_GATE_UP(moe_gate_up_f32_nb2, float, 2)
MOE_GATE_UP(moe_gate_up_f32_nb3, float, 3)
MOE_GATE_UP(moe_gate_up_f32_nb4, float, 4)
MOE_GATE_UP(moe_gate_up_bf16_nb1, __nv_bfloat16, 1)
MOE_GATE_UP(moe_gate_up_bf16_nb2, __nv_bfloat16, 2)
MOE_GATE_UP(moe_gate_up_bf16_nb3, __nv_bfloat16, 3)
MOE_GATE_UP(moe_gate_up_bf16_nb4, __nv_bfloat16, 4)

MOE_DOWN(moe_down_f32_nb1, float, 1)
MOE_DOWN(moe_down_f32_nb2, float, 2)
MOE_DOWN(moe_down_f32_nb3, float, 3)
MOE_DOWN(moe_down_f32_nb4, float, 4)
MOE_DOWN(moe_down_bf16_nb1, __nv_bfloat16, 1)
MOE_DOWN(moe_down_bf16_nb2, __nv_bfloat16, 2)
MOE_DOWN(moe_down_bf16_nb3, __nv_bfloat16, 3)
MOE_DOWN(moe_down_bf16_nb4, __nv_bfloat16, 4)
