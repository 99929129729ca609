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
// part_v/part_i[part]. With sample != 0 the values are x * inv_t + gumbel(seed, j).
__device__ __forceinline__ void argmax_chunk(const float* __restrict__ x, int n, int chunk, int part, int sample,
                                             float inv_t, unsigned long long seed, float* __restrict__ part_v,
                                             int* __restrict__ part_i) {
    const int lo = part * chunk, hi = min(n, lo + chunk);
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
        float xj = x[j];
        if (sample) xj = __fadd_rn(__fmul_rn(xj, inv_t), gumbel(seed, j));  // no FMA: as the reference
        if (!isnan(xj)) better(v, i, xj, j);
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
    argmax_chunk(x + row * n, n, chunk, blockIdx.x, sample, it, sample ? seeds[row] : 0ull, part_v + row * parts,
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
