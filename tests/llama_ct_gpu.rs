//! compressed-tensors checkpoints against their own weights dequantized to dense bf16 (top-1
//! agreement with the dequantized-bf16 reference on the GPU: what the kernels must keep), on the
//! fixtures of scripts/fixtures/llama_ct.sh (W8A8 int8, FP8 dynamic, W4A16, W8A16 int8).
//!
//! Each fixture runs twice through the engine (the batched path play, bench and serve take):
//! (a) as loaded, on the compressed-tensors kernels; (b) the same checkpoint rewritten with every
//! quantized projection dequantized by [`QuantLinear::dequantize_host`] (the numerics the CPU
//! path and the kernels' tests use) into a dense weight, run as a bf16 model. Both are
//! teacher-forced over the fixture's 8 random 96-token sequences, 8 requests at once (batched
//! decode); the prompts are 1, 5, …, 29 tokens long, so each request's first argmax comes out of
//! a prefill and the rest out of decode steps: 648 positions per format. Reported: the top-1
//! agreement of (a) with (b), and of each with transformers' f32 argmax (reference.json).
//!
//! Measured on an NVIDIA H100 80GB HBM3 (quantized vs dequantized-bf16 / quantized vs
//! transformers): W8A8 96.3% / 94.9%, FP8 86.9% / 87.5%, W4A16 100% / 98.8%, W8A16 98.5% /
//! 97.4%; the CPU in f32 (test below) gives W8A8 96.6% and FP8 86.3% against the dequantized
//! model, so the GPU loses nothing the format does not. Why so low for FP8: the dequantized model
//! does not quantize activations, the quantized one rounds each input to E4M3 per token (3
//! mantissa bits, up to 6% per element; int8's step is max|x| / 127.5), and this random model's
//! top-2 margins are small (7% of positions below 0.05, a quarter below 0.2). The weight-only
//! formats differ only by bf16 rounding in other summation orders. The bars sit ~3-7 points
//! under the measurements (random near-ties differ between GPUs and kernel versions): against
//! the dequantized model W8A8 93%, FP8 80%, W4A16 96%, W8A16 95%; against transformers' f32
//! argmax 90%, 80%, 95%, 94%.
//!
//! The test can fail: the same comparison against the dequantized model with the scales dropped
//! (scale 1) must agree on fewer than 20% of positions (measured 0.5% to 1.2%), and the bars
//! are far above that.

use std::collections::HashMap;
use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use inferno::engine::core::EngineConfig;
use inferno::engine::request::{Event, Request};
use inferno::generate::SamplerConfig;
use inferno::load::{self, LoadOptions};
use inferno::quant::{CtConfig, QuantLinear, WeightFormat};
use serde_json::Value;

mod llama_ct_fixture;
use llama_ct_fixture::{dir, reference};

const CONTEXT: usize = 128;

/// Format; the least top-1 agreement (percent) of the quantized model with its dequantized-bf16
/// one and with transformers' f32 argmax, on the GPU in bf16.
const FORMATS: [(&str, f64, f64); 4] = [
    ("w8a8_int8", 93.0, 90.0),
    ("fp8_dynamic", 80.0, 80.0),
    ("w4a16", 96.0, 95.0),
    ("w8a16_int8", 95.0, 94.0),
];

fn rows(v: &Value) -> Vec<Vec<u32>> {
    let row = |r: &Value| -> Vec<u32> {
        r.as_array().expect("row").iter().map(|x| x.as_u64().expect("id") as u32).collect()
    };
    v.as_array().expect("rows").iter().map(row).collect()
}

/// The quantized-tensor names of a compressed-tensors projection.
const QUANT_SUFFIXES: [&str; 6] = [
    "weight",
    "weight_scale",
    "weight_zero_point",
    "weight_packed",
    "weight_shape",
    "weight_g_idx",
];

/// Writes `src`'s checkpoint into `dst` with every quantized projection replaced by its dense
/// f32 weight (`q · scale`, minus zero points, by [`QuantLinear::dequantize_host`]) and the
/// `quantization_config` removed: the same model as a plain HF checkpoint. `unit_scales`: the
/// codes alone (scale 1), the broken model the test must tell apart.
fn dequantized_checkpoint(src: &Path, dst: &Path, unit_scales: bool) {
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("config JSON");
    let ct = CtConfig::from_config(&config).expect("quantization_config").expect("quantized");
    let obj = config.as_object_mut().expect("config object");
    obj.remove("quantization_config");
    obj.remove("compression_config");
    std::fs::create_dir_all(dst).expect("dst");
    std::fs::write(dst.join("config.json"), config.to_string()).expect("write config");

    let cpu = Device::Cpu;
    // SAFETY: a fixture file nobody writes while the test runs.
    let st = unsafe { MmapedSafetensors::new(src.join("model.safetensors")) }.expect("open");
    let mut out: HashMap<String, Tensor> = HashMap::new();
    let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    // The projections are the modules with a scale (`scheme_for` takes every name for a Linear).
    let quantized = |prefix: &str| names.contains(&format!("{prefix}.weight_scale"));
    for name in &names {
        let (prefix, suffix) = name.rsplit_once('.').expect("dotted name");
        let Some(scheme) = ct.scheme_for(prefix).filter(|_| quantized(prefix)) else {
            out.insert(name.clone(), st.load(name, &cpu).expect("tensor"));
            continue;
        };
        assert!(QUANT_SUFFIXES.contains(&suffix), "{name}: unexpected in a quantized projection");
        if suffix != "weight_scale" {
            continue;
        }
        let shape: Vec<usize> = match scheme.weight {
            WeightFormat::Int4 { .. } => {
                let s = st.load(&format!("{prefix}.weight_shape"), &cpu).expect("weight_shape");
                let s: Vec<i64> = s.to_dtype(DType::I64).and_then(|s| s.to_vec1()).expect("shape");
                s.into_iter().map(|d| d as usize).collect()
            }
            _ => st.get(&format!("{prefix}.weight")).expect("weight").shape().to_vec(),
        };
        let (o, i) = (shape[0], shape[1]);
        let mut q = QuantLinear::load(&st, prefix, scheme, (o, i), &cpu).expect("load");
        if unit_scales {
            q.scale = q.scale.ones_like().expect("ones");
        }
        let w = Tensor::from_vec(q.dequantize_host().expect("dequantize"), (o, i), &cpu);
        out.insert(format!("{prefix}.weight"), w.expect("dense"));
    }
    candle_core::safetensors::save(&out, dst.join("model.safetensors")).expect("save");
}

/// Teacher-forces `seqs` through an engine on `path`, all requests at once; request `s` has
/// the first `1 + 4·s` tokens as its prompt. Each request's argmax after each of its positions
/// from its prompt's last on (the first out of the prefill, the others out of decode steps).
fn forced_argmax(path: &Path, seqs: &[Vec<u32>], dtype: DType, device: &Device) -> Vec<Vec<u32>> {
    let opts = LoadOptions {
        dtype: Some(dtype),
        context: Some(CONTEXT),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let n = seqs.len();
    let cfg = EngineConfig {
        max_seqs: n,
        kv_tokens: n * CONTEXT,
        token_budget: 512,
        pipeline: inferno::switches::pipeline(),
        spec: None,
    };
    let (engine, _) =
        load::start(path.to_str().expect("path"), &opts, device, move |_| cfg).expect("engine");
    let handles: Vec<_> = seqs
        .iter()
        .enumerate()
        .map(|(s, seq)| {
            let p = 1 + 4 * s;
            engine
                .submit(Request {
                    prompt: seq[..p].to_vec(),
                    sampling: SamplerConfig::greedy(),
                    max_tokens: seq.len() - p,
                    eos_ids: Vec::new(),
                    interrupt: None,
                    logprobs: Some(1),
                    forced: seq[p..].to_vec(),
                    constraint: None,
                    prediction: Vec::new(),
                })
                .expect("submit")
        })
        .collect();
    handles
        .into_iter()
        .map(|mut h| {
            let mut top = Vec::new();
            while let Some(Event::Token(_, Some(lp))) = h.blocking_next() {
                top.push(lp.top[0].0);
            }
            top
        })
        .collect()
}

/// Percent of positions where `a` and `b` agree; `b` may be longer (all positions): it is read
/// from each row's first position `a` covers, the prompt's last.
fn percent(a: &[Vec<u32>], b: &[Vec<u32>]) -> f64 {
    let (mut same, mut all) = (0, 0);
    for (x, y) in a.iter().zip(b) {
        let y = &y[y.len() - x.len() - 1..y.len() - 1];
        same += x.iter().zip(y).filter(|(p, q)| p == q).count();
        all += x.len();
    }
    100.0 * same as f64 / all.max(1) as f64
}

/// Top-1 agreements of one format, in percent.
struct Agreement {
    /// Quantized vs dequantized.
    qd: f64,
    /// Quantized vs transformers' f32 argmax.
    qt: f64,
    /// The dequantized model with the scales dropped vs the quantized one.
    xq: f64,
}

/// Runs every format on `device` in `dtype`, prints the agreements and hands them to `check`.
fn agreements(device: &Device, dtype: DType, check: impl Fn(&str, Agreement)) {
    let tmp = tempfile::tempdir().expect("tmp");
    for (name, _, _) in FORMATS {
        let fx = reference(name);
        let (seqs, want) = (rows(&fx["forced_ids"]), rows(&fx["forced_argmax"]));
        let (dense, broken) = (tmp.path().join(name), tmp.path().join(format!("{name}-unit")));
        dequantized_checkpoint(&dir(name), &dense, false);
        dequantized_checkpoint(&dir(name), &broken, true);
        let q = forced_argmax(&dir(name), &seqs, dtype, device);
        let d = forced_argmax(&dense, &seqs, dtype, device);
        let x = forced_argmax(&broken, &seqs, dtype, device);
        // `d` covers the same positions as `q`: compare them row against row.
        let same: usize =
            q.iter().zip(&d).map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x == y).count()).sum();
        let positions: usize = q.iter().map(Vec::len).sum();
        assert_eq!(positions, d.iter().map(Vec::len).sum::<usize>(), "{name}: position counts");
        let qd = 100.0 * same as f64 / positions as f64;
        let (qt, dt) = (percent(&q, &want), percent(&d, &want));
        let xq: usize =
            q.iter().zip(&x).map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x == y).count()).sum();
        let xq = 100.0 * xq as f64 / positions as f64;
        println!(
            "{name} {dtype:?} on {device:?}: {positions} positions; quantized vs dequantized {qd:.2}%, quantized vs transformers {qt:.2}%, dequantized vs transformers {dt:.2}%, scales dropped vs quantized {xq:.2}%"
        );
        check(name, Agreement { qd, qt, xq });
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_quantized_agrees_with_dequantized_bf16() {
    let device = Device::new_cuda(0).expect("a CUDA GPU");
    agreements(&device, DType::BF16, |name, a| {
        let (_, bar_d, bar_t) = FORMATS.iter().find(|f| f.0 == name).expect("format");
        assert!(a.qd >= *bar_d, "{name}: quantized vs dequantized-bf16 {:.2}% < {bar_d}%", a.qd);
        assert!(a.qt >= *bar_t, "{name}: quantized vs transformers {:.2}% < {bar_t}%", a.qt);
        assert!(a.xq < 20.0, "{name}: dropped scales still agree on {:.2}%", a.xq);
    });
}

/// The same comparison on the CPU in f32, where the quantized model is the reference path
/// (weights dequantized at load, activations fake-quantized per token, as compressed-tensors
/// does): the weight-only formats agree with their dequantized model everywhere (the same f32
/// products); W8A8 and FP8 differ by what quantizing the activations does to the argmax
/// (measured 96.6% and 86.3%; bars 94% and 82%); the quantized model agrees with transformers'
/// argmax (measured 99.7% to 100%: the logits match to 1e-3 in tests/llama_ct_reference.rs, and
/// only near-ties may flip). Also in CI: the dequantizing helper and the engine path.
#[test]
fn quantized_agrees_with_dequantized_on_the_cpu() {
    agreements(&Device::Cpu, DType::F32, |name, a| {
        let bar = match name {
            "w8a8_int8" => 94.0,
            "fp8_dynamic" => 82.0,
            _ => 100.0,
        };
        assert!(a.qd >= bar, "{name}: quantized vs dequantized {:.2}% < {bar}%", a.qd);
        assert!(a.qt >= 99.0, "{name}: quantized vs transformers {:.2}%", a.qt);
        assert!(a.xq < 20.0, "{name}: dropped scales still agree on {:.2}%", a.xq);
    });
}
