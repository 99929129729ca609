//! The CPU reference against dequantize-then-matmul, then the CUDA kernels against the reference.

use candle_core::{D, DType, Device, IndexOp, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, RngCore};

use super::*;
use crate::kernels::testing::{rel_err, rng, tensor, uniform, values};

#[derive(Debug, Clone, Copy)]
struct Dims {
    tokens: usize,
    experts: usize,
    hidden: usize,
    inter: usize,
    k: usize,
}

/// Random packed experts, inputs and routing on the CPU, with the raw packed bytes for the naive
/// formulation.
struct Inputs {
    x: Tensor,
    ids: Tensor,
    weights: Tensor,
    packed: [Tensor; 6],
}

/// Scales around 2^-log2(√K) keep the dot products O(1..10), so that the clamps get exercised.
fn scales(rng: &mut StdRng, n: usize, k: usize) -> Vec<u8> {
    let base = 128 - ((k as f64).sqrt().log2().ceil() as i32);
    (0..n).map(|_| (base + rng.random_range(-2..=2)) as u8).collect()
}

fn bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

fn inputs(rng: &mut StdRng, d: Dims, x_dtype: DType, bias_dtype: DType) -> Inputs {
    let (e, h, i) = (d.experts, d.hidden, d.inter);
    let u8t =
        |v: Vec<u8>, shape: &[usize]| Tensor::from_vec(v, shape, &Device::Cpu).expect("u8 tensor");
    let packed = [
        u8t(bytes(rng, e * 2 * i * h / 2), &[e, 2 * i, h / 32, 16]),
        u8t(scales(rng, e * 2 * i * h / 32, h), &[e, 2 * i, h / 32]),
        tensor(uniform(rng, e * 2 * i, -1.0, 1.0), &[e, 2 * i], bias_dtype),
        u8t(bytes(rng, e * h * i / 2), &[e, h, i / 32, 16]),
        u8t(scales(rng, e * h * i / 32, i), &[e, h, i / 32]),
        tensor(uniform(rng, e * h, -1.0, 1.0), &[e, h], bias_dtype),
    ];
    let x = tensor(uniform(rng, d.tokens * h, -2.0, 2.0), &[d.tokens, h], x_dtype);
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    for _ in 0..d.tokens {
        ids.extend(rand::seq::index::sample(rng, e, d.k).into_iter().map(|e| e as u32));
        let logits = uniform(rng, d.k, -2.0, 2.0);
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        weights.extend(logits.iter().map(|l| l.exp() / total));
    }
    let ids = Tensor::from_vec(ids, (d.tokens, d.k), &Device::Cpu).expect("ids");
    let weights = Tensor::from_vec(weights, (d.tokens, d.k), &Device::Cpu).expect("weights");
    Inputs { x, ids, weights, packed }
}

fn experts(p: &[Tensor; 6], dev: &Device) -> Mxfp4Experts {
    let p: Vec<Tensor> = p.iter().map(|t| t.to_device(dev).expect("to device")).collect();
    Mxfp4Experts::new(&p[0], &p[1], &p[2], &p[3], &p[4], &p[5]).expect("experts")
}

/// The naive formulation, in f64 with candle's CPU ops: dequantize both projections to dense
/// `[E, out, in]` matrices, then per token and expert a matmul, the interleaved gate/up split by a
/// `[I, 2]` reshape, the clamps, the activation, the down matmul and the weighted sum.
/// Also returns how many gate and up values the clamps changed.
fn naive(inp: &Inputs, d: Dims, act: SwiGlu) -> (Vec<f32>, usize, usize) {
    let (e, h, i) = (d.experts, d.hidden, d.inter);
    let raw = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<u8>()).expect("bytes");
    let dense = |blocks: &Tensor, scales: &Tensor, rows: usize, cols: usize| {
        let w = mxfp4::dequantize(&raw(blocks), &raw(scales));
        Tensor::from_vec(w, (e, rows, cols), &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F64))
            .expect("dense")
    };
    let f64t = |t: &Tensor| t.to_dtype(DType::F64).expect("f64");
    let p = &inp.packed;
    let (w1, b1, w2, b2) =
        (dense(&p[0], &p[1], 2 * i, h), f64t(&p[2]), dense(&p[3], &p[4], h, i), f64t(&p[5]));
    let x = f64t(&inp.x);
    let ids = inp.ids.to_vec2::<u32>().expect("ids");
    let weights = inp.weights.to_vec2::<f32>().expect("weights");
    let limit = f64::from(act.limit);
    let (mut gate_clamped, mut up_clamped) = (0, 0);
    let mut out = Vec::new();
    for t in 0..d.tokens {
        let xt = x.i(t).and_then(|x| x.unsqueeze(1)).expect("x column");
        let mut acc = Tensor::zeros(h, DType::F64, &Device::Cpu).expect("zeros");
        for (&ex, &w) in ids[t].iter().zip(&weights[t]) {
            let ex = ex as usize;
            let hpre = (w1.i(ex).unwrap().matmul(&xt).unwrap().squeeze(1).unwrap()
                + b1.i(ex).unwrap())
            .unwrap();
            let pairs = hpre.reshape((i, 2)).unwrap(); // column 0: gate (even rows), 1: up (odd rows)
            let (gate, up) = (pairs.i((.., 0)).unwrap(), pairs.i((.., 1)).unwrap());
            gate_clamped += values(&gate).iter().filter(|&&g| f64::from(g) > limit).count();
            up_clamped += values(&up).iter().filter(|&&u| f64::from(u).abs() > limit).count();
            let gate = gate.minimum(limit).unwrap();
            let up = up.clamp(-limit, limit).unwrap();
            let sigmoid = ((gate.affine(-f64::from(act.alpha), 0.0).unwrap().exp().unwrap() + 1.0)
                .unwrap()
                .recip())
            .unwrap();
            let a = ((gate * sigmoid).unwrap() * (up + 1.0).unwrap()).unwrap();
            let y =
                (w2.i(ex).unwrap().matmul(&a.unsqueeze(1).unwrap()).unwrap().squeeze(1).unwrap()
                    + b2.i(ex).unwrap())
                .unwrap();
            acc = (acc + (y * f64::from(w)).unwrap()).unwrap();
        }
        out.extend(values(&acc));
    }
    (out, gate_clamped, up_clamped)
}

fn check_cpu(name: &str, d: Dims, x_dtype: DType, bias_dtype: DType, tol: f64) -> (usize, usize) {
    let mut rng = rng(name);
    let inp = inputs(&mut rng, d, x_dtype, bias_dtype);
    let ex = experts(&inp.packed, &Device::Cpu);
    let got = values(
        &mxfp4_moe(&inp.x, &ex, &inp.ids, &inp.weights, SwiGlu::GPT_OSS).expect("reference"),
    );
    let (want, gates, ups) = naive(&inp, d, SwiGlu::GPT_OSS);
    let err = rel_err(&got, &want);
    assert!(err < tol, "{name} {d:?}: relative error {err:e}");
    (gates, ups)
}

#[test]
fn reference_matches_dequantize_then_matmul() {
    let d = Dims { tokens: 5, experts: 4, hidden: 64, inter: 96, k: 2 };
    let (gates, ups) = check_cpu("moe f32", d, DType::F32, DType::BF16, 1e-5);
    assert!(
        gates > 0 && ups > 0,
        "the inputs should exercise both clamps ({gates} gates, {ups} ups)"
    );
    let d = Dims { tokens: 3, experts: 5, hidden: 96, inter: 32, k: 3 };
    check_cpu("moe f32 bias", d, DType::F32, DType::F32, 1e-5);
    check_cpu("moe bf16", d, DType::BF16, DType::BF16, 1e-2);
}

#[test]
fn swiglu_clamps_and_offsets() {
    let act = SwiGlu::GPT_OSS;
    let sigmoid = |z: f32| 1.0 / (1.0 + (-z).exp());
    // Gate clamped above only; up clamped both ways; the +1 on up.
    assert_eq!(act.apply(10.0, 0.0), 7.0 * sigmoid(1.702 * 7.0));
    assert_eq!(act.apply(2.0, 9.0), 2.0 * sigmoid(1.702 * 2.0) * 8.0);
    assert_eq!(act.apply(2.0, -9.0), 2.0 * sigmoid(1.702 * 2.0) * -6.0);
    let low = act.apply(-20.0, 0.0);
    assert!(low < 0.0 && low > -1e-12, "no lower clamp on the gate: {low}");
    assert_eq!(act.apply(1.0, -1.0), 0.0);
}

#[test]
fn rejects_out_of_range_experts_and_bad_shapes() {
    let d = Dims { tokens: 2, experts: 3, hidden: 64, inter: 32, k: 2 };
    let mut rng = rng("bad ids");
    let inp = inputs(&mut rng, d, DType::F32, DType::F32);
    let ex = experts(&inp.packed, &Device::Cpu);
    let ids = Tensor::new(&[[0u32, 1], [2, 3]], &Device::Cpu).unwrap();
    let err = mxfp4_moe(&inp.x, &ex, &ids, &inp.weights, SwiGlu::GPT_OSS).unwrap_err().to_string();
    assert!(err.contains("expert 3 of 3"), "{err}");
    let p = &inp.packed;
    assert!(
        Mxfp4Experts::new(&p[0], &p[1], &p[2], &p[0], &p[4], &p[5]).is_err(),
        "down blocks of the wrong shape"
    );
    let x = inp.x.narrow(D::Minus1, 0, 32).unwrap();
    assert!(
        mxfp4_moe(&x, &ex, &inp.ids, &inp.weights, SwiGlu::GPT_OSS).is_err(),
        "x narrower than hidden"
    );
}

#[test]
fn routing_is_topk_then_softmax_over_k() {
    let (ids, w) = route(&[1.0, 3.0, 2.0, -1.0], &[0.0; 4], 2);
    assert_eq!(ids, vec![1, 2]);
    let e = 1f32.exp();
    assert!((w[0] - e / (1.0 + e)).abs() < 1e-6 && (w[1] - 1.0 / (1.0 + e)).abs() < 1e-6);
    // The bias counts for the choice; ties go to the lower index.
    let (ids, _) = route(&[0.0, 1.0, -5.0, 0.5], &[0.0, 0.0, 6.5, 0.5], 2); // scores 0, 1, 1.5, 1
    assert_eq!(ids, vec![2, 1]);
}

/// Router logits with many exact ties (values on a coarse grid), so both implementations must
/// break them the same way.
fn router_inputs(rng: &mut StdRng, tokens: usize, experts: usize) -> (Tensor, Tensor) {
    let logits: Vec<f32> = uniform(rng, tokens * experts, -4.0, 4.0)
        .into_iter()
        .map(|v| (v * 2.0).round() / 2.0)
        .collect();
    let bias: Vec<f32> = (0..experts).map(|e| if e % 3 == 0 { 0.5 } else { 0.0 }).collect();
    (
        Tensor::from_vec(logits, (tokens, experts), &Device::Cpu).unwrap(),
        Tensor::from_vec(bias, experts, &Device::Cpu).unwrap(),
    )
}

#[test]
fn routed_op_is_route_then_experts() {
    let d = Dims { tokens: 6, experts: 8, hidden: 64, inter: 32, k: 3 };
    let mut rng = rng("routed");
    let inp = inputs(&mut rng, d, DType::F32, DType::F32);
    let ex = experts(&inp.packed, &Device::Cpu);
    let (logits, bias) = router_inputs(&mut rng, d.tokens, d.experts);
    let got =
        values(&mxfp4_moe_routed(&inp.x, &ex, &logits, &bias, d.k, SwiGlu::GPT_OSS, None).unwrap());
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in logits.to_vec2::<f32>().unwrap() {
        let (i, w) = route(&row, &bias.to_vec1::<f32>().unwrap(), d.k);
        ids.extend(i);
        weights.extend(w);
    }
    let ids = Tensor::from_vec(ids, (d.tokens, d.k), &Device::Cpu).unwrap();
    let weights = Tensor::from_vec(weights, (d.tokens, d.k), &Device::Cpu).unwrap();
    let want = values(&mxfp4_moe(&inp.x, &ex, &ids, &weights, SwiGlu::GPT_OSS).unwrap());
    assert_eq!(got, want);
    assert!(
        mxfp4_moe_routed(&inp.x, &ex, &logits, &bias, 9, SwiGlu::GPT_OSS, None).is_err(),
        "k above the expert count"
    );
    // Rows from `live` on are padding: zero, the others as without it.
    let live = Tensor::new(&[4u32], &Device::Cpu).unwrap();
    let padded = values(
        &mxfp4_moe_routed(&inp.x, &ex, &logits, &bias, d.k, SwiGlu::GPT_OSS, Some(&live)).unwrap(),
    );
    let h = d.hidden;
    assert_eq!(padded[..4 * h], want[..4 * h]);
    assert!(padded[4 * h..].iter().all(|&v| v == 0.0), "padding rows are zero");
    let none = Tensor::new(&[0u32], &Device::Cpu).unwrap();
    let all_padding = values(
        &mxfp4_moe_routed(&inp.x, &ex, &logits, &bias, d.k, SwiGlu::GPT_OSS, Some(&none)).unwrap(),
    );
    assert!(all_padding.iter().all(|&v| v == 0.0), "no live row: all zero");
    let bad = Tensor::new(&[4f32], &Device::Cpu).unwrap();
    let err = mxfp4_moe_routed(&inp.x, &ex, &logits, &bias, d.k, SwiGlu::GPT_OSS, Some(&bad));
    assert!(err.unwrap_err().to_string().contains("live rows"));
}

/// The GPU cases, on the path chosen by batch size: decode (1 and 3 tokens) at gpt-oss's 2880
/// widths, a 37-token batch, tiny
/// widths, and widths that need 1 to 4 blocks of 32 per lane (non-powers of two throughout).
#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use crate::kernels::testing::{assert_written_and_close, gpu};

    fn cases() -> Vec<Dims> {
        let d = |tokens, experts, hidden, inter, k| Dims { tokens, experts, hidden, inter, k };
        vec![
            d(1, 8, 2880, 2880, 4),
            d(3, 8, 2880, 2880, 4),
            d(37, 16, 1088, 544, 4),
            d(5, 4, 64, 64, 2),
            d(2, 3, 4000, 96, 3),
            d(7, 4, 2048, 3072, 2),
            // bf16 from SLOT_TILES_MIN_TOKENS: slot tiles, from GROUPED_MIN_TOKENS on: grouped. Widths not
            // multiples of the 128-row tiles; experts with no slot; experts with several tiles
            // and a partial one.
            d(24, 8, 2880, 2880, 4),
            d(300, 4, 1088, 544, 2),
            d(77, 128, 512, 256, 4),
        ]
    }

    /// Random sizes: `tokens`, 1 to 40 experts, hidden and intermediate widths of 1 to
    /// `hidden_blocks` / `inter_blocks` blocks of 32, top-1 to top-4.
    fn random_dims(
        rng: &mut StdRng,
        tokens: std::ops::RangeInclusive<usize>,
        hidden_blocks: usize,
        inter_blocks: usize,
    ) -> Dims {
        let experts = rng.random_range(1..=40);
        Dims {
            tokens: rng.random_range(tokens),
            experts,
            hidden: 32 * rng.random_range(1..=hidden_blocks),
            inter: 32 * rng.random_range(1..=inter_blocks),
            k: rng.random_range(1..=experts.min(4)),
        }
    }

    /// By batch size (None), then each CUDA path forced.
    const ALL_PATHS: [Option<Path>; 5] = [
        None,
        Some(Path::PerSlot),
        Some(Path::SlotMma),
        Some(Path::SlotTiles),
        Some(Path::Grouped),
    ];

    fn check(d: Dims, dtype: DType, tol: f64) {
        check_path(d, dtype, tol, None, false);
    }

    /// The GPU op (output poisoned with NaN first, both output dtypes) against the CPU reference,
    /// on the path `path` (`None`: chosen by batch size). With `wild_scales`, an eighth of the
    /// E8M0 scales are extreme: 2^-127 (byte 0, subnormal), 2^-126, 2^2 and 2^3 (bytes 129 and
    /// 130, past what a bf16 factor 2^(s-1) holds).
    fn check_path(d: Dims, dtype: DType, tol: f64, path: Option<Path>, wild_scales: bool) {
        check_path_tols(d, dtype, (tol, tol), path, wild_scales);
    }

    /// An eighth of both projections' E8M0 scales made extreme: 2^-127 (byte 0, subnormal),
    /// 2^-126, 2^2 and 2^3 (bytes 129 and 130, past what a bf16 factor 2^(s-1) holds).
    fn make_scales_wild(inp: &mut Inputs, rng: &mut StdRng) {
        for n in [1, 4] {
            let mut v = inp.packed[n].flatten_all().unwrap().to_vec1::<u8>().unwrap();
            for s in v.iter_mut() {
                if rng.random_range(0..8) == 0 {
                    *s = [0, 1, 129, 130][rng.random_range(0..4)];
                }
            }
            inp.packed[n] = Tensor::from_vec(v, inp.packed[n].dims(), &Device::Cpu).unwrap();
        }
    }

    /// [`check_path`] with separate bounds for the output in x's dtype and in f32.
    fn check_path_tols(
        d: Dims,
        dtype: DType,
        (tol, tol_f32): (f64, f64),
        path: Option<Path>,
        wild_scales: bool,
    ) {
        let name =
            format!("gpu moe {dtype:?} {path:?} {d:?}{}", if wild_scales { " wild" } else { "" });
        let mut rng = rng(&name);
        let mut inp = inputs(&mut rng, d, dtype, DType::BF16);
        if wild_scales {
            make_scales_wild(&mut inp, &mut rng);
        }
        // The CPU reference in x's dtype (a bf16 output is rounded), and in f32 on the same
        // values for the f32 output.
        let cpu_experts = experts(&inp.packed, &Device::Cpu);
        let reference = |x: &Tensor| {
            values(&mxfp4_moe(x, &cpu_experts, &inp.ids, &inp.weights, SwiGlu::GPT_OSS).unwrap())
        };
        let want = reference(&inp.x);
        let want_f32 = match dtype {
            DType::F32 => want.clone(),
            _ => reference(&inp.x.to_dtype(DType::F32).unwrap()),
        };
        let dev = gpu();
        let ex = experts(&inp.packed, &dev);
        let (x, ids, w) = routed_on(&inp, &dev);
        for out_f32 in [false, true] {
            let mut op = Mxfp4Moe::new(&x, &ex, &ids, &w, SwiGlu::GPT_OSS, true).unwrap();
            op.out_f32 = out_f32;
            op.force_path = path;
            let got = x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
            if path == Some(Path::SlotMma) {
                // The sum in the down kernel's last block against moe_sum's launch: same bits.
                op.separate_sum = true;
                let separate = x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
                let bits = |t: &Tensor| values(t).iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                assert!(bits(&got) == bits(&separate), "{name}: the slot kernel's own sum differs");
                // Two tiles per warp in the slot kernels against one: same bits.
                op.separate_sum = false;
                op.one_tile = true;
                let one_tile = x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
                assert!(
                    bits(&got) == bits(&one_tile),
                    "{name}: the slot kernels with one tile a warp differ"
                );
                op.one_tile = false;
            }
            let want_dtype = if out_f32 { DType::F32 } else { dtype };
            assert_eq!(got.dtype(), want_dtype, "{name}: output dtype");
            let (want, tol) = if out_f32 { (&want_f32, tol_f32) } else { (&want, tol) };
            assert_written_and_close(
                &format!("{name} out {want_dtype:?}"),
                &values(&got),
                want,
                tol,
            );
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_moe_matches_cpu_f32() {
        cases().into_iter().for_each(|d| check(d, DType::F32, 1e-5));
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_moe_matches_cpu_bf16() {
        cases().into_iter().for_each(|d| check(d, DType::BF16, 1e-2));
    }

    /// The slot tiles (forced, whatever the batch size) against the CPU: gpt-oss-20b sizes at 2
    /// and 64 tokens, experts with several tiles and a partial one, one expert for every slot,
    /// widths that leave K past a quad's 4 blocks of 32, then random shapes (tokens 2..70, any
    /// expert count, top-1..4; the same expert recurs across tokens), and the wild E8M0 scales.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_slot_tiles_match_cpu() {
        let d = |tokens, experts, hidden, inter, k| Dims { tokens, experts, hidden, inter, k };
        let cases = vec![
            d(2, 32, 2880, 2880, 4),
            d(64, 32, 2880, 2880, 4),
            d(70, 2, 96, 64, 1),
            d(40, 1, 64, 32, 1),
            d(9, 3, 4000, 96, 3),
            d(3, 33, 32, 4000, 2),
            d(17, 13, 1088, 544, 4),
        ];
        check_forced_cases(Path::SlotTiles, cases, (12, 2..=70), [5, 67]);
    }

    /// The grouped GEMMs (forced, whatever the batch size) against the CPU: gpt-oss-20b sizes at
    /// 512 tokens (and 3, one partial tile per expert), one expert for every slot (many full tiles
    /// and a partial one), widths that leave partial blocks of 128 weight rows and warps with no
    /// row, K of 1 to 7 blocks of 32 (not a multiple of the 4 per stage, fewer than the 3 stages
    /// in flight), then random shapes and the wild E8M0 scales (the slow decode).
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_grouped_matches_cpu() {
        let d = |tokens, experts, hidden, inter, k| Dims { tokens, experts, hidden, inter, k };
        let cases = vec![
            d(512, 32, 2880, 2880, 4),
            d(3, 32, 2880, 2880, 4),
            d(200, 1, 96, 64, 1),
            d(65, 3, 4000, 96, 3),
            d(40, 5, 32, 224, 2),
            d(9, 2, 160, 32, 2),
            d(130, 7, 1088, 544, 4),
        ];
        check_forced_cases(Path::Grouped, cases, (10, 1..=300), [5, 150]);
        // Every compiled variant; K of 7 blocks of 32 (fewer stages than some rings hold).
        for variant in crate::kernels::mxfp4_moe::gpu::GROUPED_VARIANTS {
            for tokens in [3, 70, 260] {
                check_grouped_variant(d(tokens, 7, 224, 224, 4), variant);
            }
        }
    }

    /// `path` forced on `cases`, then on `random.0` random shapes of `random.1` tokens (any
    /// expert count, top-1..4; the same expert recurs across tokens), then with the wild E8M0
    /// scales at each of `wild` tokens.
    fn check_forced_cases(
        path: Path,
        mut cases: Vec<Dims>,
        random: (usize, std::ops::RangeInclusive<usize>),
        wild: [usize; 2],
    ) {
        let mut rng = rng(&format!("gpu {path:?} random shapes"));
        cases.extend((0..random.0).map(|_| random_dims(&mut rng, random.1.clone(), 40, 24)));
        for d in cases {
            check_path(d, DType::BF16, 1e-2, Some(path), false);
        }
        for tokens in wild {
            let d = Dims { tokens, experts: 6, hidden: 256, inter: 128, k: 3 };
            check_path(d, DType::BF16, 1e-2, Some(path), true);
        }
    }

    fn check_grouped_variant(d: Dims, variant: crate::kernels::mxfp4_moe::gpu::GroupedVariant) {
        check_forced(d, &format!("gpu moe grouped {variant:?} {d:?}"), |op| {
            op.force_path = Some(Path::Grouped);
            op.grouped_variant = Some(variant);
        });
    }

    /// The op, as `set` configures it, against the CPU reference.
    fn check_forced(d: Dims, name: &str, set: impl Fn(&mut Mxfp4Moe)) {
        let mut rng = rng(name);
        let inp = inputs(&mut rng, d, DType::BF16, DType::BF16);
        let want = values(
            &mxfp4_moe(
                &inp.x,
                &experts(&inp.packed, &Device::Cpu),
                &inp.ids,
                &inp.weights,
                SwiGlu::GPT_OSS,
            )
            .unwrap(),
        );
        let dev = gpu();
        let (x, ids, w) = routed_on(&inp, &dev);
        let mut op =
            Mxfp4Moe::new(&x, &experts(&inp.packed, &dev), &ids, &w, SwiGlu::GPT_OSS, true)
                .unwrap();
        set(&mut op);
        let got = x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
        assert_written_and_close(name, &values(&got), &want, 1e-2);
    }

    /// The per-slot tensor-core GEMVs (forced, whatever the batch size) against the CPU:
    /// gpt-oss-20b and 120b widths at one token, several tokens, K of 1 to 7 blocks of 32 past a
    /// multiple of the 4 blocks a quad of lanes reads (and fewer blocks than the block's 8 warps
    /// have quads), one expert, then random shapes; the wild E8M0 scales take the slow decode.
    /// The f32 output too, held to the f32 bound of the CPU reference's rounding: the activations
    /// travel as hi + mid + lo, the f32 value exactly.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_slot_mma_matches_cpu() {
        let d = |tokens, experts, hidden, inter, k| Dims { tokens, experts, hidden, inter, k };
        let mut cases = vec![
            d(1, 32, 2880, 2880, 4),
            d(1, 128, 2880, 2880, 4),
            d(3, 8, 2880, 2880, 4),
            d(2, 5, 32 * 9, 32 * 5, 3),
            d(1, 3, 32, 32 * 7, 2),
            d(4, 1, 64, 96, 1),
            d(1, 6, 32 * 131, 32 * 3, 4),
        ];
        let mut rng = rng("gpu slot mma random shapes");
        cases.extend((0..12).map(|_| random_dims(&mut rng, 1..=6, 60, 40)));
        for d in cases {
            check_path_tols(d, DType::BF16, (1e-2, 2e-5), Some(Path::SlotMma), false);
        }
        for tokens in [1, 3] {
            let d = d(tokens, 6, 256, 160, 3);
            check_path_tols(d, DType::BF16, (1e-2, 2e-5), Some(Path::SlotMma), true);
        }
    }

    /// The slot tiles (forced) give every token the slot kernel's bits (forced) at once: decode
    /// sizes at gpt-oss-20b's and 120b's widths, random shapes (K past a quad's 4 blocks, experts
    /// with one slot or many, tiles cut at 8), the wild E8M0 scales' slow decode.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_slot_tiles_equal_the_slot_kernel() {
        let d = |tokens, experts, hidden, inter, k| Dims { tokens, experts, hidden, inter, k };
        let mut cases = vec![
            (d(1, 32, 2880, 2880, 4), false),
            (d(8, 32, 2880, 2880, 4), false),
            (d(64, 32, 2880, 2880, 4), false),
            (d(40, 128, 2880, 2880, 4), false),
            (d(30, 2, 32 * 9, 32 * 5, 2), false),
            (d(9, 6, 256, 160, 3), true),
        ];
        let mut rng = rng("gpu slot tiles random shapes");
        cases.extend((0..10).map(|_| (random_dims(&mut rng, 1..=70, 60, 40), false)));
        let dev = gpu();
        for (d, wild) in cases {
            let name = format!("slot tiles {d:?} wild {wild}");
            let mut rng = self::rng(&name);
            let mut inp = inputs(&mut rng, d, DType::BF16, DType::BF16);
            if wild {
                make_scales_wild(&mut inp, &mut rng);
            }
            let ex = experts(&inp.packed, &dev);
            let (x, ids, w) = routed_on(&inp, &dev);
            for out_f32 in [false, true] {
                let run = |path| {
                    let mut op = Mxfp4Moe::new(&x, &ex, &ids, &w, SwiGlu::GPT_OSS, true).unwrap();
                    op.out_f32 = out_f32;
                    op.force_path = Some(path);
                    let y = x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
                    let v = y.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
                    v.to_vec1::<f32>().unwrap().iter().map(|f| f.to_bits()).collect::<Vec<u32>>()
                };
                let (alone, tiled) = (run(Path::SlotMma), run(Path::SlotTiles));
                let differ = alone.iter().zip(&tiled).filter(|(a, b)| a != b).count();
                assert!(differ == 0, "{name} f32 out {out_f32}: {differ} values differ");
            }
        }
    }

    /// By batch size, bf16 takes the per-slot GEMVs below 8 tokens, the slot tiles from there and
    /// the grouped GEMMs from GROUPED_MIN_TOKENS: the same answers on every path (all against the
    /// CPU), at each threshold.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_moe_paths_agree_with_cpu_at_the_thresholds() {
        use crate::kernels::mxfp4_moe::gpu::{GROUPED_MIN_TOKENS, SLOT_TILES_MIN_TOKENS};
        for tokens in [
            SLOT_TILES_MIN_TOKENS - 1,
            SLOT_TILES_MIN_TOKENS,
            GROUPED_MIN_TOKENS - 1,
            GROUPED_MIN_TOKENS,
        ] {
            let d = Dims { tokens, experts: 8, hidden: 256, inter: 128, k: 4 };
            for path in ALL_PATHS {
                check_path(d, DType::BF16, 1e-2, path, false);
            }
        }
    }

    /// Each token of a batch below the grouped GEMMs' threshold (the slot kernel's sizes and the
    /// slot tiles') gets the bits it gets alone: the tiny gpt-oss's and 20b's widths, f32 output
    /// (what the model adds to its residual stream) and bf16.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_slot_tokens_alone_equal_tokens_in_a_batch() {
        use crate::kernels::mxfp4_moe::gpu::{GROUPED_MIN_TOKENS, SLOT_TILES_MIN_TOKENS};
        let dev = gpu();
        let mut differ = Vec::new();
        let sizes = |wide: bool| {
            let mut t: Vec<usize> = (2..SLOT_TILES_MIN_TOKENS + 2).collect();
            t.extend([17, 64]);
            if !wide {
                t.extend([100, GROUPED_MIN_TOKENS - 1]);
            }
            t
        };
        for (experts, hidden, inter) in [(8, 64, 64), (32, 2880, 2880)] {
            for tokens in sizes(hidden > 64) {
                let d = Dims { tokens, experts, hidden, inter, k: 4 };
                let mut rng = rng(&format!("slot invariance {d:?}"));
                let inp = inputs(&mut rng, d, DType::BF16, DType::BF16);
                let ex = super::experts(&inp.packed, &dev);
                let (x, ids, w) = routed_on(&inp, &dev);
                for out_f32 in [false, true] {
                    let run = |x: &Tensor, ids: &Tensor, w: &Tensor| {
                        let mut op = Mxfp4Moe::new(x, &ex, ids, w, SwiGlu::GPT_OSS, true).unwrap();
                        op.out_f32 = out_f32;
                        let y = x.apply_op3_no_bwd(ids, w, &op).unwrap();
                        y.to_dtype(DType::F32)
                            .unwrap()
                            .flatten_all()
                            .unwrap()
                            .to_vec1::<f32>()
                            .unwrap()
                    };
                    let batch = run(&x, &ids, &w);
                    for t in 0..tokens {
                        let one = |a: &Tensor| a.narrow(0, t, 1).unwrap().contiguous().unwrap();
                        let alone = run(&one(&x), &one(&ids), &one(&w));
                        let row = &batch[t * hidden..][..hidden];
                        if alone.iter().zip(row).any(|(a, b)| a.to_bits() != b.to_bits()) {
                            differ.push(format!("{d:?} f32 out {out_f32}: token {t}"));
                        }
                    }
                }
            }
        }
        assert!(differ.is_empty(), "tokens differ from themselves alone: {differ:#?}");
    }

    /// `moe_group` against the grouping written plainly: each expert's slots in slot order,
    /// experts in order, slots routed nowhere (ids past the experts) left out, and each expert's
    /// run cut into tiles of `tile` in order, then tiles of −1. Random ids, some of them routed
    /// nowhere, from one slot to more than the block's 1,024 threads, 1 to 1,024 experts
    /// (one a thread), slot tiles (8) and the grouped GEMMs' (64), and one expert taking most.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_group_matches_cpu() {
        let dev = gpu();
        let cuda = dev.as_cuda_device().unwrap();
        let mut r = rng("moe group");
        let cases = [
            (1, 32, 8),
            (256, 128, 8),
            (256, 32, 8),
            (1000, 7, 64),
            (8192, 128, 64),
            (3000, 1024, 8),
            (4100, 1024, 64),
            (700, 1, 8),
        ];
        for (slots, experts, tile) in cases {
            let crowd = r.random_range(0..experts as u32);
            let ids: Vec<u32> = (0..slots)
                .map(|_| match r.random_range(0..20) {
                    0 => experts as u32 + r.random_range(0..3),
                    1..=4 => crowd,
                    _ => r.random_range(0..experts as u32),
                })
                .collect();
            let (sorted, tiles) =
                crate::kernels::mxfp4_moe::gpu::group_ids(cuda, &ids, experts, tile).unwrap();
            let (want_sorted, want_tiles) = group_plainly(&ids, experts, tile);
            let what = format!("{slots} slots, {experts} experts, tiles of {tile}");
            assert_eq!(sorted, want_sorted, "{what}: the grouped slots");
            assert_eq!(tiles.len(), 3 * want_tiles.len(), "{what}: the tiles' size");
            for (t, want) in want_tiles.iter().enumerate() {
                let got = &tiles[3 * t..3 * t + 3];
                // Past the last tile only the expert (−1) is written.
                let ok = if want[0] < 0 { got[0] == -1 } else { got == want };
                assert!(ok, "{what}: tile {t} is {got:?}, not {want:?}");
            }
        }
    }

    /// The grouped slots and the tiles `[slots / tile + experts]` (expert, first position,
    /// count) that `moe_group` gives, one expert at a time.
    fn group_plainly(ids: &[u32], experts: usize, tile: usize) -> (Vec<i32>, Vec<[i32; 3]>) {
        let mut sorted = Vec::new();
        let mut tiles = Vec::new();
        for e in 0..experts {
            let first = sorted.len();
            sorted.extend((0..ids.len()).filter(|&s| ids[s] as usize == e).map(|s| s as i32));
            let count = sorted.len() - first;
            for m in (0..count).step_by(tile) {
                tiles.push([e as i32, (first + m) as i32, tile.min(count - m) as i32]);
            }
        }
        tiles.resize(ids.len().div_ceil(tile) + experts, [-1, 0, 0]);
        (sorted, tiles)
    }

    /// Routing on the GPU (route.cu) plus experts against the CPU reference: decode and prefill
    /// sizes, gpt-oss-20b's 32 and 120b's 128 experts, logits full of ties; with padding rows
    /// (`live`) on each path: zero there, and below the grouped GEMMs the live rows' bits those
    /// of the call without them.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_routed_matches_cpu() {
        let dev = gpu();
        for (tokens, experts, dtype, live) in [
            (1, 32, DType::BF16, None),
            (37, 128, DType::BF16, None),
            (300, 32, DType::BF16, None),
            (5, 128, DType::F32, None),
            (4, 32, DType::BF16, Some(3)),
            (16, 128, DType::BF16, Some(11)),
            (64, 32, DType::BF16, Some(1)),
            (300, 32, DType::BF16, Some(290)),
            (5, 128, DType::F32, Some(2)),
        ] {
            let d = Dims { tokens, experts, hidden: 256, inter: 128, k: 4 };
            let name = format!("gpu routed {dtype:?} {d:?} live {live:?}");
            let mut rng = rng(&name);
            let inp = inputs(&mut rng, d, dtype, DType::BF16);
            let (logits, bias) = router_inputs(&mut rng, tokens, experts);
            let live_on = |dev: &Device| live.map(|l: u32| Tensor::new(&[l], dev).unwrap());
            let want = values(
                &mxfp4_moe_routed(
                    &inp.x,
                    &experts_on(&inp, &Device::Cpu),
                    &logits,
                    &bias,
                    d.k,
                    SwiGlu::GPT_OSS,
                    live_on(&Device::Cpu).as_ref(),
                )
                .unwrap(),
            );
            let to = |t: &Tensor| t.to_device(&dev).unwrap();
            let run = |live: Option<&Tensor>| {
                let out = mxfp4_moe_routed(
                    &to(&inp.x),
                    &experts_on(&inp, &dev),
                    &to(&logits),
                    &to(&bias),
                    d.k,
                    SwiGlu::GPT_OSS,
                    live,
                );
                values(&out.unwrap())
            };
            let got = run(live_on(&dev).as_ref());
            assert_written_and_close(
                &name,
                &got,
                &want,
                if dtype == DType::F32 { 1e-5 } else { 1e-2 },
            );
            if let Some(l) = live {
                let at = l as usize * d.hidden;
                assert!(got[at..].iter().all(|&v| v == 0.0), "{name}: padding rows are zero");
                // Below the grouped GEMMs a token's bits do not depend on the batch.
                if tokens >= crate::kernels::mxfp4_moe::gpu::GROUPED_MIN_TOKENS {
                    continue;
                }
                let all = run(None);
                let same =
                    all[..at].iter().zip(&got[..at]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name}: live rows differ from the call without padding");
            }
        }
    }

    fn experts_on(inp: &Inputs, dev: &Device) -> Mxfp4Experts {
        experts(&inp.packed, dev)
    }

    /// `inp`'s x, expert ids and routing weights on `dev`.
    fn routed_on(inp: &Inputs, dev: &Device) -> (Tensor, Tensor, Tensor) {
        let to = |t: &Tensor| t.to_device(dev).unwrap();
        (to(&inp.x), to(&inp.ids), to(&inp.weights))
    }

    /// Not a check: prints the time of gpt-oss-20b-sized MoE calls (32 experts, top 4) on each
    /// CUDA path and on the one chosen by batch size, to read the crossovers off.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_moe_timing() {
        let dev = gpu();
        let d = Dims { tokens: 512, experts: 32, hidden: 2880, inter: 2880, k: 4 };
        let mut rng = rng("moe timing");
        let inp = inputs(&mut rng, d, DType::BF16, DType::BF16);
        let ex = experts(&inp.packed, &dev);
        let (x, ids, w) = routed_on(&inp, &dev);
        let ids_host = inp.ids.to_vec2::<u32>().unwrap();
        for tokens in [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512] {
            let (x, ids, w) = (
                x.narrow(0, 0, tokens).unwrap(),
                ids.narrow(0, 0, tokens).unwrap(),
                w.narrow(0, 0, tokens).unwrap(),
            );
            // The distinct experts' packed weights: what a path that reads each used expert once
            // must read.
            let mut used = ids_host[..tokens].iter().flatten().copied().collect::<Vec<_>>();
            used.sort_unstable();
            used.dedup();
            let bytes = used.len() as f64 * (3 * d.hidden * d.inter) as f64 * 17.0 / 32.0;
            let mut line =
                format!("moe timing: {tokens:>3} tokens bf16 ({:>2} experts):", used.len());
            // The op as `set` configures it, timed.
            let time = |set: &dyn Fn(&mut Mxfp4Moe)| {
                let mut op = Mxfp4Moe::new(&x, &ex, &ids, &w, SwiGlu::GPT_OSS, false).unwrap();
                set(&mut op);
                crate::kernels::testing::time_us(&dev, 20, || {
                    x.apply_op3_no_bwd(&ids, &w, &op).unwrap();
                })
            };
            for path in ALL_PATHS {
                if matches!(path, Some(Path::PerSlot | Path::SlotMma)) && tokens > 128 {
                    continue;
                }
                let us = time(&|op| op.force_path = path);
                let name = path.map_or("auto".to_string(), |p| format!("{p:?}"));
                line += &format!(" | {name} {us:.1} us ({:.0} GB/s)", bytes / us / 1e3);
            }
            // The grouped variants (MT, STAGES), from the sizes where prompts take them.
            for variant in crate::kernels::mxfp4_moe::gpu::GROUPED_VARIANTS {
                if tokens < 64 {
                    continue;
                }
                let us = time(&|op| {
                    op.force_path = Some(Path::Grouped);
                    op.grouped_variant = Some(variant);
                });
                line += &format!(" | grouped{variant:?} {us:.1}");
            }
            eprintln!("{line}");
        }
    }
}
