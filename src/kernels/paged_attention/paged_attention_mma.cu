// Paged attention on tensor cores, bf16: the same contract, launch grid, fixed splits, partial
// layout and fold as paged_attention.cu (its header), with the scores and the weighted values
// computed by mma.sync instead of one key per lane in f32. The engine runs every bf16 call here,
// decode steps and prefill chunks alike, so a prompt row is still bit for bit a decode step
// (cache reuse equals a fresh prefill).
//
// Why a row's bits do not depend on the launch: each warp holds 16 query rows (query, head-in-
// group pairs, query-major, as the scalar kernel) against key tiles of MBK positions (mma_key_tile) aligned to
// absolute multiples of MBK, inside the fixed splits of SK. An mma's output row depends only on
// that row of A, so a row computes the same S = q.K^T and the same P.V whatever other rows share
// its tile (a decode step's 8 heads padded to 16, or a prefill chunk's 16 of 4,096). Per tile
// and row the online softmax is one fixed sequence of operations (mask, max over the tile, exp2,
// this lane's sum in key order, the 4 lanes of a row summed by xor-shuffles at the split's end);
// tiles a row cannot see leave its state unchanged (p = 0 everywhere, alpha = 1), so a warp
// skips tiles none of its rows sees, and the splits fold in position order as in the scalar
// kernel. Keys outside the block's range read as zeros (cp.async's zero fill), never as NaN
// garbage under p = 0.
//
// Products that feed a sum are __fmul_rn or fmaf, never left to the compiler's contraction: the
// decode and prefill instances are different template instances and must round alike.
//
// Precision: q and k are bf16, their products exact, f32 accumulation (as the scalar kernel).
// The probabilities go to the P.V mma as two bf16 terms, hi = bf16(p) and lo = bf16(p - hi),
// so p keeps ~16 significant bits rather than bf16's 8 (v is bf16 already; the f32 accumulator
// takes both products).
//
// Shape: block (sequence x row tile, kv head, z) as the scalar kernel, NW warps of 16 rows, K and
// V tiles of MBK keys double-buffered in shared memory by cp.async (rows padded by 16 bytes, so
// ldmatrix's 8 row addresses hit 8 different bank groups). The _ds kernels (a decode step's rows
// fit one warp) give all NW warps the same 16 rows: each computes a share of a tile's scores
// (their row maxima, then the probabilities, meet in shared memory) and a share of the output's
// columns. The tile's chain of instructions is the time there, not its bytes (4 K/V stages
// instead of 2 gave nothing on an H100), so no warp repeats another's scores.
//
// Pools of codes (KV = uint8_t, E4M3 or with INT8 integers; include/fp8.cuh): the tiles' codes
// come in by cp.async, two stages,
// with each row's scale bytes loaded into registers one tile ahead, and every thread turns the
// chunks it loaded into the bf16 values they stand for (exact) in one stage of bf16 tiles, which
// the rest reads as it reads a bf16 pool's. A row's bits are those of the bf16 kernel on the
// dequantized pool, so everything above holds for FP8 too.

#include "fp8.cuh"
#include "mma.cuh"
#include "paged_attention.cuh"

#define KPAD 8  // bf16 of padding per shared row

// Keys per tile (attention_tile in kernels/shared_memory.rs): 64, and 32 at head_dim 256, whose
// two stages of 64-key K and V tiles (132 KiB) would not fit the 99 KiB a block gets on sm_86,
// sm_89 and sm_120. A head width has one tile size, so its rows' bits are still one function.
__host__ __device__ constexpr int mma_key_tile(int d) { return d > 128 ? 32 : 64; }

typedef __nv_bfloat16 bf16;

// Two floats as a bf16 pair (the lower-addressed, lower-k element in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo_k, float hi_k) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// p as hi + lo bf16 pairs: (x0, x1) -> hi = bf16(x), lo = bf16(x - hi).
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = pack_bf16(x0 - __low2float(h), x1 - __high2float(h));
}

template <int D, int NW, int DS, typename KV, bool INT8>
__device__ __forceinline__ void paged_attention_mma_impl(
    const bf16* __restrict__ q, const KV* __restrict__ k_pool, const KV* __restrict__ v_pool,
    const uint8_t* __restrict__ k_scale, const uint8_t* __restrict__ v_scale, const float* __restrict__ sinks, const uint32_t* __restrict__ cu_q, const uint32_t* __restrict__ q_pos,
    const uint32_t* __restrict__ tables, bf16* __restrict__ out, float* __restrict__ part_acc,
    float* __restrict__ part_ml, const PagedAttnParams& p) {
    // DS = 1: each warp its own 16 rows. DS = NW (rows that fit one warp: a decode step's heads
    // of a kv head): every warp the same 16 rows, each the P.V of its ND / DS column tiles of
    // the output; the scores and softmax are computed by each warp alike (the same operations,
    // the same bits), so a row's output is bit for bit what one warp alone gives.
    constexpr int MBK = mma_key_tile(D);
    constexpr int BQ = DS > 1 ? 16 : NW * 16;  // rows per block
    constexpr int KS = D / 16;   // k-steps of q.K^T
    constexpr int NK = MBK / 8;  // 8-key column tiles of S
    constexpr int ND = D / 8;    // 8-dimension column tiles of the output
    constexpr int NDW = ND / DS;  // this warp's
    static_assert(DS == 1 || DS == NW, "the dimensions split over all the warps or none");
    static_assert(NDW % 2 == 0, "P.V loads column tiles in pairs");
    constexpr int ROW = D + KPAD;
    constexpr int CPR = D / 8;  // 16-byte chunks per key row
    constexpr bool FP8 = sizeof(KV) == 1;
    // bf16: [2 stages][K, V][MBK][ROW]. FP8: [K, V][MBK][ROW], then the codes [2][K, V][MBK][D].
    extern __shared__ __align__(16) bf16 kv_smem[];
    __shared__ bool kvalid[2][MBK];
    // DS > 1: each warp's row maxima over its score tiles, and the tile's probabilities (rows padded
    // by 8 floats: a quad's float2 stores of 8 rows fall in different banks).
    constexpr int NKW = DS > 1 ? NK / NW : NK;
    static_assert(DS == 1 || NK % NW == 0, "the score tiles share out evenly over the warps");
    __shared__ float ds_max[2][DS > 1 ? NW : 1][8];
    __shared__ __align__(8) float ds_p[2][DS > 1 ? 8 : 1][DS > 1 ? MBK + 8 : 2];
    uint8_t* const codes = reinterpret_cast<uint8_t*>(kv_smem + 2 * MBK * ROW);
    constexpr int CPR8 = D / 16;                     // 16-byte chunks per row of codes
    constexpr int PER8 = MBK * CPR8 / (NW * 32);     // a thread's chunks per tile
    static_assert(PER8 >= 1 && MBK * CPR8 % (NW * 32) == 0, "the code chunks share out evenly");
    uint32_t sc_next[PER8], sc_cur[PER8];  // FP8: the scale bytes (k | v << 8) of a thread's chunks

    PagedTile tl;  // tiles in reverse: the heavy ones first
    if (!paged_tile<BQ, true>(tl, cu_q, q_pos, tables, p)) return;
    const int g = tl.g, G = tl.G, row0 = tl.row0;
    const long long tok0 = tl.tok0, rows = tl.rows, pos0 = tl.pos0, f_base = tl.f_base, lo = tl.lo, hi = tl.hi;
    const uint32_t* table = tl.table;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = lane >> 2, tq = lane & 3;  // the mma fragment's row and column pair

    // This lane's two rows: hf = 0 is row gq of the warp's 16, hf = 1 row gq + 8.
    const long long wrow0 = row0 + (DS > 1 ? 0 : warp * 16);
    const int nd0 = DS > 1 ? warp * NDW : 0;  // this warp's first column tile
    float sink2[2], m[2], l[2], Mt[2], Lt[2];
    long long qpos[2], orow[2];
    bool rv[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const long long R = wrow0 + gq + 8 * hf;
        rv[hf] = R < rows;
        const long long qi = rv[hf] ? R / G : 0;
        const int h = g * G + (rv[hf] ? (int)(R % G) : 0);
        qpos[hf] = pos0 + qi;
        orow[hf] = (tok0 + qi) * p.heads + h;
        sink2[hf] = sinks ? sinks[h] * LOG2E : -INFINITY;
        m[hf] = Mt[hf] = sink2[hf];
        l[hf] = Lt[hf] = 0.f;
    }
    float acc[NDW][4], At[NDW][4];
#pragma unroll
    for (int nd = 0; nd < NDW; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nd][e] = At[nd][e] = 0.f;

    const long long start = lo / MBK * MBK;
    const long long n_tiles = lo < hi ? (hi - 1 - start) / MBK + 1 : 0;
    // The keys this warp's rows may see: tiles outside are no-ops for all of them.
    const bool warp_rows = wrow0 < rows;
    // Whether the rows gq + 8 (hf = 1) exist: a decode step's 8 heads of a kv head fill only rows
    // 0-7. Without them q's rows there are zeros, so their scores are 0 and their softmax is
    // skipped: P stays 0 there, and rows 0-7 do not depend on rows 8-15 in any mma. Skipping it
    // is 1.4% of decode at 8k (H100).
    const int nhf = wrow0 + 8 < rows ? 2 : 1;
    const long long w_first = first_key(pos0 + (warp_rows ? wrow0 / G : 0), p.window);
    const long long w_last = pos0 + min(rows - 1, wrow0 + 15) / G;

    const long long row_stride = (long long)p.kv_heads * D;
    auto fetch = [&](long long t0, int buf) {
        if constexpr (FP8) {
            uint8_t* kc = codes + buf * 2 * MBK * D;
            uint8_t* vc = kc + MBK * D;
#pragma unroll
            for (int r = 0; r < PER8; r++) {
                const int idx = threadIdx.x + r * NW * 32;
                const int jj = idx / CPR8, c = (idx % CPR8) * 16;
                const long long t = t0 + jj;
                const long long slot = t >= lo && t < hi ? paged_slot(table, t, p) : -1;
                const long long at = slot >= 0 ? slot * row_stride + (long long)g * D + c : 0;
                cp_async16(kc + jj * D + c, k_pool + at, slot >= 0);
                cp_async16(vc + jj * D + c, v_pool + at, slot >= 0);
                if (c == 0) kvalid[buf][jj] = slot >= 0;
                const long long si = slot >= 0 ? slot * p.kv_heads + g : 0;
                sc_next[r] = slot >= 0 ? (uint32_t)k_scale[si] | (uint32_t)v_scale[si] << 8 : 0u;
            }
            return;
        }
        bf16* ks = reinterpret_cast<bf16*>(kv_smem) + buf * 2 * MBK * ROW;
        bf16* vs = ks + MBK * ROW;
        for (int idx = threadIdx.x; idx < MBK * CPR; idx += NW * 32) {
            const int jj = idx / CPR, c = (idx % CPR) * 8;
            const long long t = t0 + jj;
            const long long slot = t >= lo && t < hi ? paged_slot(table, t, p) : -1;
            const long long at = slot >= 0 ? slot * row_stride + (long long)g * D + c : 0;
            cp_async16(ks + jj * ROW + c, reinterpret_cast<const bf16*>(k_pool) + at, slot >= 0);
            cp_async16(vs + jj * ROW + c, reinterpret_cast<const bf16*>(v_pool) + at, slot >= 0);
            if (c == 0) kvalid[buf][jj] = slot >= 0;
        }
    };

    // FP8: this thread's chunks of stage buf (its own cp.async copies, complete) as bf16 values
    // in the one stage of bf16 tiles.
    auto convert = [&](int buf) {
        const uint8_t* kc = codes + buf * 2 * MBK * D;
#pragma unroll
        for (int r = 0; r < PER8; r++) {
            const int idx = threadIdx.x + r * NW * 32;
            const int jj = idx / CPR8, c = (idx % CPR8) * 16;
#pragma unroll
            for (int kv = 0; kv < 2; kv++) {
                const float scale = fp8_scale_value((uint8_t)(sc_cur[r] >> (8 * kv)));
                const uint4 raw = *reinterpret_cast<const uint4*>(kc + kv * MBK * D + jj * D + c);
                const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
                uint32_t o[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    o[2 * i] = kv_codes_to_bf16x2<INT8>((uint16_t)(w[i] & 0xffff), scale);
                    o[2 * i + 1] = kv_codes_to_bf16x2<INT8>((uint16_t)(w[i] >> 16), scale);
                }
                uint4* dst = reinterpret_cast<uint4*>(kv_smem + kv * MBK * ROW + jj * ROW + c);
                dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
                dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
            }
        }
    };

    // Ends fixed split f for this lane's rows: folds it (zs = 1) or writes it as a partial.
    auto close_split = [&](long long f) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float lt = l[hf] + __shfl_xor_sync(FULL_MASK, l[hf], 1);
            lt = lt + __shfl_xor_sync(FULL_MASK, lt, 2);
            if (p.zs == 1) {
                const FoldWeights fw = fold_ml(Mt[hf], Lt[hf], m[hf], lt);
#pragma unroll
                for (int nd = 0; nd < NDW; nd++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        At[nd][2 * hf + e] = fold_elem(At[nd][2 * hf + e], acc[nd][2 * hf + e], fw);
            } else if (rv[hf] && f - f_base < p.fixed_splits) {
                const long long prow = (f - f_base) * p.tokens * p.heads + orow[hf];
#pragma unroll
                for (int nd = 0; nd < NDW; nd++)
                    *reinterpret_cast<float2*>(part_acc + prow * D + (nd0 + nd) * 8 + 2 * tq) =
                        make_float2(acc[nd][2 * hf], acc[nd][2 * hf + 1]);
                if (tq == 0 && nd0 == 0) {
                    part_ml[2 * prow] = m[hf];
                    part_ml[2 * prow + 1] = lt;
                }
            }
            m[hf] = sink2[hf];
            l[hf] = 0.f;
#pragma unroll
            for (int nd = 0; nd < NDW; nd++) acc[nd][2 * hf] = acc[nd][2 * hf + 1] = 0.f;
        }
    };

    // The first tile's loads in flight while the q/k/v kernel finishes, when they are all keys of
    // earlier steps.
    const bool early = n_tiles > 0 && start + MBK <= pos0;
    if (early) fetch(start, 0);
    cp_async_commit();
    pdl_wait_release(p.release_first);
    if (n_tiles > 0 && !early) fetch(start, 0);
    cp_async_commit();
    if constexpr (FP8) {
#pragma unroll
        for (int r = 0; r < PER8; r++) sc_cur[r] = sc_next[r];
    }

    // q as A fragments, straight from global memory (32-bit pairs; zeros for rows past the end).
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int hf = i & 1, col = ks * 16 + (i >> 1) * 8 + 2 * tq;
            qa[ks][i] = rv[hf] ? *reinterpret_cast<const uint32_t*>(q + orow[hf] * D + col) : 0u;
        }

    // S's column tiles nk0 .. nk0 + NKW - 1 for this warp's rows against the tile at ks (the
    // one-warp path: all NK of them, from 0): ldmatrix rows are keys, so the fragments are K^T's
    // columns.
    auto tile_scores = [&](float (&sv)[NKW][4], int nk0, const bf16* ks) {
#pragma unroll
        for (int j = 0; j < NKW; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) sv[j][e] = 0.f;
#pragma unroll
            for (int kp = 0; kp < KS / 2; kp++) {
                uint32_t b[4];
                ldmatrix_x4<false>(b, ks + ((nk0 + j) * 8 + (lane & 7)) * ROW + kp * 32 + (lane >> 3) * 8);
                mma_bf16(sv[j], qa[2 * kp], b[0], b[1]);
                mma_bf16(sv[j], qa[2 * kp + 1], b[2], b[3]);
            }
        }
    };
    // Row hf's scores among those tiles in the log2 domain, the keys it cannot see at -inf, and
    // their max over the row's four lanes.
    auto mask_max = [&](float (&sv)[NKW][4], int nk0, int hf, int buf, long long t0) {
        // The row's visible keys in this tile: jj in (jlo, jhi], in 32-bit tile offsets.
        const long long P = qpos[hf];
        const int jhi = rv[hf] ? (int)max(-1LL, min(P - t0, (long long)MBK)) : -1;
        const int jlo = p.window > 0 ? (int)max(-1LL, min(P - p.window - t0, (long long)MBK)) : -1;
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NKW; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int jj = (nk0 + j) * 8 + 2 * tq + e;
                const bool ok = jj <= jhi && jj > jlo && kvalid[buf][jj];
                const float sc = ok ? __fmul_rn(sv[j][2 * hf + e], p.scale_log2) : -INFINITY;
                sv[j][2 * hf + e] = sc;
                mx = fmaxf(mx, sc);
            }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        return fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
    };

    for (long long it = 0; it < n_tiles; it++) {
        const long long t0 = start + it * MBK;
        const int buf = (int)(it & 1);
        if (it > 0 && t0 % SK == 0) close_split(t0 / SK - 1);
        if (it + 1 < n_tiles) fetch(t0 + MBK, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        if constexpr (FP8) convert(buf);
        __syncthreads();  // this tile's keys are in for every thread
        if (warp_rows && t0 <= w_last && t0 + MBK > w_first) {
            const bf16* ks = kv_smem + (FP8 ? 0 : buf) * 2 * MBK * ROW;
            const bf16* vs = ks + MBK * ROW;
            float s[NK][4];
            if constexpr (DS > 1) {
                // The tile's scores once, not once per warp: warp w computes S's column tiles
                // NKW w .. NKW w + NKW - 1 and their maxima; the row maxima and then the
                // probabilities meet in shared memory, and every warp reads back all of a row's
                // probabilities for its share of P.V. Each score, maximum, probability and sum is
                // the operation the one-warp path does on the same values in the same order (a
                // max is exact in any order), so the bits are the same.
                const int nk0 = warp * NKW;
                float sw[NKW][4];
                tile_scores(sw, nk0, ks);
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if (hf >= nhf) break;
                    const float mx = mask_max(sw, nk0, hf, buf, t0);
                    if (tq == 0) ds_max[hf][warp][gq] = mx;
                }
                __syncthreads();
                float alpha[2] = {1.f, 1.f};
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if (hf >= nhf) break;
                    float mx = ds_max[hf][0][gq];
#pragma unroll
                    for (int w = 1; w < NW; w++) mx = fmaxf(mx, ds_max[hf][w][gq]);
                    const float mn = fmaxf(m[hf], mx);
                    const float base = mn == -INFINITY ? 0.f : mn;
                    alpha[hf] = exp2f(m[hf] - base);
                    m[hf] = mn;
#pragma unroll
                    for (int j = 0; j < NKW; j++)
                        *reinterpret_cast<float2*>(&ds_p[hf][gq][(nk0 + j) * 8 + 2 * tq]) =
                            make_float2(exp2f(sw[j][2 * hf] - base), exp2f(sw[j][2 * hf + 1] - base));
                }
                __syncthreads();
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if (hf >= nhf) {
                        // Rows gq + 8 hold no query (their q rows are zeros): P is 0 there.
#pragma unroll
                        for (int nk = 0; nk < NK; nk++) s[nk][2 * hf] = s[nk][2 * hf + 1] = 0.f;
                        continue;
                    }
                    float ls = 0.f;
#pragma unroll
                    for (int nk = 0; nk < NK; nk++) {
                        const float2 pj = *reinterpret_cast<const float2*>(&ds_p[hf][gq][nk * 8 + 2 * tq]);
                        s[nk][2 * hf] = pj.x;
                        s[nk][2 * hf + 1] = pj.y;
                        ls += pj.x;
                        ls += pj.y;
                    }
                    l[hf] = fmaf(l[hf], alpha[hf], ls);
#pragma unroll
                    for (int nd = 0; nd < NDW; nd++) {
                        acc[nd][2 * hf] = __fmul_rn(acc[nd][2 * hf], alpha[hf]);
                        acc[nd][2 * hf + 1] = __fmul_rn(acc[nd][2 * hf + 1], alpha[hf]);
                    }
                }
            } else {
                tile_scores(s, 0, ks);
                // Online softmax per row over the tile.
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    if (hf >= nhf) break;
                    const float mx = mask_max(s, 0, hf, buf, t0);
                    const float mn = fmaxf(m[hf], mx);
                    const float base = mn == -INFINITY ? 0.f : mn;
                    const float alpha = exp2f(m[hf] - base);
                    float ls = 0.f;
#pragma unroll
                    for (int nk = 0; nk < NK; nk++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float pj = exp2f(s[nk][2 * hf + e] - base);
                            s[nk][2 * hf + e] = pj;
                            ls += pj;
                        }
                    l[hf] = fmaf(l[hf], alpha, ls);
                    m[hf] = mn;
#pragma unroll
                    for (int nd = 0; nd < NDW; nd++) {
                        acc[nd][2 * hf] = __fmul_rn(acc[nd][2 * hf], alpha);
                        acc[nd][2 * hf + 1] = __fmul_rn(acc[nd][2 * hf + 1], alpha);
                    }
                }
            }
            // acc += P.V, P as hi + lo: S's accumulator layout is the A fragment's.
#pragma unroll
            for (int kk = 0; kk < MBK / 16; kk++) {
                uint32_t ah[4], al[4];
                split_pair(s[2 * kk][0], s[2 * kk][1], ah[0], al[0]);
                split_pair(s[2 * kk][2], s[2 * kk][3], ah[1], al[1]);
                split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], ah[2], al[2]);
                split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], ah[3], al[3]);
#pragma unroll
                for (int np = 0; np < NDW / 2; np++) {
                    uint32_t b[4];
                    const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    ldmatrix_x4<true>(b, vs + key * ROW + (nd0 + 2 * np + (lane >> 4)) * 8);
                    mma_bf16(acc[2 * np], ah, b[0], b[1]);
                    mma_bf16(acc[2 * np], al, b[0], b[1]);
                    mma_bf16(acc[2 * np + 1], ah, b[2], b[3]);
                    mma_bf16(acc[2 * np + 1], al, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // the tile is consumed before its buffer is refilled
        if constexpr (FP8) {
#pragma unroll
            for (int r = 0; r < PER8; r++) sc_cur[r] = sc_next[r];
        }
    }
    if (n_tiles > 0) close_split((hi - 1) / SK);

    if (p.zs > 1) return;  // the partials are written: paged_combine folds them
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        if (!rv[hf]) continue;
        const float denom = finish_denom(Mt[hf], Lt[hf], sink2[hf]);
#pragma unroll
        for (int nd = 0; nd < NDW; nd++) {
            const __nv_bfloat162 o = __halves2bfloat162(__float2bfloat16_rn(At[nd][2 * hf] / denom),
                                                        __float2bfloat16_rn(At[nd][2 * hf + 1] / denom));
            *reinterpret_cast<__nv_bfloat162*>(out + orow[hf] * D + (nd0 + nd) * 8 + 2 * tq) = o;
        }
    }
}

// KV: bf16 pools, or uint8_t for codes, E4M3 or (INT8) integers (k_scale, v_scale: their scale
// bytes; null for bf16).
#define PAGED_ATTENTION_MMA(NAME, D, NW, DS, KV, INT8)                                                       \
    extern "C" __global__ void __launch_bounds__(NW * 32)                                                \
        NAME(const bf16* q, const KV* k_pool, const KV* v_pool, const uint8_t* k_scale,                   \
             const uint8_t* v_scale, const float* sinks, const uint32_t* cu_q, const uint32_t* q_pos,     \
             const uint32_t* tables, bf16* out, float* part_acc, float* part_ml, const PagedAttnParams p) { \
        paged_attention_mma_impl<D, NW, DS, KV, INT8>(q, k_pool, v_pool, k_scale, v_scale, sinks, cu_q, q_pos,  \
                                                tables, out, part_acc, part_ml, p);                       \
    }

PAGED_ATTENTION_MMA(paged_attention_mma_d64_w4, 64, 4, 1, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_d64_w8, 64, 8, 1, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_d128_w4, 128, 4, 1, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_d128_w8, 128, 8, 1, bf16, false)
// Rows that fit one warp (decode), the output's columns over 4 warps.
PAGED_ATTENTION_MMA(paged_attention_mma_d64_w4_ds, 64, 4, 4, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_d128_w4_ds, 128, 4, 4, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d64_w4, 64, 4, 1, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d64_w8, 64, 8, 1, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d128_w4, 128, 4, 1, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d128_w8, 128, 8, 1, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d64_w4_ds, 64, 4, 4, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d128_w4_ds, 128, 4, 4, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d64_w4, 64, 4, 1, uint8_t, true)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d64_w8, 64, 8, 1, uint8_t, true)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d128_w4, 128, 4, 1, uint8_t, true)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d128_w8, 128, 8, 1, uint8_t, true)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d64_w4_ds, 64, 4, 4, uint8_t, true)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d128_w4_ds, 128, 4, 4, uint8_t, true)
// head_dim 256 (Gemma 3 1B-12B): the _ds kernels alone, for prefill rows too (mod.rs,
// PagedKernel::pick): 16 rows a warp over all 256 output columns would hold 256 accumulators a
// thread; split over 4 warps they hold 64.
PAGED_ATTENTION_MMA(paged_attention_mma_d256_w4_ds, 256, 4, 4, bf16, false)
PAGED_ATTENTION_MMA(paged_attention_mma_fp8_d256_w4_ds, 256, 4, 4, uint8_t, false)
PAGED_ATTENTION_MMA(paged_attention_mma_int8_d256_w4_ds, 256, 4, 4, uint8_t, true)
