//! `inferno serve` (SmolLM2 on the CPU) under abuse: the JSON bodies of every endpoint edited
//! field by field (each answer below 500, a JSON error on 4xx), raw request bytes edited (an
//! answer below 500 or a closed connection), and the HTTP layer's attacks one by one: slowloris,
//! oversize heads, too many connections, half-closed sockets, clients vanishing mid-stream,
//! and what /metrics and /health reveal.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::run::{apply, apply_json, edits, fuzz, json_edits};
use crate::common::serve::Server;

fn model() -> PathBuf {
    crate::common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

/// A server with short timeouts, so the attacks that wait on them end quickly.
pub fn server(extra: &[&str]) -> Server {
    let mut args = vec!["--context", "256", "--max-seqs", "4"];
    if !extra.contains(&"--idle-timeout") {
        args.extend(["--idle-timeout", "2"]);
    }
    args.extend_from_slice(extra);
    Server::start(&model(), &args, &[])
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]})
}

/// A valid body for each endpoint, using most of its fields.
fn seeds() -> Vec<(&'static str, Value)> {
    let tool = json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": schema()}});
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "seed": 1, "stop": ["\n"], "logprobs": true, "top_logprobs": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}], "tools": [tool], "tool_choice": "auto", "max_completion_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "json please"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema(), "strict": true}}, "max_tokens": 8}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "Once upon", "max_tokens": 4, "logprobs": 2, "stop": "\n", "stream": false, "temperature": 0}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "instructions": "be brief", "max_output_tokens": 4, "tools": [{"type": "function", "name": "f", "parameters": schema()}], "text": {"format": {"type": "json_schema", "name": "x", "schema": schema()}}, "store": true}),
        ),
        (
            "/v1/responses",
            json!({"input": "hi", "max_output_tokens": 4, "stream": true, "previous_response_id": "resp_x"}),
        ),
        ("/v1/responses/input_tokens", json!({"input": "hi", "instructions": "x"})),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "be brief"}], "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [{"name": "f", "description": "d", "input_schema": schema()}], "tool_choice": {"type": "auto"}, "stream": true}),
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}], "thinking": {"type": "enabled", "budget_tokens": 1024}}),
        ),
        (
            "/v1/messages/count_tokens",
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s"}),
        ),
    ]
}

/// Keeps a generation short on the CPU: a reply limit above 8 (or none) becomes 8. Values of
/// other types stay, for the validation to see.
fn clamp(path: &str, body: &mut Value) {
    let Value::Object(m) = body else { return };
    let key = match path {
        "/v1/chat/completions" | "/v1/completions" => "max_tokens",
        "/v1/responses" => "max_output_tokens",
        "/v1/messages" => "max_tokens",
        _ => return,
    };
    for k in [key, "max_completion_tokens"] {
        match m.get(k) {
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 8) => {
                m.insert(k.into(), 8.into());
            }
            None if k == key => {
                m.insert(k.into(), 8.into());
            }
            _ => {}
        }
    }
}

/// One request; the status and whole answer, or `None` when the connection closed unanswered.
pub fn send(addr: &str, raw: &[u8]) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}

pub fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn endpoint_bodies_get_4xx_never_5xx() {
    let s = server(&[]);
    let seeds = seeds();
    let strategy = (0..seeds.len(), json_edits(4));
    fuzz("endpoint_bodies", 120, Duration::from_secs(30), strategy, |(i, e)| {
        let (path, seed) = &seeds[i];
        let mut body = apply_json(seed, &e);
        clamp(path, &mut body);
        let text = body.to_string();
        let (status, answer) = send(&s.addr, &post(path, text.as_bytes()))
            .ok_or_else(|| TestCaseError::fail(format!("no answer:\n{}", s.log())))?;
        prop_assert!(status < 500, "{path} {text:.300}: {answer:.500}");
        if status >= 400 {
            let json = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            let v: Value = serde_json::from_str(json).map_err(|e| {
                TestCaseError::fail(format!("{status} is not JSON ({e}): {answer:.300}"))
            })?;
            prop_assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        }
        // A stream that failed midway says so in an error event, never a 5xx-shaped event.
        prop_assert!(!answer.contains("\"server_error\""), "{path} {text:.300}: {answer:.800}");
        Ok(())
    });
    assert_eq!(s.request("GET", "/health", &[], b"").0, 200);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn raw_requests_edited() {
    let s = server(&["--idle-timeout", "1"]);
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string();
    let seeds = [
        post("/v1/chat/completions", body.as_bytes()),
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n1b\r\n{\"prompt\":\"a\",\"max_tokens\":1}\r\n0\r\n\r\n".to_vec(),
    ];
    let strategy = (0..seeds.len(), edits(4));
    fuzz("raw_requests", 150, Duration::from_secs(30), strategy, |(i, e)| {
        let raw = apply(&seeds[i], &e);
        if let Some((status, answer)) = send(&s.addr, &raw) {
            prop_assert!(status < 500, "{:?}: {answer:.300}", String::from_utf8_lossy(&raw));
        }
        Ok(())
    });
    assert_eq!(s.request("GET", "/health", &[], b"").0, 200);
}
