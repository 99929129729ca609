//! GGUF's Q4_K and Q6_K weights (what `Q4_K_M` files hold) as a [`QuantLinear`]
//! ([`WeightFormat::Q4K`], [`WeightFormat::Q6K`]), for gguf_gemv.cu's decode GEMVs and the
//! batched path's fused products, instead of candle's quantized matmul.
//!
//! Both are read from the file's super-blocks of 256 columns and repacked per row, at the same
//! bits per weight: the codes in the order in which a GEMV lane consumes them (gguf_gemv.cu's
//! header spells the layout out; the position functions below are its one definition on the
//! host), then the small per-block scales, 16-byte aligned; the per-256 f16 scales go to `scale`.
//! The values are ggml's: Q4_K `d·sc·q − dmin·m` (sc, m 6-bit per 32 columns), Q6_K
//! `d·sc·(q − 32)` (sc int8 per 16 columns).

use candle_core::{DType, Device, Tensor};
use half::f16;

use super::QuantLinear;
use super::config::{ActQuant, Scheme, WeightFormat};
use crate::error::{ErrorKind, fail};

/// Columns per super-block.
pub const SUPER: usize = 256;
const Q4K_BYTES: usize = 144;
const Q6K_BYTES: usize = 210;

/// Whether rows of `inp` columns take these layouts (whole super-blocks).
pub fn fits(inp: usize) -> bool {
    inp > 0 && inp.is_multiple_of(SUPER)
}

/// One row of a k-quant weight in natural column order: the codes (Q4_K 0..=15, Q6_K 0..=63),
/// the per-block scales (Q4_K sc, m per 32 columns; Q6_K sc per 16, as bytes) and the per-256
/// f16 scales (Q4_K d, dmin; Q6_K d).
struct Row {
    codes: Vec<u8>,
    small: Vec<u8>,
    sup: Vec<f16>,
}

fn f16_at(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

/// ggml's `get_scale_min_k4`: sub-block j's 6-bit scale and min from the 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn parse_q4k(blocks: &[u8]) -> Row {
    let mut r = Row { codes: Vec::new(), small: Vec::new(), sup: Vec::new() };
    for b in blocks.chunks_exact(Q4K_BYTES) {
        r.sup.extend([f16_at(b, 0), f16_at(b, 2)]);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            r.small.extend([sc, m]);
        }
        let qs = &b[16..];
        r.codes.extend((0..SUPER).map(|c| {
            let (j, l) = (c / 64, c % 64);
            if l < 32 { qs[32 * j + l] & 0xf } else { qs[32 * j + l - 32] >> 4 }
        }));
    }
    r
}

fn parse_q6k(blocks: &[u8]) -> Row {
    let mut r = Row { codes: Vec::new(), small: Vec::new(), sup: Vec::new() };
    for b in blocks.chunks_exact(Q6K_BYTES) {
        let (ql, qh) = (&b[..128], &b[128..192]);
        r.small.extend_from_slice(&b[192..208]);
        r.sup.push(f16_at(b, 208));
        r.codes.extend((0..SUPER).map(|c| {
            let (n, v) = (c / 128, c % 128);
            let (quarter, l) = (v / 32, v % 32);
            let lo = ql[64 * n + l + 32 * (quarter % 2)] >> (4 * (quarter / 2)) & 0xf;
            let hi = (qh[32 * n + l] >> (2 * quarter)) & 3;
            lo | hi << 4
        }));
    }
    r
}

/// Q4_K: byte and nibble shift of column `c`'s code in a stored row.
fn q4k_code_at(c: usize) -> (usize, u32) {
    let (q, v) = (c / 128, c % 128);
    let (b, w) = (v / 32, v % 32);
    let u = w % 16;
    (64 * q + 16 * (u / 4) + 4 * b + u % 4, 4 * (w / 16) as u32)
}

/// Q6_K: (byte, shift) of column `c`'s low 4 bits and of its high 2 bits in a stored row of `k`
/// columns.
fn q6k_code_at(c: usize, k: usize) -> ((usize, u32), (usize, u32)) {
    let (q, v) = (c / 128, c % 128);
    let (s, u) = (v / 16, v % 16);
    let (t, e) = (u / 4, u % 4);
    let lo = (64 * q + 16 * t + 4 * (s / 2) + e, 4 * (s % 2) as u32);
    let hi = (k / 2 + 32 * q + 8 * t + 4 * (s / 4) + e, 2 * (s % 4) as u32);
    (lo, hi)
}

/// Bytes of a stored row of `k` columns.
fn row_bytes(format: WeightFormat, k: usize) -> usize {
    match format {
        WeightFormat::Q4K => 9 * k / 16,
        _ => 13 * k / 16,
    }
}

fn pack_row(format: WeightFormat, row: &Row, k: usize, out: &mut [u8]) {
    if format == WeightFormat::Q4K {
        for (c, &code) in row.codes.iter().enumerate() {
            let (at, shift) = q4k_code_at(c);
            out[at] |= code << shift;
        }
        out[k / 2..].copy_from_slice(&row.small);
    } else {
        for (c, &code) in row.codes.iter().enumerate() {
            let ((lo, ls), (hi, hs)) = q6k_code_at(c, k);
            out[lo] |= (code & 0xf) << ls;
            out[hi] |= (code >> 4) << hs;
        }
        out[3 * k / 4..].copy_from_slice(&row.small);
    }
}

impl QuantLinear {
    /// A Q4_K or Q6_K tensor's bytes as they are in the GGUF file (row-major super-blocks), on
    /// `dev`.
    pub fn from_k_quant(
        format: WeightFormat,
        bytes: &[u8],
        (out, inp): (usize, usize),
        dev: &Device,
    ) -> anyhow::Result<Self> {
        let block = match format {
            WeightFormat::Q4K => Q4K_BYTES,
            WeightFormat::Q6K => Q6K_BYTES,
            _ => anyhow::bail!("{format:?} is not a k-quant"),
        };
        if !fits(inp) {
            anyhow::bail!("k-quant rows of {inp} columns are not whole super-blocks of {SUPER}");
        }
        let file_row = inp / SUPER * block;
        if bytes.len() != out * file_row {
            return Err(fail(
                ErrorKind::Integrity,
                format!(
                    "a {format:?} [{out}, {inp}] tensor holds {} bytes, not {}",
                    bytes.len(),
                    out * file_row
                ),
            ));
        }
        let rb = row_bytes(format, inp);
        let mut packed = vec![0u8; out * rb];
        let mut sup = Vec::with_capacity(out * inp / SUPER * 2);
        for (r, src) in bytes.chunks_exact(file_row).enumerate() {
            let row = if format == WeightFormat::Q4K { parse_q4k(src) } else { parse_q6k(src) };
            pack_row(format, &row, inp, &mut packed[r * rb..(r + 1) * rb]);
            sup.extend_from_slice(&row.sup);
        }
        let q = Tensor::from_vec(packed, (out, rb), dev)?;
        let scale = Tensor::from_vec(sup, (out, sup_per_row(format, inp)), dev)?;
        let scheme = Scheme { weight: format, act: ActQuant::Int8Block };
        let mut l = QuantLinear::eight_bit(scheme, (out, inp), q, scale);
        l.group = SUPER;
        if dev.is_cpu() {
            l.dense = Some(Tensor::from_vec(l.dequantize_k()?, (out, inp), dev)?);
        }
        Ok(l)
    }

    /// Random weights of about `std`, quantized by candle's (ggml's) quantizer.
    pub(super) fn random_k(
        format: WeightFormat,
        (out, inp): (usize, usize),
        std: f32,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> anyhow::Result<Self> {
        use candle_core::quantized::{GgmlDType, QTensor};
        use rand::Rng;
        let spread = std * 3f32.sqrt();
        let w: Vec<f32> = (0..out * inp).map(|_| rng.random_range(-spread..spread)).collect();
        let dtype = if format == WeightFormat::Q4K { GgmlDType::Q4K } else { GgmlDType::Q6K };
        let t = QTensor::quantize(&Tensor::from_vec(w, (out, inp), &Device::Cpu)?, dtype)?;
        QuantLinear::from_k_quant(format, &t.data()?, (out, inp), dev)
    }

    /// The dequantized weight, f32 row-major in natural column order, as ggml computes it.
    pub(super) fn dequantize_k(&self) -> anyhow::Result<Vec<f32>> {
        let q: Vec<u8> = self.q.flatten_all()?.to_vec1()?;
        let sup: Vec<f32> = self.scale.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let (k, format) = (self.inp, self.scheme.weight);
        let (rb, spr) = (row_bytes(format, k), sup_per_row(format, k));
        let mut w = Vec::with_capacity(self.out * k);
        for (row, sup) in q.chunks_exact(rb).zip(sup.chunks_exact(spr)) {
            for c in 0..k {
                w.push(if format == WeightFormat::Q4K {
                    let (at, shift) = q4k_code_at(c);
                    let code = (row[at] >> shift) & 0xf;
                    let (sc, m) = (row[k / 2 + 2 * (c / 32)], row[k / 2 + 2 * (c / 32) + 1]);
                    let d1 = sup[2 * (c / SUPER)] * f32::from(sc);
                    let m1 = sup[2 * (c / SUPER) + 1] * f32::from(m);
                    d1 * f32::from(code) - m1
                } else {
                    let ((lo, ls), (hi, hs)) = q6k_code_at(c, k);
                    let code = ((row[lo] >> ls) & 0xf) | ((row[hi] >> hs) & 3) << 4;
                    let sc = row[3 * k / 4 + c / 16] as i8;
                    sup[c / SUPER] * f32::from(sc) * f32::from(i16::from(code) - 32)
                });
            }
        }
        Ok(w)
    }
}

/// f16 values of `scale` per row: Q4_K's (d, dmin) pairs, Q6_K's d.
fn sup_per_row(format: WeightFormat, k: usize) -> usize {
    match format {
        WeightFormat::Q4K => 2 * k / SUPER,
        _ => k / SUPER,
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};

    use super::*;

    #[test]
    fn every_code_has_its_own_bits() {
        let k = 512;
        let mut q4 = vec![0u32; 9 * k / 16];
        let mut q6 = vec![0u32; 13 * k / 16];
        for c in 0..k {
            let (at, shift) = q4k_code_at(c);
            assert!(at < k / 2, "Q4_K codes before the scales");
            q4[at] += 0xf << shift;
            let ((lo, ls), (hi, hs)) = q6k_code_at(c, k);
            assert!(lo < k / 2 && (k / 2..3 * k / 4).contains(&hi), "Q6_K planes in place");
            q6[lo] += 0xf << ls;
            q6[hi] += 3 << hs;
        }
        assert!(q4[..k / 2].iter().all(|&b| b == 0xff), "each Q4_K nibble once");
        assert!(q6[..3 * k / 4].iter().all(|&b| b == 0xff), "each Q6_K bit once");
    }

    /// The repacked weight is ggml's own dequantization of the file's bytes, for both formats,
    /// and a short tensor is refused.
    #[test]
    fn k_quant_bytes_load_to_ggmls_weight() {
        let dev = Device::Cpu;
        let (out, inp) = (6, 768);
        let w = Tensor::randn(0f32, 0.02, (out, inp), &dev).expect("w");
        for (format, dtype) in
            [(WeightFormat::Q4K, GgmlDType::Q4K), (WeightFormat::Q6K, GgmlDType::Q6K)]
        {
            let qt = QTensor::quantize(&w, dtype).expect("quantize");
            let want: Vec<f32> =
                qt.dequantize(&dev).expect("deq").flatten_all().expect("f").to_vec1().expect("v");
            let bytes = qt.data().expect("bytes").to_vec();
            let l = QuantLinear::from_k_quant(format, &bytes, (out, inp), &dev).expect("load");
            let got = l.dequantize_k().expect("deq");
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!((g - e).abs() <= 1e-6 * scale, "{format:?} weight {i}: {g} vs ggml {e}");
            }
            assert!(QuantLinear::from_k_quant(format, &bytes[1..], (out, inp), &dev).is_err());
        }
    }
}
