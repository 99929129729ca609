use candle_core::DType;
use rand::Rng;

use super::router_logits;
use crate::kernels::testing::{gpu, rel_err, rng, tensor, uniform, values};

/// The kernel against an f64 reference on random shapes (token and expert counts that are
/// not multiples of the blocks' 4 × 4 and 8 × 8 tiles), and each token alone (a 4 × 4 tile)
/// equal bit for bit to the same token in the batch (8 × 8 tiles from 32 tokens).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_reference_and_is_batch_invariant() {
    let dev = gpu();
    let mut r = rng("router logits");
    for (tokens, experts, hidden) in [
        (1, 32, 2880),
        (7, 32, 2880),
        (64, 32, 2880),
        (64, 128, 2880),
        (513, 32, 2880),
        (37, 33, 68),
        (5, 33, 68),
        (3, 8, 64),
    ] {
        let h = uniform(&mut r, tokens * hidden, -3.0, 3.0);
        let w = uniform(&mut r, experts * hidden, -0.1, 0.1);
        let want: Vec<f32> = (0..tokens * experts)
            .map(|i| {
                let (t, e) = (i / experts, i % experts);
                let hr = &h[t * hidden..][..hidden];
                let wr = &w[e * hidden..][..hidden];
                hr.iter().zip(wr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() as f32
            })
            .collect();
        let ht = tensor(h, &[tokens, hidden], DType::F32).to_device(&dev).unwrap();
        let wt = tensor(w, &[experts, hidden], DType::F32).to_device(&dev).unwrap();
        let got = values(&router_logits(&ht, &wt).unwrap());
        let err = rel_err(&got, &want);
        assert!(err < 1e-5, "{tokens}×{experts}×{hidden}: relative error {err:e}");
        let t = r.random_range(0..tokens);
        let alone = values(&router_logits(&ht.narrow(0, t, 1).unwrap(), &wt).unwrap());
        let row = &got[t * experts..][..experts];
        assert!(
            alone.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{tokens}×{experts}×{hidden}: token {t} alone differs from the batch"
        );
    }
}
