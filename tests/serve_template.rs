//! `inferno serve` with a hostile chat template: a request whose render doubles a string, and
//! one whose render is slow, each get a 500 with one line (the worker rendering it dies or is
//! killed, the server lives on and serves the next request), and no render worker outlives the
//! server, whether it exits on Ctrl+C or is killed.

mod common;

use std::time::{Duration, Instant};

use common::serve::Server;
use serde_json::json;

/// Renders normally, unless the last message says `double` or `slow`.
const TEMPLATE: &str = concat!(
    "{% if messages[-1].content == 'double' %}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "{% elif messages[-1].content == 'slow' %}",
    "{% for i in range(50000) %}{{ range(100000) | list | sort | length }}{% endfor %}",
    "{% else %}",
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
    "{% endif %}"
);

fn model() -> tempfile::TempDir {
    let dir = common::tiny_llama_with_template("smollm2-135m-instruct");
    let cfg = json!({"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"});
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

fn chat(s: &Server, text: &str) -> (u16, String, Duration) {
    let body = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2});
    let t0 = Instant::now();
    let (status, reply) =
        s.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    (status, reply, t0.elapsed())
}

/// The render workers of `s`: its children.
fn workers(s: &Server) -> Vec<u32> {
    common::children_of(s.pid())
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn hostile_templates_get_one_line_and_the_server_serves_on() {
    let dir = model();
    let mut s = Server::start(dir.path(), &["--context", "1024"], &[]);
    let (status, _, _) = chat(&s, "hello");
    assert_eq!(status, 200, "{}", s.log());

    let (status, body, took) = chat(&s, "double");
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("the model's chat template used more than 1024 MiB of memory"), "{body}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (status, body, _) = chat(&s, "hello");
    assert_eq!(status, 200, "{body}\n{}", s.log());

    let (status, body, took) = chat(&s, "slow");
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("the model's chat template did not finish within 10s"), "{body}");
    assert!(took < Duration::from_secs(12), "{took:?}");
    let (status, body, _) = chat(&s, "hello");
    assert_eq!(status, 200, "{body}\n{}", s.log());

    let alive = workers(&s);
    assert!(!alive.is_empty() && alive.len() <= 4, "{alive:?}");
    assert!(alive.iter().all(|&p| common::running(p)), "{alive:?}");
    let status = s.interrupt(Duration::from_secs(30));
    assert!(status.success(), "{status}\n{}", s.log());
    let left: Vec<u32> = alive.iter().copied().filter(|&p| common::running(p)).collect();
    assert!(left.is_empty(), "workers left after Ctrl+C: {left:?}");
    assert!(!s.log().contains("without a memory limit"), "{}", s.log());
}

/// A render waits for its worker off the server's async threads: with as many slow renders in
/// flight as the runtime has threads, the server still answers at once.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn slow_renders_hold_up_no_other_request() {
    let dir = model();
    let s = std::sync::Arc::new(Server::start(dir.path(), &["--context", "1024"], &[]));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let slow: Vec<_> = (0..threads)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || chat(&s, "slow").0)
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    for path in ["/health", "/v1/models"] {
        let t0 = Instant::now();
        let (status, body) = s.request("GET", path, &[], b"");
        assert_eq!(status, 200, "{body}");
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(2), "{path} took {took:?} behind {threads} renders");
    }
    for t in slow {
        assert_eq!(t.join().unwrap(), 500);
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn a_killed_server_leaves_no_worker_running() {
    let dir = model();
    let s = Server::start(dir.path(), &["--context", "1024"], &[]);
    let (status, _, _) = chat(&s, "hello");
    assert_eq!(status, 200, "{}", s.log());
    let alive = workers(&s);
    assert!(!alive.is_empty(), "no worker");
    // Drop sends SIGKILL: the workers get theirs from PR_SET_PDEATHSIG.
    drop(s);
    let t0 = Instant::now();
    while alive.iter().any(|&p| common::running(p)) {
        assert!(t0.elapsed() < Duration::from_secs(5), "workers still running: {alive:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
