//! The CPU reference against a naive formulation, then the CUDA kernel against the reference.

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;

use super::*;
use crate::kernels::testing::{rel_err, rng, tensor, uniform, values};

#[derive(Debug, Clone, Copy)]
struct Case {
    heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    d: usize,
    start: usize,
    window: Option<usize>,
    layout: KvLayout,
}

impl Case {
    fn new(heads: usize, kv_heads: usize, d: usize) -> Self {
        Case {
            heads,
            kv_heads,
            q_len: 1,
            kv_len: 1,
            d,
            start: 0,
            window: None,
            layout: KvLayout::Linear,
        }
    }
    fn at(self, start: usize, q_len: usize, kv_len: usize) -> Self {
        Case { start, q_len, kv_len, ..self }
    }
    fn window(self, w: usize) -> Self {
        Case { window: Some(w), ..self }
    }
    fn ring(self) -> Self {
        Case { layout: KvLayout::Ring, ..self }
    }
    fn cfg(&self) -> SinkAttnConfig {
        SinkAttnConfig {
            start: self.start,
            window: self.window,
            layout: self.layout,
            scale: 1.0 / (self.d as f32).sqrt(),
        }
    }
    /// Positions held by each slot, found by replaying the writes of positions 0..=last.
    fn slot_positions(&self) -> Vec<Option<usize>> {
        let last = self.start + self.q_len - 1;
        match self.layout {
            KvLayout::Linear => (0..self.kv_len).map(Some).collect(),
            KvLayout::Ring => {
                let mut slots = vec![None; self.kv_len];
                (0..=last).for_each(|p| slots[p % self.kv_len] = Some(p));
                slots
            }
        }
    }
}

/// q, k, v, sinks as CPU tensors in `dtype`. Slots that hold no position the queries may know
/// of (ring slots never written, linear slots past the last query) are NaN: they must not be read.
fn inputs(
    rng: &mut StdRng,
    c: &Case,
    dtype: DType,
    sink: (f32, f32),
) -> (Tensor, Tensor, Tensor, Tensor) {
    let q =
        tensor(uniform(rng, c.heads * c.q_len * c.d, -2.0, 2.0), &[c.heads, c.q_len, c.d], dtype);
    let last = c.start + c.q_len - 1;
    let kv = |rng: &mut StdRng| {
        let mut x = uniform(rng, c.kv_heads * c.kv_len * c.d, -2.0, 2.0);
        for (j, pos) in c.slot_positions().into_iter().enumerate() {
            if pos.is_none_or(|p| p > last) {
                for g in 0..c.kv_heads {
                    x[(g * c.kv_len + j) * c.d..][..c.d].fill(f32::NAN);
                }
            }
        }
        tensor(x, &[c.kv_heads, c.kv_len, c.d], dtype)
    };
    let (k, v) = (kv(rng), kv(rng));
    let sinks = tensor(uniform(rng, c.heads, sink.0, sink.1), &[c.heads], dtype);
    (q, k, v, sinks)
}

/// The naive formulation, in f64: per (head, query), a row of logits over every slot with −∞
/// where masked, the sink appended as one more column, a plain softmax, the sink column dropped,
/// then the product with V.
fn naive(q: &Tensor, k: &Tensor, v: &Tensor, sinks: &Tensor, c: &Case) -> Vec<f32> {
    let to3 = |t: &Tensor| t.to_dtype(DType::F64).and_then(|t| t.to_vec3::<f64>()).expect("vec3");
    let (q, k, v) = (to3(q), to3(k), to3(v));
    let sinks: Vec<f64> = values(sinks).into_iter().map(f64::from).collect();
    let slots = c.slot_positions();
    let scale = 1.0 / (c.d as f64).sqrt();
    let mut out = Vec::with_capacity(c.heads * c.q_len * c.d);
    for h in 0..c.heads {
        let g = h / (c.heads / c.kv_heads);
        for (i, qi) in q[h].iter().enumerate() {
            let p = c.start + i;
            let mut logits: Vec<f64> = slots
                .iter()
                .enumerate()
                .map(|(j, slot)| match slot {
                    Some(t) if *t <= p && c.window.is_none_or(|w| p - t < w) => {
                        scale * qi.iter().zip(&k[g][j]).map(|(a, b)| a * b).sum::<f64>()
                    }
                    _ => f64::NEG_INFINITY,
                })
                .collect();
            logits.push(sinks[h]);
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = exps.iter().sum();
            let probs = &exps[..slots.len()]; // the sink's column dropped
            let mut o = vec![0f64; c.d];
            // Masked slots have weight 0 and may hold NaN: skip them rather than multiply.
            for (j, w) in probs.iter().enumerate().filter(|(_, w)| **w > 0.0) {
                o.iter_mut().zip(&v[g][j]).for_each(|(o, x)| *o += w / total * x);
            }
            out.extend(o.into_iter().map(|x| x as f32));
        }
    }
    out
}

fn check_cpu(name: &str, c: Case, dtype: DType, sink: (f32, f32), tol: f64) {
    let mut rng = rng(name);
    let (q, k, v, sinks) = inputs(&mut rng, &c, dtype, sink);
    let got = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).expect("reference"));
    let want = naive(&q, &k, &v, &sinks, &c);
    assert!(got.iter().all(|x| x.is_finite()), "{name}: non-finite output");
    let err = rel_err(&got, &want);
    assert!(err < tol, "{name} {c:?}: relative error {err:e}");
}

const NORMAL_SINKS: (f32, f32) = (-2.0, 2.0);

#[test]
fn reference_matches_naive_prefill_and_decode() {
    let c = Case::new(4, 2, 8);
    check_cpu("prefill", c.at(0, 5, 5), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("decode", c.at(8, 1, 9), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("chunk", c.at(3, 4, 7), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("mqa", Case::new(3, 1, 16).at(2, 3, 5), DType::F32, NORMAL_SINKS, 1e-5);
    // A preallocated linear cache longer than the sequence: slots past the last query are NaN.
    check_cpu("prealloc", c.at(2, 3, 12), DType::F32, NORMAL_SINKS, 1e-5);
}

#[test]
fn reference_matches_naive_sliding_window() {
    let c = Case::new(4, 2, 8).window(3);
    check_cpu("window prefill", c.at(0, 6, 6), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("window chunk", c.at(4, 3, 7), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("window decode", c.at(9, 1, 10), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("window 1", Case::new(2, 2, 8).window(1).at(0, 4, 4), DType::F32, NORMAL_SINKS, 1e-5);
}

#[test]
fn reference_matches_naive_ring_buffer() {
    let c = Case::new(4, 2, 8).window(4).ring();
    check_cpu("ring decode wrapped", c.at(9, 1, 4), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("ring chunk wrapped", c.at(10, 3, 6), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("ring not yet full", c.at(0, 3, 8), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu("ring exactly full", c.at(5, 1, 6), DType::F32, NORMAL_SINKS, 1e-5);
    check_cpu(
        "ring no window",
        Case::new(2, 1, 8).ring().at(2, 3, 8),
        DType::F32,
        NORMAL_SINKS,
        1e-5,
    );
}

#[test]
fn reference_matches_naive_when_the_sink_dominates() {
    let c = Case::new(4, 2, 8).at(3, 4, 7);
    check_cpu("sink dominates", c, DType::F32, (40.0, 41.0), 1e-5);
    let mut rng = rng("sink dominates, magnitude");
    let (q, k, v, sinks) = inputs(&mut rng, &c, DType::F32, (40.0, 41.0));
    let out = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).expect("reference"));
    assert!(
        out.iter().all(|x| x.abs() < 1e-12),
        "a dominant sink leaves almost no weight for the values"
    );
    check_cpu("sink negligible", c, DType::F32, (-60.0, -50.0), 1e-5);
}

#[test]
fn reference_matches_naive_bf16() {
    let c = Case::new(4, 2, 16).window(3);
    check_cpu("bf16", c.at(4, 3, 7), DType::BF16, NORMAL_SINKS, 1e-2);
}

#[test]
fn strided_views_give_the_same_result() {
    let c = Case::new(4, 2, 8).at(5, 3, 8);
    let mut rng = rng("strided views");
    let (q, k, v, sinks) = inputs(&mut rng, &c, DType::F32, NORMAL_SINKS);
    let want = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).unwrap());
    // q as [q_len, heads, d] transposed; k and v as the first kv_len slots of a longer cache.
    let q_t = q.transpose(0, 1).unwrap().contiguous().unwrap().transpose(0, 1).unwrap();
    let pad = Tensor::zeros((c.kv_heads, 5, c.d), DType::F32, q.device()).unwrap();
    let big = |t: &Tensor| Tensor::cat(&[t, &pad], 1).unwrap().narrow(1, 0, c.kv_len).unwrap();
    let (k_v, v_v) = (big(&k), big(&v));
    assert!(!q_t.is_contiguous() && !k_v.is_contiguous());
    let got = values(&sink_attention(&q_t, &k_v, &v_v, &sinks, &c.cfg()).unwrap());
    assert_eq!(got, want);
}

#[test]
fn rejects_a_ring_too_small_for_the_chunk() {
    let c = Case::new(2, 1, 8).window(4).ring().at(10, 3, 4); // needs 4 + 3 − 1 = 6 slots
    let mut rng = rng("ring too small");
    let (q, k, v, sinks) = inputs(&mut rng, &c, DType::F32, NORMAL_SINKS);
    let err = sink_attention(&q, &k, &v, &sinks, &c.cfg()).unwrap_err().to_string();
    assert!(err.contains("window + q_len"), "{err}");
    let ok = Case { kv_len: 6, ..c };
    let (q, k, v, sinks) = inputs(&mut rng, &ok, DType::F32, NORMAL_SINKS);
    assert!(sink_attention(&q, &k, &v, &sinks, &ok.cfg()).is_ok());
}

#[test]
fn ring_positions() {
    // 4 slots after writing positions 0..=9: slot j holds the latest p ≡ j (mod 4).
    let pos: Vec<_> = (0..4).map(|j| KvLayout::Ring.position(j, 4, 9)).collect();
    assert_eq!(pos, [Some(8), Some(9), Some(6), Some(7)]);
    // Not yet wrapped: slots past `last` are empty.
    let pos: Vec<_> = (0..4).map(|j| KvLayout::Ring.position(j, 4, 1)).collect();
    assert_eq!(pos, [Some(0), Some(1), None, None]);
    assert_eq!(KvLayout::Linear.position(7, 4, 1), Some(7));
}

/// The GPU cases: gpt-oss heads (64:8, d 64) over decode, short and long prefill, cache lengths
/// that are not multiples of the 32-key tile, both layouts and windows; plus d 128 and views.
/// Decode steps at positions held on the device, against the same steps with host positions:
/// whole linear caches (slots past the position are NaN), a window, and rings before and after
/// they wrap.
fn device_position_cases() -> Vec<Case> {
    let oss = Case::new(64, 8, 64);
    let w = oss.window(128);
    vec![
        oss.at(0, 1, 1000),
        oss.at(37, 1, 1000),
        oss.at(999, 1, 1000),
        w.at(500, 1, 1000),
        w.ring().at(999, 1, 128),
        w.ring().at(5, 1, 128),
    ]
}

fn at_device_position(q: &Tensor, k: &Tensor, v: &Tensor, sinks: &Tensor, c: &Case) -> Tensor {
    let pos = Tensor::new(&[c.start as i64], q.device()).unwrap();
    sink_attention_at(q, k, v, sinks, &c.cfg(), &pos).expect("sink_attention_at")
}

#[test]
fn a_position_on_the_device_matches_the_host_position() {
    for c in device_position_cases() {
        let mut rng = rng(&format!("device position {c:?}"));
        let (q, k, v, sinks) = inputs(&mut rng, &c, DType::F32, NORMAL_SINKS);
        let want = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).unwrap());
        let got = values(&at_device_position(&q, &k, &v, &sinks, &c));
        assert_eq!(got, want, "{c:?}");
    }
    let c = Case::new(4, 2, 64).at(0, 1, 8);
    let (q, k, v, sinks) = inputs(&mut rng("past the cache"), &c, DType::F32, NORMAL_SINKS);
    let pos = Tensor::new(&[8i64], q.device()).unwrap();
    let err = sink_attention_at(&q, &k, &v, &sinks, &c.cfg(), &pos).unwrap_err().to_string();
    assert!(err.contains("outside"), "{err}");
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{assert_written_and_close, gpu};

    fn cases() -> Vec<Case> {
        let oss = Case::new(64, 8, 64);
        let w = oss.window(128);
        vec![
            oss.at(0, 1, 1),
            oss.at(128, 1, 129),
            oss.at(999, 1, 1000), // split over the cache
            w.at(999, 1, 1000),
            w.at(122, 7, 129),
            oss.at(993, 7, 1000),
            oss.at(0, 130, 130),
            oss.at(870, 130, 1000),
            w.at(870, 130, 1000),
            oss.at(95, 5, 1000), // preallocated: slots 100.. are NaN
            w.ring().at(999, 1, 128),
            w.ring().at(993, 7, 134),
            w.ring().at(500, 130, 257),
            w.ring().at(1, 3, 64), // not yet wrapped: slots 4.. are NaN
            Case::new(8, 2, 128).at(293, 7, 300),
            Case::new(8, 2, 128).window(100).at(3000, 1, 3001),
        ]
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_device_position_matches_cpu() {
        for dtype in [DType::F32, DType::BF16] {
            for c in device_position_cases() {
                let name = format!("gpu device position {dtype:?} {c:?}");
                let mut rng = rng(&name);
                let (q, k, v, sinks) = inputs(&mut rng, &c, dtype, NORMAL_SINKS);
                let want =
                    values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).expect("reference"));
                let dev = gpu();
                let (qg, kg, vg, sg) =
                    [&q, &k, &v, &sinks].map(|t| t.to_device(&dev).unwrap()).into();
                let mut op = SinkAttention::new(
                    &qg,
                    &kg,
                    &vg,
                    &sg,
                    SinkAttnConfig { start: c.kv_len - 1, ..c.cfg() },
                    true,
                )
                .unwrap();
                op.pos = Some(Tensor::new(&[c.start as i64], &dev).unwrap());
                let got = values(&qg.apply_op3_no_bwd(&kg, &vg, &op).unwrap());
                assert_written_and_close(
                    &name,
                    &got,
                    &want,
                    if dtype == DType::F32 { 1e-5 } else { 1e-2 },
                );
            }
        }
    }

    fn check(c: Case, dtype: DType, tol: f64, views: bool) {
        let name = format!("gpu {dtype:?} {c:?}");
        let mut rng = rng(&name);
        let (q, k, v, sinks) = inputs(&mut rng, &c, dtype, NORMAL_SINKS);
        let want = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).expect("reference"));
        let dev = gpu();
        let (mut qg, mut kg, mut vg) =
            (q.to_device(&dev).unwrap(), k.to_device(&dev).unwrap(), v.to_device(&dev).unwrap());
        if views {
            qg = qg.transpose(0, 1).unwrap().contiguous().unwrap().transpose(0, 1).unwrap();
            let pad = Tensor::zeros((c.kv_heads, 17, c.d), dtype, &dev).unwrap();
            kg = Tensor::cat(&[&pad, &kg], 1).unwrap().narrow(1, 17, c.kv_len).unwrap();
            vg = Tensor::cat(&[&pad, &vg], 1).unwrap().narrow(1, 17, c.kv_len).unwrap();
        }
        let sg = sinks.to_device(&dev).unwrap();
        let op = SinkAttention::new(&qg, &kg, &vg, &sg, c.cfg(), true).unwrap();
        let got = values(&qg.apply_op3_no_bwd(&kg, &vg, &op).unwrap());
        assert_written_and_close(&name, &got, &want, tol);
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_cpu_f32() {
        cases().into_iter().for_each(|c| check(c, DType::F32, 1e-5, false));
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_matches_cpu_bf16() {
        cases().into_iter().for_each(|c| check(c, DType::BF16, 1e-2, false));
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_strided_views() {
        let oss = Case::new(64, 8, 64);
        check(oss.at(993, 7, 1000), DType::F32, 1e-5, true);
        check(oss.window(128).at(0, 130, 130), DType::BF16, 1e-2, true);
        check(oss.at(999, 1, 1000), DType::F32, 1e-5, true);
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_misaligned_cache_is_copied() {
        let c = Case::new(8, 2, 64).at(40, 3, 50);
        let mut rng = rng("misaligned");
        let (q, k, v, sinks) = inputs(&mut rng, &c, DType::BF16, NORMAL_SINKS);
        let want = values(&sink_attention(&q, &k, &v, &sinks, &c.cfg()).unwrap());
        let dev = gpu();
        // k and v start 3 elements into their buffers: not on a 16-byte boundary.
        let shift = |t: &Tensor| {
            let flat = Tensor::cat(
                &[&Tensor::zeros(3, DType::BF16, &Device::Cpu).unwrap(), &t.flatten_all().unwrap()],
                0,
            )
            .unwrap();
            flat.to_device(&dev)
                .unwrap()
                .narrow(0, 3, t.elem_count())
                .unwrap()
                .reshape(t.shape())
                .unwrap()
        };
        let (kg, vg) = (shift(&k), shift(&v));
        assert_eq!(kg.layout().start_offset(), 3);
        let got = values(
            &sink_attention(
                &q.to_device(&dev).unwrap(),
                &kg,
                &vg,
                &sinks.to_device(&dev).unwrap(),
                &c.cfg(),
            )
            .unwrap(),
        );
        let err = rel_err(&got, &want);
        assert!(err < 1e-2, "misaligned: relative error {err:e}");
    }

    /// Not a check: prints the time of gpt-oss-sized attention calls (64:8 heads, d 64, bf16).
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_attention_timing() {
        let dev = gpu();
        let oss = Case::new(64, 8, 64);
        for (what, c) in [
            ("decode, full, 4096 keys", oss.at(4095, 1, 4096)),
            ("decode, full, 32768 keys", oss.at(32767, 1, 32768)),
            ("decode, ring of 128", oss.window(128).ring().at(5000, 1, 128)),
            ("prefill 1024, full", oss.at(0, 1024, 1024)),
            ("prefill 1024, window 128", oss.window(128).at(0, 1024, 1024)),
        ] {
            let mut rng = rng("attention timing");
            let (q, k, v, sinks) = inputs(&mut rng, &c, DType::BF16, NORMAL_SINKS);
            let (q, k, v, sinks) = (
                q.to_device(&dev).unwrap(),
                k.to_device(&dev).unwrap(),
                v.to_device(&dev).unwrap(),
                sinks.to_device(&dev).unwrap(),
            );
            let us = crate::kernels::testing::time_us(&dev, 20, || {
                sink_attention(&q, &k, &v, &sinks, &c.cfg()).unwrap();
            });
            eprintln!("attention timing: {what}: {us:.1} us");
        }
    }
}
