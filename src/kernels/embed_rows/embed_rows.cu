// The token embedding's lookup (mod.rs): out[t] = table[tokens[t] - first] in f32, or zeros
// where tokens[t] is not among the table's rows first .. first + rows (another rank's, with the
// vocabulary split over tensor-parallel ranks). A copy: the bits of the table's values.
// Each thread moves V consecutive values of a row (16-byte loads where the rows allow: V = 8
// for bf16, 4 for f32; else V = 1), so a row's read is one round trip spread over a few blocks
// rather than one block's loop. grid (tokens, ceil(hidden / (V · 128))), block (128). Launched
// with Programmatic Dependent Launch (launch.rs).

#include "common.cuh"

template <typename T, int V>
__device__ __forceinline__ void embed_rows(const T* __restrict__ table, const unsigned* __restrict__ tokens,
                                           float* __restrict__ out, int hidden, unsigned first, unsigned rows) {
    // The tokens are an earlier kernel's output (the step's input copy): wait before reading them.
    pdl_wait();
    pdl_launch_dependents();
    const int i = (blockIdx.y * blockDim.x + threadIdx.x) * V;
    if (i >= hidden) return;
    const unsigned r = tokens[blockIdx.x] - first;  // wraps past `rows` below `first`
    float v[V];
    if (r < rows) {
        const T* src = table + (long long)r * hidden + i;
        if constexpr (V == 8) {  // bf16, 16 bytes
            const uint4 raw = *reinterpret_cast<const uint4*>(src);
            const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = to_f32(b[k]);
        } else if constexpr (V == 4) {  // f32, 16 bytes
            const float4 f = *reinterpret_cast<const float4*>(src);
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
            v[0] = to_f32(src[0]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = 0.f;
    }
    float* dst = out + (long long)blockIdx.x * hidden + i;
    if constexpr (V == 1) {
        dst[0] = v[0];
    } else {
#pragma unroll
        for (int k = 0; k < V; k += 4) *reinterpret_cast<float4*>(dst + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
    }
}

#define EMBED_ROWS(NAME, T, V)                                                                           \
    extern "C" __global__ void NAME(const T* table, const unsigned* tokens, float* out, int hidden,     \
                                    unsigned first, unsigned rows) {                                    \
        embed_rows<T, V>(table, tokens, out, hidden, first, rows);                                      \
    }

EMBED_ROWS(embed_rows_f32, float, 1)
EMBED_ROWS(embed_rows_f32_v4, float, 4)
EMBED_ROWS(embed_rows_bf16, __nv_bfloat16, 1)
EMBED_ROWS(embed_rows_bf16_v8, __nv_bfloat16, 8)
