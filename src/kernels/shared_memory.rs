//! The dynamic shared memory of every kernel that takes some, as functions of its variant: the
//! launchers size their launches with these, and build.rs (which includes this file, `#[path]`)
//! adds each kernel's largest to the static shared memory ptxas reports for every target, so that
//! a kernel that only fits an H100's 227 KiB cannot build for a GPU of 99 KiB
//! (`gpu::targets::shared_per_block`).

/// The tensor-core attention's key tile for head size `d` (`mma_key_tile` in
/// paged_attention_mma.cu): 64 keys, and 32 past d 128, where two stages of 64-key tiles would
/// take 132 KiB. Its shared rows' padding is `KPAD`.
pub const fn attention_tile(d: usize) -> usize {
    if d > 128 { 32 } else { 64 }
}
pub const ATTENTION_PAD: usize = 8;

/// paged_attention_mma's shared memory for head size `d`: two stages of bf16 K and V tiles; with
/// pools of 8-bit codes, two stages of their codes and one stage of bf16 tiles they become.
pub const fn paged_attention_mma(d: usize, codes: bool) -> usize {
    let tile = attention_tile(d);
    let bf16_tiles = 2 * tile * (d + ATTENTION_PAD) * 2;
    if codes { bf16_tiles + 2 * 2 * tile * d } else { 2 * bf16_tiles }
}

/// moe_grouped.cu's tile of slots (`BM`).
pub const GROUPED_TILE: usize = 64;

/// moe_grouped's ring of `stages` stages of slot rows (256 bytes a row; down holds bf16 hi and
/// lo, twice as much).
pub const fn moe_grouped(stages: usize, down: bool) -> usize {
    stages * GROUPED_TILE * 256 * if down { 2 } else { 1 }
}

/// The widest input mxfp4_moe.cu's per-slot kernels take (8 warps of 32 lanes × 32 values).
pub const MOE_MAX_WIDTH: usize = 8 * 32 * 32;

/// mxfp4_moe.cu's inputs staged as f32, each block of 32 padded to 36 (`XPAD`), for a width of
/// `width` values.
pub const fn moe_inputs(width: usize) -> usize {
    width / 32 * 36 * 4
}

/// The most the 8-bit and GGUF GEMVs give to their quantized rows of x, per launch (90 KiB: with
/// their static arrays under the 99 KiB of every GPU since Ampere but the A100 and Hopper). A
/// product with more rows takes several launches.
pub const GEMV_X_BYTES: usize = 90 * 1024;

/// The largest dynamic shared memory kernel `name` is launched with (0: none).
pub fn largest(name: &str) -> usize {
    if let Some(rest) = name.strip_prefix("paged_attention_mma_") {
        let (codes, rest) = match rest.strip_prefix("fp8_").or_else(|| rest.strip_prefix("int8_")) {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let d =
            rest.strip_prefix('d').and_then(|r| r.split('_').next()).and_then(|d| d.parse().ok());
        return d.map_or(usize::MAX, |d| paged_attention_mma(d, codes));
    }
    for (prefix, down) in [("moe_grouped_gate_up_", false), ("moe_grouped_down_", true)] {
        if let Some(rest) = name.strip_prefix(prefix) {
            let stages = rest.rsplit_once("_s").and_then(|(_, s)| s.parse().ok());
            return stages.map_or(usize::MAX, |s| moe_grouped(s, down));
        }
    }
    if name.starts_with("moe_gate_up_") || name.starts_with("moe_down_") {
        return moe_inputs(MOE_MAX_WIDTH);
    }
    let gemv = ["ct_gemv_i8_", "ct_gemv_f8_", "ct_gemv_q80_", "gguf_gemv_"];
    if gemv.iter().any(|p| name.starts_with(p)) {
        return GEMV_X_BYTES;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names build.rs checks map to the sizes the launchers use, for every variant the
    /// kernel files instantiate, and no launch of them needs more than a 99 KiB GPU allows.
    #[test]
    fn every_variant_has_its_size_and_fits_every_target() {
        let small = crate::gpu::targets::shared_per_block(86);
        for (d, variants) in
            [(64, &["w4", "w8", "w4_ds"][..]), (128, &["w4", "w8", "w4_ds"]), (256, &["w4_ds"])]
        {
            for (pools, codes) in [("", false), ("fp8_", true), ("int8_", true)] {
                for w in variants {
                    let name = format!("paged_attention_mma_{pools}d{d}_{w}");
                    assert_eq!(largest(&name), paged_attention_mma(d, codes), "{name}");
                    assert!(largest(&name) < small, "{name}");
                }
            }
        }
        for stages in [2, 3] {
            for mt in [1, 2] {
                let up = format!("moe_grouped_gate_up_m{mt}_s{stages}");
                let down = format!("moe_grouped_down_m{mt}_s{stages}");
                assert_eq!(largest(&up), 256 * 64 * stages);
                assert_eq!(largest(&down), 2 * 256 * 64 * stages);
                assert!(largest(&down) < small, "{down}");
            }
        }
        assert_eq!(largest("ct_gemv_f8_m2"), GEMV_X_BYTES);
        assert_eq!(largest("gguf_gemv_q6k_m1"), GEMV_X_BYTES);
        assert_eq!(largest("moe_down_r16"), 8192 / 32 * 36 * 4);
        assert_eq!(largest("argmax_rows_final"), 0);
        assert_eq!(largest("paged_attention_mma_dx_w4"), usize::MAX, "a name it cannot read");
    }
}
