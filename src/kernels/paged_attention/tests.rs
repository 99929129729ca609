//! The CPU reference against the naive formulation run per sequence over contiguous copies of
//! its keys and values, then the CUDA kernels against the reference.

use candle_core::{DType, Device, Tensor};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::*;
use crate::kernels::kv_fp8::Codes;
use crate::kernels::testing::{rel_err, rng, tensor, uniform, values};

/// One batch's shape: heads, the pool's geometry and the sequences `(q_len, q_pos)`.
#[derive(Debug, Clone)]
struct Batch {
    heads: usize,
    kv_heads: usize,
    d: usize,
    block_size: usize,
    window: Option<usize>,
    sinks: bool,
    seqs: Vec<(usize, usize)>,
    /// Block-table width and pool blocks, when fixed (graph replays); else what the batch needs
    /// plus a little garbage.
    fixed: Option<(usize, usize)>,
}

impl Batch {
    fn new(heads: usize, kv_heads: usize, d: usize, block_size: usize) -> Self {
        Batch {
            heads,
            kv_heads,
            d,
            block_size,
            window: None,
            sinks: true,
            seqs: Vec::new(),
            fixed: None,
        }
    }
    fn window(self, w: Option<usize>) -> Self {
        Batch { window: w, ..self }
    }
    fn sinks(self, sinks: bool) -> Self {
        Batch { sinks, ..self }
    }
    /// `n` sequences: decode steps, empty ones (padding) and chunks of up to `max_q` queries, at
    /// positions below `max_pos`.
    fn random(self, rng: &mut StdRng, n: usize, max_q: usize, max_pos: usize) -> Self {
        let mut seqs: Vec<(usize, usize)> = (0..n)
            .map(|_| {
                let q_len = match rng.random_range(0..4) {
                    0 => 1,
                    1 if n > 1 => 0,
                    _ => rng.random_range(1..=max_q),
                };
                (q_len, rng.random_range(0..max_pos))
            })
            .collect();
        if seqs.iter().all(|s| s.0 == 0) {
            seqs[0].0 = 1; // at least one query
        }
        Batch { seqs, ..self }
    }
    fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }
    fn bounds(&self) -> PagedBounds {
        PagedBounds {
            max_q_len: self.seqs.iter().map(|s| s.0).max().unwrap_or(0).max(1),
            max_context: self.seqs.iter().map(|s| s.0 + s.1).max().unwrap_or(0).max(1),
        }
    }
    fn cfg(&self) -> PagedAttnConfig {
        PagedAttnConfig {
            block_size: self.block_size,
            window: self.window,
            scale: 1.0 / (self.d as f32).sqrt(),
            release_first: false,
        }
    }
    /// The first position any query of sequence `(q_len, q_pos)` sees.
    fn first_key(&self, q_pos: usize) -> usize {
        self.window.map_or(0, |w| (q_pos + 1).saturating_sub(w))
    }
}

/// A batch's tensors (CPU, in `dtype`), and per sequence its keys and values as contiguous
/// `[kv_heads, context, d]` caches (slot = position) for the naive formulation.
struct Inputs {
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    /// FP8 pools' scales.
    scales: Option<(Tensor, Tensor)>,
    sinks: Option<Tensor>,
    cu_q: Tensor,
    q_pos: Tensor,
    tables: Tensor,
    k_seq: Vec<Tensor>,
    v_seq: Vec<Tensor>,
}

/// Random inputs: the pool's blocks are handed out in shuffled order, block-table entries the
/// queries never need (before the window, past the context) are u32::MAX, and every pool slot
/// that holds no visible key is NaN, as are the contiguous copies' unseen positions.
fn inputs(rng: &mut StdRng, b: &Batch, dtype: DType) -> Inputs {
    let (bs, kv, d) = (b.block_size, b.kv_heads, b.d);
    let needed: Vec<(usize, usize)> = // (first block used, blocks to the context's end)
        b.seqs.iter().map(|&(l, p)| (b.first_key(p) / bs, (p + l).div_ceil(bs))).collect();
    let (max_blocks, num_blocks) = b.fixed.unwrap_or_else(|| {
        let used: usize = needed.iter().map(|(a, z)| z - a).sum();
        (needed.iter().map(|n| n.1).max().unwrap_or(0) + rng.random_range(1..3), used + 3)
    });
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut free = ids.into_iter();
    let row = kv * d;
    let (mut k_pool, mut v_pool) =
        (vec![f32::NAN; num_blocks * bs * row], vec![f32::NAN; num_blocks * bs * row]);
    let (mut tables, mut k_seq, mut v_seq) = (Vec::new(), Vec::new(), Vec::new());
    for (&(q_len, q_pos), &(first, end)) in b.seqs.iter().zip(&needed) {
        let context = q_pos + q_len;
        let mut table = vec![u32::MAX; max_blocks];
        for entry in &mut table[first..end] {
            *entry = free.next().expect("enough pool blocks");
        }
        let (mut ks, mut vs) = (vec![f32::NAN; kv * context * d], vec![f32::NAN; kv * context * d]);
        for t in b.first_key(q_pos)..context {
            let slot = table[t / bs] as usize * bs + t % bs;
            for g in 0..kv {
                let (kx, vx) = (uniform(rng, d, -2.0, 2.0), uniform(rng, d, -2.0, 2.0));
                k_pool[(slot * kv + g) * d..][..d].copy_from_slice(&kx);
                v_pool[(slot * kv + g) * d..][..d].copy_from_slice(&vx);
                ks[(g * context + t) * d..][..d].copy_from_slice(&kx);
                vs[(g * context + t) * d..][..d].copy_from_slice(&vx);
            }
        }
        k_seq.push(tensor(ks, &[kv, context, d], dtype));
        v_seq.push(tensor(vs, &[kv, context, d], dtype));
        tables.extend(table);
    }
    let tokens = b.tokens();
    let cu: Vec<u32> = std::iter::once(0)
        .chain(b.seqs.iter().scan(0u32, |acc, s| {
            *acc += s.0 as u32;
            Some(*acc)
        }))
        .collect();
    let u32s = |v: Vec<u32>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let pool_shape = [num_blocks * bs, kv, d];
    Inputs {
        q: tensor(uniform(rng, tokens * b.heads * d, -2.0, 2.0), &[tokens, b.heads, d], dtype),
        k_pool: tensor(k_pool, &pool_shape, dtype),
        v_pool: tensor(v_pool, &pool_shape, dtype),
        scales: None,
        sinks: b.sinks.then(|| tensor(uniform(rng, b.heads, -2.0, 2.0), &[b.heads], DType::F32)),
        cu_q: u32s(cu, &[b.seqs.len() + 1]),
        q_pos: u32s(b.seqs.iter().map(|s| s.1 as u32).collect(), &[b.seqs.len()]),
        tables: u32s(tables, &[b.seqs.len(), max_blocks]),
        k_seq,
        v_seq,
    }
}

fn run(x: &Inputs, b: &Batch, bounds: PagedBounds) -> candle_core::Result<Tensor> {
    paged_attention(
        &x.q,
        &x.k_pool,
        &x.v_pool,
        x.scales.as_ref().map(|(k, v)| (k, v)),
        x.sinks.as_ref(),
        &x.cu_q,
        &x.q_pos,
        &x.tables,
        bounds,
        &b.cfg(),
    )
}

/// The naive formulation, in f64, per sequence over the contiguous copies of its keys and
/// values: per (query, head), a row of logits over every key with −∞ where masked, the sink
/// appended as one more column (none: no column), a plain softmax, the sink column dropped, then
/// the product with V. Rows in `[T, heads, d]` order.
fn naive(x: &Inputs, b: &Batch) -> Vec<f32> {
    let (heads, d) = (b.heads, b.d);
    let f64s = |t: &Tensor| -> Vec<f64> { values(t).into_iter().map(f64::from).collect() };
    let sinks = x.sinks.as_ref().map(f64s);
    let q = f64s(&x.q); // [T, heads, d]
    let scale = f64::from(b.cfg().scale);
    let mut out = Vec::with_capacity(b.tokens() * heads * d);
    let mut row0 = 0;
    for (s, &(q_len, q_pos)) in b.seqs.iter().enumerate() {
        let (k, v) = (f64s(&x.k_seq[s]), f64s(&x.v_seq[s])); // [kv_heads, context, d]
        let context = q_pos + q_len;
        for i in 0..q_len {
            let p = q_pos + i;
            for h in 0..heads {
                let g = h / (heads / b.kv_heads);
                let qi = &q[((row0 + i) * heads + h) * d..][..d];
                let key = |t: usize| &k[(g * context + t) * d..][..d];
                let mut logits: Vec<f64> = (0..context)
                    .map(|t| match t <= p && b.window.is_none_or(|w| p - t < w) {
                        true => scale * qi.iter().zip(key(t)).map(|(a, c)| a * c).sum::<f64>(),
                        false => f64::NEG_INFINITY,
                    })
                    .collect();
                logits.extend(sinks.as_ref().map(|s| s[h]));
                let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                let mut o = vec![0f64; d];
                for (t, w) in exps[..context].iter().enumerate().filter(|(_, w)| **w > 0.0) {
                    let val = &v[(g * context + t) * d..][..d];
                    o.iter_mut().zip(val).for_each(|(o, x)| *o += w / total * x);
                }
                out.extend(o.into_iter().map(|x| x as f32));
            }
        }
        row0 += q_len;
    }
    out
}

fn check_cpu(name: &str, b: &Batch, dtype: DType, tol: f64) {
    let mut rng = rng(name);
    let x = inputs(&mut rng, b, dtype);
    let got = values(&run(&x, b, b.bounds()).unwrap_or_else(|e| panic!("{name} {b:?}: {e}")));
    assert!(got.iter().all(|v| v.is_finite()), "{name} {b:?}: non-finite output");
    let err = rel_err(&got, &naive(&x, b));
    assert!(err < tol, "{name} {b:?}: relative error {err:e}");
}

#[test]
fn reference_matches_naive_per_sequence() {
    let mut r = rng("paged shapes");
    for (heads, kv_heads, d) in [(4, 2, 8), (6, 1, 16), (3, 3, 8), (8, 2, 16)] {
        for window in [None, Some(r.random_range(1..20))] {
            for sinks in [true, false] {
                let bs = [1, 4, 5, 16][r.random_range(0..4)];
                let n = r.random_range(1..7);
                let b = Batch::new(heads, kv_heads, d, bs)
                    .window(window)
                    .sinks(sinks)
                    .random(&mut r, n, 40, 90);
                check_cpu("paged reference", &b, DType::F32, 1e-5);
            }
        }
    }
}

#[test]
fn reference_matches_naive_bf16_and_decode() {
    let mut r = rng("paged decode shapes");
    let decode = Batch::new(8, 2, 16, 16).random(&mut r, 9, 1, 200);
    check_cpu("paged decode", &decode, DType::F32, 1e-5);
    check_cpu("paged decode window", &decode.clone().window(Some(7)), DType::F32, 1e-5);
    let b = Batch::new(4, 2, 16, 4).window(Some(10)).random(&mut r, 5, 30, 60);
    check_cpu("paged bf16", &b, DType::BF16, 1e-2);
    check_cpu("paged bf16 no sinks", &b.sinks(false), DType::BF16, 1e-2);
}

#[test]
fn empty_batches_and_padding_sequences() {
    let mut r = rng("paged empty");
    let mut b = Batch::new(4, 2, 8, 4);
    b.seqs = vec![(0, 5), (3, 0), (0, 0), (1, 9)];
    check_cpu("paged padding", &b, DType::F32, 1e-5);
    b.seqs = vec![(0, 5), (0, 0)];
    let x = inputs(&mut r, &b, DType::F32);
    assert_eq!(run(&x, &b, b.bounds()).unwrap().dims(), [0, 4, 8]);
}

#[test]
fn rejects_bad_metadata() {
    let mut r = rng("paged rejects");
    let mut b = Batch::new(4, 2, 8, 4).window(Some(6));
    b.seqs = vec![(3, 10), (1, 20)];
    let x = inputs(&mut r, &b, DType::F32);
    // Position 10's window starts at 5 (block 1): block 0's entry is garbage and never read.
    assert_eq!(x.tables.to_vec2::<u32>().unwrap()[0][0], u32::MAX);
    assert!(run(&x, &b, b.bounds()).is_ok());
    let err = |x: &Inputs, bounds| run(x, &b, bounds).unwrap_err().to_string();
    // Bounds below the batch.
    let tight = err(&x, PagedBounds { max_q_len: 2, ..b.bounds() });
    assert!(tight.contains("bounds"), "{tight}");
    let short = err(&x, PagedBounds { max_context: 20, ..b.bounds() });
    assert!(short.contains("bounds"), "{short}");
    // Row offsets that do not rise.
    let bad = Inputs {
        cu_q: Tensor::new(&[0u32, 5, 4], &Device::Cpu).unwrap(),
        ..inputs(&mut r, &b, DType::F32)
    };
    let falls = err(&bad, b.bounds());
    assert!(falls.contains("rise"), "{falls}");
    // A garbage entry where a query needs a key: sequence 1's block of position 20.
    let mut tables = x.tables.to_vec2::<u32>().unwrap();
    tables[1][20 / 4] = u32::MAX;
    let bad = Inputs { tables: Tensor::new(tables, &Device::Cpu).unwrap(), ..x };
    let garbage = err(&bad, b.bounds());
    assert!(garbage.contains("outside"), "{garbage}");
}

/// `x` with its pools as codes and scales ([`crate::kernels::kv_fp8::quantize_pool`]), q in
/// `q_dtype`; and `x` with f32 pools holding the values those codes stand for.
fn coded_inputs(x: Inputs, q_dtype: DType, codes: Codes) -> (Inputs, Inputs) {
    use crate::kernels::kv_fp8::{dequantize_pool, quantize_pool};
    let (kc, ks) = quantize_pool(&x.k_pool, codes, &Device::Cpu).unwrap();
    let (vc, vs) = quantize_pool(&x.v_pool, codes, &Device::Cpu).unwrap();
    let dequantized = Inputs {
        q: x.q.to_dtype(q_dtype).unwrap(),
        k_pool: dequantize_pool(&kc, &ks).unwrap(),
        v_pool: dequantize_pool(&vc, &vs).unwrap(),
        scales: None,
        sinks: x.sinks.clone(),
        cu_q: x.cu_q.clone(),
        q_pos: x.q_pos.clone(),
        tables: x.tables.clone(),
        k_seq: Vec::new(),
        v_seq: Vec::new(),
    };
    let q = x.q.to_dtype(q_dtype).unwrap();
    (Inputs { q, k_pool: kc, v_pool: vc, scales: Some((ks, vs)), ..x }, dequantized)
}

/// Pools of codes: the reference reads the values the codes stand for (the same bits as f32
/// pools holding them), and those are within the codes' precision of the f32 originals (a few
/// percent of the output's norm for E4M3, under one for INT8, at random values with no structure
/// to hide it).
#[test]
fn coded_reference_reads_the_dequantized_pools() {
    let mut r = rng("paged codes");
    for (codes, (heads, kv_heads, d, window, sinks)) in
        [Codes::E4m3, Codes::Int8].into_iter().flat_map(|c| {
            [(4, 2, 16, None, true), (6, 1, 16, Some(9), false), (8, 2, 8, Some(30), true)]
                .map(|shape| (c, shape))
        })
    {
        let b = Batch::new(heads, kv_heads, d, 4).window(window).sinks(sinks);
        let b = b.random(&mut r, 5, 30, 60);
        let x = inputs(&mut r, &b, DType::F32);
        let exact = values(&run(&x, &b, b.bounds()).unwrap());
        let (fp8, dequantized) = coded_inputs(x, DType::F32, codes);
        let got = values(&run(&fp8, &b, b.bounds()).unwrap());
        let want = values(&run(&dequantized, &b, b.bounds()).unwrap());
        assert_eq!(got.len(), want.len());
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{b:?}");
        let err = rel_err(&got, &exact);
        let bound = if codes == Codes::E4m3 { 0.05 } else { 0.01 };
        assert!(err < bound && err > 0.0, "{codes:?} {b:?}: against f32 pools: {err:e}");
    }
}

/// The launch is a function of the sequence count, the shapes and the bounds only: batches with
/// other positions, lengths and tables but the same bounds get the same one; decode splits the
/// keys, long prefill does not.
#[test]
fn launch_depends_on_bounds_only() {
    let mut r = rng("paged launch");
    let bounds = PagedBounds { max_q_len: 1, max_context: 3000 };
    let mut plans = Vec::new();
    for _ in 0..3 {
        let mut b = Batch::new(8, 2, 64, 16);
        b.seqs = (0..4).map(|_| (1, r.random_range(0..2999))).collect();
        b.fixed = Some((3000usize.div_ceil(16), 4 * 3000usize.div_ceil(16)));
        let x = inputs(&mut r, &b, DType::F32);
        let (sinks, scales) = (x.sinks.as_ref(), None);
        let meta = Meta { scales, sinks, cu_q: &x.cu_q, q_pos: &x.q_pos, tables: &x.tables };
        let op =
            PagedAttention::new(&x.q, &x.k_pool, &x.v_pool, meta, bounds, b.cfg(), false).unwrap();
        plans.push(op.plan(4, 132));
    }
    assert!(plans.windows(2).all(|w| w[0] == w[1]), "{plans:?}");
    let decode = plans[0];
    assert_eq!(decode.grid, (4, 2, decode.splits as u32));
    assert!(decode.splits > 1 && decode.combine_blocks == (4 * 8usize).div_ceil(4), "{decode:?}");
    let prefill = |bf16| {
        let bounds = PagedBounds { max_q_len: 600, max_context: 5000 };
        paged_launch(2, 1200, (64, 8, 64, bf16), bounds, None, 132)
    };
    let scalar = prefill(false);
    assert_eq!(scalar.kernel, PagedKernel::Scalar { rows_per_warp: 4 });
    assert_eq!((scalar.splits, scalar.combine_blocks), (1, 0));
    assert_eq!(scalar.grid, (2 * (8 * 600usize).div_ceil(16) as u32, 8, 1));
    // bf16 takes the tensor-core kernel: 8 warps of 16 rows for a prefill, 4 warps sharing a
    // decode step's 8 rows.
    let mma = prefill(true);
    assert_eq!((mma.kernel, mma.splits), (PagedKernel::Mma { warps: 8 }, 1));
    assert_eq!(mma.grid, (2 * (8 * 600usize).div_ceil(128) as u32, 8, 1));
    let step = paged_launch(4, 4, (64, 8, 64, true), bounds, None, 132);
    assert_eq!(step.kernel, PagedKernel::MmaSplitDims);
    assert_eq!(step.grid.0, 4, "one row tile per sequence");
    let short =
        paged_launch(1, 8, (64, 8, 64, true), PagedBounds { max_q_len: 8, ..bounds }, None, 132);
    assert_eq!(short.kernel, PagedKernel::Mma { warps: 4 }, "64 rows a kv head");
    // Head size 256 takes the `_ds` kernel for prefill rows too, 16 rows a block.
    let long = PagedBounds { max_q_len: 600, max_context: 5000 };
    let wide = paged_launch(2, 1200, (8, 4, 256, true), long, None, 132);
    assert_eq!((wide.kernel, wide.splits), (PagedKernel::MmaSplitDims, 1));
    assert_eq!(wide.grid, (2 * (2 * 600usize).div_ceil(16) as u32, 4, 1));
    assert!(super::cuda_head_dim(256, true) && !super::cuda_head_dim(256, false));
    assert!(!super::cuda_head_dim(96, true) && super::cuda_head_dim(64, false));
}

#[cfg(feature = "cuda")]
mod gpu;
