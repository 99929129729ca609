//! `inferno serve`'s Responses API (`/v1/responses`) through the real `openai` Python client
//! (tests/python/responses_client.py): the tiny gpt-oss fixture with forced replies for the
//! tool loop (a call, its output sent back as the whole history or by `previous_response_id`,
//! the answer), the stored responses (GET, DELETE, 404s, the count bound), a 400 naming the
//! field for each bad value; and real SmolLM2 weights, whose greedy Responses text must equal
//! chat's for the same message.

mod common;

use common::serve::Server;
use serde_json::{Value, json};

fn gpt_oss(args: &[&str]) -> Server {
    let model = common::tiny_gpt_oss_full_vocab();
    let mut all = vec!["--dtype", "f32", "--context", "2048", "--kv-tokens", "8192"];
    all.extend_from_slice(args);
    Server::start(&model, &all, &[("INFERNO_TEST_HOOKS", "1")])
}

/// Runs a scenario of tests/python/responses_client.py against `s`; its JSON result.
fn python(s: &Server, scenario: &str, args: Value) -> Value {
    s.python_script("responses_client.py", scenario, args)
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn a_tool_call_its_output_and_the_answer_by_history_or_previous_response_id() {
    let s = gpt_oss(&[]);
    let r = python(&s, "tool_loop", json!({}));
    // The second prompt holds the tool's output (rendered as harmony's tool message).
    let ids: Vec<u32> = serde_json::from_value(r["prompt_ids"].clone()).unwrap();
    let tokenizer =
        tokenizers::Tokenizer::from_file(common::tiny_gpt_oss_full_vocab().join("tokenizer.json"))
            .unwrap();
    let text = tokenizer.decode(&ids, false).unwrap();
    let want = format!(
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{}<|end|>",
        r["tool_output"].as_str().unwrap()
    );
    assert!(text.contains(&want), "{text}");
    // Inside the tool loop the call's reasoning is replayed.
    assert!(text.contains("Need get_weather for Tokyo."), "{text}");
    let m = s.metrics(&[]);
    assert!(m.keys().any(|k| k.contains("/v1/responses")), "{m:?}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn stored_responses_get_delete_and_the_bound() {
    let s = gpt_oss(&["--responses-store", "2"]);
    let r = python(&s, "store", json!({}));
    assert_eq!(r["ids"].as_array().map(Vec::len), Some(3), "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn bad_values_are_400s_naming_the_field() {
    let s = gpt_oss(&[]);
    let r = python(&s, "errors", json!({}));
    let msg = r["too_long"].as_str().unwrap();
    assert!(msg.contains("tokens") && msg.contains("2048"), "{msg}");
    // Odd bodies are answered, never a dropped connection or a 500.
    for body in
        ["", "{}", "null", "[]", r#"{"input": null}"#, r#"{"input": [{}]}"#, r#"{"input": [5]}"#]
    {
        let (status, text) = s.request("POST", "/v1/responses", &[], body.as_bytes());
        assert_eq!(status, 400, "{body}: {text}");
    }
    let (status, _) = s.request("GET", "/health", &[], b"");
    assert_eq!(status, 200);
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn smollm2_responses_text_equals_chat() {
    let model = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    let s = Server::start(&model, &["--context", "1024", "--kv-tokens", "4096"], &[]);
    let r = python(&s, "same_as_chat", json!({"max_tokens": 24}));
    for case in ["none", "You are terse."] {
        let text = r[case]["responses"].as_str().unwrap_or("");
        assert!(!text.is_empty(), "{r}");
        assert_eq!(r[case]["responses"], r[case]["chat"], "{r}");
    }
    // Structured outputs: the scenario validates each reply against its schema.
    let r = python(&s, "structured", json!({}));
    assert!(r["json"].as_str().is_some_and(|t| t.starts_with('{')), "{r}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn a_client_gone_mid_stream_cancels_its_generation() {
    use std::io::{Read, Write};
    let s = gpt_oss(&[]);
    // A forced answer of 1500 words: a delta per token for half a minute or more.
    let long = format!("<|channel|>final<|message|>{}<|return|>", "word ".repeat(1500));
    let body = json!({"input": "Tell a long story.", "stream": true, "max_output_tokens": 1800,
                      "x_inferno_force_reply": long});
    let body = body.to_string();
    let mut tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.write_all(body.as_bytes()).unwrap();
    // Read until the first delta: the generation is running.
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains(".delta") {
        let n = tcp.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("event: response.created\n"), "{seen}");
    drop(tcp);
    let t0 = std::time::Instant::now();
    loop {
        let m = s.metrics(&[]);
        if m.get("inferno_cancelled_total") == Some(&1.0)
            && m.get("inferno_running_sequences") == Some(&0.0)
        {
            break;
        }
        assert!(m.get("inferno_generation_tokens_total") == Some(&0.0), "ran to the end: {m:?}");
        assert!(t0.elapsed().as_secs() < 20, "not cancelled: {m:?}\n{}", s.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(s.log().contains("client disconnected"), "{}", s.log());
}

/// `truncation: "auto"` drops the oldest turns until the input fits (the newest message stays);
/// without it, the same conversation is a 400 `context_length_exceeded`.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn truncation_auto_drops_the_oldest_turns_until_the_input_fits() {
    let model = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    let s = Server::start(&model, &["--context", "256", "--kv-tokens", "1024"], &[]);
    let mut input = Vec::new();
    for t in 0..12 {
        let said =
            format!("Turn {t}: tell me one more fact about the planets of the solar system.");
        input.push(json!({"role": "user", "content": said}));
        input.push(json!({"role": "assistant", "content": format!("Fact {t}: Jupiter is the largest planet, and Mercury is the closest to the sun.")}));
    }
    input.push(json!({"role": "user", "content": "Which planet is the largest?"}));
    let body = |truncation: &str| {
        json!({"input": input, "max_output_tokens": 8, "temperature": 0,
               "instructions": "Answer briefly.", "truncation": truncation})
        .to_string()
    };
    let headers = [("Content-Type", "application/json")];
    let (status, text) = s.request("POST", "/v1/responses", &headers, body("disabled").as_bytes());
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("truncation \"auto\""), "{v}");
    let (status, text) = s.request("POST", "/v1/responses", &headers, body("auto").as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["truncation"], "auto", "{v}");
    let used = v["usage"]["input_tokens"].as_u64().unwrap()
        + v["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    // It fits, and no more went than needed: a turn is ~40 tokens.
    assert!(used < 256 && used > 256 - 2 * 45, "{used} input tokens: {v}");
    let (status, text) = s.request("POST", "/v1/responses", &headers, body("sometimes").as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("truncation must be"), "{text}");
}
