// Mixture of MXFP4 experts with gpt-oss's clamped SwiGLU, for the few-token (decode) case first.
//
// out[t] = sum_k w[t,k] * (down_e(act(gate_up_e(x[t]) + b1_e)) + b2_e),  e = ids[t,k]
// gate = row 2j, up = row 2j+1 of gate_up; gate = min(gate, limit); up = clamp(up, -limit, limit);
// act_j = gate * sigmoid(alpha * gate) * (up + 1).
//
// Two kernels, because every down row needs the whole activation vector of its (token, expert):
//   moe_gate_up: one (token, slot) and 16 gate_up rows per block; writes act[slot, j], an f32
//                scratch [tokens * k, I], with the bias and the SwiGLU applied.
//   moe_down:    one token and 8 output rows per block, over the token's k experts; the routing
//                weights and biases are applied and the experts summed in a fixed order (no
//                atomics: deterministic), out written once.
// Both are GEMVs straight off the packed weights [E, rows, K/32, 16] (+ scales [E, rows, K/32]).
// A block has WK = ceil(K / 1024) warps along K: lane l of warp y owns block g = 32 y + l, keeps its
// 32 input values in registers, reads its block of each row with one 16-byte load (a warp reads
// 512 contiguous bytes), decodes the FP4 codes through a 16-entry table in shared memory and
// scales the block's partial sum; warps reduce with shuffles, the block adds the warps' sums.
// Rows go RSTEP at a time with the next step's loads already issued. f32 accumulation throughout.

#include "common.cuh"

#define RSTEP 4      // rows per step: the next step's loads overlap this step's arithmetic
#define GU_ROWS 32   // gate_up rows per block (16 gate/up pairs)
#define DOWN_ROWS 8  // down rows per block
#define MAX_SLOTS 8  // experts per token (k) the down kernel can sum
#define MAX_WK 8     // warps along K, one block of 32 per lane: K <= 8192
#define XPAD 36      // x in shared memory: block g of 32 values at 36 g, so the lanes' 16-byte reads are conflict-free

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

// Loads of one step: RSTEP consecutive rows' block g (this lane's), zeros past the end of K.
struct Step {
    uint4 w[RSTEP];
    uint32_t s[RSTEP];
};

__device__ __forceinline__ void load_step(Step& st, const uint8_t* __restrict__ blocks,
                                          const uint8_t* __restrict__ scales, long long row0, int kb, int g,
                                          bool on) {
#pragma unroll
    for (int r = 0; r < RSTEP; r++) {
        if (on && g < kb) {
            st.w[r] = __ldg(reinterpret_cast<const uint4*>(blocks) + (row0 + r) * kb + g);
            st.s[r] = __ldg(scales + (row0 + r) * kb + g);
        } else {  // code 0 is +0: contributes nothing
            st.w[r] = make_uint4(0, 0, 0, 0);
            st.s[r] = 127;
        }
    }
}

// The step's rows dotted with the lane's 32 inputs, summed over the warp (each warp holds one
// slice of K; the block adds the slices).
__device__ __forceinline__ void dot_step(const Step& st, const float* xr, const float* lut, float (&out)[RSTEP]) {
#pragma unroll
    for (int r = 0; r < RSTEP; r++) out[r] = warp_sum(e8m0(st.s[r]) * block_dot(st.w[r], xr, lut));
}

// Block (32, WK): lane l of warp y owns block g = 32 y + l of K (WK = ceil(K / 1024) warps).
//
// grid (tokens * k, 2I / GU_ROWS): slots on x, which has no 65535 limit. The block computes
// GU_ROWS consecutive gate_up rows (GU_ROWS / 2 gate/up pairs) of its slot's expert, RSTEP rows
// at a time with the next step's loads in flight, and writes act[slot, pair].
template <typename T>
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x, const uint32_t* __restrict__ ids,
                                                 const uint8_t* __restrict__ blocks,
                                                 const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                                 float* __restrict__ act, int k, int n_experts, int hidden,
                                                 int inter, float limit, float alpha) {
    __shared__ float lut[16];
    extern __shared__ __align__(16) float xs[];  // [kb * XPAD], sized by the launch
    __shared__ float red[MAX_WK][GU_ROWS];
    const int lane = threadIdx.x, wk = threadIdx.y, tid = wk * 32 + lane;
    const int nthreads = 32 * blockDim.y;
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    const bool on = e < (uint32_t)n_experts;  // off: no contribution (the CPU reference errors)
    const int kb = hidden / 32, g = wk * 32 + lane;
    const long long row0 = (long long)(on ? e : 0) * 2 * inter + (long long)blockIdx.y * GU_ROWS;

    // Steps go through three buffers: two steps' loads in flight during each step's arithmetic.
    constexpr int NST = GU_ROWS / RSTEP;
    Step buf[3];
    load_step(buf[0], blocks, scales, row0, kb, g, on);
    load_step(buf[1], blocks, scales, row0 + RSTEP, kb, g, on);
    if (tid < 16) lut[tid] = FP4_TABLE[tid];
    const T* xt = x + (long long)(slot / k) * hidden;
    // Unrolled so that each thread has several loads in flight (x may be any alignment: no
    // vector loads).
#pragma unroll 8
    for (int i = tid; i < hidden; i += nthreads) xs[(i >> 5) * XPAD + (i & 31)] = to_f32(xt[i]);
    __syncthreads();
    float xr[32];
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float4 v = g < kb ? *reinterpret_cast<const float4*>(&xs[g * XPAD + 4 * q]) : make_float4(0.f, 0.f, 0.f, 0.f);
        xr[4 * q] = v.x;
        xr[4 * q + 1] = v.y;
        xr[4 * q + 2] = v.z;
        xr[4 * q + 3] = v.w;
    }
#pragma unroll
    for (int st = 0; st < NST; st++) {
        if (st + 2 < NST) load_step(buf[(st + 2) % 3], blocks, scales, row0 + (st + 2) * RSTEP, kb, g, on);
        float d[RSTEP];
        dot_step(buf[st % 3], xr, lut, d);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RSTEP; r++) red[wk][st * RSTEP + r] = d[r];
        }
    }
    __syncthreads();
    if (tid < GU_ROWS / 2) {  // pair tid: gate row 2 tid, up row 2 tid + 1
        const int j = blockIdx.y * (GU_ROWS / 2) + tid;
        float out = 0.f;
        if (on) {
            float gs = 0.f, us = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) {
                gs += red[w][2 * tid];
                us += red[w][2 * tid + 1];
            }
            const float gate = fminf(gs + bias[row0 + 2 * tid], limit);
            const float up = fminf(fmaxf(us + bias[row0 + 2 * tid + 1], -limit), limit);
            out = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        }
        act[(long long)slot * inter + j] = out;
    }
}

// grid (tokens, H / DOWN_ROWS), block (32, WK) as above. The block computes DOWN_ROWS output rows
// for each of the token's k <= MAX_SLOTS experts in turn (the next step's loads, and the next
// expert's activations, in flight during each step), then adds w * (dot + bias) over the experts
// in a fixed order: no atomics, deterministic, out written once.
template <typename T>
__device__ __forceinline__ void moe_down_impl(const float* __restrict__ act, const uint32_t* __restrict__ ids,
                                              const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                              const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                              T* __restrict__ out, int k, int n_experts, int hidden, int inter) {
    __shared__ float lut[16];
    __shared__ float red[MAX_SLOTS][MAX_WK][DOWN_ROWS];
    __shared__ int eid[MAX_SLOTS];  // the token's experts, -1 where out of range
    constexpr int NST = DOWN_ROWS / RSTEP;
    const int lane = threadIdx.x, wk = threadIdx.y, tid = wk * 32 + lane;
    const int t = blockIdx.x;
    const int kb = inter / 32, g = wk * 32 + lane;
    const int r0 = blockIdx.y * DOWN_ROWS;
    if (tid < 16) lut[tid] = FP4_TABLE[tid];
    if (tid < k) {
        const uint32_t e = ids[t * k + tid];
        eid[tid] = e < (uint32_t)n_experts ? (int)e : -1;
    }
    __syncthreads();

    // Iteration it = slot kk * NST + step: rows r0 + step * RSTEP of expert eid[kk].
    auto expert = [&](int kk) { return eid[kk]; };
    auto load_x = [&](int kk, float (&xr)[32]) {
        const float4* a = reinterpret_cast<const float4*>(act + (long long)(t * k + kk) * inter);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const float4 v = g < kb ? __ldg(a + g * 8 + q) : make_float4(0.f, 0.f, 0.f, 0.f);
            xr[4 * q] = v.x;
            xr[4 * q + 1] = v.y;
            xr[4 * q + 2] = v.z;
            xr[4 * q + 3] = v.w;
        }
    };
    // Iterations go through three step buffers (two steps' loads in flight during each step's
    // arithmetic) and two activation buffers (the next expert's load during this expert's first
    // step). The loop is unrolled so that every buffer index is static: a register copy of a
    // buffer would wait for its loads.
    const int total = k * NST;
    auto issue = [&](Step& st, int it) {
        const int e1 = expert(it / NST);
        load_step(st, blocks, scales, (long long)max(e1, 0) * hidden + r0 + (it % NST) * RSTEP, kb, g, e1 >= 0);
    };
    Step buf[3];
    float xb[2][32];
    issue(buf[0], 0);
    if (total > 1) issue(buf[1], 1);
    load_x(0, xb[0]);
#pragma unroll
    for (int it = 0; it < MAX_SLOTS * NST; it++) {
        if (it >= total) break;
        const int kk = it / NST, st = it % NST;
        if (it + 2 < total) issue(buf[(it + 2) % 3], it + 2);
        if (st == 0 && kk + 1 < k) load_x(kk + 1, xb[(kk + 1) & 1]);
        float d[RSTEP];
        dot_step(buf[it % 3], xb[kk & 1], lut, d);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RSTEP; r++) red[kk][wk][st * RSTEP + r] = d[r];
        }
    }
    __syncthreads();
    if (tid < DOWN_ROWS) {
        float acc = 0.f;
        for (int kk = 0; kk < k; kk++) {
            const int ek = expert(kk);
            if (ek < 0) continue;
            float dot = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) dot += red[kk][w][tid];
            acc = fmaf(weights[t * k + kk], dot + bias[(long long)ek * hidden + r0 + tid], acc);
        }
        out[(long long)t * hidden + r0 + tid] = from_f32<T>(acc);
    }
}

#define MOE_GATE_UP(NAME, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MAX_WK)                                            \
        NAME(const T* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales, const float* bias, \
             float* act, int k, int n_experts, int hidden, int inter, float limit, float alpha) {         \
        moe_gate_up_impl<T>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha); \
    }

#define MOE_DOWN(NAME, T)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MAX_WK)                                            \
        NAME(const float* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,          \
             const uint8_t* scales, const float* bias, T* out, int k, int n_experts, int hidden, int inter) { \
        moe_down_impl<T>(act, ids, weights, blocks, scales, bias, out, k, n_experts, hidden, inter);      \
    }

MOE_GATE_UP(moe_gate_up_f32, float)
MOE_GATE_UP(moe_gate_up_bf16, __nv_bfloat16)
MOE_DOWN(moe_down_f32, float)
MOE_DOWN(moe_down_bf16, __nv_bfloat16)
