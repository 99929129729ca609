//! `inferno download` against a local stand-in of the Hub (tests/common/hub_server.rs).

mod common;

use std::path::{Path, PathBuf};

use common::hub_server::{FakeFile, FakeRepo, GOOD_TOKEN, HubServer};
use common::{inferno, noise, stderr, stdout};

fn llama_repo() -> FakeRepo {
    let index = r#"{"metadata":{"total_size":1},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;
    FakeRepo::new(
        "org/tiny-llama",
        vec![
            FakeFile::new("config.json", br#"{"model_type":"llama"}"#.to_vec(), false),
            FakeFile::new("tokenizer.json", b"{\"version\":\"1.0\"}".to_vec(), false),
            FakeFile::new("README.md", b"# readme".to_vec(), false),
            FakeFile::new("model.safetensors.index.json", index.as_bytes().to_vec(), false),
            FakeFile::new("model-00001-of-00002.safetensors", noise(300_000, 1), true),
            FakeFile::new("model-00002-of-00002.safetensors", noise(200_000, 2), true),
            FakeFile::new("consolidated.safetensors", noise(1000, 3), true),
            FakeFile::new("original/model.safetensors", noise(1000, 4), true),
        ],
    )
}

fn snapshot(cache: &Path, repo: &FakeRepo) -> PathBuf {
    cache
        .join(format!("models--{}", repo.id.replace('/', "--")))
        .join("snapshots")
        .join(&repo.commit)
}

fn blobs(cache: &Path, repo: &FakeRepo) -> Vec<String> {
    let dir = cache.join(format!("models--{}", repo.id.replace('/', "--"))).join("blobs");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

const FETCHED: [&str; 5] = [
    "config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
];

#[test]
fn full_download_writes_the_hf_cache_layout() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let snap = snapshot(cache.path(), &repo);
    assert_eq!(stdout(&out).trim(), snap.display().to_string());

    let mut present: Vec<String> = std::fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    assert_eq!(present, FETCHED, "README, consolidated and original/ must not be fetched");
    for name in FETCHED {
        let link = snap.join(name);
        let target = std::fs::read_link(&link).unwrap();
        assert!(target.starts_with("../../blobs"), "{name} -> {}", target.display());
        assert_eq!(std::fs::read(&link).unwrap(), repo.file(name).data, "{name}");
        assert!(target.ends_with(repo.file(name).etag()));
    }
    let refs = cache.path().join("models--org--tiny-llama/refs/main");
    assert_eq!(std::fs::read_to_string(refs).unwrap(), repo.commit);
    assert!(blobs(cache.path(), &repo).iter().all(|b| !b.ends_with(".incomplete")));

    // A second run finds everything cached and fetches no content.
    server.clear_log();
    let again = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    let gets: Vec<_> =
        server.content_gets().into_iter().filter(|l| !l.path.ends_with("index.json")).collect();
    assert!(gets.is_empty(), "re-downloaded: {gets:?}");
}

#[test]
fn a_cut_connection_is_resumed_with_range() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    server.cut("model-00001-of-00002.safetensors", 100_000, 2);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sha = repo.file("model-00001-of-00002.safetensors").sha256();
    let ranges: Vec<Option<String>> = server
        .content_gets()
        .into_iter()
        .filter(|l| l.path.ends_with(&sha))
        .map(|l| l.range)
        .collect();
    assert_eq!(ranges, vec![None, Some("bytes=100000-".into()), Some("bytes=200000-".into())]);
    let got = std::fs::read(snapshot(cache.path(), &repo).join("model-00001-of-00002.safetensors"))
        .unwrap();
    assert_eq!(got, repo.file("model-00001-of-00002.safetensors").data);
}

#[test]
fn a_partial_file_from_an_earlier_run_is_resumed() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let file = repo.file("model-00002-of-00002.safetensors");
    let blobs_dir = cache.path().join("models--org--tiny-llama/blobs");
    std::fs::create_dir_all(&blobs_dir).unwrap();
    std::fs::write(blobs_dir.join(format!("{}.incomplete", file.sha256())), &file.data[..12_345])
        .unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log: Vec<_> =
        server.content_gets().into_iter().filter(|l| l.path.ends_with(&file.sha256())).collect();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].range.as_deref(), Some("bytes=12345-"));
    let got = std::fs::read(snapshot(cache.path(), &repo).join(&file.path)).unwrap();
    assert_eq!(got, file.data);
}

#[test]
fn a_checksum_mismatch_is_rejected_and_nothing_is_linked() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    server.corrupt("model-00002-of-00002.safetensors");
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("checksum mismatch")
            && err.lines().filter(|l| l.starts_with("error:")).count() == 1,
        "{err}"
    );
    let file = repo.file("model-00002-of-00002.safetensors");
    let names = blobs(cache.path(), &repo);
    assert!(!names.iter().any(|b| b.starts_with(&file.sha256())), "{names:?}");
    assert!(!snapshot(cache.path(), &repo).join(&file.path).exists());
}

#[test]
fn gated_repos_need_a_token_and_the_token_stays_on_the_hub() {
    let mut repo = llama_repo();
    repo.id = "org/gated".into();
    repo.gated = true;
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/gated"], &[]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("set HF_TOKEN"), "{}", stderr(&out));

    let bad = inferno(
        cache.path(),
        Some(&server.url),
        &["download", "org/gated"],
        &[("HF_TOKEN", "hf_wrong")],
    );
    assert_eq!(bad.status.code(), Some(4));
    assert!(stderr(&bad).contains("no access"), "{}", stderr(&bad));

    server.clear_log();
    let ok = inferno(
        cache.path(),
        Some(&server.url),
        &["download", "org/gated"],
        &[("HF_TOKEN", GOOD_TOKEN)],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    for l in server.log() {
        if l.path.starts_with("/cdn/") {
            assert_eq!(l.auth, None, "token leaked to the CDN");
        } else {
            assert_eq!(l.auth.as_deref(), Some(format!("Bearer {GOOD_TOKEN}").as_str()));
        }
    }
}

#[test]
fn missing_repo_and_revision_are_not_found() {
    let server = HubServer::start(vec![llama_repo()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/nope"], &[]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    let out = inferno(
        cache.path(),
        Some(&server.url),
        &["download", "org/tiny-llama", "--revision", "v9"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("revision \"v9\" not found"), "{}", stderr(&out));
    assert!(!cache.path().join("models--org--nope").exists());
}

#[test]
fn path_traversal_is_refused() {
    let server = HubServer::start(vec![llama_repo()]);
    let cache = tempfile::tempdir().unwrap();
    for bad in ["../evil", "org/../../x", "/abs/path", "org\\name"] {
        let out = inferno(cache.path(), Some(&server.url), &["download", bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
    }
    let out = inferno(
        cache.path(),
        Some(&server.url),
        &["download", "org/tiny-llama", "--revision", "../../x"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    for evil in ["../../../../tmp/pwned", "sub/../../x", "a\\b.json", "/etc/passwd"] {
        let server = HubServer::start(vec![llama_repo()]);
        server.add_sibling_name(evil);
        let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
        assert_eq!(out.status.code(), Some(2), "{evil}: {}", stderr(&out));
        assert!(stderr(&out).contains("refusing file name"), "{}", stderr(&out));
    }
    assert!(std::fs::read_dir(cache.path()).unwrap().next().is_none(), "something was written");
}

#[test]
fn dry_run_lists_files_and_writes_nothing() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out =
        inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama", "--dry-run"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for name in FETCHED {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(!text.contains("README") && !text.contains("original/"));
    let total: usize = FETCHED.iter().map(|n| repo.file(n).data.len()).sum();
    let human = format!("{:.1} kB in total", total as f64 / 1000.0);
    assert!(text.contains("5 files") && text.contains(&human), "{text} (want {human})");
    assert!(
        std::fs::read_dir(cache.path()).unwrap().next().is_none(),
        "dry run wrote to the cache"
    );
}

#[test]
fn include_and_exclude_choose_files() {
    let repo = FakeRepo::new(
        "org/tiny-gguf",
        vec![
            FakeFile::new("config.json", b"{}".to_vec(), false),
            FakeFile::new("tokenizer.json", b"{}".to_vec(), false),
            FakeFile::new("m.Q4_0.gguf", noise(5000, 5), true),
            FakeFile::new("m.Q8_0.gguf", noise(9000, 6), true),
        ],
    );
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-gguf"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("m.Q4_0.gguf") && stderr(&out).contains("--include"),
        "{}",
        stderr(&out)
    );

    let args = ["download", "org/tiny-gguf", "--include", "*Q8_0.gguf", "--exclude", "tokenizer*"];
    let out = inferno(cache.path(), Some(&server.url), &args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let snap = snapshot(cache.path(), &repo);
    assert!(snap.join("m.Q8_0.gguf").exists() && snap.join("config.json").exists());
    assert!(!snap.join("m.Q4_0.gguf").exists() && !snap.join("tokenizer.json").exists());
}

#[test]
fn offline_mode_uses_the_cache_only() {
    let repo = llama_repo();
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let offline = [("HF_HUB_OFFLINE", "1")];
    let out = inferno(cache.path(), None, &["download", "org/tiny-llama"], &offline);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("offline"), "{}", stderr(&out));

    let online = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &[]);
    assert!(online.status.success(), "{}", stderr(&online));
    server.clear_log();
    let out = inferno(cache.path(), Some(&server.url), &["download", "org/tiny-llama"], &offline);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), stdout(&online));
    assert!(server.log().is_empty(), "offline mode made requests: {:?}", server.log());

    // A file the selection needs is missing from the snapshot: offline cannot complete it.
    std::fs::remove_file(snapshot(cache.path(), &repo).join("model-00002-of-00002.safetensors"))
        .unwrap();
    let out = inferno(cache.path(), None, &["download", "org/tiny-llama"], &offline);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn an_unreachable_hub_is_a_network_error() {
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), None, &["download", "org/tiny-llama"], &[]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("cannot reach") && err.contains("HF_HUB_OFFLINE"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A minimal valid safetensors file holding one U8 tensor of `n` bytes.
fn tiny_safetensors(name: &str, n: usize) -> Vec<u8> {
    let header = format!(r#"{{"{name}":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}}}"#);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(noise(n, n as u64));
    out
}

#[test]
fn gpt_oss_20b_file_list_fetches_only_what_is_needed_and_lists_as_mxfp4() {
    let config =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/configs/gpt-oss-20b.json"))
            .unwrap();
    let index = r#"{"metadata":{"total_size":3000},"weight_map":{
        "model.embed_tokens.weight":"model-00000-of-00002.safetensors",
        "model.layers.0.mlp.experts.down_proj_blocks":"model-00001-of-00002.safetensors",
        "lm_head.weight":"model-00002-of-00002.safetensors"}}"#;
    let text = |s: &str| s.as_bytes().to_vec();
    let repo = FakeRepo::new(
        "openai/gpt-oss-20b",
        vec![
            FakeFile::new(".gitattributes", text("*.safetensors filter=lfs"), false),
            FakeFile::new("LICENSE", text("Apache-2.0"), false),
            FakeFile::new("README.md", text("# gpt-oss-20b"), false),
            FakeFile::new("USAGE_POLICY", text("policy"), false),
            FakeFile::new("chat_template.jinja", text("{{ messages }}"), false),
            FakeFile::new("config.json", config, false),
            FakeFile::new(
                "generation_config.json",
                text(r#"{"eos_token_id":[200002,199999,200012]}"#),
                false,
            ),
            FakeFile::new("metal/model.bin", noise(4000, 7), true),
            FakeFile::new(
                "model-00000-of-00002.safetensors",
                tiny_safetensors("model.embed_tokens.weight", 1000),
                true,
            ),
            FakeFile::new(
                "model-00001-of-00002.safetensors",
                tiny_safetensors("model.layers.0.mlp.experts.down_proj_blocks", 1000),
                true,
            ),
            FakeFile::new(
                "model-00002-of-00002.safetensors",
                tiny_safetensors("lm_head.weight", 1000),
                true,
            ),
            FakeFile::new("model.safetensors.index.json", text(index), false),
            FakeFile::new("original/config.json", text("{}"), false),
            FakeFile::new("original/dtypes.json", text("{}"), false),
            FakeFile::new("original/model.safetensors", noise(3000, 8), true),
            FakeFile::new("special_tokens_map.json", text("{}"), false),
            FakeFile::new("tokenizer.json", text("{}"), false),
            FakeFile::new("tokenizer_config.json", text("{}"), false),
        ],
    );
    let server = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&server.url), &["download", "openai/gpt-oss-20b"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let snap = snapshot(cache.path(), &repo);
    let mut got: Vec<String> = std::fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model-00000-of-00002.safetensors",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    );
    let fetched: Vec<String> = server.content_gets().into_iter().map(|l| l.path).collect();
    for skipped in ["metal/model.bin", "original/model.safetensors"] {
        let sha = repo.file(skipped).sha256();
        assert!(!fetched.iter().any(|p| p.ends_with(&sha)), "{skipped} was downloaded");
    }

    let list = inferno(cache.path(), None, &["list", "--json"], &[]);
    assert!(list.status.success(), "{}", stderr(&list));
    let rows: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["model"], "openai/gpt-oss-20b");
    assert_eq!(row["architecture"], "gpt_oss", "{row}");
    assert_eq!(row["format"], "mxfp4", "{row}");
    assert_eq!(row["context_length"], 131072, "{row}");
}
