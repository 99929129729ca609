// Index of the largest value of a long f32 row (a decode step's logits, 201,088 for gpt-oss),
// optionally after adding Gumbel noise (a temperature-sampling draw, see gumbel() below):
// candle's argmax reduces a row in one block, which took 156 us per token there. Two stages, for
// every row of a batch in one launch pair, each row with its own temperature and seed:
// argmax_rows_partial: each block reduces a contiguous chunk of a row to (value, index);
// argmax_rows_final: one block per row reduces its partials. NaN is never the maximum; ties go to
// the lower index (the sampler's rule). A row of only NaN gives index 0.

#include "argmax.cuh"

#define THREADS ARGMAX_THREADS

// One chunk of one row: [part * chunk, min(n, (part + 1) * chunk)) reduced to (value, index) in
// part_v/part_i[part], column j standing for index offset + j (a rank's piece of a vocabulary).
// With sample != 0 the values are x * inv_t + gumbel(seed, offset + j).
__device__ __forceinline__ void argmax_chunk(const float* __restrict__ x, int n, int offset, int chunk, int part,
                                             int sample, float inv_t, unsigned long long seed,
                                             float* __restrict__ part_v, int* __restrict__ part_i) {
    const int lo = part * chunk, hi = min(n, lo + chunk);
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
        float xj = x[j];
        // no FMA: as the reference
        if (sample) xj = __fadd_rn(__fmul_rn(xj, inv_t), gumbel(seed, offset + j));
        if (!isnan(xj)) better(v, i, xj, offset + j);
    }
    block_best(v, i);
    if (threadIdx.x == 0) {
        part_v[part] = v;
        part_i[part] = i;
    }
}

// The best of `parts` partials, as the row's index (0 when every value was NaN).
__device__ __forceinline__ void argmax_parts(const float* __restrict__ part_v, const int* __restrict__ part_i,
                                             int parts, uint32_t* __restrict__ out) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int p = threadIdx.x; p < parts; p += THREADS) better(v, i, part_v[p], part_i[p]);
    block_best(v, i);
    if (threadIdx.x == 0) *out = i == 0x7fffffff ? 0u : (uint32_t)i;
}

// A batch of rows x [rows, n], each row in `parts` chunks of `chunk`: grid (parts, rows), block
// (THREADS). inv_t and seeds are per row ([rows]); a row with inv_t <= 0, or every row when inv_t
// is null, takes the plain argmax. Partials are [rows, parts].
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_rows_partial(const float* __restrict__ x, int n, int chunk, int parts, const float* __restrict__ inv_t,
                        const unsigned long long* __restrict__ seeds, float* __restrict__ part_v,
                        int* __restrict__ part_i) {
    pdl_wait();  // launched with PDL (launch.rs): nothing before it
    const long long row = blockIdx.y;
    const float it = inv_t ? inv_t[row] : 0.f;
    const int sample = it > 0.f;
    argmax_chunk(x + row * n, n, 0, chunk, blockIdx.x, sample, it, sample ? seeds[row] : 0ull, part_v + row * parts,
                 part_i + row * parts);
}

// grid (rows), block (THREADS): row r's partials to out[r].
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_rows_final(const float* __restrict__ part_v, const int* __restrict__ part_i, int parts,
                      uint32_t* __restrict__ out) {
    pdl_wait();
    const long long row = blockIdx.x;
    argmax_parts(part_v + row * parts, part_i + row * parts, parts, out + row);
}

// The draw over a vocabulary split between ranks (an LM head split by vocabulary): each rank
// reduces its own columns to candidates, the ranks gather them, and every rank picks the best.
// Only (value, index) pairs cross between GPUs, never the logits, and the pick is the one
// argmax_rows / sample_gumbel_rows make over the whole row: the same values (the noise is drawn
// at the global index), the same rule (the larger value, on a tie the lower index).
//
// draws: u32 [3 rows]: per row its seed as two words (low, high), then per row 1/T's bits (0:
// greedy). Words rather than a u64 array: the draws are a view of a decode graph's input buffer.

// grid (parts, rows), block (THREADS): row r's local columns [part * chunk, ...) below `valid`
// (a padded piece's last rank holds fewer real columns than n), at global indices offset + j,
// to cand[r, part] (the value's bits) and cand[r, parts + part] (its global index; 0x7fffffff
// where the chunk had none): argmax_chunk's partials, the two halves of the row's words.
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_shard_partial(const float* __restrict__ x, int n, int valid, int offset, int chunk, int parts,
                         const uint32_t* __restrict__ draws, uint32_t* __restrict__ cand) {
    pdl_wait();
    const int rows = gridDim.y;
    const long long row = blockIdx.y;
    const float it = __uint_as_float(draws[2 * rows + row]);
    const int sample = it > 0.f;
    const unsigned long long seed =
        (unsigned long long)draws[2 * row] | ((unsigned long long)draws[2 * row + 1] << 32);
    uint32_t* mine = cand + row * 2 * parts;
    argmax_chunk(x + row * n, valid, offset, chunk, blockIdx.x, sample, it, seed, reinterpret_cast<float*>(mine),
                 reinterpret_cast<int*>(mine + parts));
}

// grid (rows), block (THREADS): every rank's candidates of row r, all [pieces, rows, 2 parts]
// (the gather of argmax_shard_partial's outputs), to out[r] (0 when no candidate had a value).
extern "C" __global__ void __launch_bounds__(THREADS)
    argmax_shard_pick(const uint32_t* __restrict__ all, int pieces, int parts, uint32_t* __restrict__ out) {
    pdl_wait();
    const int rows = gridDim.x;
    const long long row = blockIdx.x;
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int p = threadIdx.x; p < pieces * parts; p += THREADS) {
        const uint32_t* c = all + ((long long)(p / parts) * rows + row) * 2 * parts;
        better(v, i, __uint_as_float(c[p % parts]), (int)c[parts + p % parts]);
    }
    block_best(v, i);
    if (threadIdx.x == 0) out[row] = i == 0x7fffffff ? 0u : (uint32_t)i;
}
