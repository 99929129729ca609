// What the two paged attention kernels share (paged_attention.cu: scalar f32 scores, f32 and
// bf16; paged_attention_mma.cu: tensor cores, bf16): the launch parameters, the block-table
// lookup, and the fold of fixed splits, which must give the same bits in both the one-block path
// and the combine so that a row's output never depends on the launch. paged_attention.cu's
// header has the layouts and the argument.
#pragma once

#include "common.cuh"

#define SK 128  // positions per fixed split (a multiple of both kernels' key tiles); SPLIT_KEYS in mod.rs
#define LOG2E 1.4426950408889634f

// Mirrors Params in gpu.rs (repr(C)): keep the field order.
struct PagedAttnParams {
    long long num_slots;  // pool slots
    long long tokens;     // T: the partials are [split][T][heads]
    int heads, kv_heads;
    int max_blocks;       // block-table row length
    int block_size;
    int window;           // 0: no window
    int zs;               // gridDim.z: blocks sharing one tile's fixed splits
    int fixed_splits;     // partial rows per (token, head): every sequence has at most this many
    int row_blocks;       // row tiles per sequence
    int num_seqs;
    float scale_log2;     // scale * log2(e)
    int release_first;    // release the PDL dependents before the wait (kernels/launch.rs)
};

// The pool slot of position t, or -1 when the table row does not reach it or its entry points
// past the pool (garbage, u32::MAX).
__device__ __forceinline__ long long paged_slot(const uint32_t* __restrict__ table, long long t,
                                                const PagedAttnParams& p) {
    if (t < 0 || t > 0xffffffffLL) return -1;
    const uint32_t u = (uint32_t)t, bs = (uint32_t)p.block_size;  // 32-bit division: cheaper
    const uint32_t b = u / bs;
    if (b >= (uint32_t)p.max_blocks) return -1;
    const long long slot = (long long)table[b] * bs + (u - b * bs);
    return slot < p.num_slots ? slot : -1;
}

// Folds one split's softmax state (m_s, l_s, acc_s), m_s >= the sink logit, into a row's running
// state (M, L, A), which starts at (sink or -inf, 0, 0). Both paths fold with this, in position
// order, so they agree bit for bit. Exact cases that make skipping harmless: the first real split
// gives (M, L, A) = (m_s, l_s, acc_s) exactly (w = 1, L and A were 0); a split the row does not
// see (m_s = the sink logit or -inf, l_s = 0, acc_s = 0) changes nothing (a = 1, or everything 0
// while M is still -inf).
// The fold's scalar part: updates M and L and gives the weights (a of the running A, w of the
// split's acc) that every element of A then takes with fold_elem. The MMA kernel folds its
// fragments element by element with these, the other paths whole rows with fold().
struct FoldWeights {
    float a, w;
};
__device__ __forceinline__ FoldWeights fold_ml(float& M, float& L, float m_s, float l_s) {
    const float mn = fmaxf(M, m_s);
    const float base = mn == -INFINITY ? 0.f : mn;
    const FoldWeights fw = {exp2f(M - base), exp2f(m_s - base)};
    L = fmaf(l_s, fw.w, L * fw.a);
    M = mn;
    return fw;
}
__device__ __forceinline__ float fold_elem(float A, float acc_s, FoldWeights fw) {
    return fmaf(acc_s, fw.w, A * fw.a);
}

template <int DC>
__device__ __forceinline__ void fold(float& M, float& L, float* A, float m_s, float l_s, const float* acc_s) {
    const FoldWeights fw = fold_ml(M, L, m_s, l_s);
#pragma unroll
    for (int dc = 0; dc < DC; dc++) A[dc] = fold_elem(A[dc], acc_s[dc], fw);
}

// The output of a folded state: A over L plus the sink's share.
__device__ __forceinline__ float finish_denom(float M, float L, float sink2) {
    return L + (sink2 == -INFINITY ? 0.f : exp2f(sink2 - M));
}

// The first visible key of a query at position P, and the first fixed split of sequence whose
// first query is at pos0 (what partial rows are numbered from).
__device__ __forceinline__ long long first_key(long long P, int window) {
    return window > 0 ? max(0LL, P - window + 1) : 0LL;
}

// A block's share of a launch: its sequence's tile of BQ rows (rows are (query, head of the kv
// head's group), query-major: G · q_len of them) and the keys [lo, hi) of the fixed splits it owns.
struct PagedTile {
    int g, G, row0;         // kv head, heads per kv head, the tile's first row
    long long tok0, rows;   // the sequence's first token in q, its rows
    long long pos0;         // its first query's position
    long long f_base;       // its first fixed split (what partial rows are numbered from)
    long long lo, hi;       // the keys this block scores
    const uint32_t* table;  // its block-table row
};

// This block's tile, the tile index reversed with REVERSE (a sequence's last rows see the most
// keys: they start first, for a shorter tail; which block computes a row does not change its
// bits). False (block-uniform, after letting the next kernel launch: the block must return) when
// the tile has no rows (short sequences, padding with q_len 0) or reaches past T (bad cu_q).
// Reads only the step's metadata: it may run before pdl_wait().
template <int BQ, bool REVERSE>
__device__ __forceinline__ bool paged_tile(PagedTile& t, const uint32_t* __restrict__ cu_q,
                                           const uint32_t* __restrict__ q_pos, const uint32_t* __restrict__ tables,
                                           const PagedAttnParams& p) {
    const int seq = blockIdx.x / p.row_blocks, b = blockIdx.x % p.row_blocks;
    const int tile = REVERSE ? p.row_blocks - 1 - b : b;
    t.g = blockIdx.y;
    t.G = p.heads / p.kv_heads;
    t.tok0 = cu_q[seq];
    const long long q_len = (long long)cu_q[seq + 1] - t.tok0;
    t.rows = t.G * q_len;
    t.row0 = tile * BQ;
    if (t.row0 >= t.rows || t.tok0 + q_len > p.tokens) {
        pdl_launch_dependents();
        return false;
    }
    t.pos0 = q_pos[seq];
    t.table = tables + (long long)seq * p.max_blocks;
    // The fixed splits this block owns, then the keys of those that the tile's rows may see. The
    // tile's own splits (up to its last row's position), not the bound's, are shared out: a
    // decode step captured for a 128k bound still spreads a 1k context over its zs blocks. Which
    // block computes a split does not change its bits (each split starts afresh).
    t.f_base = first_key(t.pos0, p.window) / SK;
    const long long qi_lo = t.row0 / t.G;
    const long long qi_hi = min(t.rows - 1, (long long)t.row0 + BQ - 1) / t.G;
    const long long tile_splits = min((t.pos0 + qi_hi) / SK - t.f_base + 1, (long long)p.fixed_splits);
    const long long per_z = (tile_splits + p.zs - 1) / p.zs;
    const int z = blockIdx.z;  // this block's share of the tile's splits
    t.lo = max(first_key(t.pos0 + qi_lo, p.window), (t.f_base + z * per_z) * SK);
    t.hi = min(t.pos0 + qi_hi + 1, (t.f_base + (z + 1) * per_z) * SK);
    return true;
}

// Folds the fixed splits' partials of output row `row` (token, head; query position P, its
// sequence's first query at pos0) in position order, one warp. It reads exactly the splits
// holding keys the row sees, which the attention blocks wrote; the others would fold as no-ops.
// L2 loads (__ldcg): other blocks wrote them during this launch in the fused path.
template <typename T, int D>
__device__ __forceinline__ void combine_row(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                            long long row, long long pos0, long long P, float sink2,
                                            T* __restrict__ out, const PagedAttnParams& p) {
    constexpr int DC = D / 32;
    const int lane = threadIdx.x & 31;
    const long long rows = p.tokens * p.heads;
    const long long f_base = first_key(pos0, p.window) / SK;
    float M = sink2, L = 0.f, A[DC];
#pragma unroll
    for (int dc = 0; dc < DC; dc++) A[dc] = 0.f;
    const long long f_end = min(P / SK + 1, f_base + p.fixed_splits);
    // The fold is a chain through every split (65 at 8k positions), each step a max, two exp2 and
    // the updates. Its running max needs no chain (max is exact: a prefix max over the lanes
    // gives every step's value), and with it every step's two weights: lane j computes those of
    // split f + j. Only L's and A's fmaf(acc, w, X * a) stay in order, so the bits are those of
    // one split at a time (fold_ml, fold_elem). CB splits a batch (32 for d64), their partials
    // loaded at once: the loads sit in a loop that breaks like the fold's, or ptxas sinks each
    // one to its use, an L2 round trip per split (seen in the SASS; 8k decode 360 vs 383 tok/s).
    constexpr int CB = 64 / DC;
    for (long long f = first_key(P, p.window) / SK; f < f_end; f += CB) {
        const int nb = (int)min((long long)CB, f_end - f);
        float acc[CB][DC], m_j = -INFINITY, l_j = 0.f;
        if (lane < nb) {
            const long long prow = (f + lane - f_base) * rows + row;
            m_j = __ldcg(part_ml + 2 * prow);
            l_j = __ldcg(part_ml + 2 * prow + 1);
        }
#pragma unroll
        for (int i = 0; i < CB; i++) {
            if (i >= nb) break;
            const long long prow = (f + i - f_base) * rows + row;
#pragma unroll
            for (int dc = 0; dc < DC; dc++) acc[i][dc] = __ldcg(part_acc + prow * D + lane + 32 * dc);
        }
        // mn: fold_ml's max after split f + lane; prev: before it.
        float mn = warp_scan(m_j, [](float a, float b) { return fmaxf(a, b); });
        mn = fmaxf(M, mn);
        float prev = __shfl_up_sync(FULL_MASK, mn, 1);
        if (lane == 0) prev = M;
        const float base = mn == -INFINITY ? 0.f : mn;
        const float a_j = exp2f(prev - base), w_j = exp2f(m_j - base);
#pragma unroll
        for (int i = 0; i < CB; i++) {
            if (i >= nb) break;
            const float a = __shfl_sync(FULL_MASK, a_j, i), w = __shfl_sync(FULL_MASK, w_j, i);
            L = fmaf(__shfl_sync(FULL_MASK, l_j, i), w, L * a);
#pragma unroll
            for (int dc = 0; dc < DC; dc++) A[dc] = fmaf(acc[i][dc], w, A[dc] * a);
        }
        M = __shfl_sync(FULL_MASK, mn, nb - 1);
    }
    const float denom = finish_denom(M, L, sink2);
#pragma unroll
    for (int dc = 0; dc < DC; dc++) out[row * D + lane + 32 * dc] = from_f32<T>(A[dc] / denom);
}

