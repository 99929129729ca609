// Mixture of MXFP4 experts with gpt-oss's clamped SwiGLU, for the few-token (decode) case first.
//
// out[t] = sum_k w[t,k] * (down_e(act(gate_up_e(x[t]) + b1_e)) + b2_e),  e = ids[t,k]
// gate = row 2j, up = row 2j+1 of gate_up; gate = min(gate, limit); up = clamp(up, -limit, limit);
// act_j = gate * sigmoid(alpha * gate) * (up + 1).
//
// Two kernels, because every down row needs the whole activation vector of its (token, expert):
//   moe_gate_up: one (token, slot) per blockIdx.x; each warp computes PPW (gate, up) row pairs and
//                writes act[slot, j] (f32 scratch [tokens * k, I]).
//   moe_down:    one token per blockIdx.x and RPW output rows per block; the block's warps share
//                out the token's k slots and their sums are added in a fixed order, so the routing
//                weights and biases are applied without atomics (deterministic), out written once.
// Both are GEMVs straight off the packed weights [E, rows, K/32, 16] (+ scales [E, rows, K/32]):
// lane l of a warp owns the blocks l, l+32, ... (NB of them) of the reduction dimension K, keeps
// its 32·NB input values in registers (loaded once per warp, reused by every row), reads each of
// its row blocks with one 16-byte load, decodes the FP4 codes through a 16-entry table in shared
// memory and applies the block scale to the block's partial sum. f32 accumulation throughout.

#include "common.cuh"

#define WARPS 4
#define PPW 2   // gate/up row pairs per warp
#define RPW 4   // down rows per warp
#define XPAD 36 // x in shared memory: block g of 32 values at 36 g, so the lanes' 16-byte reads are conflict-free
#define MAX_KB 128  // blocks of 32 along K: K <= 4096

__constant__ float FP4_TABLE[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                    -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// 2^(s - 127), exact: byte 0 is the subnormal 2^-127 (no flush-to-zero in these kernels).
__device__ __forceinline__ float e8m0(uint32_t s) {
    return s == 0 ? 0x1p-127f : __uint_as_float(s << 23);
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

__device__ __forceinline__ void fill_lut(float* lut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = FP4_TABLE[threadIdx.x];
}

// Dot products of R packed rows (row indices into [rows, kb, 16]) with the lane's input blocks,
// reduced over the warp. All the rows' loads are issued before any arithmetic.
template <int NB, int R>
__device__ __forceinline__ void row_dots(const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                         const long long (&row)[R], const bool (&valid)[R], int kb, int lane,
                                         const float (&xr)[NB][32], const float* lut, float (&out)[R]) {
    uint4 w[R][NB];
    uint32_t s[R][NB];
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            const int g = lane + 32 * nb;
            if (valid[r] && g < kb) {
                w[r][nb] = __ldg(reinterpret_cast<const uint4*>(blocks) + row[r] * kb + g);
                s[r][nb] = __ldg(scales + row[r] * kb + g);
            } else {  // code 0 is +0: contributes nothing
                w[r][nb] = make_uint4(0, 0, 0, 0);
                s[r][nb] = 127;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float acc = 0.f;
#pragma unroll
        for (int nb = 0; nb < NB; nb++) acc = fmaf(e8m0(s[r][nb]), block_dot(w[r][nb], xr[nb], lut), acc);
        out[r] = warp_sum(acc);
    }
}

// grid (tokens * k, ceil(I / (WARPS * PPW))), block WARPS * 32: slots on x, which has no 65535 limit.
template <typename T, int NB>
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x, const uint32_t* __restrict__ ids,
                                                 const uint8_t* __restrict__ blocks,
                                                 const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                                 float* __restrict__ act, int k, int n_experts, int hidden,
                                                 int inter, float limit, float alpha) {
    __shared__ float lut[16];
    __shared__ __align__(16) float xs[MAX_KB * XPAD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slot = blockIdx.x;
    const int t = slot / k;
    const uint32_t e = ids[slot];
    const int kb = hidden / 32;
    fill_lut(lut);
    const T* xt = x + (long long)t * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) xs[(i >> 5) * XPAD + (i & 31)] = to_f32(xt[i]);
    __syncthreads();

    const int j0 = (blockIdx.y * WARPS + warp) * PPW;
    if (j0 >= inter) return;
    if (e >= (uint32_t)n_experts) {  // out of range: no contribution (the CPU reference errors)
        if (lane < PPW && j0 + lane < inter) act[(long long)slot * inter + j0 + lane] = 0.f;
        return;
    }
    float xr[NB][32];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        const int g = lane + 32 * nb;
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const float4 v = g < kb ? *reinterpret_cast<const float4*>(&xs[g * XPAD + 4 * q]) : make_float4(0.f, 0.f, 0.f, 0.f);
            xr[nb][4 * q] = v.x;
            xr[nb][4 * q + 1] = v.y;
            xr[nb][4 * q + 2] = v.z;
            xr[nb][4 * q + 3] = v.w;
        }
    }
    long long row[2 * PPW];
    bool valid[2 * PPW];
#pragma unroll
    for (int r = 0; r < 2 * PPW; r++) {  // gate row 2j, up row 2j + 1
        const int j = j0 + r / 2;
        valid[r] = j < inter;
        row[r] = (long long)e * 2 * inter + 2 * j + (r & 1);
    }
    float h[2 * PPW];
    row_dots<NB, 2 * PPW>(blocks, scales, row, valid, kb, lane, xr, lut, h);
    if (lane == 0) {
#pragma unroll
        for (int pp = 0; pp < PPW; pp++) {
            if (!valid[2 * pp]) continue;
            const float gate = fminf(h[2 * pp] + bias[row[2 * pp]], limit);
            const float up = fminf(fmaxf(h[2 * pp + 1] + bias[row[2 * pp + 1]], -limit), limit);
            act[(long long)slot * inter + j0 + pp] = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        }
    }
}

// grid (tokens, ceil(H / RPW)), block WARPS * 32: the block's warps share out the token's k
// slots (warp w takes slots w, w + WARPS, ...) for the same RPW rows, then the block adds the
// warps' sums in a fixed order.
template <typename T, int NB>
__device__ __forceinline__ void moe_down_impl(const float* __restrict__ act, const uint32_t* __restrict__ ids,
                                              const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                              const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                              T* __restrict__ out, int k, int n_experts, int hidden, int inter) {
    __shared__ float lut[16];
    __shared__ float part[WARPS][RPW];
    fill_lut(lut);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x;
    const int r0 = blockIdx.y * RPW;
    const int kb = inter / 32;
    float acc[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) acc[rr] = 0.f;
#pragma unroll 1
    for (int kk = warp; kk < k; kk += WARPS) {
        const int slot = t * k + kk;
        const uint32_t e = ids[slot];
        if (e >= (uint32_t)n_experts) continue;
        const float w = weights[slot];
        // The activations: our own scratch, 16-byte aligned (inter is a multiple of 32).
        const float4* a = reinterpret_cast<const float4*>(act + (long long)slot * inter);
        float xr[NB][32];
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            const int g = lane + 32 * nb;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const float4 v = g < kb ? __ldg(a + g * 8 + q) : make_float4(0.f, 0.f, 0.f, 0.f);
                xr[nb][4 * q] = v.x;
                xr[nb][4 * q + 1] = v.y;
                xr[nb][4 * q + 2] = v.z;
                xr[nb][4 * q + 3] = v.w;
            }
        }
        long long row[RPW];
        bool valid[RPW];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            valid[rr] = r0 + rr < hidden;
            row[rr] = (long long)e * hidden + r0 + rr;
        }
        float d[RPW];
        row_dots<NB, RPW>(blocks, scales, row, valid, kb, lane, xr, lut, d);
#pragma unroll
        for (int rr = 0; rr < RPW; rr++)
            if (valid[rr]) acc[rr] = fmaf(w, d[rr] + bias[row[rr]], acc[rr]);
    }
    if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) part[warp][rr] = acc[rr];
    }
    __syncthreads();
    if (threadIdx.x < RPW && r0 + threadIdx.x < hidden) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) sum += part[w][threadIdx.x];
        out[(long long)t * hidden + r0 + threadIdx.x] = from_f32<T>(sum);
    }
}

#define MOE_GATE_UP(NAME, T, NB, MINB)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)                                           \
        NAME(const T* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales, const float* bias, \
             float* act, int k, int n_experts, int hidden, int inter, float limit, float alpha) {         \
        moe_gate_up_impl<T, NB>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha); \
    }

#define MOE_DOWN(NAME, T, NB, MINB)                                                                             \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)                                           \
        NAME(const float* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,          \
             const uint8_t* scales, const float* bias, T* out, int k, int n_experts, int hidden, int inter) { \
        moe_down_impl<T, NB>(act, ids, weights, blocks, scales, bias, out, k, n_experts, hidden, inter);  \
    }

// NB = blocks of 32 per lane = ceil(K / 1024): K <= 1024, 2048, 3072 (gpt-oss: 2880), 4096.
// MINB: blocks per SM to fit, which caps registers at 168 (NB 4 needs more: 2 blocks, 255).
MOE_GATE_UP(moe_gate_up_f32_nb1, float, 1, 3)
MOE_GATE_UP(moe_gate_up_f32_nb2, float, 2, 3)
MOE_GATE_UP(moe_gate_up_f32_nb3, float, 3, 3)
MOE_GATE_UP(moe_gate_up_f32_nb4, float, 4, 2)
MOE_GATE_UP(moe_gate_up_bf16_nb1, __nv_bfloat16, 1, 3)
MOE_GATE_UP(moe_gate_up_bf16_nb2, __nv_bfloat16, 2, 3)
MOE_GATE_UP(moe_gate_up_bf16_nb3, __nv_bfloat16, 3, 3)
MOE_GATE_UP(moe_gate_up_bf16_nb4, __nv_bfloat16, 4, 2)

MOE_DOWN(moe_down_f32_nb1, float, 1, 3)
MOE_DOWN(moe_down_f32_nb2, float, 2, 3)
MOE_DOWN(moe_down_f32_nb3, float, 3, 3)
MOE_DOWN(moe_down_f32_nb4, float, 4, 2)
MOE_DOWN(moe_down_bf16_nb1, __nv_bfloat16, 1, 3)
MOE_DOWN(moe_down_bf16_nb2, __nv_bfloat16, 2, 3)
MOE_DOWN(moe_down_bf16_nb3, __nv_bfloat16, 3, 3)
MOE_DOWN(moe_down_bf16_nb4, __nv_bfloat16, 4, 2)
