//! NCCL, opened at run time: the collectives between the GPUs of a tensor-parallel model, one
//! process per GPU.
//!
//! Bound here by hand (seven functions through `libloading`) rather than through cudarc's
//! `nccl` feature: candle turns on cudarc's link-time mode, in which that feature links `-lnccl`
//! into every build, so every build (CI's included) would need the 300 MB library, and the
//! binary could not start without it. Opened this way, a machine without NCCL runs everything
//! but `--tp` above 1, and says what is missing when that is asked for.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use candle_core::{DType, Device, Tensor};

use super::Shard;
use super::collective::Collective;
use crate::kernels::device_address;
use crate::kernels::layer_norm_act::{AddNorm, Normed};

/// The id rank 0 makes and every rank joins with (`ncclUniqueId`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

type Comm = *mut c_void;
type Stream = *mut c_void;

#[allow(non_snake_case)]
struct Api {
    ncclGetVersion: unsafe extern "C" fn(*mut c_int) -> c_int,
    ncclGetUniqueId: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    ncclCommInitRank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    ncclCommAbort: unsafe extern "C" fn(Comm) -> c_int,
    ncclGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    ncclAllGather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int,
    ncclBroadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> c_int,
    _lib: libloading::Library,
}

/// The library's file name: what `nvidia-nccl-cu13`'s wheel and the distributions install.
pub const SONAME: &str = "libnccl.so.2";

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> anyhow::Result<&'static Api> {
    API.get_or_init(open).as_ref().map_err(|e| {
        crate::error::fail(
            crate::error::ErrorKind::NoDevice,
            format!("--tp needs NCCL: {e} (scripts/install.sh fetches it; or put the folder of {SONAME} on LD_LIBRARY_PATH)"),
        )
    })
}

fn open() -> Result<Api, String> {
    let mut candidates = vec![std::path::PathBuf::from(SONAME)];
    if let Some(home) = std::env::var_os("HOME") {
        let cache = std::path::Path::new(&home).join(".cache/inferno/nccl/lib").join(SONAME);
        candidates.push(cache);
    }
    let mut err = String::new();
    for c in candidates {
        // SAFETY: NCCL is made to be dlopen'ed (PyTorch and cudarc do); its initialisers only
        // set up its own state.
        match unsafe { libloading::Library::new(&c) } {
            Ok(lib) => return bind(lib),
            Err(e) if err.is_empty() => err = crate::gpu::loader::dl_error_text(&e),
            Err(_) => {}
        }
    }
    Err(err)
}

fn bind(lib: libloading::Library) -> Result<Api, String> {
    macro_rules! sym {
        ($name:ident) => {
            // SAFETY: the signature is NCCL's (nccl.h, stable since 2.x for these calls).
            *unsafe { lib.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e| format!("{SONAME} has no {}: {e}", stringify!($name)))?
        };
    }
    Ok(Api {
        ncclGetVersion: sym!(ncclGetVersion),
        ncclGetUniqueId: sym!(ncclGetUniqueId),
        ncclCommInitRank: sym!(ncclCommInitRank),
        ncclCommAbort: sym!(ncclCommAbort),
        ncclGetErrorString: sym!(ncclGetErrorString),
        ncclAllGather: sym!(ncclAllGather),
        ncclBroadcast: sym!(ncclBroadcast),
        _lib: lib,
    })
}

fn check(api: &Api, what: &str, code: c_int) -> anyhow::Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for any code.
    let text = unsafe { CStr::from_ptr((api.ncclGetErrorString)(code)) };
    anyhow::bail!("NCCL {what}: {} (code {code})", text.to_string_lossy())
}

/// NCCL's version as `2.27.3`, or why it cannot be opened (`inferno doctor`).
pub fn version() -> anyhow::Result<String> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: writes one int.
    check(api, "version", unsafe { (api.ncclGetVersion)(&mut v) })?;
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// A new id for a group (on rank 0, sent to the others by the rendezvous).
pub fn unique_id() -> anyhow::Result<UniqueId> {
    let api = api()?;
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: writes the 128-byte struct.
    check(api, "unique id", unsafe { (api.ncclGetUniqueId)(&mut id) })?;
    Ok(id)
}

/// One rank's NCCL communicator, on the stream of its model's device.
pub struct NcclComm {
    comm: Comm,
    shard: Shard,
    device: candle_core::CudaDevice,
    /// The sums' faster way where every rank's GPU reaches the others' memory.
    peer_sum: Option<super::p2p::PeerSum>,
}

// SAFETY: the communicator is used by one thread at a time (the engine's, which owns the model);
// NCCL allows a communicator to move between threads, and `ncclCommAbort` from another thread.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Joins the group `id` as `shard.rank` on `device` (blocks until every rank has joined).
    pub fn join(id: UniqueId, shard: Shard, device: &Device) -> anyhow::Result<NcclComm> {
        let Device::Cuda(dev) = device else { anyhow::bail!("NCCL needs a CUDA device") };
        let api = api()?;
        dev.cuda_stream().context().bind_to_thread()?;
        let mut comm: Comm = std::ptr::null_mut();
        let (world, rank) = (shard.world as c_int, shard.rank as c_int);
        // SAFETY: writes the communicator handle; the id is passed by value as nccl.h declares.
        check(api, "init", unsafe { (api.ncclCommInitRank)(&mut comm, world, id, rank) })?;
        let mut nccl = NcclComm { comm, shard, device: dev.clone(), peer_sum: None };
        nccl.peer_sum = super::p2p::PeerSum::open(&nccl, device)?;
        Ok(nccl)
    }

    /// Ends the communicator at once, unblocking anything waiting on a rank that died.
    pub fn abort(&self) {
        if let Ok(api) = api() {
            // SAFETY: the handle is live; NCCL allows abort from any thread.
            unsafe { (api.ncclCommAbort)(self.comm) };
        }
    }
}

impl Drop for NcclComm {
    /// Aborts rather than destroys: `ncclCommDestroy` waits for the other ranks to finish their
    /// operations, which ranks that exited (or that wait for this one) never do.
    fn drop(&mut self) {
        let trace = crate::switches::tp_trace();
        if trace {
            eprintln!("inferno tp rank {}: aborting NCCL", self.shard.rank);
        }
        self.abort();
        if trace {
            eprintln!("inferno tp rank {}: NCCL aborted", self.shard.rank);
        }
    }
}

/// NCCL's `ncclDataType_t` for a dtype.
fn nccl_type(d: DType) -> anyhow::Result<c_int> {
    Ok(match d {
        DType::U8 => 1,
        DType::U32 => 3,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::BF16 => 9,
        other => anyhow::bail!("NCCL: no collective for {other:?}"),
    })
}

impl Collective for NcclComm {
    fn shard(&self) -> Shard {
        self.shard
    }

    fn all_gather(&self, x: &Tensor) -> anyhow::Result<Tensor> {
        if let Some(p) = &self.peer_sum
            && let Some(all) = p.all_gather(x)?
        {
            return Ok(all);
        }
        let api = api()?;
        let x = x.contiguous()?;
        let n = x.elem_count();
        let stream = self.device.cuda_stream();
        let mut dims = vec![self.shard.world];
        dims.extend_from_slice(x.dims());
        let out = Tensor::zeros(dims, x.dtype(), &Device::Cuda(self.device.clone()))?;
        let kind = nccl_type(x.dtype())?;
        let send = device_address(&x)?;
        let recv = device_address(&out)?;
        // SAFETY: `recv` holds world · n elements, `send` n, both on this stream's device; NCCL
        // enqueues on the stream the tensors are ordered by.
        let code = unsafe {
            (api.ncclAllGather)(
                send as *const c_void,
                recv as *mut c_void,
                n,
                kind,
                self.comm,
                stream.cu_stream() as Stream,
            )
        };
        check(api, "all-gather", code)?;
        Ok(out)
    }

    fn sums_through(&self) -> &'static str {
        if self.peer_sum.is_some() { "peer memory" } else { "NCCL" }
    }

    fn sum(&self, x: &Tensor) -> anyhow::Result<Tensor> {
        if let Some(p) = &self.peer_sum
            && let Some(sum) = p.sum(x)?
        {
            return Ok(sum);
        }
        super::collective::all_reduce_sum(self, x)
    }

    fn sum_add_norm(&self, x: &Tensor, norm: &AddNorm) -> anyhow::Result<Normed> {
        if let Some(p) = &self.peer_sum
            && let Some(normed) = p.sum_add_norm(x, norm)?
        {
            return Ok(normed);
        }
        Ok(norm.apply(&self.sum(x)?)?)
    }

    fn broadcast(&self, x: &Tensor, root: usize) -> anyhow::Result<()> {
        if let Some(p) = &self.peer_sum
            && p.broadcast(x, root)?
        {
            return Ok(());
        }
        let api = api()?;
        let stream = self.device.cuda_stream();
        let kind = nccl_type(x.dtype())?;
        let at = device_address(x)?;
        // SAFETY: in place: the same `elem_count` elements on every rank.
        let code = unsafe {
            (api.ncclBroadcast)(
                at as *const c_void,
                at as *mut c_void,
                x.elem_count(),
                kind,
                root as c_int,
                self.comm,
                stream.cu_stream() as Stream,
            )
        };
        check(api, "broadcast", code)
    }
}
