use candle_core::{Device, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

use super::token_mask;
use crate::kernels::testing::{rng, uniform, values};

/// Random logits `[rows, vocab]`, a random mask for some rows (others -1), masks of random
/// words (fewer than the vocabulary needs, or more) and densities.
fn case(r: &mut StdRng, vocab: usize) -> (Vec<f32>, Vec<i32>, Vec<u32>, usize, usize) {
    let rows = r.random_range(1..9);
    let masks = r.random_range(1..=rows);
    let words = r.random_range(1..=vocab.div_ceil(32) + 2);
    let logits = uniform(r, rows * vocab, -30.0, 30.0);
    let which = (0..rows)
        .map(|_| if r.random_bool(0.7) { r.random_range(0..masks) as i32 } else { -1 })
        .collect();
    let density = r.random_range(0.0..1.0);
    let bits = (0..masks * words)
        .map(|_| (0..32).fold(0u32, |w, b| w | (u32::from(r.random_bool(density)) << b)))
        .collect();
    (logits, which, bits, rows, words)
}

/// The rule written out token by token: a masked row keeps exactly its allowed tokens' bits.
fn reference(logits: &[f32], which: &[i32], bits: &[u32], vocab: usize, words: usize) -> Vec<f32> {
    let mut out = logits.to_vec();
    for (r, &m) in which.iter().enumerate() {
        if m < 0 {
            continue;
        }
        for t in 0..vocab {
            let allowed =
                t / 32 < words && bits[m as usize * words + t / 32] & (1 << (t % 32)) != 0;
            if !allowed {
                out[r * vocab + t] = f32::NEG_INFINITY;
            }
        }
    }
    out
}

fn run(
    dev: &Device,
    logits: &[f32],
    which: &[i32],
    bits: &[u32],
    rows: usize,
    words: usize,
) -> Vec<f32> {
    let vocab = logits.len() / rows;
    let l = Tensor::from_slice(logits, (rows, vocab), dev).unwrap();
    let w = Tensor::from_slice(which, rows, dev).unwrap();
    let b = Tensor::from_slice(bits, (bits.len() / words.max(1), words), dev).unwrap();
    values(&token_mask(&l, &w, &b).unwrap())
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn cpu_matches_the_rule() {
    let mut r = rng("token_mask cpu");
    for _ in 0..30 {
        let vocab = r.random_range(1..400);
        let (logits, which, bits, rows, words) = case(&mut r, vocab);
        let got = run(&Device::Cpu, &logits, &which, &bits, rows, words);
        assert!(same_bits(&got, &reference(&logits, &which, &bits, vocab, words)));
    }
}

/// The GPU gives the CPU's bits on fresh random cases, including a 201,088-token vocabulary
/// (gpt-oss's) and widths that are not a multiple of the 4 tokens a thread writes.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_cpu() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("token_mask gpu");
    let vocabs = [201_088, 128_256, r.random_range(1..5000), r.random_range(1..70), 1];
    for vocab in vocabs {
        let (logits, which, bits, rows, words) = case(&mut r, vocab);
        let want = run(&Device::Cpu, &logits, &which, &bits, rows, words);
        let got = run(&dev, &logits, &which, &bits, rows, words);
        assert!(same_bits(&got, &want), "vocab {vocab}: the GPU's masked logits differ");
    }
}
