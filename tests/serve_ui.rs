//! The chat page of `inferno serve` (`GET /`), driven in headless Chromium by
//! scripts/ui/drive.py (Selenium, Debian's chromium and chromium-driver; scripts/test.sh
//! installs them and sets INFERNO_UI_PYTHON) against the real server on 127.0.0.1 with the
//! SmolLM2 weights on the CPU, or the tiny gpt-oss for reasoning. What the page shows and keeps
//! is compared with what the official `openai` client gets for the same conversation, and the
//! server's /metrics says whether a stopped reply freed its sequence.
//!
//! INFERNO_UI_SHOTS=DIR keeps a screenshot of each scenario in DIR.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::serve::Server;
use serde_json::{Value, json};

fn smollm2() -> PathBuf {
    common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

fn server(args: &[&str]) -> Server {
    let mut all = vec!["--context", "1024", "--kv-tokens", "4096"];
    if !args.contains(&"--max-seqs") {
        all.extend(["--max-seqs", "4"]);
    }
    all.extend_from_slice(args);
    Server::start(&smollm2(), &all, &[])
}

/// Runs a scenario of scripts/ui/drive.py against the server (with the python that has
/// selenium: INFERNO_UI_PYTHON); its JSON result, which must report no console error (a script
/// error, a load the CSP refused).
fn drive(s: &Server, scenario: &str, mut args: Value) -> Value {
    if let Some(dir) = std::env::var_os("INFERNO_UI_SHOTS") {
        let shot = PathBuf::from(dir).join(format!("ui-{scenario}.png"));
        args["shot"] = shot.to_string_lossy().into_owned().into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ui/drive.py");
    let python = common::serve::python_with("INFERNO_UI_PYTHON", "selenium");
    let v = s.script(python, &script, scenario, args);
    assert_eq!(v["console_errors"], json!([]), "{scenario}: the page logged errors");
    v
}

/// Whitespace collapsed: the page lays text out (line breaks become `<br>`, paragraphs).
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the page kept for a reply equals the API's, and shows it as it streamed in.
fn same_reply(page: &Value, api: &Value) {
    assert_eq!(page["stored"]["content"], api["content"], "page {page}\napi {api}");
    assert_eq!(page["state"], "done", "{page}");
    let shown = page["text"].as_str().unwrap();
    assert_eq!(words(shown), words(api["content"].as_str().unwrap()), "{page}");
    // It grew in the page: several lengths between empty and whole were on screen.
    let full = shown.chars().count() as u64;
    let lengths: Vec<u64> =
        page["lengths"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    let partial: std::collections::BTreeSet<u64> =
        lengths.iter().copied().filter(|&n| n > 0 && n < full).collect();
    assert!(partial.len() >= 3, "the reply did not stream in the page: {lengths:?}");
    let stats = page["stored"]["stats"].clone();
    assert_eq!(stats["tokens"], api["completion_tokens"], "{page}");
    for part in ["tokens", "tok/s", "TTFT", "prompt"] {
        assert!(page["stats"].as_str().unwrap().contains(part), "stats line: {page}");
    }
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the SmolLM2 GGUF: scripts/test.sh"
)]
fn a_chat_streams_as_the_api_answers_and_comes_back_after_a_reload() {
    let s = server(&[]);
    let (first, second) = ("What is the capital of Germany?", "And of Italy?");
    let settings = json!({"temperature": 0, "max_tokens": 24});
    let page =
        drive(&s, "chat", json!({"prompt": first, "followup": second, "settings": settings}));
    let api = s.python("turns", json!({"messages": [first, second], "settings": settings}));
    same_reply(&page["first"], &api["turns"][0]);
    same_reply(&page["second"], &api["turns"][1]);
    assert_eq!(page["model"], "SmolLM2-135M-Instruct.Q4_1", "{page}");
    assert_eq!(page["effort_shown"], false, "reasoning effort offered to a Llama: {page}");
    // The second turn's prompt began with the first: the prefix cache served it.
    assert!(page["second"]["stored"]["stats"]["cached_tokens"].as_u64() > Some(0), "{page}");
    assert_eq!(page["restored"], true, "{page}");
    let texts: Vec<String> = page["restored_texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| words(t.as_str().unwrap()))
        .collect();
    let want = [
        first,
        api["turns"][0]["content"].as_str().unwrap(),
        second,
        api["turns"][1]["content"].as_str().unwrap(),
    ];
    assert_eq!(texts, want.map(words), "{page}");
    assert_eq!(page["listed"], json!([first]), "{page}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the SmolLM2 GGUF: scripts/test.sh"
)]
fn stopping_a_reply_ends_it_and_frees_its_sequence() {
    let s = server(&[]);
    let settings = json!({"temperature": 0, "max_tokens": 600});
    let page = drive(
        &s,
        "stop",
        json!({"prompt": "Write a long story about a dragon.", "settings": settings}),
    );
    let text = page["at_stop"]["text"].as_str().unwrap();
    assert!(!text.is_empty(), "{page}");
    assert_eq!(page["later"]["text"], text, "the reply grew after Stop: {page}");
    assert_eq!(page["later"]["state"], "stopped", "{page}");
    assert_eq!(words(page["stored"]["content"].as_str().unwrap()), words(text), "{page}");
    assert_eq!((&page["send_shown"], &page["stop_shown"]), (&json!(true), &json!(false)), "{page}");
    // The server saw the client go and freed the sequence.
    let m = until_running(&s, 0, Duration::from_secs(10));
    assert_eq!(m.get("inferno_cancelled_total"), Some(&1.0), "{m:?}");
    assert!(s.log().contains("client disconnected"), "{}", s.log());
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the SmolLM2 GGUF: scripts/test.sh"
)]
fn conversations_are_listed_switched_deleted_and_kept() {
    let s = server(&[]);
    let settings = json!({"temperature": 0, "max_tokens": 4});
    let page = drive(
        &s,
        "conversations",
        json!({"first": "Hi there", "second": "Name a color.", "settings": settings}),
    );
    assert_eq!(page["empty_after_new"], true, "{page}");
    assert_eq!(page["titles"], json!(["Name a color.", "Hi there"]), "{page}");
    assert_eq!(page["shown_first"], json!(["Hi there"]), "{page}");
    assert_eq!(page["asked"], "Delete?", "{page}");
    assert_eq!(page["after_delete"], json!(["Hi there"]), "{page}");
    assert_eq!(page["shown_after_reload"], json!(["Hi there"]), "{page}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the SmolLM2 GGUF: scripts/test.sh"
)]
fn refused_messages_are_one_line_and_go_back_to_the_box() {
    let s = server(&["--body-limit", "65536", "--max-seqs", "1", "--max-waiting", "0"]);
    // One long generation holds the only slot: the page's next message is refused with 503.
    let hog = hold_the_slot(&s);
    // Over the context (SmolLM2 makes a token of each " word"), and over the body limit.
    let too_long = "word ".repeat(3000);
    let too_large = "x".repeat(100_000);
    let args = json!({"too_long": too_long, "too_large": too_large, "busy": "Hello?"});
    let page = drive(&s, "errors", args);
    drop(s);
    let _ = hog.join();
    let line = page["too_long"].as_str().unwrap();
    assert!(
        line.starts_with("Error 400: the prompt is ") && line.contains("context holds 1024"),
        "{page}"
    );
    assert_eq!(page["too_large"], "Error 413: the request body is larger than the server accepts");
    let busy = page["busy"].as_str().unwrap();
    assert!(busy.starts_with("Error 503: ") && busy.ends_with("(try again in 1 s)"), "{page}");
    for case in ["too_long", "too_large", "busy"] {
        assert_eq!(page[format!("{case}_input_back")], true, "{case}: {page}");
    }
    assert_eq!((&page["messages"], &page["conversations"]), (&json!(0), &json!(0)), "{page}");
}

/// A streamed generation as long as the context allows, running until the server goes; returns
/// once the engine runs it.
fn hold_the_slot(s: &Server) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    // A reply constrained to a string of 4,000 characters cannot end before its 900 tokens (a
    // free reply may stop at its end-of-text token within seconds and free the slot).
    let long = json!({"type": "json_schema",
                      "json_schema": {"name": "story", "schema": {"type": "string", "minLength": 4000}}});
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                      "max_tokens": 900, "stream": true, "response_format": long})
    .to_string();
    let addr = s.addr.clone();
    let hog = std::thread::spawn(move || {
        let Ok(mut c) = std::net::TcpStream::connect(&addr) else { return };
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = c.write_all(head.as_bytes()).and_then(|_| c.write_all(body.as_bytes()));
        let _ = c.read_to_end(&mut Vec::new());
    });
    until_running(s, 1, Duration::from_secs(30));
    hog
}

/// /metrics once the engine runs `n` sequences (polled; a panic after `limit`).
fn until_running(s: &Server, n: u32, limit: Duration) -> HashMap<String, f64> {
    let t0 = Instant::now();
    loop {
        let m = s.metrics(&[]);
        if m.get("inferno_running_sequences") == Some(&f64::from(n)) {
            return m;
        }
        assert!(t0.elapsed() < limit, "{n} sequences never ran: {m:?}\n{}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the SmolLM2 GGUF: scripts/test.sh"
)]
fn with_an_api_key_the_page_loads_asks_for_it_and_then_works() {
    let s = server(&["--api-key", "sekret"]);
    assert_eq!(s.request("GET", "/", &[], b"").0, 200);
    assert_eq!(s.request("GET", "/v1/models", &[], b"").0, 401);
    let page = drive(&s, "key", json!({"prompt": "Hi", "key": "sekret", "wrong_key": "nope"}));
    let unauthorized = s.request("GET", "/v1/models", &[], b"").1;
    let message: Value = serde_json::from_str(&unauthorized).unwrap();
    let line = format!("Error 401: {}", message["error"]["message"].as_str().unwrap());
    assert_eq!(page["first_error"], line.as_str(), "{page}");
    assert_eq!(page["send_error"], line.as_str(), "{page}");
    assert_eq!(page["panel_open"], true, "{page}");
    assert_eq!(page["input_back"], "Hi", "the refused message was lost: {page}");
    assert_eq!(page["wrong"]["error"], line.as_str(), "{page}");
    assert_eq!(
        page["right"],
        json!({"error": "", "model": "SmolLM2-135M-Instruct.Q4_1", "panel_open": false})
    );
    assert_eq!(page["reply"]["state"], "done", "{page}");
    assert!(!page["reply"]["stored"]["content"].as_str().unwrap().is_empty(), "{page}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn the_page_has_its_types_and_policy_and_no_ui_removes_it() {
    let s = server(&[]);
    let (status, body) = s.request("GET", "/", &[], b"");
    assert_eq!(status, 200);
    assert!(body.contains("<script type=\"module\" src=\"/ui/app.js\">"), "{body}");
    let head = s.last_head();
    assert!(head.contains("content-type: text/html; charset=utf-8"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self';"),
        "{head}"
    );
    for (path, kind) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
        ("/ui/icon.svg", "image/svg+xml"),
    ] {
        assert_eq!(s.request("GET", path, &[], b"").0, 200, "{path}");
        assert!(
            s.last_head().contains(&format!("content-type: {kind}")),
            "{path}: {}",
            s.last_head()
        );
    }
    assert_eq!(s.request("GET", "/ui/nothing.js", &[], b"").0, 404);
    let m = s.metrics(&[]);
    assert_eq!(
        m.get("inferno_requests_total{endpoint=\"/ (chat page)\",status=\"200\"}"),
        Some(&4.0),
        "{m:?}"
    );
    drop(s);

    let s = server(&["--no-ui"]);
    for path in ["/", "/ui/app.js"] {
        let (status, body) = s.request("GET", path, &[], b"");
        assert_eq!(status, 404, "{path}: {body}");
    }
    assert_eq!(s.request("GET", "/v1/models", &[], b"").0, 200);
}

/// A gpt-oss reply whose text is forced (the tiny model's random weights never write harmony
/// channels on their own): its reasoning in a collapsed block, its answer as Markdown, text
/// that looks like HTML shown as text.
const FORCED: &str = "<|channel|>analysis<|message|>The user asks for **2 + 2**. <img src=x onerror=\"window.__pwned = 1\"><|end|><|start|>assistant<|channel|>final<|message|>The answer is **4**.\n\n```python\nprint(2 + 2)\n```\n\n<script>window.__pwned = 1</script><|return|>";

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs Chromium with selenium and the gpt-oss tokenizer: scripts/test.sh"
)]
fn gpt_oss_reasoning_is_a_collapsed_block_and_markdown_is_safe() {
    let dir = tempfile::tempdir().unwrap();
    let replies = dir.path().join("replies.json");
    std::fs::write(&replies, serde_json::to_string(&[FORCED, FORCED, READABLE]).unwrap()).unwrap();
    let model = common::tiny_gpt_oss_full_vocab();
    let env = [("INFERNO_TEST_HOOKS", "1"), ("INFERNO_TEST_REPLIES", replies.to_str().unwrap())];
    let args = ["--dtype", "f32", "--context", "2048", "--kv-tokens", "4096", "--max-seqs", "2"];
    let s = Server::start(&model, &args, &env);
    let settings = json!({"temperature": 0, "reasoning_effort": "low"});
    let cases = markdown_cases();
    let sources: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let page = drive(
        &s,
        "reasoning",
        json!({"prompt": "What is 2 + 2?", "settings": settings, "markdown": sources}),
    );
    let api =
        s.python("turns", json!({"messages": ["What is 2 + 2?"], "settings": {"temperature": 0}}));
    let (reply, api) = (&page["reply"], &api["turns"][0]);
    assert_eq!(page["effort_shown"], true, "{page}");
    assert_eq!(reply["stored"]["content"], api["content"], "{page}\n{api}");
    assert_eq!(reply["stored"]["reasoning"], api["reasoning"], "{page}\n{api}");
    let r = &reply["reasoning"];
    assert_eq!(r["open"], false, "the reasoning block is not collapsed: {page}");
    assert!(r["summary"].as_str().unwrap().starts_with("Thought for "), "{page}");
    assert!(r["text"].as_str().unwrap().contains("The user asks for 2 + 2."), "{page}");
    assert!(reply["html"].as_str().unwrap().contains("<strong>4</strong>"), "{page}");
    assert_eq!(page["code_blocks"], json!(["print(2 + 2)"]), "{page}");
    assert!(
        reply["text"].as_str().unwrap().contains("<script>window.__pwned = 1</script>"),
        "{page}"
    );
    assert_eq!((&page["pwned"], &page["img_in_messages"]), (&json!(false), &json!(0)), "{page}");
    check_markdown(&cases, &page["markdown"]);
    if let Some(dir) = std::env::var_os("INFERNO_UI_SHOTS") {
        let out = PathBuf::from(dir).join("ui-gpt-oss.png");
        let prompts = ["Why is the sky blue?"];
        drive(&s, "shot", json!({"out": out, "prompts": prompts, "open_reasoning": true}));
    }
}

/// A reply that reads well, for the screenshot INFERNO_UI_SHOTS asks for.
const READABLE: &str = "<|channel|>analysis<|message|>The user asks why the sky is blue. The key is Rayleigh scattering: its strength goes as 1/λ⁴, so blue light (about 450 nm) scatters almost 6 times more than red (about 700 nm). A small table makes the numbers clear; sunsets are the same effect.<|end|><|start|>assistant<|channel|>final<|message|>The sky looks blue because of **Rayleigh scattering**: the molecules of the air scatter short wavelengths much more strongly than long ones (the strength goes as `1/λ⁴`).\n\n| Color | Wavelength | Scattered, relative to red |\n|---|---:|---:|\n| Blue | 450 nm | 5.8× |\n| Green | 550 nm | 2.6× |\n| Red | 700 nm | 1× |\n\nAt sunset the light crosses much more air, so most of the blue is scattered away before it reaches you and the reds and oranges remain.<|return|>";

/// Markdown sources for the page's renderer, with tags its HTML must have.
fn markdown_cases() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("<script>window.__pwned = 1</script>", &["p"]),
        ("<img src=x onerror=alert(1)> and <a href=\"javascript:alert(1)\">x</a>", &["p"]),
        ("[click](javascript:alert(1)) [ok](https://example.com/a?b=1&c=2)", &["a", "p"]),
        ("[x](https://example.com/\"><img src=x onerror=alert(1)>)", &["a", "p"]),
        ("```html\n<b onmouseover=alert(1)>x</b>\n```", &["button", "code", "div", "pre", "span"]),
        ("```\nunclosed <i>fence", &["code", "pre"]),
        ("**bold** *em* ~~gone~~ `code <b>` \\*literal\\*", &["code", "del", "em", "p", "strong"]),
        ("| a | <i>b</i> |\n|---|:-:|\n| 1 | 2 |", &["table", "tbody", "td", "th", "thead", "tr"]),
        (
            "1. one\n2. two\n   - nested <u>u</u>\n\n> quote\n> > deeper",
            &["blockquote", "li", "ol", "ul"],
        ),
        ("# Title\n---\ntext", &["h1", "hr", "p"]),
    ]
}

fn check_markdown(cases: &[(&str, &[&str])], got: &Value) {
    let allowed_attrs = ["class", "href", "rel", "start", "target", "type"];
    for ((src, want), r) in cases.iter().zip(got.as_array().expect("markdown results")) {
        let tags: Vec<&str> =
            r["tags"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for t in *want {
            assert!(tags.contains(t), "{src:?}: no <{t}> in {r}");
        }
        for bad in ["script", "img", "b", "i", "u", "iframe", "style"] {
            assert!(!tags.contains(&bad), "{src:?} made <{bad}>: {r}");
        }
        for a in r["attrs"].as_array().unwrap() {
            assert!(
                allowed_attrs.contains(&a.as_str().unwrap()),
                "{src:?} made attribute {a}: {r}"
            );
        }
        for h in r["hrefs"].as_array().unwrap() {
            let h = h.as_str().unwrap();
            assert!(h.starts_with("https://") || h.starts_with("mailto:"), "{src:?}: {h}");
        }
    }
    assert_eq!(got.as_array().unwrap().len(), cases.len(), "{got}");
}
