// The MLP activations, one definition each, so that every kernel that applies one computes the
// same bits (the fused GEMV epilogues must equal the separate kernels they replace).
#pragma once

#include "common.cuh"

// Llama's SwiGLU: silu(g) · u (silu_mul_bf16, gemv_bf16.cu's SWIGLU epilogue).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }

// gpt-oss's clamped SwiGLU of a gate/up pair, biases added (docs/gpt-oss.md §4.5): gate clamped
// to at most limit, up to [-limit, limit], then gate · sigmoid(alpha · gate) · (up + 1). All three
// MoE paths (mxfp4_moe.cu, moe_slot_mma.cu, mxfp4_mma.cuh's epilogue for the grouped kernels).
__device__ __forceinline__ float swiglu_clamped(float gate, float up, float limit, float alpha) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    return gate / (1.f + expf(-alpha * gate)) * (up + 1.f);
}
