//! The HTTP layer's attacks one by one against `inferno serve` (SmolLM2 on the CPU, a 2 s idle
//! timeout): slowloris, oversize heads, more connections than allowed, half-closed sockets,
//! clients vanishing mid-stream; and what /metrics and /health reveal of a prompt.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;

use super::http::{post, send, server};

fn health(addr: &str) -> u16 {
    send(addr, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_or(0, |a| a.0)
}

/// Reads until the server closes the connection; how long that took (at most `limit`).
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn slowloris_connections_are_closed_and_others_served_meanwhile() {
    let s = server(&[]);
    let head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let mut slow: Vec<TcpStream> = (0..16).map(|_| TcpStream::connect(&s.addr).unwrap()).collect();
    // One byte each every 200 ms: headers that would never finish.
    for b in head.iter().take(8) {
        for c in &mut slow {
            c.write_all(&[*b]).unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(health(&s.addr), 200, "a normal client waits behind slow ones");
    for c in &mut slow {
        let took = closed_within(c, Duration::from_secs(10));
        assert!(took.is_some(), "a slow client's connection stayed open past the idle timeout");
    }
    assert_eq!(health(&s.addr), 200);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn oversize_heads_get_431() {
    let s = server(&[]);
    let big = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(70_000));
    assert_eq!(send(&s.addr, big.as_bytes()).map(|a| a.0), Some(431));
    let many = format!("GET /health HTTP/1.1\r\nHost: x\r\n{}\r\n", "X-A: b\r\n".repeat(200));
    assert_eq!(send(&s.addr, many.as_bytes()).map(|a| a.0), Some(431));
    let fits = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
        "a".repeat(60_000)
    );
    assert_eq!(send(&s.addr, fits.as_bytes()).map(|a| a.0), Some(200));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn connections_past_the_limit_wait_for_a_free_one() {
    let s = server(&["--max-connections", "4"]);
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&s.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    // The fifth is answered once the idle ones time out (2 s), not before, and not refused.
    let t0 = Instant::now();
    assert_eq!(health(&s.addr), 200);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1200), "answered after {waited:?}: no limit");
    assert!(waited < Duration::from_secs(10), "answered after {waited:?}");
    drop(held);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_stalled_body_gets_400_after_the_idle_timeout() {
    let s = server(&[]);
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = vec![0u8; 4096];
    let n = c.read(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out[..n]);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("not received within"), "{text}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn half_closed_sockets_and_vanished_clients_free_their_sequences() {
    let s = server(&[]);
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 200, "stream": true}).to_string();
    // Half-closed after the request: hyper ends the connection (the client is gone).
    for _ in 0..4 {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(&post("/v1/chat/completions", body.as_bytes())).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let _ = closed_within(&mut c, Duration::from_secs(30));
    }
    // Streams read to their first event, then dropped.
    for _ in 0..6 {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(&post("/v1/chat/completions", body.as_bytes())).unwrap();
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("data: ") {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "closed before the first event");
            got.extend_from_slice(&buf[..n]);
        }
        drop(c);
    }
    let t0 = Instant::now();
    loop {
        let m = s.metrics(&[]);
        if m["inferno_running_sequences"] == 0.0 && m["inferno_requests_in_flight"] <= 1.0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "sequences still running: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _) = s.request(
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        br#"{"prompt": "a", "max_tokens": 2}"#,
    );
    assert_eq!(status, 200);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn metrics_and_health_reveal_nothing_of_prompts() {
    let key = "sk-test-key-0123456789";
    let s = server(&["--api-key", key]);
    let secret = "canary-7f3a9c-SECRET-prompt";
    let auth = format!("Bearer {key}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let bodies = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": secret}], "max_tokens": 2}),
        ),
        ("/v1/completions", json!({"prompt": secret, "max_tokens": 2, "stop": [secret]})),
        (
            "/v1/messages",
            json!({"max_tokens": 2, "system": secret, "messages": [{"role": "user", "content": secret}]}),
        ),
        // Refused requests too: the secret in a field that fails validation.
        ("/v1/chat/completions", json!({"messages": [{"role": secret, "content": secret}]})),
        ("/v1/completions", json!({"prompt": secret, "max_tokens": secret})),
    ];
    for (path, body) in &bodies {
        let (status, text) = s.request("POST", path, &headers, body.to_string().as_bytes());
        assert!(status < 500, "{path}: {text}");
    }
    // A secret in the path and the API key of a refused request.
    let _ = s.request("GET", &format!("/v1/{secret}"), &headers, b"");
    let _ = s.request("GET", "/v1/models", &[("Authorization", &format!("Bearer {secret}"))], b"");
    let (status, metrics) = s.request("GET", "/metrics", &[("Authorization", auth.as_str())], b"");
    assert_eq!(status, 200);
    assert!(metrics.contains("inferno_requests_total"), "{metrics}");
    let (status, health) = s.request("GET", "/health", &[], b"");
    assert_eq!(status, 200);
    for (what, text) in [("/metrics", &metrics), ("/health", &health)] {
        assert!(!text.contains("canary"), "{what} shows the prompt:\n{text}");
        assert!(!text.contains(key), "{what} shows the API key:\n{text}");
    }
    assert!(health.len() < 64, "/health says more than its status: {health}");
}
