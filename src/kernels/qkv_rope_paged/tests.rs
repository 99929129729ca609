//! The reference against candle's `rope`/`rope_i` per token and a slot-by-slot look at the
//! pools; then the CUDA kernel against the reference.

use candle_core::{DType, Device, Tensor};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::*;
use crate::kernels::kv_fp8::Codes;
use crate::kernels::testing::{rng, tensor, uniform, values};

const TABLE_ROWS: usize = 64;

struct Inputs {
    qkv: Tensor,
    bias: Option<Tensor>,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    slots: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    /// FP8 pools' scales.
    scales: Option<(Tensor, Tensor)>,
    /// q's and k's norm weights.
    norm: Option<(Tensor, Tensor)>,
}

const NORM_EPS: f64 = 1e-6;

/// `tokens` tokens at random positions, stored in distinct random slots of a `num_slots` pool,
/// every third or so padding (no slot); pools of random values in `dtype`.
fn inputs(
    r: &mut StdRng,
    h: QkvHeads,
    tokens: usize,
    num_slots: usize,
    dtype: DType,
    bias: bool,
) -> Inputs {
    let (d, width) = (h.head_dim, (h.heads + 2 * h.kv_heads) * h.head_dim);
    let angles = uniform(r, TABLE_ROWS * d / 2, -3.0, 3.0);
    let table = |f: fn(f32) -> f32| {
        tensor(angles.iter().map(|&a| f(a)).collect(), &[TABLE_ROWS, d / 2], DType::F32)
    };
    let mut free: Vec<u32> = (0..num_slots as u32).collect();
    free.shuffle(r);
    let slots: Vec<u32> =
        (0..tokens).map(|t| if r.random_range(0..3) == 0 { NO_SLOT } else { free[t] }).collect();
    let positions: Vec<u32> = (0..tokens).map(|_| r.random_range(0..TABLE_ROWS as u32)).collect();
    let pool_shape = [num_slots, h.kv_heads, d];
    let mut pool = || tensor(uniform(r, num_slots * h.kv_heads * d, -1.0, 1.0), &pool_shape, dtype);
    let (k_pool, v_pool) = (pool(), pool());
    Inputs {
        qkv: tensor(uniform(r, tokens * width, -1.0, 1.0), &[tokens, width], DType::F32),
        bias: bias.then(|| tensor(uniform(r, width, -1.0, 1.0), &[width], DType::F32)),
        cos: table(f32::cos),
        sin: table(f32::sin),
        positions: Tensor::new(positions, &Device::Cpu).unwrap(),
        slots: Tensor::new(slots, &Device::Cpu).unwrap(),
        k_pool,
        v_pool,
        scales: None,
        norm: None,
    }
}

/// `x` with q and k norm weights of Qwen3's spread (gains 0.5 to 3).
fn with_norm(r: &mut StdRng, x: Inputs, d: usize) -> Inputs {
    let mut w = || tensor(uniform(r, d, 0.5, 3.0), &[d], DType::F32);
    Inputs { norm: Some((w(), w())), ..x }
}

fn run(x: &Inputs, h: QkvHeads, pairs: RotaryPairs) -> candle_core::Result<Tensor> {
    qkv_rope_paged(
        &x.qkv,
        x.bias.as_ref(),
        x.norm.as_ref().map(|(q, k)| QkNorm { q, k, eps: NORM_EPS }),
        &x.cos,
        &x.sin,
        &x.positions,
        &x.slots,
        h,
        pairs,
        &x.k_pool,
        &x.v_pool,
        x.scales.as_ref().map(|(k, v)| (k, v)),
        false,
    )
}

/// Each element within `tol` of the expected one, relative to max(1, |expected|).
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

/// candle's RoPE of heads `[T, n, d]` (f32), each token at its own row of the tables: as
/// `[1, n, T, d]` with the tables' rows gathered by position.
fn candle_rope(x: &Tensor, cos: &Tensor, sin: &Tensor, pairs: RotaryPairs) -> Tensor {
    let x = x.transpose(0, 1).unwrap().unsqueeze(0).unwrap().contiguous().unwrap();
    let y = match pairs {
        RotaryPairs::HalfSplit => candle_nn::rotary_emb::rope(&x, cos, sin),
        RotaryPairs::Interleaved => candle_nn::rotary_emb::rope_i(&x, cos, sin),
    };
    y.unwrap().squeeze(0).unwrap().transpose(0, 1).unwrap().contiguous().unwrap()
}

fn check_reference(h: QkvHeads, pairs: RotaryPairs, dtype: DType, bias: bool, norm: bool) {
    let name = format!("qkv_rope_paged {h:?} {pairs:?} {dtype:?} bias {bias} norm {norm}");
    let mut r = rng(&name);
    let (tokens, num_slots) = (r.random_range(1..20), 40);
    let x = inputs(&mut r, h, tokens, num_slots, dtype, bias);
    let x = if norm { with_norm(&mut r, x, h.head_dim) } else { x };
    let (k0, v0) = (values(&x.k_pool), values(&x.v_pool));
    let q = values(&run(&x, h, pairs).unwrap());

    // The expected values, from candle ops in f32 and rounded once to the pools' dtype.
    let mut qkv = x.qkv.clone();
    if let Some(b) = &x.bias {
        qkv = qkv.broadcast_add(b).unwrap();
    }
    // candle-nn's rms_norm over q's and k's heads (its own order of the sum of squares).
    if let Some((qn, kn)) = &x.norm {
        let (n, d) = (h.heads + h.kv_heads, h.head_dim);
        let normed = |start: usize, n: usize, w: &Tensor| {
            let part = qkv.narrow(1, start * d, n * d).unwrap().contiguous().unwrap();
            let part = part.reshape((tokens * n, d)).unwrap();
            crate::kernels::rms_norm(&part, w, NORM_EPS).unwrap().reshape((tokens, n * d)).unwrap()
        };
        let (q, k) = (normed(0, h.heads, qn), normed(h.heads, h.kv_heads, kn));
        let v = qkv.narrow(1, n * d, h.kv_heads * d).unwrap();
        qkv = Tensor::cat(&[q, k, v], 1).unwrap();
    }
    let qkv = qkv.reshape((tokens, h.heads + 2 * h.kv_heads, h.head_dim)).unwrap();
    let (cos, sin) = (
        x.cos.index_select(&x.positions, 0).unwrap(),
        x.sin.index_select(&x.positions, 0).unwrap(),
    );
    let part = |from, n| qkv.narrow(1, from, n).unwrap();
    let rounded = |t: Tensor| values(&t.to_dtype(dtype).unwrap());
    let want_q = rounded(candle_rope(&part(0, h.heads), &cos, &sin, pairs));
    let want_k = rounded(candle_rope(&part(h.heads, h.kv_heads), &cos, &sin, pairs));
    let want_v = rounded(part(h.heads + h.kv_heads, h.kv_heads).contiguous().unwrap());
    let tol = match (dtype, norm) {
        (DType::F32, false) => 1e-6,
        (DType::F32, true) => 4e-6, // the norm's sums of squares in another order, times gains ≤ 3
        _ => 8e-3,
    };
    assert_close(&format!("{name} q"), &q, &want_q, tol);

    let slots = x.slots.to_vec1::<u32>().unwrap();
    let (k, v) = (values(&x.k_pool), values(&x.v_pool));
    let row = h.kv_heads * h.head_dim;
    for slot in 0..num_slots {
        let at = slot * row..(slot + 1) * row;
        match slots.iter().position(|&s| s as usize == slot) {
            Some(t) => {
                let from = t * row..(t + 1) * row;
                assert_close(
                    &format!("{name} k slot {slot}"),
                    &k[at.clone()],
                    &want_k[from.clone()],
                    tol,
                );
                assert_eq!(&v[at], &want_v[from], "{name} v slot {slot}");
            }
            None => {
                assert_eq!(&k[at.clone()], &k0[at.clone()], "{name}: slot {slot} written");
                assert_eq!(&v[at.clone()], &v0[at], "{name}: slot {slot} written");
            }
        }
    }
}

#[test]
fn reference_matches_candle_rope_and_writes_the_slots() {
    for h in [
        QkvHeads { heads: 4, kv_heads: 2, head_dim: 16 },
        QkvHeads { heads: 8, kv_heads: 1, head_dim: 64 },
    ] {
        for pairs in [RotaryPairs::HalfSplit, RotaryPairs::Interleaved] {
            for (dtype, bias) in [(DType::F32, true), (DType::F32, false), (DType::BF16, true)] {
                check_reference(h, pairs, dtype, bias, false);
            }
            check_reference(h, pairs, DType::F32, false, true);
            check_reference(h, pairs, DType::BF16, true, true);
        }
    }
}

#[test]
fn rejects_positions_and_slots_outside() {
    let h = QkvHeads { heads: 2, kv_heads: 1, head_dim: 8 };
    let mut r = rng("qkv_rope_paged rejects");
    let x = inputs(&mut r, h, 3, 10, DType::F32, false);
    let mut with = |positions: &[u32], slots: &[u32]| {
        let x = Inputs {
            positions: Tensor::new(positions, &Device::Cpu).unwrap(),
            slots: Tensor::new(slots, &Device::Cpu).unwrap(),
            ..inputs(&mut r, h, 3, 10, DType::F32, false)
        };
        run(&x, h, RotaryPairs::HalfSplit).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(with(&[0, 1, 2], &[0, NO_SLOT, 9]).is_ok());
    assert!(with(&[0, 64, 2], &[0, 1, 2]).unwrap_err().contains("past the"));
    assert!(with(&[0, 1, 2], &[0, 10, 2]).unwrap_err().contains("past the"));
    let empty = Tensor::zeros((0, 32), DType::F32, &Device::Cpu).unwrap();
    let none = Tensor::zeros(0, DType::U32, &Device::Cpu).unwrap();
    let q = qkv_rope_paged(
        &empty,
        None,
        None,
        &x.cos,
        &x.sin,
        &none,
        &none,
        h,
        RotaryPairs::HalfSplit,
        &x.k_pool,
        &x.v_pool,
        None,
        false,
    );
    assert_eq!(q.unwrap().dims(), [0, 2, 8]);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_reference() {
    use crate::kernels::testing::{assert_written_and_close, gpu};
    let dev = gpu();
    let mut r = rng("qkv_rope_paged gpu");
    for h in [
        QkvHeads { heads: 64, kv_heads: 8, head_dim: 64 },
        QkvHeads { heads: 32, kv_heads: 8, head_dim: 128 },
        QkvHeads { heads: 8, kv_heads: 4, head_dim: 256 },
        QkvHeads { heads: 6, kv_heads: 2, head_dim: 16 },
    ] {
        for pairs in [RotaryPairs::HalfSplit, RotaryPairs::Interleaved] {
            let cases = [(DType::F32, true), (DType::BF16, false), (DType::BF16, true)];
            for ((dtype, bias), norm) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
                let name =
                    format!("gpu qkv_rope_paged {h:?} {pairs:?} {dtype:?} bias {bias} norm {norm}");
                let tokens = r.random_range(1..300);
                let x = inputs(&mut r, h, tokens, 400, dtype, bias);
                let x = if norm { with_norm(&mut r, x, h.head_dim) } else { x };
                let on = |t: &Tensor| t.to_device(&dev).unwrap();
                let g = Inputs {
                    qkv: on(&x.qkv),
                    bias: x.bias.as_ref().map(on),
                    cos: on(&x.cos),
                    sin: on(&x.sin),
                    positions: on(&x.positions),
                    slots: on(&x.slots),
                    k_pool: on(&x.k_pool),
                    v_pool: on(&x.v_pool),
                    scales: None,
                    norm: x.norm.as_ref().map(|(q, k)| (on(q), on(k))),
                };
                let want = values(&run(&x, h, pairs).unwrap());
                let got = values(&run(&g, h, pairs).unwrap());
                // Both compute in f32 and round once; they may differ where the kernel's fused
                // multiply-adds move an f32 result across a bf16 rounding boundary (one ulp).
                let tol = if dtype == DType::F32 { 1e-6 } else { 1e-3 };
                assert_written_and_close(&format!("{name} q"), &got, &want, tol);
                let pools = [(&g.k_pool, &x.k_pool, "k"), (&g.v_pool, &x.v_pool, "v")];
                for (gp, cp, what) in pools {
                    assert_written_and_close(
                        &format!("{name} {what}"),
                        &values(gp),
                        &values(cp),
                        tol,
                    );
                }
            }
        }
    }
}

/// `x` with pools of `codes` of `num_slots` (codes of garbage, scales 0).
fn with_coded_pools(x: Inputs, h: QkvHeads, num_slots: usize, codes: Codes) -> Inputs {
    let raw: Vec<u8> =
        (0..num_slots * h.kv_heads * h.head_dim).map(|i| (i * 37 % 251) as u8).collect();
    let dims = [num_slots, h.kv_heads, h.head_dim];
    let pool = || Tensor::from_raw_buffer(&raw, codes.dtype(), &dims, &Device::Cpu).unwrap();
    let scales = || Tensor::zeros((num_slots, h.kv_heads), DType::U8, &Device::Cpu).unwrap();
    Inputs { k_pool: pool(), v_pool: pool(), scales: Some((scales(), scales())), ..x }
}

/// The raw codes of an FP8 pool and its scales, on the host.
fn fp8_pool(codes: &Tensor, scales: &Tensor) -> (Vec<u8>, Vec<u8>) {
    let codes = codes.to_device(&Device::Cpu).unwrap();
    let (storage, _) = codes.storage_and_layout();
    let candle_core::Storage::Cpu(s) = &*storage else { panic!("not on the CPU") };
    let raw = crate::kernels::kv_fp8::cpu_codes(s).unwrap();
    (raw, scales.flatten_all().unwrap().to_device(&Device::Cpu).unwrap().to_vec1().unwrap())
}

/// Pools of codes: each stored row is the f32 pools' row quantized under its own scale
/// (kv_fp8::quantize_row), keys rotated first (kv_fp8::rotate), the other slots untouched; q as
/// with f32 pools, rotated alike (kv_fp8's tests check that the scores stay).
#[test]
fn coded_reference_quantizes_each_stored_row() {
    let h = QkvHeads { heads: 4, kv_heads: 2, head_dim: 16 };
    let mut r = rng("qkv_rope_paged codes");
    for (pairs, codes) in [
        (RotaryPairs::HalfSplit, Codes::E4m3),
        (RotaryPairs::Interleaved, Codes::E4m3),
        (RotaryPairs::HalfSplit, Codes::Int8),
    ] {
        let (tokens, num_slots) = (r.random_range(1..20), 40);
        let x = inputs(&mut r, h, tokens, num_slots, DType::F32, true);
        let slots = x.slots.to_vec1::<u32>().unwrap();
        let q32 = values(&run(&x, h, pairs).unwrap());
        let (k32, v32) = (values(&x.k_pool), values(&x.v_pool));
        let x = with_coded_pools(x, h, num_slots, codes);
        let (k0, _) = fp8_pool(&x.k_pool, &x.scales.as_ref().unwrap().0);
        let q = run(&x, h, pairs).unwrap();
        assert_eq!(q.dtype(), DType::F32, "the CPU's q with pools of codes");
        let q = values(&q);
        let d = h.head_dim;
        let turned = |rows: &[f32], key: bool| -> Vec<f32> {
            let mut out = rows.to_vec();
            out.chunks_mut(d).for_each(|r| crate::kernels::kv_fp8::rotate(r, key));
            out
        };
        assert_eq!(q, turned(&q32, false), "q rotated");
        let k32 = turned(&k32, true);
        let (ks, vs) = x.scales.as_ref().unwrap();
        let row = h.kv_heads * h.head_dim;
        for (pool, scales, want) in [(&x.k_pool, ks, &k32), (&x.v_pool, vs, &v32)] {
            let (got, scales) = fp8_pool(pool, scales);
            for slot in 0..num_slots {
                let at = slot * row..(slot + 1) * row;
                if !slots.contains(&(slot as u32)) {
                    assert_eq!(&got[at.clone()], &k0[at], "slot {slot} written");
                    continue;
                }
                for g in 0..h.kv_heads {
                    let r0 = slot * row + g * h.head_dim;
                    let mut c = vec![0u8; h.head_dim];
                    let s = crate::kernels::kv_fp8::quantize_row(
                        codes,
                        &want[r0..][..h.head_dim],
                        &mut c,
                    );
                    assert_eq!(scales[slot * h.kv_heads + g], s, "slot {slot} head {g} scale");
                    assert_eq!(&got[r0..][..h.head_dim], &c[..], "slot {slot} head {g} codes");
                }
            }
        }
    }
}

/// The FP8 kernel against the reference: the same codes and scales bit for bit (RoPE rounded
/// step by step on both), q in bf16 within a rounding of the reference's f32.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_fp8_matches_reference() {
    use crate::kernels::testing::{assert_written_and_close, gpu};
    let dev = gpu();
    let mut r = rng("qkv_rope_paged gpu fp8");
    for h in [
        QkvHeads { heads: 64, kv_heads: 8, head_dim: 64 },
        QkvHeads { heads: 32, kv_heads: 8, head_dim: 128 },
        QkvHeads { heads: 8, kv_heads: 4, head_dim: 256 },
    ] {
        for (pairs, bias, codes, norm) in [
            (RotaryPairs::HalfSplit, true, Codes::E4m3, false),
            (RotaryPairs::Interleaved, false, Codes::E4m3, true),
            (RotaryPairs::HalfSplit, false, Codes::Int8, true),
            (RotaryPairs::Interleaved, true, Codes::Int8, false),
        ] {
            let name =
                format!("gpu qkv_rope_paged {codes:?} {h:?} {pairs:?} bias {bias} norm {norm}");
            let (tokens, num_slots) = (r.random_range(1..300), 400);
            let x = inputs(&mut r, h, tokens, num_slots, DType::F32, bias);
            let x = if norm { with_norm(&mut r, x, h.head_dim) } else { x };
            let x = with_coded_pools(x, h, num_slots, codes);
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let (ks, vs) = x.scales.as_ref().unwrap();
            let g = Inputs {
                qkv: on(&x.qkv),
                bias: x.bias.as_ref().map(on),
                cos: on(&x.cos),
                sin: on(&x.sin),
                positions: on(&x.positions),
                slots: on(&x.slots),
                k_pool: on(&x.k_pool),
                v_pool: on(&x.v_pool),
                scales: Some((on(ks), on(vs))),
                norm: x.norm.as_ref().map(|(q, k)| (on(q), on(k))),
            };
            let want = values(&run(&x, h, pairs).unwrap());
            let q = run(&g, h, pairs).unwrap();
            assert_eq!(q.dtype(), DType::BF16, "{name}: q with fp8 pools on CUDA");
            assert_written_and_close(&format!("{name} q"), &values(&q), &want, 8e-3);
            let (gks, gvs) = g.scales.as_ref().unwrap();
            for (gp, gs, cp, cs, what) in
                [(&g.k_pool, gks, &x.k_pool, ks, "k"), (&g.v_pool, gvs, &x.v_pool, vs, "v")]
            {
                let (got, want) = (fp8_pool(gp, gs), fp8_pool(cp, cs));
                assert_eq!(got.1, want.1, "{name} {what} scales");
                let diff = got.0.iter().zip(&want.0).position(|(a, b)| a != b);
                assert!(diff.is_none(), "{name} {what} codes differ at {diff:?}");
            }
        }
    }
}
