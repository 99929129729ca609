//! Quantized projections stacked along the output dimension: the batched Llama path's fused
//! q/k/v and gate/up products (`models/llama/fuse.rs`) for compressed-tensors weights, so that a
//! decode step reads a layer's input once per fused product and launches two GEMVs where it
//! launched five. Here rather than beside [`QuantLinear`]: the packed 4-bit words are stacked on
//! the GPU by [`stack_rows`]'s device copies.

use candle_core::{Result, Tensor};

use super::stack_rows;
use crate::quant::QuantLinear;

/// The parts stacked (each tensor along its first dimension, which is the output's), and a view
/// of the stack for each part; `None` unless the parts share the scheme, input width and scale
/// groups, and have no activation order (its column order is per projection).
pub fn stack_quant(parts: &[&QuantLinear]) -> Result<Option<(QuantLinear, Vec<QuantLinear>)>> {
    let Some(first) = parts.first() else { return Ok(None) };
    let alike = |p: &&QuantLinear| {
        p.scheme == first.scheme
            && p.inp == first.inp
            && p.group == first.group
            && p.g_idx.is_none()
            && p.zero.is_some() == first.zero.is_some()
            && p.dense.is_some() == first.dense.is_some()
            && p.scale.rank() == first.scale.rank()
    };
    if !parts.iter().all(alike) {
        return Ok(None);
    }
    let cat = |f: &dyn Fn(&QuantLinear) -> Option<&Tensor>| -> Result<Option<Tensor>> {
        let ts: Option<Vec<&Tensor>> = parts.iter().map(|p| f(p)).collect();
        ts.map(|ts| stack_rows(&ts)).transpose()
    };
    let q = stack_rows(&parts.iter().map(|p| &p.q).collect::<Vec<_>>())?;
    let scale = Tensor::cat(&parts.iter().map(|p| &p.scale).collect::<Vec<_>>(), 0)?;
    let all = QuantLinear {
        scheme: first.scheme,
        out: parts.iter().map(|p| p.out).sum(),
        inp: first.inp,
        q,
        scale,
        zero: cat(&|p| p.zero.as_ref())?,
        g_idx: None,
        group: first.group,
        dense: cat(&|p| p.dense.as_ref())?,
    };
    let mut views = Vec::with_capacity(parts.len());
    let mut start = 0;
    for p in parts {
        let rows = |t: &Tensor| t.narrow(0, start, p.out);
        views.push(QuantLinear {
            scheme: p.scheme,
            out: p.out,
            inp: p.inp,
            q: rows(&all.q)?,
            scale: rows(&all.scale)?,
            zero: all.zero.as_ref().map(rows).transpose()?,
            g_idx: None,
            group: p.group,
            dense: all.dense.as_ref().map(rows).transpose()?,
        });
        start += p.out;
    }
    Ok(Some((all, views)))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::stack_quant;
    use crate::kernels::quant_matmul;
    use crate::quant::{ActQuant, QuantLinear, Scheme, WeightFormat};

    /// The stack's product is the parts' products side by side (each output column is its own
    /// dot product, and the per-token quantization of x does not depend on the weight), and the
    /// views still give their parts' products.
    #[test]
    fn stacked_product_is_the_parts_side_by_side() {
        let d = Device::Cpu;
        let int4 = WeightFormat::Int4 { group: Some(32), symmetric: false, g_idx: false };
        for scheme in [
            Scheme { weight: WeightFormat::Int8, act: ActQuant::Int8Token },
            Scheme { weight: WeightFormat::Fp8, act: ActQuant::Fp8Token },
            Scheme { weight: int4, act: ActQuant::None },
        ] {
            let parts: Vec<QuantLinear> = [(24, 1), (8, 2), (16, 3)]
                .into_iter()
                .map(|(out, seed)| QuantLinear::random(scheme, (out, 64), 0.02, seed, &d))
                .collect::<anyhow::Result<_>>()
                .expect("parts");
            let x = Tensor::arange(0f32, 3.0 * 64.0, &d).expect("x");
            let x = (x.reshape((3, 64)).expect("r") * 0.01).expect("x").sin().expect("sin");
            let x = x.to_dtype(DType::BF16).expect("bf16");
            let each = |ps: &[QuantLinear]| -> Vec<Vec<f32>> {
                let ys: Vec<Tensor> =
                    ps.iter().map(|p| quant_matmul(&x, p).expect("part")).collect();
                Tensor::cat(&ys, 1).expect("cat").to_vec2().expect("v")
            };
            let want = each(&parts);
            let refs: Vec<&QuantLinear> = parts.iter().collect();
            let (all, views) = stack_quant(&refs).expect("stack").expect("stackable");
            assert_eq!(all.out, 48);
            let got: Vec<Vec<f32>> = quant_matmul(&x, &all).expect("all").to_vec2().expect("v");
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-3), "{scheme:?}: {g} vs {w}");
            }
            assert_eq!(each(&views), want, "{scheme:?}: views");
            let other = QuantLinear::random(
                Scheme { weight: WeightFormat::Int8, act: ActQuant::None },
                (4, 64),
                0.02,
                9,
                &d,
            )
            .expect("other");
            assert!(stack_quant(&[&parts[0], &other]).expect("stack").is_none());
        }
    }
}
