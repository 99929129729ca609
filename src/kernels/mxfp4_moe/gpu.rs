//! The CUDA launches, by batch size (bf16 x; f32 always takes the per-slot GEMVs of
//! `mxfp4_moe.cu`):
//! - below [`SLOT_TILES_MIN_TOKENS`] tokens, and where the slots are fewer than half the experts
//!   ([`slot_tiles_pay`]), the per-slot GEMVs on tensor cores (`moe_slot_mma.cu`);
//! - else below [`GROUPED_MIN_TOKENS`] (128), the same GEMVs over tiles of up to 8 slots grouped
//!   by expert (`moe_slot_mma.cu`'s slot tiles): each expert's weight rows read once per tile, and
//!   each slot's bits those of the per-slot GEMVs;
//! - from [`GROUPED_MIN_TOKENS`] on, the tensor-core GEMMs batched by expert in tiles of 64 slots
//!   (`moe_grouped.cu`).
//!
//! All leave one f32 row per (token, slot) that `moe_sum` adds up in slot order (the per-slot
//! tensor-core kernels add them in their last block instead, in the same order).

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, bail};
use half::bf16;

use super::{Mxfp4Moe, Path};
use crate::kernels::cuda::{
    COUNTERS, Fatbin, KernelFloat, allow_shared, counters, cuda_view, fatbin, int, output,
};
use crate::kernels::launch::Launch;
use crate::kernels::shared_memory;

/// moe_slot_mma.cu's warps per block (along K), and the rows of its tile. 8 warps: 33.1 µs per
/// gpt-oss-20b layer against 33.4 with 4 (H100, scripts/analysis/moe_decode_kernels.py).
const SLOT_MMA_WARPS: u32 = 8;
const SLOT_MMA_ROWS: usize = 16;
/// The GEMVs' widest K: 8 warps of 32 lanes, 32 inputs each.
const MAX_K: usize = shared_memory::MOE_MAX_WIDTH;

/// The warps along K of down's per-slot and slot-tile kernels, from its K (the intermediate
/// width) alone, so that both give a slot the same bits: 8 as gate_up, but 4 where 8 would walk
/// at most two quads (of 4 blocks of 32 values) each, as gpt-oss's experts split over two ranks
/// (45 blocks): there half of 8 warps idle for half of each block.
fn down_warps(inter: usize) -> u32 {
    if inter / 32 <= 2 * 4 * SLOT_MMA_WARPS as usize { 4 } else { SLOT_MMA_WARPS }
}

/// Up to this many tokens the GEMVs take 16 rows per block (more blocks to fill the GPU),
/// beyond it 32 (measured on an H200, gpt-oss-20b sizes: 1 token 52 vs 57 µs, 128 tokens
/// 3.3 vs 2.8 ms).
const SMALL_BATCH: usize = 2;
/// From this many tokens bf16 batches may group their slots by expert into slot tiles (one
/// `moe_group` launch, [`slot_tiles_pay`]); below it each slot is its own block
/// (`moe_slot_mma.cu`'s per-slot kernels). Both give a slot the same bits, so this is a matter
/// of speed alone: at 8 tokens of gpt-oss-20b the grouping already saves the re-reads of
/// experts that several tokens share. A token's MoE sums in the same order whatever the batch,
/// so a prompt in chunks below [`GROUPED_MIN_TOKENS`] computes each position bit for bit as a
/// decode step does (tests/cache_reuse.rs reuses KV that decode steps wrote and compares with a
/// fresh prefill).
pub(crate) const SLOT_TILES_MIN_TOKENS: usize = 8;
/// Whether a bf16 batch of `tokens` routed to `k` of `experts` takes the slot tiles rather than
/// the per-slot kernels. The per-slot kernels read an expert once per slot but move each byte
/// faster (two tiles a warp, no grouping); the tiles read it once per 8 of its slots. So the
/// tiles pay from [`SLOT_TILES_MIN_TOKENS`] tokens once the slots are at least half the
/// experts, where about a fifth of them share an expert with another (at `s` slots over `e`
/// experts, `e·(1 − e^(−s/e))` distinct). One H200, per-slot against tiles, tok/s: gpt-oss-120b
/// (128 experts) at 8 streams 978.9 / 852.4, at 16 1,120.7 / 1,112.9, at 12 (a graph of 16)
/// 892.5 / 981.7, at 32 1,242.9 / 1,520.1; gpt-oss-20b (32 experts) at 8 streams 1,474.2 /
/// 1,678.0, at 4 1,151.5 / 1,109.7.
pub(crate) fn slot_tiles_pay(tokens: usize, k: usize, experts: usize) -> bool {
    tokens >= SLOT_TILES_MIN_TOKENS && 2 * tokens * k >= experts
}

/// The slot tiles' size (`moe_st_gate_up`: 8 columns of one slot each; `moe_st_down`: 24 columns,
/// 3 pieces a slot).
const SLOT_TILE: usize = 8;
/// From this many tokens bf16 batches go to the grouped tensor-core GEMMs (tiles of 64 slots).
/// Measured on the H100 (`gpu_moe_timing`, one gpt-oss-20b layer, slot tiles / grouped, µs):
/// 353.3 / 400.3 at 64 tokens, 591.0 / 470.5 at 128, 1,029 / 589 at 256. Each tile decodes its
/// expert's weights again, so the tiles' time grows with them, and the lines cross near 82
/// tokens. Below 128 the tiles are kept all the same: up to ~25% more MoE time for steps of
/// 82–127 tokens buys a token the same bits in any batch (`kernels::invariance`).
pub(crate) const GROUPED_MIN_TOKENS: usize = 128;

/// moe_grouped.cu's tiles (BM slots) and its expert limit.
const BM: usize = shared_memory::GROUPED_TILE;
/// A grouped kernel variant `(MT, STAGES)`: warps of MT tiles of 16 weight rows (blocks of 4
/// warps), STAGES stages of slot rows in flight (256 bytes per slot row each, twice for down's hi
/// and lo, in shared memory). Measured on the H100 (`gpu_moe_timing`, one gpt-oss-20b layer at
/// 512 / 128 tokens, µs): (2, 2) 849.5 / 470.7, (2, 3) 861.0 / 478.1, (1, 3) 964.6 / 577.6; 4
/// stages were slower still, and so were register caps for 3 or 4 blocks per multiprocessor
/// (they spill): (2, 2) capped for 3 blocks 958.8 / 537.0. Registers per thread (gate_up, down;
/// sm_90, nvcc 13.0): (2, 2) 200, 204; (2, 3) 206, 206; (1, 3) 144, 155.
pub(super) type GroupedVariant = (usize, usize);
pub(super) const GROUPED_VARIANTS: [GroupedVariant; 3] = [(2, 2), (2, 3), (1, 3)];
const GROUPED_DEFAULT: GroupedVariant = (2, 2);
const GROUPED_MAX_EXPERTS: usize = 1024;

/// The layer's packed weights as device views.
struct Packed<'a> {
    gu_blocks: CudaView<'a, u8>,
    gu_scales: CudaView<'a, u8>,
    gu_bias: CudaView<'a, f32>,
    d_blocks: CudaView<'a, u8>,
    d_scales: CudaView<'a, u8>,
    d_bias: CudaView<'a, f32>,
}

/// Everything one call's kernels read: the op, the device, the routed inputs and the weights.
struct Call<'a, T> {
    op: &'a Mxfp4Moe,
    dev: &'a CudaDevice,
    x: &'a CudaView<'a, T>,
    ids: &'a CudaView<'a, u32>,
    weights: &'a CudaView<'a, f32>,
    p: &'a Packed<'a>,
    d: Dims,
}

/// Sizes of one call.
#[derive(Clone, Copy)]
struct Dims {
    tokens: usize,
    k: usize,
    experts: usize,
    hidden: usize,
    inter: usize,
}

impl Dims {
    fn slots(self) -> usize {
        self.tokens * self.k
    }

    /// k, experts, hidden and intermediate as the kernels' `int`s.
    fn ints(self) -> Result<(i32, i32, i32, i32)> {
        Ok((
            int(self.k, "k")?,
            int(self.experts, "experts")?,
            int(self.hidden, "hidden")?,
            int(self.inter, "intermediate")?,
        ))
    }
}

pub(super) fn launch<T: KernelFloat>(
    op: &Mxfp4Moe,
    dev: &CudaDevice,
    (x, xl): (&CudaSlice<T>, &Layout),
    (ids, il): (&CudaStorage, &Layout),
    (weights, wl): (&CudaStorage, &Layout),
) -> Result<CudaStorageSlice> {
    if !il.is_contiguous() || !wl.is_contiguous() {
        bail!("mxfp4_moe: expert ids and routing weights must be contiguous");
    }
    let ids = ids.as_cuda_slice::<u32>()?.slice(il.start_offset()..);
    let weights = weights.as_cuda_slice::<f32>()?.slice(wl.start_offset()..);
    launch_routed(op, dev, (x, xl), &ids, &weights, il.shape().dims2()?.1)
}

/// The experts for `x` with routing already on the device: ids and weights `[tokens, k]`.
pub(super) fn launch_routed<T: KernelFloat>(
    op: &Mxfp4Moe,
    dev: &CudaDevice,
    (x, xl): (&CudaSlice<T>, &Layout),
    ids: &CudaView<u32>,
    weights: &CudaView<f32>,
    k: usize,
) -> Result<CudaStorageSlice> {
    let e = &op.experts;
    let (tokens, hidden) = xl.shape().dims2()?;
    let d = Dims { tokens, k, experts: e.experts, hidden, inter: e.intermediate };
    if !xl.is_contiguous() {
        bail!("mxfp4_moe: x must be contiguous");
    }
    let x = x.slice(xl.start_offset()..);
    let guards = [
        &e.gate_up_blocks,
        &e.gate_up_scales,
        &e.gate_up_bias,
        &e.down_blocks,
        &e.down_scales,
        &e.down_bias,
    ]
    .map(|t| t.storage_and_layout());
    let p = Packed {
        gu_blocks: cuda_view::<u8>(&guards[0].0, guards[0].1, "gate_up blocks")?,
        gu_scales: cuda_view::<u8>(&guards[1].0, guards[1].1, "gate_up scales")?,
        gu_bias: cuda_view::<f32>(&guards[2].0, guards[2].1, "gate_up bias")?,
        d_blocks: cuda_view::<u8>(&guards[3].0, guards[3].1, "down blocks")?,
        d_scales: cuda_view::<u8>(&guards[4].0, guards[4].1, "down scales")?,
        d_bias: cuda_view::<f32>(&guards[5].0, guards[5].1, "down bias")?,
    };
    let call = Call { op, dev, x: &x, ids, weights, p: &p, d };
    // 16-byte loads of x rows need an 8-aligned start (candle's buffers themselves are aligned).
    let tiled = T::BF16 && hidden % 8 == 0 && xl.start_offset() % 8 == 0;
    let path = match op.force_path {
        Some(path) if tiled || path == Path::PerSlot => path,
        Some(path) => bail!("mxfp4_moe: the {path:?} path needs bf16 x with 16-byte aligned rows"),
        None if !tiled => Path::PerSlot,
        None if !slot_tiles_pay(tokens, k, e.experts) => Path::SlotMma,
        None if tokens < GROUPED_MIN_TOKENS => Path::SlotTiles,
        None => Path::Grouped,
    };
    // The slot kernel adds the slots itself where it can (moe_sum's launch saved).
    if path == Path::SlotMma
        && !op.separate_sum
        && tokens * hidden.div_ceil(SLOT_MMA_ROWS) <= COUNTERS
        && let Some(counters) = counters(dev)
    {
        return Ok(if op.out_f32 {
            f32::wrap(slot_mma_summed(&call, counters)?)
        } else {
            T::wrap(slot_mma_summed(&call, counters)?)
        });
    }
    let part = match path {
        Path::PerSlot => per_slot(&call)?,
        Path::SlotMma => slot_mma::<T, f32>(&call, None)?,
        Path::SlotTiles => slot_tiles(&call)?,
        Path::Grouped => by_expert(&call)?,
    };

    Ok(if op.out_f32 {
        f32::wrap(sum(op, dev, &part, ids, d)?)
    } else {
        T::wrap(sum(op, dev, &part, ids, d)?)
    })
}

/// `out[t] = Σ_k part[t·k + kk]` in slot order, in the output dtype `O`.
fn sum<O: KernelFloat>(
    op: &Mxfp4Moe,
    dev: &CudaDevice,
    part: &CudaSlice<f32>,
    ids: &CudaView<u32>,
    d: Dims,
) -> Result<CudaSlice<O>> {
    let mut out = output::<O>(dev, d.tokens * d.hidden, op.poison)?;
    let func = fatbin::mxfp4_moe::MXFP4_MOE.func(dev, &format!("moe_sum_{}", O::NAME))?;
    let (t32, k32, h32, e32) = (
        int(d.tokens, "tokens")?,
        int(d.k, "k")?,
        int(d.hidden, "hidden")?,
        int(d.experts, "experts")?,
    );
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(part).ptr(ids).ptr_mut(&mut out).val(t32).val(k32).val(h32).val(e32);
    let n = d.tokens * d.hidden;
    let grid = LaunchConfig {
        grid_dim: (int(n.div_ceil(256), "blocks")? as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match moe_sum's signature; it reads only the part rows of valid slots,
    // which every path writes, and waits (PDL) before reading anything.
    unsafe { b.launch(grid) }?;
    drop(b);
    Ok(out)
}

/// The GEMVs: every (token, slot) reads its expert's rows. Returns part `[slots, H]`.
fn per_slot<T: KernelFloat>(c: &Call<T>) -> Result<CudaSlice<f32>> {
    let Call { op, dev, x, ids, weights, p, d } = *c;
    if d.hidden > MAX_K || d.inter > MAX_K {
        bail!(
            "mxfp4_moe: the CUDA kernels support widths up to {MAX_K}, got hidden {}, intermediate {}",
            d.hidden,
            d.inter
        );
    }
    let slots = d.slots();
    let (k32, n_exp, h32, i32_) = d.ints()?;
    // Warps along K (one block of 32 inputs per lane), and the inputs staged in shared memory
    // as f32, each block of 32 padded to 36 (XPAD in the kernel).
    let rows_per_block = if d.tokens <= SMALL_BATCH { 16 } else { 32 };
    let variant = format!("r{rows_per_block}");
    let launch_cfg = |rows: usize, width: usize| -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (int(slots, "tokens × k")? as u32, (rows / rows_per_block) as u32, 1),
            block_dim: (32, width.div_ceil(32 * 32) as u32, 1),
            shared_mem_bytes: shared_memory::moe_inputs(width) as u32,
        })
    };
    // SAFETY (both): moe_gate_up writes every element of act, moe_down every element of part.
    let mut act = unsafe { dev.alloc::<f32>(slots * d.inter)? };
    let mut part = unsafe { dev.alloc::<f32>(slots * d.hidden)? };

    let stream = dev.cuda_stream();
    let func =
        fatbin::mxfp4_moe::MXFP4_MOE.func(dev, &format!("moe_gate_up_{}_{variant}", T::NAME))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(x).ptr(ids).ptr(&p.gu_blocks).ptr(&p.gu_scales).ptr(&p.gu_bias).ptr_mut(&mut act);
    b.val(k32).val(n_exp).val(h32).val(i32_).val(op.act.limit).val(op.act.alpha);
    // SAFETY: the arguments match moe_gate_up's signature; shapes were checked in Mxfp4Experts::new.
    // It waits (PDL) before anything else.
    unsafe { b.launch(launch_cfg(2 * d.inter, d.hidden)?) }?;
    drop(b);

    let func = fatbin::mxfp4_moe::MXFP4_MOE.func(dev, &format!("moe_down_{variant}"))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(&act).ptr(ids).ptr(weights).ptr(&p.d_blocks).ptr(&p.d_scales).ptr(&p.d_bias);
    b.ptr_mut(&mut part).val(n_exp).val(h32).val(i32_);
    // SAFETY: the arguments match moe_down's signature; it waits (PDL) before anything else.
    unsafe { b.launch(launch_cfg(d.hidden, d.inter)?) }?;
    drop(b);
    Ok(part)
}

/// [`slot_mma`] with the sum over each token's slots in its down kernel: the output `[T, H]`.
fn slot_mma_summed<T: KernelFloat, O: KernelFloat>(
    c: &Call<T>,
    counters: u64,
) -> Result<CudaSlice<O>> {
    let mut out = output::<O>(c.dev, c.d.tokens * c.d.hidden, c.op.poison)?;
    slot_mma(c, Some((&mut out, counters)))?;
    Ok(out)
}

/// The GEMVs per (token, slot) on tensor cores (bf16 x with 16-byte aligned rows): gate_up leaves
/// the activations as bf16 hi, mid and lo `[slots, 3, I]`, down the routing-weighted rows in
/// part `[slots, H]`. With `summed` (the output `[T, H]` and zeroed counters), the last of a
/// token's k down blocks of each row tile also writes the sum over the token's slots, as moe_sum
/// would (moe_slot_mma.cu).
fn slot_mma<T: KernelFloat, O: KernelFloat>(
    c: &Call<T>,
    summed: Option<(&mut CudaSlice<O>, u64)>,
) -> Result<CudaSlice<f32>> {
    let Call { op, dev, x, ids, weights, p, d } = *c;
    let slots = d.slots();
    let (k32, n_exp, h32, i32_) = d.ints()?;
    // Two tiles of 16 rows per warp (moe_slot_mma.cu's *_TWO_TILES: half the blocks, fewer
    // waves); one with the op's `one_tile` (tests: the same bits). H and 2I are multiples of the
    // 32 rows (Mxfp4Experts::new: H = 32 × its blocks along K, I a multiple of 32).
    let tiles = if op.one_tile { 1 } else { 2 };
    let cfg = |rows: usize, warps: u32| -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (
                int(slots, "tokens × k")? as u32,
                int(rows / (tiles * SLOT_MMA_ROWS), "row blocks")? as u32,
                1,
            ),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        })
    };
    // SAFETY (both): moe_sm_gate_up writes every element of act, moe_sm_down every one of part.
    let mut act = unsafe { dev.alloc::<bf16>(slots * 3 * d.inter)? };
    let mut part = unsafe { dev.alloc::<f32>(slots * d.hidden)? };
    let suffix = if tiles == 2 { "_t2" } else { "" };
    let name = |what: &str, warps: u32| format!("moe_sm_{what}_w{warps}{suffix}");
    let down_w = down_warps(d.inter);
    let stream = dev.cuda_stream();
    let func = fatbin::mxfp4_moe::MOE_SLOT_MMA.func(dev, &name("gate_up", SLOT_MMA_WARPS))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(x).ptr(ids).ptr(&p.gu_blocks).ptr(&p.gu_scales).ptr(&p.gu_bias).ptr_mut(&mut act);
    b.val(k32).val(n_exp).val(h32).val(i32_).val(op.act.limit).val(op.act.alpha);
    // SAFETY: the arguments match moe_sm_gate_up's signature; x is bf16 with 16-byte aligned rows
    // (checked by the caller), 2I and H are multiples of the block's rows (above). It waits
    // (PDL) before reading anything.
    unsafe { b.launch(cfg(2 * d.inter, SLOT_MMA_WARPS)?) }?;
    drop(b);
    let func = fatbin::mxfp4_moe::MOE_SLOT_MMA.func(dev, &name("down", down_w))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(&act).ptr(ids).ptr(weights).ptr(&p.d_blocks).ptr(&p.d_scales).ptr(&p.d_bias);
    b.ptr_mut(&mut part).val(n_exp).val(h32).val(i32_).val(k32);
    match summed {
        Some((out, counters)) => b.ptr_mut(out).val(i32::from(O::BF16)).val(counters),
        None => b.null().val(0i32).null(),
    };
    // SAFETY: the arguments match moe_sm_down's signature. Before its PDL wait it reads only the
    // weights and the routing, which moe_sm_gate_up waited for before letting it start. With
    // counters: out holds T·H values of O, and the buffer a zeroed counter for every (token, row
    // tile) of the grid (checked against COUNTERS by the caller).
    unsafe { b.launch(cfg(d.hidden, down_w)?) }?;
    drop(b);
    Ok(part)
}

/// The slots grouped by expert in tiles of up to [`SLOT_TILE`], each computed as
/// [`slot_mma`] computes it alone (`moe_slot_mma.cu`'s slot tiles): part `[slots, H]`, rows of
/// slots routed to no valid expert unwritten (moe_sum skips them).
fn slot_tiles<T: KernelFloat>(c: &Call<T>) -> Result<CudaSlice<f32>> {
    let Call { op, dev, x, ids, weights, p, d } = *c;
    let g = group(dev, ids, d, SLOT_TILE)?;
    let slots = d.slots();
    let (k32, n_exp, h32, i32_) = d.ints()?;
    // Two tiles of 16 rows per warp, as the slot kernels (*_TWO_TILES).
    let cfg = |rows: usize, warps: u32| -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (
                int(g.max_tiles, "tiles")? as u32,
                int(rows / (2 * SLOT_MMA_ROWS), "row blocks")? as u32,
                1,
            ),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        })
    };
    // SAFETY: moe_st_gate_up writes act's rows of every grouped slot, and moe_st_down reads only
    // those; part is poisoned for tests (rows of slots routed to no valid expert stay unwritten,
    // and moe_sum skips them).
    let mut act = unsafe { dev.alloc::<bf16>(slots * 3 * d.inter)? };
    let mut part = output::<f32>(dev, slots * d.hidden, op.poison)?;
    let stream = dev.cuda_stream();
    let func = fatbin::mxfp4_moe::MOE_SLOT_MMA.func(dev, "moe_st_gate_up")?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(x).ptr(ids).ptr(&g.sorted).ptr(&g.tiles);
    b.ptr(&p.gu_blocks).ptr(&p.gu_scales).ptr(&p.gu_bias).ptr_mut(&mut act);
    b.val(k32).val(n_exp).val(h32).val(i32_).val(op.act.limit).val(op.act.alpha);
    // SAFETY: the arguments match moe_st_gate_up's signature; x is bf16 with 16-byte aligned
    // rows (checked by the caller), 2I and H multiples of the block's 32 rows (Mxfp4Experts::new).
    // It waits (PDL) before reading anything.
    unsafe { b.launch(cfg(2 * d.inter, SLOT_MMA_WARPS)?) }?;
    drop(b);
    let down_w = down_warps(d.inter);
    let func = fatbin::mxfp4_moe::MOE_SLOT_MMA.func(dev, &format!("moe_st_down_w{down_w}"))?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(&act).ptr(ids).ptr(&g.sorted).ptr(&g.tiles).ptr(weights);
    b.ptr(&p.d_blocks).ptr(&p.d_scales).ptr(&p.d_bias).ptr_mut(&mut part);
    b.val(n_exp).val(h32).val(i32_).val(k32).null().val(0i32).null();
    // SAFETY: the arguments match moe_st_down's signature (no counters: moe_sum adds the slots).
    // Before its PDL wait it reads only the weights, the routing and the grouping, which
    // moe_st_gate_up waited for.
    unsafe { b.launch(cfg(d.hidden, down_w)?) }?;
    drop(b);
    Ok(part)
}

/// The slots grouped by expert on the device (`moe_group`): `sorted[p]` the slot at grouped
/// position p, `tiles` `[max_tiles, 3]` (expert or −1, first position, slot count ≤ `tile`).
struct Groups {
    sorted: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    max_tiles: usize,
}

fn group(dev: &CudaDevice, ids: &CudaView<u32>, d: Dims, tile: usize) -> Result<Groups> {
    if d.experts > GROUPED_MAX_EXPERTS {
        bail!(
            "mxfp4_moe: the grouped kernels support up to {GROUPED_MAX_EXPERTS} experts, got {}",
            d.experts
        );
    }
    let slots = d.slots();
    // Each expert's slots are cut into tiles; at most one partial tile per expert.
    let max_tiles = slots.div_ceil(tile) + d.experts;
    // SAFETY (both): moe_group writes sorted[0..n] for the n validly routed slots and every tile
    // entry; the kernels after it read only those.
    let mut sorted = unsafe { dev.alloc::<i32>(slots)? };
    let mut tiles = unsafe { dev.alloc::<i32>(3 * max_tiles)? };
    let (s32, e32, t32, bm) = (
        int(slots, "tokens × k")?,
        int(d.experts, "experts")?,
        int(max_tiles, "tiles")?,
        int(tile, "tile")?,
    );
    let func = fatbin::mxfp4_moe::MOE_GROUPED.func(dev, "moe_group")?;
    let stream = dev.cuda_stream();
    let mut b = Launch::new(&stream, &func);
    b.ptr(ids).val(s32).val(e32).ptr_mut(&mut sorted).ptr_mut(&mut tiles).val(t32).val(bm);
    let one_block =
        LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match moe_group's signature; experts ≤ its shared-memory limit. It
    // waits (PDL) before anything else.
    unsafe { b.launch(one_block) }?;
    drop(b);
    Ok(Groups { sorted, tiles, max_tiles })
}

/// [`group`] of `ids` (an expert id a slot; ids from `experts` on are routed nowhere) on `dev`,
/// read back: the slots in grouped order (as many as are routed) and the tiles `[max_tiles, 3]`.
#[cfg(test)]
pub(super) fn group_ids(
    dev: &CudaDevice,
    ids: &[u32],
    experts: usize,
    tile: usize,
) -> Result<(Vec<i32>, Vec<i32>)> {
    use candle_core::cuda_backend::WrapErr;
    let stream = dev.cuda_stream();
    let on_dev = stream.clone_htod(ids).w()?;
    let d = Dims { tokens: ids.len(), k: 1, experts, hidden: 0, inter: 0 };
    let g = group(dev, &on_dev.slice(..), d, tile)?;
    let routed = ids.iter().filter(|&&e| (e as usize) < experts).count();
    let sorted = stream.clone_dtoh(&g.sorted.slice(..routed)).w()?;
    Ok((sorted, stream.clone_dtoh(&g.tiles).w()?))
}

/// Batched by expert on tensor cores (bf16 x only): group the slots by expert on the device,
/// then one GEMM tile per (expert's slots, weight rows). Returns part `[slots, H]`, whose rows
/// of slots routed to no valid expert stay unwritten (moe_sum skips them). The activations
/// between the two projections travel as bf16 hi + lo (16 significant bits): with hi alone the
/// 20b-shaped agreement test lost 3 points (88.7% → 85.7%).
fn by_expert<T: KernelFloat>(c: &Call<T>) -> Result<CudaSlice<f32>> {
    let (mt, stages) = c.op.grouped_variant.unwrap_or(GROUPED_DEFAULT);
    if !GROUPED_VARIANTS.contains(&(mt, stages)) {
        bail!("mxfp4_moe: no grouped variant {:?} (MT, STAGES)", (mt, stages));
    }
    let kernels = GroupKernels {
        fatbin: &fatbin::mxfp4_moe::MOE_GROUPED,
        gate_up: format!("moe_grouped_gate_up_m{mt}_s{stages}"),
        down: format!("moe_grouped_down_m{mt}_s{stages}"),
        rows_per_block: 64 * mt,
        threads: 128,
        shared: [
            shared_memory::moe_grouped(stages, false),
            shared_memory::moe_grouped(stages, true),
        ],
    };
    project_groups(c, group(c.dev, c.ids, c.d, BM)?, &kernels)
}

/// A pair of kernels over slots grouped by expert ([`group`]): gate_up (bias, clamped SwiGLU,
/// activations as bf16 hi + lo), then down (bias, routing weight) into part (the grouped GEMMs'
/// variants).
struct GroupKernels {
    fatbin: &'static Fatbin,
    gate_up: String,
    down: String,
    /// Weight rows one block covers (the grid's second dimension).
    rows_per_block: usize,
    threads: u32,
    /// Dynamic shared memory of gate_up and of down, bytes.
    shared: [usize; 2],
}

/// Runs `k` over the tiles of `g`; returns part `[slots, H]`.
fn project_groups<T: KernelFloat>(
    c: &Call<T>,
    g: Groups,
    k: &GroupKernels,
) -> Result<CudaSlice<f32>> {
    let Call { op, dev, x, weights, p, d, .. } = *c;
    let Groups { sorted, tiles, max_tiles } = g;
    let slots = d.slots();
    // The kernels write act's and part's rows of the validly routed slots and read only those
    // (poisoned for tests, so that a missed element shows).
    let mut act_hi = output::<bf16>(dev, slots * d.inter, op.poison)?;
    let mut act_lo = output::<bf16>(dev, slots * d.inter, op.poison)?;
    let mut part = output::<f32>(dev, slots * d.hidden, op.poison)?;
    let t32 = int(max_tiles, "tiles")?;
    let (k32, h32, i32_) =
        (int(d.k, "k")?, int(d.hidden, "hidden")?, int(d.inter, "intermediate")?);
    let grid = |rows: usize, shared: usize| -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (t32 as u32, int(rows.div_ceil(k.rows_per_block), "row blocks")? as u32, 1),
            block_dim: (k.threads, 1, 1),
            shared_mem_bytes: int(shared, "shared memory")? as u32,
        })
    };
    let stream = dev.cuda_stream();
    let func = k.fatbin.func(dev, &k.gate_up)?;
    allow_shared(dev, &func, &k.gate_up, k.shared[0])?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(x).ptr(&sorted).ptr(&tiles).ptr(&p.gu_blocks).ptr(&p.gu_scales).ptr(&p.gu_bias);
    b.ptr_mut(&mut act_hi).ptr_mut(&mut act_lo);
    b.val(k32).val(h32).val(i32_).val(op.act.limit).val(op.act.alpha);
    // SAFETY: the arguments match the kernel's signature; x is bf16 (T::BF16) with 16-byte
    // aligned rows (hidden % 8 == 0, checked by the caller), act rows likewise (I % 32 == 0).
    // It waits (PDL) before anything else.
    unsafe { b.launch(grid(2 * d.inter, k.shared[0])?) }?;
    drop(b);

    let func = k.fatbin.func(dev, &k.down)?;
    allow_shared(dev, &func, &k.down, k.shared[1])?;
    let mut b = Launch::new(&stream, &func);
    b.ptr(&act_hi).ptr(&act_lo).ptr(&sorted).ptr(&tiles).ptr(weights);
    b.ptr(&p.d_blocks).ptr(&p.d_scales).ptr(&p.d_bias).ptr_mut(&mut part);
    b.val(h32).val(i32_);
    // SAFETY: the arguments match the kernel's signature; it waits (PDL) before anything else.
    unsafe { b.launch(grid(d.hidden, k.shared[1])?) }?;
    drop(b);
    Ok(part)
}
