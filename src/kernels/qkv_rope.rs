//! A decode step's attention inputs at a position held on the device ([`qkv_rope_store`]): bias,
//! head split, RoPE on q and k, k and v into the caches. On CUDA one kernel (`qkv_rope.cu`)
//! instead of eight launches; elsewhere the same steps as candle ops in f32, which are the
//! reference. Everything is computed in f32 and rounded once into the cache dtype: candle's
//! RoPE in bf16 rounds each product and the difference (three roundings, and the difference of
//! two near-equal products loses most of its bits): with it, the tiny test model's bf16 logits
//! were 0.134 off its f32 ones at worst; with one rounding, 0.019.

use candle_core::{D, DType, Result, Tensor, bail};

use super::{KvLayout, kv_write_at};

/// The shapes of one call.
#[derive(Debug, Clone, Copy)]
pub struct QkvHeads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// One call's inputs, checked by [`qkv_rope_store`].
#[derive(Clone, Copy)]
struct Args<'a> {
    qkv: &'a Tensor,
    bias: &'a Tensor,
    cos: &'a Tensor,
    sin: &'a Tensor,
    pos: &'a Tensor,
    h: QkvHeads,
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
    layout: KvLayout,
}

/// For one token: `qkv` `[1, (heads + 2·kv_heads)·d]` (the fused projection without its bias),
/// `bias` `[(heads + 2·kv_heads)·d]`, `cos`/`sin` the model's RoPE tables `[positions, d/2]`,
/// all f32, and `pos` i64 `[1]` on the device. Adds the bias, splits q, k, v, rotates q and k
/// (half-split pairs) by the row `pos` of the tables, writes k and v into `k_cache`/`v_cache`
/// (`[kv_heads, capacity, d]`, contiguous, f32 or bf16) at `pos` (see [`kv_write_at`]) and
/// returns q `[heads, 1, d]` in the caches' dtype.
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_store(
    qkv: &Tensor,
    bias: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    pos: &Tensor,
    h: QkvHeads,
    (k_cache, v_cache): (&Tensor, &Tensor),
    layout: KvLayout,
) -> Result<Tensor> {
    let width = (h.heads + 2 * h.kv_heads) * h.head_dim;
    if qkv.dims() != [1, width]
        || bias.dims() != [width]
        || !h.head_dim.is_multiple_of(2)
        || h.head_dim > 2048
    {
        bail!(
            "qkv_rope_store: qkv {:?} and bias {:?} must be [1, {width}] and [{width}] (even head_dim)",
            qkv.dims(),
            bias.dims()
        );
    }
    if cos.dim(D::Minus1)? != h.head_dim / 2 || sin.dims() != cos.dims() {
        bail!(
            "qkv_rope_store: cos {:?} / sin {:?} must be [positions, {}]",
            cos.dims(),
            sin.dims(),
            h.head_dim / 2
        );
    }
    let dtype = k_cache.dtype();
    if [qkv, bias, cos, sin].iter().any(|t| t.dtype() != DType::F32)
        || v_cache.dtype() != dtype
        || !matches!(dtype, DType::F32 | DType::BF16)
    {
        bail!(
            "qkv_rope_store: qkv, bias, cos and sin must be f32, the caches both f32 or both bf16"
        );
    }
    if k_cache.dims() != v_cache.dims()
        || k_cache.dim(0)? != h.kv_heads
        || k_cache.dim(2)? != h.head_dim
    {
        bail!(
            "qkv_rope_store: caches {:?} must be [{}, capacity, {}]",
            k_cache.dims(),
            h.kv_heads,
            h.head_dim
        );
    }
    let args = Args { qkv, bias, cos, sin, pos, h, k_cache, v_cache, layout };
    match qkv.device() {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(_) => gpu::launch(args),
        _ => reference(args),
    }
}

/// The steps as candle ops in f32, rounded once into the caches' dtype.
fn reference(a: Args) -> Result<Tensor> {
    let Args { qkv, bias, cos, sin, pos, h, k_cache, v_cache, layout } = a;
    let (d, dtype) = (h.head_dim, k_cache.dtype());
    let qkv = qkv.broadcast_add(bias)?.reshape((h.heads + 2 * h.kv_heads, 1, d))?;
    let (cos, sin) = (cos.index_select(pos, 0)?, sin.index_select(pos, 0)?);
    let rope = |t: Tensor| {
        candle_nn::rotary_emb::rope(&t.contiguous()?.unsqueeze(0)?, &cos, &sin)?
            .squeeze(0)?
            .to_dtype(dtype)
    };
    let q = rope(qkv.narrow(0, 0, h.heads)?)?;
    let k = rope(qkv.narrow(0, h.heads, h.kv_heads)?)?;
    let v = qkv.narrow(0, h.heads + h.kv_heads, h.kv_heads)?.to_dtype(dtype)?;
    kv_write_at(k_cache, &k, pos, layout)?;
    kv_write_at(v_cache, &v, pos, layout)?;
    Ok(q)
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
    use candle_core::{
        CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor, bail,
    };

    use super::{Args, QkvHeads};
    use crate::kernels::KvLayout;
    use crate::kernels::cuda::{QKV_ROPE_PTX, int};

    /// The device address of a tensor's first element.
    fn address(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<u64> {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cuda(s) = &*storage else { bail!("qkv_rope_store: expected CUDA tensors") };
        let base = match &s.slice {
            CudaStorageSlice::F32(x) => x.device_ptr(stream).0,
            CudaStorageSlice::BF16(x) => x.device_ptr(stream).0,
            CudaStorageSlice::I64(x) => x.device_ptr(stream).0,
            _ => bail!("qkv_rope_store: unexpected dtype {:?}", t.dtype()),
        };
        Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
    }

    /// The op on qkv; the other inputs and the caches it writes travel inside.
    struct QkvRope {
        tensors: [Tensor; 6], // bias, cos, sin, pos, k cache, v cache (contiguous)
        h: QkvHeads,
        layout: KvLayout,
    }

    pub(super) fn launch(a: Args) -> Result<Tensor> {
        let Args { qkv, bias, cos, sin, pos, h, k_cache, v_cache, layout } = a;
        if !k_cache.is_contiguous()
            || !v_cache.is_contiguous()
            || pos.dtype() != DType::I64
            || pos.dims() != [1]
        {
            bail!("qkv_rope_store: contiguous caches and an i64 [1] position");
        }
        let tensors = [
            bias.contiguous()?,
            cos.contiguous()?,
            sin.contiguous()?,
            pos.contiguous()?,
            k_cache.clone(),
            v_cache.clone(),
        ];
        qkv.contiguous()?.apply_op1_no_bwd(&QkvRope { tensors, h, layout })
    }

    impl CustomOp1 for QkvRope {
        fn name(&self) -> &'static str {
            "qkv_rope_store"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            bail!("qkv_rope_store: the CPU runs the reference ops instead")
        }

        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = s.device.clone();
            let stream = dev.cuda_stream();
            let h = self.h;
            let n = h.heads * h.head_dim;
            let addrs =
                self.tensors.iter().map(|t| address(t, &stream)).collect::<Result<Vec<u64>>>()?;
            let (heads, kv_heads, d) = (
                int(h.heads, "heads")?,
                int(h.kv_heads, "kv_heads")?,
                int(h.head_dim, "head_dim")?,
            );
            let (capacity, ring) = (
                int(self.tensors[4].dim(1)?, "capacity")?,
                i32::from(self.layout == KvLayout::Ring),
            );
            let cfg = LaunchConfig {
                grid_dim: ((h.heads + 2 * h.kv_heads) as u32, 1, 1),
                block_dim: ((h.head_dim / 2) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            macro_rules! run {
                ($t:ty, $name:literal, $wrap:ident) => {{
                    let qkv = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
                    // SAFETY: the kernel writes all heads × d elements of q.
                    let mut q = unsafe { dev.alloc::<$t>(n)? };
                    let func =
                        dev.get_or_load_custom_func($name, "inferno_qkv_rope", QKV_ROPE_PTX)?;
                    let mut b = func.builder();
                    b.arg(&qkv)
                        .arg(&addrs[0])
                        .arg(&addrs[1])
                        .arg(&addrs[2])
                        .arg(&addrs[3])
                        .arg(&mut q)
                        .arg(&addrs[4])
                        .arg(&addrs[5]);
                    b.arg(&heads).arg(&kv_heads).arg(&d).arg(&capacity).arg(&ring);
                    // SAFETY: the arguments match the kernel's signature; shapes were checked by
                    // qkv_rope_store. The kernel also writes the caches through their addresses:
                    // candle does not see those writes, which is fine on the one stream all
                    // work runs on.
                    unsafe { b.launch(cfg) }.w()?;
                    CudaStorageSlice::$wrap(q)
                }};
            }
            let slice = match self.tensors[4].dtype() {
                DType::F32 => run!(f32, "qkv_rope_store_f32", F32),
                DType::BF16 => run!(half::bf16, "qkv_rope_store_bf16", BF16),
                other => bail!("qkv_rope_store: unsupported dtype {other:?}"),
            };
            Ok((CudaStorage { slice, device: dev }, Shape::from((h.heads, 1, h.head_dim))))
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;
    use crate::kernels::testing::{rng, tensor, uniform, values};

    struct Inputs {
        qkv: Tensor,
        bias: Tensor,
        cos: Tensor,
        sin: Tensor,
        caches: (Tensor, Tensor),
    }

    const H: QkvHeads = QkvHeads { heads: 8, kv_heads: 2, head_dim: 64 };

    fn inputs(name: &str, dtype: DType, capacity: usize) -> Inputs {
        let mut r = rng(name);
        let width = (H.heads + 2 * H.kv_heads) * H.head_dim;
        let t = |r: &mut _, n: usize, shape: &[usize], dtype| {
            tensor(uniform(r, n, -1.0, 1.0), shape, dtype)
        };
        let angles = uniform(&mut r, 50 * H.head_dim / 2, -3.0, 3.0);
        let cos =
            tensor(angles.iter().map(|a| a.cos()).collect(), &[50, H.head_dim / 2], DType::F32);
        let sin =
            tensor(angles.iter().map(|a| a.sin()).collect(), &[50, H.head_dim / 2], DType::F32);
        let (cache_len, shape) =
            (H.kv_heads * capacity * H.head_dim, [H.kv_heads, capacity, H.head_dim]);
        let caches = (t(&mut r, cache_len, &shape, dtype), t(&mut r, cache_len, &shape, dtype));
        let (qkv, bias) =
            (t(&mut r, width, &[1, width], DType::F32), t(&mut r, width, &[width], DType::F32));
        Inputs { qkv, bias, cos, sin, caches }
    }

    /// The reference against plain loops: q and k rotated by the position's angles, k and v in
    /// their slot, nothing else in the caches touched.
    #[test]
    fn reference_rotates_and_stores() {
        let inp = inputs("qkv reference", DType::F32, 5);
        let (k0, v0) = (values(&inp.caches.0), values(&inp.caches.1));
        let pos = Tensor::new(&[7i64], &Device::Cpu).unwrap();
        let q = qkv_rope_store(
            &inp.qkv,
            &inp.bias,
            &inp.cos,
            &inp.sin,
            &pos,
            H,
            (&inp.caches.0, &inp.caches.1),
            KvLayout::Ring,
        )
        .unwrap();
        let x: Vec<f32> =
            values(&inp.qkv).iter().zip(values(&inp.bias)).map(|(a, b)| a + b).collect();
        let (cos, sin) = (values(&inp.cos), values(&inp.sin));
        let (d, half) = (H.head_dim, H.head_dim / 2);
        let rotate = |head: usize| -> Vec<f32> {
            let v = &x[head * d..][..d];
            let mut out = vec![0f32; d];
            for i in 0..half {
                let (c, s) = (cos[7 * half + i], sin[7 * half + i]);
                out[i] = v[i] * c - v[i + half] * s;
                out[i + half] = v[i + half] * c + v[i] * s;
            }
            out
        };
        let q = values(&q);
        for h in 0..H.heads {
            let want = rotate(h);
            q[h * d..][..d]
                .iter()
                .zip(&want)
                .for_each(|(a, b)| assert!((a - b).abs() < 1e-5, "q head {h}"));
        }
        let (k, v) = (values(&inp.caches.0), values(&inp.caches.1));
        let slot = 7 % 5;
        for g in 0..H.kv_heads {
            for s in 0..5 {
                let at = (g * 5 + s) * d;
                let (want_k, want_v) = if s == slot {
                    (rotate(H.heads + g), x[(H.heads + H.kv_heads + g) * d..][..d].to_vec())
                } else {
                    (k0[at..][..d].to_vec(), v0[at..][..d].to_vec())
                };
                k[at..][..d]
                    .iter()
                    .zip(&want_k)
                    .for_each(|(a, b)| assert!((a - b).abs() < 1e-5, "k head {g} slot {s}"));
                assert_eq!(&v[at..][..d], want_v.as_slice(), "v head {g} slot {s}");
            }
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_reference() {
        use crate::kernels::testing::{assert_written_and_close, gpu};
        let dev = gpu();
        for (dtype, layout, pos, capacity) in [
            (DType::F32, KvLayout::Linear, 3i64, 40),
            (DType::BF16, KvLayout::Linear, 39, 40),
            (DType::F32, KvLayout::Ring, 47, 9),
            (DType::BF16, KvLayout::Ring, 2, 9),
        ] {
            let name = format!("gpu qkv_rope {dtype:?} {layout:?} pos {pos}");
            let cpu = inputs(&name, dtype, capacity);
            // Both compute in f32 and round once; they may differ where the kernel's fused
            // multiply-adds move an f32 result across a bf16 rounding boundary (one ulp).
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let gpu_caches = (on(&cpu.caches.0), on(&cpu.caches.1));
            let want_q = qkv_rope_store(
                &cpu.qkv,
                &cpu.bias,
                &cpu.cos,
                &cpu.sin,
                &Tensor::new(&[pos], &Device::Cpu).unwrap(),
                H,
                (&cpu.caches.0, &cpu.caches.1),
                layout,
            )
            .unwrap();
            let got_q = qkv_rope_store(
                &on(&cpu.qkv),
                &on(&cpu.bias),
                &on(&cpu.cos),
                &on(&cpu.sin),
                &Tensor::new(&[pos], &dev).unwrap(),
                H,
                (&gpu_caches.0, &gpu_caches.1),
                layout,
            )
            .unwrap();
            let tol = if dtype == DType::F32 { 1e-6 } else { 1e-3 };
            assert_written_and_close(&format!("{name} q"), &values(&got_q), &values(&want_q), tol);
            assert_written_and_close(
                &format!("{name} k"),
                &values(&gpu_caches.0),
                &values(&cpu.caches.0),
                tol,
            );
            assert_written_and_close(
                &format!("{name} v"),
                &values(&gpu_caches.1),
                &values(&cpu.caches.1),
                tol,
            );
        }
    }
}
