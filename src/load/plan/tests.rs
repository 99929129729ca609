//! The plan against what the models allocate (built on the CPU), and the largest-context search.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::*;
use crate::engine::core::EngineConfig;
use crate::engine::pool::{BLOCK_SIZE, pool_groups};
use crate::load::{self, LoadOptions, Source};
use crate::models::batch::KvPool;

fn bench_config(name: &str) -> PathBuf {
    PathBuf::from(format!("{}/benches/configs/{name}.json", env!("CARGO_MANIFEST_DIR")))
}

fn spec_of(source: &Source, dtype: Option<DType>, context: usize, target: Target) -> Spec {
    let opts =
        LoadOptions { dtype, context: Some(context), dummy: false, kv_dtype: Default::default() };
    Spec::read(source, &opts, target).unwrap()
}

#[test]
fn largest_fitting_finds_the_edge() {
    for edge in [1, 2, 3, 100, 4095, 4096, 999_999] {
        assert_eq!(largest_fitting(1_000_000, |c| c <= edge), Some(edge), "edge {edge}");
    }
    assert_eq!(largest_fitting(1_000_000, |c| c <= 5_000_000), Some(1_000_000));
    assert_eq!(largest_fitting(1_000_000, |_| false), None);
    assert_eq!(largest_fitting(0, |_| true), None);
    assert_eq!(largest_fitting(1, |_| true), Some(1));
    assert_eq!(largest_fitting(usize::MAX, |c| c <= usize::MAX / 3), Some(usize::MAX / 3));
}

#[test]
fn the_largest_context_of_gpt_oss_20b_on_an_h100() {
    // 77.1 GiB free: the weights (12.8 GiB) and the fixed terms leave room for about 2.7 M
    // positions at 24.25 KiB each (KV cache 24 KiB, f32 RoPE tables 256 B).
    let source = Source::Dummy(bench_config("gpt-oss-20b"));
    let spec = spec_of(&source, None, 1_000_000_000, Target::Gpu);
    let free = (77.1 * (1u64 << 30) as f64) as u64;
    let c = spec.largest_context(free, spec.context).unwrap();
    assert!(spec.plan(c).total() <= free && spec.plan(c + 1).total() > free, "{c}");
    assert!((2_600_000..2_800_000).contains(&c), "{c}");
    let err = spec.check("gpt-oss-20b", Some(&Budget { free, target: Target::Gpu }), true);
    let msg = err.unwrap_err().to_string();
    assert!(msg.starts_with("gpt-oss-20b needs "), "{msg}");
    assert!(
        msg.contains(" at --context 1000000000 (weights 12.8 GiB, KV cache 22.4 TiB (bf16), "),
        "{msg}"
    );
    assert!(
        msg.contains("but the GPU has 77.1 GiB free; the largest context that fits is"),
        "{msg}"
    );
    assert!(msg.ends_with(&format!("is {c}")), "{msg}");
}

#[test]
fn a_model_larger_than_the_memory_fits_at_no_context() {
    let source = Source::Dummy(bench_config("llama-3.1-8b"));
    let spec = spec_of(&source, None, 8192, Target::Gpu);
    let budget = Budget { free: 10 << 30, target: Target::Gpu };
    assert_eq!(spec.largest_context(budget.free, 8192), None);
    let msg = spec.check("llama", Some(&budget), false).unwrap_err().to_string();
    assert!(msg.contains("at its default context 8192"), "{msg}");
    assert!(msg.ends_with("it does not fit at any context"), "{msg}");
    let err = spec.check("llama", Some(&budget), false).unwrap_err();
    assert_eq!(crate::error::kind_of(&err).exit_code(), 7);
}

#[test]
fn the_default_context_says_which_flag_to_pass() {
    let source = Source::Dummy(bench_config("tinyllama-1.1b"));
    let opts =
        LoadOptions { dtype: None, context: None, dummy: true, kv_dtype: Default::default() };
    let spec = Spec::read(&source, &opts, Target::Gpu).unwrap();
    assert_eq!(spec.context, 2048, "min(model max, 8192)");
    let need = spec.plan(2048).total();
    let budget = Budget { free: need - 1, target: Target::Gpu };
    let msg = spec.check("tiny", Some(&budget), false).unwrap_err().to_string();
    let c = spec.largest_context(budget.free, 2047).unwrap();
    assert!(msg.ends_with(&format!("the largest context that fits is {c}: pass --context {c}")));
    assert_eq!(
        spec.check("tiny", Some(&Budget { free: need, target: Target::Gpu }), false).unwrap(),
        spec.plan(2048)
    );
}

#[test]
fn the_20b_kv_pool_by_hand() {
    // 2 KiB per token and layer. Full layers: 8192 positions in blocks of 16, plus the padding
    // block. Sliding layers: the window and one step (128 + 2048 in 137 blocks), 4096 tokens of
    // headroom (256 blocks) and the padding block.
    let spec = Spec::read(
        &Source::Dummy(bench_config("gpt-oss-20b")),
        &LoadOptions {
            dtype: None,
            context: Some(8192),
            dummy: true,
            kv_dtype: Default::default(),
        },
        Target::Gpu,
    )
    .unwrap();
    let per_layer_token = 8 * 64 * 2 * 2;
    let (full, sliding) = (513 * 16, (137 + 256 + 1) * 16);
    assert_eq!(spec.plan(8192).kv_cache, 12 * (full + sliding) * per_layer_token);
}

#[test]
fn a_rank_plans_its_slice_and_a_refusal_names_the_tp_that_fits() {
    let spec = Spec::read(
        &Source::Dummy(bench_config("gpt-oss-120b")),
        &LoadOptions {
            dtype: None,
            context: Some(8192),
            dummy: true,
            kv_dtype: Default::default(),
        },
        Target::Gpu,
    )
    .unwrap();
    let rank =
        |world| spec.for_rank(crate::dist::Shard { rank: 0, world }, false).unwrap().plan(8192);
    let (one, two, four) = (spec.plan(8192), rank(2), rank(4));
    // Everything splits but the router and the experts' down biases (53 MB each over 36
    // layers), whole on every rank.
    let halves = two.weights * 2;
    assert!(halves.abs_diff(one.weights) < 128 << 20, "{} vs {}", two.weights, one.weights);
    // Rank 0 keeping the whole embedding too (an EAGLE-3 head reads it) holds the other half.
    let shard = crate::dist::Shard { rank: 0, world: 2 };
    let kept = spec.for_rank(shard, true).unwrap().plan(8192);
    assert_eq!(kept.weights - two.weights, 201_088 / 2 * 2880 * 2);
    assert!(four.weights < two.weights);
    assert_eq!((two.kv_cache * 2, four.kv_cache * 4), (one.kv_cache, one.kv_cache));
    // A GPU that holds half of the model but not all of it.
    let budget = Budget { free: two.total() + (1 << 30), target: Target::Gpu };
    let err = spec.check("gpt-oss-120b", Some(&budget), true).unwrap_err();
    let err =
        super::super::with_tp_advice(err, &spec, 8192, Some(&budget), crate::dist::Shard::SINGLE);
    let msg = err.to_string();
    assert!(msg.contains("; with --tp 2 each GPU needs"), "{msg}");
    assert_eq!(crate::error::kind_of(&err).exit_code(), 7);
    assert_eq!(msg.lines().count(), 1);
}

/// Loads `name` on the CPU and checks the plan it made against what the
/// model it built holds and the KV pool an engine of one sequence allocates for it.
fn plan_matches_allocation(name: &Path, dtype: Option<DType>, context: usize, dummy: bool) {
    plan_matches_allocation_kv(name, dtype, context, dummy, Default::default());
}

fn plan_matches_allocation_kv(
    name: &Path,
    dtype: Option<DType>,
    context: usize,
    dummy: bool,
    kv_dtype: crate::models::batch::KvDtype,
) {
    let opts = LoadOptions { dtype, context: Some(context), dummy, kv_dtype };
    let loaded = load::load(name.to_str().unwrap(), &opts, &Device::Cpu).unwrap();
    let got = loaded.model.allocated();
    let shape = loaded.model.kv_shape();
    let groups = pool_groups(&shape, &EngineConfig::single(context).pool());
    let blocks: Vec<usize> = groups.iter().map(|g| g.blocks).collect();
    let pool = KvPool::new(&shape, BLOCK_SIZE, &blocks, &Device::Cpu).unwrap();
    let plan = loaded.info.plan;
    let what = format!("{} {dtype:?} context {context}", name.display());
    assert_eq!(plan.context, context, "{what}");
    assert_eq!(plan.weights, got.weights, "weights: {what}");
    assert_eq!(plan.kv_cache, pool.bytes(), "KV cache: {what}");
    assert_eq!(plan.rope_tables, got.rope_tables, "RoPE tables: {what}");
    assert!(pool.bytes() > 0 && got.weights > 0);
}

fn gpt_oss_fixture() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"))
}

#[test]
fn gpt_oss_checkpoint_plan_is_what_the_model_allocates() {
    // The fixture's window is 8: its sliding group is smaller than the full one only past
    // window + step + headroom tokens.
    for (dtype, context) in
        [(None, 64), (Some(DType::F32), 300), (None, 519), (None, 2000), (None, 8000)]
    {
        plan_matches_allocation(&gpt_oss_fixture(), dtype, context, false);
    }
}

/// FP8 pools (the CPU emulates them): the codes, and a scale byte per row of keys or values.
#[test]
fn fp8_kv_plan_is_what_the_pool_allocates() {
    let fp8 = crate::models::batch::KvDtype::Fp8;
    for context in [64, 2000] {
        plan_matches_allocation_kv(&gpt_oss_fixture(), None, context, false, fp8);
    }
    let int8 = crate::models::batch::KvDtype::Int8;
    plan_matches_allocation_kv(&gpt_oss_fixture(), None, 300, false, int8);
    let llama = gpt_oss_fixture().with_file_name("llama3_tiny");
    plan_matches_allocation_kv(&llama, None, 300, false, fp8);
}

#[test]
fn gpt_oss_gguf_plan_is_what_the_model_allocates() {
    // Loaded into the HF layout's tensors (experts repacked, Q8_0 dequantized): the same count.
    let gguf = gpt_oss_fixture().with_file_name("gpt_oss_tiny_gguf").join("model.gguf");
    for (dtype, context) in [(None, 64), (Some(DType::F32), 300)] {
        plan_matches_allocation(&gguf, dtype, context, false);
    }
}

fn write_config(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(gpt_oss_fixture().join("config.json")).unwrap(),
    )
    .unwrap();
    edit(&mut v);
    let path = dir.join(name);
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn gpt_oss_random_weights_plan_is_what_the_model_allocates() {
    let tmp = tempfile::tempdir().unwrap();
    let untied = write_config(tmp.path(), "untied.json", |_| {});
    let tied = write_config(tmp.path(), "tied.json", |v| v["tie_word_embeddings"] = true.into());
    for path in [&untied, &tied] {
        plan_matches_allocation(path, None, 700, true);
        plan_matches_allocation(path, Some(DType::F32), 100, true);
    }
}

const TINY_LLAMA: &str = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":96,
    "num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":300,
    "max_position_embeddings":128,"rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":TIE,
    "attention_bias":BIAS,"torch_dtype":"bfloat16"ROPE}"#;

fn tiny_llama(tie: bool, bias: bool, rope: &str) -> String {
    TINY_LLAMA
        .replace("TIE", &tie.to_string())
        .replace("BIAS", &bias.to_string())
        .replace("ROPE", rope)
}

#[test]
fn llama_random_weights_plan_is_what_the_model_allocates() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (tie, bias)) in [(false, false), (true, true)].into_iter().enumerate() {
        let path = tmp.path().join(format!("llama{i}.json"));
        std::fs::write(&path, tiny_llama(tie, bias, "")).unwrap();
        for dtype in [None, Some(DType::F32), Some(DType::F16)] {
            plan_matches_allocation(&path, dtype, 200, true);
        }
    }
    // Dynamic NTK has no fixed RoPE tables, which the batched path needs: refused at load.
    let dynamic = r#","rope_scaling":{"type":"dynamic","factor":2.0}"#;
    let path = tmp.path().join("dynamic.json");
    std::fs::write(&path, tiny_llama(false, false, dynamic)).unwrap();
    let opts =
        LoadOptions { dtype: None, context: Some(200), dummy: true, kv_dtype: Default::default() };
    let err = load::load(path.to_str().unwrap(), &opts, &Device::Cpu).err().unwrap();
    assert!(err.to_string().contains("dynamic NTK"), "{err}");
}

#[test]
fn llama_checkpoint_plan_is_what_the_model_allocates() {
    // A checkpoint written from random weights (f32 in the file, bf16 once loaded), tied with
    // and without an lm_head tensor in the file.
    use std::collections::HashMap;
    let dev = Device::Cpu;
    for (tie, with_head) in [(false, true), (true, false), (true, true)] {
        let tmp = tempfile::tempdir().unwrap();
        let text = tiny_llama(tie, false, "");
        std::fs::write(tmp.path().join("config.json"), &text).unwrap();
        let cfg = crate::models::llama::LlamaConfig::from_hf_json(&text).unwrap();
        let mut tensors: HashMap<String, candle_core::Tensor> = HashMap::new();
        for (name, shape) in crate::models::llama::memory::checkpoint_tensors(&cfg, with_head) {
            tensors.insert(name, candle_core::Tensor::randn(0f32, 0.02, shape, &dev).unwrap());
        }
        candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
        for dtype in [None, Some(DType::F32)] {
            plan_matches_allocation(tmp.path(), dtype, 100, false);
        }
    }
}

#[test]
fn llama_gguf_plan_is_what_the_model_allocates() {
    use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
    let dev = Device::Cpu;
    let q = |shape: &[usize], t: GgmlDType| {
        QTensor::quantize(&candle_core::Tensor::randn(0f32, 0.02, shape, &dev).unwrap(), t).unwrap()
    };
    for with_output in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tiny.gguf");
        let (h, i, v) = (64, 96, 256);
        let mut tensors = vec![("token_embd.weight".to_string(), q(&[v, h], GgmlDType::Q8_0))];
        tensors.push(("output_norm.weight".into(), q(&[h], GgmlDType::F32)));
        if with_output {
            tensors.push(("output.weight".into(), q(&[v, h], GgmlDType::Q4_1)));
        }
        for n in 0..2 {
            let b = |s: &str| format!("blk.{n}.{s}.weight");
            tensors.push((b("attn_norm"), q(&[h], GgmlDType::F32)));
            tensors.push((b("ffn_norm"), q(&[h], GgmlDType::F32)));
            tensors.push((b("attn_q"), q(&[h, h], GgmlDType::Q4_0)));
            tensors.push((b("attn_k"), q(&[32, h], GgmlDType::Q8_0)));
            tensors.push((b("attn_v"), q(&[32, h], GgmlDType::F16)));
            tensors.push((b("attn_output"), q(&[h, h], GgmlDType::Q4_0)));
            tensors.push((b("ffn_gate"), q(&[i, h], GgmlDType::Q4_1)));
            tensors.push((b("ffn_up"), q(&[i, h], GgmlDType::Q4_1)));
            tensors.push((b("ffn_down"), q(&[h, i], GgmlDType::Q8_0)));
        }
        use gguf_file::Value as V;
        let meta = [
            ("general.architecture", V::String("llama".into())),
            ("llama.context_length", V::U32(256)),
            ("llama.embedding_length", V::U32(h as u32)),
            ("llama.feed_forward_length", V::U32(i as u32)),
            ("llama.block_count", V::U32(2)),
            ("llama.attention.head_count", V::U32(4)),
            ("llama.attention.head_count_kv", V::U32(2)),
            ("llama.rope.dimension_count", V::U32(16)),
        ];
        let meta: Vec<(&str, &V)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
        gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &meta, &refs).unwrap();
        plan_matches_allocation(&path, None, 200, false);
    }
}

#[test]
fn a_device_allocation_failure_while_loading_is_exit_7_with_the_plan() {
    let spec = spec_of(&Source::Dummy(bench_config("tinyllama-1.1b")), None, 2048, Target::Gpu);
    let plan = spec.plan(2048);
    let budget = Some(Budget { free: 1 << 30, target: Target::Gpu });
    // What candle returns when cuMemAllocAsync fails, under the loader's context.
    let oom =
        candle_core::Error::Msg("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into());
    let err = load::out_of_memory(anyhow::Error::from(oom).context("loading"), "m", &plan, budget);
    assert_eq!(crate::error::kind_of(&err).exit_code(), 7);
    let msg = err.to_string();
    assert!(
        msg.starts_with("out of GPU memory while loading m at context 2048: the plan was "),
        "{msg}"
    );
    assert!(msg.contains("; 1.0 GiB was free before loading"), "{msg}");
    let other = load::out_of_memory(anyhow::anyhow!("bad shape"), "m", &plan, budget);
    assert_eq!(other.to_string(), "bad shape");
}

/// `--kv-dtype fp8` (int8 takes the same bytes) on gpt-oss-120b with one H100's 77.1 GiB free:
/// the KV cache takes 65 bytes a row of 64 where bf16 takes 128, so the largest context nearly
/// doubles; what keeps it from 2× is the scale byte and the f32 RoPE tables (256 B a position,
/// the same in both).
#[test]
fn fp8_kv_nearly_doubles_the_120b_context_on_an_h100() {
    let source = Source::Dummy(bench_config("gpt-oss-120b"));
    let free = (77.1 * (1u64 << 30) as f64) as u64;
    let largest = |kv_dtype| {
        let opts = LoadOptions { dtype: None, context: Some(1 << 30), dummy: true, kv_dtype };
        let spec = Spec::read(&source, &opts, Target::Gpu).unwrap();
        let c = spec.largest_context(free, spec.context).unwrap();
        (c, spec.plan(c))
    };
    let (bf16, bf16_plan) = largest(crate::models::batch::KvDtype::Compute);
    let (fp8, fp8_plan) = largest(crate::models::batch::KvDtype::Fp8);
    let ratio = fp8 as f64 / bf16 as f64;
    eprintln!(
        "gpt-oss-120b on 77.1 GiB: bf16 KV {bf16} positions ({}), fp8 KV {fp8} positions ({}): \
         {ratio:.3}x",
        bf16_plan.parts(),
        fp8_plan.parts()
    );
    assert!(fp8_plan.parts().contains("(fp8)") && bf16_plan.parts().contains("(bf16)"));
    assert!((1.9..2.0).contains(&ratio), "{bf16} -> {fp8}: {ratio}");
    // Per position and full layer: 8 kv heads × (64 codes + 1 scale) for k and for v.
    let spec = |kv_dtype| {
        let opts = LoadOptions { dtype: None, context: Some(8192), dummy: true, kv_dtype };
        Spec::read(&source, &opts, Target::Gpu).unwrap().plan(8192).kv_cache
    };
    let (b, f) =
        (spec(crate::models::batch::KvDtype::Compute), spec(crate::models::batch::KvDtype::Fp8));
    assert_eq!(f * 128, b * 65, "fp8 {f} bytes, bf16 {b}");
}

/// The tiny gpt-oss's verify-step cost model ([`crate::models::step_cost`]) takes its experts'
/// share of a one-row step from the built model's tensors: here the same share from its
/// config by hand and the plan's weight bytes (which the test above ties to the model).
#[test]
fn gpt_oss_step_cost_counts_its_experts_by_hand() {
    let opts =
        LoadOptions { dtype: None, context: Some(64), dummy: false, kv_dtype: Default::default() };
    let loaded = load::load(gpt_oss_fixture().to_str().unwrap(), &opts, &Device::Cpu).unwrap();
    // 4 layers of 8 experts over hidden 64, intermediate 64: u8 FP4 blocks of 16 bytes and u8
    // scales per 32 values, f32 biases; gate_up has 128 rows, down 64.
    let per_expert: u64 = (128 * 2 * 16 + 128 * 2 + 128 * 4) + (64 * 2 * 16 + 64 * 2 + 64 * 4);
    let experts = 4 * 8 * per_expert;
    let embed = 256 * 64 * loaded.info.dtype.size_in_bytes() as u64;
    let rest = loaded.info.plan.weights - experts - embed + embed / 256;
    let routed = experts as f64 * 4.0 / 8.0;
    let bytes = routed + rest as f64;
    let want = crate::models::step_cost::StepCost::moe(8, 4, routed / bytes, bytes as u64);
    assert_eq!(loaded.model.step_cost(), want);
    // A dense model's extra rows cost 2% of a step each.
    let llama = gpt_oss_fixture().with_file_name("llama3_tiny");
    let loaded = load::load(llama.to_str().unwrap(), &opts, &Device::Cpu).unwrap();
    assert_eq!(loaded.model.step_cost().relative(3), 1.04);
}

/// Each rank of `--tp 2` plans what it allocates: its rows of the vocabulary (the last rank's
/// padded where the ranks do not divide it), a tied head sharing the embedding's rows, and with
/// the whole embedding kept beside them (rank 0 under an EAGLE-3 head without its own).
#[test]
fn a_rank_plans_what_it_allocates() {
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let tied = write_config(tmp.path(), "tied.json", |v| {
        v["tie_word_embeddings"] = true.into();
        v["vocab_size"] = 251.into();
    });
    let llama = gpt_oss_fixture().with_file_name("llama3_tiny");
    let cases = [(gpt_oss_fixture(), false), (llama, false), (tied.clone(), true)];
    for (path, dummy) in &cases {
        for whole in [false, true] {
            for end in crate::dist::ThreadGroup::new(2) {
                let rank = crate::dist::Collective::shard(&end).rank;
                let opts = LoadOptions {
                    dtype: None,
                    context: Some(64),
                    dummy: *dummy,
                    kv_dtype: Default::default(),
                };
                let comm: Arc<dyn crate::dist::Collective> = Arc::new(end);
                let name = path.to_str().unwrap();
                let loaded = load::load_with(name, &opts, &Device::Cpu, Some(comm), whole).unwrap();
                let what = format!("{} rank {rank} of 2, whole embedding {whole}", path.display());
                assert_eq!(loaded.info.plan.weights, loaded.model.allocated().weights, "{what}");
                assert_eq!(loaded.model.embedding().is_some(), whole, "{what}");
            }
        }
    }
}
