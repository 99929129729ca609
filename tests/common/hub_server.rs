//! A Hugging Face Hub stand-in on 127.0.0.1 for download tests.
//!
//! It speaks the parts of the protocol that inferno and huggingface_hub use:
//! - `GET /api/models/{repo}/revision/{rev}?blobs=true`: commit sha and siblings with sizes,
//!   git blob ids and LFS sha256s;
//! - `GET|HEAD /{repo}/resolve/{rev}/{file}`: non-LFS files directly (ETag = git blob sha1), LFS
//!   files as a 302 to `/cdn/{sha256}` with `X-Linked-Etag` / `X-Linked-Size`, every answer with
//!   `X-Repo-Commit`; `Range: bytes=N-` gives 206;
//! - errors with the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound,
//!   GatedRepo) and statuses 401/403/404.
//!
//! Faults for tests: cut a file's body after N bytes (the next K times), serve corrupted bytes,
//! ignore Range. Every request is logged for assertions.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha1::Sha1;
use sha2::{Digest, Sha256};

pub const GOOD_TOKEN: &str = "hf_good_token";

#[derive(Clone, Debug)]
pub struct FakeFile {
    pub path: String,
    pub data: Vec<u8>,
    pub lfs: bool,
}

impl FakeFile {
    pub fn new(path: &str, data: impl Into<Vec<u8>>, lfs: bool) -> FakeFile {
        FakeFile { path: path.to_string(), data: data.into(), lfs }
    }
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(&self.data))
    }
    pub fn git_sha1(&self) -> String {
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", self.data.len()).as_bytes());
        h.update(&self.data);
        hex::encode(h.finalize())
    }
    /// The blob name huggingface_hub and inferno store it under.
    pub fn etag(&self) -> String {
        if self.lfs { self.sha256() } else { self.git_sha1() }
    }
}

#[derive(Clone, Debug)]
pub struct FakeRepo {
    pub id: String,
    pub commit: String,
    pub files: Vec<FakeFile>,
    pub gated: bool,
}

impl FakeRepo {
    pub fn new(id: &str, files: Vec<FakeFile>) -> FakeRepo {
        let commit = hex::encode(Sha1::digest(id.as_bytes()));
        FakeRepo { id: id.to_string(), commit, files, gated: false }
    }
    pub fn file(&self, path: &str) -> &FakeFile {
        self.files.iter().find(|f| f.path == path).expect("no such fake file")
    }
}

#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

#[derive(Default)]
struct Faults {
    /// file path -> (bytes to send before cutting, how many more times)
    cut: HashMap<String, (usize, usize)>,
    corrupt: Vec<String>,
    /// Extra siblings (unsafe names) added to listings.
    extra_siblings: Vec<String>,
}

#[derive(Default)]
struct State {
    repos: Vec<FakeRepo>,
    log: Vec<Logged>,
    faults: Faults,
}

pub struct HubServer {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl HubServer {
    pub fn start(repos: Vec<FakeRepo>) -> HubServer {
        let state = Arc::new(Mutex::new(State { repos, ..Default::default() }));
        // LFS content is served from a second port: another origin, like the Hub's CDN, so
        // tests can check that the token is not sent there.
        let cdn = listen(state.clone(), None);
        let url = listen(state.clone(), Some(cdn));
        HubServer { url, state }
    }

    /// Cut the body of `path` after `after` bytes, the next `times` times it is served.
    pub fn cut(&self, path: &str, after: usize, times: usize) {
        self.state.lock().unwrap().faults.cut.insert(path.to_string(), (after, times));
    }

    /// Serve `path` with a flipped byte (same length).
    pub fn corrupt(&self, path: &str) {
        self.state.lock().unwrap().faults.corrupt.push(path.to_string());
    }

    pub fn add_sibling_name(&self, name: &str) {
        self.state.lock().unwrap().faults.extra_siblings.push(name.to_string());
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// GET requests for file contents (resolve of non-LFS files, or the CDN).
    pub fn content_gets(&self) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|l| l.method == "GET" && !l.path.starts_with("/api/"))
            .collect()
    }
}

/// Serves on a fresh 127.0.0.1 port; returns its base URL. `cdn` is where LFS redirects point.
fn listen(state: Arc<Mutex<State>>, cdn: Option<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let cdn = cdn.unwrap_or_else(|| url.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let st = state.clone();
            let cdn = cdn.clone();
            std::thread::spawn(move || {
                let _ = handle(conn, &st, &cdn);
            });
        }
    });
    url
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many body bytes, then drop the connection.
    cut_at: Option<usize>,
}

impl Reply {
    fn new(status: u16) -> Reply {
        Reply { status, headers: vec![], body: vec![], cut_at: None }
    }
    fn header(mut self, k: &str, v: impl Into<String>) -> Reply {
        self.headers.push((k.to_string(), v.into()));
        self
    }
    fn error(status: u16, code: &str) -> Reply {
        let body = format!("{{\"error\":\"{code}\"}}").into_bytes();
        Reply { status, headers: vec![("X-Error-Code".into(), code.into())], body, cut_at: None }
    }
}

fn handle(conn: TcpStream, state: &Mutex<State>, cdn: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let logged = Logged {
        method: method.clone(),
        path: path.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    };
    let reply = {
        let mut st = state.lock().unwrap();
        st.log.push(logged.clone());
        route(&mut st, &logged, cdn)
    };
    write_reply(conn, &method, reply)
}

fn route(st: &mut State, req: &Logged, cdn: &str) -> Reply {
    let path = percent_decode(&req.path);
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return Reply::error(404, "EntryNotFound");
        };
        return match find_repo(st, repo, req) {
            Ok(r) => api_info(&r, rev, &st.faults.extra_siblings),
            Err(e) => e,
        };
    }
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let file = st
            .repos
            .iter()
            .flat_map(|r| r.files.iter())
            .find(|f| f.lfs && f.sha256() == sha)
            .cloned();
        return match file {
            Some(f) => serve_bytes(st, &f, req, Reply::new(200)),
            None => Reply::error(404, "EntryNotFound"),
        };
    }
    if let Some((repo, rest)) = path[1..].split_once("/resolve/") {
        let repo = match find_repo(st, repo, req) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let Some((rev, file)) = rest.split_once('/') else {
            return Reply::error(404, "EntryNotFound");
        };
        if rev != "main" && rev != repo.commit {
            return Reply::error(404, "RevisionNotFound");
        }
        let Some(f) = repo.files.iter().find(|f| f.path == file).cloned() else {
            return Reply::error(404, "EntryNotFound").header("X-Repo-Commit", repo.commit.clone());
        };
        if f.lfs {
            return Reply::new(302)
                .header("Location", format!("{cdn}/cdn/{}", f.sha256()))
                .header("X-Repo-Commit", repo.commit.clone())
                .header("X-Linked-Etag", format!("\"{}\"", f.sha256()))
                .header("X-Linked-Size", f.data.len().to_string())
                .header("ETag", format!("\"{}\"", f.git_sha1()));
        }
        let head = Reply::new(200)
            .header("X-Repo-Commit", repo.commit.clone())
            .header("ETag", format!("\"{}\"", f.git_sha1()));
        return serve_bytes(st, &f, req, head);
    }
    Reply::error(404, "EntryNotFound")
}

fn find_repo(st: &State, id: &str, req: &Logged) -> Result<FakeRepo, Reply> {
    let Some(repo) = st.repos.iter().find(|r| r.id == id) else {
        // Like the real Hub for anonymous callers: 401 + RepoNotFound.
        return Err(Reply::error(401, "RepoNotFound"));
    };
    if repo.gated {
        match req.auth.as_deref() {
            None => return Err(Reply::error(401, "GatedRepo")),
            Some(a) if a != format!("Bearer {GOOD_TOKEN}") => {
                return Err(Reply::error(403, "GatedRepo"));
            }
            _ => {}
        }
    }
    Ok(repo.clone())
}

fn api_info(repo: &FakeRepo, rev: &str, extra: &[String]) -> Reply {
    if rev != "main" && rev != repo.commit {
        return Reply::error(404, "RevisionNotFound");
    }
    let mut siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|f| {
            let mut v = serde_json::json!({"rfilename": f.path, "size": f.data.len(), "blobId": f.git_sha1()});
            if f.lfs {
                v["lfs"] = serde_json::json!({"sha256": f.sha256(), "size": f.data.len(), "pointerSize": 134});
            }
            v
        })
        .collect();
    for name in extra {
        siblings.push(serde_json::json!({"rfilename": name, "size": 1, "blobId": "0".repeat(40)}));
    }
    let body = serde_json::json!({"id": repo.id, "modelId": repo.id, "sha": repo.commit, "private": false, "siblings": siblings});
    let mut r = Reply::new(200).header("Content-Type", "application/json");
    r.body = body.to_string().into_bytes();
    r
}

fn serve_bytes(st: &mut State, f: &FakeFile, req: &Logged, mut reply: Reply) -> Reply {
    let mut data = f.data.clone();
    if st.faults.corrupt.contains(&f.path) && !data.is_empty() {
        data[0] ^= 0xff;
    }
    let total = data.len();
    let mut start = 0;
    if let Some(r) = req.range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        let from: usize = r.split('-').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if from >= total && total > 0 {
            return Reply::new(416).header("Content-Range", format!("bytes */{total}"));
        }
        start = from;
        reply.status = 206;
        reply = reply
            .header("Content-Range", format!("bytes {from}-{}/{total}", total.saturating_sub(1)));
    }
    reply.body = data[start..].to_vec();
    if req.method == "GET"
        && let Some((after, times)) = st.faults.cut.get_mut(&f.path)
        && *times > 0
    {
        *times -= 1;
        reply.cut_at = Some((*after).min(reply.body.len()));
    }
    reply.header("Accept-Ranges", "bytes")
}

fn write_reply(mut conn: TcpStream, method: &str, reply: Reply) -> std::io::Result<()> {
    let reason = match reply.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", reply.body.len()));
    conn.write_all(head.as_bytes())?;
    if method != "HEAD" {
        let n = reply.cut_at.unwrap_or(reply.body.len());
        conn.write_all(&reply.body[..n])?;
    }
    conn.flush()?;
    // Dropping the stream closes it; after a cut the client sees an early EOF.
    Ok(())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
