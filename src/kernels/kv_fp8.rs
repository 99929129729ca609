//! The 8-bit KV caches' number formats (`--kv-dtype fp8|int8`), the plain-Rust version the CPU
//! references and the tests use; `include/fp8.cuh` is the same on the device.
//!
//! INT8 (`--kv-dtype int8`, llama.cpp's q8_0 kind) takes the same layout and scale rule with
//! integer codes: the value is `code · 2^(e − 127)`, code in −127..127, the scale the smallest
//! power of two that fits the row's largest magnitude within 127. Its error is at most half a
//! step, 1/127 of the row's largest magnitude, rather than E4M3's 1/16 of each value; on
//! attention rows, whose values are of one size, that is the smaller error (docs/performance.md
//! has what it does to agreement). Every dequantized value is exact in bf16 here too.
//!
//! Each (slot, kv head) row of `d` keys or values is stored as `d` E4M3 codes plus one E8M0
//! scale byte `e`: the value is `E4M3[code] · 2^(e − 127)`. The scale is the smallest power of
//! two that brings the row's largest magnitude within E4M3's 448, so no row can overflow, and a
//! power of two costs no precision (E4M3 is a float format: its 3 mantissa bits are relative to
//! each value whatever the scale) while making the dequantized value exact in bf16: the attention
//! kernel turns a row into the bf16 it would have held and runs the bf16 kernel's arithmetic on
//! it. One scale byte per row of 64 codes: 65 bytes where bf16 takes 128 (1.97×).
//!
//! Keys are stored rotated. Where the head width `d` is a power of two from 16 to 256, the keys
//! and the queries of pools of codes are multiplied by the Walsh–Hadamard matrix `H` (entries
//! ±1, `H·H = d·I`) before the keys are quantized: keys `H·k · 2^-a`, queries `H·q · 2^-(log2 d
//! − a)`, `a = ⌊log2 d / 2⌋`, so every score `q·k` is unchanged, and both scalings are exact
//! powers of two. Why: a trained model's keys carry a few channels far larger than the rest,
//! which set a row's scale (INT8's step is 1/127 of the largest) and dominate the scores'
//! rounding error; the rotation spreads every channel over all of them. SmolLM2-135M-Instruct
//! (real weights, f32 compute, 1,024 tokens, argmax against the same run with f32 keys and
//! values): INT8 98.14% → 99.41% with rotated keys; E4M3 95.12% → 94.43% (its error is relative
//! to each value, which a rotation does not change; docs/performance.md). Values are not
//! rotated: undoing it would take the attention's output through `H` again, and it gained nothing
//! measurable there. [`rotate`] is the transform, butterfly by butterfly as the kernel does it.
//!
//! E4M3 is the "fn" variant of the OCP FP8 formats: bias 7, no infinities, `S.1111.111` is NaN,
//! the largest finite value 448, subnormals `m · 2^-9`. Conversions round to nearest, ties to
//! even, and saturate at ±448 (what `cvt.rn.satfinite.e4m3x2.f32` does on the device).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Result, Tensor, bail};
use half::bf16;

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;
/// The largest INT8 code magnitude (−128 is not used: the codes are symmetric).
pub const INT8_MAX: f32 = 127.0;

/// Whether pools of codes store the keys of heads of width `d` rotated (the module's header).
pub fn rotates(d: usize) -> bool {
    d.is_power_of_two() && (16..=256).contains(&d)
}

/// A head's row rotated for pools of codes: `H·x` scaled by `2^-a` for a key (`a = ⌊log2 d /
/// 2⌋`) or by `2^-(log2 d − a)` for a query (the module's header), in place. The butterflies
/// of stage `h` (1, 2, 4, …) replace `x[j]`, `x[j + h]` with their sum and difference; each is one
/// f32 addition or subtraction and the scaling is exact, so the kernel's order of the
/// butterflies within a stage does not change a bit.
pub fn rotate(x: &mut [f32], key: bool) {
    let d = x.len();
    let mut h = 1;
    while h < d {
        for j in (0..d).filter(|j| j & h == 0) {
            let (a, b) = (x[j], x[j + h]);
            x[j] = a + b;
            x[j + h] = a - b;
        }
        h *= 2;
    }
    let lg = d.trailing_zeros() as i32;
    let shift = if key { lg / 2 } else { lg - lg / 2 };
    let f = 2f32.powi(-shift);
    x.iter_mut().for_each(|v| *v *= f);
}

/// The code format of a quantized pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codes {
    /// E4M3 (`DType::F8E4M3` pools).
    E4m3,
    /// Two's-complement INT8 in u8 (`DType::U8` pools).
    Int8,
}

impl Codes {
    /// The format of pools of `dtype`, `None` for f32/bf16 pools.
    pub fn of(dtype: DType) -> Option<Codes> {
        match dtype {
            DType::F8E4M3 => Some(Codes::E4m3),
            DType::U8 => Some(Codes::Int8),
            _ => None,
        }
    }

    /// The pools' dtype.
    pub fn dtype(self) -> DType {
        match self {
            Codes::E4m3 => DType::F8E4M3,
            Codes::Int8 => DType::U8,
        }
    }

    /// The largest magnitude a code holds.
    pub fn max(self) -> f32 {
        match self {
            Codes::E4m3 => E4M3_MAX,
            Codes::Int8 => INT8_MAX,
        }
    }

    /// The scale byte of a row whose largest magnitude is `amax`: the smallest `s` in
    /// [-120, 120] with `amax ≤ max · 2^s`, as `s + 127`. From the bits: with
    /// `max = 1.g · 2^m` (448 = 1.75 · 2^8, 127 = 1.984375 · 2^6), `amax = 1.f · 2^E` fits with
    /// `s = E − m` when `1.f ≤ 1.g`, else `E − m + 1` (NaN and infinities: 120).
    pub fn scale_byte(self, amax: f32) -> u8 {
        let (m, g) = match self {
            Codes::E4m3 => (8, 0x60_0000),
            Codes::Int8 => (6, 0x7e_0000),
        };
        let bits = amax.abs().to_bits();
        let e = (bits >> 23) as i32 - 127;
        let s = e - m + i32::from(bits & 0x7f_ffff > g);
        (s.clamp(MIN_EXP, MAX_EXP) + 127) as u8
    }

    /// The code of an already scaled value: to nearest, ties to even, saturating (INT8: NaN
    /// as 0).
    pub fn encode(self, x: f32) -> u8 {
        match self {
            Codes::E4m3 => e4m3_from_f32(x),
            Codes::Int8 => (x.round_ties_even().clamp(-INT8_MAX, INT8_MAX) as i8) as u8,
        }
    }

    /// The value of a code.
    pub fn decode(self, code: u8) -> f32 {
        match self {
            Codes::E4m3 => e4m3_to_f32(code),
            Codes::Int8 => f32::from(code as i8),
        }
    }
}
/// The E4M3 code of NaN (either sign bit).
const NAN_CODE: u8 = 0x7f;
/// The scale exponents a row may take: a row whose largest magnitude is below 448 · 2^-120
/// (zeros, tiny values) takes 2^-120, where every dequantized value is still exact in bf16.
const MIN_EXP: i32 = -120;
const MAX_EXP: i32 = 120;

/// `x` as the nearest E4M3 code (ties to even), ±448 beyond the range, NaN as NaN.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return NAN_CODE;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Below 2^-6 the step is the subnormals' 2^-9; above, 2^(e − 3) for a = 1.f · 2^e. The
    // quotient by the step is exact (a power of two) and its rounding carries into the exponent
    // (m = 16 is the next binade's 8, m = 8 in the subnormal case the smallest normal).
    let e = ((a.to_bits() >> 23) as i32 - 127).max(-6);
    let m = (a * 2f32.powi(3 - e)).round_ties_even() as u32;
    let code = if a < 2f32.powi(-6) { m } else { (((e + 7) as u32) << 3) + m - 8 };
    sign | code.min(0x7e) as u8
}

/// The value of E4M3 code `b`.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let (e, m) = (i32::from((b >> 3) & 0xf), f32::from(b & 7));
    let a = match (e, b & 0x7f) {
        (_, NAN_CODE) => f32::NAN,
        (0, _) => m * 2f32.powi(-9),
        _ => (1.0 + m / 8.0) * 2f32.powi(e - 7),
    };
    if b & 0x80 != 0 { -a } else { a }
}

/// 2^(byte − 127) for the scale bytes [`Codes::scale_byte`] gives (exact, from the bits).
pub fn scale_value(byte: u8) -> f32 {
    f32::from_bits(u32::from(byte) << 23)
}

/// One row quantized: its codes into `out`, its scale byte returned. Each value is
/// `x · 2^-s` (exact) rounded to a code.
pub fn quantize_row(codes: Codes, x: &[f32], out: &mut [u8]) -> u8 {
    let amax = x.iter().fold(0f32, |m, v| if v.abs() > m || v.is_nan() { v.abs() } else { m });
    let byte = codes.scale_byte(amax);
    let inv = scale_value((254 - i32::from(byte)) as u8); // 2^-s
    for (c, &v) in out.iter_mut().zip(x) {
        *c = codes.encode(v * inv);
    }
    byte
}

/// The value a code of a row with scale byte `scale` stands for, as the attention kernel sees
/// it: `code's value · 2^s` rounded to bf16 (exact for the scales [`Codes::scale_byte`] gives).
pub fn dequantize(codes: Codes, code: u8, scale: u8) -> f32 {
    bf16::from_f32(codes.decode(code) * scale_value(scale)).to_f32()
}

/// A pool of codes (`[slots, kv_heads, d]`, in [`Codes::dtype`]) and its scales
/// (`[slots, kv_heads]`, u8) from the values of `x` (`[slots, kv_heads, d]`, any float dtype), on
/// `device`: what the kernel stores for those values. Tests build pools with it.
pub fn quantize_pool(x: &Tensor, kind: Codes, device: &Device) -> Result<(Tensor, Tensor)> {
    let (slots, kv_heads, d) = x.dims3()?;
    let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut codes = vec![0u8; values.len()];
    let scales: Vec<u8> = values
        .chunks_exact(d)
        .zip(codes.chunks_exact_mut(d))
        .map(|(row, c)| quantize_row(kind, row, c))
        .collect();
    let codes = Tensor::from_raw_buffer(&codes, kind.dtype(), &[slots, kv_heads, d], device)?;
    Ok((codes, Tensor::from_vec(scales, (slots, kv_heads), &Device::Cpu)?.to_device(device)?))
}

/// The raw codes of a CPU pool of codes.
pub(super) fn cpu_codes(s: &CpuStorage) -> Result<Vec<u8>> {
    match s {
        CpuStorage::F8E4M3(v) => Ok(v.iter().map(|c| c.to_bits()).collect()),
        CpuStorage::U8(v) => Ok(v.clone()),
        other => bail!("expected FP8 or INT8 codes, got {:?}", other.dtype()),
    }
}

/// A pool dequantized, `[slots, kv_heads, d]` f32 ([`dequantize`] per element): what the
/// attention reads.
pub fn dequantize_pool(codes: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let (slots, kv_heads, d) = codes.dims3()?;
    let Some(kind) = Codes::of(codes.dtype()) else {
        bail!("dequantize_pool: not a pool of codes")
    };
    let codes = codes.to_device(&Device::Cpu)?;
    let (storage, layout) = codes.storage_and_layout();
    let candle_core::Storage::Cpu(s) = &*storage else { bail!("dequantize_pool: not on the CPU") };
    let Some((a, b)) = layout.contiguous_offsets() else {
        bail!("dequantize_pool: the codes must be contiguous")
    };
    let raw = cpu_codes(s)?;
    let scales = scales.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<u8>()?;
    let out: Vec<f32> =
        raw[a..b].iter().enumerate().map(|(i, &c)| dequantize(kind, c, scales[i / d])).collect();
    Tensor::from_vec(out, (slots, kv_heads, d), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;
    use crate::kernels::testing::rng;

    /// Every finite E4M3 value with its code, from the definition (not from e4m3_to_f32).
    fn table() -> Vec<(u8, f64)> {
        let mut out = Vec::new();
        for code in 0u8..0x7f {
            let (e, m) = (i32::from(code >> 3), f64::from(code & 7));
            let v = if e == 0 { m / 512.0 } else { (8.0 + m) * 2f64.powi(e - 10) };
            out.push((code, v));
            out.push((code | 0x80, -v));
        }
        out
    }

    /// The nearest code by search: the closest value, ties to the even code (even mantissa),
    /// clamped to ±448.
    fn nearest(x: f32, table: &[(u8, f64)]) -> u8 {
        let x = f64::from(x).clamp(-448.0, 448.0);
        let mut best = (f64::INFINITY, 0u8);
        for &(code, v) in table.iter().filter(|(_, v)| (*v >= 0.0) == (x >= 0.0) || *v == 0.0) {
            let dist = (v - x).abs();
            if dist < best.0 || (dist == best.0 && code & 1 == 0 && best.1 & 1 == 1) {
                best = (dist, code);
            }
        }
        // ±0: the sign of x.
        if best.1 & 0x7f == 0 { if x.is_sign_negative() { 0x80 } else { 0 } } else { best.1 }
    }

    /// A rotated query against a rotated key gives the plain score, and turning a key back with
    /// the query's rotation gives the key: `H·H = d·I` and the two scalings multiply to `1/d`.
    #[test]
    fn rotated_queries_and_keys_keep_every_score() {
        let mut r = crate::kernels::testing::rng("kv rotation");
        for d in [16, 32, 64, 128, 256] {
            assert!(rotates(d) && !rotates(d + 8) && !rotates(8) && !rotates(512));
            for _ in 0..20 {
                let q = crate::kernels::testing::uniform(&mut r, d, -4.0, 4.0);
                let mut k = crate::kernels::testing::uniform(&mut r, d, -4.0, 4.0);
                k[r.random_range(0..d)] = 300.0; // an outlier channel, as trained keys have
                let plain: f64 = q.iter().zip(&k).map(|(a, b)| f64::from(a * b)).sum();
                let (mut qr, mut kr) = (q.clone(), k.clone());
                rotate(&mut qr, false);
                rotate(&mut kr, true);
                let turned: f64 = qr.iter().zip(&kr).map(|(a, b)| f64::from(a * b)).sum();
                let size: f64 = q.iter().zip(&k).map(|(a, b)| f64::from((a * b).abs())).sum();
                assert!((plain - turned).abs() <= 1e-5 * size, "d {d}: {plain} vs {turned}");
                // The outlier is spread: no rotated channel keeps more than a few times 300 / √d.
                let top = kr.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(
                    top < 300.0 / 2f32.powi(d.trailing_zeros() as i32 / 2) * 2.0,
                    "d {d}: {top}"
                );
                rotate(&mut kr, false);
                for (a, b) in kr.iter().zip(&k) {
                    assert!((a - b).abs() <= 1e-5 * 300.0, "d {d}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn codes_round_to_nearest_even_and_saturate() {
        let table = table();
        for &(code, v) in &table {
            assert_eq!(f64::from(e4m3_to_f32(code)), v, "code {code:#x}");
            assert_eq!(e4m3_from_f32(v as f32), code, "value {v}");
        }
        let mut r = rng("e4m3 rounding");
        for _ in 0..20_000 {
            let mag = 2f32.powi(r.random_range(-12..10));
            let x = r.random_range(-1.0f32..1.0) * mag;
            assert_eq!(e4m3_from_f32(x), nearest(x, &table), "x = {x:e}");
        }
        // Halfway cases: between 1.0 (mantissa 0) and 1.125 (1), 1.125 and 1.25 (2).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.1875)), 1.25);
        assert_eq!(e4m3_from_f32(1e9), 0x7e);
        assert_eq!(e4m3_from_f32(f32::NEG_INFINITY), 0xfe);
        assert!(e4m3_to_f32(e4m3_from_f32(f32::NAN)).is_nan());
    }

    #[test]
    fn scale_is_the_smallest_power_that_fits() {
        let mut r = rng("e4m3 scales");
        for _ in 0..20_000 {
            let amax = r.random_range(0.0f32..1.0) * 2f32.powi(r.random_range(-30..30));
            for codes in [Codes::E4m3, Codes::Int8] {
                let byte = codes.scale_byte(amax);
                let s = i32::from(byte) - 127;
                let fits = |s: i32| f64::from(amax) <= f64::from(codes.max()) * 2f64.powi(s);
                assert!(fits(s) && (s == MIN_EXP || !fits(s - 1)), "{codes:?} {amax:e}: s {s}");
                assert_eq!(f64::from(scale_value(byte)), 2f64.powi(s));
            }
        }
        for (codes, max) in [(Codes::E4m3, 448.0f32), (Codes::Int8, 127.0)] {
            assert_eq!(codes.scale_byte(max), 127);
            assert_eq!(codes.scale_byte(max * 1.001), 128);
            assert_eq!(codes.scale_byte(max / 2.0), 126);
            assert_eq!(codes.scale_byte(0.0), (MIN_EXP + 127) as u8);
            assert_eq!(codes.scale_byte(f32::INFINITY), (MAX_EXP + 127) as u8);
        }
    }

    /// Rows of random magnitudes: no value saturates, each within half a step of the input
    /// (E4M3: 2^-4 relative, or its subnormal step below 2^-6 · 2^s; INT8: half of 2^s), and the
    /// dequantized value is exact in bf16.
    #[test]
    fn rows_round_trip_within_half_a_step() {
        let mut r = rng("kv code rows");
        for kind in [Codes::E4m3, Codes::Int8] {
            for _ in 0..500 {
                let mag = 2f32.powi(r.random_range(-40..40));
                let row: Vec<f32> = (0..64).map(|_| r.random_range(-1.0f32..1.0) * mag).collect();
                let mut codes = vec![0u8; 64];
                let scale = quantize_row(kind, &row, &mut codes);
                let s = scale_value(scale);
                for (&x, &c) in row.iter().zip(&codes) {
                    let exact = kind.decode(c) * s;
                    assert_eq!(dequantize(kind, c, scale), exact, "not exact in bf16");
                    let tol = match kind {
                        Codes::E4m3 => {
                            assert!((c & 0x7f) != 0x7e || x.abs() >= 416.0 * s, "saturated");
                            (x.abs() / 16.0).max(s * 2f32.powi(-10))
                        }
                        Codes::Int8 => s / 2.0,
                    };
                    assert!((exact - x).abs() <= tol, "{kind:?} {x:e} -> {exact:e} (scale {s:e})");
                }
            }
        }
    }

    #[test]
    fn int8_codes_round_to_nearest_even_and_saturate() {
        let i = Codes::Int8;
        assert_eq!([i.encode(2.5), i.encode(3.5), i.encode(-2.5)], [2, 4, (-2i8) as u8]);
        assert_eq!([i.encode(300.0), i.encode(-1e9), i.encode(f32::NAN)], [127, 0x81, 0]);
        assert!((-127..=127).all(|c: i32| i.decode(i.encode(c as f32)) == c as f32));
    }
}
