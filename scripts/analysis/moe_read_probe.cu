// Read-only probes for scripts/analysis/moe_decode_kernels.py: what reading a layer's 4 experts'
// gate_up weights costs with no arithmetic, in the access patterns the MoE kernels use. Each
// kernel folds what it reads into one word per block so that no load can be dropped.
//
//   probe_frag<P>: moe_slot_mma.cu's pattern. Block (slot, 16-row tile), 8 warps along K; lane
//                  (g, t) reads the 16-byte block 4Q + t of rows 2g and 2g + 1 (and one scale
//                  byte each) for its quads Q = w, w + 8, ...; P quads loaded before any is used.
//   probe_rows<P>: mxfp4_moe.cu's pattern. Block (slot, 16 rows), 3 warps along K; lane l of
//                  warp y reads block 32 y + l of each row (a warp reads 512 contiguous bytes),
//                  P rows loaded before any is used.
//   probe_flat<P>: the slot's whole expert matrix as one flat array, grid-stride, P 16-byte loads
//                  per thread in flight.

#include <stdint.h>

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <int P>
__device__ void frag(const uint8_t* blocks, const uint8_t* scales, const uint32_t* ids, uint32_t* out, int rows,
                     int kb) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const long long row0 = (long long)ids[blockIdx.x] * rows + 16 * blockIdx.y;
    const uint4* r0 = reinterpret_cast<const uint4*>(blocks) + (row0 + 2 * g) * kb;
    const uint4* r1 = r0 + kb;
    const uint8_t* s0 = scales + (row0 + 2 * g) * kb;
    const uint8_t* s1 = s0 + kb;
    const int nq = (kb + 3) / 4;
    uint32_t acc = 0;
    for (int Q = w; Q < nq; Q += 8 * P) {
        uint4 a[P], b[P];
        uint32_t sa[P], sb[P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const int blk = 4 * (Q + 8 * p) + t;
            const bool in = blk < kb;
            a[p] = in ? __ldg(r0 + blk) : make_uint4(0, 0, 0, 0);
            b[p] = in ? __ldg(r1 + blk) : make_uint4(0, 0, 0, 0);
            sa[p] = in ? __ldg(s0 + blk) : 0u;
            sb[p] = in ? __ldg(s1 + blk) : 0u;
        }
#pragma unroll
        for (int p = 0; p < P; p++) acc ^= fold(a[p]) ^ fold(b[p]) ^ sa[p] ^ sb[p];
    }
    if (acc == 0x12345678u) out[blockIdx.x * gridDim.y + blockIdx.y] = acc;
}

template <int P>
__device__ void rows_(const uint8_t* blocks, const uint8_t* scales, const uint32_t* ids, uint32_t* out, int rows,
                      int kb) {
    const int g = 32 * threadIdx.y + threadIdx.x;
    const long long row0 = (long long)ids[blockIdx.x] * rows + 16 * blockIdx.y;
    uint32_t acc = 0;
    for (int r = 0; r < 16; r += P) {
        uint4 a[P];
        uint32_t s[P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const bool in = g < kb;
            a[p] = in ? __ldg(reinterpret_cast<const uint4*>(blocks) + (row0 + r + p) * kb + g) : make_uint4(0, 0, 0, 0);
            s[p] = in ? __ldg(scales + (row0 + r + p) * kb + g) : 0u;
        }
#pragma unroll
        for (int p = 0; p < P; p++) acc ^= fold(a[p]) ^ s[p];
    }
    if (acc == 0x12345678u) out[blockIdx.x * gridDim.y + blockIdx.y] = acc;
}

template <int P>
__device__ void flat(const uint8_t* blocks, const uint8_t* scales, const uint32_t* ids, uint32_t* out, int rows,
                     int kb) {
    const long long n = (long long)rows * kb;  // 16-byte units of one expert
    const uint4* base = reinterpret_cast<const uint4*>(blocks) + (long long)ids[blockIdx.y] * n;
    uint32_t acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x * P;
    for (long long i = (long long)blockIdx.x * blockDim.x * P + threadIdx.x; i < n; i += stride) {
        uint4 a[P];
#pragma unroll
        for (int p = 0; p < P; p++) a[p] = i + p * blockDim.x < n ? __ldg(base + i + p * blockDim.x) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int p = 0; p < P; p++) acc ^= fold(a[p]);
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

#define PROBE(KIND, P)                                                                                  \
    extern "C" __global__ void probe_##KIND##_p##P(const uint8_t* blocks, const uint8_t* scales,       \
                                                   const uint32_t* ids, uint32_t* out, int rows, int kb) { \
        KIND<P>(blocks, scales, ids, out, rows, kb);                                                     \
    }
PROBE(frag, 1)
PROBE(frag, 2)
PROBE(frag, 4)
PROBE(rows_, 1)
PROBE(rows_, 2)
PROBE(rows_, 4)
PROBE(flat, 2)
PROBE(flat, 4)
PROBE(flat, 8)
