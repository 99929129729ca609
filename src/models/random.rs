//! Random tensors for dummy weights, made a slice of rows at a time into the final tensor.
//!
//! Drawn whole, a bf16 weight is an f32 tensor twice its size that is freed right after the
//! conversion; between the weights that stay, those freed draws leave holes in the device's
//! memory pool (hundreds of MiB for TinyLlama's shape) that the pool cannot return to the
//! driver and that allocations of other sizes do not fill: memory the plan does not count.
//! Slices of at most [`SLICE_ELEMS`] keep the transient small and the same size every time,
//! so each slice reuses the last one's memory.

use candle_core::{DType, Device, Result, Tensor};

/// Elements drawn at once (32 MiB of f32).
const SLICE_ELEMS: usize = 8 << 20;

/// Normal values (mean 0, `std`) of `shape`, in `dtype`.
pub fn normal(shape: &[usize], std: f32, dtype: DType, device: &Device) -> Result<Tensor> {
    by_slices(shape, dtype, device, |dims| Tensor::randn(0f32, std, dims, device)?.to_dtype(dtype))
}

/// Whole numbers uniform in `[lo, hi)` of `shape`, as u8 (FP4 codes and scales).
pub fn bytes(shape: &[usize], lo: f32, hi: f32, device: &Device) -> Result<Tensor> {
    by_slices(shape, DType::U8, device, |dims| {
        Tensor::rand(lo, hi, dims, device)?.floor()?.to_dtype(DType::U8)
    })
}

/// Fills a tensor of `shape` a slice of rows (its first dimension) at a time.
fn by_slices(
    shape: &[usize],
    dtype: DType,
    device: &Device,
    draw: impl Fn(Vec<usize>) -> Result<Tensor>,
) -> Result<Tensor> {
    let Some((&rows, rest)) = shape.split_first() else { return draw(vec![]) };
    let per_row: usize = rest.iter().product::<usize>().max(1);
    let step = (SLICE_ELEMS / per_row).clamp(1, rows.max(1));
    if step >= rows {
        return draw(shape.to_vec());
    }
    let out = Tensor::zeros(shape, dtype, device)?;
    for r0 in (0..rows).step_by(step) {
        let n = step.min(rows - r0);
        let dims: Vec<usize> = std::iter::once(n).chain(rest.iter().copied()).collect();
        out.slice_set(&draw(dims)?, 0, r0)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliced_draws_fill_every_row_with_the_asked_distribution() {
        let dev = Device::Cpu;
        // 3 rows of 4M elements: slices of 2 rows, the last one short.
        let t = normal(&[3, 4 << 20], 0.5, DType::BF16, &dev).unwrap();
        assert_eq!((t.dims(), t.dtype()), (&[3, 4 << 20][..], DType::BF16));
        for r in 0..3 {
            let row = t.get(r).unwrap().to_dtype(DType::F32).unwrap();
            let std = row.sqr().unwrap().mean_all().unwrap().to_scalar::<f32>().unwrap().sqrt();
            assert!((std - 0.5).abs() < 0.01, "row {r}: std {std}");
        }
        let b = bytes(&[5, 2 << 20], 3.0, 7.0, &dev).unwrap().flatten_all().unwrap();
        let b = b.to_vec1::<u8>().unwrap();
        assert!(b.iter().all(|&x| (3..7).contains(&x)));
        assert!((3..7).all(|v| b.contains(&v)), "every value in range appears");
    }
}
