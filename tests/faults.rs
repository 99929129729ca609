//! Faults without a GPU. `serve` SIGKILLed while it loads and while it streams, then started
//! again on the same HF cache: the cache and the downloaded files are intact and the new
//! process serves at once. A download stopped by a full disk (a file-size limit on the
//! process: RLIMIT_FSIZE, as `ulimit -f` sets, with SIGXFSZ ignored so writes fail with EFBIG,
//! or left to kill it): no half-written file is visible as complete, and a later download
//! resumes from where the partial file ends. Against the local Hub stand-in on 127.0.0.1.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::hub_server::{FakeFile, FakeRepo, HubServer};
use common::serve::Server;
use common::{inferno, noise, stderr};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn smol_repo() -> FakeRepo {
    let data = std::fs::read(common::asset(GGUF, "scripts/assets/smollm2-gguf.sh")).unwrap();
    FakeRepo::new("org/smol-gguf", vec![FakeFile::new(GGUF, data, true)])
}

fn repo_dir(cache: &Path, repo: &FakeRepo) -> PathBuf {
    cache.join(format!("models--{}", repo.id.replace('/', "--")))
}

/// Every file of the snapshot reads back as the Hub's bytes, and no partial file is left.
fn assert_cache_intact(cache: &Path, repo: &FakeRepo) {
    let dir = repo_dir(cache, repo);
    for f in &repo.files {
        let got = std::fs::read(dir.join("snapshots").join(&repo.commit).join(&f.path))
            .unwrap_or_else(|e| panic!("{}: {e}", f.path));
        assert!(got == f.data, "{} differs from the Hub's", f.path);
    }
    let partial: Vec<_> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(partial.is_empty(), "partial files left: {partial:?}");
}

fn serve_env(cache: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HF_HUB_CACHE", cache.display().to_string()),
        ("HF_HUB_OFFLINE", "1".to_string()),
        ("HF_TOKEN_PATH", cache.join("no-token").display().to_string()),
    ]
}

fn chat(addr: &str) -> (u16, String) {
    let body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}"#;
    common::serve::post(addr, "/v1/chat/completions", body)
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn serve_killed_while_loading_and_while_streaming_restarts_on_an_intact_cache() {
    let repo = smol_repo();
    let hub = HubServer::start(vec![repo.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let out = inferno(cache.path(), Some(&hub.url), &["download", &repo.id], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env = serve_env(cache.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // SIGKILL while loading: as soon as it listens (the model loads after).
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", &repo.id, "--cpu", "--port", "0", "--context", "256"])
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("loading"), "{first}");
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_cache_intact(cache.path(), &repo);

    // SIGKILL with streams open (Drop kills with SIGKILL).
    let s = Server::start(Path::new(&repo.id), &["--context", "256"], &env);
    let body = r#"{"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200, "stream": true}"#;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut c = common::serve::send_post(&s.addr, "/v1/chat/completions", body);
        let mut buf = [0u8; 512];
        assert!(c.read(&mut buf).unwrap() > 0);
        streams.push(c);
    }
    drop(s);
    assert_cache_intact(cache.path(), &repo);

    // Started again, it serves at once: ready as fast as a first start, and answers.
    let t0 = Instant::now();
    let s = Server::start(Path::new(&repo.id), &["--context", "256"], &env);
    let ready = t0.elapsed();
    assert!(ready < Duration::from_secs(30), "ready after {ready:?}");
    let (status, answer) = chat(&s.addr);
    assert_eq!(status, 200, "{answer}");
    drop(s);
    assert_cache_intact(cache.path(), &repo);
}

/// `inferno download REPO` with files limited to `limit` bytes (RLIMIT_FSIZE); with
/// `ignore_sigxfsz`, a write past it fails (EFBIG) instead of killing the process.
fn download_limited(
    cache: &Path,
    hub: &str,
    repo: &str,
    limit: u64,
    ignore_sigxfsz: bool,
) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferno"));
    cmd.args(["download", repo])
        .env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", hub)
        .env("HF_TOKEN_PATH", cache.join("no-token"))
        .env_remove("HF_TOKEN")
        .env("INFERNO_RETRY_DELAY_MS", "20");
    // SAFETY: setrlimit and signal are async-signal-safe, called in the child before exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if ignore_sigxfsz {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

#[test]
fn a_full_disk_leaves_no_complete_looking_file_and_the_next_download_resumes() {
    let big = "model.safetensors";
    let repo = FakeRepo::new(
        "org/full-disk",
        vec![
            FakeFile::new("config.json", br#"{"model_type":"llama"}"#.to_vec(), false),
            FakeFile::new(big, noise(400_000, 7), true),
        ],
    );
    let hub = HubServer::start(vec![repo.clone()]);
    let sha = repo.file(big).sha256();
    for ignore_sigxfsz in [true, false] {
        let cache = tempfile::tempdir().unwrap();
        let out = download_limited(cache.path(), &hub.url, &repo.id, 150_000, ignore_sigxfsz);
        assert!(!out.status.success());
        if ignore_sigxfsz {
            // A one-line storage error, exit code 7.
            assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
            let err = stderr(&out);
            let last = err.lines().last().unwrap_or_default();
            assert!(last.starts_with("error:") && last.contains("too large"), "{err}");
        } else {
            assert_eq!(out.status.signal(), Some(libc::SIGXFSZ), "{}", stderr(&out));
        }
        let dir = repo_dir(cache.path(), &repo);
        let blobs = dir.join("blobs");
        assert!(!blobs.join(&sha).exists(), "a half-written blob has its final name");
        let partial = blobs.join(format!("{sha}.incomplete"));
        let have = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
        assert!(have <= 150_000, "{have}");
        let link = dir.join("snapshots").join(&repo.commit).join(big);
        assert!(!link.exists(), "the snapshot links a file that is not complete");

        hub.clear_log();
        let out = inferno(cache.path(), Some(&hub.url), &["download", &repo.id], &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let ranges: Vec<Option<String>> = hub
            .content_gets()
            .into_iter()
            .filter(|l| l.path.ends_with(&sha))
            .map(|l| l.range)
            .collect();
        let want = if have > 0 { Some(format!("bytes={have}-")) } else { None };
        assert_eq!(ranges, vec![want], "resumed from the partial file");
        assert_cache_intact(cache.path(), &repo);
    }
}
