//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod hub_server;

use std::path::Path;
use std::process::{Command, Output};

/// Runs the real `inferno` binary with a clean HF environment pointing at `cache`.
pub fn inferno(
    cache: &Path,
    endpoint: Option<&str>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferno"));
    cmd.args(args)
        .env_remove("HF_HOME")
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("XDG_CACHE_HOME")
        .env("HF_TOKEN_PATH", cache.join("no-token-file"))
        .env("HF_HUB_CACHE", cache)
        .env("INFERNO_RETRY_DELAY_MS", "20");
    match endpoint {
        Some(e) => cmd.env("HF_ENDPOINT", e),
        // Nothing listens on port 9 of the loopback: any request fails fast.
        None => cmd.env("HF_ENDPOINT", "http://127.0.0.1:9"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running inferno")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A test asset (real model files fetched by a script): `$INFERNO_ASSETS/name`, else
/// `${INFERNO_CACHE:-~/.cache/inferno}/assets/name`. Panics with how to fetch it when absent:
/// tests that need real weights never pass without them.
pub fn asset(name: &str, script: &str) -> std::path::PathBuf {
    let dir =
        std::env::var_os("INFERNO_ASSETS").map(std::path::PathBuf::from).unwrap_or_else(|| {
            let cache = std::env::var_os("INFERNO_CACHE")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/inferno")
                });
            cache.join("assets")
        });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "test asset {} is missing: run `bash {script}` (scripts/test.sh does)",
        path.display()
    );
    path
}
