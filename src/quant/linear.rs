//! A compressed-tensors projection: its quantized tensors as the checkpoint stores them, on the
//! device, and the CPU reference of its product with an input.
//!
//! On the CPU (the reference) the weight is dequantized once at load and the input
//! fake-quantized per token before an f32 product: what compressed-tensors' forward computes.
//! On a GPU the tensors stay quantized and `kernels::quant_matmul` runs them; the product
//! that picks between the two lives there, above this module, so that the kernels can take
//! this type without a cycle.

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use safetensors::Dtype as St;

use super::config::{ActQuant, Scheme, WeightFormat};
use super::numerics::{fake_quantize_rows, fp8_to_f32, nibble};
use crate::error::{ErrorKind, fail};

pub struct QuantLinear {
    pub scheme: Scheme,
    /// `[out, in]` of the dense weight this stands for.
    pub out: usize,
    pub inp: usize,
    /// Int8 and FP8: the weight's bytes, U8 `[out, in]`; Int4: the packed words, I32
    /// `[out, in / 8]`.
    pub q: Tensor,
    /// f32: `[out]` (Int8, FP8: a per-tensor scale is repeated per row) or `[out, groups]`.
    pub scale: Tensor,
    /// Int4 asymmetric: the zero points unpacked, f32 `[out, groups]`.
    pub zero: Option<Tensor>,
    /// Int4 activation order: each input column's group, U32 `[in]`.
    pub g_idx: Option<Tensor>,
    /// Input columns per scale group (Int4; `in` for one group per row).
    pub group: usize,
    /// On the CPU: the dequantized f32 weight `[out, in]`.
    pub dense: Option<Tensor>,
}

/// A tensor's raw data from the checkpoint, checked for dtype and shape.
fn raw<'a>(
    st: &'a MmapedSafetensors,
    name: &str,
    dtypes: &[St],
    shape: &[usize],
) -> anyhow::Result<(St, &'a [u8])> {
    let v = st.get(name).map_err(|e| fail(ErrorKind::Integrity, format!("tensor {name}: {e}")))?;
    if !dtypes.contains(&v.dtype()) || v.shape() != shape {
        return Err(fail(
            ErrorKind::Integrity,
            format!(
                "tensor {name} is {:?} {:?}, expected {dtypes:?} {shape:?}",
                v.dtype(),
                v.shape()
            ),
        ));
    }
    Ok((v.dtype(), v.data()))
}

/// A float tensor (f32, bf16 or f16 in the file) as f32 on `device`.
fn floats(
    st: &MmapedSafetensors,
    name: &str,
    shape: &[usize],
    dev: &Device,
) -> anyhow::Result<Tensor> {
    raw(st, name, &[St::F32, St::BF16, St::F16], shape)?;
    let t = st
        .load(name, dev)
        .map_err(|e| fail(ErrorKind::Integrity, format!("tensor {name}: {e}")))?;
    Ok(t.to_dtype(DType::F32)?)
}

fn i32s(st: &MmapedSafetensors, name: &str, shape: &[usize]) -> anyhow::Result<Vec<i32>> {
    let (_, bytes) = raw(st, name, &[St::I32], shape)?;
    Ok(bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

impl QuantLinear {
    /// An 8-bit (int8 or FP8) weight: codes `q` `[out, inp]` with one scale per output row.
    pub(super) fn eight_bit(
        scheme: Scheme,
        (out, inp): (usize, usize),
        q: Tensor,
        scale: Tensor,
    ) -> Self {
        QuantLinear { scheme, out, inp, q, scale, zero: None, g_idx: None, group: inp, dense: None }
    }

    /// Loads projection `prefix` (`model.layers.0.self_attn.q_proj`) of shape `[out, inp]`.
    pub fn load(
        st: &MmapedSafetensors,
        prefix: &str,
        scheme: Scheme,
        (out, inp): (usize, usize),
        dev: &Device,
    ) -> anyhow::Result<QuantLinear> {
        let name = |s: &str| format!("{prefix}.{s}");
        let mut l = match scheme.weight {
            WeightFormat::Int8 | WeightFormat::Fp8 => {
                let want = if scheme.weight == WeightFormat::Int8 { St::I8 } else { St::F8_E4M3 };
                let (_, bytes) = raw(st, &name("weight"), &[want], &[out, inp])?;
                let q = Tensor::from_raw_buffer(bytes, DType::U8, &[out, inp], dev)?;
                let scale = row_scales(st, &name("weight_scale"), out, dev)?;
                QuantLinear::eight_bit(scheme, (out, inp), q, scale)
            }
            WeightFormat::Int4 { group, symmetric, g_idx } => {
                load_int4(st, prefix, scheme, (out, inp), (group, symmetric, g_idx), dev)?
            }
            WeightFormat::Q8Block | WeightFormat::Q4K | WeightFormat::Q6K => {
                anyhow::bail!("{prefix}: GGUF block formats come from GGUF files only")
            }
        };
        if dev.is_cpu() {
            let w = l.dequantize_host()?;
            l.dense = Some(Tensor::from_vec(w, (out, inp), dev)?);
        }
        Ok(l)
    }

    /// The dequantized weight `[out, in]` in f32, row-major, on the host: `q · scale` (minus
    /// the zero point first for asymmetric Int4), as compressed-tensors' dequantize computes it.
    pub fn dequantize_host(&self) -> anyhow::Result<Vec<f32>> {
        match self.scheme.weight {
            WeightFormat::Q8Block => return self.dequantize_q8_block(),
            WeightFormat::Q4K | WeightFormat::Q6K => return self.dequantize_k(),
            _ => {}
        }
        let scale: Vec<f32> = self.scale.flatten_all()?.to_vec1()?;
        let int4 = matches!(self.scheme.weight, WeightFormat::Int4 { .. });
        let (out, inp) = (self.out, self.inp);
        let mut w = Vec::with_capacity(out * inp);
        if int4 {
            let words: Vec<i32> = self.q.flatten_all()?.to_vec1()?;
            let zero: Option<Vec<f32>> =
                self.zero.as_ref().map(|z| z.flatten_all()?.to_vec1()).transpose()?;
            let g_idx: Option<Vec<u32>> = self.g_idx.as_ref().map(|g| g.to_vec1()).transpose()?;
            let groups = scale.len() / out;
            let wpr = inp.div_ceil(8);
            for r in 0..out {
                let row = &words[r * wpr..(r + 1) * wpr];
                for c in 0..inp {
                    let g = g_idx.as_ref().map_or(c / self.group, |gi| gi[c] as usize);
                    let zp = zero.as_ref().map_or(0.0, |z| z[r * groups + g]);
                    w.push((nibble(row, c) as f32 - zp) * scale[r * groups + g]);
                }
            }
        } else {
            let q: Vec<u8> = self.q.flatten_all()?.to_vec1()?;
            let int8 = self.scheme.weight == WeightFormat::Int8;
            for (r, row) in q.chunks_exact(inp).enumerate() {
                w.extend(row.iter().map(|&b| {
                    let v = if int8 { f32::from(b as i8) } else { fp8_to_f32(b) };
                    v * scale[r]
                }));
            }
        }
        Ok(w)
    }

    /// `x` `[rows, in]` times the weight, f32 `[rows, out]` (no bias), on the CPU: the
    /// dequantized weight times `x` fake-quantized per token. `None` where the weight is not
    /// dequantized (on a GPU).
    pub fn matmul_reference(&self, x: &Tensor) -> Option<candle_core::Result<Tensor>> {
        let w = self.dense.as_ref()?;
        let product = || {
            let x = x.to_dtype(DType::F32)?;
            let x = if self.scheme.act == ActQuant::None {
                x
            } else {
                let (rows, k) = x.dims2()?;
                let mut v: Vec<f32> = x.flatten_all()?.to_vec1()?;
                fake_quantize_rows(&mut v, k, self.scheme.act);
                Tensor::from_vec(v, (rows, k), x.device())?
            };
            x.matmul(&w.t()?)
        };
        Some(product())
    }

    /// Random codes with scales that give weights of about `std` (`inferno bench
    /// --dummy-weights` on a quantized layout, and the kernels' tests), made on the host from
    /// `seed` and copied to `dev`. Zero points and activation-order groups when the scheme
    /// has them.
    pub fn random(
        scheme: Scheme,
        (out, inp): (usize, usize),
        std: f32,
        seed: u64,
        dev: &Device,
    ) -> anyhow::Result<QuantLinear> {
        use rand::{Rng, RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut l = match scheme.weight {
            WeightFormat::Int8 | WeightFormat::Fp8 => {
                let mut bytes = vec![0u8; out * inp];
                rng.fill_bytes(&mut bytes);
                let int8 = scheme.weight == WeightFormat::Int8;
                // int8: uniform over -127..=127 (std ≈ 73); FP8: sign and codes below 0x58
                // (|v| < 16, no NaN; std ≈ 5).
                let spread = if int8 { 73.0 } else { 5.0 };
                for b in &mut bytes {
                    *b =
                        if int8 { (*b % 255).wrapping_sub(127) } else { (*b & 0x80) | (*b % 0x58) };
                }
                let q = Tensor::from_vec(bytes, (out, inp), dev)?;
                let scale = Tensor::full(std / spread, out, dev)?;
                QuantLinear::eight_bit(scheme, (out, inp), q, scale)
            }
            WeightFormat::Int4 { group, symmetric, g_idx } => {
                let group = group.unwrap_or(inp);
                let groups = inp.div_ceil(group);
                let wpr = inp.div_ceil(8);
                let words: Vec<i32> = (0..out * wpr).map(|_| rng.next_u32() as i32).collect();
                let q = Tensor::from_vec(words, (out, wpr), dev)?;
                // Uniform nibbles have std ≈ 4.6; scales vary by group.
                let scales: Vec<f32> =
                    (0..out * groups).map(|_| std / 4.6 * rng.random_range(0.5..1.5)).collect();
                let scale = Tensor::from_vec(scales, (out, groups), dev)?;
                let zero = (!symmetric)
                    .then(|| {
                        let z: Vec<f32> =
                            (0..out * groups).map(|_| rng.random_range(-8..8) as f32).collect();
                        Tensor::from_vec(z, (out, groups), dev)
                    })
                    .transpose()?;
                let g_idx = g_idx
                    .then(|| {
                        let g: Vec<u32> =
                            (0..inp).map(|_| rng.random_range(0..groups as u32)).collect();
                        Tensor::from_vec(g, inp, dev)
                    })
                    .transpose()?;
                QuantLinear { scheme, out, inp, q, scale, zero, g_idx, group, dense: None }
            }
            WeightFormat::Q8Block => QuantLinear::random_q8_block((out, inp), std, &mut rng, dev)?,
            f @ (WeightFormat::Q4K | WeightFormat::Q6K) => {
                QuantLinear::random_k(f, (out, inp), std, &mut rng, dev)?
            }
        };
        if dev.is_cpu() {
            let w = l.dequantize_host()?;
            l.dense = Some(Tensor::from_vec(w, (out, inp), dev)?);
        }
        Ok(l)
    }

    /// The same weight on another device.
    pub fn to_device(&self, dev: &Device) -> anyhow::Result<QuantLinear> {
        let move_ = |t: &Tensor| t.to_device(dev);
        let dense = if dev.is_cpu() {
            Some(Tensor::from_vec(self.dequantize_host()?, (self.out, self.inp), dev)?)
        } else {
            None
        };
        Ok(QuantLinear {
            scheme: self.scheme,
            out: self.out,
            inp: self.inp,
            q: move_(&self.q)?,
            scale: move_(&self.scale)?,
            zero: self.zero.as_ref().map(move_).transpose()?,
            g_idx: self.g_idx.as_ref().map(move_).transpose()?,
            group: self.group,
            dense,
        })
    }

    /// Bytes of the tensors held (what the memory plan counts).
    pub fn bytes(&self) -> u64 {
        let b = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let mut n = b(&self.q) + b(&self.scale);
        n += self.zero.as_ref().map_or(0, b) + self.g_idx.as_ref().map_or(0, b);
        n + self.dense.as_ref().map_or(0, b)
    }
}

/// `weight_scale` `[out, 1]` (channel) or `[1]` / `[]` (tensor) as f32 `[out]`.
fn row_scales(
    st: &MmapedSafetensors,
    name: &str,
    out: usize,
    dev: &Device,
) -> anyhow::Result<Tensor> {
    let shape = st
        .get(name)
        .map_err(|e| fail(ErrorKind::Integrity, format!("tensor {name}: {e}")))?
        .shape()
        .to_vec();
    let s = floats(st, name, &shape, dev)?;
    match shape.as_slice() {
        [n, 1] | [n] if *n == out => Ok(s.flatten_all()?),
        [1] | [] | [1, 1] => Ok(s.flatten_all()?.broadcast_as(out)?.contiguous()?),
        _ => Err(fail(
            ErrorKind::Integrity,
            format!("tensor {name} has shape {shape:?}, expected [{out}, 1] or [1]"),
        )),
    }
}

fn load_int4(
    st: &MmapedSafetensors,
    prefix: &str,
    scheme: Scheme,
    (out, inp): (usize, usize),
    (group, symmetric, has_g_idx): (Option<usize>, bool, bool),
    dev: &Device,
) -> anyhow::Result<QuantLinear> {
    let name = |s: &str| format!("{prefix}.{s}");
    let group = group.unwrap_or(inp);
    let groups = inp.div_ceil(group);
    let shape = i32s_any(st, &name("weight_shape"))?;
    if shape != [out as i64, inp as i64] {
        return Err(fail(
            ErrorKind::Integrity,
            format!("tensor {} says {shape:?}, expected [{out}, {inp}]", name("weight_shape")),
        ));
    }
    let wpr = inp.div_ceil(8);
    let words = i32s(st, &name("weight_packed"), &[out, wpr])?;
    let q = Tensor::from_vec(words, (out, wpr), dev)?;
    let scale = floats(st, &name("weight_scale"), &[out, groups], dev)?;
    let zero = if symmetric {
        None
    } else {
        // Packed along the rows: zero point (r, g) is nibble r % 8 of word (r / 8, g).
        let packed = i32s(st, &name("weight_zero_point"), &[out.div_ceil(8), groups])?;
        let z: Vec<f32> = (0..out * groups)
            .map(|i| {
                let (r, g) = (i / groups, i % groups);
                let word = packed[(r / 8) * groups + g];
                nibble(&[word], r % 8) as f32
            })
            .collect();
        Some(Tensor::from_vec(z, (out, groups), dev)?)
    };
    let g_idx = if has_g_idx {
        let gi = i32s(st, &name("weight_g_idx"), &[inp])?;
        if gi.iter().any(|&g| g < 0 || g as usize >= groups) {
            return Err(fail(
                ErrorKind::Integrity,
                format!("{}: group out of range", name("weight_g_idx")),
            ));
        }
        Some(Tensor::from_vec(gi.into_iter().map(|g| g as u32).collect::<Vec<_>>(), inp, dev)?)
    } else {
        None
    };
    Ok(QuantLinear { scheme, out, inp, q, scale, zero, g_idx, group, dense: None })
}

/// `weight_shape` (int64 in files by compressed-tensors, int32 in some older ones).
fn i32s_any(st: &MmapedSafetensors, name: &str) -> anyhow::Result<Vec<i64>> {
    let (dt, bytes) = raw(st, name, &[St::I64, St::I32], &[2])?;
    Ok(match dt {
        St::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))))
            .collect(),
    })
}
