//! The ranks' sums, gathers and broadcasts through the GPUs' peer memory ([`PeerSum`]): each rank
//! allocates one buffer, shares it with the others as a CUDA IPC handle, and maps theirs, so the
//! kernels of `kernels::all_reduce` can write into every rank's buffer. Where any rank cannot map
//! a peer's buffer (GPUs without peer access to each other: no NVLink, and PCIe peer access off),
//! or `INFERNO_TP_P2P=0` on any rank, no rank uses it and the collectives go through NCCL: every
//! rank decides the same, since a collective that some ranks enter and others do not never ends.
//! The collectives of both kinds must still come in the same order on every rank, as NCCL's do:
//! those through peer memory share the buffers' call numbers.

use candle_core::cuda_backend::cudarc::driver::sys::{self, CUipcMemHandle, CUresult};
use candle_core::{DType, Device, Tensor};

use super::Shard;
use super::collective::Collective;
use crate::kernels::all_reduce::{self, Peers};
use crate::kernels::layer_norm_act::{AddNorm, Normed};

/// Floats a rank's piece may have to go this way: 1 Mi (4 MiB), a decode batch of 364 rows of
/// gpt-oss's 2,880. Larger sums (long prefill chunks, where bytes rather than latency count)
/// take NCCL's all-gather, which adds in the same order.
const REGION: usize = 1 << 20;

/// This rank's buffer and the mapped buffers of the others.
pub struct PeerSum {
    shard: Shard,
    peers: Peers,
    own: sys::CUdeviceptr,
    device: candle_core::CudaDevice,
}

// SAFETY: the addresses are plain device pointers, used from one thread at a time (the engine's).
unsafe impl Send for PeerSum {}
unsafe impl Sync for PeerSum {}

fn ok(what: &str, r: CUresult) -> Result<(), String> {
    if r == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(format!("{what}: {r:?}")) }
}

/// The bytes every rank shares in the exchange: whether it can take part, and its handle.
const SHARED: usize = 1 + std::mem::size_of::<CUipcMemHandle>();

impl PeerSum {
    /// Sets up the buffers through `comm` (a collective call: every rank must make it). `None`
    /// when some rank cannot take part (this rank logs why it cannot).
    pub fn open(comm: &dyn Collective, device: &Device) -> anyhow::Result<Option<PeerSum>> {
        let Device::Cuda(dev) = device else { anyhow::bail!("peer sums need a CUDA device") };
        let shard = comm.shard();
        anyhow::ensure!(
            shard.world <= all_reduce::MAX_RANKS,
            "--tp above {}",
            all_reduce::MAX_RANKS
        );
        dev.cuda_stream().context().bind_to_thread()?;
        // Held as a PeerSum from the start, so that dropping it (any rank refusing) frees the
        // buffer and unmaps whatever was mapped.
        let mut own = None;
        if crate::switches::tp_p2p() {
            match allocate(shard.world) {
                Ok((p, handle)) => {
                    let sum =
                        PeerSum { shard, peers: Peers::default(), own: p, device: dev.clone() };
                    own = Some((sum, handle));
                }
                Err(e) => tracing::warn!("--tp: peer memory: {e}"),
            }
        }
        let mut mine = [0u8; SHARED];
        if let Some((_, handle)) = &own {
            mine[0] = 1;
            // SAFETY: the handle is a plain 64-byte struct.
            let bytes: [u8; SHARED - 1] = unsafe { std::mem::transmute(*handle) };
            mine[1..].copy_from_slice(&bytes);
        }
        let all = exchange(comm, &mine, device)?;
        let every = all.chunks(SHARED).all(|c| c[0] == 1);
        let opened = every
            && own.as_mut().is_some_and(|(s, _)| {
                s.map_peers(&all).map_err(|e| tracing::warn!("--tp: peer memory: {e}")).is_ok()
            });
        // Every rank learns whether every rank mapped every buffer.
        let agreed = exchange(comm, &[u8::from(opened)], device)?.iter().all(|&b| b == 1);
        if !agreed {
            tracing::info!("--tp: sums go through NCCL (peer memory is not usable by every rank)");
            return Ok(None);
        }
        tracing::info!("--tp: sums go through peer memory");
        Ok(own.map(|(s, _)| s))
    }

    /// Maps every other rank's buffer from the gathered handles.
    fn map_peers(&mut self, all: &[u8]) -> Result<(), String> {
        for (r, c) in all.chunks(SHARED).enumerate() {
            if r == self.shard.rank {
                self.peers.base[r] = self.own;
                continue;
            }
            // SAFETY: 64 bytes gathered from a rank's `cuIpcGetMemHandle`.
            let handle: CUipcMemHandle =
                unsafe { std::ptr::read_unaligned(c[1..].as_ptr() as *const CUipcMemHandle) };
            let mut ptr = 0;
            // SAFETY: writes the mapped address; the handle names a live allocation of rank r.
            let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            ok(&format!("mapping rank {r}'s buffer"), unsafe {
                sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags)
            })?;
            self.peers.base[r] = ptr;
        }
        Ok(())
    }

    /// The sum over the ranks of `x`, or `None` where it does not go this way (not f32, or
    /// larger than a region): the caller takes NCCL's path, which gives the same bits.
    pub fn sum(&self, x: &Tensor) -> anyhow::Result<Option<Tensor>> {
        let n = x.elem_count();
        if x.dtype() != DType::F32 || n > REGION || !n.is_multiple_of(4) || !x.device().is_cuda() {
            return Ok(None);
        }
        let x = x.contiguous()?;
        let Shard { rank, world } = self.shard;
        Ok(Some(all_reduce::all_reduce_f32(&x, &self.peers, rank, world, REGION)?))
    }

    /// Every rank's `x` stacked in rank order (`Collective::all_gather`), or `None` where it does
    /// not go this way (not f32 or u32, or larger than a region).
    pub fn all_gather(&self, x: &Tensor) -> anyhow::Result<Option<Tensor>> {
        let Shard { rank, world } = self.shard;
        Ok(all_reduce::all_gather_b32(&x.contiguous()?, &self.peers, rank, world, REGION)?)
    }

    /// Rank `root`'s `x` over every rank's, in place (`Collective::broadcast`); `false` where it
    /// does not go this way.
    pub fn broadcast(&self, x: &Tensor, root: usize) -> anyhow::Result<bool> {
        let Shard { rank, world } = self.shard;
        Ok(all_reduce::broadcast_b32(x, &self.peers, rank, world, REGION, root)?)
    }

    /// [`PeerSum::sum`] with `norm` applied to it in the same launch, or `None` where that
    /// kernel does not take it (the caller then sums and norms in two steps, the same bits).
    pub fn sum_add_norm(&self, x: &Tensor, norm: &AddNorm) -> anyhow::Result<Option<Normed>> {
        let Shard { rank, world } = self.shard;
        Ok(all_reduce::all_reduce_add_rms_norm(x, norm, &self.peers, rank, world, REGION)?)
    }
}

impl Drop for PeerSum {
    fn drop(&mut self) {
        let _ = self.device.cuda_stream().context().bind_to_thread();
        for (r, &p) in self.peers.base.iter().enumerate().take(self.shard.world) {
            if r != self.shard.rank && p != 0 {
                // SAFETY: mapped by `map_peers`, unmapped once.
                unsafe { sys::cuIpcCloseMemHandle(p) };
            }
        }
        // SAFETY: allocated by `allocate`; the graphs that captured its address are gone (the
        // engine drops them first), and a buffer no rank mapped is nobody's but this one's.
        unsafe { sys::cuMemFree_v2(self.own) };
    }
}

/// A zeroed buffer for `world` ranks and its IPC handle (memory from `cuMemAlloc`: pool
/// allocations, candle's, cannot be shared this way).
fn allocate(world: usize) -> Result<(sys::CUdeviceptr, CUipcMemHandle), String> {
    let bytes = all_reduce::buffer_bytes(world, REGION);
    let mut ptr = 0;
    // SAFETY: writes the address of a new allocation of `bytes`.
    ok("allocating the peer buffer", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
    // SAFETY: `ptr` holds `bytes`; zeroed before any rank learns of it.
    // (`cuMemsetD8` may return before it has run: wait, so that no peer's flag lands first.)
    let zeroed = ok("zeroing the peer buffer", unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) })
        .and_then(|()| ok("zeroing the peer buffer", unsafe { sys::cuCtxSynchronize() }));
    // SAFETY: a zeroed struct is a valid handle to be written.
    let mut handle: CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: writes the handle of the allocation at `ptr`.
    let shared = zeroed.and_then(|()| {
        ok("sharing the peer buffer", unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) })
    });
    match shared {
        Ok(()) => Ok((ptr, handle)),
        Err(e) => {
            // SAFETY: allocated above, not shared.
            unsafe { sys::cuMemFree_v2(ptr) };
            Err(e)
        }
    }
}

/// Every rank's `bytes` (the same length on every rank), in rank order, on the host.
fn exchange(comm: &dyn Collective, bytes: &[u8], device: &Device) -> anyhow::Result<Vec<u8>> {
    let x = Tensor::from_slice(bytes, bytes.len(), device)?;
    Ok(comm.all_gather(&x)?.flatten_all()?.to_vec1::<u8>()?)
}
