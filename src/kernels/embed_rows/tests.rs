use candle_core::{DType, Device, Tensor};
use rand::Rng;
use rand::rngs::StdRng;

use super::embed_rows;
use crate::kernels::testing::{rng, tensor, uniform, values};

/// A random table of `vocab` rows and a slice of it (`first .. first + rows`, a view with an
/// offset, as a rank keeping the whole table reads its own rows), and random ids over the whole
/// vocabulary and past it. `hidden`: the rows' width, random where `None`.
fn case(r: &mut StdRng, dtype: DType, hidden: Option<usize>) -> (Tensor, usize, usize, Vec<u32>) {
    let vocab = r.random_range(2..300);
    let hidden = hidden.unwrap_or_else(|| r.random_range(1..700));
    let table = tensor(uniform(r, vocab * hidden, -4.0, 4.0), &[vocab, hidden], dtype);
    let first = r.random_range(0..vocab);
    let rows = r.random_range(1..=vocab - first);
    let n = r.random_range(1..80);
    let ids = (0..n).map(|_| r.random_range(0..vocab as u32 + 5)).collect();
    (table, first, rows, ids)
}

/// Against candle's lookup and cast, row by row: the slice's own ids look up their row's exact
/// values, every other id zeros.
#[test]
fn cpu_looks_up_its_rows_and_zeros_elsewhere() {
    let mut r = rng("embed_rows cpu");
    for dtype in [DType::F32, DType::BF16, DType::F32, DType::BF16] {
        let (table, first, rows, ids) = case(&mut r, dtype, None);
        let hidden = table.dim(1).unwrap();
        let mine = table.narrow(0, first, rows).unwrap();
        let tokens = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
        let got = values(&embed_rows(&mine, &tokens, first).unwrap());
        for (t, &id) in ids.iter().enumerate() {
            let row = &got[t * hidden..][..hidden];
            let want = match (id as usize).checked_sub(first).filter(|&i| i < rows) {
                Some(_) => values(&table.get(id as usize).unwrap().to_dtype(DType::F32).unwrap()),
                None => vec![0.0; hidden],
            };
            let same = row.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{dtype:?}: token {id} (rows {first}..{}) looked up other values",
                first + rows
            );
        }
    }
}

/// The GPU's lookup gives the CPU's bits, on fresh random tables, slices and ids: rows of a
/// width the 16-byte loads take (gpt-oss's 2,880, a multiple of 8) and of any width.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_cpu() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("embed_rows gpu");
    let widths =
        [Some(2880), Some(8 * r.random_range(1..90)), Some(4 * r.random_range(1..90)), None];
    for (dtype, hidden) in widths.iter().flat_map(|&h| [(DType::F32, h), (DType::BF16, h)]) {
        let (table, first, rows, ids) = case(&mut r, dtype, hidden);
        let mine = table.narrow(0, first, rows).unwrap();
        let tokens = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
        let want = values(&embed_rows(&mine, &tokens, first).unwrap());
        let on_gpu = table.to_device(&dev).unwrap().narrow(0, first, rows).unwrap();
        let got = embed_rows(&on_gpu, &tokens.to_device(&dev).unwrap(), first).unwrap();
        let same = values(&got).iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{dtype:?} {hidden:?}: the GPU's lookup differs from the CPU's");
    }
}
