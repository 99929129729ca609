//! `inferno serve` with a gpt-oss checkpoint: harmony end to end through the real `openai`
//! client. The tiny gpt-oss fixture (exact layout, real tokenizer, random weights) answers
//! noise, so the checks are the format's: reasoning apart from the answer, no markup anywhere,
//! `reasoning_effort` in the prompt, the same greedy answer as `inferno play`, prompts token
//! for token as `openai-harmony` renders them (tests/fixtures/harmony.json), and the tool-call
//! path (a call, its result, the final answer) driven by forced replies (`INFERNO_TEST_HOOKS`),
//! preambles as content, and logprobs of the visible content only.

mod common;

use std::process::Command;

use common::serve::Server;
use serde_json::{Value, json};

fn server(hooks: bool) -> Server {
    let model = common::tiny_gpt_oss_full_vocab();
    let env: &[(&str, &str)] = if hooks { &[("INFERNO_TEST_HOOKS", "1")] } else { &[] };
    Server::start(&model, &["--dtype", "f32", "--context", "2048", "--kv-tokens", "8192"], env)
}

fn fixtures() -> Value {
    serde_json::from_str(include_str!("fixtures/harmony.json")).unwrap()
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn harmony_chat_has_reasoning_apart_and_answers_as_play_does() {
    let s = server(false);
    let prompt = "What is 2 + 2?";
    let r = s.python("harmony_chat", json!({"prompt": prompt, "max_tokens": 24}));
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .arg("play")
        .arg(common::tiny_gpt_oss_full_vocab())
        .args(["--cpu", "--dtype", "f32", "--context", "2048", "--temperature", "0"])
        .args(["--max-tokens", "24", "--reasoning", "high", "--system", "Be brief.", "-p", prompt])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let play = String::from_utf8(out.stdout).unwrap();
    let served = r["high"]["content"].as_str().unwrap_or("");
    assert_eq!(served, play.strip_suffix('\n').unwrap_or(&play), "{r}");
    // Effort is in the prompt: high and low differ in length by the word only.
    let (hi, lo) = (&r["high"]["prompt_tokens"], &r["low"]["prompt_tokens"]);
    assert_eq!(hi, lo, "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn prompts_render_exactly_as_openai_harmony() {
    let s = server(true);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/harmony.json");
    let r = s.python("harmony_fixtures", json!({"fixtures": path}));
    let cases: Vec<&str> =
        r["cases"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for want in [
        "user",
        "tools_weather",
        "tools_call_in_progress",
        "tools_turn_answered",
        "tools_second_call_in_progress",
        "tools_preamble_call_in_progress",
    ] {
        assert!(cases.contains(&want), "case {want} not checked: {cases:?}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn a_tool_call_its_result_and_the_answer() {
    let s = server(true);
    let fx = fixtures();
    let case = fx["render"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tools_call_in_progress")
        .unwrap();
    let r = s.python("tool_calls", json!({"tools": case["tools"]}));
    // The second turn's prompt (call, result, reasoning kept mid-turn) is openai-harmony's.
    assert_eq!(r["prompt_ids"], case["expected_ids"], "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn preambles_are_content_and_logprobs_cover_the_content_only() {
    let s = server(true);
    let r = s.python("harmony_preamble_and_logprobs", json!({}));
    assert_eq!(r["content"], "One moment.\nIt is 21 °C.", "{r}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn test_hooks_are_off_unless_enabled() {
    let s = server(false);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
                      "x_inferno_force_reply": "<|channel|>final<|message|>forced<|return|>",
                      "x_inferno_prompt_ids": true});
    let (status, text) =
        s.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v.get("x_inferno_prompt_ids").is_none(), "{v}");
    assert_ne!(v["choices"][0]["message"]["content"], "forced", "{v}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn odd_harmony_conversations_are_400s() {
    let s = server(false);
    let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
    let user = json!({"role": "user", "content": "hi"});
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let bodies = [
        json!({"messages": [user, {"role": "assistant", "tool_calls": [call("a", "f"), call("a", "f")]}], "tools": tools}),
        json!({"messages": [user, {"role": "tool", "tool_call_id": "nope", "content": "x"}]}),
        json!({"messages": [user, {"role": "tool", "content": "x"}]}),
        json!({"messages": [user, {"role": "assistant", "tool_calls": [call("a", "<|call|>")]}]}),
        json!({"messages": [user], "tools": [{"type": "function", "function": {"name": "a b"}}]}),
        json!({"messages": [user], "tools": [{"type": "retrieval"}]}),
        json!({"messages": [user], "reasoning_effort": "max"}),
        json!({"messages": [user], "reasoning": {"effort": 3}}),
    ];
    let texts: Vec<String> = bodies.iter().map(|b| b.to_string()).collect();
    let extra: Vec<(&str, &str, u16)> =
        texts.iter().map(|t| ("/v1/chat/completions", t.as_str(), 400)).collect();
    common::serve::odd_bodies_are_answered(&s, &extra);
    // A call answered by its result, without an id on the result (the one pending call).
    let ok = json!({"max_tokens": 1, "tools": tools, "messages": [user,
        {"role": "assistant", "content": null, "tool_calls": [call("c1", "f")]},
        {"role": "tool", "content": "42"}]});
    let (status, text) = s.request("POST", "/v1/chat/completions", &[], ok.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
}
