//! MXFP4 expert weights as they sit in the checkpoint (gpt-oss.md §3): `blocks` u8
//! `[experts, rows, cols/32, 16]` (two FP4 E2M1 codes per byte, low nibble first) and `scales`
//! u8 `[experts, rows, cols/32]` (E8M0: 2^(s−127) per 32 elements). They stay packed on the
//! device; [`Mxfp4Experts::dequantize`] expands one expert with plain tensor ops (two 256-entry
//! lookup tables), the reference path that runs on any device.

use candle_core::{DType, Device, Tensor};

/// FP4 E2M1 code → value.
pub const FP4_VALUES: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

pub struct Mxfp4Experts {
    pub blocks: Tensor,
    pub scales: Tensor,
    pub rows: usize,
    pub cols: usize,
    lo: Tensor,
    hi: Tensor,
    pow2: Tensor,
}

impl Mxfp4Experts {
    pub fn new(blocks: Tensor, scales: Tensor, experts: usize, rows: usize, cols: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            blocks.dims() == [experts, rows, cols / 32, 16] && blocks.dtype() == DType::U8,
            "MXFP4 blocks have shape {:?} ({:?}), expected [{experts}, {rows}, {}, 16] u8",
            blocks.dims(),
            blocks.dtype(),
            cols / 32
        );
        anyhow::ensure!(
            scales.dims() == [experts, rows, cols / 32] && scales.dtype() == DType::U8,
            "MXFP4 scales have shape {:?}, expected [{experts}, {rows}, {}] u8",
            scales.dims(),
            cols / 32
        );
        let device = blocks.device().clone();
        let lo: Vec<f32> = (0..256).map(|b| FP4_VALUES[b & 0xF]).collect();
        let hi: Vec<f32> = (0..256).map(|b| FP4_VALUES[b >> 4]).collect();
        let pow2: Vec<f32> = (0..256).map(|s: i32| 2f32.powi(s - 127)).collect();
        Ok(Mxfp4Experts {
            blocks,
            scales,
            rows,
            cols,
            lo: Tensor::from_vec(lo, 256, &device)?,
            hi: Tensor::from_vec(hi, 256, &device)?,
            pow2: Tensor::from_vec(pow2, 256, &device)?,
        })
    }

    pub fn device(&self) -> &Device {
        self.blocks.device()
    }

    /// Expert `e` as a dense `[rows, cols]` matrix in `dtype`.
    pub fn dequantize(&self, e: usize, dtype: DType) -> candle_core::Result<Tensor> {
        let (rows, groups) = (self.rows, self.cols / 32);
        let bytes = self.blocks.get(e)?.flatten_all()?.to_dtype(DType::U32)?;
        let lo = self.lo.index_select(&bytes, 0)?.reshape((rows * groups * 16, 1))?;
        let hi = self.hi.index_select(&bytes, 0)?.reshape((rows * groups * 16, 1))?;
        // Low nibble is element 2b, high nibble 2b+1.
        let values = Tensor::cat(&[lo, hi], 1)?.reshape((rows, groups, 32))?;
        let scales = self.scales.get(e)?.flatten_all()?.to_dtype(DType::U32)?;
        let scales = self.pow2.index_select(&scales, 0)?.reshape((rows, groups, 1))?;
        values.broadcast_mul(&scales)?.reshape((rows, self.cols))?.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doc_example_and_nibble_order() {
        // Byte 0x2A with scale 125 gives (-1.0, +1.0) x 0.25 = (-0.25, +0.25): low nibble first.
        let dev = Device::Cpu;
        let mut block = vec![0u8; 16];
        block[0] = 0x2A;
        block[15] = 0x7F; // low F = -6, high 7 = +6
        let blocks = Tensor::from_vec(block, (1, 1, 1, 16), &dev).unwrap();
        let scales = Tensor::from_vec(vec![125u8], (1, 1, 1), &dev).unwrap();
        let w = Mxfp4Experts::new(blocks, scales, 1, 1, 32).unwrap().dequantize(0, DType::F32).unwrap();
        let v: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!((v[0], v[1]), (-0.25, 0.25));
        assert_eq!((v[30], v[31]), (-1.5, 1.5));
        assert!(v[2..30].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn shapes_are_checked() {
        let dev = Device::Cpu;
        let blocks = Tensor::zeros((2, 4, 2, 16), DType::U8, &dev).unwrap();
        let scales = Tensor::zeros((2, 4, 2), DType::U8, &dev).unwrap();
        assert!(Mxfp4Experts::new(blocks.clone(), scales.clone(), 2, 4, 64).is_ok());
        assert!(Mxfp4Experts::new(blocks, scales, 2, 4, 32).is_err());
    }
}
