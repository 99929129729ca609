//! MXFP4 decoding (docs/gpt-oss.md §3), the plain-Rust version the CPU references and the tests use.
//!
//! A block is 32 consecutive elements along the last (input) dimension: 16 bytes of FP4 (E2M1)
//! codes plus one E8M0 scale byte. In byte `b`, the low nibble is element `2b` and the high nibble
//! element `2b + 1`; the value is `FP4[code] · 2^(scale − 127)`.

/// FP4 E2M1 code → value (bit 3 sign, bits 2–1 exponent, bit 0 mantissa).
pub const FP4_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Bytes of FP4 codes per block (32 elements).
pub const BLOCK_BYTES: usize = 16;
/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;

/// 2^(scale − 127), exactly (scale 0 is the subnormal 2^-127, 255 is +inf, as the reference's ldexp).
pub fn e8m0(scale: u8) -> f32 {
    2f32.powi(i32::from(scale) - 127)
}

/// Dequantizes one row: `blocks` holds `n` blocks of 16 bytes, `scales` their `n` scales, and
/// `out` receives the `32·n` values.
pub fn dequantize_row(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
    debug_assert_eq!(blocks.len(), scales.len() * BLOCK_BYTES);
    debug_assert_eq!(out.len(), scales.len() * BLOCK_ELEMS);
    for ((block, &scale), out) in
        blocks.chunks_exact(BLOCK_BYTES).zip(scales).zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let scale = e8m0(scale);
        for (&byte, pair) in block.iter().zip(out.chunks_exact_mut(2)) {
            pair[0] = FP4_VALUES[usize::from(byte & 0xF)] * scale;
            pair[1] = FP4_VALUES[usize::from(byte >> 4)] * scale;
        }
    }
}

/// Dequantizes a whole packed tensor: `blocks` is `[…, n_blocks, 16]` and `scales` `[…, n_blocks]`
/// (flattened, row-major); the result is `[…, 32·n_blocks]`, flattened.
///
/// # Panics
/// When `blocks.len() != 16 · scales.len()`.
pub fn dequantize(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
    assert_eq!(blocks.len(), scales.len() * BLOCK_BYTES, "MXFP4: 16 block bytes per scale byte");
    let mut out = vec![0f32; scales.len() * BLOCK_ELEMS];
    dequantize_row(blocks, scales, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_example_byte_0x2a_scale_125() {
        // docs/gpt-oss.md §3: byte 0x2A with scale 125 gives (−1.0, +1.0) × 0.25.
        let mut blocks = [0u8; 16];
        blocks[0] = 0x2A;
        let out = dequantize(&blocks, &[125]);
        assert_eq!(out.len(), 32);
        assert_eq!((out[0], out[1]), (-0.25, 0.25));
        assert!(out[2..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn fp4_table_from_the_bit_fields() {
        // E2M1: sign · 2^(e−1) · (1 + m/2) for e > 0, sign · m/2 for e = 0 (subnormal).
        for code in 0u8..16 {
            let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
            let (e, m) = (i32::from((code >> 1) & 3), f32::from(code & 1));
            let mag = if e == 0 { m * 0.5 } else { 2f32.powi(e - 1) * (1.0 + m * 0.5) };
            assert_eq!(FP4_VALUES[usize::from(code)], sign * mag, "code {code}");
            assert_eq!(FP4_VALUES[usize::from(code)].is_sign_negative(), code & 8 != 0);
        }
    }

    #[test]
    fn every_nibble_in_every_position_with_scale() {
        // Byte b = (hi << 4) | lo puts lo at element 2b and hi at 2b + 1 of its block.
        let scales = [127u8, 128, 126];
        let mut blocks = vec![0u8; 16 * scales.len()];
        for (i, byte) in blocks.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        let out = dequantize(&blocks, &scales);
        for (g, &s) in scales.iter().enumerate() {
            for b in 0..16 {
                let byte = blocks[16 * g + b];
                let scale = 2f32.powi(i32::from(s) - 127);
                assert_eq!(out[32 * g + 2 * b], FP4_VALUES[usize::from(byte & 15)] * scale);
                assert_eq!(out[32 * g + 2 * b + 1], FP4_VALUES[usize::from(byte >> 4)] * scale);
            }
        }
    }

    #[test]
    fn extreme_scales() {
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(0), 2f32.powi(-127));
        assert!(e8m0(0) > 0.0, "2^-127 is a subnormal f32, not zero");
        assert_eq!(e8m0(254), 2f32.powi(127));
        assert_eq!(e8m0(255), f32::INFINITY);
    }
}
