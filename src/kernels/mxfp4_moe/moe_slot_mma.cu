// The MXFP4 experts for decode batches of a few tokens, per (token, slot) like mxfp4_moe.cu's GEMVs (same
// maths, see mod.rs), but on tensor cores with K split over the warps of a block.
//
// Why: at batch 1 the per-slot GEMVs decoded every FP4 value through a table in shared memory
// and multiplied it in f32 (a shared-memory load, a bit-field extract and an FMA per weight): the
// shared-memory pipe alone took ~9 us per gate_up call, about what reading its 35 MB takes. Here a
// value costs about two logic ops (mxfp4_mma.cuh: the codes go straight into bf16 mma fragments,
// the E8M0 scale applied by one bf16x2 multiply per pair) and the products run on tensor cores.
// A kernel that gives each warp whole rows over all of K takes 90 dependent steps per warp at one
// token for gpt-oss; here K is cut over the block's warps and the partial sums meet in shared
// memory (in a fixed order: deterministic).
//
// One block = one slot (blockIdx.x) and one tile of 16 weight rows (blockIdx.y; or two tiles, each
// warp taking both with one load of the input per quad: *_TWO_TILES), W warps. The tile
// is the 16-row A operand of mma.m16n8k16 (fragment row g = weight row 2g, row g + 8 = row 2g + 1:
// for gate_up the gate and the up value of pair g); the input is B, one column per bf16 piece of
// it: 1 for bf16 x (exact), 3 for the f32 activations between the projections (hi + mid + lo: the
// f32 value exactly), the other 5 columns zero. Lane (g, t) of a warp reads the whole 32-value
// block 4Q + t of its two rows (16-byte loads; a quad of lanes reads 64 contiguous bytes of each
// row) for the quads of blocks Q = w, w + W, ... Measured on an H100 at gpt-oss-20b sizes
// (scripts/analysis/moe_decode_kernels.py, 24 layers of cold weights), gate_up + down + sum per
// layer: 33 us against the table GEMVs' 56 (8 warps; 4 warps 33.4-33.8). No faster (34-47 us): two
// quads loaded before either is used, double-buffered loads, two tiles per warp, the input staged
// in shared memory (also with the registers that frees: 48, 5 blocks per multiprocessor), the
// weights streamed through a 3- to 6-stage cp.async ring in shared memory, the weights as the B
// operand (8 rows per load instead of 16, twice the mma instructions), a register cap for more
// blocks per multiprocessor, or integer dot products (scripts/analysis/moe_slot_dp4a.cu: fewer
// instructions per weight, 36 us). Taken apart (the same script): its loads alone take as long as
// the whole kernel, its arithmetic alone 15 of gate_up's 19.5 us, and a read-only kernel with the
// same access pattern reads gate_up's 35 MB in 14.4 us (2.4 TB/s; 12.8 us as one flat array): what
// is left is in how the loads are spread, not in the arithmetic. Keep the loop as it is: moving the
// next quad's weight loads to the end of the loop body made both kernels ~3 us slower.
//
//   moe_sm_gate_up: gate_up rows, bias, clamped SwiGLU -> act [slots, 3, I] bf16 (hi, mid, lo).
//   moe_sm_down:    down rows, bias, routing weight -> part [slots, H] f32, which mxfp4_moe.cu's
//                   moe_sum adds in slot order; or, given counters, the last of a token's k
//                   blocks of a row tile adds them itself (the same sums in the same order: the
//                   same bits), and moe_sum's launch is saved.

#include "common.cuh"
#include "mxfp4_mma.cuh"

// One quad for a lane: block b of its two rows in each of the warp's MT tiles, their scales, and
// (lanes whose fragment column g < NCOL) the 32 input values of piece g at block b.
template <int MT>
struct SlotQuad {
    uint4 w[MT][2];
    uint32_t s[MT][2];
    uint4 x[4];
};

// row_w / row_s: the lane's two rows' blocks and scales in each tile (tile i, row h at [i][h]).
// Zeros past kb. Read-only data: may be loaded before pdl_wait().
template <int MT>
__device__ __forceinline__ void sm_load_w(SlotQuad<MT>& qd, int b, int kb, const uint4* const (&row_w)[MT][2],
                                          const uint8_t* const (&row_s)[MT][2], bool on) {
    const bool in = on && b < kb;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            qd.w[i][h] = in ? __ldg(row_w[i][h] + b) : make_uint4(0, 0, 0, 0);  // code 0 is +0: nothing
            qd.s[i][h] = in ? __ldg(row_s[i][h] + b) : 127u;
        }
}

// xg: piece g of the input row (nullptr for lanes with no column). Written by the kernel before:
// only after pdl_wait().
template <int MT>
__device__ __forceinline__ void sm_load_x(SlotQuad<MT>& qd, int b, int kb, const __nv_bfloat16* xg, bool on) {
    const bool in = on && b < kb && xg;
#pragma unroll
    for (int q = 0; q < 4; q++)
        qd.x[q] = in ? __ldg(reinterpret_cast<const uint4*>(xg + 32 * b + 8 * q)) : make_uint4(0, 0, 0, 0);
}

// acc += k16 step ST of word q (nibble pairs (2 ST, 2 ST + 4) and (2 ST + 1, 2 ST + 5)) of the
// lane's two rows, against the input word xq at the same positions.
template <int ST, bool BIG>
__device__ __forceinline__ void sm_step(float (&acc)[4], const uint4& xq, uint32_t w0, uint32_t w1, const Scale& s0,
                                        const Scale& s1) {
    uint32_t b0, b1;
    b_frag(xq, ST, b0, b1);
    const uint32_t a[4] = {fp4_pair<2 * ST, BIG>(w0, s0), fp4_pair<2 * ST, BIG>(w1, s1),
                           fp4_pair<2 * ST + 1, BIG>(w0, s0), fp4_pair<2 * ST + 1, BIG>(w1, s1)};
    mma_bf16(acc, a, b0, b1);
}

// acc[i] += the quad's products of tile i (each tile's in the same order as a lone tile's).
template <bool BIG, int MT>
__device__ __forceinline__ void sm_mma(float (&acc)[MT][4], const SlotQuad<MT>& qd) {
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const Scale s0 = scale_of<BIG>(qd.s[i][0]), s1 = scale_of<BIG>(qd.s[i][1]);
        const uint32_t w0[4] = {qd.w[i][0].x, qd.w[i][0].y, qd.w[i][0].z, qd.w[i][0].w};
        const uint32_t w1[4] = {qd.w[i][1].x, qd.w[i][1].y, qd.w[i][1].z, qd.w[i][1].w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            sm_step<0, BIG>(acc[i], qd.x[q], w0[q], w1[q], s0, s1);
            sm_step<1, BIG>(acc[i], qd.x[q], w0[q], w1[q], s0, s1);
        }
    }
}

// The block's MT tiles (rows row0 .. row0 + 16 MT - 1 of the [*, K/32, 16] matrix) dotted with the
// NCOL pieces of the input (piece c at x + c * x_stride, K bf16 values each), summed over the
// warps: red[w][r][c] for warp w, row r (weight row row0 + r) and piece c. WAIT: the first
// weights are loaded, then pdl_wait(), then the input. Ends with a block-level sync; every thread
// of the block must call it. A row's sum is the same whatever MT (the same quads, warps, order).
template <int NCOL, int W, bool WAIT, int MT = 1>
__device__ __forceinline__ void sm_tile(float (&red)[W][16 * MT][4], const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, long long row0, int kb,
                                        const __nv_bfloat16* x, long long x_stride, bool on) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint4* row_w[MT][2];
    const uint8_t* row_s[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long row = row0 + 16 * i + 2 * g + h;
            row_w[i][h] = reinterpret_cast<const uint4*>(blocks) + row * kb;
            row_s[i][h] = scales + row * kb;
        }
    const __nv_bfloat16* xg = g < NCOL ? x + g * x_stride : nullptr;
    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = 0.f;
    const int nq = (kb + 3) / 4;
    // Quad Q's products, its weights in qd: the input's loads, then the mma chain.
    auto quad = [&](SlotQuad<MT>& qd, int Q) {
        sm_load_x(qd, 4 * Q + t, kb, xg, on);
        // A scale of 128 or more in any lane takes the slow decode (warp-uniform).
        uint32_t big = 0;
#pragma unroll
        for (int i = 0; i < MT; i++) big |= qd.s[i][0] | qd.s[i][1];
        if (__any_sync(FULL_MASK, big & 0x80u)) {
            sm_mma<true>(acc, qd);
        } else {
            sm_mma<false>(acc, qd);
        }
    };
    SlotQuad<MT> p, n;
    sm_load_w(p, 4 * w + t, kb, row_w, row_s, on);
    // Fewer than 8 warps walk longer chains: there the next quad's weights are in flight while a
    // quad's products run (two buffers, as gemv_chain; with 8 warps that gained nothing).
    constexpr bool AHEAD = W < 8;
    if (AHEAD) sm_load_w(n, 4 * (w + W) + t, kb, row_w, row_s, on);
    if (WAIT) {  // the input is the previous kernel's output; the first weights are on their way
        pdl_wait();
        pdl_launch_dependents();
    }
    // A slot routed to no expert (a decode graph's padding) reads nothing and its sums stay
    // zero: its block skips the products, which would all be of zeros.
    if (on && AHEAD) {
#pragma unroll 1
        for (int Q = w; Q < nq; Q += 2 * W) {
            if (Q != w) sm_load_w(n, 4 * (Q + W) + t, kb, row_w, row_s, on);
            quad(p, Q);
            if (Q + W >= nq) break;
            if (Q + 2 * W < nq) sm_load_w(p, 4 * (Q + 2 * W) + t, kb, row_w, row_s, on);
            quad(n, Q + W);
        }
    } else if (on) {
#pragma unroll 1
        for (int Q = w; Q < nq; Q += W) {
            if (Q != w) sm_load_w(p, 4 * Q + t, kb, row_w, row_s, on);
            quad(p, Q);
        }
    }
    // Lane (g, t): columns (pieces) 2t, 2t + 1 of fragment rows g (acc 0, 1: tile row 2g) and
    // g + 8 (acc 2, 3: tile row 2g + 1) of each tile.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            if (2 * t + c < NCOL) {
                red[w][16 * i + 2 * g][2 * t + c] = acc[i][c];
                red[w][16 * i + 2 * g + 1][2 * t + c] = acc[i][2 + c];
            }
        }
    __syncthreads();
}

// Tile row r's dot product: pieces, then warps, in order.
template <int NCOL, int W, int R>
__device__ __forceinline__ float sm_dot(const float (&red)[W][R][4], int r) {
    float d = 0.f;
#pragma unroll
    for (int w = 0; w < W; w++) {
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < NCOL; c++) s += red[w][r][c];
        d += s;
    }
    return d;
}

// grid (tokens * k, 2I / (16 MT)), block 32 W. x [tokens, H] bf16 -> act [slots, 3, I] bf16: hi, mid, lo
// with hi + mid + lo the f32 activation.
template <int W, int MT>
__device__ __forceinline__ void sm_gate_up(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ ids,
                                           const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                           const float* __restrict__ bias, __nv_bfloat16* __restrict__ act, int k,
                                           int n_experts, int hidden, int inter, float limit, float alpha) {
    constexpr int ROWS = 16 * MT;  // the block's weight rows: MT tiles per warp
    __shared__ float red[W][ROWS][4];
    pdl_wait();  // the routing is the previous kernel's
    // Only now: the down kernel reads the routing before its own wait (launch.rs).
    pdl_launch_dependents();
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    const bool on = e < (uint32_t)n_experts;  // off: no contribution (the CPU reference errors)
    const long long row0 = (long long)(on ? e : 0) * 2 * inter + ROWS * blockIdx.y;
    sm_tile<1, W, false, MT>(red, blocks, scales, row0, hidden / 32, x + (long long)(slot / k) * hidden, 0, on);
    const int j = threadIdx.x;  // pair j of the block: gate = row 2j, up = row 2j + 1
    if (j < ROWS / 2) {
        float a = 0.f;
        if (on) {
            a = swiglu_clamped(sm_dot<1, W>(red, 2 * j) + bias[row0 + 2 * j],
                               sm_dot<1, W>(red, 2 * j + 1) + bias[row0 + 2 * j + 1], limit, alpha);
        }
        const __nv_bfloat16 hi = __float2bfloat16_rn(a);
        const float r = a - __bfloat162float(hi);
        const __nv_bfloat16 mid = __float2bfloat16_rn(r);
        __nv_bfloat16* out = act + (long long)slot * 3 * inter + ROWS / 2 * blockIdx.y + j;
        out[0] = hi;
        out[inter] = mid;
        out[2 * inter] = bf16_lo(r, mid);
    }
}

// grid (tokens * k, H / (16 MT)), block 32 W. part[slot, r] = weights[slot] * (dot + bias), f32.
// With counters ([tokens, H / 16], zero; each left zero again): out[t, r] = the sum over the
// token's k slots of part, in slot order, skipping slots routed to no valid expert (moe_sum's
// formula), f32 or (out_bf16) bf16, by the last of the token's k blocks of each row tile.
template <int W, int MT>
__device__ __forceinline__ void sm_down(const __nv_bfloat16* __restrict__ act, const uint32_t* __restrict__ ids,
                                        const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                        float* __restrict__ part, int n_experts, int hidden, int inter, int k,
                                        void* __restrict__ out, int out_bf16, uint32_t* __restrict__ counters) {
    constexpr int ROWS = 16 * MT;  // the block's weight rows: MT tiles per warp
    __shared__ float red[W][ROWS][4];
    __shared__ bool last;
    const int slot = blockIdx.x;
    const uint32_t e = ids[slot];
    const bool on = e < (uint32_t)n_experts;
    const long long row0 = (long long)(on ? e : 0) * hidden + ROWS * blockIdx.y;
    // The routing was written before moe_sm_gate_up ran (it waited for it): readable before
    // pdl_wait(), which waits for moe_sm_gate_up's activations.
    sm_tile<3, W, true, MT>(red, blocks, scales, row0, inter / 32, act + (long long)slot * 3 * inter, inter, on);
    const int r = threadIdx.x;  // the block's row
    if (r < ROWS) {
        float v = 0.f;
        if (on) v = weights[slot] * (sm_dot<3, W>(red, r) + bias[row0 + r]);
        part[(long long)slot * hidden + ROWS * blockIdx.y + r] = v;
    }
    if (!counters) return;
    __threadfence();  // this block's part rows, visible before it counts
    __syncthreads();
    const int token = slot / k;
    if (threadIdx.x == 0) {
        uint32_t* c = counters + (long long)token * gridDim.y + blockIdx.y;
        last = atomicAdd(c, 1u) == (uint32_t)k - 1;
        if (last) *c = 0;  // all k blocks have counted
    }
    __syncthreads();
    if (!last || r >= ROWS) return;
    __threadfence();
    const long long col = ROWS * blockIdx.y + r;
    float acc = 0.f;
    for (int kk = 0; kk < k; kk++) {
        const long long s = (long long)token * k + kk;
        if (ids[s] < (uint32_t)n_experts) acc += __ldcg(part + s * hidden + col);  // L2: other blocks wrote it
    }
    const long long at = (long long)token * hidden + col;
    if (out_bf16) {
        static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(acc);
    } else {
        static_cast<float*>(out)[at] = acc;
    }
}

// One tile per warp, W warps along K (the analysis script also builds gate_up at W = 4).
#define SM_GATE_UP(W)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * W) moe_sm_gate_up_w##W(                              \
        const __nv_bfloat16* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales,         \
        const float* bias, __nv_bfloat16* act, int k, int n_experts, int hidden, int inter, float limit,   \
        float alpha) {                                                                                    \
        sm_gate_up<W, 1>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha);    \
    }
#define SM_DOWN(W)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * W) moe_sm_down_w##W(                                 \
        const __nv_bfloat16* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,        \
        const uint8_t* scales, const float* bias, float* part, int n_experts, int hidden, int inter, int k, \
        void* out, int out_bf16, uint32_t* counters) {                                                    \
        sm_down<W, 1>(act, ids, weights, blocks, scales, bias, part, n_experts, hidden, inter, k, out,      \
                      out_bf16, counters);                                                                \
    }
#define SM_VARIANT(W) SM_GATE_UP(W) SM_DOWN(W)

// Two tiles of 16 rows per warp, what gpu.rs launches (the one-tile kernels above give the same
// bits: the GPU tests compare them). gpt-oss-20b: down has 360 blocks per call, all resident at
// once (80 registers a thread: 3 blocks per multiprocessor), where 720 blocks of one tile took a
// second, partial wave (62 registers: 4 per multiprocessor, 528 at once); gate_up 720 blocks in
// 1.8 waves instead of 1,440 in 2.7 (held to 80 registers: 93 otherwise, 2 blocks per
// multiprocessor). H100, same call: decode at 1k 437.1 -> 448.9 tok/s with down's (after 8k
// 407.9 -> 418.8), 447.9 -> 451.5 with gate_up's too (417.9 -> 420.5). Slower: four tiles for down
// (128 registers), 4 warps of two tiles, down held to 64 registers (4 blocks per multiprocessor),
// gate_up of one tile held to 48 (5 blocks per multiprocessor, 12 bytes spilled), gate_up's two
// tiles at 93 registers.
#define SM_GATE_UP_TWO_TILES(W)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * W, 3) moe_sm_gate_up_w##W##_t2(                      \
        const __nv_bfloat16* x, const uint32_t* ids, const uint8_t* blocks, const uint8_t* scales,         \
        const float* bias, __nv_bfloat16* act, int k, int n_experts, int hidden, int inter, float limit,   \
        float alpha) {                                                                                    \
        sm_gate_up<W, 2>(x, ids, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha);    \
    }
#define SM_DOWN_TWO_TILES(W)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * W) moe_sm_down_w##W##_t2(                            \
        const __nv_bfloat16* act, const uint32_t* ids, const float* weights, const uint8_t* blocks,        \
        const uint8_t* scales, const float* bias, float* part, int n_experts, int hidden, int inter, int k, \
        void* out, int out_bf16, uint32_t* counters) {                                                    \
        sm_down<W, 2>(act, ids, weights, blocks, scales, bias, part, n_experts, hidden, inter, k, out,      \
                      out_bf16, counters);                                                                \
    }

SM_VARIANT(8)
SM_GATE_UP_TWO_TILES(8)
SM_DOWN_TWO_TILES(8)
// Down's K is the experts' intermediate width, which tensor parallelism splits: gpt-oss's 2,880
// over two ranks is 45 blocks, 12 quads, which 8 warps would walk 2 or 1 at a time (half the
// warps idle for half the block). Such K takes down kernels of 4 warps (gpu.rs's down_warps),
// per slot and in slot tiles alike: the same chains in both, so a slot's bits do not depend on
// its batch. With fewer warps sm_tile keeps two quads a warp in flight. Two H200 (NV18),
// gpt-oss-120b at --tp 2 against 8 warps, same call: 64 streams 3,272.7 -> 3,676.7 tok/s, 16
// streams 1,610.1 -> 1,792.8 (at 8 warps the slot tiles' down scales 1.53x from one GPU to two,
// gate_up 1.96x); one stream 473.4 -> 467.1, gpt-oss-20b's 681.2 -> 673.4 (without the second
// quad in flight 447.2 against 471.2).
SM_DOWN(4)
SM_DOWN_TWO_TILES(4)

// ---------------------------------------------------------------------------------------------
// Slot tiles: the per-slot kernels above for several slots of one expert at once, each weight
// row read once for all of them. Every slot is a column (gate_up: x of the slot's token; down:
// its act pieces hi, mid, lo as three columns) of the mma's B operand, so the tile's slots share
// each decoded A fragment. A column's sums are those of the lone slot above: the same quads per
// warp in the same order, the same mma chain per column (a column's product does not depend on
// the others), the same reduction over the warps and pieces. So a slot gets the same bits in a
// tile of any size as alone: the batch-invariant MoE for every decode batch, with the weights
// read once per tile instead of once per slot. Lone slots (fewer than 8 tokens) keep the kernels
// above: the tile kernels run with one slot a tile gave the same bits but decoded gpt-oss-20b
// 3.5% slower at one token (H100, same call: 451.5 -> 435.7 tok/s; 4 streams 1,045 -> 992).
//
// Tiles: moe_group's (tiles [max_tiles, 3]: expert or -1, first grouped position, count; sorted:
// the slot at each grouped position), or with tiles null, tile i = slot i alone. NT mma column
// groups of 8: a tile holds up to 8 NT / P slots (P columns a slot).

template <int MT, int NT>
struct TileQuad {
    uint4 w[MT][2];
    uint32_t s[MT][2];
    uint4 x[NT][4];
};

// The tile: expert, first grouped position, slot count (0: none).
struct SlotTile {
    int e, p0, count;
    bool on;  // false: a lone slot routed to no valid expert (zeros, as sm_*'s `on`)
};

__device__ __forceinline__ SlotTile slot_tile(const int* __restrict__ tiles, const uint32_t* __restrict__ ids,
                                              int n_experts) {
    if (!tiles) {
        const uint32_t e = ids[blockIdx.x];
        const bool on = e < (uint32_t)n_experts;
        return SlotTile{on ? (int)e : 0, (int)blockIdx.x, 1, on};
    }
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return SlotTile{0, 0, 0, false};
    return SlotTile{e, tiles[3 * blockIdx.x + 1], tiles[3 * blockIdx.x + 2], true};
}

__device__ __forceinline__ int tile_slot(const int* __restrict__ sorted, const SlotTile& tl, int m) {
    return sorted ? sorted[tl.p0 + m] : tl.p0 + m;
}

// sm_mma for NT column groups: each A fragment decoded once for all of them; each (tile, group)
// accumulates in sm_mma's order (quad, word, k16 step).
template <bool BIG, int MT, int NT>
__device__ __forceinline__ void st_mma(float (&acc)[MT][NT][4], const TileQuad<MT, NT>& qd) {
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const Scale s0 = scale_of<BIG>(qd.s[i][0]), s1 = scale_of<BIG>(qd.s[i][1]);
        const uint32_t w0[4] = {qd.w[i][0].x, qd.w[i][0].y, qd.w[i][0].z, qd.w[i][0].w};
        const uint32_t w1[4] = {qd.w[i][1].x, qd.w[i][1].y, qd.w[i][1].z, qd.w[i][1].w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t a0[4] = {fp4_pair<0, BIG>(w0[q], s0), fp4_pair<0, BIG>(w1[q], s1),
                                    fp4_pair<1, BIG>(w0[q], s0), fp4_pair<1, BIG>(w1[q], s1)};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint32_t b0, b1;
                b_frag(qd.x[j][q], 0, b0, b1);
                mma_bf16(acc[i][j], a0, b0, b1);
            }
            const uint32_t a1[4] = {fp4_pair<2, BIG>(w0[q], s0), fp4_pair<2, BIG>(w1[q], s1),
                                    fp4_pair<3, BIG>(w0[q], s0), fp4_pair<3, BIG>(w1[q], s1)};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                uint32_t b0, b1;
                b_frag(qd.x[j][q], 1, b0, b1);
                mma_bf16(acc[i][j], a1, b0, b1);
            }
        }
    }
}

// sm_tile for NT column groups: xg[j] is this lane's column of group j (column 8 j + g; nullptr:
// zeros; groups from NT on are not read). red[w][r][c]: warp w's sum for tile row r and column c
// (columns from 8 NT on are left as they are). Ends with a block-level sync.
template <int NT, int W, bool WAIT, int MT, int C, int NX>
__device__ __forceinline__ void st_tile(float (&red)[W][16 * MT][C], const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, long long row0, int kb,
                                        const __nv_bfloat16* const (&xg)[NX], bool on) {
    static_assert(NT <= NX && 8 * NT <= C, "the tile's column groups fit its inputs and its sums");
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const uint4* row_w[MT][2];
    const uint8_t* row_s[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long row = row0 + 16 * i + 2 * g + h;
            row_w[i][h] = reinterpret_cast<const uint4*>(blocks) + row * kb;
            row_s[i][h] = scales + row * kb;
        }
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    const int nq = (kb + 3) / 4;
    TileQuad<MT, NT> qd;
    auto load_w = [&](int b) {
        const bool in = on && b < kb;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                qd.w[i][h] = in ? __ldg(row_w[i][h] + b) : make_uint4(0, 0, 0, 0);  // code 0 is +0
                qd.s[i][h] = in ? __ldg(row_s[i][h] + b) : 127u;
            }
    };
    load_w(4 * w + t);
    if (WAIT) {  // the input is the previous kernel's output; the first weights are on their way
        pdl_wait();
        pdl_launch_dependents();
    }
#pragma unroll 1
    for (int Q = w; Q < nq; Q += W) {
        const int b = 4 * Q + t;
        if (Q != w) load_w(b);
        const bool in = on && b < kb;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                qd.x[j][q] = in && xg[j] ? __ldg(reinterpret_cast<const uint4*>(xg[j] + 32 * b + 8 * q))
                                         : make_uint4(0, 0, 0, 0);
        // A scale of 128 or more in any lane takes the slow decode (warp-uniform).
        uint32_t big = 0;
#pragma unroll
        for (int i = 0; i < MT; i++) big |= qd.s[i][0] | qd.s[i][1];
        if (__any_sync(FULL_MASK, big & 0x80u)) {
            st_mma<true>(acc, qd);
        } else {
            st_mma<false>(acc, qd);
        }
    }
    // Lane (g, t): columns 8 j + 2t, 8 j + 2t + 1 of fragment rows g (acc 0, 1: tile row 2g) and
    // g + 8 (acc 2, 3: tile row 2g + 1) of each tile.
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                red[w][16 * i + 2 * g][8 * j + 2 * t + c] = acc[i][j][c];
                red[w][16 * i + 2 * g + 1][8 * j + 2 * t + c] = acc[i][j][2 + c];
            }
    __syncthreads();
}

// sm_dot for the P pieces of columns c0 .. c0 + P - 1: pieces, then warps, in order.
template <int P, int W, int R, int C>
__device__ __forceinline__ float st_dot(const float (&red)[W][R][C], int r, int c0) {
    float d = 0.f;
#pragma unroll
    for (int w = 0; w < W; w++) {
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < P; c++) s += red[w][r][c0 + c];
        d += s;
    }
    return d;
}

// grid (tiles, 2I / (16 MT)), block 32 W. x [tokens, H] bf16 -> act [slots, 3, I] (hi, mid, lo),
// as sm_gate_up for each slot of the tile (up to 8 NT).
template <int W, int MT, int NT>
__device__ __forceinline__ void st_gate_up(const __nv_bfloat16* __restrict__ x, const uint32_t* __restrict__ ids,
                                           const int* __restrict__ sorted, const int* __restrict__ tiles,
                                           const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                           const float* __restrict__ bias, __nv_bfloat16* __restrict__ act, int k,
                                           int n_experts, int hidden, int inter, float limit, float alpha) {
    constexpr int ROWS = 16 * MT;
    __shared__ float red[W][ROWS][8 * NT];
    pdl_wait();  // the routing and the grouping are the previous kernels'
    // Only now: the down kernel reads them before its own wait (launch.rs).
    pdl_launch_dependents();
    const SlotTile tl = slot_tile(tiles, ids, n_experts);
    if (tl.count == 0) return;  // the whole block
    const long long row0 = (long long)tl.e * 2 * inter + ROWS * blockIdx.y;
    const int g = (threadIdx.x & 31) >> 2;
    const __nv_bfloat16* xg[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int m = 8 * j + g;
        xg[j] = m < tl.count ? x + (long long)(tile_slot(sorted, tl, m) / k) * hidden : nullptr;
    }
    st_tile<NT, W, false, MT>(red, blocks, scales, row0, hidden / 32, xg, tl.on);
    for (int i = threadIdx.x; i < ROWS / 2 * tl.count; i += 32 * W) {
        const int j = i % (ROWS / 2), m = i / (ROWS / 2);  // pair j (gate 2j, up 2j + 1), slot m
        const int slot = tile_slot(sorted, tl, m);
        float a = 0.f;
        if (tl.on)
            a = swiglu_clamped(st_dot<1, W>(red, 2 * j, m) + bias[row0 + 2 * j],
                               st_dot<1, W>(red, 2 * j + 1, m) + bias[row0 + 2 * j + 1], limit, alpha);
        const __nv_bfloat16 hi = __float2bfloat16_rn(a);
        const float r = a - __bfloat162float(hi);
        const __nv_bfloat16 mid = __float2bfloat16_rn(r);
        __nv_bfloat16* out = act + (long long)slot * 3 * inter + ROWS / 2 * blockIdx.y + j;
        out[0] = hi;
        out[inter] = mid;
        out[2 * inter] = bf16_lo(r, mid);
    }
}

// grid (tiles, H / (16 MT)), block 32 W. As sm_down for each slot of the tile (up to 8 NT / 3):
// part rows, and with counters the sum over a token's slots by the last of its k blocks of a row
// tile (a token's slots are in k different tiles: top-k experts differ). Counters need every slot
// of a token in some tile: lone slots (tiles null) only, where each slot is its own tile.
template <int W, int MT, int NT>
__device__ __forceinline__ void st_down(const __nv_bfloat16* __restrict__ act, const uint32_t* __restrict__ ids,
                                        const int* __restrict__ sorted, const int* __restrict__ tiles,
                                        const float* __restrict__ weights, const uint8_t* __restrict__ blocks,
                                        const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                        float* __restrict__ part, int n_experts, int hidden, int inter, int k,
                                        void* __restrict__ out, int out_bf16, uint32_t* __restrict__ counters) {
    constexpr int ROWS = 16 * MT, SLOTS = 8 * NT / 3;
    __shared__ float red[W][ROWS][8 * NT];
    __shared__ bool last[SLOTS];
    // The routing and grouping were written before the gate_up kernel ran (it waited for them):
    // readable before pdl_wait(), which waits for its activations.
    const SlotTile tl = slot_tile(tiles, ids, n_experts);
    if (tl.count == 0) return;  // the whole block
    const long long row0 = (long long)tl.e * hidden + ROWS * blockIdx.y;
    const int g = (threadIdx.x & 31) >> 2;
    const __nv_bfloat16* xg[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int c = 8 * j + g, m = c / 3;
        xg[j] = m < tl.count ? act + (long long)tile_slot(sorted, tl, m) * 3 * inter + (c % 3) * inter : nullptr;
    }
    // Only the column groups that hold the tile's slots: a column's chain is the same whatever
    // the groups beside it, so the bits are too, and a tile of one or two slots (most of them
    // when the slots spread over many experts: 64 streams of gpt-oss-120b route ~2 slots to
    // each of its 128 experts) runs one mma a fragment instead of three, and loads a third of
    // the activations. One H200, same call, against all three groups always: gpt-oss-120b at
    // 8 / 16 / 64 streams 793.6 -> 851.6, 1,036.6 -> 1,117.3, 2,123 -> 2,248 tok/s; gpt-oss-20b
    // (8 slots an expert at 64 streams: full tiles) 1,587.9 -> 1,683.3 and 6,348 -> 6,402. With
    // only the one-group and three-group forms (no spills) 120b at 64 streams took 2,213.
    if (tl.count <= 8 / 3) {
        st_tile<1, W, true, MT>(red, blocks, scales, row0, inter / 32, xg, tl.on);
    } else if (tl.count <= 16 / 3) {
        st_tile<2, W, true, MT>(red, blocks, scales, row0, inter / 32, xg, tl.on);
    } else {
        st_tile<NT, W, true, MT>(red, blocks, scales, row0, inter / 32, xg, tl.on);
    }
    for (int i = threadIdx.x; i < ROWS * tl.count; i += 32 * W) {
        const int r = i % ROWS, m = i / ROWS;
        const int slot = tile_slot(sorted, tl, m);
        float v = 0.f;
        if (tl.on) v = weights[slot] * (st_dot<3, W>(red, r, 3 * m) + bias[row0 + r]);
        part[(long long)slot * hidden + ROWS * blockIdx.y + r] = v;
    }
    if (!counters) return;
    __threadfence();  // this block's part rows, visible before it counts
    __syncthreads();
    if ((int)threadIdx.x < tl.count) {
        const int token = tile_slot(sorted, tl, threadIdx.x) / k;
        uint32_t* c = counters + (long long)token * gridDim.y + blockIdx.y;
        last[threadIdx.x] = atomicAdd(c, 1u) == (uint32_t)k - 1;
        if (last[threadIdx.x]) *c = 0;  // all k blocks have counted
    }
    __syncthreads();
    __threadfence();
    for (int i = threadIdx.x; i < ROWS * tl.count; i += 32 * W) {
        const int r = i % ROWS, m = i / ROWS;
        if (!last[m]) continue;
        const int token = tile_slot(sorted, tl, m) / k;
        const long long col = ROWS * blockIdx.y + r;
        float acc = 0.f;
        for (int kk = 0; kk < k; kk++) {
            const long long s = (long long)token * k + kk;
            if (ids[s] < (uint32_t)n_experts) acc += __ldcg(part + s * hidden + col);  // L2: other blocks wrote it
        }
        const long long at = (long long)token * hidden + col;
        if (out_bf16) {
            static_cast<__nv_bfloat16*>(out)[at] = __float2bfloat16_rn(acc);
        } else {
            static_cast<float*>(out)[at] = acc;
        }
    }
}

// Tiles of up to 8 slots, two tiles of 16 rows per warp as *_TWO_TILES: gate_up's slots in one
// group of 8 columns (80 registers: 3 blocks per multiprocessor), down's 3 pieces a slot in 3
// groups (24 columns). Measured on an H100 (gpt-oss-20b, all streams decoding): 8 / 16 / 64
// streams 1,481 / 2,358 / 6,084 tok/s against the expert-major GEMVs' 1,435 / 2,263 / 6,017 in
// the same call (each warp whole rows over all of K, tiles of 8 or 16 slots; removed for these); slower there: down with one tile a warp (more blocks, 1,346 / 2,118 / 5,371) and
// gate_up in tiles of 16 (1,285 / 2,028 / 5,638).
extern "C" __global__ void __launch_bounds__(256, 3)
    moe_st_gate_up(const __nv_bfloat16* x, const uint32_t* ids, const int* sorted, const int* tiles,
                   const uint8_t* blocks, const uint8_t* scales, const float* bias, __nv_bfloat16* act, int k,
                   int n_experts, int hidden, int inter, float limit, float alpha) {
    st_gate_up<8, 2, 1>(x, ids, sorted, tiles, blocks, scales, bias, act, k, n_experts, hidden, inter, limit, alpha);
}

#define ST_DOWN(W)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * W, 16 / W) moe_st_down_w##W(                         \
        const __nv_bfloat16* act, const uint32_t* ids, const int* sorted, const int* tiles,                \
        const float* weights, const uint8_t* blocks, const uint8_t* scales, const float* bias, float* part, \
        int n_experts, int hidden, int inter, int k, void* out, int out_bf16, uint32_t* counters) {        \
        st_down<W, 2, 3>(act, ids, sorted, tiles, weights, blocks, scales, bias, part, n_experts, hidden,   \
                         inter, k, out, out_bf16, counters);                                               \
    }

// W warps along K, as the per-slot down kernel of the same K (down_warps); held to 16 warps a
// multiprocessor either way (128 registers at both W with 34 bytes spilled, from the three
// column-group forms of st_down; one form took 127 with none).
ST_DOWN(8)
ST_DOWN(4)
