// Weight loads shared by the tensor-core GEMVs (gemv_bf16.cu, quant_matmul's ct_gemv.cu): a block's warps take quad steps q (4 chunks of 16 bytes along K) of their 16-row
// weight tiles, lane (g, t) of a quad chunk 4q + t of the tile's rows g and g + 8.
#pragma once

#include <stdint.h>

// One batch of a lane's weight chunks: U quad steps q = q0, q0 + stride, ..., for each of its MT
// tiles the chunk of row g (a[u][i][0]) and of row g + 8 (a[u][i][1]); zeros past `groups` quad
// steps or `chunks` chunks.
template <int MT, int U>
__device__ __forceinline__ void load_w_chunks(uint4 (&a)[U][MT][2], int q0, int stride, int groups, int chunks,
                                              const uint4* const (&wr)[MT][2]) {
    const int t = threadIdx.x & 3;
    const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int q = q0 + u * stride, c = 4 * q + t;
        const bool in = q < groups && c < chunks;
#pragma unroll
        for (int i = 0; i < MT; i++) {
            a[u][i][0] = in ? __ldg(wr[i][0] + c) : z;
            a[u][i][1] = in ? __ldg(wr[i][1] + c) : z;
        }
    }
}
