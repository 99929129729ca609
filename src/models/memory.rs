//! Bytes a model holds, counted two ways that tests hold against each other: planned from
//! shapes and dtypes before anything is allocated (`load::plan`), and measured on a built
//! model by summing its tensors.
//!
//! Planned sizes come from config files and file headers, whose numbers can be anything: all
//! arithmetic here saturates at `u64::MAX` (a plan that large is refused, never wrapped into a
//! small number that would then be allocated).

use std::collections::{BTreeMap, HashSet};

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Tensor, TensorId};

use super::linear::Linear;

/// The product of `dims`, saturating.
pub fn elems(dims: &[usize]) -> u64 {
    dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

/// Bytes of a dense tensor of shape `dims` in `dtype`, saturating.
pub fn dense_bytes(dims: &[usize], dtype: DType) -> u64 {
    elems(dims).saturating_mul(dtype.size_in_bytes() as u64)
}

/// Sum of byte counts, saturating.
pub fn sum(parts: impl IntoIterator<Item = u64>) -> u64 {
    parts.into_iter().fold(0u64, u64::saturating_add)
}

/// One tensor of a weight file, as its header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileTensor {
    pub elems: u64,
    /// Bytes of data in the file.
    pub bytes: u64,
}

/// The tensors of a checkpoint by name (all shards together).
pub type FileTensors = BTreeMap<String, FileTensor>;

/// The tensors of safetensors headers.
pub fn safetensors_tensors<'a>(
    headers: impl IntoIterator<Item = &'a crate::inspect::safetensors::Header>,
) -> FileTensors {
    let mut out = FileTensors::new();
    for h in headers {
        for (name, t) in &h.tensors {
            let elems = t.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d));
            out.insert(name.clone(), FileTensor { elems, bytes: t.bytes });
        }
    }
    out
}

/// What a built model holds, measured on its tensors (the KV pool is the engine's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allocated {
    pub weights: u64,
    pub rope_tables: u64,
}

/// Sums the bytes of a built model's weights, each storage once: a tied LM head is a clone of
/// the embedding (same tensor id) and must not count twice.
#[derive(Default)]
pub struct Measured {
    seen: HashSet<TensorId>,
    seen_q: HashSet<*const QTensor>,
    pub total: u64,
}

impl Measured {
    pub fn tensor(&mut self, t: &Tensor) {
        if self.seen.insert(t.id()) {
            self.total += (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        }
    }

    /// A view of a tensor counted already (its id is another).
    pub fn view(&mut self, t: &Tensor) {
        self.seen.insert(t.id());
    }

    pub fn linear(&mut self, l: &Linear) {
        match l {
            Linear::Dense { weight, bias } => {
                self.tensor(weight);
                bias.iter().for_each(|b| self.tensor(b));
            }
            Linear::Quantized { weight, bias } => {
                match weight {
                    QMatMul::QTensor(q) => {
                        if self.seen_q.insert(std::sync::Arc::as_ptr(q)) {
                            self.total += q.storage_size_in_bytes() as u64;
                        }
                    }
                    QMatMul::Tensor(t) | QMatMul::TensorF16(t) => self.tensor(t),
                }
                bias.iter().for_each(|b| self.tensor(b));
            }
            Linear::Ct { weight, bias } => {
                self.total += weight.bytes();
                bias.iter().for_each(|b| self.tensor(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_saturate_instead_of_wrapping() {
        assert_eq!(dense_bytes(&[3, 4], DType::BF16), 24);
        assert_eq!(dense_bytes(&[usize::MAX, usize::MAX, 2], DType::F32), u64::MAX);
        assert_eq!(sum([u64::MAX, 1]), u64::MAX);
    }

    #[test]
    fn a_tied_tensor_counts_once() {
        let dev = candle_core::Device::Cpu;
        let t = Tensor::zeros((4, 8), DType::F32, &dev).unwrap();
        let mut m = Measured::default();
        m.tensor(&t);
        m.linear(&Linear::Dense { weight: t.clone(), bias: None });
        assert_eq!(m.total, 4 * 8 * 4);
    }
}
