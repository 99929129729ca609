//! A device-memory arena for what a captured decode step allocates, so that its CUDA graph holds
//! kernels only.
//!
//! # Why
//! candle allocates every op's output with `cuMemAllocAsync` and frees it with `cuMemFreeAsync`.
//! Captured, each becomes a memory node of the graph: a Llama-1B step was 593 nodes, 167 of them
//! kernels and 426 allocation and free nodes between them. A kernel launched with Programmatic
//! Dependent Launch overlaps its predecessor only across a kernel-to-kernel edge, so those nodes
//! cancelled PDL (measured: no gain), and a replay walks them all. The driver refuses to edit
//! them out after capture (`CUDA_ERROR_NOT_SUPPORTED` for graphs with memory nodes).
//!
//! # How
//! While an [`Arena::serve`] scope is alive, this thread's allocations on its stream come from
//! that arena's plain `cuMemAlloc` chunks; captured, nothing reaches the graph. Every block a
//! step allocates is freed before its capture ends (`engine/graphs.rs` owns its outputs up
//! front), so all of the arena is free again afterwards, and the next capture (another batch
//! size) reuses the same bytes: one engine's graphs replay one at a time on its stream, as
//! PyTorch's graphs share a memory pool. Nothing else may ever hold arena bytes, or a replay
//! would overwrite it. So each engine owns its own [`Arena`]: two engines in one process replay
//! at the same time on their own streams (one arena per CUDA context gave both the same bytes,
//! and one engine's replies turned to noise), and an engine's chunks go back to the driver with
//! it.
//!
//! A capturing stream may not add a chunk (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), so the
//! chunk is reserved before: the eager warm-up step before each capture runs in a [`measure`]
//! scope, which passes its allocations to the driver and records their peak, and
//! [`Arena::reserve`] makes room for twice that peak (best fit fragments; a capture that still
//! runs out fails and its batch size decodes eagerly). The warm-up itself must not take arena
//! bytes: it fills candle's caches of uploaded kernel parameters, which live for the process.
//!
//! Reusing a block inside one graph is safe in stream order, and under PDL too: a kernel that
//! overlaps its predecessor only loads weights before `griddepcontrol.wait`, and writes after it,
//! when everything before it has completed.
//!
//! The two entry points are ours because `lazy.rs` already defines every CUDA function the binary
//! calls: `codegen.rs` labels their trampolines `inferno_real_*`, and the definitions below take
//! the public names. `INFERNO_GRAPH_ARENA=0` turns the arena off (graphs then hold memory nodes).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::cuda_backend::cudarc::driver::sys::{self, CUdeviceptr, CUresult, CUstream};

use super::arena_blocks::Blocks;

// The public names as hidden symbols that jump to the Rust definitions: a `#[no_mangle]` Rust
// function of those names would be exported from the executable (tests/no_cuda.rs checks that no
// CUDA name is).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.inferno_arena,\"ax\",%progbits",
    ".globl cuMemAllocAsync",
    ".hidden cuMemAllocAsync",
    "cuMemAllocAsync:",
    "    jmp inferno_arena_cuMemAllocAsync",
    ".globl cuMemFreeAsync",
    ".hidden cuMemFreeAsync",
    "cuMemFreeAsync:",
    "    jmp inferno_arena_cuMemFreeAsync",
    ".popsection",
);
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".pushsection .text.inferno_arena,\"ax\",%progbits",
    ".globl cuMemAllocAsync",
    ".hidden cuMemAllocAsync",
    "cuMemAllocAsync:",
    "    b inferno_arena_cuMemAllocAsync",
    ".globl cuMemFreeAsync",
    ".hidden cuMemFreeAsync",
    "cuMemFreeAsync:",
    "    b inferno_arena_cuMemFreeAsync",
    ".popsection",
);

unsafe extern "C" {
    fn inferno_real_cuMemAllocAsync(
        dptr: *mut CUdeviceptr,
        bytes: usize,
        stream: CUstream,
    ) -> CUresult;
    fn inferno_real_cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult;
}

/// Each live [`Arena`]'s blocks, by its id.
static ARENAS: Mutex<Vec<(u64, Blocks)>> = Mutex::new(Vec::new());
/// The next [`Arena`]'s id.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Whether any chunk exists, so that frees outside graphs skip the lock until one does.
static ANY_CHUNK: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Measure,
    Serve,
}

/// What this thread's allocations on one stream record.
#[derive(Default)]
struct Measured {
    /// Live allocations made in the scope: pointer -> bytes.
    live: HashMap<CUdeviceptr, u64>,
    now: u64,
    peak: u64,
}

/// Whose allocations a thread diverts, and where to.
#[derive(Clone, Copy)]
struct Diversion {
    stream: usize,
    mode: Mode,
    /// The serving arena's id (0 when measuring or off).
    arena: u64,
}

const OFF: Diversion = Diversion { stream: 0, mode: Mode::Off, arena: 0 };

thread_local! {
    static SCOPE: Cell<Diversion> = const { Cell::new(OFF) };
    static MEASURED: RefCell<Measured> = RefCell::new(Measured::default());
}

/// While alive, this thread's allocations on one stream are served or measured.
pub struct Scope {
    previous: Diversion,
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|c| c.set(self.previous));
    }
}

fn enter(stream: CUstream, mode: Mode, arena: u64) -> Scope {
    let mode = if crate::switches::graph_arena() { mode } else { Mode::Off };
    if mode == Mode::Measure {
        MEASURED.with(|m| *m.borrow_mut() = Measured::default());
    }
    let now = Diversion { stream: stream as usize, mode, arena };
    Scope { previous: SCOPE.with(|c| c.replace(now)) }
}

/// Records the peak of this thread's allocations on `stream` (still the driver's) until
/// dropped; read it with [`measured_peak`]. For the eager step before a capture.
pub fn measure(stream: CUstream) -> Scope {
    enter(stream, Mode::Measure, 0)
}

/// The peak bytes the last [`measure`] scope of this thread saw live at once.
pub fn measured_peak() -> u64 {
    MEASURED.with(|m| m.borrow().peak)
}

/// One engine's capture memory: the chunks its decode graphs' steps allocate from. Its chunks
/// go back to the driver when it drops, so it must outlive every graph that uses its bytes.
pub struct Arena {
    id: u64,
    /// The context of its chunks, from the first [`Arena::reserve`]: kept alive to free them.
    context: Mutex<Option<Arc<CudaContext>>>,
}

impl Default for Arena {
    fn default() -> Self {
        Arena { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), context: Mutex::new(None) }
    }
}

impl Arena {
    /// Serves this thread's allocations on `stream` from this arena until dropped (a no-op scope
    /// with `INFERNO_GRAPH_ARENA=0`). Open it after [`Arena::reserve`] and before
    /// `begin_capture`; drop it after `end_capture`.
    pub fn serve(&self, stream: CUstream) -> Scope {
        enter(stream, Mode::Serve, self.id)
    }

    /// Makes sure this arena has a free block of `bytes`, adding a chunk in `context` (the
    /// current one) when it has not. Call it outside any capture. Also fails when arena bytes
    /// are still lent (a capture that kept some): those must not be shared.
    pub fn reserve(&self, context: &Arc<CudaContext>, bytes: u64) -> Result<(), CUresult> {
        let mut arenas = lock();
        let blocks = blocks_of(&mut arenas, self.id);
        if blocks.live_bytes() > 0 {
            return Err(CUresult::CUDA_ERROR_ALREADY_ACQUIRED);
        }
        if blocks.largest_free() >= bytes {
            return Ok(());
        }
        let mut ours = self.context.lock().unwrap_or_else(|e| e.into_inner());
        if ours.as_ref().is_some_and(|c| c.cu_ctx() != context.cu_ctx()) {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        // Exactly what is asked (in 2 MiB steps): the memory plan's runtime allowance holds the
        // arena, and a 1B model's batch-1 step peaks at a few MiB. A larger batch size captured
        // later adds a larger chunk beside the small ones.
        let len = bytes.div_ceil(2 << 20) * (2 << 20);
        let mut chunk = 0;
        // SAFETY: writes one device pointer.
        let mut r = unsafe { sys::cuMemAlloc_v2(&mut chunk, len as usize) };
        // The memory pool may keep what the chunk needs (`gpu/mempool.rs`).
        if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY && super::mempool::trim(context).is_ok() {
            // SAFETY: as above.
            r = unsafe { sys::cuMemAlloc_v2(&mut chunk, len as usize) };
        }
        if r != CUresult::CUDA_SUCCESS {
            return Err(r);
        }
        blocks.add_chunk(chunk, len);
        *ours = Some(context.clone());
        ANY_CHUNK.store(true, Ordering::Release);
        Ok(())
    }

    /// (chunk bytes, live bytes): what this arena holds, and what it lends now.
    pub fn usage(&self) -> (u64, u64) {
        let arenas = lock();
        arenas
            .iter()
            .find(|(id, _)| *id == self.id)
            .map_or((0, 0), |(_, b)| (b.chunk_bytes(), b.live_bytes()))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let blocks = {
            let mut arenas = lock();
            match arenas.iter().position(|(id, _)| *id == self.id) {
                Some(i) => arenas.swap_remove(i).1,
                None => return,
            }
        };
        let context = self.context.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        // Bytes still lent belong to someone (a failed capture's leftovers): leave them to the
        // context rather than free memory in use. Otherwise wait for the last replay, then free.
        let Some(context) = context.filter(|_| blocks.live_bytes() == 0) else { return };
        if context.bind_to_thread().is_err() || context.synchronize().is_err() {
            return;
        }
        for (start, _) in blocks.chunks() {
            // SAFETY: a chunk of this arena's cuMemAlloc, lent to no one, its users finished.
            unsafe { sys::cuMemFree_v2(start) };
        }
    }
}

fn blocks_of(arenas: &mut Vec<(u64, Blocks)>, id: u64) -> &mut Blocks {
    let index = match arenas.iter().position(|(i, _)| *i == id) {
        Some(i) => i,
        None => {
            arenas.push((id, Blocks::default()));
            arenas.len() - 1
        }
    };
    &mut arenas[index].1
}

fn lock() -> MutexGuard<'static, Vec<(u64, Blocks)>> {
    // A panic cannot happen under the lock (no user data, no allocation that can fail loudly),
    // but a poisoned lock must not turn every later free into an abort.
    ARENAS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A block of `bytes` from arena `id` (never a new chunk: see [`Arena::reserve`]).
fn alloc(id: u64, bytes: usize) -> Result<CUdeviceptr, CUresult> {
    let mut arenas = lock();
    blocks_of(&mut arenas, id).alloc(bytes as u64).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

/// Returns `dptr` to its arena: `false` when it is not an arena block.
fn free(dptr: CUdeviceptr) -> bool {
    ANY_CHUNK.load(Ordering::Acquire) && lock().iter_mut().any(|(_, b)| b.free(dptr))
}

/// The driver's allocation, recorded by a [`measure`] scope.
fn measured_alloc(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { inferno_real_cuMemAllocAsync(dptr, bytes, stream) };
    if r == CUresult::CUDA_SUCCESS {
        // SAFETY: the driver wrote it.
        let p = unsafe { *dptr };
        MEASURED.with(|m| {
            let mut m = m.borrow_mut();
            m.live.insert(p, bytes as u64);
            m.now += bytes as u64;
            m.peak = m.peak.max(m.now);
        });
    }
    r
}

/// cudarc's (and so candle's) allocation entry point: see the module header.
///
/// # Safety
/// As the driver's `cuMemAllocAsync`: `dptr` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn inferno_arena_cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    let scope = SCOPE.with(Cell::get);
    let scoped = scope.stream == stream as usize;
    match scope.mode {
        Mode::Serve if scoped => match alloc(scope.arena, bytes) {
            Ok(p) => {
                // SAFETY: the caller's contract.
                unsafe { *dptr = p };
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        },
        Mode::Measure if scoped => measured_alloc(dptr, bytes, stream),
        // SAFETY: the caller's arguments, unchanged.
        _ => unsafe { inferno_real_cuMemAllocAsync(dptr, bytes, stream) },
    }
}

/// cudarc's free entry point: arena blocks go back to the arena, the rest to the driver.
///
/// # Safety
/// As the driver's `cuMemFreeAsync`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn inferno_arena_cuMemFreeAsync(
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    if free(dptr) {
        return CUresult::CUDA_SUCCESS;
    }
    if SCOPE.with(Cell::get).mode == Mode::Measure {
        MEASURED.with(|m| {
            let mut m = m.borrow_mut();
            if let Some(bytes) = m.live.remove(&dptr) {
                m.now -= bytes;
            }
        });
    }
    // SAFETY: the caller's arguments, unchanged.
    unsafe { inferno_real_cuMemFreeAsync(dptr, stream) }
}
