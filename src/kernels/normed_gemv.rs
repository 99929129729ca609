//! The RMSNorm in front of a product, folded into the product's GEMV for decode steps.
//!
//! Each Llama layer runs [`add_rms_norm`] (the residual add, the norm and the bf16 cast in one
//! launch) and then a product of its output, twice: before q/k/v and before gate/up; gpt-oss
//! before q/k/v. At batch 1 the norm is one block whose time is all latency, plus the launch
//! boundary it puts between two GEMVs. Here the GEMV's blocks compute the norm themselves as a
//! prologue (gemv_bf16.cu's NORM variants), each with the norm kernel's own sums in its own
//! order (rms_norm.cuh), so the results are the two launches' bit for bit; the one block that
//! would have written the new residual stream writes it. Shapes the GEMV does not take (prefill,
//! the CPU, rows too wide for its shared memory) get `None` and run the two ops.

use candle_core::{DType, Result, Tensor};

use super::layer_norm_act::add_rms_norm;

/// The two results of a normed product.
#[derive(Debug)]
pub struct NormedProduct {
    /// The residual stream after the add (`x` itself without a delta), f32 `[m, k]`.
    pub x: Tensor,
    /// The product: f32 `[m, n]`, or Llama's SwiGLU of it, bf16 `[m, n / 2]`.
    pub y: Tensor,
}

/// What follows the norm: [`super::matmul_f32_out`] or [`super::matmul_swiglu_bf16`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Product {
    F32,
    SwiGlu,
}

/// The inputs of [`add_rms_norm`] for a bf16 norm: the f32 residual stream `x` `[m, k]`, the
/// product added to it first (`delta` `[m, k]`, with its `bias` `[k]`), the norm's f32 weight
/// `[k]` and `eps`.
#[derive(Clone, Copy)]
pub struct NormInput<'a> {
    pub x: &'a Tensor,
    pub delta: Option<&'a Tensor>,
    pub bias: Option<&'a Tensor>,
    pub weight: &'a Tensor,
    pub eps: f64,
}

impl NormInput<'_> {
    /// The norm as its own launch, to `dtype` (in bf16, the path the fused one equals).
    pub fn run_to(&self, dtype: DType) -> Result<super::Normed> {
        add_rms_norm(self.x, self.delta, self.bias, self.weight, self.eps, dtype, false)
    }
}

/// `norm` then its bf16 output times bf16 `w` `[n, k]` (`product`) in one launch, or `None`
/// where that launch does not apply (the caller runs [`NormInput::run_to`] and the product).
pub fn normed_product(
    norm: NormInput,
    w: &Tensor,
    product: Product,
) -> Result<Option<NormedProduct>> {
    #[cfg(feature = "cuda")]
    if gpu::applies(&norm, w, product) {
        return gpu::launch(&norm, w, product, None).map(Some);
    }
    let _ = (norm, w, product);
    Ok(None)
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::CudaStorageSlice;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Device, Result, Storage, Tensor, bail};
    use half::bf16;

    use super::{NormInput, NormedProduct, Product};
    use crate::kernels::cuda::cuda_view;
    use crate::kernels::f32_out_matmul::{gemv, gemv_off, gemv_wins};

    /// `INFERNO_FUSE_NORM=0` keeps the norm's own launch (A/B timings).
    fn off() -> bool {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OFF.get_or_init(|| std::env::var("INFERNO_FUSE_NORM").is_ok_and(|v| v == "0"))
    }

    /// Whether the NORM GEMV takes this: f32 norm inputs and a bf16 weight on a GPU, contiguous
    /// and 16-byte aligned (the norm kernel's fast path, whose sums the prologue repeats), up to
    /// 8 rows that fit the kernel's shared memory, K a multiple of 8.
    pub(super) fn applies(norm: &NormInput, w: &Tensor, product: Product) -> bool {
        let (Ok((m, k)), Ok((n, kw))) = (norm.x.dims2(), w.dims2()) else { return false };
        let f32_at = |t: &Tensor, dims: &[usize]| {
            t.dtype() == DType::F32
                && t.dims() == dims
                && t.is_contiguous()
                && t.layout().start_offset().is_multiple_of(4)
        };
        norm.x.device().is_cuda()
            && !off()
            && !gemv_off()
            && f32_at(norm.x, &[m, k])
            && norm.delta.is_none_or(|d| f32_at(d, &[m, k]))
            && norm.bias.is_none_or(|b| norm.delta.is_some() && f32_at(b, &[k]))
            && f32_at(norm.weight, &[k])
            && w.dtype() == DType::BF16
            && w.is_contiguous()
            && w.layout().start_offset().is_multiple_of(8)
            && k == kw
            && k.is_multiple_of(8)
            && k <= 16_384
            && (1..=8).contains(&m)
            && m * k <= gemv::NORM_MAX_VALUES
            && gemv_wins(m, n)
            && (product == Product::F32
                || (n.is_multiple_of(2) && !crate::kernels::swiglu_gemv::two_launches()))
    }

    fn wrap<T: candle_core::cuda_backend::CudaDType>(
        slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        dev: &candle_core::CudaDevice,
        shape: (usize, usize),
    ) -> Tensor {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
        Tensor::from_storage(storage, shape, BackpropOp::none(), false)
    }

    /// The launch ([`applies`] holds); `batch` forces the GEMV's U (tests).
    pub(super) fn launch(
        norm: &NormInput,
        w: &Tensor,
        product: Product,
        batch: Option<usize>,
    ) -> Result<NormedProduct> {
        let ((m, k), (n, _)) = (norm.x.dims2()?, w.dims2()?);
        let Device::Cuda(dev) = norm.x.device() else { bail!("normed product: not on the GPU") };
        let (xs, xl) = norm.x.storage_and_layout();
        let ds = norm.delta.map(Tensor::storage_and_layout);
        let bs = norm.bias.map(Tensor::storage_and_layout);
        let (ns, nl) = norm.weight.storage_and_layout();
        let (ws, wl) = w.storage_and_layout();
        let xv = cuda_view::<f32>(&xs, xl, "normed product x")?;
        let dv = ds.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "normed product delta"));
        let dv = dv.transpose()?;
        let bv = bs.as_ref().map(|(s, l)| cuda_view::<f32>(s, l, "normed product bias"));
        let bv = bv.transpose()?;
        let nv = cuda_view::<f32>(&ns, nl, "normed product norm weight")?;
        let wv = cuda_view::<bf16>(&ws, wl, "normed product weight")?;
        // SAFETY (both): block 0 writes all of x_out, and the product all of its output.
        let mut x_out = dv.as_ref().map(|_| unsafe { dev.alloc::<f32>(m * k) }).transpose()?;
        let normed = gemv::Norm {
            x: &xv,
            delta: dv.as_ref(),
            bias: bv.as_ref(),
            w: &nv,
            x_out: x_out.as_mut(),
            eps: norm.eps as f32,
        };
        let y = match product {
            Product::F32 => {
                let mut y = unsafe { dev.alloc::<f32>(m * n)? };
                let epi = gemv::Epilogue::F32;
                gemv::launch_normed(dev, normed, &wv, (&mut y, epi), (m, n, k), batch)?;
                Tensor::from_storage(
                    Storage::Cuda(CudaStorage { slice: CudaStorageSlice::F32(y), device: dev.clone() }),
                    (m, n),
                    BackpropOp::none(),
                    false,
                )
            }
            Product::SwiGlu => {
                let mut y = unsafe { dev.alloc::<bf16>(m * n / 2)? };
                let epi = gemv::Epilogue::SwiGlu;
                gemv::launch_normed(dev, normed, &wv, (&mut y, epi), (m, n, k), batch)?;
                wrap(y, dev, (m, n / 2))
            }
        };
        let x = match x_out {
            Some(s) => wrap(s, dev, (m, k)),
            None => norm.x.clone(),
        };
        Ok(NormedProduct { x, y })
    }

    #[cfg(test)]
    mod tests {
        use candle_core::{DType, Tensor};
        use rand::Rng;

        use super::*;
        use crate::kernels::testing::{rng, tensor, uniform};
        use crate::kernels::{matmul_f32_out, matmul_swiglu_bf16};

        fn bits(t: &Tensor) -> Vec<u32> {
            let t = t.flatten_all().expect("flat");
            match t.dtype() {
                DType::BF16 => t
                    .to_vec1::<bf16>()
                    .expect("bf16")
                    .iter()
                    .map(|v| u32::from(v.to_bits()))
                    .collect(),
                _ => t.to_vec1::<f32>().expect("f32").iter().map(|v| v.to_bits()).collect(),
            }
        }

        /// The one launch against the norm's launch and the product's, bit for bit (the new
        /// residual stream and the product), every U, with and without a delta and a bias, on
        /// widths that are not multiples of the tiles, Llama-1B's and gpt-oss's shapes.
        #[test]
        #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
        fn gpu_normed_product_equals_the_norm_and_the_product() {
            let dev = crate::kernels::testing::gpu();
            let mut r = rng("normed gemv");
            let mut shapes = vec![(1, 3072, 2048), (1, 2 * 8192, 2048), (1, 5120, 2880)];
            shapes.extend([(8, 72, 2048), (3, 40, 8), (5, 2 * 37, 4000), (1, 16, 16_384)]);
            for _ in 0..8 {
                shapes.push((
                    r.random_range(1..=8),
                    2 * r.random_range(1..=700),
                    8 * r.random_range(1..=2000),
                ));
            }
            for (i, (m, n, k)) in shapes.into_iter().enumerate() {
                if m * k > gemv::NORM_MAX_VALUES {
                    continue;
                }
                let f32s = |r: &mut rand::rngs::StdRng, len, shape: &[usize], s: f32| {
                    tensor(uniform(r, len, -s, s), shape, DType::F32).to_device(&dev).expect("f32")
                };
                let x = f32s(&mut r, m * k, &[m, k], 3.0);
                let delta = f32s(&mut r, m * k, &[m, k], 1.0);
                let bias = f32s(&mut r, k, &[k], 0.5);
                let weight = f32s(&mut r, k, &[k], 1.5);
                let w = tensor(uniform(&mut r, n * k, -0.1, 0.1), &[n, k], DType::BF16)
                    .to_device(&dev)
                    .expect("w");
                let (delta, bias) = match i % 3 {
                    0 => (Some(&delta), Some(&bias)),
                    1 => (Some(&delta), None),
                    _ => (None, None),
                };
                let norm = NormInput { x: &x, delta, bias, weight: &weight, eps: 1e-5 };
                for product in [Product::F32, Product::SwiGlu] {
                    let name = format!("{m}x{n}x{k} {product:?}, delta {}", delta.is_some());
                    assert!(applies(&norm, &w, product), "{name}: should apply");
                    let two = norm.run_to(DType::BF16).expect("norm");
                    let want = match product {
                        Product::F32 => matmul_f32_out(&two.h, &w),
                        Product::SwiGlu => matmul_swiglu_bf16(&two.h, &w),
                    }
                    .expect("product");
                    for batch in [None, Some(2), Some(4), Some(8)] {
                        let one = launch(&norm, &w, product, batch).expect("normed");
                        assert!(bits(&one.x) == bits(&two.x), "{name} U {batch:?}: residual");
                        assert_eq!(one.y.dims(), want.dims(), "{name}");
                        assert!(bits(&one.y) == bits(&want), "{name} U {batch:?}: product");
                    }
                }
            }
        }
    }
}
