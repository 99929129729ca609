//! Rotary position embeddings: inverse frequencies for the RoPE variants of Hugging Face's
//! `modeling_rope_utils.py` (default, linear, dynamic NTK, llama3, YaRN), llama.cpp's per-pair
//! frequency factors (a GGUF's `rope_freqs.weight`), and cos/sin tables.
//!
//! Frequencies are computed in f32 like transformers does, so positions rotate the same way in
//! both implementations; the tables are cast to the compute dtype afterwards.

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

/// `rope_scaling` / `rope_parameters` from config.json (either spelling, `rope_type` or `type`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    /// Newer transformers put `rope_theta` inside `rope_parameters`.
    pub rope_theta: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    /// YaRN: round the correction range to whole dims (gpt-oss says `false`).
    pub truncate: Option<bool>,
    pub attention_factor: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeKind {
    Default,
    Linear {
        factor: f64,
    },
    /// Dynamic NTK: the base grows once the sequence passes the trained length.
    Dynamic {
        factor: f64,
        max_position_embeddings: usize,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max: usize,
    },
    /// YaRN (NTK-by-parts) as in transformers' `_compute_yarn_parameters`.
    Yarn {
        factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        original_max: usize,
        truncate: bool,
        attention_factor: f64,
    },
    /// llama.cpp's `rope_freqs.weight`: one divisor per rotated pair, applied to the default
    /// frequencies. Its converter writes Llama 3.x's llama3 scaling this way (GGUF has no
    /// metadata for it), so the tensor is what defines the rotation of such a file.
    FreqFactors {
        factors: Vec<f32>,
    },
}

impl RopeKind {
    pub fn from_scaling(
        s: Option<&RopeScaling>,
        max_position_embeddings: usize,
    ) -> anyhow::Result<RopeKind> {
        let Some(s) = s else { return Ok(RopeKind::Default) };
        let kind = s.rope_type.as_deref().unwrap_or("default");
        let factor =
            || s.factor.ok_or_else(|| anyhow::anyhow!("rope scaling {kind:?} needs a factor"));
        Ok(match kind {
            "default" => RopeKind::Default,
            "linear" => RopeKind::Linear { factor: factor()? },
            "dynamic" => RopeKind::Dynamic { factor: factor()?, max_position_embeddings },
            "llama3" => RopeKind::Llama3 {
                factor: factor()?,
                low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                original_max: s.original_max_position_embeddings.unwrap_or(8192),
            },
            "yarn" => {
                let factor = factor()?;
                RopeKind::Yarn {
                    factor,
                    beta_fast: s.beta_fast.unwrap_or(32.0),
                    beta_slow: s.beta_slow.unwrap_or(1.0),
                    original_max: s
                        .original_max_position_embeddings
                        .unwrap_or(max_position_embeddings),
                    truncate: s.truncate.unwrap_or(true),
                    attention_factor: s.attention_factor.unwrap_or_else(|| yarn_mscale(factor)),
                }
            }
            other => anyhow::bail!(
                "unsupported rope scaling type {other:?} (supported: default, linear, dynamic, llama3, yarn)"
            ),
        })
    }

    /// YaRN with transformers' defaults (beta 32/1, truncated correction range, attention factor
    /// 0.1·ln(factor) + 1), which llama.cpp applies too: a GGUF stores the factor and the
    /// original context alone.
    pub fn yarn(factor: f64, original_max: usize) -> anyhow::Result<RopeKind> {
        anyhow::ensure!(
            factor.is_finite() && factor >= 1.0 && original_max > 0,
            "YaRN scaling needs a factor of at least 1 and an original context (got {factor}, {original_max})"
        );
        Ok(RopeKind::Yarn {
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max,
            truncate: true,
            attention_factor: yarn_mscale(factor),
        })
    }

    /// llama.cpp's per-pair frequency factors for `dim` rotary dimensions (a GGUF's
    /// `rope_freqs.weight`), checked: a factor per pair, each positive and finite, or the
    /// frequencies would be misaligned or infinite.
    pub fn freq_factors(factors: Vec<f32>, dim: usize) -> anyhow::Result<RopeKind> {
        anyhow::ensure!(
            factors.len() == dim / 2,
            "rope_freqs.weight has {} values, but {dim} rotary dimensions need {} (one per pair)",
            factors.len(),
            dim / 2
        );
        if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            anyhow::bail!("rope_freqs.weight holds {bad}: frequency factors must be positive");
        }
        Ok(RopeKind::FreqFactors { factors })
    }
}

/// YaRN's attention ("concentration") factor: 0.1·ln(factor) + 1 (1.3466 for gpt-oss).
pub fn yarn_mscale(factor: f64) -> f64 {
    if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 }
}

impl RopeKind {
    /// The factor cos and sin are multiplied by (YaRN), 1 otherwise.
    pub fn attention_scaling(&self) -> f32 {
        match self {
            RopeKind::Yarn { attention_factor, .. } => *attention_factor as f32,
            _ => 1.0,
        }
    }
}

/// YaRN's correction range: the (fractional, unless `truncate`) dims where interpolation
/// blends into extrapolation, clamped to `[0, dim-1]` — not rounded for gpt-oss
/// (docs/gpt-oss.md pitfall #1).
pub fn yarn_range(
    beta_fast: f64,
    beta_slow: f64,
    dim: usize,
    base: f64,
    original_max: usize,
    truncate: bool,
) -> (f64, f64) {
    let correction = |rot: f64| {
        (dim as f64 * (original_max as f64 / (rot * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    (low.max(0.0), high.min(dim as f64 - 1.0))
}

/// The unscaled inverse frequencies `theta^(-2i/dim)` of the `dim/2` rotated pairs, in f32 as
/// transformers computes them.
fn default_freqs(theta: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2).map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / dim as f32)).collect()
}

/// Inverse frequencies for `dim` rotary dimensions; `seq_len` matters only for dynamic NTK.
pub fn inv_freq(kind: &RopeKind, theta: f64, dim: usize, seq_len: usize) -> Vec<f32> {
    let base_freqs = |base: f64| default_freqs(base, dim);
    match *kind {
        RopeKind::Default => base_freqs(theta),
        RopeKind::Linear { factor } => {
            base_freqs(theta).into_iter().map(|f| f / factor as f32).collect()
        }
        RopeKind::Dynamic { factor, max_position_embeddings } => {
            let seq = seq_len.max(max_position_embeddings) as f64;
            let base = theta
                * ((factor * seq / max_position_embeddings as f64) - (factor - 1.0))
                    .powf(dim as f64 / (dim as f64 - 2.0));
            base_freqs(base)
        }
        RopeKind::Llama3 { factor, low_freq_factor, high_freq_factor, original_max } => {
            let old = original_max as f32;
            let (factor, low, high) =
                (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
            let low_wavelen = old / low;
            let high_wavelen = old / high;
            base_freqs(theta)
                .into_iter()
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        // Divided, as llama.cpp divides each pair's angle by its factor (ggml_rope_ext).
        RopeKind::FreqFactors { ref factors } => {
            base_freqs(theta).into_iter().zip(factors).map(|(f, r)| f / r).collect()
        }
        RopeKind::Yarn { factor, beta_fast, beta_slow, original_max, truncate, .. } => {
            let (low, mut high) =
                yarn_range(beta_fast, beta_slow, dim, theta, original_max, truncate);
            if low == high {
                high += 0.001;
            }
            let factor = factor as f32;
            base_freqs(theta)
                .into_iter()
                .enumerate()
                .map(|(i, extrapolation)| {
                    let ramp =
                        ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp; // weight of the original (extrapolated) frequency
                    let interpolation = extrapolation / factor;
                    interpolation * (1.0 - keep) + extrapolation * keep
                })
                .collect()
        }
    }
}

/// What llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.generate_extra_tensors`)
/// writes to `rope_freqs.weight` for llama3 scaling: 1 for short wavelengths, `factor` for long
/// ones, the reciprocal of transformers' blend in between. In f64 (the check below allows for
/// the converter's f32 rounding).
fn llama3_factors(kind: &RopeKind, theta: f64, dim: usize) -> Option<Vec<f64>> {
    let RopeKind::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_max } =
        *kind
    else {
        return None;
    };
    let old = original_max as f64;
    let factors = default_freqs(theta, dim).into_iter().map(|f| {
        let wavelen = std::f64::consts::TAU / f64::from(f);
        if wavelen < old / high {
            1.0
        } else if wavelen > old / low {
            factor
        } else {
            let smooth = (old / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        }
    });
    Some(factors.collect())
}

/// The llama3 scaling that a GGUF's `rope_freqs.weight` was written from, if one was: what
/// `config.json` needs to say when the file is converted back to the HF layout.
///
/// The factors pin down only the two band edges, wavelengths `original_max / high_freq_factor`
/// and `original_max / low_freq_factor`, so `low_freq_factor` is taken as 1 (as in every
/// Llama 3.x release). In the blended band the factor's reciprocal is linear in 1/wavelength,
/// so two blended pairs give both edges; the result must reproduce every factor.
pub fn llama3_from_factors(factors: &[f32], theta: f64, dim: usize) -> Option<RopeKind> {
    if factors.len() != dim / 2 {
        return None;
    }
    let factor = f64::from(factors.iter().copied().fold(1.0f32, f32::max));
    // (1/wavelength, smooth) of each blended pair, from 1/r = (1 - smooth)/factor + smooth.
    let blended: Vec<(f64, f64)> = factors
        .iter()
        .zip(default_freqs(theta, dim))
        .map(|(&r, f)| (f64::from(r), f64::from(f)))
        .filter(|&(r, _)| r > 1.0 && r < factor)
        .map(|(r, f)| (f / std::f64::consts::TAU, (1.0 / r - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    let (&(x0, s0), &(x1, s1)) = (blended.first()?, blended.last()?);
    if x0 == x1 {
        return None;
    }
    // smooth = (original_max·x - 1)/(high - 1): slope a, intercept b.
    let a = (s1 - s0) / (x1 - x0);
    let b = s0 - a * x0;
    // The fit carries the factors' f32 rounding: snap to plain values, then check them all.
    let high = ((1.0 - 1.0 / b) * 1e4).round() / 1e4;
    let original_max = (-a / b).round();
    if !(high > 1.0 && (1.0..1e12).contains(&original_max)) {
        return None;
    }
    let kind = RopeKind::Llama3 {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: high,
        original_max: original_max as usize,
    };
    let want = llama3_factors(&kind, theta, dim)?;
    let fits = factors.iter().zip(&want).all(|(&r, w)| (f64::from(r) - w).abs() <= 1e-5 * w);
    fits.then_some(kind)
}

/// cos and sin tables `[positions, dim/2]` for positions `start..start+len`, multiplied by
/// `scale` (YaRN's attention factor; 1 otherwise).
pub fn scaled_tables(
    inv_freq: &[f32],
    scale: f32,
    start: usize,
    len: usize,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<(Tensor, Tensor)> {
    let half = inv_freq.len();
    // Built on the host first: a context too large for host memory must be an error here, not
    // an abort inside the allocator (memory plans normally refuse such a context earlier).
    let n = len.checked_mul(half).ok_or_else(|| too_large(len))?;
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    cos.try_reserve_exact(n).map_err(|_| too_large(len))?;
    sin.try_reserve_exact(n).map_err(|_| too_large(len))?;
    for p in start..start + len {
        for &f in inv_freq {
            let angle = p as f32 * f;
            cos.push(angle.cos() * scale);
            sin.push(angle.sin() * scale);
        }
    }
    let cos = Tensor::from_vec(cos, (len, half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (len, half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

fn too_large(len: usize) -> anyhow::Error {
    crate::error::fail(
        crate::error::ErrorKind::Memory,
        format!("not enough host memory for the RoPE tables of {len} positions: lower --context"),
    )
}

/// Bytes of the cos and sin tables [`scaled_tables`] makes for `len` positions of `dim/2`
/// frequencies in `dtype`: what memory plans count.
pub fn table_bytes(half: usize, len: usize, dtype: DType) -> u64 {
    2u64.saturating_mul(super::memory::dense_bytes(&[len, half], dtype))
}

/// cos and sin tables `[positions, dim/2]` for positions `start..start+len`.
pub fn tables(
    inv_freq: &[f32],
    start: usize,
    len: usize,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<(Tensor, Tensor)> {
    scaled_tables(inv_freq, 1.0, start, len, dtype, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies() {
        let f = inv_freq(&RopeKind::Default, 10000.0, 8, 0);
        assert_eq!(f.len(), 4);
        assert!(
            (f[0] - 1.0).abs() < 1e-7 && (f[1] - 0.1).abs() < 1e-6 && (f[3] - 0.001).abs() < 1e-8
        );
    }

    #[test]
    fn llama3_matches_transformers() {
        // The band structure of transformers' _compute_llama3_parameters, on Llama-3.1-8B's settings
        // (theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192).
        let kind = RopeKind::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max: 8192,
        };
        let f = inv_freq(&kind, 500000.0, 128, 0);
        let base = inv_freq(&RopeKind::Default, 500000.0, 128, 0);
        assert_eq!(f[0], base[0], "high frequencies are kept");
        assert!(
            (f[63] - base[63] / 8.0).abs() < 1e-12,
            "low frequencies are divided by the factor"
        );
        // Medium band: strictly between the two.
        let mid = (0..64)
            .find(|&i| f[i] != base[i] && (f[i] - base[i] / 8.0).abs() > 1e-12)
            .expect("a blended frequency");
        assert!(f[mid] < base[mid] && f[mid] > base[mid] / 8.0);
    }

    const LLAMA3_THETA: f64 = 500000.0;

    fn llama3(factor: f64, original_max: usize) -> RopeKind {
        RopeKind::Llama3 { factor, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max }
    }

    /// `rope_freqs.weight` as llama.cpp's converter writes it (f32).
    fn converter_factors(kind: &RopeKind, theta: f64, dim: usize) -> Vec<f32> {
        llama3_factors(kind, theta, dim).unwrap().into_iter().map(|f| f as f32).collect()
    }

    #[test]
    fn freq_factors_divide_the_default_frequencies() {
        let kind = RopeKind::freq_factors(vec![1.0, 2.0, 4.0, 8.0], 8).unwrap();
        let base = inv_freq(&RopeKind::Default, 10000.0, 8, 0);
        let want = vec![base[0], base[1] / 2.0, base[2] / 4.0, base[3] / 8.0];
        assert_eq!(inv_freq(&kind, 10000.0, 8, 0), want);
        assert_eq!(kind.attention_scaling(), 1.0);
    }

    #[test]
    fn llama3_factors_give_the_llama3_frequencies_and_parameters() {
        // Llama 3.1 8B, Llama 3.2 1B, and tests/fixtures/llama3_tiny's short original context.
        let theta = LLAMA3_THETA;
        for (kind, dim) in
            [(llama3(8.0, 8192), 128), (llama3(32.0, 8192), 64), (llama3(8.0, 64), 64)]
        {
            let factors = converter_factors(&kind, theta, dim);
            let as_factors = RopeKind::freq_factors(factors.clone(), dim).unwrap();
            let gguf = inv_freq(&as_factors, theta, dim, 0);
            let hf = inv_freq(&kind, theta, dim, 0);
            assert_ne!(hf, inv_freq(&RopeKind::Default, theta, dim, 0));
            // Not bit for bit: each factor is rounded to f32 and both sides round their own
            // chain of f32 operations (a few ulps here in the blended band; the real
            // converter's factors land within one, tests/llama3_reference.rs).
            for (i, (g, h)) in gguf.iter().zip(&hf).enumerate() {
                assert!((g - h).abs() <= 4.0 * h * f32::EPSILON, "{kind:?} pair {i}: {g} vs {h}");
            }
            assert_eq!(llama3_from_factors(&factors, theta, dim), Some(kind));
        }
    }

    #[test]
    fn factors_that_are_not_llama3_scaling_are_not_taken_for_it() {
        let theta = LLAMA3_THETA;
        let factors = converter_factors(&llama3(8.0, 8192), theta, 128);
        let blended = factors.iter().position(|&f| f > 1.0 && f < 8.0).unwrap();
        let mut nudged = factors.clone();
        nudged[blended + 1] *= 1.01;
        assert_eq!(llama3_from_factors(&nudged, theta, 128), None);
        assert_eq!(llama3_from_factors(&[1.0; 64], theta, 128), None);
        assert_eq!(llama3_from_factors(&factors[..32], theta, 128), None);
        // One blended pair cannot tell both band edges apart.
        let steps: Vec<f32> = (0..32)
            .map(|i| {
                if i < 10 {
                    1.0
                } else if i == 10 {
                    3.0
                } else {
                    8.0
                }
            })
            .collect();
        assert_eq!(llama3_from_factors(&steps, theta, 64), None);
    }

    #[test]
    fn bad_freq_factors_are_refused() {
        let err = RopeKind::freq_factors(vec![1.0; 16], 64).unwrap_err().to_string();
        assert!(err.contains("16 values") && err.contains("need 32"), "{err}");
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(RopeKind::freq_factors(vec![1.0, bad], 4).is_err(), "{bad}");
        }
    }

    #[test]
    fn yarn_matches_the_gpt_oss_sanity_values() {
        // docs/gpt-oss.md §4.3: low 8.092779115512402, high 17.39802450158856,
        // C 1.3465735902799727, inv_freq[1] 0.6890443, [8] 0.05081327, [9] 0.0317057,
        // [12] 6.794959e-3, [17] 1.293187e-4, [18] 3.830881e-5, [31] 3.023511e-7.
        let (low, high) = yarn_range(32.0, 1.0, 64, 150000.0, 4096, false);
        assert!(
            (low - 8.092779115512402).abs() < 1e-12 && (high - 17.39802450158856).abs() < 1e-12
        );
        assert!((yarn_mscale(32.0) - 1.3465735902799727).abs() < 1e-15);
        let s: RopeScaling = serde_json::from_str(
            r#"{"rope_type":"yarn","factor":32.0,"beta_fast":32.0,"beta_slow":1.0,"original_max_position_embeddings":4096,"truncate":false}"#,
        )
        .unwrap();
        let kind = RopeKind::from_scaling(Some(&s), 131072).unwrap();
        assert!((kind.attention_scaling() - 1.3465736).abs() < 1e-6);
        let f = inv_freq(&kind, 150000.0, 64, 0);
        for (i, want) in [
            (0, 1.0),
            (1, 0.6890443),
            (8, 0.05081327),
            (9, 0.0317057),
            (12, 6.794959e-3),
            (17, 1.293187e-4),
            (18, 3.830881e-5),
            (31, 3.023511e-7),
        ] {
            assert!(
                ((f[i] as f64) - want).abs() / want < 2e-6,
                "inv_freq[{i}] = {} want {want}",
                f[i]
            );
        }
    }

    #[test]
    fn scaling_spellings() {
        let s: RopeScaling = serde_json::from_str(r#"{"type":"linear","factor":2.0}"#).unwrap();
        assert_eq!(
            RopeKind::from_scaling(Some(&s), 2048).unwrap(),
            RopeKind::Linear { factor: 2.0 }
        );
        let s: RopeScaling =
            serde_json::from_str(r#"{"rope_type":"default","rope_theta":100000.0}"#).unwrap();
        assert_eq!(RopeKind::from_scaling(Some(&s), 2048).unwrap(), RopeKind::Default);
        let s: RopeScaling =
            serde_json::from_str(r#"{"rope_type":"longrope","factor":4.0}"#).unwrap();
        assert!(RopeKind::from_scaling(Some(&s), 2048).is_err());
        let linear = inv_freq(&RopeKind::Linear { factor: 4.0 }, 10000.0, 8, 0);
        assert!((linear[0] - 0.25).abs() < 1e-7);
        let dynamic = RopeKind::Dynamic { factor: 2.0, max_position_embeddings: 100 };
        assert_eq!(inv_freq(&dynamic, 10000.0, 8, 50), inv_freq(&RopeKind::Default, 10000.0, 8, 0));
        assert!(
            inv_freq(&dynamic, 10000.0, 8, 400)[1] < inv_freq(&RopeKind::Default, 10000.0, 8, 0)[1]
        );
    }
}
