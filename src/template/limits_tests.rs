//! Hostile templates end quickly with a one-line error naming the limit; real templates with
//! long conversations stay well inside the limits.

use super::super::{ChatTemplate, Message};
use crate::error::{ErrorKind, kind_of};
use serde_json::json;
use std::time::{Duration, Instant};

/// Renders `src` over `messages` on a thread with serve's 2 MiB stack; the error's text, and how
/// long the render took.
fn render_err(src: &str, messages: Vec<Message>) -> (String, Duration) {
    let src = src.to_string();
    let run = move || {
        let t0 = Instant::now();
        let t = ChatTemplate::new(&src, None, None).expect("parses");
        let err = t.render(&messages, true, &json!(null)).expect_err("the render is refused");
        assert_eq!(kind_of(&err), ErrorKind::Other, "{err}");
        (err.to_string(), t0.elapsed())
    };
    std::thread::Builder::new().stack_size(2 << 20).spawn(run).unwrap().join().unwrap()
}

#[test]
fn two_nested_loops_of_100000_stop_at_the_step_limit() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let (err, took) = render_err(src, vec![]);
    assert_eq!(
        err,
        "the model's chat template ran past its limit of 1000296 steps for this conversation (a template that never ends?)"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // The same inside a macro and an include, which wrap the error.
    let src = "{% macro f() %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endmacro %}{% if messages %}{{ f() }}{% else %}{% include 'chat_template' %}{% endif %}";
    let (err, _) = render_err(src, vec![Message::new("user", "x")]);
    assert!(err.contains("ran past its limit of"), "{err}");
}

#[test]
fn a_huge_output_stops_at_the_output_limit() {
    let (err, took) =
        render_err("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", vec![]);
    assert!(err.contains("wrote more than 1049168 bytes"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn endless_recursion_stops_at_the_depth_limit_within_a_2_mib_stack() {
    let (err, _) = render_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", vec![]);
    assert!(err.contains("nested calls deeper than 64"), "{err}");
    let (err, _) = render_err("x{% include 'chat_template' %}", vec![]);
    assert!(err.contains("nested calls deeper than 64"), "{err}");
}

#[test]
fn a_render_past_its_deadline_is_answered_in_time() {
    // Each pass sorts 100,000 items in one instruction: seconds of work within little fuel.
    let src = "{% for i in range(2000) %}{{ range(100000) | list | sort | length }}{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    let t0 = Instant::now();
    let ctx = serde_json::Map::new();
    let err = t.render_bounded(ctx, Duration::from_millis(300)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(kind_of(&err), ErrorKind::Other);
    assert_eq!(
        err.to_string(),
        "the model's chat template did not finish within 0.3s for this conversation (a template that never ends?)"
    );
}

#[test]
fn templates_read_no_files() {
    for src in [
        "{% include '/etc/hostname' %}",
        "{% import '/etc/hostname' as h %}",
        "{% extends '/etc/hostname' %}",
        "{% include '../../../../../../etc/hostname' %}",
    ] {
        let t = ChatTemplate::new(src, None, None).unwrap();
        let err = t.render(&[], true, &json!(null)).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::InvalidInput, "{src}: {err}");
        assert!(err.to_string().contains("template not found"), "{src}: {err}");
    }
}

#[test]
fn a_long_conversation_renders_with_real_templates() {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/chat_templates.json")).unwrap();
    let messages: Vec<Message> = (0..20_000)
        .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, "hi"))
        .collect();
    for name in ["smollm2-135m-instruct", "llama3_1-8b-instruct", "qwen3", "gemma3"] {
        let t = &fx["templates"][name];
        let bos = t["bos_token"].as_str().map(str::to_string);
        let eos = t["eos_token"].as_str().map(str::to_string);
        let tmpl = ChatTemplate::new(t["source"].as_str().unwrap(), bos, eos).unwrap();
        let out = tmpl.render(&messages, true, &json!(null));
        let out = out.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.matches("hi").count() >= 20_000, "{name}");
    }
}
