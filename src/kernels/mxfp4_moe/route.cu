// gpt-oss routing (docs/gpt-oss.md §4.5, pitfall #5): per token, the k largest of the raw router
// logits (plus bias), then a softmax over those k only. One warp per token; lane l holds logits
// l, l + 32, ...; k rounds of a warp argmax (ties: the lower expert index, as a stable sort
// gives), each winner knocked out. Replaces sort + narrow + gather + softmax + bias add.
// grid (ceil(tokens / 4)), block (128); experts <= 32 * MAX_PER_LANE, k <= 32. Launched with
// Programmatic Dependent Launch (launch.rs). The CPU reference is routed.rs's `route`.
// live (may be null): tokens from *live on are padding (a decode graph's padding sequences),
// routed to no expert (id `experts`, weight 0), so the expert kernels read no weights for them.

#include "common.cuh"

#define MAX_PER_LANE 8  // experts up to 256

extern "C" __global__ void __launch_bounds__(128)
    route_topk_softmax(const float* __restrict__ logits, const float* __restrict__ bias, uint32_t* __restrict__ ids,
                       float* __restrict__ weights, int tokens, int experts, int k,
                       const uint32_t* __restrict__ live) {
    pdl_launch_dependents();
    pdl_wait();  // the logits are the previous kernel's
    const int lane = threadIdx.x & 31;
    const long long t = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (t >= tokens) return;
    if (live && t >= (long long)*live) {
        if (lane < k) {
            ids[t * k + lane] = (uint32_t)experts;
            weights[t * k + lane] = 0.f;
        }
        return;
    }
    float v[MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_PER_LANE; i++) {
        const int e = lane + 32 * i;
        v[i] = e < experts ? logits[t * experts + e] + bias[e] : -INFINITY;
    }
    float top0 = 0.f, sum = 0.f, mine = 0.f;
    int mine_id = 0;
    for (int r = 0; r < k; r++) {
        // This lane's best (value, index), then the warp's.
        float best = -INFINITY;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MAX_PER_LANE; i++) {
            const int e = lane + 32 * i;
            if (e < experts && (v[i] > best || (v[i] == best && e < best_e))) {
                best = v[i];
                best_e = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL_MASK, best, o);
            const int oe = __shfl_xor_sync(FULL_MASK, best_e, o);
            if (ob > best || (ob == best && oe < best_e)) {
                best = ob;
                best_e = oe;
            }
        }
        if (r == 0) top0 = best;
        const float w = expf(best - top0);  // the first is the largest: no overflow
        sum += w;
        if (lane == r) {
            mine = w;
            mine_id = best_e;
        }
        if ((best_e & 31) == lane) {
#pragma unroll
            for (int i = 0; i < MAX_PER_LANE; i++)
                if (lane + 32 * i == best_e) v[i] = -INFINITY;
        }
    }
    if (lane < k) {
        ids[t * k + lane] = (uint32_t)mine_id;
        weights[t * k + lane] = mine / sum;
    }
}
