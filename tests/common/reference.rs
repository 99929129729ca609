//! A tiny fixture checkpoint (`tests/fixtures/NAME/`: config.json, model.safetensors, maybe
//! model.gguf, and reference.json with transformers' f32 greedy tokens and logit rows, written
//! by `scripts/fixtures/NAME.sh`) built through the registry as the CLI builds it, and the
//! comparisons the family reference tests make with it.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use inferno::models::arch::{Build, Origin};
use inferno::models::registry;
use serde_json::Value;

use super::one_seq::OneSeq;

pub const CONTEXT: usize = 128;

pub struct Fixture {
    pub name: &'static str,
    pub reference: Value,
}

impl Fixture {
    pub fn new(name: &'static str, reference_json: &str) -> Fixture {
        Fixture { name, reference: serde_json::from_str(reference_json).expect("reference JSON") }
    }

    /// The folder: beside the sources, or under the current directory when the test binary
    /// runs from a copy of the repository elsewhere (the GPU machine).
    pub fn dir(&self) -> PathBuf {
        let built =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(self.name);
        if built.exists() { built } else { PathBuf::from("tests/fixtures").join(self.name) }
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        ids(&self.reference[key])
    }

    /// The checkpoint, as the registry reads and builds it.
    pub fn safetensors(&self, dtype: DType, device: &Device) -> OneSeq {
        let dir = self.dir();
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let kind: Value = serde_json::from_str(&text).unwrap();
        let arch = registry::for_model_type(kind["model_type"].as_str()).expect("known model_type");
        let read = arch.read_hf(&text, None, Some(dtype)).expect("read config.json");
        let b = Build { origin: Origin::Checkpoint(&dir), dtype, context: CONTEXT, device };
        OneSeq::new(read.config.build(&b).expect("build from safetensors"))
    }

    /// The GGUF of GGUF architecture `arch`, as the registry reads and builds it.
    pub fn gguf(&self, arch: &str, device: &Device) -> OneSeq {
        let path = self.dir().join("model.gguf");
        let header = inferno::inspect::gguf::read_header(&path).expect("GGUF header");
        let family = registry::for_gguf(Some(arch));
        let read = family.read_gguf(&path, &header, None, device.is_cuda()).expect("read GGUF");
        let b = Build { origin: Origin::Gguf(&path), dtype: read.dtype, context: CONTEXT, device };
        OneSeq::new(read.config.build(&b).expect("build from GGUF"))
    }

    /// Greedy decoding from the reference's prompt, one token at a time after it.
    pub fn greedy(&self, model: &mut OneSeq, steps: usize) -> Vec<u32> {
        let prompt = self.ids("prompt_ids");
        let mut out = vec![argmax(&model.forward_last(&prompt, 0).unwrap())];
        while out.len() < steps {
            let pos = prompt.len() + out.len() - 1;
            out.push(argmax(&model.forward_last(&[*out.last().unwrap()], pos).unwrap()));
        }
        out
    }

    /// Logits for every position of the prompt followed by the reference's greedy tokens.
    pub fn all_logits(&self, model: &mut OneSeq) -> Vec<Vec<f32>> {
        let tokens = [self.ids("prompt_ids"), self.ids("greedy_tokens")].concat();
        let logits = model.forward_all(&tokens, 0).unwrap();
        logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
    }

    /// 32 or more greedy tokens identical to transformers'.
    pub fn check_greedy(&self, model: &mut OneSeq, label: &str) {
        let want = self.ids("greedy_tokens");
        assert!(want.len() >= 32);
        let got = self.greedy(model, want.len());
        assert_eq!(got, want, "{label}: greedy tokens differ from transformers'");
    }

    /// The logits rows transformers recorded, within `tolerance`.
    pub fn check_logits(&self, model: &mut OneSeq, tolerance: f32, label: &str) {
        let got = self.all_logits(model);
        let mut worst = 0f32;
        let rows = self.reference["logits"].as_array().unwrap();
        for (pos, want) in self.ids("logit_positions").iter().zip(rows) {
            let want: Vec<f32> = serde_json::from_value(want.clone()).expect("numbers");
            worst = worst.max(max_diff(&got[*pos as usize], &want));
        }
        eprintln!("{label}: max |logit - transformers| = {worst:.2e}");
        assert!(worst < tolerance, "{label}: logits differ from transformers' by {worst}");
    }

    /// Teacher-forced top-1 agreement of `model` with transformers' f32 greedy tokens.
    pub fn agreement(&self, model: &mut OneSeq) -> f32 {
        let (prompt, want) = (self.ids("prompt_ids"), self.ids("greedy_tokens"));
        let logits = self.all_logits(model);
        let hits = (0..want.len())
            .filter(|&i| {
                let row = &logits[prompt.len() - 1 + i];
                let best = (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
                best as u32 == want[i]
            })
            .count();
        hits as f32 / want.len() as f32
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

pub fn argmax(logits: &Tensor) -> u32 {
    logits.to_dtype(DType::F32).unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap()
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn gpu() -> Device {
    inferno::gpu::open(0).expect("a CUDA device").0
}
