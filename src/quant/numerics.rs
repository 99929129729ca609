//! The numbers of compressed-tensors, in plain Rust: FP8 E4M3 coding, the per-token activation
//! fake-quantization its Linear forward applies, and the 4-bit unpacking. These are the CPU
//! reference (what the GPU kernels are tested against) and the CPU path itself.

use super::config::ActQuant;

/// Largest finite E4M3 value (`torch.float8_e4m3fn`: no infinities, 0x7f/0xff are NaN).
pub const FP8_MAX: f32 = 448.0;

/// The value of an E4M3 byte (bias 7, 3 mantissa bits, subnormals below 2^-6).
pub fn fp8_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xf, b & 7);
    if e == 0xf && m == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        f32::from(m) * 2f32.powi(-9)
    } else {
        (1.0 + f32::from(m) / 8.0) * 2f32.powi(i32::from(e) - 7)
    };
    sign * mag
}

/// The non-negative finite E4M3 values by code, 0x00..=0x7e (increasing with the code).
fn fp8_table() -> &'static [f32; 127] {
    static T: std::sync::OnceLock<[f32; 127]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|c| fp8_to_f32(c as u8)))
}

/// `x` rounded to E4M3 as torch's `.to(float8_e4m3fn)` does it, for |x| ≤ 448: to the nearest
/// code, ties to the even code (adjacent codes differ in the mantissa's last bit).
pub fn f32_to_fp8(x: f32) -> u8 {
    let t = fp8_table();
    let a = x.abs().min(FP8_MAX);
    // First code whose value is ≥ a; the nearest is it or the one below.
    let hi = t.partition_point(|&v| v < a).min(126);
    let code = if hi == 0 {
        0
    } else {
        let (lo_d, hi_d) = (a - t[hi - 1], t[hi] - a);
        if lo_d < hi_d || (lo_d == hi_d && (hi - 1) % 2 == 0) { hi - 1 } else { hi }
    };
    code as u8 | if x.is_sign_negative() && code != 0 { 0x80 } else { 0 }
}

/// A row's dynamic per-token scale: max |x| (with 0 in the range) over half the quantized
/// range (127.5 for int8, 448 for FP8), the float epsilon instead of 0 (compressed-tensors'
/// `calculate_qparams`).
pub fn token_scale(row: &[f32], act: ActQuant) -> f32 {
    let max = row.iter().fold(0f32, |m, &v| m.max(v));
    let min = row.iter().fold(0f32, |m, &v| m.min(v));
    let half_range = match act {
        ActQuant::Fp8Token => FP8_MAX,
        _ => 127.5,
    };
    let s = max.max(-min) / half_range;
    if s == 0.0 { f32::EPSILON } else { s }
}

/// One value quantized with `scale`: the int8 or E4M3 value, as f32 (exact).
pub fn quantize(x: f32, scale: f32, act: ActQuant) -> f32 {
    let v = x / scale;
    match act {
        ActQuant::Int8Token | ActQuant::Int8Block => v.clamp(-128.0, 127.0).round_ties_even(),
        ActQuant::Fp8Token => fp8_to_f32(f32_to_fp8(v.clamp(-FP8_MAX, FP8_MAX))),
        ActQuant::None => v,
    }
}

/// `x` (`[rows, k]` row-major) fake-quantized in place, row by row: quantize, then multiply
/// back by the row's scale, as compressed-tensors' forward does to a Linear's input.
pub fn fake_quantize_rows(x: &mut [f32], k: usize, act: ActQuant) {
    if act == ActQuant::None || k == 0 {
        return;
    }
    if act == ActQuant::Int8Block {
        x.chunks_mut(Q8_BLOCK).for_each(fake_quantize_block);
        return;
    }
    for row in x.chunks_exact_mut(k) {
        let s = token_scale(row, act);
        for v in row.iter_mut() {
            *v = quantize(*v, s, act) * s;
        }
    }
}

/// Values per block of GGUF's Q8_0 (weights) and of [`ActQuant::Int8Block`] (inputs).
pub const Q8_BLOCK: usize = 32;

/// One block of x quantized as [`ActQuant::Int8Block`] and multiplied back. The operations are
/// the GEMV's (ct_gemv.cu's `quantize_blocks`): d = max / 127 and 1 / d correctly rounded, then
/// round(x · (1 / d)), so the codes are the same bits on both.
fn fake_quantize_block(b: &mut [f32]) {
    let d = b.iter().fold(0f32, |m, &v| m.max(v.abs())) / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    for v in b {
        *v = (*v * id).round() * d;
    }
}

/// 4-bit value `i` of a packed row (element i at bits 4·(i % 8) of word i / 8, stored as q + 8).
pub fn nibble(words: &[i32], i: usize) -> i32 {
    ((words[i / 8] as u32 >> (4 * (i % 8))) & 0xf) as i32 - 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_codes_round_trip_and_round_to_nearest_even() {
        for c in 0..=255u8 {
            let v = fp8_to_f32(c);
            if !v.is_nan() && c != 0x80 {
                assert_eq!(f32_to_fp8(v), c, "code {c:#x} = {v}");
            }
        }
        assert_eq!(fp8_to_f32(0x7e), 448.0);
        assert_eq!(fp8_to_f32(0x01), 2f32.powi(-9));
        // 1.0625 lies halfway between 1.0 (0x38, even) and 1.125 (0x39).
        assert_eq!(f32_to_fp8(1.0625), 0x38);
        assert_eq!(f32_to_fp8(1.1875), 0x3a, "between 0x39 and 0x3a: to the even 0x3a");
        assert_eq!(f32_to_fp8(-1.07), 0xb9);
        assert_eq!(f32_to_fp8(1e-4), 0, "below half the smallest subnormal");
    }

    #[test]
    fn int8_token_quantization_matches_compressed_tensors() {
        // max |x| = 2.55: scale 0.02; 2.55 / 0.02 = 127.5 clamps to 127, -1.01 / 0.02 = -50.5
        // rounds to -50 (ties to even), 0.03 / 0.02 = 1.5 to 2.
        let mut x = vec![2.55f32, -1.01, 0.03, 0.0];
        let s = token_scale(&x, ActQuant::Int8Token);
        assert_eq!(s, 2.55f32 / 127.5);
        let q: Vec<f32> = x.iter().map(|&v| quantize(v, s, ActQuant::Int8Token)).collect();
        assert_eq!(q, [127.0, -50.0, 2.0, 0.0]);
        fake_quantize_rows(&mut x, 4, ActQuant::Int8Token);
        assert_eq!(x, [127.0 * s, -50.0 * s, 2.0 * s, 0.0]);
        let mut zeros = vec![0f32; 3];
        fake_quantize_rows(&mut zeros, 3, ActQuant::Fp8Token);
        assert_eq!(zeros, [0.0; 3]);
    }

    /// ct_gemv.cu quantizes x / s as q + (x − q·s)·r with q = x·r and r = 1 / s (each step
    /// rounded once, the two last as FMAs): the same as the division wherever the quotient is
    /// above 1e-4 in magnitude (below, int8 and E4M3 both round to 0), for every bf16 x within
    /// the row's maximum and scales from 1e-30 up.
    #[test]
    fn reciprocal_correction_equals_the_division() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..200 {
            let max = f32::from_bits(((next() & 0x7f7f) as u32) << 16);
            let s = max / if i % 2 == 0 { 127.5 } else { FP8_MAX };
            if !max.is_finite() || s < 1e-30 {
                continue;
            }
            let r = 1.0 / s;
            for b in 0..=0xffffu32 {
                let x = f32::from_bits(b << 16);
                if x.is_nan() || x.abs() > max {
                    continue;
                }
                let q = x * r;
                let got = (-q).mul_add(s, x).mul_add(r, q);
                let want = x / s;
                assert!(
                    got == want || (got.abs() < 1e-4 && want.abs() < 1e-4),
                    "x {x:e} s {s:e}: {got:e} vs {want:e}"
                );
            }
        }
    }

    #[test]
    fn nibbles_unpack_least_significant_first() {
        // Words hold q + 8: 0x...f8 is element 0 = 0, element 1 = 7.
        let words = [0x0000_00f8u32 as i32, 0x1000_0000];
        assert_eq!((nibble(&words, 0), nibble(&words, 1), nibble(&words, 2)), (0, 7, -8));
        assert_eq!(nibble(&words, 15), -7);
    }
}
