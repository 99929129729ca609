// ggml MXFP4 blocks (GGUF type 39: scale byte, then 16 code bytes, element j in the low nibble of
// byte j and j + 16 in its high nibble) respelled on the device into the checkpoint layout our
// MoE kernels take (codes [rows, blocks, 16] with elements 2b, 2b + 1 in byte b; scales
// [rows, blocks]), the output rows taken from n_src sources in turn (2: gate and up fused as HF's
// gate_up, gate channel j = row 2j). The CPU reference is mxfp4::ggml_rows_to_hf. On the host the
// respelling of a gpt-oss-20b file (600 million blocks) took seconds and a host copy of the
// whole expert set; here the raw bytes go up as they lie in the file and this runs in
// milliseconds. One thread per output block.
#include "common.cuh"

extern "C" __global__ void mxfp4_ggml_to_hf(
    const uint8_t* __restrict__ src0, const uint8_t* __restrict__ src1, int n_src,
    uint8_t* __restrict__ codes, uint8_t* __restrict__ scales, long long out_blocks,
    int row_blocks) {
    pdl_wait();
    const long long ob = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (ob >= out_blocks) return;
    const long long r = ob / row_blocks, b = ob % row_blocks;
    const uint8_t* src = (n_src == 2 && (r & 1)) ? src1 : src0;
    const uint8_t* in = src + ((r / n_src) * row_blocks + b) * 17;
    scales[ob] = in[0];
    uint8_t q[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) q[k] = in[1 + k];
    // Output byte k holds elements 2k (low) and 2k + 1 (high); element e < 16 is the low nibble
    // of q[e], e >= 16 the high nibble of q[e - 16].
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = 4 * w + j, lo = 2 * k, hi = 2 * k + 1;
            const uint32_t a = lo < 16 ? (q[lo] & 0xF) : (q[lo - 16] >> 4);
            const uint32_t c = hi < 16 ? (q[hi] & 0xF) : (q[hi - 16] >> 4);
            word |= (a | (c << 4)) << (8 * j);
        }
        words[w] = word;
    }
    // codes is 16-byte aligned (a fresh allocation) and each block's 16 bytes start at 16·ob.
    reinterpret_cast<uint4*>(codes)[ob] = make_uint4(words[0], words[1], words[2], words[3]);
}
