//! Chat template tests: the environment's Python behaviours one by one, then every case of
//! `tests/fixtures/chat_templates.json` (transformers' own `apply_chat_template` output).

use super::*;
use serde_json::json;
use std::time::{Duration, UNIX_EPOCH};

fn render(src: &str, messages: &[Message], extra: serde_json::Value) -> Result<String> {
    ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into()))?.render(messages, true, &extra)
}

fn user(text: &str) -> Vec<Message> {
    vec![Message::new("user", text)]
}

#[test]
fn trim_blocks_lstrip_blocks_and_trailing_newline() {
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(render(src, &user("hi"), json!(null)).unwrap(), "[hi]\n");
}

#[test]
fn generation_tags_render_their_body() {
    let src = "{% for m in messages %}{%- generation -%}\n  <{{ m.content }}>\n{%- endgeneration %}\n{% endfor %}";
    assert_eq!(render(src, &user("hi"), json!(null)).unwrap(), "<hi>");
    assert_eq!(
        rewrite_generation_tags("a{%generation%}b{%+ endgeneration -%}c{% if x %}"),
        "a{% if true %}b{%+ endif -%}c{% if x %}"
    );
    // An unterminated tag is kept once (for the parser to report), text before it too.
    assert_eq!(rewrite_generation_tags("ab{% if"), "ab{% if");
    assert_eq!(rewrite_generation_tags("x{%}y"), "x{%}y");
}

#[test]
fn none_is_not_iterable_but_lists_and_undefined_are() {
    let src = "{{ tools is iterable }}{{ [] is iterable }}{{ nothing is iterable }}{{ 'ab' is iterable }}";
    assert_eq!(render(src, &[], json!(null)).unwrap(), "FalseTrueTrueTrue");
}

#[test]
fn raise_exception_carries_the_message() {
    let src = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with a system message') }}{% endif %}";
    let err = render(src, &user("hi"), json!(null)).unwrap_err();
    assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput);
    assert_eq!(
        err.to_string(),
        "the chat template rejected the conversation: Conversation must start with a system message"
    );
}

#[test]
fn syntax_errors_surface_at_construction() {
    let err = ChatTemplate::new("{% if %}", None, None).unwrap_err();
    assert!(err.to_string().starts_with("chat template does not parse"), "{err}");
}

#[test]
fn strftime_now_uses_the_injected_clock() {
    let t = ChatTemplate::new(
        "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}",
        None,
        None,
    )
    .unwrap()
    .with_clock(|| UNIX_EPOCH + Duration::from_secs(1_722_012_709));
    assert_eq!(t.render(&[], false, &json!(null)).unwrap(), "26 Jul 2024|2024-07-26");
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let src = "{{ tools[0] | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ 'é<' | tojson }}{{ 'é' | tojson(ensure_ascii=true) }}{{ tools[0].function | tojson(separators=(',', ':'), sort_keys=true) }}";
    let tools = json!([{"type": "function", "function": {"name": "f", "description": "<b>", "parameters": {}}}]);
    let out = render(src, &[], json!({"tools": tools})).unwrap();
    let want = concat!(
        r#"{"type": "function", "function": {"name": "f", "description": "<b>", "parameters": {}}}"#,
        "\n{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"f\",\n    \"description\": \"<b>\",\n    \"parameters\": {}\n  }\n}\n",
        r#""é<""\u00e9"{"description":"<b>","name":"f","parameters":{}}"#
    );
    assert_eq!(out, want);
}

#[test]
fn python_methods_and_loop_controls() {
    let src = "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.content.strip().upper().split(' ')[-1] }}{% if m.content.startswith(' a') %}!{% endif %}{% endfor %}{% for k, v in extra.items() %}{{ k }}={{ v }}{% endfor %}";
    let msgs =
        [Message::new("user", " a b "), Message::new("user", "skip"), Message::new("user", "c d")];
    assert_eq!(render(src, &msgs, json!({"extra": {"z": 1, "a": 2}})).unwrap(), "B!Dz=1a=2");
}

#[test]
fn context_variables() {
    let src = "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ reasoning_effort | default('medium') }}";
    // Booleans print the Python way, as in Jinja2.
    assert_eq!(render(src, &[], json!(null)).unwrap(), "<s>|</s>|True|True|True|medium");
    assert_eq!(
        render(src, &[], json!({"reasoning_effort": "high", "bos_token": "B"})).unwrap(),
        "B|</s>|True|True|True|high"
    );
    // Extra variables cannot replace the conversation.
    let src = "{{ messages | length }}{{ add_generation_prompt }}";
    assert_eq!(
        render(src, &user("x"), json!({"messages": [], "add_generation_prompt": false})).unwrap(),
        "1True"
    );
    assert!(render(src, &[], json!([1])).is_err());
    // Unknown special tokens are undefined, as in transformers when the tokenizer has none.
    let t = ChatTemplate::new("[{{ bos_token }}]{{ bos_token is defined }}", None, None).unwrap();
    assert_eq!(t.render(&[], false, &json!(null)).unwrap(), "[]False");
}

#[test]
fn from_files_prefers_the_jinja_file_and_reads_added_tokens() {
    let cfg = json!({
        "chat_template": "config:{{ bos_token }}",
        "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": false},
        "eos_token": "<|im_end|>"
    });
    let t = ChatTemplate::from_files(&cfg, None).unwrap();
    assert_eq!(t.bos_token(), Some("<｜begin▁of▁sentence｜>"));
    assert_eq!(t.eos_token(), Some("<|im_end|>"));
    assert_eq!(t.render(&[], false, &json!(null)).unwrap(), "config:<｜begin▁of▁sentence｜>");
    let t = ChatTemplate::from_files(&cfg, Some("file:{{ eos_token }}\n")).unwrap();
    assert_eq!(t.render(&[], false, &json!(null)).unwrap(), "file:<|im_end|>");
}

#[test]
fn from_files_template_lists_and_missing_templates() {
    let cfg = json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "default"}
    ]});
    let t = ChatTemplate::from_files(&cfg, None).unwrap();
    assert_eq!(t.render(&[], false, &json!(null)).unwrap(), "default");
    let err = ChatTemplate::from_files(
        &json!({"chat_template": [{"name": "rag", "template": "x"}]}),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("(rag)"), "{err}");
    let err = ChatTemplate::from_files(&json!({"bos_token": null}), None).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput);
}

// ---------------------------------------------------------------- transformers fixtures

#[derive(Deserialize)]
struct Fixtures {
    now_unix: u64,
    templates: std::collections::BTreeMap<String, FixtureTemplate>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct FixtureTemplate {
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    conversation: String,
    /// As transformers got them: tool calls and tool results included.
    messages: serde_json::Value,
    add_generation_prompt: bool,
    extra: serde_json::Value,
    expected: Option<String>,
    error: Option<String>,
}

#[test]
fn matches_transformers_apply_chat_template() {
    // INFERNO_CHAT_FIXTURES points at another file of the same shape (for exploring templates).
    let path = crate::switches::test_var("INFERNO_CHAT_FIXTURES").unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates.json").into()
    });
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fx: Fixtures = serde_json::from_str(&text).expect("fixture JSON");
    let now = UNIX_EPOCH + Duration::from_secs(fx.now_unix);
    let mut failures = Vec::new();
    for case in &fx.cases {
        let t = &fx.templates[&case.template];
        let tmpl = match ChatTemplate::new(&t.source, t.bos_token.clone(), t.eos_token.clone()) {
            Ok(t) => t.with_clock(move || now),
            Err(e) => {
                failures.push(format!("{}: {e:#}", case.template));
                continue;
            }
        };
        let got = tmpl.render_values(&case.messages, case.add_generation_prompt, &case.extra);
        let label = format!(
            "{} / {} / agp={}",
            case.template, case.conversation, case.add_generation_prompt
        );
        match (&case.expected, &case.error, got) {
            (Some(want), _, Ok(got)) if *want == got => {}
            (Some(want), _, Ok(got)) => {
                failures.push(format!("{label}:\n--- want\n{want}\n--- got\n{got}"))
            }
            (Some(_), _, Err(e)) => failures.push(format!("{label}: {e:#}")),
            (None, Some(msg), Err(e)) if e.to_string().contains(msg.as_str()) => {}
            (None, Some(msg), other) => {
                failures.push(format!("{label}: want error {msg:?}, got {other:?}"))
            }
            (None, None, _) => {
                failures.push(format!("{label}: fixture has neither expected nor error"))
            }
        }
    }
    assert!(fx.cases.len() >= 20, "too few fixture cases");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n\n")
    );
}
