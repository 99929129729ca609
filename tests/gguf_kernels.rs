//! A Q4_K_M-style GGUF (Q4_K and Q6_K weights, a Q6_K tied embedding) through our own GGUF GEMVs
//! on the GPU, in the engine's batched decode steps (fused q/k/v and gate/up where the formats
//! agree) and in a prefill, against candle's (ggml's) quantized kernels on the CPU. Both are
//! measured against the same weights dequantized to f32 (an f32 model on the CPU): ours must be
//! about as close as ggml's kernels. A wrong column order, scale or min lands orders of magnitude
//! off. The file is made here from random weights by candle's quantizer (ggml's), so nothing is
//! downloaded.

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use inferno::models::llama::load::{self, GgufFile};

mod common;
use common::one_seq::OneSeq;

const HIDDEN: usize = 256;
const INTER: usize = 512;
const VOCAB: usize = 512;
const LAYERS: usize = 2;
const CONTEXT: usize = 256;

/// The tensors of the file: layer 0 in Q4_K_M's mix (v and down in Q6_K, so q/k/v do not fuse),
/// layer 1 all Q4_K; `dequantized`: every tensor as the f32 values of those blocks instead.
fn write_gguf(path: &Path, dequantized: bool) {
    let cpu = Device::Cpu;
    let mut seed = 0u64;
    let mut q = |shape: &[usize], t: GgmlDType| {
        seed += 1;
        // The same values in both files (candle's randn is not seeded): a sine of the index,
        // per tensor.
        let n: usize = shape.iter().product();
        let v: Vec<f32> =
            (0..n).map(|i| 0.08 * ((i as f32 * 0.37 + seed as f32 * 1.3).sin())).collect();
        let w = Tensor::from_vec(v, shape, &cpu).expect("w");
        let qt = QTensor::quantize(&w, t).expect("quantize");
        match dequantized {
            true => {
                QTensor::quantize(&qt.dequantize(&cpu).expect("deq"), GgmlDType::F32).expect("f32")
            }
            false => qt,
        }
    };
    let ones = |n: usize| {
        QTensor::quantize(&Tensor::ones(n, DType::F32, &cpu).expect("1"), GgmlDType::F32)
    };
    let mut tensors = vec![("token_embd.weight".to_string(), q(&[VOCAB, HIDDEN], GgmlDType::Q6K))];
    tensors.push(("output_norm.weight".into(), ones(HIDDEN).expect("norm")));
    for n in 0..LAYERS {
        let b = |s: &str| format!("blk.{n}.{s}.weight");
        let more = if n == 0 { GgmlDType::Q6K } else { GgmlDType::Q4K };
        tensors.push((b("attn_norm"), ones(HIDDEN).expect("norm")));
        tensors.push((b("ffn_norm"), ones(HIDDEN).expect("norm")));
        tensors.push((b("attn_q"), q(&[HIDDEN, HIDDEN], GgmlDType::Q4K)));
        tensors.push((b("attn_k"), q(&[128, HIDDEN], GgmlDType::Q4K)));
        tensors.push((b("attn_v"), q(&[128, HIDDEN], more)));
        tensors.push((b("attn_output"), q(&[HIDDEN, HIDDEN], GgmlDType::Q4K)));
        tensors.push((b("ffn_gate"), q(&[INTER, HIDDEN], GgmlDType::Q4K)));
        tensors.push((b("ffn_up"), q(&[INTER, HIDDEN], GgmlDType::Q4K)));
        tensors.push((b("ffn_down"), q(&[HIDDEN, INTER], more)));
    }
    use gguf_file::Value as V;
    let meta = [
        ("general.architecture", V::String("llama".into())),
        ("llama.context_length", V::U32(CONTEXT as u32)),
        ("llama.embedding_length", V::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", V::U32(INTER as u32)),
        ("llama.block_count", V::U32(LAYERS as u32)),
        ("llama.attention.head_count", V::U32(4)),
        ("llama.attention.head_count_kv", V::U32(2)),
        ("llama.rope.dimension_count", V::U32(64)),
    ];
    let meta: Vec<(&str, &V)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(path).expect("create"), &meta, &refs)
        .expect("write");
}

fn tokens() -> Vec<u32> {
    (0..40u32).map(|i| (i * 37 + 11) % VOCAB as u32).collect()
}

fn model(path: &Path, dev: &Device) -> OneSeq {
    let mut gguf = GgufFile::open(path).expect("open GGUF");
    OneSeq::new(Box::new(load::load_gguf(&mut gguf, CONTEXT, dev).expect("load GGUF")))
}

fn prefill_logits(path: &Path, dev: &Device) -> Vec<Vec<f32>> {
    model(path, dev).forward_all(&tokens(), 0).expect("forward").to_vec2().expect("logits")
}

/// The engine's batched path, one decode step per position (what `play`, `bench` and `serve`
/// run), teacher-forced.
fn engine_step_logits(path: &Path, dev: &Device) -> Vec<Vec<f32>> {
    use inferno::engine::kv::blocks::{BlockConfig, BlockManager, GroupSpec};
    use inferno::engine::runner::Runner;
    use inferno::engine::scheduler::Chunk;
    use inferno::load::LoadOptions;
    use inferno::models::batch::KvPool;
    const BLOCK: usize = 16;
    let tokens = tokens();
    let opts = LoadOptions {
        dtype: None,
        context: Some(CONTEXT),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let loaded = inferno::load::load(path.to_str().expect("path"), &opts, dev).expect("load");
    let model = loaded.split().0;
    let shape = model.kv_shape();
    let n_blocks = tokens.len().div_ceil(BLOCK) + 2;
    let pool =
        KvPool::new(&shape, BLOCK, &vec![n_blocks; shape.group_windows.len()], dev).expect("pool");
    let groups = shape.group_windows.iter().map(|w| GroupSpec { blocks: n_blocks, window: *w });
    let mut blocks = BlockManager::new(BlockConfig { block_size: BLOCK, groups: groups.collect() })
        .expect("blocks");
    let mut runner = Runner::new(model, pool, shape);
    blocks.add_sequence(0, &tokens);
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        blocks.ensure(0, i, i + 1).expect("ensure");
        let chunk = Chunk { id: 0, start: i, len: 1, sample: true, drafts: 0 };
        let logits: Tensor =
            runner.forward(&[chunk], &[&[*t][..]], &blocks).expect("step").expect("logits");
        out.push(
            logits
                .flatten_all()
                .expect("flat")
                .to_dtype(DType::F32)
                .expect("f32")
                .to_vec1()
                .expect("v"),
        );
    }
    out
}

/// Largest logit difference over all rows, relative to the largest |logit| of `want`.
fn rel_max_diff(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (a - b).abs()))
        .fold(0f32, f32::max);
    worst / scale
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    let (q, f) = (dir.join("q4_k_m.gguf"), dir.join("f32.gguf"));
    write_gguf(&q, false);
    write_gguf(&f, true);
    (q, f)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_k_quant_gguf_is_as_close_to_the_f32_model_as_ggmls_kernels() {
    let dev = inferno::gpu::open(0).expect("a CUDA device").0;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (q, f) = files(tmp.path());
    assert!(load::own_blocks_only(&GgufFile::open(&q).expect("open")), "our GEMVs take the file");
    let want = prefill_logits(&f, &Device::Cpu);
    let ggml = rel_max_diff(&prefill_logits(&q, &Device::Cpu), &want);
    let ours_prefill = rel_max_diff(&prefill_logits(&q, &dev), &want);
    let ours_steps = rel_max_diff(&engine_step_logits(&q, &dev), &want);
    eprintln!(
        "Q4_K/Q6_K, max |logit - f32| / max |logit|: ggml (CPU) {ggml:.2e}; ours (GPU) prefill \
         {ours_prefill:.2e}, engine decode steps {ours_steps:.2e}"
    );
    for (label, e) in [("prefill", ours_prefill), ("engine steps", ours_steps)] {
        assert!(e <= 2.0 * ggml + 1e-3, "{label}: ours {e} against ggml's {ggml}");
    }
}

/// The CPU half alone (runs everywhere): the file is one our GEMVs take on a GPU, it loads on
/// candle's kernels on the CPU, and they are close to the f32 model, so the GPU test's yardstick
/// is meaningful.
#[test]
fn ggmls_k_quant_kernels_are_close_to_the_f32_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (q, f) = files(tmp.path());
    assert!(load::own_blocks_only(&GgufFile::open(&q).expect("open")), "our GEMVs take the file");
    assert!(!load::own_blocks_only(&GgufFile::open(&f).expect("open")), "not the f32 file");
    let e = rel_max_diff(&prefill_logits(&q, &Device::Cpu), &prefill_logits(&f, &Device::Cpu));
    eprintln!("ggml Q4_K/Q6_K against f32: {e:.2e}");
    assert!(e > 0.0 && e < 0.1, "{e}");
}
