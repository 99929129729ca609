//! `inferno serve` driven by the real `openai` Python client (PyPI) on 127.0.0.1, with the real
//! SmolLM2-135M-Instruct weights on the CPU: chat and completions streamed and not, usage, stop
//! strings, seeds, /v1/models, the error statuses, the API key, the queue limit, Ctrl+C, and
//! greedy replies identical to `inferno play`'s. Needs the SmolLM2 asset and a python with
//! `openai` (scripts/test.sh provides both).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::serve::Server;
use serde_json::json;

fn model() -> PathBuf {
    common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

const CONTEXT: usize = 1024;

fn server(args: &[&str], env: &[(&str, &str)]) -> Server {
    let context = CONTEXT.to_string();
    let mut all = vec!["--context", &context, "--kv-tokens", "8192"];
    if !args.contains(&"--max-seqs") {
        all.extend(["--max-seqs", "8"]);
    }
    all.extend_from_slice(args);
    Server::start(&model(), &all, env)
}

/// `inferno play MODEL --cpu --temperature 0 …` stdout, without its final newline.
fn play(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .arg("play")
        .arg(model())
        .args(["--cpu", "--temperature", "0", "--context", &CONTEXT.to_string()])
        .args(args)
        .env("XDG_STATE_HOME", std::env::temp_dir().join("inferno-test-state"))
        .output()
        .expect("run play");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).expect("utf-8");
    s.strip_suffix('\n').unwrap_or(&s).to_string()
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn chat_and_completions_match_play_streamed_or_not() {
    let s = server(&[], &[]);
    assert!(s.saw_loading, "/health never said 503 while the model loaded");
    let prompt = "What is the capital of Germany?";
    let raw = "The three primary colors are";
    let r = s.python("basic", json!({"prompt": prompt, "raw": raw, "max_tokens": 24}));
    assert_eq!(r["chat"], play(&["--max-tokens", "24", "--prompt", prompt]), "{r}");
    assert_eq!(r["completion"], play(&["--raw", "--max-tokens", "24", "--prompt", raw]), "{r}");
    assert!(s.log().contains(" /v1/chat/completions 200 "), "no request log line:\n{}", s.log());
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn stop_strings_seeds_and_models() {
    let s = server(&[], &[]);
    let r =
        s.python("stop_strings", json!({"prompt": "Name three primary colors.", "max_tokens": 30}));
    assert!(r["cut"].as_str().unwrap().len() < r["full"].as_str().unwrap().len(), "{r}");
    s.python("seeds", json!({"prompt": "Write a short poem about the sea."}));
    s.python("models", json!({"aliases": ["SmolLM2-135M-Instruct.Q4_1"]}));
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn errors_are_openai_error_objects_with_the_right_status() {
    let s = server(&["--body-limit", "65536"], &[]);
    s.python("errors", json!({"context": CONTEXT, "body_limit": 65536}));
    // Requests no route takes are in the log, not silent.
    let log = s.log();
    assert!(log.contains("GET /v1/nowhere: no such endpoint"), "{log}");
    assert!(log.contains("GET /v1/chat/completions: method not allowed"), "{log}");
    let m = s.metrics(&[]);
    assert!(
        m["inferno_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"] >= 5.0,
        "{m:?}"
    );
    assert_eq!(m["inferno_running_sequences"], 0.0);
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn the_api_key_is_a_bearer_token_from_the_flag_or_the_environment() {
    let s = server(&["--api-key", "sekret", "--cors-origin", "http://app.example"], &[]);
    s.python("api_key", json!({"api_key": "sekret"}));
    // CORS: a preflight from an allowed origin is answered (without the key), others are not.
    let preflight = |origin: &str| {
        let headers = [
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization,content-type"),
        ];
        let (status, _) = s.request("OPTIONS", "/v1/chat/completions", &headers, b"");
        (status, s.last_head())
    };
    let (status, head) = preflight("http://app.example");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("access-control-allow-origin: http://app.example"), "{head}");
    let (_, head) = preflight("http://evil.example");
    assert!(!head.contains("access-control-allow-origin"), "{head}");
    drop(s);
    let s = server(&[], &[("INFERNO_API_KEY", "from-env")]);
    s.python("api_key", json!({"api_key": "from-env"}));
    assert_eq!(s.request("GET", "/v1/models", &[], b"").0, 401);
    // No --cors-origin: no CORS headers at all.
    s.request("GET", "/health", &[("Origin", "http://app.example")], b"");
    assert!(!s.last_head().contains("access-control"), "{}", s.last_head());
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn a_full_queue_is_503_with_retry_after() {
    let s = server(&["--max-seqs", "1", "--max-waiting", "0"], &[]);
    s.python("queue_full", json!({}));
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn ctrl_c_ends_open_streams_with_an_error_and_exits() {
    let mut s = server(&[], &[]);
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("streaming");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/serve_client.py");
    let client = common::serve::python_command()
        .arg(script)
        .arg(s.url())
        .arg("stream_until_interrupted")
        .arg(json!({"ready_file": ready}).to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "the stream never started:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = s.interrupt(Duration::from_secs(20));
    assert!(status.success(), "{status}:\n{}", s.log());
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["error"].as_str().unwrap().contains("shutting down"), "{r}");
    assert!(s.log().contains("shutting down"), "{}", s.log());
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn a_waiting_stream_gets_keep_alive_comments() {
    let s = server(&["--max-seqs", "1"], &[("INFERNO_SSE_KEEP_ALIVE_SECS", "1")]);
    s.python("keep_alive", json!({"busy_tokens": 900}));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn tools_go_through_a_chat_template_that_supports_them() {
    let template = "llama3_1-8b-instruct";
    let dir = common::tiny_llama_with_template(template);
    let s = Server::start(dir.path(), &["--context", "512"], &[("INFERNO_TEST_HOOKS", "1")]);
    let case = common::template_case(template, |c| c["extra"].get("tools").is_some());
    let body = json!({"messages": case["messages"], "tools": case["extra"]["tools"], "max_tokens": 1,
                      "x_inferno_prompt_ids": true});
    let (status, text) =
        s.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let got: serde_json::Value = serde_json::from_str(&text).unwrap();
    // transformers' rendering, tokenized as the server tokenizes a rendered chat.
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let want = tok.encode(case["expected"].as_str().unwrap(), false).unwrap().get_ids().to_vec();
    assert_eq!(got["x_inferno_prompt_ids"], json!(want));
}

/// `log_softmax` of a logits row, in f64.
fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
    row.iter().map(|l| l - lse).collect()
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the python clients: scripts/test.sh")]
fn completion_logprobs_are_the_log_softmax_of_transformers_logits() {
    // The tiny Llama 3 GGUF and transformers' f32 logits on it (scripts/fixtures/llama3_tiny.py):
    // greedy from the fixture's prompt is the fixture's greedy sequence, and the logits it kept
    // at some positions are those of the steps that sampled the next token there.
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/llama3_tiny/reference.json")).unwrap();
    let model = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/llama3_tiny/model.gguf"
    ));
    let s = Server::start(&model, &["--context", "256"], &[]);
    let prompt = fx["prompt_ids"].as_array().unwrap();
    let want: Vec<u64> =
        fx["greedy_tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let r = s.python(
        "completion_logprobs",
        json!({"prompt": prompt, "max_tokens": want.len(), "top": 20}),
    );
    let id = |t: &serde_json::Value| -> usize {
        t.as_str().and_then(|t| t.strip_prefix("token_id:")).unwrap().parse().unwrap()
    };
    let got: Vec<u64> = r["tokens"].as_array().unwrap().iter().map(|t| id(t) as u64).collect();
    assert_eq!(got, want, "greedy tokens");
    let mut compared = 0;
    for (pos, row) in
        fx["logit_positions"].as_array().unwrap().iter().zip(fx["logits"].as_array().unwrap())
    {
        // The row at position p predicts token p + 1: generated token p + 1 - prompt length.
        let Some(step) = (pos.as_u64().unwrap() as usize + 1).checked_sub(prompt.len()) else {
            continue;
        };
        let row: Vec<f64> = row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let reference = log_softmax(&row);
        let chosen = r["token_logprobs"][step].as_f64().unwrap();
        assert!((chosen - reference[want[step] as usize]).abs() < 1e-3, "step {step}: {chosen}");
        // The 20 alternatives: the 20 best of the reference, each with its number.
        let alternatives = r["top_logprobs"][step].as_object().unwrap();
        assert_eq!(alternatives.len(), 20, "{alternatives:?}");
        let mut best = reference.clone();
        best.sort_by(|a, b| b.total_cmp(a));
        for (token, lp) in alternatives {
            let lp = lp.as_f64().unwrap();
            let t = id(&json!(token));
            assert!(
                (lp - reference[t]).abs() < 1e-3,
                "step {step} token {t}: {lp} vs {}",
                reference[t]
            );
            assert!(
                reference[t] >= best[19] - 1e-3,
                "step {step}: token {t} is not among the 20 best"
            );
        }
        compared += 1;
    }
    assert!(compared >= 5, "only {compared} fixture rows fall in the generated part");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn chat_logprobs_agree_with_completions_streamed_or_not() {
    let s = server(&[], &[("INFERNO_TEST_HOOKS", "1")]);
    let r = s.python("chat_logprobs", json!({"prompt": "Name three colors.", "max_tokens": 24}));
    assert!(r["entries"].as_u64().unwrap() >= 3, "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn presence_and_frequency_penalties_follow_openais_formula() {
    let s = server(&[], &[]);
    // (presence, frequency): none, then each kind, discouraging and encouraging repeats.
    let penalties = [[0.0, 0.0], [0.0, 1.5], [-2.0, 0.0], [0.5, -1.0]];
    let prompt = "Repeat after me: yes yes yes yes yes yes";
    let r =
        s.python("penalties", json!({"prompt": prompt, "max_tokens": 32, "penalties": penalties}));
    // The formula is checked at every step in the scenario; here, that the replies moved the
    // way each penalty pushes: fewer repeats when penalised, more when encouraged.
    let yes = |i: usize| r["replies"][i].as_str().unwrap().to_lowercase().matches("yes").count();
    assert!(yes(1) < yes(0), "frequency 1.5 did not cut the repeats: {r}");
    assert!(yes(2) > yes(0), "presence -2 did not add repeats: {r}");
    assert!(yes(3) > yes(0), "frequency -1 did not add repeats: {r}");
    // `play` with the same penalties says the same.
    let args = ["--max-tokens", "32", "--presence-penalty", "0.5", "--frequency-penalty", "-1"];
    assert_eq!(r["replies"][3], play(&[&args[..], &["--prompt", prompt]].concat()), "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the Llama 2 tokenizer: scripts/test.sh"
)]
fn a_template_without_tools_gets_them_in_its_system_message() {
    let dir = common::tiny_llama_with_template("smollm2-135m-instruct");
    let s = Server::start(dir.path(), &["--context", "1024"], &[("INFERNO_TEST_HOOKS", "1")]);
    let r = s.python("polyfill_tools", json!({}));
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let text = |key: &str| {
        let ids: Vec<u32> = serde_json::from_value(r[key].clone()).unwrap();
        tok.decode(&ids, false).unwrap()
    };
    let offered = text("offered");
    assert!(offered.contains("<|im_start|>system"), "{offered}");
    assert!(offered.contains("- get_weather: Current weather in a city."), "{offered}");
    assert!(offered.contains(r#""required":["city"]"#), "{offered}");
    let round = text("round_trip");
    assert!(round.contains(r#"{"name":"get_weather","arguments":"#), "{round}");
    assert!(
        round.contains("<|im_start|>user\nResult of the call to get_weather:\n18 C, cloudy"),
        "{round}"
    );
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the Llama 2 tokenizer: scripts/test.sh"
)]
fn llama_tool_calls_become_tool_calls_and_their_results_render_back() {
    let template = "llama3_1-8b-instruct";
    let dir = common::tiny_llama_with_template(template);
    let s = Server::start(dir.path(), &["--context", "1024"], &[("INFERNO_TEST_HOOKS", "1")]);
    let case = common::template_case(template, |c| c["conversation"] == "tool_round_trip");
    let r = s.python(
        "llama_tool_calls",
        json!({"tools": case["extra"]["tools"], "messages": case["messages"]}),
    );
    // transformers' rendering (arguments as a dict), tokenized as the server tokenizes a chat.
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let want = tok.encode(case["expected"].as_str().unwrap(), false).unwrap().get_ids().to_vec();
    assert_eq!(r["prompt_ids"], json!(want));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn odd_inputs_never_break_the_server() {
    let s = server(&[], &[]);
    common::serve::odd_bodies_are_answered(&s, &[]);
}

/// `serve --draft ngram`: a reply that copies its prompt is the one plain decoding gives (play
/// without drafts), and `/metrics` counts the drafts and the accepted tokens.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn speculation_replies_as_without_and_is_counted() {
    let s = server(&["--draft", "ngram", "--draft-tokens", "6"], &[]);
    let ask = "Repeat this sentence exactly: the old mill stood by the river, and the river ran \
               fast in spring.";
    let body = json!({
        "model": model().to_str().expect("utf-8 path"),
        "messages": [{"role": "user", "content": ask}],
        "max_tokens": 40,
        "temperature": 0,
    });
    let (status, text) = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    let r: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let reply = r["choices"][0]["message"]["content"].as_str().expect("content");
    assert_eq!(reply, play(&["--max-tokens", "40", "--prompt", ask]));
    let m = s.metrics(&[]);
    assert!(m["inferno_spec_decode_num_drafts"] > 0.0, "no draft counted: {m:?}");
    assert!(m["inferno_spec_decode_num_accepted_tokens"] > 0.0, "nothing accepted: {m:?}");
    assert!(
        m["inferno_spec_decode_num_accepted_tokens"] <= m["inferno_spec_decode_num_draft_tokens"]
    );
}

/// Predicted Outputs through the `openai` client: the same greedy reply with any prediction,
/// most of an exact prediction accepted, an unrelated one mostly rejected (SmolLM2 repeating a
/// paragraph; the server has no `--draft`: the prediction alone drafts).
#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn predicted_outputs_change_nothing_but_the_speed() {
    let s = server(&[], &[]);
    let prompt = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog \
                  near the river bank, and then it runs back into the forest.";
    let unrelated = "Prices of copper rose sharply on Tuesday after the mine strike.";
    let r = s
        .python("predictions", json!({"prompt": prompt, "max_tokens": 40, "unrelated": unrelated}));
    let n = |case: &str, k: &str| r[case][k].as_u64().unwrap_or_else(|| panic!("{r}"));
    let generated = r["completion_tokens"].as_u64().unwrap();
    assert!(
        n("exact", "accepted") * 2 >= generated,
        "an exact prediction was mostly rejected: {r}"
    );
    assert!(n("exact", "accepted") > 2 * n("exact", "rejected"), "{r}");
    assert!(n("parts", "accepted") == n("exact", "accepted"), "{r}");
    assert!(n("streamed", "accepted") == n("exact", "accepted"), "{r}");
    assert!(n("edited", "rejected") > 0, "an edited prediction lost nothing: {r}");
    assert!(n("unrelated", "accepted") < n("exact", "accepted"), "{r}");
}
