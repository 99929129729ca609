//! Our bf16 tensor-core GEMV (`gemv_bf16.cu`), the launch side: `x` `[m, k]` times `w`
//! `[n, k]` transposed for the few rows of a decode step, with f32 accumulation, written as f32
//! ([`super::matmul_f32_out()`]) or as Llama's SwiGLU of a fused gate/up product
//! ([`super::matmul_swiglu_bf16()`]), and its rows kernel for tall weights and many rows (the
//! same sums, another split of the work). Here: which of them a product takes ([`kernel_for`]),
//! which variant a shape takes and how many warps run along K. Its GPU tests and timings go
//! through those two ops (`matmul_f32_out`'s `check_gemv` and `gpu_gemv_timing`, `swiglu_gemv`'s).

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DevicePtrMut, DeviceRepr, LaunchConfig,
};
use candle_core::{CudaDevice, Result};
use half::bf16;

use crate::kernels::cuda::{fatbin, int};
use crate::kernels::launch::Launch;

/// Rows up to which a bf16 product takes one of our kernels while batch invariance is on: each
/// gives a row the bits it gets alone, which speculative verify steps rely on
/// (`kernels/invariance.rs`). Past it (prefill chunks) cuBLAS, which picks its reduction by the
/// row count.
pub const INVARIANT_ROWS: usize = 256;

/// Which of our kernels a product of `m` rows of x against `n` weight rows takes; `None`:
/// cuBLAS (more than [`INVARIANT_ROWS`] rows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kernel {
    /// The GEMV (`gemv_bf16_m*_n*`): K split over a block's warps, up to 64 rows a launch.
    Split,
    /// `gemv_bf16_rows_*`: a block per K chain of the GEMV, its warps sharing x, the chains'
    /// sums added in the GEMV's order; the same sums, for tall weights and many rows.
    Rows,
}

/// Which kernel a product of `m` rows against `n` weight rows takes. With batch invariance on
/// (`kernels::invariance::on`), ours up to [`INVARIANT_ROWS`] rows, the faster of the two
/// (both give a row the same bits), measured on an H100 (`gpu_gemv_timing`,
/// docs/performance.md): the split GEMV up to 32 rows, and up to 64 but for LM heads; the rows
/// kernel past that. Else the GEMV only where it beats cuBLAS: up to 16 rows, up to 32 for
/// weights of at most 4096 rows.
pub fn kernel_for(m: usize, n: usize) -> Option<Kernel> {
    if !crate::kernels::invariance::on() {
        return (m <= 16 || (m <= 32 && n <= 4096)).then_some(Kernel::Split);
    }
    match m {
        0 => None,
        1..=32 => Some(Kernel::Split),
        33..=64 if n < 65_536 => Some(Kernel::Split),
        _ if m <= INVARIANT_ROWS => Some(Kernel::Rows),
        _ => None,
    }
}

/// gemv_bf16.cu's largest block: GEMV_MAX_WK warps along K.
const MAX_WK: usize = 8;
/// Enough warps to keep every multiprocessor's loads in flight (132 SMs on an H100, ~16
/// warps each); fewer output tiles than that get more warps along K.
const TARGET_WARPS: usize = 2048;

/// Warps along K for `n` outputs of width `k`: from the shape only, so that a row's sums
/// run in the same order whatever the batch (see the kernel's header).
pub fn warps_along_k(n: usize, k: usize) -> usize {
    let tiles = n.div_ceil(16);
    // At least two groups of 32 values per warp.
    let by_k = (k / 64).max(1);
    TARGET_WARPS.div_ceil(tiles).clamp(1, MAX_WK).min(by_k)
}

/// The kernel variant for `m` rows and `wk` warps along K: `(MT, NT)`, MT tiles of 16 weight
/// rows per warp (each x fragment reused MT times: with 32 or 64 rows of x and one tile per
/// warp, the LM head's x reads from L2 outweigh its weight reads; measured on the H100 at
/// 32 rows: 952 µs with one tile, cuBLAS 433), NT tiles of 8 rows of x. The block's
/// shared memory holds WK · MT ≤ 8 tiles. MT does not change any sum's order.
pub fn tiles(m: usize, wk: usize) -> (usize, usize) {
    let (nt, mt_best) = match m {
        0..=8 => (1, 1),
        9..=16 => (2, 2),
        17..=32 => (4, 4),
        _ => (8, 2),
    };
    let mt = [4, 2, 1].into_iter().find(|&t| t <= mt_best && t * wk <= MAX_WK).unwrap_or(1);
    (mt, nt)
}

/// Groups of 32 values a warp loads per batch (U) for up to 8 rows of x; the kernel is
/// built for these.
pub const BATCHES: [usize; 3] = [8, 4, 2];

/// What the kernel writes: the f32 product, or Llama's SwiGLU of a fused gate/up product
/// (bf16, half as wide: gemv_bf16.cu's SWIGLU epilogue).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Epilogue {
    F32,
    SwiGlu,
}

impl Epilogue {
    fn prefix(self) -> &'static str {
        match self {
            Epilogue::F32 => "gemv_bf16",
            Epilogue::SwiGlu => "gemv_swiglu",
        }
    }
}

/// The kernel of one tile of x rows (up to 8 rows) with `u` groups per batch.
fn one_tile_kernel(epi: Epilogue, u: usize) -> String {
    let p = epi.prefix();
    if u == 4 { format!("{p}_m1_n1") } else { format!("{p}_m1_n1_u{u}") }
}

/// U for one tile of x rows against `tiles` blocks of `wk` warps along a K of `k`: the largest
/// whose blocks all fit on the GPU at once (registers bound the resident warps, and a second wave
/// of a few blocks runs at a fraction of the bandwidth), else the largest (a launch of many
/// waves, an LM head: the most loads in flight per warp). Long chains (64 groups of 32 values
/// or more a warp) over many blocks (4 a multiprocessor or more) take the largest too: there a
/// warp's longer runs of each row outweigh a partial last wave. H100, one rank of the
/// Llama-3.1-70B shape at TP4 (gate/up 14,336 × 8,192, 896 blocks of 3 warps): U = 2 (one
/// wave) 65.3 tok/s, U = 4 68.4, U = 8 68.8; Llama-3.2-1B's gate/up (2,048 wide, 32 groups a
/// warp) lost 0.4% with U = 8, Llama-3.1-8B's (64) neither lost nor gained. See gemv_bf16.cu's
/// variants. U does not change any sum, so this is free to depend on the GPU.
fn batch_for(
    dev: &CudaDevice,
    epi: Epilogue,
    tiles: usize,
    (wk, k): (usize, usize),
) -> Result<usize> {
    type Key = (usize, Epilogue, usize, usize, usize);
    type Cache = std::sync::Mutex<std::collections::HashMap<Key, usize>>;
    static CHOSEN: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let key = (dev.cuda_stream().context().ordinal(), epi, tiles, wk, k);
    let cache = CHOSEN.get_or_init(Default::default);
    if let Some(&u) = cache.lock().ok().and_then(|c| c.get(&key).copied()).as_ref() {
        return Ok(u);
    }
    let sms = crate::kernels::cuda::multiprocessors(dev);
    let long_chains = k / 32 / wk.max(1) >= 64 && tiles >= 4 * sms;
    let chosen = if long_chains { BATCHES[0] } else { one_wave_batch(dev, epi, tiles, wk, sms)? };
    if let Ok(mut c) = cache.lock() {
        c.insert(key, chosen);
    }
    Ok(chosen)
}

/// The largest U whose `tiles` blocks of `wk` warps all fit on the `sms` multiprocessors at
/// once, by the driver's occupancy calculator; the largest U when none does.
fn one_wave_batch(
    dev: &CudaDevice,
    epi: Epilogue,
    tiles: usize,
    wk: usize,
    sms: usize,
) -> Result<usize> {
    for u in BATCHES {
        let func = fatbin::gemv_bf16::GEMV_BF16.func(dev, &one_tile_kernel(epi, u))?;
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(32 * wk as u32, 0, None)
            .map_err(|e| candle_core::Error::Msg(format!("gemv occupancy: {e:?}")))?;
        if per_sm as usize * sms >= tiles {
            return Ok(u);
        }
    }
    Ok(BATCHES[0])
}

/// y `[m, n]` = x `[m, k]` · w `[n, k]`ᵀ (f32), or its SwiGLU (bf16 `[m, n / 2]`, n even),
/// m ≤ 64 (16 for the SwiGLU), k % 8 == 0, 16-byte aligned starts. `batch` forces U for up
/// to 8 rows (tests: every U gives the same bits).
pub fn launch<T: DeviceRepr, O: DevicePtrMut<T>>(
    dev: &CudaDevice,
    x: &CudaView<bf16>,
    w: &CudaView<bf16>,
    (out, epi): (&mut O, Epilogue),
    (m, n, k): (usize, usize, usize),
    batch: Option<usize>,
) -> Result<()> {
    let wk = warps_along_k(n, k);
    let (mt, nt) = tiles(m, wk);
    if epi == Epilogue::SwiGlu && (nt > 2 || !n.is_multiple_of(2)) {
        candle_core::bail!("gemv: the SwiGLU epilogue takes up to 16 rows and an even width");
    }
    let name = if (mt, nt) == (1, 1) {
        let u = match batch {
            Some(u) => u,
            None => batch_for(dev, epi, n.div_ceil(16), (wk, k))?,
        };
        one_tile_kernel(epi, u)
    } else {
        format!("{}_m{mt}_n{nt}", epi.prefix())
    };
    let func = fatbin::gemv_bf16::GEMV_BF16.func(dev, &name)?;
    let cfg = LaunchConfig {
        grid_dim: (int(n.div_ceil(16 * mt), "output tiles")? as u32, 1, 1),
        block_dim: (32, wk as u32, 1),
        shared_mem_bytes: 0,
    };
    let (m32, n32, k32) = (int(m, "rows")?, int(n, "outputs")?, int(k, "inner dim")?);
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(x).ptr(w).ptr_mut(out).val(m32).val(n32).val(k32);
    // SAFETY: the arguments match the kernels' signature; x holds m·k, w n·k and out m·n
    // f32 elements (m·n/2 bf16 for the SwiGLU), k % 8 == 0 and both starts are 16-byte
    // aligned (the caller checks); the kernel reads only w before pdl_wait().
    unsafe { b.launch(cfg) }
}

/// The rows kernel's shape for `m` rows against `n` weight rows: `(MT, NT, WN)`, MT tiles of 16
/// weight rows per warp (x reused from registers), NT tiles of 8 rows of x per block (more rows
/// take more blocks along gridDim.x), WN warps per block (sharing x through L1). None of them
/// changes a sum.
pub fn rows_shape(m: usize, n: usize) -> (usize, usize, usize) {
    let nt = if m <= 32 { 4 } else { 8 };
    let tiles = n.div_ceil(16);
    let mt = if tiles >= 4096 { 2 } else { 1 };
    let wn = (tiles / mt).clamp(1, 4);
    (mt, nt, wn)
}

/// y `[m, n]` (f32) = x `[m, k]` · w `[n, k]`ᵀ with the rows kernel (`gemv_bf16_rows_*`, then
/// `gemv_rows_sum` for shapes whose sums run in several chains): any m, each row the bits
/// [`launch`] gives it. k % 8 == 0, 16-byte aligned starts. `mt` forces the weight tiles per
/// warp (tests: both give the same bits).
pub fn launch_rows(
    dev: &CudaDevice,
    x: &CudaView<bf16>,
    w: &CudaView<bf16>,
    out: &mut CudaSlice<f32>,
    (m, n, k): (usize, usize, usize),
    mt: Option<usize>,
) -> Result<()> {
    let (auto_mt, nt, wn) = rows_shape(m, n);
    let mt = mt.unwrap_or(auto_mt);
    let wk = warps_along_k(n, k);
    let func = fatbin::gemv_bf16::GEMV_BF16.func(dev, &format!("gemv_bf16_rows_m{mt}_n{nt}"))?;
    let cfg = LaunchConfig {
        grid_dim: (
            int(m.div_ceil(8 * nt), "row blocks")? as u32,
            int(n.div_ceil(16 * mt * wn), "output tiles")? as u32,
            wk as u32,
        ),
        block_dim: (32, wn as u32, 1),
        shared_mem_bytes: 0,
    };
    let (m32, n32, k32) = (int(m, "rows")?, int(n, "outputs")?, int(k, "inner dim")?);
    let stream = dev.cuda_stream();
    // Several chains: each writes its sums to its slice of `part`, added up in order below.
    let mut part = if wk > 1 {
        // SAFETY: the kernel writes all wk·m·n elements (every chain, row and output).
        Some(unsafe { dev.alloc::<f32>(wk * m * n)? })
    } else {
        None
    };
    {
        let mut b = Launch::new(&stream, &func);
        b.ptr(x).ptr(w);
        match part.as_mut() {
            Some(p) => b.ptr_mut(p),
            None => b.ptr_mut(out),
        };
        b.val(m32).val(n32).val(k32);
        // SAFETY: the arguments match the kernel's signature; x holds m·k, w n·k and the output
        // gridDim.z·m·n elements, k % 8 == 0 and both starts are 16-byte aligned (the caller
        // checks); the kernel reads only w before pdl_wait().
        unsafe { b.launch(cfg) }?;
    }
    let Some(part) = part else { return Ok(()) };
    let len = m * n;
    let sum = fatbin::gemv_bf16::GEMV_BF16.func(dev, "gemv_rows_sum")?;
    let mut b = Launch::new(&stream, &sum);
    b.ptr(&part).ptr_mut(out).val(len as i64).val(int(wk, "chains")?);
    let cfg = LaunchConfig {
        grid_dim: (len.div_ceil(256).min(4096) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: part holds wk·len and out len elements; the kernel waits (PDL) before reading.
    unsafe { b.launch(cfg) }
}
