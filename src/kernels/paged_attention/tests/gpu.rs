//! The CUDA kernels against the CPU reference: random batches (decode, chunks, long prefill,
//! padding sequences, loose bounds as a graph bucket has), both dtypes and head sizes, outputs
//! poisoned with NaN first; and a captured CUDA graph replayed with other positions, lengths and
//! tables.

use candle_core::Device;

use super::*;
use crate::kernels::kv_fp8::Codes;
use crate::kernels::testing::{assert_written_and_close, gpu};

/// The batch's tensors on `dev` (without the contiguous copies, which only the CPU needs).
fn to_device(x: &Inputs, dev: &Device) -> Inputs {
    let on = |t: &Tensor| t.to_device(dev).unwrap();
    Inputs {
        q: on(&x.q),
        k_pool: on(&x.k_pool),
        v_pool: on(&x.v_pool),
        scales: x.scales.as_ref().map(|(k, v)| (on(k), on(v))),
        sinks: x.sinks.as_ref().map(on),
        cu_q: on(&x.cu_q),
        q_pos: on(&x.q_pos),
        tables: on(&x.tables),
        k_seq: Vec::new(),
        v_seq: Vec::new(),
    }
}

/// CUDA (poisoned output) against the reference, under the batch's own bounds and under looser
/// ones (more rows and keys than any sequence has: tiles with no rows, splits past the keys).
fn check(name: &str, b: &Batch, dtype: DType, tol: f64) {
    if b.tokens() == 0 {
        return;
    }
    let mut rng = rng(name);
    check_inputs(name, b, dtype, tol, inputs(&mut rng, b, dtype));
}

fn check_inputs(name: &str, b: &Batch, dtype: DType, tol: f64, x: Inputs) {
    let want = values(&run(&x, b, b.bounds()).expect("reference"));
    let dev = gpu();
    let g = to_device(&x, &dev);
    let tight = b.bounds();
    let loose = PagedBounds { max_q_len: tight.max_q_len + 9, max_context: 2 * tight.max_context };
    for bounds in [tight, loose] {
        let scales = g.scales.as_ref().map(|(k, v)| (k, v));
        let (sinks, cu_q, q_pos, tables) = (g.sinks.as_ref(), &g.cu_q, &g.q_pos, &g.tables);
        let meta = Meta { scales, sinks, cu_q, q_pos, tables };
        let op = PagedAttention::new(&g.q, &g.k_pool, &g.v_pool, meta, bounds, b.cfg(), true)
            .expect("op");
        let plan = op.plan(b.tokens(), 132);
        let got = values(&g.q.apply_op3_no_bwd(&g.k_pool, &g.v_pool, &op).expect("cuda"));
        let what = format!("{name} {dtype:?} {bounds:?} {plan:?} {b:?}");
        assert_written_and_close(&what, &got, &want, tol);
    }
}

/// The cases, drawn afresh each run.
fn batches(rng: &mut StdRng) -> Vec<(&'static str, Batch)> {
    let oss = Batch::new(64, 8, 64, 16);
    let mut long = Batch::new(8, 2, 128, 16);
    long.seqs = vec![(600, 0), (517, rng.random_range(3000..4400)), (1, 4999), (0, 100), (37, 63)];
    vec![
        ("decode 64 full", oss.clone().random(rng, 64, 1, 5000)),
        ("decode 64 window", oss.clone().window(Some(128)).random(rng, 64, 1, 5000)),
        ("decode 3", oss.clone().random(rng, 3, 1, 5000)),
        ("mixed", oss.clone().random(rng, 12, 40, 3000)),
        ("mixed window", oss.clone().window(Some(128)).random(rng, 12, 300, 3000)),
        ("long prefill", long.clone()),
        ("long prefill window no sinks", long.window(Some(100)).sinks(false)),
        ("llama", Batch::new(32, 8, 128, 16).sinks(false).random(rng, 8, 100, 2000)),
        ("llama decode", Batch::new(32, 8, 128, 16).sinks(false).random(rng, 40, 1, 4000)),
        ("block 5", Batch::new(12, 4, 64, 5).random(rng, 20, 33, 700)),
        ("mqa", Batch::new(6, 1, 64, 16).window(Some(50)).random(rng, 7, 60, 500)),
        // Gemma 3's head size (bf16 and codes only: `cuda_head_dim`).
        (
            "d256 window",
            Batch::new(8, 4, 256, 16).sinks(false).window(Some(512)).random(rng, 6, 300, 3000),
        ),
        ("d256 decode", Batch::new(16, 8, 256, 16).sinks(false).random(rng, 24, 1, 4000)),
        ("d256 mqa prefill", Batch::new(4, 1, 256, 16).sinks(false).random(rng, 3, 700, 2000)),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_cpu_f32() {
    let mut r = rng("paged gpu f32 cases");
    for (name, b) in batches(&mut r) {
        if !cuda_head_dim(b.d, false) {
            continue;
        }
        check(name, &b, DType::F32, 1e-5);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_cpu_bf16() {
    let mut r = rng("paged gpu bf16 cases");
    for (name, b) in batches(&mut r) {
        check(name, &b, DType::BF16, 1e-2);
    }
}

/// Pools of FP8 and of INT8 codes (bf16 q) against the CPU reference on the same codes, every
/// case of the bf16 test: the kernel reads the values the codes stand for, so a row is within the
/// bf16 kernel's tolerance of the reference.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_cpu_fp8() {
    let mut r = rng("paged gpu fp8 cases");
    for codes in [Codes::E4m3, Codes::Int8] {
        for (name, b) in batches(&mut r) {
            if b.tokens() == 0 {
                continue;
            }
            let x = inputs(&mut r, &b, DType::F32);
            let (coded, _) = super::coded_inputs(x, DType::BF16, codes);
            check_inputs(&format!("{name} {codes:?}"), &b, DType::BF16, 1e-2, coded);
        }
    }
}

/// A decode batch of 10 sequences (2 of them padding) captured once into a CUDA graph, then
/// replayed after the host overwrote the inputs in place with other batches of the same shape:
/// other positions, other padding rows (cu_q), other tables and pool contents.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_graph_replays_with_other_metadata() {
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode,
    };

    let dev = gpu();
    let Device::Cuda(cuda) = &dev else { panic!("not a CUDA device") };
    let mut r = rng("paged graph");
    let bounds = PagedBounds { max_q_len: 1, max_context: 3000 };
    for (window, sinks) in [(None, true), (Some(128), false)] {
        let batch = |r: &mut StdRng| {
            let mut b = Batch::new(16, 2, 64, 16).window(window).sinks(sinks);
            let mut lens = vec![1usize; 8];
            lens.extend([0, 0]);
            lens.shuffle(r);
            b.seqs = lens.into_iter().map(|l| (l, r.random_range(0..3000 - 1))).collect();
            b.fixed = Some((3000usize.div_ceil(16), 10 * 3000usize.div_ceil(16)));
            b
        };
        let b0 = batch(&mut r);
        let g = to_device(&inputs(&mut r, &b0, DType::F32), &dev);
        // Eagerly first: loads the kernels (which a capture may not), and gives the output buffer.
        let out = run(&g, &b0, bounds).expect("eager");
        let stream = cuda.cuda_stream();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).w().unwrap();
        let recorded = run(&g, &b0, bounds).and_then(|o| out.slice_set(&o, 0, 0));
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).w().unwrap();
        recorded.expect("captured call");
        let graph = graph.expect("a non-empty graph");
        for round in 0..3 {
            let b = batch(&mut r);
            let x = inputs(&mut r, &b, DType::F32);
            let fresh = to_device(&x, &dev);
            let pairs = [
                (&g.q, &fresh.q),
                (&g.k_pool, &fresh.k_pool),
                (&g.v_pool, &fresh.v_pool),
                (&g.cu_q, &fresh.cu_q),
                (&g.q_pos, &fresh.q_pos),
                (&g.tables, &fresh.tables),
            ];
            for (dst, src) in pairs {
                dst.slice_set(src, 0, 0).unwrap();
            }
            if let (Some(dst), Some(src)) = (&g.sinks, &fresh.sinks) {
                dst.slice_set(src, 0, 0).unwrap();
            }
            graph.launch().w().unwrap();
            let want = values(&run(&x, &b, bounds).expect("reference"));
            let name = format!("graph replay {round} window {window:?} sinks {sinks}");
            assert_written_and_close(&name, &values(&out), &want, 1e-5);
        }
    }
}

/// Not a check: prints the time of gpt-oss-sized batches (64:8 heads, d 64, bf16).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_paged_attention_timing() {
    let dev = gpu();
    let mut r = rng("paged timing");
    let oss = Batch::new(64, 8, 64, 16);
    let mut prefill = oss.clone();
    prefill.seqs = vec![(1024, 0)];
    let mut decode = oss.clone();
    decode.seqs = (0..32).map(|_| (1, 2047)).collect();
    let mut one = oss.clone();
    one.seqs = vec![(1, 4095)];
    for (what, b) in [
        ("decode 1 × 4096 keys", one),
        ("decode 32 × 2048 keys", decode.clone()),
        ("decode 32 × window 128", decode.window(Some(128))),
        ("prefill 1024", prefill.clone()),
        ("prefill 1024 window 128", prefill.window(Some(128))),
    ] {
        let g = to_device(&inputs(&mut r, &b, DType::BF16), &dev);
        let us = crate::kernels::testing::time_us(&dev, 20, || {
            run(&g, &b, b.bounds()).unwrap();
        });
        eprintln!("paged attention timing: {what}: {us:.1} us");
    }
}

/// Not a check: prints the time of gpt-oss-shaped decode steps (64 query heads, 8 kv heads,
/// d 64, sinks) for batches of 1–64 sequences at 640 and 4,000 positions, full and windowed, and
/// of one sequence at 32,000, with a graph bucket's bounds (8,192 positions, or the next power of
/// two).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_decode_timing() {
    let dev = gpu();
    let mut r = rng("paged decode timing");
    for (pos, window) in [(640, None), (640, Some(128)), (4000, None), (32000, None)] {
        for n in [1, 8, 64] {
            if pos > 4000 && n > 1 {
                continue;
            }
            let mut b = Batch::new(64, 8, 64, 16).window(window);
            b.seqs = (0..n).map(|_| (1, pos - 1)).collect();
            let x = to_device(&inputs(&mut r, &b, DType::BF16), &dev);
            let bounds =
                PagedBounds { max_q_len: 1, max_context: pos.max(8192).next_power_of_two() };
            let us = crate::kernels::testing::time_us(&dev, 20, || {
                paged_attention(
                    &x.q,
                    &x.k_pool,
                    &x.v_pool,
                    None,
                    x.sinks.as_ref(),
                    &x.cu_q,
                    &x.q_pos,
                    &x.tables,
                    bounds,
                    &b.cfg(),
                )
                .unwrap();
            });
            eprintln!("paged decode timing: {n} seqs at {pos} window {window:?}: {us:.1} us");
        }
    }
}

/// Batch invariance, bit for bit: every query row of a batch of prefill chunks equals the same
/// query computed alone in a decode step under a graph bucket's loose bounds (its keys shared
/// among blocks and combined), and the same query inside chunks of 7 (other tiles, other rows).
/// This is what makes a prefix decoded token by token and reused from the cache equal a fresh
/// prefill of it in bf16, and with FP8 pools.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_rows_are_batch_invariant() {
    let dev = gpu();
    let mut r = rng("paged invariance");
    let loose = PagedBounds { max_q_len: 1, max_context: 8192 };
    let u32s = |v: &[u32]| Tensor::new(v, &dev).unwrap();
    let kinds = [(DType::F32, None), (DType::BF16, None)];
    let coded = [(DType::BF16, Some(Codes::E4m3)), (DType::BF16, Some(Codes::Int8))];
    let windows = [(None, true), (Some(128), true), (Some(100), false), (None, false)];
    let shapes = [(64, 8, 64), (8, 4, 256)];
    let cases = kinds.into_iter().chain(coded).flat_map(|k| shapes.map(|s| (k, s)));
    for ((dtype, codes), (heads, kv_heads, d)) in cases {
        if !cuda_head_dim(d, dtype == DType::BF16) {
            continue;
        }
        for (window, sinks) in windows {
            let mut b = Batch::new(heads, kv_heads, d, 16).window(window).sinks(sinks);
            b.seqs = vec![(200, 0), (37, 900), (1, 2500), (70, r.random_range(100..300))];
            let host = match codes {
                Some(c) => super::coded_inputs(inputs(&mut r, &b, DType::F32), dtype, c).0,
                None => inputs(&mut r, &b, dtype),
            };
            let x = to_device(&host, &dev);
            let full = values(&run(&x, &b, b.bounds()).unwrap());
            let row = b.heads * b.d;
            let what = format!("{dtype:?} d {d} codes {codes:?} window {window:?} sinks {sinks}");
            let same = |got: &[f32], at: usize, how: &str| {
                let want = &full[at * row..][..got.len()];
                let diff = got.iter().zip(want).position(|(a, w)| a.to_bits() != w.to_bits());
                assert!(diff.is_none(), "{what}: {how}: row {at} differs at {diff:?}");
            };
            // Each query alone, as a decode step.
            let mut at = 0;
            for (s, &(q_len, q_pos)) in b.seqs.iter().enumerate() {
                for i in 0..q_len {
                    let one = Inputs {
                        q: x.q.narrow(0, at, 1).unwrap(),
                        cu_q: u32s(&[0, 1]),
                        q_pos: u32s(&[(q_pos + i) as u32]),
                        tables: x.tables.narrow(0, s, 1).unwrap(),
                        sinks: x.sinks.clone(),
                        k_pool: x.k_pool.clone(),
                        v_pool: x.v_pool.clone(),
                        scales: x.scales.clone(),
                        k_seq: Vec::new(),
                        v_seq: Vec::new(),
                    };
                    let shape = (b.heads, b.kv_heads, b.d, dtype == DType::BF16);
                    let plan = paged_launch(1, 1, shape, loose, window, 132);
                    assert!(plan.splits > 1, "{what}: the decode call does not split: {plan:?}");
                    same(&values(&run(&one, &b, loose).unwrap()), at, "alone");
                    at += 1;
                }
            }
            // Every sequence in chunks of 7 (other tiles, other rows), and of 2 (a verify
            // step's 16 rows a kv head: the split kernel with both halves of its rows), each
            // all in one call.
            for chunk in [7, 2] {
                let (mut cu, mut pos, mut rows) = (vec![0u32], Vec::new(), Vec::new());
                for (s, &(q_len, q_pos)) in b.seqs.iter().enumerate() {
                    for c in (0..q_len).step_by(chunk) {
                        cu.push(cu.last().unwrap() + (q_len - c).min(chunk) as u32);
                        pos.push((q_pos + c) as u32);
                        rows.push(s as u32);
                    }
                }
                let chunked = Inputs {
                    cu_q: u32s(&cu),
                    q_pos: u32s(&pos),
                    tables: x.tables.index_select(&u32s(&rows), 0).unwrap(),
                    ..to_device(&x, &dev)
                };
                let bounds = PagedBounds { max_q_len: chunk, max_context: b.bounds().max_context };
                same(
                    &values(&run(&chunked, &b, bounds).unwrap()),
                    0,
                    &format!("in chunks of {chunk}"),
                );
            }
        }
    }
}
