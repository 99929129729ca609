//! `inferno serve` under load on 127.0.0.1 (CPU, SmolLM2): 32 concurrent streams each give exactly the
//! reply they give alone (greedy; the alone replies run one after the other, most of this file's
//! time in CI), and 100 clients that disconnect at random points
//! leave no running sequence and no KV block behind (read from `/metrics`). Bounded in time:
//! every wait has a deadline.

mod common;

use std::time::{Duration, Instant};

use common::serve::Server;
use serde_json::json;

fn smollm2() -> std::path::PathBuf {
    common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn concurrent_streams_equal_their_single_replies() {
    let model = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    let s = Server::start(
        &model,
        &["--context", "512", "--kv-tokens", "16384", "--max-seqs", "32"],
        &[],
    );
    let subjects = ["the sea", "a cat", "winter", "bread", "a city", "the moon", "rain", "music"];
    let asks = [
        "Write one sentence about",
        "Name a color linked to",
        "Give a title for a story about",
        "Describe",
    ];
    let mut prompts: Vec<String> = Vec::new();
    for a in asks {
        for subject in subjects {
            prompts.push(format!("{a} {subject}."));
        }
    }
    assert_eq!(prompts.len(), 32);
    let max_tokens = 8;
    // Alone, one after the other, then all at once.
    let t0 = Instant::now();
    let r = s.python("load", json!({"prompts": prompts, "max_tokens": max_tokens, "alone": true}));
    eprintln!(
        "load: {:.1} s alone, {:.1} s together ({:.1} s in all)",
        r["alone_s"],
        r["wall_s"],
        t0.elapsed().as_secs_f64()
    );
    let alone = r["alone"].as_array().unwrap();
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(
            &r["replies"][i], want,
            "request {i} ({:?}): concurrent differs from alone",
            prompts[i]
        );
    }
    let m = s.wait_drained(Duration::from_secs(60));
    assert!(m["inferno_batch_size"] >= 0.0);
    assert!(
        m.iter()
            .any(|(k, v)| k.starts_with("inferno_inter_token_latency_seconds_count") && *v > 0.0),
        "{m:?}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn random_client_disconnects_leave_no_sequence_and_no_kv_block() {
    let s = Server::start(
        &smollm2(),
        &["--context", "512", "--kv-tokens", "16384", "--max-seqs", "32"],
        &[],
    );
    let before = s.metrics(&[])["inferno_cancelled_total"];
    let t0 = Instant::now();
    let r = s.python("disconnects", json!({"requests": 100, "seed": 7}));
    eprintln!("disconnects: {r} ({:.1} s)", t0.elapsed().as_secs_f64());
    assert!(r["streamed"].as_u64().unwrap() > 50 && r["collected"].as_u64().unwrap() > 10, "{r}");
    let t0 = Instant::now();
    let m = s.wait_drained(Duration::from_secs(120));
    eprintln!("drained in {:.1} s", t0.elapsed().as_secs_f64());
    assert!(m["inferno_cancelled_total"] - before >= 75.0, "few generations were cancelled: {m:?}");
}
