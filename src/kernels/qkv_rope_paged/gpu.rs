//! The launch of `qkv_rope_paged.cu`: an op on qkv that writes the pools through their
//! addresses.

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, LaunchConfig};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor, bail,
};
use half::bf16;

use super::{Args, QkvHeads, RotaryPairs};
use crate::kernels::cuda::{KernelFloat, fatbin, int};
use crate::kernels::launch::Launch;

/// The device address of a tensor's first element.
fn address(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("qkv_rope_paged: expected CUDA tensors") };
    let base = match &s.slice {
        CudaStorageSlice::F32(x) => x.device_ptr(stream).0,
        CudaStorageSlice::BF16(x) => x.device_ptr(stream).0,
        CudaStorageSlice::U32(x) => x.device_ptr(stream).0,
        CudaStorageSlice::U8(x) => x.device_ptr(stream).0,
        CudaStorageSlice::F8E4M3(x) => x.device_ptr(stream).0,
        _ => bail!("qkv_rope_paged: unexpected dtype {:?}", t.dtype()),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}

/// The op on qkv; the other inputs and the pools it writes travel inside.
struct QkvRopePaged {
    /// cos, sin, positions, slots (contiguous), k pool, v pool.
    tensors: [Tensor; 6],
    bias: Option<Tensor>,
    /// q's and k's norm weights (f32, contiguous) and eps.
    norm: Option<(Tensor, Tensor, f32)>,
    /// FP8 pools' key and value scales.
    scales: Option<[Tensor; 2]>,
    h: QkvHeads,
    pairs: RotaryPairs,
    release_first: bool,
}

pub(super) fn launch(a: Args) -> Result<Tensor> {
    let Args {
        qkv,
        bias,
        norm,
        cos,
        sin,
        positions,
        slots,
        h,
        pairs,
        k_pool,
        v_pool,
        scales,
        release_first,
    } = a;
    let tensors = [
        cos.contiguous()?,
        sin.contiguous()?,
        positions.contiguous()?,
        slots.contiguous()?,
        k_pool.clone(),
        v_pool.clone(),
    ];
    let bias = bias.map(Tensor::contiguous).transpose()?;
    let scales = scales.map(|(k, v)| [k.clone(), v.clone()]);
    qkv.contiguous()?.apply_op1_no_bwd(&QkvRopePaged {
        tensors,
        bias,
        norm,
        scales,
        h,
        pairs,
        release_first,
    })
}

impl CustomOp1 for QkvRopePaged {
    fn name(&self) -> &'static str {
        "qkv_rope_paged"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("qkv_rope_paged: the CPU runs the reference loops instead")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let slice = match self.tensors[4].dtype() {
            DType::F32 => self.launch::<f32>(s, l)?,
            DType::BF16 | DType::F8E4M3 | DType::U8 => self.launch::<bf16>(s, l)?,
            other => bail!("qkv_rope_paged: unsupported dtype {other:?}"),
        };
        let (tokens, h) = (l.shape().dims2()?.0, self.h);
        Ok((
            CudaStorage { slice, device: s.device.clone() },
            Shape::from((tokens, h.heads, h.head_dim)),
        ))
    }
}

impl QkvRopePaged {
    /// The kernel for pools of `T`, or FP8 pools with q in bf16 (`T`): q `[T, heads, d]` in `T`.
    fn launch<T: KernelFloat>(&self, s: &CudaStorage, l: &Layout) -> Result<CudaStorageSlice> {
        let dev = &s.device;
        let stream = dev.cuda_stream();
        let h = self.h;
        let tokens = l.shape().dims2()?.0;
        let n = tokens * h.heads * h.head_dim;
        let addrs =
            self.tensors.iter().map(|t| address(t, &stream)).collect::<Result<Vec<u64>>>()?;
        let bias = self.bias.as_ref().map_or(Ok(0), |b| address(b, &stream))?;
        let (q_norm, k_norm, eps) = match &self.norm {
            Some((q, k, eps)) => (address(q, &stream)?, address(k, &stream)?, *eps),
            None => (0, 0, 0.0),
        };
        let (heads, kv_heads, d) =
            (int(h.heads, "heads")?, int(h.kv_heads, "kv_heads")?, int(h.head_dim, "head_dim")?);
        let n_positions = int(self.tensors[0].dim(0)?, "RoPE table rows")?;
        let num_slots = self.tensors[4].dim(0)? as i64;
        // Heads per block: about 256 threads (the kernel's header says why).
        let per_block = (256 / (h.head_dim / 2)).clamp(1, h.heads + 2 * h.kv_heads);
        let cfg = LaunchConfig {
            grid_dim: (
                int(tokens, "tokens")? as u32,
                int((h.heads + 2 * h.kv_heads).div_ceil(per_block), "heads")? as u32,
                1,
            ),
            block_dim: ((h.head_dim / 2) as u32, per_block as u32, 1),
            shared_mem_bytes: 0,
        };
        let pairs = match self.pairs {
            RotaryPairs::HalfSplit => "half",
            RotaryPairs::Interleaved => "interleaved",
        };
        let qkv = s.as_cuda_slice::<f32>()?.slice(l.start_offset()..);
        // SAFETY: the kernel writes all T × heads × d elements of q.
        let mut q = unsafe { dev.alloc::<T>(n)? };
        let scales = match &self.scales {
            Some(sc) => Some([address(&sc[0], &stream)?, address(&sc[1], &stream)?]),
            None => None,
        };
        let kind = match crate::kernels::kv_fp8::Codes::of(self.tensors[4].dtype()) {
            Some(crate::kernels::kv_fp8::Codes::E4m3) => "fp8",
            Some(crate::kernels::kv_fp8::Codes::Int8) => "int8",
            None => T::NAME,
        };
        let name = format!("qkv_rope_paged_{pairs}_{kind}");
        let func = fatbin::qkv_rope_paged::QKV_ROPE_PAGED.func(dev, &name)?;
        let mut b = Launch::new(&stream, &func);
        b.ptr(&qkv).val(bias).val(q_norm).val(k_norm).val(eps);
        b.val(addrs[0]).val(addrs[1]).val(addrs[2]);
        b.val(addrs[3]).ptr_mut(&mut q).val(addrs[4]).val(addrs[5]);
        if let Some([ks, vs]) = scales {
            b.val(ks).val(vs);
        }
        b.val(heads).val(kv_heads).val(d).val(n_positions).val(num_slots);
        b.val(i32::from(self.release_first));
        // SAFETY: the arguments match the kernel's signature; shapes were checked by
        // qkv_rope_paged and the kernel guards positions and slots. It also writes the pools
        // through their addresses: candle does not see those writes, which is fine on the one
        // stream all work runs on. The kernel waits (PDL) before it reads or writes anything.
        unsafe { b.launch(cfg) }?;
        drop(b);
        Ok(T::wrap(q))
    }
}
