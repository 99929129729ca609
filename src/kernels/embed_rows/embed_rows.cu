// The token embedding's lookup (mod.rs): out[t] = table[tokens[t] - first] in f32, or zeros
// where tokens[t] is not among the table's rows first .. first + rows (another rank's, with the
// vocabulary split over tensor-parallel ranks). A copy: the bits of the table's values.
// grid (tokens), block (256). Launched with Programmatic Dependent Launch (launch.rs).

#include "common.cuh"

template <typename T>
__device__ __forceinline__ void embed_rows(const T* __restrict__ table, const unsigned* __restrict__ tokens,
                                           float* __restrict__ out, int hidden, unsigned first, unsigned rows) {
    // The tokens are an earlier kernel's output (the step's input copy): wait before reading them.
    pdl_wait();
    pdl_launch_dependents();
    const unsigned r = tokens[blockIdx.x] - first;  // wraps past `rows` below `first`
    float* o = out + (long long)blockIdx.x * hidden;
    if (r < rows) {
        const T* row = table + (long long)r * hidden;
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = to_f32(row[i]);
    } else {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = 0.f;
    }
}

extern "C" __global__ void embed_rows_f32(const float* table, const unsigned* tokens, float* out, int hidden,
                                          unsigned first, unsigned rows) {
    embed_rows(table, tokens, out, hidden, first, rows);
}

extern "C" __global__ void embed_rows_bf16(const __nv_bfloat16* table, const unsigned* tokens, float* out,
                                           int hidden, unsigned first, unsigned rows) {
    embed_rows(table, tokens, out, hidden, first, rows);
}
