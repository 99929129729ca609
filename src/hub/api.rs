//! The parts of the Hugging Face Hub HTTP protocol that downloading needs.
//!
//! Written on `ureq` rather than the `hf-hub` crate because we need things hf-hub does not
//! expose: the Hub's error codes (`X-Error-Code`: repo vs revision not found, gated) mapped to
//! distinct exit codes, the LFS sha256 of every file before downloading it (for verification and
//! `--dry-run` sizes), HTTP Range resumption of our own `.incomplete` files with retry policy,
//! and `HF_HUB_OFFLINE`.
//!
//! Endpoints used:
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`: commit sha and the file list
//!   with sizes, git blob ids and LFS sha256s.
//! - `GET {endpoint}/{repo}/resolve/{commit}/{file}`: the content; LFS files answer with a
//!   redirect to a CDN, which we follow by hand (without the token when it changes host).

use std::io::Read;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use super::names::RepoId;
use crate::error::{ErrorKind, fail};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Settings read from the environment, as huggingface_hub reads them.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
}

impl HubConfig {
    pub fn from_env() -> HubConfig {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")).or_else(token_file);
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| is_truthy(&v));
        HubConfig { endpoint: endpoint.trim_end_matches('/').to_string(), token, offline }
    }
}

/// The token `hf auth login` saved, at `$HF_TOKEN_PATH` or `$HF_HOME/token`.
fn token_file() -> Option<String> {
    let path = std::env::var_os("HF_TOKEN_PATH").map(std::path::PathBuf::from).or_else(|| {
        let home = std::env::var_os("HF_HOME").map(std::path::PathBuf::from).or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/huggingface"))
        })?;
        Some(home.join("token"))
    })?;
    let token = std::fs::read_to_string(path).ok()?;
    Some(token.trim().to_string()).filter(|t| !t.is_empty())
}

fn is_truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
}

/// `GET /api/models/{repo}/revision/{rev}` response (the fields we use).
#[derive(Debug, Clone, Deserialize)]
pub struct RepoInfo {
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    pub size: Option<u64>,
    #[serde(rename = "blobId")]
    pub blob_id: Option<String>,
    pub lfs: Option<LfsInfo>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LfsInfo {
    pub sha256: String,
    pub size: u64,
}

/// A response body positioned at `offset` of the file, with its total length.
pub struct FileStream {
    /// Where the body starts in the file: the requested offset for a 206, 0 for a 200.
    pub start: u64,
    pub reader: Box<dyn Read + Send>,
}

pub struct HubClient {
    config: HubConfig,
    agent: ureq::Agent,
}

/// HTTP failures that are worth retrying (connection trouble, 5xx, 429).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Transient(pub String);

impl HubClient {
    pub fn new(config: HubConfig) -> HubClient {
        let agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .user_agent(concat!("inferno/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        HubClient { config, agent }
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The commit a revision points to and its files.
    pub fn repo_info(&self, repo: &RepoId, revision: &str) -> anyhow::Result<RepoInfo> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.config.endpoint,
            repo,
            encode_component(revision)
        );
        let mut resp = self.send(&url, None, repo, revision)?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| Transient(format!("reading the file list of {repo}: {e}")))?;
        let info: RepoInfo = serde_json::from_str(&body)
            .with_context(|| format!("the Hub sent an unreadable file list for {repo}"))?;
        if !super::names::is_commit_hash(&info.sha) {
            return Err(fail(
                ErrorKind::Integrity,
                format!("the Hub sent an invalid commit id {:?}", info.sha),
            ));
        }
        Ok(info)
    }

    /// Opens `file` at `commit`, from byte `offset` (HTTP Range) when `offset > 0`.
    pub fn open_file(
        &self,
        repo: &RepoId,
        commit: &str,
        file: &str,
        offset: u64,
    ) -> anyhow::Result<FileStream> {
        let url =
            format!("{}/{}/resolve/{}/{}", self.config.endpoint, repo, commit, encode_path(file));
        let range = (offset > 0).then(|| format!("bytes={offset}-"));
        let resp = self.send(&url, range.as_deref(), repo, commit)?;
        let status = resp.status().as_u16();
        let start = if status == 206 { content_range_start(&resp).unwrap_or(u64::MAX) } else { 0 };
        if status == 206 && start != offset {
            return Err(Transient(format!("server resumed {file} at the wrong offset")).into());
        }
        Ok(FileStream { start, reader: Box::new(resp.into_body().into_reader()) })
    }

    /// Reads a small file (an index) into memory.
    pub fn read_small(&self, repo: &RepoId, commit: &str, file: &str) -> anyhow::Result<Vec<u8>> {
        let mut stream = self.open_file(repo, commit, file, 0)?;
        let mut buf = Vec::new();
        stream
            .reader
            .by_ref()
            .take(64 << 20)
            .read_to_end(&mut buf)
            .map_err(|e| Transient(format!("reading {file}: {e}")))?;
        Ok(buf)
    }

    /// GET with redirects followed by hand; maps error statuses to user-facing failures.
    fn send(
        &self,
        url: &str,
        range: Option<&str>,
        repo: &RepoId,
        revision: &str,
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut url = url.to_string();
        let origin = origin_of(&url).to_string();
        for _ in 0..10 {
            let mut req = self.agent.get(&url);
            if let Some(r) = range {
                req = req.header("Range", r);
            }
            // The token goes only to the Hub itself, never to the CDN it redirects to.
            if let (Some(token), true) = (&self.config.token, origin_of(&url) == origin) {
                req = req.header("Authorization", &format!("Bearer {token}"));
            }
            let resp = req.call().map_err(|e| self.transport_error(e))?;
            let status = resp.status().as_u16();
            if (300..400).contains(&status) {
                let location =
                    resp.headers().get("location").and_then(|v| v.to_str().ok()).ok_or_else(
                        || Transient(format!("redirect without a location from {url}")),
                    )?;
                url = join_url(&url, location);
                continue;
            }
            if status < 300 {
                return Ok(resp);
            }
            return Err(self.status_error(status, &resp, repo, revision, &url));
        }
        Err(Transient(format!("too many redirects for {url}")).into())
    }

    fn transport_error(&self, err: ureq::Error) -> anyhow::Error {
        match err {
            ureq::Error::Io(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Timeout(_) => {
                Transient(format!("cannot reach {}: {err}", self.config.endpoint)).into()
            }
            other => {
                Transient(format!("request to {} failed: {other}", self.config.endpoint)).into()
            }
        }
    }

    fn status_error(
        &self,
        status: u16,
        resp: &ureq::http::Response<ureq::Body>,
        repo: &RepoId,
        revision: &str,
        url: &str,
    ) -> anyhow::Error {
        let code = resp.headers().get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("");
        let has_token = self.config.token.is_some();
        match (status, code) {
            (_, "RepoNotFound") | (404, _)
                if code != "RevisionNotFound" && code != "EntryNotFound" =>
            {
                let hint = if has_token { "" } else { " (if it is private, set HF_TOKEN)" };
                fail(ErrorKind::NotFound, format!("repository {repo} not found on the Hub{hint}"))
            }
            (_, "RevisionNotFound") => {
                fail(ErrorKind::NotFound, format!("revision {revision:?} not found in {repo}"))
            }
            (_, "EntryNotFound") => {
                fail(ErrorKind::NotFound, format!("file not found in {repo}: {url}"))
            }
            (401 | 403, _) | (_, "GatedRepo") => {
                let msg = if has_token {
                    format!(
                        "access to {repo} denied: your HF_TOKEN has no access (for a gated repo, accept its terms on the Hub first)"
                    )
                } else {
                    format!(
                        "{repo} is gated or private: set HF_TOKEN to a Hugging Face access token that has access"
                    )
                };
                fail(ErrorKind::Unauthorized, msg)
            }
            (429 | 500..=599, _) => {
                Transient(format!("the Hub answered HTTP {status} for {url}")).into()
            }
            _ => fail(ErrorKind::Other, format!("the Hub answered HTTP {status} for {url}")),
        }
    }
}

fn content_range_start(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    // "bytes 100-199/200"
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    v.strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// `scheme://host[:port]` of a URL.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// Resolves a redirect target against the URL it came from.
fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if location.starts_with('/') {
        format!("{}{}", origin_of(base), location)
    } else {
        let dir = base.rsplit_once('/').map(|(d, _)| d).unwrap_or(base);
        format!("{dir}/{location}")
    }
}

/// Percent-encodes one path component (a revision like `refs/pr/1` included).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes each component of a repo-relative path, keeping the slashes.
pub fn encode_path(path: &str) -> String {
    path.split('/').map(encode_component).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(origin_of("http://127.0.0.1:8080/a/b"), "http://127.0.0.1:8080");
        assert_eq!(join_url("http://h:1/a/b", "/cdn/x?y=1"), "http://h:1/cdn/x?y=1");
        assert_eq!(join_url("http://h:1/a/b", "https://cdn/x"), "https://cdn/x");
        assert_eq!(join_url("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(encode_component("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode_path("original/model 1.safetensors"), "original/model%201.safetensors");
    }

    #[test]
    fn truthy() {
        assert!(is_truthy("1") && is_truthy("TRUE") && is_truthy("yes"));
        assert!(!is_truthy("0") && !is_truthy("false"));
    }
}
