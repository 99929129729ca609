// The constraint masks written into a step's logits (mod.rs): out[r][t] = -inf where row r has
// mask m = which[r] >= 0 and bit t of its mask is clear (or t is past the mask's words), else
// logits[r][t], the same bits. The masks travel as llguidance's bit words, 1/32 of a byte per
// token, so 64 rows of a 201k vocabulary upload 1.6 MB rather than 13 MB of bytes.
// grid (rows, ceil(vocab / (4 · 256))), block (256): each thread 4 consecutive tokens. Launched
// with Programmatic Dependent Launch (launch.rs).

#include "common.cuh"

extern "C" __global__ void token_mask(const float* __restrict__ logits, const int* __restrict__ which,
                                      const unsigned* __restrict__ bits, float* __restrict__ out, int vocab,
                                      int words) {
    // The logits are the step's last product (launch.rs: wait before reading or writing).
    pdl_wait();
    pdl_launch_dependents();
    const int r = blockIdx.x;
    const int m = which[r];
    const long long base = (long long)r * vocab;
    const int t0 = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int t = t0 + k;
        if (t >= vocab) return;
        float v = logits[base + t];
        if (m >= 0) {
            const int w = t >> 5;
            const bool allowed = w < words && ((bits[(long long)m * words + w] >> (t & 31)) & 1u);
            if (!allowed) v = -INFINITY;
        }
        out[base + t] = v;
    }
}
