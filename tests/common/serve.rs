//! `inferno serve` as a test starts it: the real binary on 127.0.0.1 with a port the OS picks
//! (read back from its banner), waited for until `/health` says 200, killed when dropped; a
//! tiny HTTP/1.1 client for the checks that need no SDK; and the `openai` Python client
//! (tests/python/serve_client.py) for the rest.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
    log: Arc<Mutex<String>>,
    /// `/health` answered 503 before it answered 200 (the model was loading).
    pub saw_loading: bool,
    last_head: Mutex<String>,
}

impl Server {
    /// Starts `inferno serve MODEL --cpu --port 0 ARGS` with `env`, and waits until it is ready.
    pub fn start(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::launch(model, &["--cpu"], args, env)
    }

    /// [`Server::start`] on GPU 0.
    pub fn start_gpu(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::launch(model, &[], args, env)
    }

    fn launch(model: &Path, device: &[&str], args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferno"));
        cmd.arg("serve").arg(model).args(device).args(["--port", "0"]).args(args);
        cmd.env_remove("INFERNO_API_KEY").env("INFERNO_LOG", "inferno=info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn inferno serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("inferno serve · http://") {
                    let addr = rest.split_whitespace().next().unwrap_or_default().to_string();
                    let _ = tx.send(addr);
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("inferno serve printed no address:\n{}", log.lock().unwrap());
            }
        };
        let mut server =
            Server { child, addr, log, saw_loading: false, last_head: Mutex::default() };
        let t0 = Instant::now();
        loop {
            match server.try_request("GET", "/health", &[], b"") {
                Some((200, _)) => break,
                Some((503, _)) => server.saw_loading = true,
                _ => {}
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("inferno serve exited ({status}) before it was ready:\n{}", server.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "not ready after 300 s:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the server wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// One request; `(status, body)`.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|| panic!("{method} {path} failed:\n{}", self.log()))
    }

    fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(600))).ok()?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).ok()?;
        s.write_all(body).ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        *self.last_head.lock().unwrap() = head.to_ascii_lowercase();
        Some((status, body.to_string()))
    }

    /// The status line and headers of the last answer (lowercased).
    pub fn last_head(&self) -> String {
        self.last_head.lock().unwrap().clone()
    }

    /// `/metrics` as `name{labels}` → value.
    pub fn metrics(&self, headers: &[(&str, &str)]) -> std::collections::HashMap<String, f64> {
        let (status, body) = self.request("GET", "/metrics", headers, b"");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    /// Runs a scenario of tests/python/serve_client.py against this server; its JSON result.
    pub fn python(&self, scenario: &str, args: serde_json::Value) -> serde_json::Value {
        self.python_script("serve_client.py", scenario, args)
    }

    /// [`Self::python`] with another script of tests/python (same arguments).
    pub fn python_script(
        &self,
        script: &str,
        scenario: &str,
        args: serde_json::Value,
    ) -> serde_json::Value {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python");
        self.script(python_command(), &Path::new(dir).join(script), scenario, args)
    }

    /// `PYTHON SCRIPT URL SCENARIO ARGS`: a scenario of a script against this server; the JSON
    /// it prints. A failure shows the script's stderr and the server's log.
    pub fn script(
        &self,
        mut python: Command,
        script: &Path,
        scenario: &str,
        args: serde_json::Value,
    ) -> serde_json::Value {
        let name = script.file_name().unwrap_or_default().to_string_lossy();
        let out = python
            .arg(script)
            .arg(self.url())
            .arg(scenario)
            .arg(args.to_string())
            .output()
            .expect("running python");
        assert!(
            out.status.success(),
            "{name} {scenario} failed:\n{}\n--- server log ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{name} {scenario} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Sends SIGINT (Ctrl+C) and waits for the exit, at most `limit`.
    pub fn interrupt(&mut self, limit: Duration) -> ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid, libc::SIGINT) };
        self.wait_exit(limit)
            .unwrap_or_else(|| panic!("still running {limit:?} after Ctrl+C:\n{}", self.log()))
    }

    /// The server's exit status once it exits, or `None` if it still runs after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            if t0.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `/metrics` until the engine is idle with every KV block free, or fails after `limit`.
    pub fn wait_drained(&self, limit: Duration) -> std::collections::HashMap<String, f64> {
        let t0 = Instant::now();
        loop {
            let m = self.metrics(&[]);
            let groups: Vec<&String> =
                m.keys().filter(|k| k.starts_with("inferno_kv_total_blocks{")).collect();
            let free = groups.iter().all(|k| {
                let free = k.replace("inferno_kv_total_blocks", "inferno_kv_free_blocks");
                m.get(&free) == m.get(*k)
            });
            if m["inferno_running_sequences"] == 0.0
                && m["inferno_waiting_sequences"] == 0.0
                && m["inferno_requests_in_flight"] == 0.0
                && !groups.is_empty()
                && free
            {
                return m;
            }
            assert!(t0.elapsed() < limit, "not drained after {limit:?}: {m:?}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `POST path` with the JSON `body` on a connection of its own, which the server closes
/// after its reply; the connection, to read the reply from.
pub fn send_post(addr: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    s
}

/// [`send_post`], its whole reply read (within 300 s): `(status, head and body)`.
pub fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = send_post(addr, path, body);
    s.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

/// The python with the `openai` package (scripts/test.sh makes it and sets INFERNO_PYTHON).
pub fn python_command() -> Command {
    python_with("INFERNO_PYTHON", "openai")
}

/// The python `var` names (else `python3`), which must import `module`: scripts/test.sh makes
/// the venvs and sets the variables.
pub fn python_with(var: &str, module: &str) -> Command {
    let py = std::env::var(var).unwrap_or_else(|_| "python3".to_string());
    let ok = Command::new(&py)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{py} cannot import {module}: run scripts/test.sh, or set {var} to a python that has it"
    );
    Command::new(py)
}

/// Bodies a fuzzer or a confused client sends: every one gets an answer (never a dropped
/// connection or a 500), and the server keeps serving.
pub fn odd_bodies_are_answered(s: &Server, extra: &[(&str, &str, u16)]) {
    let cases: Vec<(&str, &str, u16)> = vec![
        ("/v1/chat/completions", "", 400),
        ("/v1/chat/completions", "{}", 400),
        ("/v1/chat/completions", "null", 400),
        ("/v1/chat/completions", "[]", 400),
        ("/v1/chat/completions", r#""x""#, 400),
        ("/v1/chat/completions", r#"{"messages": null}"#, 400),
        ("/v1/chat/completions", r#"{"messages": [{}]}"#, 400),
        ("/v1/chat/completions", r#"{"messages": [{"role": "user"}], "max_tokens": 1}"#, 200),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
            400,
        ),
        ("/v1/chat/completions", r#"{"messages": [{"role": "user", "content": 5}]}"#, 400),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e309}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "seed": 1e20}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}"#,
            400,
        ),
        ("/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "\ud800"}]}"#, 400),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_k": 99999999999, "temperature": 1e30, "seed": -5, "max_tokens": 2}"#,
            200,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}"#,
            400,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "tools": "all"}"#,
            400,
        ),
        ("/v1/completions", r#"{"prompt": [-1]}"#, 400),
        ("/v1/completions", r#"{"prompt": [10000000000]}"#, 400),
        ("/v1/completions", r#"{"prompt": []}"#, 400),
        ("/v1/completions", r#"{"prompt": [[]]}"#, 400),
        ("/v1/completions", r#"{"prompt": ["a", "b"]}"#, 400),
        ("/v1/completions", r#"{"prompt": {"x": 1}}"#, 400),
        ("/v1/completions", r#"{"prompt": ""}"#, 400),
        ("/v1/completions", r#"{"prompt": [[1, 2]], "max_tokens": 1}"#, 200),
        ("/v1/completions", r#"{"prompt": "x", "logprobs": 30}"#, 400),
        ("/v1/completions", r#"{"prompt": "x", "logprobs": "3"}"#, 400),
        ("/v1/completions", r#"{"prompt": "x", "logprobs": 3, "max_tokens": 2}"#, 200),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 20, "max_tokens": 2, "frequency_penalty": -2, "presence_penalty": 2}"#,
            200,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}"#,
            400,
        ),
        ("/v1/completions", r#"{"prompt": "x", "echo": true}"#, 400),
    ];
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let mut all = cases;
    all.push(("/v1/chat/completions", &deep, 400));
    all.extend_from_slice(extra);
    for (path, body, want) in all {
        let (status, text) =
            s.request("POST", path, &[("Content-Type", "application/json")], body.as_bytes());
        assert_eq!(status, want, "{path} {body:.200}: {text}\n{}", s.log());
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{body:.100}: {e}: {text}"));
        if want != 200 {
            assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        }
    }
    assert_eq!(s.request("GET", "/health", &[], b"").0, 200);
}
