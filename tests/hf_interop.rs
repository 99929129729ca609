//! The cache is shared with the official `huggingface_hub` client (PyPI), both ways:
//! what inferno downloads, huggingface_hub reads; what huggingface_hub downloaded, inferno reuses.
//!
//! Needs python3 with huggingface_hub (scripts/test.sh installs it into a venv and sets
//! INFERNO_PYTHON). Without it these tests fail with a message saying so: they never pass
//! without having run. Without the `conformance` feature (scripts/test.sh turns it on), a plain
//! `cargo test` lists them as ignored, saying what they need.

mod common;

use std::process::Command;

use common::hub_server::{FakeFile, FakeRepo, HubServer};
use common::{inferno, stderr, stdout};
use sha2::{Digest, Sha256};

fn python() -> String {
    let py = std::env::var("INFERNO_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let ok = Command::new(&py)
        .args(["-c", "import huggingface_hub"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{py} cannot import huggingface_hub: run scripts/test.sh, or set INFERNO_PYTHON to a python that has it"
    );
    py
}

fn helper(cache: &std::path::Path, endpoint: &str, args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/hf_cache.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_DISABLE_XET", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "hf_cache.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("hf_cache.py printed JSON")
}

fn repo() -> FakeRepo {
    FakeRepo::new(
        "org/shared",
        vec![
            FakeFile::new("config.json", br#"{"model_type":"llama"}"#.to_vec(), false),
            FakeFile::new("tokenizer.json", b"{}".to_vec(), false),
            FakeFile::new(
                "model.safetensors",
                (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>(),
                true,
            ),
        ],
    )
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs python's huggingface_hub: scripts/test.sh"
)]
fn huggingface_hub_reads_what_inferno_downloaded() {
    let repo = repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/shared"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    let seen = helper(cache.path(), &server.url, &["read", "org/shared", &repo.commit]);
    assert_eq!(seen["found"], true, "{seen}");
    assert_eq!(seen["warnings"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["refs"], serde_json::json!(["main"]));
    let snapshot = std::fs::canonicalize(stdout(&out).trim()).unwrap();
    assert_eq!(seen["snapshot"].as_str().unwrap(), snapshot.to_str().unwrap());
    for f in &repo.files {
        let want = hex::encode(Sha256::digest(&f.data));
        assert_eq!(seen["files"][&f.path].as_str(), Some(want.as_str()), "{}", f.path);
    }
    let total: u64 = repo.files.iter().map(|f| f.data.len() as u64).sum();
    assert_eq!(seen["size_on_disk"].as_u64(), Some(total));
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs python's huggingface_hub: scripts/test.sh"
)]
fn inferno_reuses_what_huggingface_hub_downloaded() {
    let repo = repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    helper(
        cache.path(),
        &server.url,
        &["fetch", "org/shared", "config.json", "tokenizer.json", "model.safetensors"],
    );
    let python_gets = server.content_gets().len();
    assert!(python_gets >= 3, "huggingface_hub did not download through the test server");

    server.clear_log();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/shared"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        server.content_gets().is_empty(),
        "inferno downloaded again: {:?}",
        server.content_gets()
    );
    let snap = std::path::PathBuf::from(stdout(&out).trim());
    for f in &repo.files {
        assert_eq!(std::fs::read(snap.join(&f.path)).unwrap(), f.data, "{}", f.path);
    }
    let offline =
        inferno(cache.path(), None, &["download", "org/shared"], &[("HF_HUB_OFFLINE", "1")]);
    assert!(offline.status.success(), "{}", stderr(&offline));
    assert_eq!(stdout(&offline), stdout(&out));
}
