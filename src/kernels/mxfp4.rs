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

// ------------------------------------------------------------------------- ggml's MXFP4 blocks

/// Bytes of one ggml MXFP4 block (type 39): the E8M0 scale byte, then 16 bytes of codes.
pub const GGML_BLOCK_BYTES: usize = 17;

/// The 16 code bytes of a ggml MXFP4 block respelled in the checkpoint's nibble order. ggml puts
/// element `j` in the low nibble of byte `j` and element `j + 16` in its high nibble
/// (`dequantize_row_mxfp4` in ggml-quants.c); the checkpoint puts elements `2b` and `2b + 1` in
/// the low and high nibbles of byte `b`. The codes themselves index the same FP4 table in both,
/// and the scale byte is the same E8M0 exponent (ggml doubles its table and halves the scale).
pub fn ggml_codes_to_hf(qs: &[u8; BLOCK_BYTES]) -> [u8; BLOCK_BYTES] {
    let code = |k: usize| if k < 16 { qs[k] & 0xF } else { qs[k - 16] >> 4 };
    std::array::from_fn(|b| code(2 * b) | (code(2 * b + 1) << 4))
}

/// Respells rows of ggml MXFP4 blocks (`[rows, row_blocks, 17]` each, flattened) into the
/// checkpoint's codes (`[rows·n, row_blocks, 16]`) and scales (`[rows·n, row_blocks]`), taking
/// the output rows from the `n` sources in turn: one source is a plain respelling, two (gate, up)
/// give HF's fused `gate_up` (gate channel j = row 2j, up = row 2j + 1) in the same pass. Spread
/// over the host's cores: a gpt-oss-20b file holds 600 million blocks.
///
/// # Panics
/// When the sources differ in length or are not whole rows of 17-byte blocks.
pub fn ggml_rows_to_hf(sources: &[&[u8]], row_blocks: usize) -> (Vec<u8>, Vec<u8>) {
    let n = sources.len();
    let row_bytes = row_blocks * GGML_BLOCK_BYTES;
    let rows = sources.first().map_or(0, |s| s.len() / row_bytes.max(1));
    for s in sources {
        assert!(s.len() == rows * row_bytes, "MXFP4: sources must be equal whole rows");
    }
    let out_rows = rows * n;
    let (mut codes, mut scales) =
        (vec![0u8; out_rows * row_blocks * BLOCK_BYTES], vec![0u8; out_rows * row_blocks]);
    if out_rows == 0 || row_blocks == 0 {
        return (codes, scales);
    }
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(16);
    let per = out_rows.div_ceil(threads);
    std::thread::scope(|scope| {
        let parts = codes
            .chunks_mut(per * row_blocks * BLOCK_BYTES)
            .zip(scales.chunks_mut(per * row_blocks))
            .enumerate();
        for (part, (codes, scales)) in parts {
            scope.spawn(move || {
                let rows_out = codes.chunks_exact_mut(row_blocks * BLOCK_BYTES);
                for (k, (codes, scales)) in
                    rows_out.zip(scales.chunks_exact_mut(row_blocks)).enumerate()
                {
                    let r = part * per + k;
                    let src = &sources[r % n][(r / n) * row_bytes..][..row_bytes];
                    let blocks = src.chunks_exact(GGML_BLOCK_BYTES);
                    for ((block, out), scale) in
                        blocks.zip(codes.chunks_exact_mut(BLOCK_BYTES)).zip(scales.iter_mut())
                    {
                        let (e, qs) = block.split_at(1);
                        *scale = e[0];
                        let qs: &[u8; BLOCK_BYTES] = qs.try_into().expect("16 code bytes");
                        out.copy_from_slice(&ggml_codes_to_hf(qs));
                    }
                }
            });
        }
    });
    (codes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's own decoding of one ggml block, transcribed from `dequantize_row_mxfp4`:
    /// `kvalues_mxfp4` (the FP4 values doubled) times `GGML_E8M0_TO_FP32_HALF(e)`.
    fn ggml_dequantize_block(block: &[u8]) -> [f32; 32] {
        const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
        let d = 2f32.powi(i32::from(block[0]) - 127) * 0.5;
        let mut y = [0f32; 32];
        for j in 0..16 {
            y[j] = f32::from(KVALUES[usize::from(block[1 + j] & 0x0F)]) * d;
            y[j + 16] = f32::from(KVALUES[usize::from(block[1 + j] >> 4)]) * d;
        }
        y
    }

    #[test]
    fn ggml_blocks_respelled_decode_to_the_same_values() {
        let mut raw = vec![0u8; 17 * 40];
        for (i, byte) in raw.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(73).wrapping_add(5);
        }
        for (g, block) in raw.chunks_exact_mut(17).enumerate() {
            block[0] = 110 + (g as u8 % 30); // scales around 2^0, away from inf
        }
        // 40 blocks as 8 rows of 5, plainly; then as two sources of 4 rows, interleaved.
        let (codes, scales) = ggml_rows_to_hf(&[&raw], 5);
        let ours = dequantize(&codes, &scales);
        for (g, block) in raw.chunks_exact(17).enumerate() {
            let want = ggml_dequantize_block(block);
            assert_eq!(&ours[32 * g..32 * g + 32], &want[..], "block {g}");
        }
        let (a, b) = raw.split_at(17 * 20);
        let (codes2, scales2) = ggml_rows_to_hf(&[a, b], 5);
        let fused = dequantize(&codes2, &scales2);
        let row = |v: &[f32], r: usize| v[160 * r..160 * r + 160].to_vec();
        for j in 0..4 {
            assert_eq!(row(&fused, 2 * j), row(&ours, j), "row {j} of the first source");
            assert_eq!(row(&fused, 2 * j + 1), row(&ours, 4 + j), "row {j} of the second");
        }
    }

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
