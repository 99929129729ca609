//! `inferno list` as a user runs it, against a cache built here in the real Hugging Face layout
//! (content-addressed blobs, relative symlinks in `snapshots/`, `refs/main`), written by hand
//! the way huggingface_hub does rather than through inferno's own cache code.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const LLAMA: &str = "TinyOrg/tiny-llama";
const LLAMA_MAIN: &str = "aaaaaaa111111111111111111111111111111111";
const LLAMA_OLD: &str = "bbbbbbb222222222222222222222222222222222";
const GPT_OSS: &str = "openai/gpt-oss-mini";
const GPT_OSS_MAIN: &str = "ccccccc333333333333333333333333333333333";
const GGUF: &str = "bartowski/tiny-GGUF";
const GGUF_MAIN: &str = "ddddddd444444444444444444444444444444444";
const DANGLING: &str = "broken/dangling";
const DANGLING_MAIN: &str = "eeeeeee555555555555555555555555555555555";
const EMPTY: &str = "broken/empty";

/// 2024-01-02T03:04:05Z
fn fixed_time() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_704_164_645)
}

struct TestCache {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl TestCache {
    fn new() -> TestCache {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("hub");
        std::fs::create_dir_all(&root).unwrap();
        TestCache { _tmp: tmp, root }
    }

    fn repo_dir(&self, id: &str) -> PathBuf {
        self.root.join(format!("models--{}", id.replace('/', "--")))
    }

    /// Stores `data` as a blob named by its sha256 and links it into the snapshot; returns the
    /// blob path.
    fn add_file(&self, id: &str, commit: &str, file: &str, data: &[u8]) -> PathBuf {
        let etag = hex::encode(Sha256::digest(data));
        let blob = self.repo_dir(id).join("blobs").join(&etag);
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, data).unwrap();
        self.link(id, commit, file, &etag);
        blob
    }

    /// `snapshots/<commit>/<file>` -> `../../blobs/<etag>` (one more `..` per folder in `file`).
    fn link(&self, id: &str, commit: &str, file: &str, etag: &str) {
        let link = self.repo_dir(id).join("snapshots").join(commit).join(file);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let ups = "../".repeat(file.matches('/').count() + 2);
        std::os::unix::fs::symlink(format!("{ups}blobs/{etag}"), link).unwrap();
    }

    fn set_ref(&self, id: &str, name: &str, commit: &str) {
        let path = self.repo_dir(id).join("refs").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, commit).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        run_with_cache(&self.root, args)
    }
}

fn run_with_cache(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("HF_HUB_CACHE", root)
        .output()
        .unwrap()
}

/// A real safetensors file: `(name, dtype, shape, bytes per element)`, zero data.
fn safetensors(tensors: &[(&str, &str, &[u64], u64)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, dtype, shape, elem) in tensors {
        let n = shape.iter().product::<u64>() * elem;
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let header = Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + offset as usize, 0);
    out
}

fn gguf_q4_0() -> Vec<u8> {
    let t = candle_core::Tensor::randn(0f32, 1f32, (64, 64), &candle_core::Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, GgmlDType::Q4_0).unwrap();
    let arch = gguf_file::Value::String("llama".into());
    let ctx = gguf_file::Value::U32(4096);
    let mut out = std::io::Cursor::new(Vec::new());
    let meta = [("general.architecture", &arch), ("llama.context_length", &ctx)];
    gguf_file::write(&mut out, &meta, &[("blk.0.attn_q.weight", &q)]).unwrap();
    out.into_inner()
}

fn touch(path: &Path, t: SystemTime) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
}

/// The cache every test below lists; returns it with the expected size of each revision.
fn populated() -> (TestCache, Sizes) {
    let c = TestCache::new();
    let mut sizes = Sizes::default();

    let config =
        br#"{"model_type": "llama", "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}"#;
    let weights = safetensors(&[
        ("model.embed_tokens.weight", "BF16", &[256, 64], 2),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", &[64, 64], 2),
        ("model.norm.weight", "F32", &[64], 4),
    ]);
    for (file, data) in [("config.json", &config[..]), ("model.safetensors", &weights)] {
        touch(&c.add_file(LLAMA, LLAMA_MAIN, file, data), fixed_time());
    }
    sizes.llama = (config.len() + weights.len()) as u64;
    // An older revision with a different config only (no weights): a second row.
    let old_config = br#"{"model_type": "llama", "max_position_embeddings": 1024}"#;
    touch(
        &c.add_file(LLAMA, LLAMA_OLD, "config.json", old_config),
        fixed_time() - Duration::from_secs(86400),
    );
    c.set_ref(LLAMA, "main", LLAMA_MAIN);

    let config = br#"{"model_type": "gpt_oss", "max_position_embeddings": 131072,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}"#;
    let weights = safetensors(&[
        ("model.layers.0.mlp.experts.gate_up_proj_blocks", "U8", &[4, 128, 2, 16], 1),
        ("model.layers.0.mlp.experts.gate_up_proj_scales", "U8", &[4, 128, 2], 1),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", &[64, 64], 2),
    ]);
    c.add_file(GPT_OSS, GPT_OSS_MAIN, "config.json", config);
    c.add_file(GPT_OSS, GPT_OSS_MAIN, "model.safetensors", &weights);
    // gpt-oss repos also ship the original checkpoint; the same blob twice counts once.
    let etag = hex::encode(Sha256::digest(&weights));
    c.link(GPT_OSS, GPT_OSS_MAIN, "original/model.safetensors", &etag);
    c.set_ref(GPT_OSS, "main", GPT_OSS_MAIN);
    sizes.gpt_oss = (config.len() + weights.len()) as u64;

    let gguf = gguf_q4_0();
    c.add_file(GGUF, GGUF_MAIN, "tiny-Q4_0.gguf", &gguf);
    c.set_ref(GGUF, "main", GGUF_MAIN);
    sizes.gguf = gguf.len() as u64;

    c.add_file(
        DANGLING,
        DANGLING_MAIN,
        "model.safetensors",
        &safetensors(&[("w", "F16", &[8], 2)]),
    );
    c.link(DANGLING, DANGLING_MAIN, "config.json", "0000000000000000000000000000000000000000");
    c.set_ref(DANGLING, "main", DANGLING_MAIN);

    std::fs::create_dir_all(c.repo_dir(EMPTY).join("blobs")).unwrap();
    std::fs::write(c.repo_dir(EMPTY).join("blobs").join("abc.incomplete"), [0u8; 10]).unwrap();
    // Not models: other tools' datasets and stray files are ignored.
    std::fs::create_dir_all(c.root.join("datasets--org--data/snapshots")).unwrap();
    std::fs::write(c.root.join("version.txt"), "1").unwrap();
    (c, sizes)
}

#[derive(Default)]
struct Sizes {
    llama: u64,
    gpt_oss: u64,
    gguf: u64,
}

fn json_rows(c: &TestCache) -> Vec<Value> {
    let out = c.run(&["list", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().clone()
}

#[test]
fn json_describes_every_revision() {
    let (c, sizes) = populated();
    let rows = json_rows(&c);
    let ids: Vec<(&str, Option<&str>)> =
        rows.iter().map(|r| (r["model"].as_str().unwrap(), r["commit"].as_str())).collect();
    assert_eq!(
        ids,
        vec![
            (GGUF, Some(GGUF_MAIN)),
            (DANGLING, Some(DANGLING_MAIN)),
            (EMPTY, None),
            (GPT_OSS, Some(GPT_OSS_MAIN)),
            (LLAMA, Some(LLAMA_MAIN)),
            (LLAMA, Some(LLAMA_OLD)),
        ]
    );

    let llama = &rows[4];
    assert_eq!(llama["architecture"], "llama");
    assert_eq!(llama["format"], "bf16");
    assert_eq!(llama["context_length"], 2048);
    assert_eq!(llama["refs"], json!(["main"]));
    assert_eq!(llama["size_bytes"], sizes.llama);
    assert_eq!(llama["modified"], "2024-01-02T03:04:05Z");
    assert_eq!(llama["error"], Value::Null);
    let snapshot = c.repo_dir(LLAMA).join("snapshots").join(LLAMA_MAIN);
    assert_eq!(llama["path"], snapshot.display().to_string());

    let old = &rows[5];
    assert_eq!((&old["format"], &old["context_length"]), (&json!("no weights"), &json!(1024)));
    assert_eq!((&old["refs"], &old["modified"]), (&json!([]), &json!("2024-01-01T03:04:05Z")));

    let gpt_oss = &rows[3];
    assert_eq!(gpt_oss["architecture"], "gpt_oss");
    assert_eq!(gpt_oss["format"], "mxfp4");
    assert_eq!(gpt_oss["context_length"], 131072);
    assert_eq!(gpt_oss["size_bytes"], sizes.gpt_oss, "a blob linked twice counts once");

    let gguf = &rows[0];
    assert_eq!(gguf["architecture"], "llama");
    assert_eq!(gguf["format"], "GGUF Q4_0");
    assert_eq!(gguf["context_length"], 4096);
    assert_eq!(gguf["size_bytes"], sizes.gguf);
}

#[test]
fn broken_entries_get_a_row_and_do_not_fail_the_command() {
    let (c, _) = populated();
    let rows = json_rows(&c);
    let dangling = &rows[1];
    assert_eq!(dangling["error"], "missing blob for config.json");
    assert_eq!((&dangling["format"], &dangling["architecture"]), (&Value::Null, &Value::Null));
    let empty = &rows[2];
    assert!(empty["error"].as_str().unwrap().starts_with("no snapshot"), "{empty}");
    assert_eq!(empty["size_bytes"], 10);

    // A truncated safetensors header (a copy cut short) is reported the same way.
    let blob = c.repo_dir(LLAMA).join("blobs").join(hex::encode(Sha256::digest(safetensors(&[
        ("model.embed_tokens.weight", "BF16", &[256, 64], 2),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", &[64, 64], 2),
        ("model.norm.weight", "F32", &[64], 4),
    ]))));
    std::fs::File::options().write(true).open(&blob).unwrap().set_len(50).unwrap();
    let rows = json_rows(&c);
    let err = rows[4]["error"].as_str().unwrap();
    assert!(err.starts_with("model.safetensors: not a valid safetensors file: truncated"), "{err}");
    assert_eq!(rows[3]["error"], Value::Null, "other rows are unaffected");
}

#[test]
fn plain_output_is_tab_separated_without_header() {
    let (c, sizes) = populated();
    let out = c.run(&["list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines.iter().all(|l| l.len() == 8), "{text}");
    let llama_size = sizes.llama.to_string();
    assert_eq!(
        lines[4],
        [
            LLAMA,
            LLAMA_MAIN,
            "main",
            llama_size.as_str(),
            "2024-01-02T03:04:05Z",
            "llama",
            "2048",
            "bf16"
        ]
    );
    assert_eq!(lines[0][7], "GGUF Q4_0");
    assert_eq!(lines[1][7], "broken: missing blob for config.json");
    assert_eq!(&lines[2][..3], [EMPTY, "-", "-"]);
}

#[test]
fn empty_or_missing_cache_prints_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    for root in [tmp.path().to_path_buf(), tmp.path().join("does-not-exist")] {
        let out = run_with_cache(&root, &["list"]);
        assert!(out.status.success());
        assert!(out.stdout.is_empty());
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            err.trim_end(),
            format!(
                "no models in {}; download one with: inferno download HuggingFaceTB/SmolLM2-135M-Instruct",
                root.display()
            )
        );
        let out = run_with_cache(&root, &["list", "--json"]);
        assert!(out.status.success());
        assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), json!([]));
    }
}

/// compressed-tensors checkpoints are listed by scheme (the fixtures of llama_ct_reference.rs).
#[test]
fn compressed_tensors_checkpoints_show_their_scheme() {
    let c = TestCache::new();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_ct");
    let commit = "c0ffee0000000000000000000000000000000000";
    let dirs = [
        ("w8a8_int8", "org/w8a8"),
        ("fp8_dynamic", "org/fp8"),
        ("w4a16", "org/w4a16"),
        ("w8a16_int8", "org/w8a16"),
    ];
    for (dir, id) in dirs {
        for file in ["config.json", "model.safetensors"] {
            let data = std::fs::read(fixtures.join(dir).join(file)).unwrap();
            c.add_file(id, commit, file, &data);
        }
        c.set_ref(id, "main", commit);
    }
    let rows = json_rows(&c);
    let formats: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["model"].as_str().unwrap(), r["format"].as_str().unwrap()))
        .collect();
    let want = [
        ("org/fp8", "fp8"),
        ("org/w4a16", "w4a16"),
        ("org/w8a16", "w8a16-int8"),
        ("org/w8a8", "w8a8-int8"),
    ];
    assert_eq!(formats, want);
}
