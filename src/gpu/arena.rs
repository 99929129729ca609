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
//! While a [`serve`] scope is alive, this thread's allocations on its stream come from an arena
//! of plain `cuMemAlloc` chunks, kept for the process; captured, nothing reaches the graph. Every
//! block a step allocates is freed before its capture ends (`engine/graphs.rs` owns its outputs
//! up front), so all of the arena is free again afterwards, and the next capture (another batch
//! size) reuses the same bytes: the graphs replay one at a time on one stream, as PyTorch's graphs
//! share a memory pool. Nothing else may ever hold arena bytes, or a replay would overwrite it.
//!
//! A capturing stream may not add a chunk (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), so the
//! chunk is reserved before: the eager warm-up step before each capture runs in a [`measure`]
//! scope, which passes its allocations to the driver and records their peak, and [`reserve`]
//! makes room for twice that peak (best fit fragments; a capture that still runs out fails and
//! its batch size decodes eagerly). The warm-up itself must not take arena bytes: it fills
//! candle's caches of uploaded kernel parameters, which live for the process.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

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

/// Each CUDA context's blocks.
static ARENAS: Mutex<Vec<(usize, Blocks)>> = Mutex::new(Vec::new());
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

thread_local! {
    /// The stream whose allocations this thread diverts, and how (stream 0: none).
    static SCOPE: Cell<(usize, Mode)> = const { Cell::new((0, Mode::Off)) };
    static MEASURED: RefCell<Measured> = RefCell::new(Measured::default());
}

/// While alive, this thread's allocations on one stream are served or measured.
pub struct Scope {
    previous: (usize, Mode),
}

impl Drop for Scope {
    fn drop(&mut self) {
        SCOPE.with(|c| c.set(self.previous));
    }
}

fn enter(stream: CUstream, mode: Mode) -> Scope {
    let on = !std::env::var("INFERNO_GRAPH_ARENA").is_ok_and(|v| v == "0");
    let mode = if on { mode } else { Mode::Off };
    if mode == Mode::Measure {
        MEASURED.with(|m| *m.borrow_mut() = Measured::default());
    }
    Scope { previous: SCOPE.with(|c| c.replace((stream as usize, mode))) }
}

/// Records the peak of this thread's allocations on `stream` (still the driver's) until
/// dropped; read it with [`measured_peak`]. For the eager step before a capture.
pub fn measure(stream: CUstream) -> Scope {
    enter(stream, Mode::Measure)
}

/// The peak bytes the last [`measure`] scope of this thread saw live at once.
pub fn measured_peak() -> u64 {
    MEASURED.with(|m| m.borrow().peak)
}

/// Serves this thread's allocations on `stream` from the arena until dropped (a no-op scope
/// with `INFERNO_GRAPH_ARENA=0`). Open it after [`reserve`] and before `begin_capture`; drop it
/// after `end_capture`.
pub fn serve(stream: CUstream) -> Scope {
    enter(stream, Mode::Serve)
}

/// Makes sure the current context's arena has a free block of `bytes`, adding a chunk when it
/// has not. Call it outside any capture. Also fails when arena bytes are still lent (a capture
/// that kept some): those must not be shared.
pub fn reserve(bytes: u64) -> Result<(), CUresult> {
    let ctx = current_context()?;
    let mut arenas = lock();
    let blocks = arena_of(&mut arenas, ctx);
    if blocks.live_bytes() > 0 {
        return Err(CUresult::CUDA_ERROR_ALREADY_ACQUIRED);
    }
    if blocks.largest_free() >= bytes {
        return Ok(());
    }
    // Exactly what is asked (in 2 MiB steps): the memory plan's runtime allowance holds the
    // arena, and a 1B model's batch-1 step peaks at a few MiB. A larger batch size captured later
    // adds a larger chunk beside the small ones.
    let len = bytes.div_ceil(2 << 20) * (2 << 20);
    let mut chunk = 0;
    // SAFETY: writes one device pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut chunk, len as usize) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(r);
    }
    blocks.add_chunk(chunk, len);
    ANY_CHUNK.store(true, Ordering::Release);
    Ok(())
}

/// (chunk bytes, live bytes) over all contexts: what the arena holds, and what it lends now.
pub fn usage() -> (u64, u64) {
    let arenas = lock();
    arenas.iter().fold((0, 0), |(c, l), (_, b)| (c + b.chunk_bytes(), l + b.live_bytes()))
}

fn current_context() -> Result<usize, CUresult> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    if r == CUresult::CUDA_SUCCESS { Ok(ctx as usize) } else { Err(r) }
}

fn arena_of(arenas: &mut Vec<(usize, Blocks)>, ctx: usize) -> &mut Blocks {
    let index = match arenas.iter().position(|(c, _)| *c == ctx) {
        Some(i) => i,
        None => {
            arenas.push((ctx, Blocks::default()));
            arenas.len() - 1
        }
    };
    &mut arenas[index].1
}

fn lock() -> MutexGuard<'static, Vec<(usize, Blocks)>> {
    // A panic cannot happen under the lock (no user data, no allocation that can fail loudly),
    // but a poisoned lock must not turn every later free into an abort.
    ARENAS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current context's arena block of `bytes` (never a new chunk: see [`reserve`]).
fn alloc(bytes: usize) -> Result<CUdeviceptr, CUresult> {
    let ctx = current_context()?;
    let mut arenas = lock();
    arena_of(&mut arenas, ctx).alloc(bytes as u64).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
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
    let (scoped, mode) = SCOPE.with(Cell::get);
    match mode {
        Mode::Serve if scoped == stream as usize => match alloc(bytes) {
            Ok(p) => {
                // SAFETY: the caller's contract.
                unsafe { *dptr = p };
                CUresult::CUDA_SUCCESS
            }
            Err(e) => e,
        },
        Mode::Measure if scoped == stream as usize => measured_alloc(dptr, bytes, stream),
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
    if SCOPE.with(Cell::get).1 == Mode::Measure {
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
