// An experiment for scripts/analysis/moe_decode_kernels.py (not built into inferno, not yet run on
// a GPU): moe_slot_mma.cu's single-token MoE with a persistent grid. The read-only probes say a
// layer's expert weights read as flat arrays take 12.8 us for gate_up against 14.4 us with the
// kernel's access pattern in blocks of one tile, and the kernel itself takes 19.5: its blocks
// live for three quads per warp, so every tile pays the block's start (routing read, address
// arithmetic, the first loads' latency) and its end (shared-memory reduction, sync).
//
// Here a block loops over (slot, tile) items item = blockIdx.x, + gridDim.x, ...: the first
// quad of the next item is loaded before this item's reduction and epilogue, and the reduction
// buffer is double-buffered so that no second sync per item is needed. Same maths, same order of
// every sum as moe_slot_mma.cu (so the results must match it bit for bit).
//
// grid (any), block (32 W). The act layout and the epilogues are moe_slot_mma.cu's.

#include "moe_slot_mma.cu"

// One item's routing: slot, tile, expert, on, first row.
struct SpItem {
    int slot, tile;
    bool on;
    long long row0;
};

__device__ __forceinline__ SpItem sp_item(int item, int tiles, const uint32_t* __restrict__ ids, int n_experts,
                                          int n_rows) {
    SpItem it;
    it.slot = item / tiles;
    it.tile = item % tiles;
    const uint32_t e = ids[it.slot];
    it.on = e < (uint32_t)n_experts;
    it.row0 = (long long)(it.on ? e : 0) * n_rows + 16 * it.tile;
    return it;
}

// The lane's row pointers for an item.
__device__ __forceinline__ void sp_rows(const SpItem& it, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, int kb, const uint4* (&row_w)[2],
                                        const uint8_t* (&row_s)[2]) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const long long row = it.row0 + 2 * g + h;
        row_w[h] = reinterpret_cast<const uint4*>(blocks) + row * kb;
        row_s[h] = scales + row * kb;
    }
}

// Items of NCOL input pieces; `epilogue(item, red)` runs after the item's partial sums are in
// red (block-wide sync done), by whichever threads it picks.
template <int NCOL, int W, typename Input, typename Epilogue>
__device__ __forceinline__ void sp_loop(const uint32_t* __restrict__ ids, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, int n_experts, int n_rows, int kb,
                                        int slots, Input input, Epilogue epilogue) {
    __shared__ float red[2][W][16][4];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tiles = n_rows / 16, total = slots * tiles, nq = (kb + 3) / 4;
    int item = blockIdx.x;
    if (item >= total) return;
    SpItem it = sp_item(item, tiles, ids, n_experts, n_rows);
    const uint4* row_w[2];
    const uint8_t* row_s[2];
    sp_rows(it, blocks, scales, kb, row_w, row_s);
    SlotQuad qd;
    sm_load_w(qd, 4 * w + t, kb, row_w, row_s, it.on);
    for (int buf = 0;; buf ^= 1) {
        const __nv_bfloat16* xg = g < NCOL ? input(it.slot, g) : nullptr;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
        for (int Q = w; Q < nq; Q += W) {
            if (Q != w) sm_load_w(qd, 4 * Q + t, kb, row_w, row_s, it.on);
            sm_load_x(qd, 4 * Q + t, kb, xg, it.on);
            if (__any_sync(FULL_MASK, (qd.s[0] | qd.s[1]) & 0x80u)) {
                sm_mma<true>(acc, qd);
            } else {
                sm_mma<false>(acc, qd);
            }
        }
        // The next item's first quad, before this one's reduction.
        const int next = item + gridDim.x;
        SpItem nit = it;
        if (next < total) {
            nit = sp_item(next, tiles, ids, n_experts, n_rows);
            sp_rows(nit, blocks, scales, kb, row_w, row_s);
            sm_load_w(qd, 4 * w + t, kb, row_w, row_s, nit.on);
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            if (2 * t + c < NCOL) {
                red[buf][w][2 * g][2 * t + c] = acc[c];
                red[buf][w][2 * g + 1][2 * t + c] = acc[2 + c];
            }
        }
        __syncthreads();
        epilogue(it, red[buf]);
        if (next >= total) return;
        item = next;
        it = nit;
    }
}

template <int W>
__device__ __forceinline__ void sp_gate_up(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ ids,
                                           const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                           const float* __restrict__ bias, __nv_bfloat16* __restrict__ act, int k,
                                           int n_experts, int hidden, int inter, float limit, float alpha,
                                           int slots) {
    pdl_wait();
    pdl_launch_dependents();
    auto input = [&](int slot, int) { return x + (long long)(slot / k) * hidden; };
    auto epilogue = [&](const SpItem& it, const float (&red)[W][16][4]) {
        const int j = threadIdx.x;
        if (j >= 8) return;
        float a = 0.f;
        if (it.on) {
            const float gate = fminf(sm_dot<1, W>(red, 2 * j) + bias[it.row0 + 2 * j], limit);
            const float up = fminf(fmaxf(sm_dot<1, W>(red, 2 * j + 1) + bias[it.row0 + 2 * j + 1], -limit), limit);
            a = gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
        }
        const __nv_bfloat16 hi = __float2bfloat16_rn(a);
        const float r = a - __bfloat162float(hi);
        const __nv_bfloat16 mid = __float2bfloat16_rn(r);
        __nv_bfloat16* out = act + (long long)it.slot * 3 * inter + 8 * it.tile + j;
        out[0] = hi;
        out[inter] = mid;
        out[2 * inter] = __float2bfloat16_rn(r - __bfloat162float(mid));
    };
    sp_loop<1, W>(ids, blocks, scales, n_experts, 2 * inter, hidden / 32, slots, input, epilogue);
}

template <int W>
__device__ __forceinline__ void sp_down(const __nv_bfloat16* __restrict__ act, const uint32_t* __restrict__ ids,
                                        const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                        float* __restrict__ part, int n_experts, int hidden, int inter, int slots) {
    pdl_wait();
    pdl_launch_dependents();
    auto input = [&](int slot, int g) { return act + (long long)slot * 3 * inter + (long long)g * inter; };
    auto epilogue = [&](const SpItem& it, const float (&red)[W][16][4]) {
        const int r = threadIdx.x;
        if (r >= 16) return;
        float out = 0.f;
        if (it.on) out = weights[it.slot] * (sm_dot<3, W>(red, r) + bias[it.row0 + r]);
        part[(long long)it.slot * hidden + 16 * it.tile + r] = out;
    };
    sp_loop<3, W>(ids, blocks, scales, n_experts, hidden, inter / 32, slots, input, epilogue);
}

#define SP_VARIANT(W)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * W) moe_sp_gate_up_w##W(                                \
        const __nv_bfloat16* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales,           \
        const float* bias, __nv_bfloat16* act, int k, int n_experts, int hidden, int inter, float limit,     \
        float alpha, int slots) {                                                                            \
        sp_gate_up<W>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha, slots);  \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * W) moe_sp_down_w##W(                                   \
        const __nv_bfloat16* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,          \
        const uint8_t* scales, const float* bias, float* part, int n_experts, int hidden, int inter,         \
        int slots) {                                                                                         \
        sp_down<W>(act, ids, weights, blocks, scales, bias, part, n_experts, hidden, inter, slots);          \
    }

SP_VARIANT(4)
SP_VARIANT(8)
