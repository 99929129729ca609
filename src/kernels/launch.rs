//! Kernel launches with Programmatic Dependent Launch (PDL, Hopper and later).
//!
//! A decode step is a chain of ~150 short kernels, and between two of them the GPU drains the
//! first grid, then ramps the next one up: at batch 1 that gap costs about as much as a small
//! GEMV's work. With PDL the next kernel's blocks start while the previous grid finishes: each of
//! our kernels first does what needs nothing from its predecessors (a GEMV issues its weight
//! loads), then waits (`pdl_wait()` in common.cuh: `griddepcontrol.wait`, which returns once the
//! previous grid has completed and its writes are visible), and releases its own dependents
//! (`pdl_launch_dependents()`). A kernel launched here must therefore call `pdl_wait()` before it
//! reads anything an earlier kernel wrote and before it writes any global memory (a buffer it
//! writes may have been freed by an earlier kernel that still reads it); weights and other
//! read-only inputs may be read before.
//!
//! When a kernel releases does not change what its dependents see (their `pdl_wait()` returns
//! only once this grid has completed), only when they start, and so how far back their pre-wait
//! reads may reach. The MoE's down kernels read the routing before their wait, which is safe
//! because gate_up releases only after its own. gpt-oss's router and top-k release first, so the
//! next weight stream's blocks are resident and loading sooner; RoPE and attention do where the
//! model asks (`PagedAttnConfig::release_first`, `pdl_wait_release` in common.cuh): gpt-oss gains
//! 1.6–2.6% at `--tp 2` with them, Llama-3.2-1B would lose 2.9%. The norms, shared by every
//! model, wait first: released first they gained gpt-oss 0.5% on one GPU and cost Llama-3.2-1B
//! as much (docs/performance.md).
//!
//! In a captured decode step the overlap needs kernel-to-kernel edges: stream capture turns a PDL
//! launch into a programmatic edge only when the node before it is a kernel, so the step's
//! allocations come from an arena (`src/gpu/arena.rs`) and its graph holds kernels only.
//!
//! Every kernel of `src/kernels` is launched through this builder, so every kernel follows that
//! rule; one with nothing to do before its inputs are ready calls `pdl_wait()` first thing.
//! cudarc's `LaunchArgs` cannot set launch attributes, hence this small builder over
//! `cuLaunchKernelEx`. On devices before compute capability 9.0, or with `INFERNO_PDL=0` (for
//! A/B timings), it launches the ordinary way: the kernels' `griddepcontrol` instructions are
//! compiled out below sm_90 and return at once in a launch without the attribute.

use std::ffi::c_void;
use std::sync::OnceLock;

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::sys::{self, CUdevice_attribute};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, SyncOnDrop,
};
use candle_core::{Result, bail};

/// A kernel's parameters, each in its own run of 8-byte slots (8-byte alignment suffices for
/// every parameter our kernels take: device pointers, scalars, structs of them), and the launch.
pub(super) struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    slots: Vec<u64>,
    /// The first slot of each parameter.
    starts: Vec<usize>,
    /// Keeps cudarc's read/write tracking of the buffers alive until the launch is enqueued.
    _guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Launch<'a> {
    pub fn new(stream: &'a CudaStream, func: &'a CudaFunction) -> Self {
        Launch {
            stream,
            func,
            slots: Vec::with_capacity(24),
            starts: Vec::with_capacity(16),
            _guards: Vec::new(),
        }
    }

    /// A buffer the kernel reads.
    pub fn ptr<T, P: DevicePtr<T>>(&mut self, p: &'a P) -> &mut Self {
        let (ptr, guard) = p.device_ptr(self.stream);
        self._guards.push(guard);
        self.val(ptr)
    }

    /// A buffer the kernel writes.
    pub fn ptr_mut<T, P: DevicePtrMut<T>>(&mut self, p: &'a mut P) -> &mut Self {
        let (ptr, guard) = p.device_ptr_mut(self.stream);
        self._guards.push(guard);
        self.val(ptr)
    }

    /// A null pointer, for an optional buffer the kernel does without.
    pub fn null(&mut self) -> &mut Self {
        self.val(0u64)
    }

    /// A parameter passed by value: a scalar (`int`, `float`, a 64-bit value) or a plain struct.
    pub fn val<T: DeviceRepr + Copy>(&mut self, v: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        const { assert!(std::mem::align_of::<T>() <= 8) };
        let start = self.slots.len();
        self.slots.resize(start + size.div_ceil(8).max(1), 0);
        // SAFETY: the slots from `start` hold at least `size` bytes, 8-byte aligned (T needs no
        // more, checked above), and T is plain data (DeviceRepr); the kernel reads its
        // parameter's size from there.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &v as *const T as *const u8,
                self.slots.as_mut_ptr().add(start) as *mut u8,
                size,
            )
        };
        self.starts.push(start);
        self
    }

    /// Enqueues the kernel, as a programmatic dependent of the stream's previous kernel where the
    /// device supports it.
    ///
    /// # Safety
    /// The parameters must match the kernel's signature, the buffers must hold what the kernel
    /// reads and writes, and the kernel must follow the module's rule on `pdl_wait()`.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        self.stream.context().bind_to_thread().w()?;
        let base = self.slots.as_mut_ptr();
        // SAFETY: every start indexes into `slots`, which is not resized from here on.
        let mut params: Vec<*mut c_void> =
            self.starts.iter().map(|&i| unsafe { base.add(i) } as *mut c_void).collect();
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            // SAFETY: an all-zero union is a valid value of every member.
            value: unsafe { std::mem::zeroed() },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let pdl = enabled(self.stream);
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if pdl { &mut attr } else { std::ptr::null_mut() },
            numAttrs: u32::from(pdl),
        };
        // SAFETY: config, attr and params outlive the call; the caller vouches for the rest.
        let status = unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if status != sys::CUresult::CUDA_SUCCESS {
            bail!("kernel launch failed: {status:?}");
        }
        Ok(())
    }
}

/// Whether launches get the PDL attribute: compute capability 9.0 or later, unless
/// `INFERNO_PDL=0`. Decided once per process (one GPU kind per process).
pub(super) fn enabled(stream: &CudaStream) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let major = stream
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .unwrap_or(0);
        crate::switches::pdl() && major >= 9
    })
}
