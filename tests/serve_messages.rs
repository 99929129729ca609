//! `inferno serve`'s Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`)
//! driven by real clients on 127.0.0.1: the `anthropic` Python SDK (tests/python/
//! messages_client.py) against SmolLM2-135M (greedy text identical to the chat completion's,
//! streaming, stop sequences, usage and cache reads, count_tokens, every bad field a 400 naming
//! it, API keys) and against the tiny gpt-oss (thinking and tool_use blocks, the tool loop,
//! effort on the Reasoning line), and Claude Code itself (`claude -p`) completing a turn.
//! Needs scripts/test.sh's venv (INFERNO_PYTHON) and Claude Code (INFERNO_CLAUDE).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::serve::Server;
use serde_json::{Value, json};

fn smollm2() -> PathBuf {
    common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

fn smollm2_server(args: &[&str]) -> Server {
    let mut all = vec!["--context", "1024", "--kv-tokens", "8192"];
    all.extend_from_slice(args);
    Server::start(&smollm2(), &all, &[])
}

fn gpt_oss_server(context: &str, env: &[(&str, &str)]) -> Server {
    let args = ["--dtype", "f32", "--context", context, "--kv-tokens", context];
    Server::start(&common::tiny_gpt_oss_full_vocab(), &args, env)
}

/// Runs a scenario of tests/python/messages_client.py against `s`; its JSON result.
fn client(s: &Server, scenario: &str, args: Value) -> Value {
    s.python_script("messages_client.py", scenario, args)
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn smollm2_greedy_text_is_the_chat_completions() {
    let s = smollm2_server(&[]);
    let r = client(&s, "smollm2", json!({"prompt": "Name three colors.", "max_tokens": 24}));
    assert_eq!(r["text"], r["chat"], "{r}");
    assert!(r["text"].as_str().is_some_and(|t| t.len() > 10), "{r}");
    // Structured outputs: the scenario validates each reply against its schema.
    let r = client(&s, "structured", json!({}));
    assert!(r["json"].as_str().is_some_and(|t| t.starts_with('{')), "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn bad_fields_are_400s_naming_them_and_unknown_ones_are_ignored() {
    let s = smollm2_server(&[]);
    let r = client(&s, "errors", json!({}));
    assert!(r["messages"].as_array().is_some_and(|m| m.len() > 20), "{r}");
    // Raw bodies a confused client sends: Anthropic's error shape, never a 500.
    for (path, body) in [
        ("/v1/messages", ""),
        ("/v1/messages", "[]"),
        ("/v1/messages", "{\"model\": 5}"),
        ("/v1/messages/count_tokens", "{}"),
        ("/v1/messages/count_tokens", "{\"messages\": [{\"role\": \"user\"}]}"),
    ] {
        let (status, text) = s.request("POST", path, &[], body.as_bytes());
        assert_eq!(status, 400, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    // The OpenAI paths keep OpenAI's shape.
    let (status, text) = s.request("POST", "/v1/chat/completions", &[], b"{}");
    assert_eq!(status, 400);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["error"]["message"].is_string() && v.get("type").is_none(), "{v}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn x_api_key_and_bearer_are_both_accepted() {
    let s = smollm2_server(&["--api-key", "sk-test-123"]);
    client(&s, "api_key", json!({"api_key": "sk-test-123"}));
    let (status, text) = s.request("POST", "/v1/messages", &[("x-api-key", "nope")], b"{}");
    assert_eq!(status, 401, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error"]["type"],
        "authentication_error"
    );
    let (status, text) = s.request("POST", "/v1/chat/completions", &[("x-api-key", "nope")], b"{}");
    assert_eq!(status, 401, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "invalid_api_key");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn gpt_oss_thinking_tool_use_and_the_tool_loop() {
    let s = gpt_oss_server("2048", &[("INFERNO_TEST_HOOKS", "1")]);
    let r = client(&s, "gpt_oss_tools", json!({}));
    assert!(r["call_id"].as_str().is_some_and(|id| id.starts_with("toolu_")), "{r}");
}

/// Claude Code's native binary: INFERNO_CLAUDE, set by scripts/test.sh.
fn claude() -> PathBuf {
    let path = std::env::var("INFERNO_CLAUDE").unwrap_or_default();
    assert!(
        Path::new(&path).is_file(),
        "INFERNO_CLAUDE={path:?} is not Claude Code's binary: run scripts/test.sh (it installs @anthropic-ai/claude-code)"
    );
    PathBuf::from(path)
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Claude Code and the gpt-oss tokenizer: scripts/test.sh"
)]
fn claude_code_completes_a_turn() {
    let claude = claude();
    let home = tempfile::tempdir().unwrap();
    let answer = "Hello from inferno!";
    let replies = home.path().join("replies.json");
    let forced = format!(
        "<|channel|>analysis<|message|>Greet.<|end|><|start|>assistant<|channel|>final<|message|>{answer}<|return|>"
    );
    std::fs::write(&replies, json!(vec![forced; 16]).to_string()).unwrap();
    let key = "sk-claude-test";
    let env = [("INFERNO_TEST_HOOKS", "1"), ("INFERNO_TEST_REPLIES", replies.to_str().unwrap())];
    let model = common::tiny_gpt_oss_full_vocab();
    let s = Server::start(
        &model,
        &["--dtype", "f32", "--context", "16384", "--kv-tokens", "16384", "--api-key", key],
        &env,
    );
    let name = model.file_name().unwrap().to_str().unwrap().to_string();
    let mut cmd = Command::new(claude);
    cmd.args(["-p", "Say hello"]).env_clear().current_dir(home.path());
    for var in ["PATH", "LANG", "SSL_CERT_FILE"] {
        if let Ok(v) = std::env::var(var) {
            cmd.env(var, v);
        }
    }
    cmd.env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", s.url())
        .env("ANTHROPIC_API_KEY", key)
        // Only 127.0.0.1: no telemetry, error reports, update checks or other traffic.
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("API_TIMEOUT_MS", "600000");
    for slot in [
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ] {
        cmd.env(slot, &name);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn claude");
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // Its ~10k-token prompt takes the CPU one to three minutes (more on a busy machine).
        if t0.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            panic!("claude -p still running after 600 s:\n{}", s.log());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let log = s.log();
    assert!(
        status.success(),
        "claude -p failed ({status}):\n{stdout}\n{stderr}\n--- server ---\n{log}"
    );
    assert_eq!(stdout.trim(), answer, "{stderr}\n--- server ---\n{log}");
    assert!(log.contains("/v1/messages 200 stop (stream)"), "{log}");
    // What Claude Code asked for (prompt size, cache hits), for `--nocapture` readers.
    log.lines().filter(|l| l.contains("/v1/messages")).for_each(|l| eprintln!("{l}"));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_stream_cut_by_shutdown_ends_with_an_error_event() {
    use std::io::{BufRead, BufReader, Write};
    let mut s = smollm2_server(&[]);
    let body = json!({"model": "", "max_tokens": 900, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": "Count from 1 to 500, one number per line."}]})
    .to_string();
    let mut tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        tcp,
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(tcp).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("text_delta")) {
        seen.push(rx.recv_timeout(Duration::from_secs(120)).expect("no text delta came"));
    }
    assert!(s.interrupt(Duration::from_secs(30)).success());
    seen.extend(rx.iter());
    let text = seen.join("\n");
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains(r#""type":"overloaded_error""#), "{text}");
    assert!(!text.contains("message_stop"), "{text}");
}
