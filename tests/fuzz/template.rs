//! The chat-template renderer (src/template) with hostile templates: generated ones that nest
//! loops, recursion, includes, big repetitions and Python methods, and the real templates of
//! tests/fixtures/chat_templates.json with their bytes edited. Every render must end (within
//! the step, output and depth limits) with text or a one-line error; none may panic. Single
//! builtins stay small here (`range(1000) | sum`): one as big as minijinja allows inside a long
//! loop only meets the render deadline, and runs on unseen (src/template/limits.rs). A string
//! doubled on each pass (`ns.s = ns.s ~ ns.s`), or data that holds the last pass's twice
//! (`ns.l = [ns.l, ns.l]`, whose printing doubles each pass) is left out: printed into a macro's
//! output, which minijinja keeps in memory unbounded, it takes exponential time and memory, the
//! one hole the limits leave (bounding memory needs a separate process).

use std::time::{Duration, Instant};

use inferno::template::{ChatTemplate, Message};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::run::{apply, edits, fuzz};

/// Expressions and statements that cost time, memory or stack, or reach outside.
const LEAVES: &[&str] = &[
    "{{ messages }}",
    "{{ messages[0].content }}",
    "{{ messages[-1]['content'].upper() }}",
    "{{ 'x' * 10000 }}",
    "{{ [1, 2] * 1000 }}",
    "{{ range(1000) | list | length }}",
    "{{ range(1000) | sum }}",
    "{{ tools | tojson(indent=4) }}",
    "{{ messages | tojson }}",
    "{{ raise_exception('no') }}",
    "{{ strftime_now('%Y %% %Q %-d') }}",
    "{{ messages | map(attribute='content') | join(',') }}",
    "{{ x.y.z }}",
    "{{ 1 / 0 }}",
    "{{ 2 ** 100000 }}",
    "{{ 'a'.center(1000000) }}",
    "{{ 'ab'.replace('', 'xxxx') }}",
    "{{ 'a b c'.split(' ') | reverse | list }}",
    "{{ debug() }}",
    "{{ namespace(a=1) }}",
    "{% set ns.s = ns.s ~ 'ab' %}",
    "{% set ns.l = [ns.l] %}",
    "{% set ns.l = [[[[[[[[[[ns.l]]]]]]]]]] %}",
    "{% set ns.l = {'k': ns.l, 'v': [1]} %}",
    "{{ ns.l == ns.l }}",
    "{{ ns.l | tojson }}",
    "{{ [ns.l] | sort | length }}",
    "{{ ns.l }}",
    "{% include 'chat_template' %}",
    "{% include '/etc/hostname' %}",
    "{% import 'chat_template' as t %}",
    "{{ self }}",
    "{{ loop.index }}",
    "{{ f(3) }}",
    "{% break %}",
    "{{ m.content }}",
    "{{ tools[0].function.parameters | tojson }}",
    "{{ bos_token ~ eos_token }}",
    "{{ '%s %d' % (1, 'a') }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ {'a': ns} | items | list }}",
    "plain text ",
];

const COUNTS: &[&str] = &["0", "1", "10", "1000", "100000", "-5", "1e9", "messages | length"];

fn template() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(LEAVES).prop_map(str::to_string);
    leaf.prop_recursive(4, 24, 4, |inner| {
        let body = prop::collection::vec(inner, 1..4).prop_map(|v| v.concat());
        prop_oneof![
            (prop::sample::select(COUNTS), body.clone())
                .prop_map(|(n, b)| format!("{{% for i in range({n}) %}}{b}{{% endfor %}}")),
            body.clone().prop_map(|b| format!("{{% for m in messages %}}{b}{{% endfor %}}")),
            body.clone().prop_map(|b| format!("{{% if messages %}}{b}{{% else %}}x{{% endif %}}")),
            body.clone().prop_map(|b| format!(
                "{{% macro f(n) %}}{b}{{{{ f(n + 1) }}}}{{% endmacro %}}{{{{ f(0) }}}}"
            )),
            body.clone().prop_map(|b| format!("{{% filter upper %}}{b}{{% endfilter %}}")),
            body.clone()
                .prop_map(|b| format!("{{% set cap %}}{b}{{% endset %}}{{{{ cap ~ cap }}}}")),
            body.prop_map(|b| format!("{{% with a = 1 %}}{b}{{% endwith %}}")),
        ]
    })
    .prop_map(|t| format!("{{% set ns = namespace(s='ab', l=[]) %}}{t}"))
}

fn conversation() -> (Vec<Value>, Value) {
    let messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "hi <|im_end|> {{ 1 }}"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}),
        json!({"role": "tool", "content": "42", "tool_call_id": "c1"}),
    ];
    let tools = json!({"tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]});
    (messages, tools)
}

/// Renders `src` (when it compiles) on the conversation, twice; an error is fine, a render
/// that does not answer within [`ANSWERED_WITHIN`] is not.
fn render(src: &str) -> Result<(), TestCaseError> {
    let Ok(t) = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())) else {
        return Ok(());
    };
    let (messages, extra) = conversation();
    let renders: [&dyn Fn(); 2] =
        [&|| drop(t.render_values(&Value::Array(messages.clone()), true, &extra)), &|| {
            drop(t.render(&[Message::new("user", "x")], false, &Value::Null))
        }];
    for r in renders {
        let t0 = Instant::now();
        r();
        let took = t0.elapsed();
        prop_assert!(took < ANSWERED_WITHIN, "a render answered after {took:?}");
    }
    let _ = t.uses_variable("tools");
    Ok(())
}

/// Every render answers within the render deadline (10 s), with a margin for a busy machine.
const ANSWERED_WITHIN: Duration = Duration::from_secs(12);

#[test]
fn generated_hostile_templates() {
    fuzz("template_generated", 1500, 2 * ANSWERED_WITHIN, template(), |src| render(&src));
}

#[test]
fn real_templates_edited() {
    let fx: Value = serde_json::from_str(include_str!("../fixtures/chat_templates.json")).unwrap();
    let sources: Vec<String> = fx["templates"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["source"].as_str().unwrap().to_string())
        .collect();
    let strategy = (0..sources.len(), edits(6));
    fuzz("template_edited", 3000, 2 * ANSWERED_WITHIN, strategy, |(i, e)| {
        let bytes = apply(sources[i].as_bytes(), &e);
        render(&String::from_utf8_lossy(&bytes))
    });
}
