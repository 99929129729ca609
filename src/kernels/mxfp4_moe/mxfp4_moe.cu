// Mixture of MXFP4 experts with gpt-oss's clamped SwiGLU, for the few-token (decode) case first.
//
// out[t] = sum_k w[t,k] * (down_e(act(gate_up_e(x[t]) + b1_e)) + b2_e),  e = ids[t,k]
// gate = row 2j, up = row 2j+1 of gate_up; gate = min(gate, limit); up = clamp(up, -limit, limit);
// act_j = gate * sigmoid(alpha * gate) * (up + 1).
//
// Three kernels, because every down row needs the whole activation vector of its (token, expert)
// and the experts' outputs are summed without atomics (deterministic):
//   moe_gate_up: per (token, slot) and ROWS gate_up rows: GEMV, bias, SwiGLU -> act [tokens*k, I] f32.
//   moe_down:    per (token, slot) and ROWS down rows: GEMV, bias, times the routing weight
//                -> part [tokens*k, H] f32.
//   moe_sum:     out[t] = sum over the token's k slots of part, in slot order.
// The GEMVs run straight off the packed weights [E, rows, K/32, 16] (+ scales [E, rows, K/32]).
// A block has WK = ceil(K / 1024) warps along K: lane l of warp y owns block g = 32 y + l, keeps its
// 32 inputs in registers (staged through shared memory), reads its block of each row with one
// 16-byte load (a warp reads 512 contiguous bytes), decodes the FP4 codes through a 16-entry table
// in shared memory and scales the block's partial sum; warps reduce with shuffles and the block
// adds its warps' sums. Rows go RSTEP at a time, the next step's loads issued before this step's
// arithmetic; the loop stays rolled (two steps per turn, static buffers) to keep the code small.
// f32 accumulation throughout.

#include "activation.cuh"
#include "mxfp4.cuh"

// Template parameters of the GEMVs: RSTEP rows per step, ROWS rows per block (a multiple of
// 2 RSTEP; gate_up: ROWS / 2 gate/up pairs).
#define MAX_WK 8     // warps along K, one block of 32 per lane: K <= 8192
#define XPAD 36      // inputs in shared memory: block g of 32 values at 36 g (conflict-free 16-byte reads)


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
template <int RSTEP>
struct Step {
    uint4 w[RSTEP];
    uint32_t s[RSTEP];
};

template <int RSTEP>
__device__ __forceinline__ void load_step(Step<RSTEP>& st, const uint8_t* __restrict__ blocks,
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
template <int RSTEP>
__device__ __forceinline__ void dot_step(const Step<RSTEP>& st, const float* xr, const float* lut, float (&out)[RSTEP]) {
#pragma unroll
    for (int r = 0; r < RSTEP; r++) out[r] = warp_sum(e8m0(st.s[r]) * block_dot(st.w[r], xr, lut));
}

// One block: slot blockIdx.x (expert e = ids[slot]), rows blockIdx.y * ROWS .. + ROWS of that
// expert's [n_rows, K] matrix, dotted with input row (slot / in_div) of `in` [*, K]. Leaves the
// row sums in red (summed over the warps by the caller's epilogue). Block (32, WK).
template <typename TIn, int RSTEP, int ROWS>
__device__ __forceinline__ void gemv_rows(const TIn* __restrict__ in, int in_div, const uint32_t* __restrict__ ids,
                                          const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                          int n_experts, int n_rows, int K, float* xs, float* lut,
                                          float (*red)[ROWS], bool& on, long long& row0) {
    constexpr int NST = ROWS / RSTEP;
    const int lane = threadIdx.x, wk = threadIdx.y, tid = wk * 32 + lane;
    const int nthreads = 32 * blockDim.y;
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    on = e < (uint32_t)n_experts;  // off: no contribution (the CPU reference errors)
    const int kb = K / 32, g = wk * 32 + lane;
    row0 = (long long)(on ? e : 0) * n_rows + (long long)blockIdx.y * ROWS;

    Step<RSTEP> a, b;
    load_step(a, blocks, scales, row0, kb, g, on);
    if (tid < 16) lut[tid] = FP4_TABLE[tid];
    const TIn* xt = in + (long long)(slot / in_div) * K;
#pragma unroll 8
    for (int i = tid; i < K; i += nthreads) xs[(i >> 5) * XPAD + (i & 31)] = to_f32(xt[i]);
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
#pragma unroll 1
    for (int st = 0; st < NST; st += 2) {
        load_step(b, blocks, scales, row0 + (st + 1) * RSTEP, kb, g, on);
        float d[RSTEP];
        dot_step(a, xr, lut, d);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RSTEP; r++) red[wk][st * RSTEP + r] = d[r];
        }
        if (st + 2 < NST) load_step(a, blocks, scales, row0 + (st + 2) * RSTEP, kb, g, on);
        dot_step(b, xr, lut, d);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RSTEP; r++) red[wk][(st + 1) * RSTEP + r] = d[r];
        }
    }
    __syncthreads();
}

// grid (tokens * k, 2I / ROWS): slots on x, which has no 65535 limit. act[slot, j] for the block's
// ROWS / 2 gate/up pairs (gate row 2j, up row 2j + 1).
template <typename T, int RSTEP, int ROWS>
__device__ __forceinline__ void moe_gate_up_impl(const T* __restrict__ x, const uint32_t* __restrict__ ids,
                                                 const uint8_t* __restrict__ blocks,
                                                 const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                                 float* __restrict__ act, int k, int n_experts, int hidden,
                                                 int inter, float limit, float alpha) {
    pdl_wait();
    extern __shared__ __align__(16) float xs[];  // [K / 32 * XPAD], sized by the launch
    __shared__ float lut[16];
    __shared__ float red[MAX_WK][ROWS];
    bool on;
    long long row0;
    gemv_rows<T, RSTEP, ROWS>(x, k, ids, blocks, scales, n_experts, 2 * inter, hidden, xs, lut, red, on, row0);
    const int tid = threadIdx.y * 32 + threadIdx.x;
    if (tid < ROWS / 2) {
        float out = 0.f;
        if (on) {
            float gs = 0.f, us = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) {
                gs += red[w][2 * tid];
                us += red[w][2 * tid + 1];
            }
            out = swiglu_clamped(gs + bias[row0 + 2 * tid], us + bias[row0 + 2 * tid + 1], limit, alpha);
        }
        act[(long long)blockIdx.x * inter + blockIdx.y * (ROWS / 2) + tid] = out;
    }
}

// grid (tokens * k, H / ROWS). part[slot, r] = w[slot] * (dot + bias) for the block's rows.
template <int RSTEP, int ROWS>
__device__ __forceinline__ void moe_down_impl(const float* __restrict__ act, const uint32_t* __restrict__ ids,
                                              const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                              const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                              float* __restrict__ part, int n_experts, int hidden, int inter) {
    pdl_wait();
    extern __shared__ __align__(16) float xs[];
    __shared__ float lut[16];
    __shared__ float red[MAX_WK][ROWS];
    bool on;
    long long row0;
    gemv_rows<float, RSTEP, ROWS>(act, 1, ids, blocks, scales, n_experts, hidden, inter, xs, lut, red, on, row0);
    const int tid = threadIdx.y * 32 + threadIdx.x;
    if (tid < ROWS) {
        float out = 0.f;
        if (on) {
            float dot = 0.f;
            for (int w = 0; w < (int)blockDim.y; w++) dot += red[w][tid];
            out = weights[blockIdx.x] * (dot + bias[row0 + tid]);
        }
        part[(long long)blockIdx.x * hidden + blockIdx.y * ROWS + tid] = out;
    }
}

// out[t, r] = sum over kk < k of part[t * k + kk, r], in order, skipping slots routed to no valid
// expert (the grouped kernels never write those). One thread per output element.
template <typename T>
__device__ __forceinline__ void moe_sum_impl(const float* __restrict__ part, const uint32_t* __restrict__ ids,
                                             T* __restrict__ out, int tokens, int k, int hidden, int n_experts) {
    pdl_wait();  // part is the previous kernel's (gpu.rs launches this one with PDL)
    pdl_launch_dependents();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * hidden) return;
    const long long t = i / hidden, r = i % hidden;
    float acc = 0.f;
    for (int kk = 0; kk < k; kk++) {
        if (ids[t * k + kk] < (uint32_t)n_experts) acc += part[(t * k + kk) * hidden + r];
    }
    out[i] = from_f32<T>(acc);
}
#define MOE_GATE_UP(NAME, T, RSTEP, ROWS)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MAX_WK)                                              \
        NAME(const T* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales, const float* bias, \
             float* act, int k, int n_experts, int hidden, int inter, float limit, float alpha) {           \
        moe_gate_up_impl<T, RSTEP, ROWS>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, \
                                         alpha);                                                           \
    }

#define MOE_DOWN(NAME, RSTEP, ROWS)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MAX_WK)                                              \
        NAME(const float* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,            \
             const uint8_t* scales, const float* bias, float* part, int n_experts, int hidden, int inter) {  \
        moe_down_impl<RSTEP, ROWS>(act, ids, weights, blocks, scales, bias, part, n_experts, hidden, inter); \
    }

// Variants _r{ROWS}, all with RSTEP 2; gpu.rs picks one. Measured on an H200 for gpt-oss-20b
// sizes, RSTEP 4 or 8 was no faster; 16 rows per block suit one or two tokens (more blocks),
// 32 rows more tokens.
#define MOE_VARIANTS(R)                                             \
    MOE_GATE_UP(moe_gate_up_f32_r##R, float, 2, R)                  \
    MOE_GATE_UP(moe_gate_up_bf16_r##R, __nv_bfloat16, 2, R)         \
    MOE_DOWN(moe_down_r##R, 2, R)

MOE_VARIANTS(16)
MOE_VARIANTS(32)

extern "C" __global__ void moe_sum_f32(const float* part, const uint32_t* ids, float* out, int tokens, int k,
                                       int hidden, int n_experts) {
    moe_sum_impl<float>(part, ids, out, tokens, k, hidden, n_experts);
}

extern "C" __global__ void moe_sum_bf16(const float* part, const uint32_t* ids, __nv_bfloat16* out, int tokens,
                                        int k, int hidden, int n_experts) {
    moe_sum_impl<__nv_bfloat16>(part, ids, out, tokens, k, hidden, n_experts);
}
