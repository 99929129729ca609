// The sum over the ranks of a tensor-parallel model of each rank's f32 vector, through the GPUs'
// peer memory, in one launch (src/kernels/all_reduce/mod.rs says why and describes the buffers).
//
// Every rank runs this kernel with the same grid on vectors of the same length. Block b of each
// rank owns the same chunk of the vector on every rank and pushes its rank's piece of that chunk
// into every other rank's buffer (remote stores are posted, so pushing costs less than each rank
// pulling). How a receiver learns that a piece has arrived depends on the vector's length:
//
// - Up to AR_LL_FLOATS floats (decode steps), in lines that carry their own flag (NCCL's LL
//   protocol): every 16-byte store is two (value, call number) pairs, and a receiver reads a line
//   until both its pairs hold this call's number. A store may land as two 8-byte halves but never
//   splits a pair, so a pair with the call's number holds the call's value. One crossing of the
//   link, no fence: the latency a decode step's few KiB are bound by.
// - Longer vectors, in plain floats followed by a system-wide fence and a flag per block; a
//   receiver waits for every rank's flag, then reads. Half the bytes of the lines, a fence and a
//   second crossing more.
//
// Then the pieces are added in rank order (this rank's own straight from its input): every rank
// adds the same numbers in the same order, so every rank gets the same bits, the two protocols
// give the same bits, and a row's bits do not depend on the other rows of the vector.
//
// Calls are numbered per block in device memory: AR_MAX_BLOCKS counts, of which a launch of g
// blocks has block b keep counts b, b + g, …, so every call moves every count (all blocks of a
// rank agree, whatever grid the call before had; a captured graph replays correctly). Call e
// uses slot e & 1 of either protocol. A rank writes slot e & 1 again at call e + 2, when it has
// passed call e + 1, which needed every rank's piece of call e + 1; each rank pushes that only
// after its call e has finished (stream order, and pdl_wait below), so no rank still reads the
// slot. The numbers run 1, 2, …, 2^32 - 2 and start again at 1: never 0, a zeroed line's number,
// and an even cycle, so the slots still alternate where it wraps.
#include "common.cuh"
#include "norm_row.cuh"

// These must match src/kernels/all_reduce/mod.rs.
constexpr int AR_MAX_RANKS = 8;
constexpr int AR_MAX_BLOCKS = 128;
constexpr int AR_THREADS = 512;
constexpr unsigned long long AR_DATA_OFFSET = 8192;
constexpr unsigned AR_LL_FLOATS = 64 * 1024;
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
// rank's own calls), AR_MAX_BLOCKS of each.
__device__ __forceinline__ unsigned *ar_flag(unsigned long long base, int block, int rank) {
    return reinterpret_cast<unsigned *>(base) + block * AR_MAX_RANKS + rank;
}

__device__ __forceinline__ unsigned *ar_count(unsigned long long base, int block) {
    return reinterpret_cast<unsigned *>(base) + AR_MAX_BLOCKS * AR_MAX_RANKS + block;
}

// Region `r` of slot `slot` of a buffer: `region` floats each, `world` regions a slot.
__device__ __forceinline__ float4 *ar_region(unsigned long long base, unsigned slot, int world,
                                             int r, unsigned region) {
    float *data = reinterpret_cast<float *>(base + AR_DATA_OFFSET);
    return reinterpret_cast<float4 *>(data + (static_cast<size_t>(slot) * world + r) * region);
}

// Line region `r` of LL slot `slot`, past the plain slots: AR_LL_FLOATS / 2 lines, two a float4.
__device__ __forceinline__ uint4 *ll_region(unsigned long long base, unsigned slot, int world,
                                            int r, unsigned region) {
    const unsigned long long lines = base + AR_DATA_OFFSET + 2ull * world * region * 4;
    return reinterpret_cast<uint4 *>(lines) + (static_cast<size_t>(slot) * world + r) * (AR_LL_FLOATS / 2);
}

// The number of the call after `last` (see the top of the file).
__device__ __forceinline__ unsigned ar_next(unsigned last) {
    return last >= 0xFFFFFFFEu ? 1u : last + 1u;
}

// The call's number, read by one thread of the block and handed to all. Count b was written
// last by the call before (by its block b % its grid), which has ended.
__device__ __forceinline__ unsigned ar_begin(unsigned long long own, unsigned *call) {
    if (threadIdx.x == 0) *call = ar_next(*ar_count(own, blockIdx.x));
    __syncthreads();
    return *call;
}

// The block's counts moved to call e: b, b + gridDim.x, … (the top of the file).
__device__ __forceinline__ void ar_end(unsigned long long own, unsigned e) {
    if (threadIdx.x == 0)
        for (int b = blockIdx.x; b < AR_MAX_BLOCKS; b += gridDim.x) *ar_count(own, b) = e;
}

// Block b's chunk of a vector of n units (float4s, or words): [start, end).
__device__ __forceinline__ void ar_chunk(unsigned n, unsigned *start, unsigned *end) {
    const unsigned chunk = (n + gridDim.x - 1) / gridDim.x;
    *start = blockIdx.x * chunk;
    *end = min(*start + chunk, n);
}

// The end of a plain push: every thread's stores of this block are visible system-wide before
// its flag for call e says they are there, in every rank's header. It raises the flags of blocks
// b + gridDim.x, … too, which no block of this call waits for, so that every flag is as recent
// as the last plain call, whatever grids the calls take.
__device__ __forceinline__ void ar_raise(const Peers &peers, int rank, int world, unsigned e) {
    __threadfence_system();
    __syncthreads();
    for (int t = threadIdx.x; t < world * AR_MAX_BLOCKS; t += blockDim.x) {
        const int b = blockIdx.x + (t / world) * gridDim.x;
        if (b < AR_MAX_BLOCKS) store_release_sys(ar_flag(peers.base[t % world], b, rank), e);
    }
}

// Phase one of a plain call: block b pushes this rank's piece of its chunk of the flat vector (n
// floats, a multiple of 4) into region `rank` of the call's slot of every rank's buffer, and
// raises its flag there.
__device__ __forceinline__ void ar_push(const Peers &peers, int rank, int world,
                                        const float *__restrict__ in, unsigned n,
                                        unsigned region, unsigned e) {
    const unsigned slot = e & 1;
    unsigned start, end;
    ar_chunk(n / 4, &start, &end);
    const float4 *in4 = reinterpret_cast<const float4 *>(in);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float4 v = in4[i];
        for (int r = 0; r < world; ++r) ar_region(peers.base[r], slot, world, rank, region)[i] = v;
    }
    ar_raise(peers, rank, world, e);
}

__device__ __forceinline__ void ll_store(uint4 *p, float a, float b, unsigned e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p),
                 "r"(__float_as_uint(a)), "r"(e), "r"(__float_as_uint(b)), "r"(e)
                 : "memory");
}

__device__ __forceinline__ uint4 ll_load(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// Phase one of an LL call: block b pushes this rank's piece of its chunk as lines of call e into
// region `rank` of the call's LL slot of every other rank's buffer.
__device__ __forceinline__ void ll_push(const Peers &peers, int rank, int world,
                                        const float *__restrict__ in, unsigned n,
                                        unsigned region, unsigned e) {
    const unsigned slot = e & 1;
    unsigned start, end;
    ar_chunk(n / 4, &start, &end);
    const float4 *in4 = reinterpret_cast<const float4 *>(in);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float4 v = in4[i];
        for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            uint4 *line = ll_region(peers.base[r], slot, world, rank, region) + 2 * i;
            ll_store(line, v.x, v.y, e);
            ll_store(line + 1, v.z, v.w, e);
        }
    }
}

// The float4 a rank pushed as two lines of call e, once both have arrived.
__device__ __forceinline__ float4 ll_read4(const uint4 *line, unsigned e) {
    uint4 a = ll_load(line), b = ll_load(line + 1);
    if (a.y != e || a.w != e || b.y != e || b.w != e) {
        const unsigned long long t0 = global_ns();
        while (a.y != e || a.w != e) {
            a = ll_load(line);
            if (global_ns() - t0 > AR_TIMEOUT_NS) __trap();
        }
        while (b.y != e || b.w != e) {
            b = ll_load(line + 1);
            if (global_ns() - t0 > AR_TIMEOUT_NS) __trap();
        }
    }
    return make_float4(__uint_as_float(a.x), __uint_as_float(a.z), __uint_as_float(b.x),
                       __uint_as_float(b.z));
}

__device__ __forceinline__ void add4(float4 &s, const float4 v) {
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
}

// The sum of float4 i over the ranks, in rank order, as ar_sum4 adds them: this rank's own from
// `in`, the others' from the lines of call e in this rank's LL slot.
__device__ __forceinline__ float4 ll_sum4(const uint4 *slot0, const float *__restrict__ in,
                                          int rank, int world, size_t i, unsigned e) {
    const float4 own = reinterpret_cast<const float4 *>(in)[i];
    float4 s = rank == 0 ? own : ll_read4(slot0 + 2 * i, e);
    for (int r = 1; r < world; ++r)
        add4(s, r == rank ? own : ll_read4(slot0 + static_cast<size_t>(r) * (AR_LL_FLOATS / 2) + 2 * i, e));
    return s;
}

// How far past call e a rank's flag may be and still count as having reached it.
constexpr unsigned AR_AHEAD = 1u << 16;

// Waits until every rank's flag for `block` has reached call e. A rank may already be a call or
// a few ahead (it saw this rank's flag and went on; a broadcast's root waits for nobody), so a
// flag from e to e + AR_AHEAD counts. A flag behind e does not, however far behind: flags move
// only in plain calls, which a server may not make for hours (steps of at most 22 rows take the
// lines), and a wrapping >= would take a flag 2^31 calls old for one ahead. Only a flag stale by
// one whole cycle of the numbers (2^32 − 2 calls, a day or more of sums) could match again.
__device__ __forceinline__ void ar_wait(unsigned long long own, int block, int rank, unsigned e) {
    const unsigned *flag = ar_flag(own, block, rank);
    const unsigned long long t0 = global_ns();
    while (load_acquire_sys(flag) - e >= AR_AHEAD) {
        if (global_ns() - t0 > AR_TIMEOUT_NS) __trap();
    }
}

// Waits, the whole block, until every rank's flag for this block has reached call e.
__device__ __forceinline__ void ar_wait_block(unsigned long long own, int world, unsigned e) {
    if (threadIdx.x < world) ar_wait(own, blockIdx.x, threadIdx.x, e);
    __syncthreads();
}

// The sum of one float4 over the ranks' regions of this rank's own buffer, in rank order.
__device__ __forceinline__ float4 ar_sum4(const float4 *slot0, int world, unsigned region,
                                          size_t i) {
    // Written by other GPUs: read past L1, which does not see their stores.
    float4 s = __ldcg(slot0 + i);
    for (int r = 1; r < world; ++r) add4(s, __ldcg(slot0 + static_cast<size_t>(r) * (region / 4) + i));
    return s;
}

// out = Σ_r in_r over `world` ranks, in rank order; n floats (a multiple of 4), at most `region`.
extern "C" __global__ void __launch_bounds__(AR_THREADS)
    all_reduce_f32(Peers peers, int rank, int world, const float *__restrict__ in,
                   float *__restrict__ out, unsigned n, unsigned region) {
    __shared__ unsigned call;
    pdl_wait();
    const unsigned long long own = peers.base[rank];
    const unsigned e = ar_begin(own, &call);
    const bool ll = n <= AR_LL_FLOATS;
    if (ll) {
        ll_push(peers, rank, world, in, n, region, e);
    } else {
        ar_push(peers, rank, world, in, n, region, e);
        ar_wait_block(own, world, e);
    }
    pdl_launch_dependents();

    unsigned start, end;
    ar_chunk(n / 4, &start, &end);
    float4 *out4 = reinterpret_cast<float4 *>(out);
    if (ll) {
        const uint4 *slot0 = ll_region(own, e & 1, world, 0, region);
        for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x)
            out4[i] = ll_sum4(slot0, in, rank, world, i, e);
    } else {
        const float4 *slot0 = ar_region(own, e & 1, world, 0, region);
        for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x)
            out4[i] = ar_sum4(slot0, world, region, i);
    }
    ar_end(own, e);
}

// The sum over the ranks of `in` [rows, n] with the residual add and RMSNorm after it, as
// add_rms_norm_bf16 does them with delta = the sum (layer_norm_act.cu): x_out = x + (Σ_r in_r +
// bias), h16 = bf16(norm(x_out) · w), h32 the same unrounded when asked. One launch where the
// sum and the norm were two, with their bits: the same additions in the same order, and the
// norm's arithmetic from norm_row.cuh at add_rms_norm_bf16's block width (the launch takes
// its threads) and a block a row (24 to AR_MAX_BLOCKS blocks): the rows' norms run side by
// side, not one after another in a few blocks. Phase one is all_reduce_f32's; a row may span
// several blocks' chunks, so each block then norms rows b, b + gridDim.x, …, reading every
// block's chunks of them: in LL lines as they arrive, or in plain floats once every block's flags
// are in. Reading other blocks' chunks of the same call is safe: a rank writes the slot again
// only two calls on, after every rank's next call has begun, so after this kernel has ended.
// n / 4 must fit the block's registers (n ≤ blockDim.x · 4 · NORM_VEC) and every pointer be
// 16-byte aligned: the caller checks.
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
    const unsigned e = ar_begin(own, &call);
    const bool ll = rows * n <= AR_LL_FLOATS;
    if (ll) {
        ll_push(peers, rank, world, in, rows * n, region, e);
    } else {
        ar_push(peers, rank, world, in, rows * n, region, e);
        for (unsigned t = threadIdx.x; t < gridDim.x * world; t += blockDim.x) ar_wait(own, t / world, t % world, e);
        __syncthreads();
    }
    pdl_launch_dependents();

    const uint4 *lines = ll_region(own, e & 1, world, 0, region);
    const float4 *slot0 = ar_region(own, e & 1, world, 0, region);
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long row = (long long)r * n;
        float4 v[NORM_VEC];
        const float s = gather_row(n / 4, v, [&](int i) {
            const size_t at = row / 4 + i;
            const float4 d = ll ? ll_sum4(lines, in, rank, world, at, e) : ar_sum4(slot0, world, region, at);
            const float4 a = add_residual(reinterpret_cast<const float4 *>(x + row)[i], d, bias, i);
            reinterpret_cast<float4 *>(x_out + row)[i] = a;
            return a;
        });
        norm_row_vec(v, s, n, w, h16, h32, row, eps, partial);
        // The next row's sum of squares reuses `partial`.
        __syncthreads();
    }
    ar_end(own, e);
}

__device__ __forceinline__ void ll_store_word(uint2 *p, unsigned v, unsigned e) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v), "r"(e) : "memory");
}

__device__ __forceinline__ uint2 ll_load_word(const uint2 *p) {
    uint2 v;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

// The word a rank pushed as one (value, call) pair of call e, once it has arrived.
__device__ __forceinline__ unsigned ll_read_word(const uint2 *p, unsigned e) {
    uint2 v = ll_load_word(p);
    if (v.y != e) {
        const unsigned long long t0 = global_ns();
        do {
            v = ll_load_word(p);
            if (global_ns() - t0 > AR_TIMEOUT_NS) __trap();
        } while (v.y != e);
    }
    return v.x;
}

// Every rank's n 32-bit words (f32 or u32), gathered in rank order: out[r · n + i] = in_r[i]
// (root < 0); or rank `root`'s words written over `out` (root ≥ 0: a broadcast, in place where out
// is in). The same two protocols as the sums, by words: up to AR_LL_FLOATS as one (word, call)
// pair per 8-byte store, longer ones as plain words, a fence and the flags. Every rank pushes its
// words even for a broadcast: a rank then passes call e + 1 only once every rank has begun it,
// which is what keeps the slots safe (the top of the file).
extern "C" __global__ void __launch_bounds__(AR_THREADS)
    all_gather_b32(Peers peers, int rank, int world, const unsigned *in, unsigned *out,
                   unsigned n, unsigned region, int root) {
    __shared__ unsigned call;
    pdl_wait();
    const unsigned long long own = peers.base[rank];
    const unsigned e = ar_begin(own, &call);
    const unsigned slot = e & 1;
    const bool ll = n <= AR_LL_FLOATS;
    unsigned start, end;
    ar_chunk(n, &start, &end);
    for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned v = in[i];
        for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            if (ll) {
                ll_store_word(reinterpret_cast<uint2 *>(ll_region(peers.base[r], slot, world, rank, region)) + i, v, e);
            } else {
                reinterpret_cast<unsigned *>(ar_region(peers.base[r], slot, world, rank, region))[i] = v;
            }
        }
        if (root < 0) out[static_cast<size_t>(rank) * n + i] = v;
    }
    if (!ll) {
        ar_raise(peers, rank, world, e);
        ar_wait_block(own, world, e);
    }
    pdl_launch_dependents();

    for (int r = 0; r < world; ++r) {
        if (r == rank || (root >= 0 && r != root)) continue;
        unsigned *to = root < 0 ? out + static_cast<size_t>(r) * n : out;
        const uint2 *lines = reinterpret_cast<const uint2 *>(ll_region(own, slot, world, r, region));
        const unsigned *words = reinterpret_cast<const unsigned *>(ar_region(own, slot, world, r, region));
        for (unsigned i = start + threadIdx.x; i < end; i += blockDim.x)
            to[i] = ll ? ll_read_word(lines + i, e) : __ldcg(words + i);
    }
    ar_end(own, e);
}
