// The MXFP4 mixture of experts for many tokens at once (prefill), batched by expert, on tensor
// cores. Same maths as mxfp4_moe.cu (see mod.rs), bf16 activations only:
//
//   moe_group:         the (token, slot) pairs grouped by expert, stably (slot order within an
//                      expert), and cut into tiles of at most BM slots of one expert.
//   moe_grouped_gate_up: per tile and 64 MT gate/up rows: [BM, H] x [H, 64 MT] on tensor cores, bias and
//                      SwiGLU fused -> act [slots, I] as two bf16 arrays hi + lo (hi = bf16(act),
//                      lo = bf16(act - hi): 16 significant bits, so the down projection sees the
//                      activations almost as exactly as the f32 GEMV path), rows in grouped order.
//   moe_grouped_down:  per tile and 64 MT down rows: [BM, I] x [I, 64 MT] for hi and lo, bias and
//                      routing weight fused -> part [slots, H] f32, rows in slot order;
//                      mxfp4_moe.cu's moe_sum then adds a token's k slots in order
//                      (deterministic, no atomics).
//
// Each expert's weights are read once per tile of its slots instead of once per slot, decoded
// into mma fragments in registers (below, "The grouped GEMMs"). The grid is sized for
// the worst case (slots / BM + experts tiles); tiles past the real count exit at once, so the host
// never waits for the grouping.

#include "common.cuh"

#define BM 64             // slots per tile
#define THREADS 128       // 4 warps
#define MAX_EXPERTS 1024  // moe_group's shared counters

// Tile t of the grouping: tiles[3t] expert (-1: no tile), tiles[3t + 1] first grouped position,
// tiles[3t + 2] slot count (1..bm). sorted[p] is the slot at grouped position p. bm is the tile
// size: BM for this file's GEMMs, 8 for moe_slot_mma.cu's slot tiles. Slots whose id is not an
// expert (>= n_experts) are left out.
// One block of 1024 threads (n_experts <= 1024: one expert a thread in the scans):
// 1. each expert's slot count, by shared-memory atomics (counts: any order gives the same);
// 2. each expert's first grouped position and first tile, exclusive scans over the experts
//    (a warp's shuffles, then the warps' totals), and each expert's thread writes its tiles;
// 3. each warp takes experts w, w + 32, ... and compacts their slots with ballots, so the order
//    within an expert is the slot order.
extern "C" __global__ void __launch_bounds__(1024)
    moe_group(const uint32_t* __restrict__ ids, int slots, int n_experts, int* __restrict__ sorted,
              int* __restrict__ tiles, int max_tiles, int bm) {
    pdl_wait();
    __shared__ int start[MAX_EXPERTS];
    __shared__ int totals[2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) start[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        const uint32_t e = ids[s];
        if (e < (uint32_t)n_experts) atomicAdd(&start[e], 1);
    }
    __syncthreads();

    const int e = threadIdx.x;
    const int count = e < n_experts ? start[e] : 0;
    const int ntiles = (count + bm - 1) / bm;
    const auto plus = [](int a, int b) { return a + b; };
    const int count_incl = warp_scan(count, plus), tiles_incl = warp_scan(ntiles, plus);
    if (lane == 31) {
        totals[0][warp] = count_incl;
        totals[1][warp] = tiles_incl;
    }
    __syncthreads();
    int pos = count_incl - count, t = tiles_incl - ntiles, all_tiles = 0;
    for (int w = 0; w < nwarps; w++) {
        if (w < warp) {
            pos += totals[0][w];
            t += totals[1][w];
        }
        all_tiles += totals[1][w];
    }
    for (int m = 0; m < count && t < max_tiles; m += bm, t++) {
        tiles[3 * t] = e;
        tiles[3 * t + 1] = pos + m;
        tiles[3 * t + 2] = min(bm, count - m);
    }
    for (int u = all_tiles + threadIdx.x; u < max_tiles; u += blockDim.x) tiles[3 * u] = -1;
    // Every thread has read its count before the counts become first positions.
    __syncthreads();
    if (e < n_experts) start[e] = pos;
    __syncthreads();

    for (int x = warp; x < n_experts; x += nwarps) {
        int p = start[x];
        for (int base = 0; base < slots; base += 32) {
            const int s = base + lane;
            const bool hit = s < slots && ids[s] == (uint32_t)x;
            const uint32_t mask = __ballot_sync(FULL_MASK, hit);
            if (hit) sorted[p + __popc(mask & ((1u << lane) - 1))] = s;
            p += __popc(mask);
        }
    }
}

// ---- The grouped GEMMs ----------------------------------------------------------------------
//
// A block takes one tile (up to BM = 64 slots of one expert) and 64 MT weight rows; each of its
// 4 warps owns MT tiles of 16 rows over all of K, in mxfp4_mma.cuh's "swap AB" form
// (its header): the weights are the 16-row A operand of mma.m16n8k16, decoded from MXFP4 straight
// into fragments (mxfp4_mma.cuh), lane t of a quad taking the whole 32-value block 4s + t of its
// two rows at stage s; the tile's 64 slots are the B operand, NT = 8 columns of 8. Only the slot
// rows are shared, so they go through shared memory: a ring of STAGES stages, each 4 blocks of 32
// along K (256 bytes) of every slot row (hi and, for down, lo), filled by cp.async while the
// stage before is multiplied. A weight is decoded once per block and used against 64 slots (two
// mma per pair of decoded words for down's hi + lo).
//
// Why not a bf16 tile in shared memory: each step of 32 along K would decode 128 rows through a
// table into shared memory, sync twice and wait for its loads (one stage in flight); a kernel built
// that way ran gate_up at 97 TFLOP/s at 512 tokens.

#include "mxfp4_mma.cuh"

#define GW 4             // warps per block
#define GNT 8            // 8-slot columns per tile: BM = GNT * 8
#define STAGE_CHUNKS 16  // 16-byte chunks of a slot row per stage: 4 blocks of 32 bf16
static_assert(GNT * 8 == BM && GW * 32 == THREADS, "tile shape");

// Where chunk c (0..15) of slot row r sits in a stage. Lanes (g, t) read chunk 4 t + q of rows
// 8 j + g together; a 16-byte load is served 8 lanes at a time (g and g + 1, t = 0..3), and this
// swizzle gives those 8 chunks 8 different bank groups (bits: t0, q1 ^ t1, q0 ^ row parity).
__device__ __forceinline__ int swizzle(int r, int c) { return c ^ (((c >> 3) & 1) << 1) ^ (r & 1); }

// The slot rows of one stage into ring slot `buf`: this thread's chunk `ch` of rows rr + 8 i.
// rows[i]: row rr + 8 i's first value (nullptr: past the tile, zeros); with SPLIT also the row
// `lo_delta` elements further (act_lo). Blocks past kb are zeros.
template <bool SPLIT>
__device__ __forceinline__ void load_stage(uint4* ring, int buf, int stage, int kb, const __nv_bfloat16* const (&rows)[8],
                                           long long lo_delta, const __nv_bfloat16* fallback) {
    const int ch = threadIdx.x & 15, rr = threadIdx.x >> 4;
    const bool in_k = 4 * stage + (ch >> 2) < kb;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = rr + 8 * i;
        const bool on = in_k && rows[i];
        const __nv_bfloat16* src = on ? rows[i] + 128 * stage + 8 * ch : fallback;
        uint4* dst = ring + ((buf * (SPLIT ? 2 : 1)) * BM + r) * STAGE_CHUNKS + swizzle(r, ch);
        cp_async16(dst, src, on);
        if (SPLIT) cp_async16(dst + BM * STAGE_CHUNKS, on ? src + lo_delta : fallback, on);
    }
}

// A lane's weights for one stage: the whole block 4 stage + t of each of its 2 MT rows and their
// scales (zeros and scale 127 for rows that are off and blocks past kb).
template <int MT>
struct StageW {
    uint4 w[MT][2];
    uint32_t s[MT][2];
};

template <int MT>
__device__ __forceinline__ void load_w(StageW<MT>& sw, int stage, int kb, const uint4* const (&wp)[MT][2],
                                       const uint8_t* const (&sp)[MT][2], const bool (&rv)[MT][2]) {
    const int b = 4 * stage + (threadIdx.x & 3);
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bool on = rv[i][h] && b < kb;
            sw.w[i][h] = on ? __ldg(wp[i][h] + b) : make_uint4(0, 0, 0, 0);  // code 0 is +0
            sw.s[i][h] = on ? __ldg(sp[i][h] + b) : 127u;
        }
}

__device__ __forceinline__ uint32_t word(const uint4& u, int q) { return q == 0 ? u.x : q == 1 ? u.y : q == 2 ? u.z : u.w; }

// The A fragment of k16 step ST of word w0 (row 2g) / w1 (row 2g + 1): mxfp4_mma.cuh's order.
template <int ST, bool BIG>
__device__ __forceinline__ void a_frag(uint32_t (&a)[4], uint32_t w0, uint32_t w1, const Scale& s0, const Scale& s1) {
    a[0] = fp4_pair<2 * ST, BIG>(w0, s0);
    a[1] = fp4_pair<2 * ST, BIG>(w1, s1);
    a[2] = fp4_pair<2 * ST + 1, BIG>(w0, s0);
    a[3] = fp4_pair<2 * ST + 1, BIG>(w1, s1);
}

// acc += this stage's products: word q of the lane's block against the slots' values 8 q .. 8 q + 7
// of the same block (chunk 4 t + q of their rows in the ring). Columns from `cols` on hold no slot
// and are skipped, unless FULL says there are none (a separate instance: the check in the loop
// costs full tiles ~4%).
template <bool BIG, bool SPLIT, int MT, bool FULL>
__device__ __forceinline__ void mma_stage(float (&acc)[MT][GNT][4], const uint4* stage_rows, const StageW<MT>& sw,
                                          int cols) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    Scale sc[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) sc[i][h] = scale_of<BIG>(sw.s[i][h]);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a[MT][2][4];
#pragma unroll
        for (int i = 0; i < MT; i++) {
            a_frag<0, BIG>(a[i][0], word(sw.w[i][0], q), word(sw.w[i][1], q), sc[i][0], sc[i][1]);
            a_frag<1, BIG>(a[i][1], word(sw.w[i][0], q), word(sw.w[i][1], q), sc[i][0], sc[i][1]);
        }
#pragma unroll
        for (int j = 0; j < GNT; j++) {
            if (!FULL && j >= cols) break;  // block-uniform
            const int r = 8 * j + g, at = r * STAGE_CHUNKS + swizzle(r, 4 * t + q);
            const uint4 xh = stage_rows[at];
            uint4 xl = make_uint4(0, 0, 0, 0);
            if (SPLIT) xl = stage_rows[BM * STAGE_CHUNKS + at];
#pragma unroll
            for (int st = 0; st < 2; st++) {
                uint32_t bh0, bh1, bl0, bl1;
                b_frag(xh, st, bh0, bh1);
                if (SPLIT) b_frag(xl, st, bl0, bl1);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    mma_bf16(acc[i][j], a[i][st], bh0, bh1);
                    if (SPLIT) mma_bf16(acc[i][j], a[i][st], bl0, bl1);
                }
            }
        }
    }
}

// One stage: wait for its slot rows, refill the ring slot the previous stage used, multiply.
template <bool SPLIT, int MT, int STAGES>
__device__ __forceinline__ void run_stage(float (&acc)[MT][GNT][4], uint4* ring, int stage, int stages, int kb,
                                          const StageW<MT>& sw, bool active, int cols, const __nv_bfloat16* const (&rows)[8],
                                          long long lo_delta, const __nv_bfloat16* fallback) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // the stage is in; every warp is done with the ring slot refilled next
    if (stage + STAGES - 1 < stages)
        load_stage<SPLIT>(ring, (stage + STAGES - 1) % STAGES, stage + STAGES - 1, kb, rows, lo_delta, fallback);
    cp_async_commit();  // possibly empty: keeps one group per stage for the wait's count
    if (!active) return;
    const uint4* stage_rows = ring + (stage % STAGES) * (SPLIT ? 2 : 1) * BM * STAGE_CHUNKS;
    uint32_t any = 0;
#pragma unroll
    for (int i = 0; i < MT; i++) any |= sw.s[i][0] | sw.s[i][1];
    if (__any_sync(FULL_MASK, any & 0x80u)) {
        mma_stage<true, SPLIT, MT, false>(acc, stage_rows, sw, cols);
    } else if (cols == GNT) {
        mma_stage<false, SPLIT, MT, true>(acc, stage_rows, sw, cols);
    } else {
        mma_stage<false, SPLIT, MT, false>(acc, stage_rows, sw, cols);
    }
}

// The block's products: acc = this warp's 32 rows (from r0 of expert e's [n_rows, K/32, 16]
// packed matrix) against the tile's slot rows. kb = K / 32; K % 32 == 0, rows 16-byte aligned.
template <bool SPLIT, int MT, int STAGES>
__device__ __forceinline__ void grouped_rows(float (&acc)[MT][GNT][4], uint4* ring, int cols,
                                             const uint8_t* __restrict__ blocks,
                                             const uint8_t* __restrict__ scales, long long row0, int rows_left, int kb,
                                             const __nv_bfloat16* const (&rows)[8], long long lo_delta,
                                             const __nv_bfloat16* fallback) {
    const int g = (threadIdx.x & 31) >> 2;
    const bool active = rows_left > 0;  // warp-uniform; idle warps still fill the ring and sync
    const uint4* wp[MT][2];
    const uint8_t* sp[MT][2];
    bool rv[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * i + 2 * g + h;
            rv[i][h] = r < rows_left;
            const long long row = row0 + (rv[i][h] ? r : 0);
            wp[i][h] = reinterpret_cast<const uint4*>(blocks) + row * kb;
            sp[i][h] = scales + row * kb;
        }
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < GNT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    const int stages = (kb + 3) / 4;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < stages) load_stage<SPLIT>(ring, s, s, kb, rows, lo_delta, fallback);
        cp_async_commit();
    }
    // Two stages' weights in registers: the next one's loads go out before this one's arithmetic.
    StageW<MT> p, q;
    if (active) load_w(p, 0, kb, wp, sp, rv);
#pragma unroll 1
    for (int s = 0; s < stages; s += 2) {
        if (active && s + 1 < stages) load_w(q, s + 1, kb, wp, sp, rv);
        run_stage<SPLIT, MT, STAGES>(acc, ring, s, stages, kb, p, active, cols, rows, lo_delta, fallback);
        if (s + 1 >= stages) break;
        if (active && s + 2 < stages) load_w(p, s + 2, kb, wp, sp, rv);
        run_stage<SPLIT, MT, STAGES>(acc, ring, s + 1, stages, kb, q, active, cols, rows, lo_delta, fallback);
    }
    cp_async_wait<0>();
}

// Dynamic shared memory: gate_up STAGES * BM * 256 bytes, down twice that (hi + lo); gpu.rs
// sets the same sizes.
extern __shared__ uint4 grouped_ring[];

// grid (max_tiles, ceil(2I / (64 MT))). x [tokens, H] bf16; act [slots, I] bf16 in grouped order.
template <int MT, int STAGES>
__device__ __forceinline__ void grouped_gate_up(const __nv_bfloat16* __restrict__ x, const int* __restrict__ sorted,
                                                const int* __restrict__ tiles, const uint8_t* __restrict__ blocks,
                                                const uint8_t* __restrict__ scales, const float* __restrict__ bias,
                                                __nv_bfloat16* __restrict__ act_hi, __nv_bfloat16* __restrict__ act_lo,
                                                int k, int hidden, int inter, float limit, float alpha) {
    pdl_wait();
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int n_rows = 2 * inter, r0 = (blockIdx.y * GW + (threadIdx.x >> 5)) * 16 * MT;
    const __nv_bfloat16* rows[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int m = (threadIdx.x >> 4) + 8 * i;
        rows[i] = m < count ? x + (long long)(sorted[p0 + m] / k) * hidden : nullptr;
    }
    float acc[MT][GNT][4];
    grouped_rows<false, MT, STAGES>(acc, grouped_ring, (count + 7) / 8, blocks, scales, (long long)e * n_rows + r0, n_rows - r0,
                                    hidden / 32, rows, 0, x);
    if (r0 < n_rows) store_gate_up(acc, r0, n_rows, e, p0, count, bias, act_hi, act_lo, inter, limit, alpha);
}

// grid (max_tiles, ceil(H / (64 MT))). act_hi/act_lo [slots, I] bf16 in grouped order; part
// [slots, H] f32 in slot order: part[slot, n] = weights[slot] * (dot + bias).
template <int MT, int STAGES>
__device__ __forceinline__ void grouped_down(const __nv_bfloat16* __restrict__ act_hi,
                                             const __nv_bfloat16* __restrict__ act_lo, const int* __restrict__ sorted,
                                             const int* __restrict__ tiles, const float* __restrict__ weights,
                                             const uint8_t* __restrict__ blocks, const uint8_t* __restrict__ scales,
                                             const float* __restrict__ bias, float* __restrict__ part, int hidden,
                                             int inter) {
    pdl_wait();
    const int e = tiles[3 * blockIdx.x];
    if (e < 0) return;
    const int p0 = tiles[3 * blockIdx.x + 1], count = tiles[3 * blockIdx.x + 2];
    const int r0 = (blockIdx.y * GW + (threadIdx.x >> 5)) * 16 * MT;
    const __nv_bfloat16* rows[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int m = (threadIdx.x >> 4) + 8 * i;
        rows[i] = m < count ? act_hi + (long long)(p0 + m) * inter : nullptr;
    }
    float acc[MT][GNT][4];
    grouped_rows<true, MT, STAGES>(acc, grouped_ring, (count + 7) / 8, blocks, scales, (long long)e * hidden + r0, hidden - r0,
                                   inter / 32, rows, act_lo - act_hi, act_hi);
    if (r0 < hidden) store_down(acc, r0, hidden, e, p0, count, sorted, weights, bias, part);
}

// Variants _m{MT}_s{STAGES}: warps of MT tiles of 16 weight rows (blocks of 64 MT rows), STAGES
// stages of slot rows in the ring. gpu.rs picks one (GROUPED_DEFAULT).
#define GROUPED_VARIANT(MT, S)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) moe_grouped_gate_up_m##MT##_s##S(                         \
        const __nv_bfloat16* x, const int* sorted, const int* tiles, const uint8_t* blocks, const uint8_t* scales, \
        const float* bias, __nv_bfloat16* act_hi, __nv_bfloat16* act_lo, int k, int hidden, int inter, float limit,  \
        float alpha) {                                                                                            \
        grouped_gate_up<MT, S>(x, sorted, tiles, blocks, scales, bias, act_hi, act_lo, k, hidden, inter, limit,    \
                               alpha);                                                                            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS) moe_grouped_down_m##MT##_s##S(                            \
        const __nv_bfloat16* act_hi, const __nv_bfloat16* act_lo, const int* sorted, const int* tiles,           \
        const float* weights, const uint8_t* blocks, const uint8_t* scales, const float* bias, float* part,      \
        int hidden, int inter) {                                                                                  \
        grouped_down<MT, S>(act_hi, act_lo, sorted, tiles, weights, blocks, scales, bias, part, hidden, inter);   \
    }

GROUPED_VARIANT(2, 2)
GROUPED_VARIANT(2, 3)
GROUPED_VARIANT(1, 3)
