//! GGUF's Q8_0 weights as a [`QuantLinear`] ([`WeightFormat::Q8Block`]), so that a llama.cpp
//! Q8_0 file runs on the GPU through our own decode GEMV (ct_gemv.cu's `ct_gemv_q80`) and the
//! batched path's fused q/k/v and gate/up products, instead of candle's quantized matmul.
//!
//! A Q8_0 block is 34 bytes: an f16 scale d, then 32 int8 codes; the weight is d · q. At load
//! the codes are split from the scales (16-byte aligned rows for the GEMV's loads) and reordered
//! within every 64 columns so that each 16-byte chunk a GEMV lane loads holds 8 codes of the
//! group's first block and the same 8 positions of its second: each of the lane's two int8
//! `mma` steps then sums exactly one block, whose two scales apply to its integer sum.

use candle_core::{DType, Device, Tensor};
use half::f16;

use super::QuantLinear;
use super::config::{ActQuant, Scheme, WeightFormat};
use super::numerics::Q8_BLOCK;
use crate::error::{ErrorKind, fail};

/// Bytes of one Q8_0 block in a GGUF file.
const BLOCK_BYTES: usize = 2 + Q8_BLOCK;
/// Columns the reorder works within (a GEMV quad: 4 lanes × 16 bytes).
pub const GROUP: usize = 64;

/// The scheme of every Q8_0 weight: x quantized per block as llama.cpp does before its dot
/// products.
pub const SCHEME: Scheme = Scheme { weight: WeightFormat::Q8Block, act: ActQuant::Int8Block };

/// The input column whose code sits at position `s` of a stored row.
pub fn natural_column(s: usize) -> usize {
    let j = s % GROUP;
    let (lane, half, e) = (j / 16, (j % 16) / 8, j % 8);
    s - j + Q8_BLOCK * half + 8 * lane + e
}

/// Whether a `[out, inp]` Q8_0 weight can take this layout (whole groups of 64 columns).
pub fn fits(inp: usize) -> bool {
    inp > 0 && inp.is_multiple_of(GROUP)
}

impl QuantLinear {
    /// A Q8_0 tensor's bytes as they are in the GGUF file (row-major blocks), on `dev`.
    pub fn from_q8_0(
        bytes: &[u8],
        (out, inp): (usize, usize),
        dev: &Device,
    ) -> anyhow::Result<Self> {
        if !fits(inp) {
            anyhow::bail!("Q8_0 rows of {inp} columns are not whole groups of {GROUP}");
        }
        let blocks = out * inp / Q8_BLOCK;
        if bytes.len() != blocks * BLOCK_BYTES {
            return Err(fail(
                ErrorKind::Integrity,
                format!(
                    "a Q8_0 [{out}, {inp}] tensor holds {} bytes, not {}",
                    bytes.len(),
                    blocks * BLOCK_BYTES
                ),
            ));
        }
        let mut codes = vec![0u8; out * inp];
        let mut scales = Vec::with_capacity(blocks);
        let row_bytes = inp / Q8_BLOCK * BLOCK_BYTES;
        for (r, row) in bytes.chunks_exact(row_bytes).enumerate() {
            let natural: Vec<u8> =
                row.chunks_exact(BLOCK_BYTES).flat_map(|b| b[2..].iter().copied()).collect();
            for block in row.chunks_exact(BLOCK_BYTES) {
                scales.push(f16::from_le_bytes([block[0], block[1]]));
            }
            let dst = &mut codes[r * inp..(r + 1) * inp];
            for (s, c) in dst.iter_mut().enumerate() {
                *c = natural[natural_column(s)];
            }
        }
        let q = Tensor::from_vec(codes, (out, inp), dev)?;
        let scale = Tensor::from_vec(scales, (out, inp / Q8_BLOCK), dev)?;
        let mut l = QuantLinear::q8_block(q, scale, (out, inp));
        if dev.is_cpu() {
            l.dense = Some(Tensor::from_vec(l.dequantize_q8_block()?, (out, inp), dev)?);
        }
        Ok(l)
    }

    /// Codes `[out, inp]` (stored order) and f16 block scales `[out, inp / 32]`.
    pub(super) fn q8_block(q: Tensor, scale: Tensor, (out, inp): (usize, usize)) -> Self {
        let mut l = QuantLinear::eight_bit(SCHEME, (out, inp), q, scale);
        l.group = Q8_BLOCK;
        l
    }

    /// Random codes over -127..=127 and a scale per block around `std / 73`.
    pub(super) fn random_q8_block(
        (out, inp): (usize, usize),
        std: f32,
        rng: &mut rand::rngs::StdRng,
        dev: &Device,
    ) -> anyhow::Result<Self> {
        use rand::Rng;
        if !fits(inp) {
            anyhow::bail!("Q8_0 rows of {inp} columns are not whole groups of {GROUP}");
        }
        let codes: Vec<u8> = (0..out * inp).map(|_| rng.random_range(-127i8..=127) as u8).collect();
        let scales: Vec<f16> = (0..out * inp / Q8_BLOCK)
            .map(|_| f16::from_f32(std / 73.0 * rng.random_range(0.5..1.5)))
            .collect();
        let q = Tensor::from_vec(codes, (out, inp), dev)?;
        let scale = Tensor::from_vec(scales, (out, inp / Q8_BLOCK), dev)?;
        Ok(QuantLinear::q8_block(q, scale, (out, inp)))
    }

    /// The dequantized weight, f32 row-major in natural column order (the CPU reference).
    pub(super) fn dequantize_q8_block(&self) -> anyhow::Result<Vec<f32>> {
        let q: Vec<u8> = self.q.flatten_all()?.to_vec1()?;
        let scale: Vec<f32> = self.scale.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let (inp, per_row) = (self.inp, self.inp / Q8_BLOCK);
        let mut w = vec![0f32; self.out * inp];
        for (r, row) in q.chunks_exact(inp).enumerate() {
            for (s, &b) in row.iter().enumerate() {
                let c = natural_column(s);
                w[r * inp + c] = f32::from(b as i8) * scale[r * per_row + c / Q8_BLOCK];
            }
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};

    use super::*;

    #[test]
    fn the_column_order_is_a_permutation_that_keeps_blocks_in_their_group() {
        let mut seen = [false; 2 * GROUP];
        for s in 0..2 * GROUP {
            let c = natural_column(s);
            assert!(!seen[c], "column {c} twice");
            seen[c] = true;
            assert_eq!(c / GROUP, s / GROUP, "stays in its group");
            // A lane's chunk: bytes 0..8 from the group's first block, 8..16 from its second.
            assert_eq!((c % GROUP) / Q8_BLOCK, (s % 16) / 8);
        }
    }

    /// The weight read from GGUF bytes is ggml's own dequantization, value for value, and the
    /// CPU product (x quantized per block) is close to candle's Q8_0 matmul, which quantizes x
    /// per block the same way but keeps x's scale in f16.
    #[test]
    fn gguf_q8_0_bytes_load_to_ggmls_weight_and_product() {
        let dev = Device::Cpu;
        let (out, inp) = (24, 192);
        let w = Tensor::randn(0f32, 0.02, (out, inp), &dev).expect("w");
        let qt = QTensor::quantize(&w, GgmlDType::Q8_0).expect("quantize");
        let want: Vec<f32> =
            qt.dequantize(&dev).expect("deq").flatten_all().expect("f").to_vec1().expect("v");
        let bytes = qt.data().expect("bytes").to_vec();
        let l = QuantLinear::from_q8_0(&bytes, (out, inp), &dev).expect("load");
        assert_eq!(l.dequantize_q8_block().expect("deq"), want);

        let x = Tensor::randn(0f32, 1.0, (3, inp), &dev).expect("x");
        let got = l.matmul_reference(&x).expect("on the CPU").expect("ours");
        let got: Vec<f32> = got.flatten_all().expect("f").to_vec1().expect("v");
        let qm = candle_core::quantized::QMatMul::from_qtensor(qt).expect("qmatmul");
        let ggml: Vec<f32> = candle_core::Module::forward(&qm, &x)
            .expect("ggml")
            .flatten_all()
            .expect("f")
            .to_vec1()
            .expect("v");
        let scale = ggml.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, e) in got.iter().zip(&ggml) {
            assert!((g - e).abs() <= 2e-3 * scale, "{g} vs ggml {e}");
        }
        let bad = QuantLinear::from_q8_0(&bytes[1..], (out, inp), &dev);
        assert!(bad.is_err(), "a short tensor is refused");
    }
}
