//! The batched path's fused projections: q, k and v as one weight, gate and up as another (dense
//! or compressed-tensors weights alike), so a decode step reads each layer's inputs once per
//! fused product and launches 2 products where it launched 5 (every launch is a few
//! microseconds of a ~1 ms step, and the small q/k/v products alone could not keep the GPU's
//! loads in flight).
//!
//! The separate projections become views into the fused weights, so fusing costs no memory
//! after the layer is done (one layer's copy while it runs). Loaders fuse each layer as soon as
//! it is built: the next layer's parts then reuse the memory this layer's parts freed, where
//! fusing every layer at the end would leave a layer's parts' worth of holes between each two
//! layers in the device's memory pool (1.1 GiB for Llama-3.1-8B, measured), memory the pool
//! cannot give back and the memory plan does not count.

use std::sync::Arc;

use candle_core::Tensor;

use super::model::Layer;
use crate::kernels::stack_quant;
use crate::models::linear::Linear;
use crate::quant::QuantLinear;

/// One layer's fused products (`None` where the parts cannot be fused: GGUF weights, mixed
/// formats, compressed-tensors weights with activation order, or biases on some parts only).
#[derive(Clone, Default)]
pub struct Fused {
    /// `[q_out + 2 kv_out, hidden]`: q, then k, then v.
    pub qkv: Option<Linear>,
    /// `[2 intermediate, hidden]`: gate, then up.
    pub gate_up: Option<Linear>,
}

impl Layer {
    /// Fuses the layer's q/k/v and gate/up weights and points its parts at views of them.
    pub fn fuse(mut self) -> candle_core::Result<Layer> {
        if let Some((all, parts)) = concat(&[&self.q, &self.k, &self.v])? {
            [self.q, self.k, self.v] = parts_array(parts);
            self.fused.qkv = Some(all);
        }
        if let Some((all, parts)) = concat(&[&self.gate, &self.up])? {
            [self.gate, self.up] = parts_array(parts);
            self.fused.gate_up = Some(all);
        }
        Ok(self)
    }
}

fn parts_array<const N: usize>(parts: Vec<Linear>) -> [Linear; N] {
    match parts.try_into() {
        Ok(a) => a,
        // concat returns one view per part it was given.
        Err(_) => unreachable!("one view per fused part"),
    }
}

/// The parts' weights (and biases) stacked along the output dimension, and a view of the
/// stack for each part; `None` unless every part is dense with one dtype, or every part is a
/// compressed-tensors weight that stacks ([`stack_quant`]), and all or none have a
/// bias.
fn concat(parts: &[&Linear]) -> candle_core::Result<Option<(Linear, Vec<Linear>)>> {
    let biases: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias()).collect();
    if !(biases.is_empty() || biases.len() == parts.len()) {
        return Ok(None);
    }
    let bias = if biases.is_empty() { None } else { Some(Tensor::cat(&biases, 0)?) };
    let Some((all, views)) = stack_weights(parts)? else { return Ok(None) };
    let mut fused = Vec::with_capacity(parts.len());
    let mut start = 0;
    for view in views {
        let rows = view.rows();
        let bias = bias.as_ref().map(|b| b.narrow(0, start, rows)).transpose()?;
        fused.push(view.with_bias(bias));
        start += rows;
    }
    Ok(Some((all.with_bias(bias), fused)))
}

/// A weight stacked from the parts' (without biases), and a view for each part.
enum Stacked {
    Dense(Tensor),
    Ct(QuantLinear),
}

impl Stacked {
    fn rows(&self) -> usize {
        match self {
            Stacked::Dense(w) => w.dim(0).unwrap_or(0),
            Stacked::Ct(q) => q.out,
        }
    }

    fn with_bias(self, bias: Option<Tensor>) -> Linear {
        match self {
            Stacked::Dense(weight) => Linear::Dense { weight, bias },
            Stacked::Ct(q) => Linear::Ct { weight: Arc::new(q), bias },
        }
    }
}

fn stack_weights(parts: &[&Linear]) -> candle_core::Result<Option<(Stacked, Vec<Stacked>)>> {
    let dense: Option<Vec<&Tensor>> = parts
        .iter()
        .map(|p| match p {
            Linear::Dense { weight, .. } => Some(weight),
            _ => None,
        })
        .collect();
    if let Some(weights) = dense {
        let dtype = weights[0].dtype();
        if weights.iter().any(|w| w.dtype() != dtype) {
            return Ok(None);
        }
        let weight = Tensor::cat(&weights, 0)?;
        let mut views = Vec::with_capacity(parts.len());
        let mut start = 0;
        for w in &weights {
            let rows = w.dim(0)?;
            views.push(Stacked::Dense(weight.narrow(0, start, rows)?));
            start += rows;
        }
        return Ok(Some((Stacked::Dense(weight), views)));
    }
    let quant: Option<Vec<&QuantLinear>> = parts
        .iter()
        .map(|p| match p {
            Linear::Ct { weight, .. } => Some(weight.as_ref()),
            _ => None,
        })
        .collect();
    let Some(quant) = quant else { return Ok(None) };
    Ok(stack_quant(&quant)?
        .map(|(all, views)| (Stacked::Ct(all), views.into_iter().map(Stacked::Ct).collect())))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;

    fn dense(rows: usize, seed: f32, bias: bool) -> Linear {
        let d = Device::Cpu;
        let w = Tensor::arange(0f32, (rows * 4) as f32, &d).expect("w");
        let w = ((w * 0.01).expect("s") + seed as f64).expect("o").reshape((rows, 4)).expect("r");
        let b = bias.then(|| Tensor::full(seed, rows, &d).expect("b"));
        Linear::Dense { weight: w, bias: b }
    }

    /// The fused product equals the parts' products side by side, and the parts (now views)
    /// still give their own products.
    #[test]
    fn fused_product_is_the_parts_side_by_side() {
        let d = Device::Cpu;
        let x = Tensor::arange(0f32, 8.0, &d).expect("x").reshape((2, 4)).expect("r");
        for bias in [false, true] {
            let parts = [dense(3, 0.5, bias), dense(2, -1.0, bias), dense(2, 2.0, bias)];
            let want: Vec<Tensor> = parts.iter().map(|p| p.forward(&x).expect("part")).collect();
            let want = Tensor::cat(&want, 1).expect("cat").to_vec2::<f32>().expect("v");
            let (all, views) =
                concat(&[&parts[0], &parts[1], &parts[2]]).expect("cat").expect("fused");
            assert_eq!(all.forward(&x).expect("fused").to_vec2::<f32>().expect("v"), want);
            let again: Vec<Tensor> = views.iter().map(|p| p.forward(&x).expect("view")).collect();
            let again = Tensor::cat(&again, 1).expect("cat").to_vec2::<f32>().expect("v");
            assert_eq!(again, want);
        }
        let mixed = [dense(3, 0.5, true), dense(2, 1.0, false)];
        assert!(concat(&[&mixed[0], &mixed[1]]).expect("cat").is_none(), "bias on one part only");
        let other = Linear::Dense {
            weight: Tensor::zeros((2, 4), DType::BF16, &d).expect("z"),
            bias: None,
        };
        assert!(concat(&[&dense(2, 0.0, false), &other]).expect("cat").is_none(), "mixed dtypes");
    }
}
