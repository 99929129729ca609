// The sum over the ranks of a tensor-parallel model of each rank's f32 vector, through the GPUs'
// peer memory, in one launch (src/kernels/all_reduce/mod.rs says why and describes the buffers).
//
// Every rank runs this kernel with the same grid on vectors of the same length. Block b of each
// rank owns the same chunk of the vector on every rank. It pushes its rank's piece of that chunk
// into region `rank` of the current slot of every rank's buffer (remote stores are posted, so
// pushing costs less than each rank pulling), raises its flag in every rank's header, waits
// until every rank's flag for block b has reached this call, then adds the regions of its own
// buffer in rank order. Every rank therefore adds the same numbers in the same order: the same
// bits on every rank, and a row's bits do not depend on the other rows of the vector.
//
// The flags count calls (per block; every call runs every block, so all blocks of a rank agree on
// the count). Call e uses slot e & 1. A rank writes slot e & 1 again at call e + 2, when it has
// passed call e + 1's wait: each rank raises call e + 1's flags only after its call e has
// finished (stream order, and pdl_wait below), so no rank still reads the slot. The count lives
// in device memory, so a captured graph replays correctly.
#include "common.cuh"
#include "norm_row.cuh"

// These must match src/kernels/all_reduce/mod.rs.
constexpr int AR_MAX_RANKS = 8;
constexpr int AR_BLOCKS = 24;
constexpr int AR_THREADS = 512;
constexpr unsigned long long AR_DATA_OFFSET = 4096;
// A peer that has not arrived after this long is hung (or dead): trap, so that the rank fails
// with an error instead of spinning forever.
constexpr unsigned long long AR_TIMEOUT_NS = 30ull * 1000 * 1000 * 1000;

// Each rank's buffer, as mapped in this process (rank `rank`'s own at its index).
struct Peers {
    unsigned long long base[AR_MAX_RANKS];
};

__device__ __forceinline__ void store_release_sys(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire_sys(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Header of a rank's buffer: flags[block][rank] (raised by that rank), then counts[block] (this
// rank's own calls).
__device__ __forceinline__ unsigned *ar_flag(unsigned long long base, int block, int rank) {
    return reinterpret_cast<unsigned *>(base) + block * AR_MAX_RANKS + rank;
}

__device__ __forceinline__ unsigned *ar_count(unsigned long long base, int block) {
    return reinterpret_cast<unsigned *>(base) + AR_BLOCKS * AR_MAX_RANKS + block;
}

// Region `r` of slot `slot` of a buffer: `region` floats each, `world` regions a slot.
__device__ __forceinline__ float4 *ar_region(unsigned long long base, unsigned slot, int world,
                                             int r, unsigned region) {
    float *data = reinterpret_cast<float *>(base + AR_DATA_OFFSET);
    return reinterpret_cast<float4 *>(data + (static_cast<size_t>(slot) * world + r) * region);
}

// Phase one of a call, the same for both kernels below: block b pushes this rank's piece of its
// chunk of the flat vector (n floats, a multiple of 4) into region `rank` of the call's slot of
// every rank's buffer, and raises its flag there. Returns the call's number.
__device__ __forceinline__ unsigned ar_push(const Peers &peers, int rank, int world,
                                            const float *__restrict__ in, unsigned n,
                                            unsigned region, unsigned *call) {
    const unsigned long long own = peers.base[rank];
    if (threadIdx.x == 0) *call = *ar_count(own, blockIdx.x) + 1;
    __syncthreads();
    const unsigned e = *call;
    const unsigned slot = e & 1;
    const unsigned n4 = n / 4;
    const unsigned chunk = (n4 + gridDim.x - 1) / gridDim.x;
    const unsigned start = blockIdx.x * chunk;
    const unsigned end = min(start + chunk, n4);
    const float4 *in4 = reinterpret_cast<const float4 *>(in);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float4 v = in4[i];
        for (int r = 0; r < world; ++r) ar_region(peers.base[r], slot, world, rank, region)[i] = v;
    }
    // Every thread's stores are visible system-wide before any flag says they are there.
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x < world) store_release_sys(ar_flag(peers.base[threadIdx.x], blockIdx.x, rank), e);
    return e;
}

// Waits until every rank's flag for `block` has reached call e. A rank may already be a call
// ahead (it saw this rank's flag and went on): >=, in wrapping arithmetic.
__device__ __forceinline__ void ar_wait(unsigned long long own, int block, int rank, unsigned e) {
    const unsigned *flag = ar_flag(own, block, rank);
    const unsigned long long t0 = global_ns();
    while (static_cast<int>(load_acquire_sys(flag) - e) < 0) {
        if (global_ns() - t0 > AR_TIMEOUT_NS) __trap();
    }
}

// The sum of one float4 over the ranks' regions of this rank's own buffer, in rank order.
__device__ __forceinline__ float4 ar_sum4(const float4 *slot0, int world, unsigned region,
                                          size_t i) {
    // Written by other GPUs: read past L1, which does not see their stores.
    float4 s = __ldcg(slot0 + i);
    for (int r = 1; r < world; ++r) {
        const float4 v = __ldcg(slot0 + static_cast<size_t>(r) * (region / 4) + i);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
    }
    return s;
}

// out = Σ_r in_r over `world` ranks, in rank order; n floats (a multiple of 4), at most `region`.
extern "C" __global__ void __launch_bounds__(AR_THREADS)
    all_reduce_f32(Peers peers, int rank, int world, const float *__restrict__ in,
                   float *__restrict__ out, unsigned n, unsigned region) {
    __shared__ unsigned call;
    pdl_wait();
    const unsigned long long own = peers.base[rank];
    const unsigned e = ar_push(peers, rank, world, in, n, region, &call);
    if (threadIdx.x < world) ar_wait(own, blockIdx.x, threadIdx.x, e);
    __syncthreads();
    pdl_launch_dependents();

    const unsigned n4 = n / 4;
    const unsigned chunk = (n4 + gridDim.x - 1) / gridDim.x;
    const unsigned start = blockIdx.x * chunk;
    const unsigned end = min(start + chunk, n4);
    const float4 *slot0 = ar_region(own, e & 1, world, 0, region);
    float4 *out4 = reinterpret_cast<float4 *>(out);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) out4[i] = ar_sum4(slot0, world, region, i);
    if (threadIdx.x == 0) *ar_count(own, blockIdx.x) = e;
}

// The sum over the ranks of `in` [rows, n] with the residual add and RMSNorm after it, as
// add_rms_norm_bf16 does them with delta = the sum (layer_norm_act.cu): x_out = x + (Σ_r in_r +
// bias), h16 = bf16(norm(x_out) · w), h32 the same unrounded when asked. One launch where the
// sum and the norm were two, with their bits: the same additions in the same order, and the
// norm's arithmetic from norm_row.cuh at add_rms_norm_bf16's block width (the launch takes
// its threads). Phase one is all_reduce_f32's; a row spans several blocks' chunks, so each block
// then waits for every block's flags and norms rows b, b + gridDim.x, … (reading other blocks'
// chunks of the same call is safe: a rank writes the slot again only two calls on, after every
// rank's next call has begun, so after this kernel has ended). n / 4 must fit the block's
// registers (n ≤ blockDim.x · 4 · NORM_VEC) and every pointer be 16-byte aligned: the caller
// checks.
extern "C" __global__ void __launch_bounds__(NORM_MAX_THREADS)
    all_reduce_add_rms_norm_bf16(Peers peers, int rank, int world, const float *__restrict__ in,
                                 const float *__restrict__ x, const float *__restrict__ bias,
                                 const float *__restrict__ w, float *__restrict__ x_out,
                                 __nv_bfloat16 *__restrict__ h16, float *__restrict__ h32,
                                 unsigned rows, unsigned n, unsigned region, float eps) {
    __shared__ unsigned call;
    __shared__ float partial[NORM_MAX_THREADS / 32];
    pdl_wait();
    const unsigned long long own = peers.base[rank];
    const unsigned e = ar_push(peers, rank, world, in, rows * n, region, &call);
    for (unsigned t = threadIdx.x; t < gridDim.x * world; t += blockDim.x) ar_wait(own, t / world, t % world, e);
    __syncthreads();
    pdl_launch_dependents();

    const float4 *slot0 = ar_region(own, e & 1, world, 0, region);
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long row = (long long)r * n;
        float4 v[NORM_VEC];
        const float s = gather_row(n / 4, v, [&](int i) {
            const float4 d = ar_sum4(slot0, world, region, row / 4 + i);
            const float4 a = add_residual(reinterpret_cast<const float4 *>(x + row)[i], d, bias, i);
            reinterpret_cast<float4 *>(x_out + row)[i] = a;
            return a;
        });
        norm_row_vec(v, s, n, w, h16, h32, row, eps, partial);
        // The next row's sum of squares reuses `partial`.
        __syncthreads();
    }
    if (threadIdx.x == 0) *ar_count(own, blockIdx.x) = e;
}
