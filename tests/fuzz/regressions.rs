//! Each crash or hang the fuzz targets found, as the smallest input that showed it (named
//! after what it was), so it stays fixed.

use inferno::template::ChatTemplate;

/// Renders `src` with no messages; the error's text, or the output.
fn render(src: &str) -> Result<String, String> {
    let t = ChatTemplate::new(src, None, None).map_err(|e| e.to_string())?;
    t.render(&[], true, &serde_json::Value::Null).map_err(|e| e.to_string())
}

/// template_generated: a list wrapped in a list 100,000 times overflowed the test thread's
/// stack when minijinja dropped it (it drops, prints and compares nested data recursively).
/// Renders now run on a thread whose stack holds the deepest nesting the fuel allows; here as
/// deep as it allows, 20 levels a pass, then printed, compared, sorted and dropped.
#[test]
fn template_nested_list_overflowed_the_stack() {
    let wrap = format!("{}ns.l{}", "[".repeat(20), "]".repeat(20));
    for tail in [
        "",
        "{% set c %}{{ ns.l }}{% endset %}",
        "{{ ns.l == ns.l }}",
        "{{ [ns.l, ns.l] | sort | length }}",
        "{{ ns.l | tojson }}",
        "{{ ns.l | string | length }}",
    ] {
        // 100,000 passes run out of fuel in the loop; 60,000 finish, nesting 1.2 million
        // levels, and print, compare or drop them: an error or text, never a crash.
        for passes in [100_000, 60_000] {
            let src = format!(
                "{{% set ns = namespace(l=[]) %}}{{% for i in range({passes}) %}}{{% set ns.l = {wrap} %}}{{% endfor %}}{tail}"
            );
            if let Err(e) = render(&src) {
                assert!(e.contains("limit") || e.contains("nested more than 1000"), "{tail}: {e}");
            }
        }
    }
}

/// gguf_generated: a GGUF whose `token_embd.weight` has no dimensions panicked (an index out
/// of bounds) where the loader took the vocabulary size from its first dimension.
#[test]
fn gguf_token_embd_without_dimensions_panicked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // metadata entries
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u64).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    };
    string(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    string(&mut b, "qwen3");
    string(&mut b, "token_embd.weight");
    b.extend_from_slice(&0u32.to_le_bytes()); // no dimensions
    b.extend_from_slice(&0u32.to_le_bytes()); // F32
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    b.resize(b.len().next_multiple_of(32) + 32, 0);
    std::fs::write(&path, b).unwrap();
    let opts = inferno::load::LoadOptions {
        dtype: None,
        context: Some(64),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let source = inferno::load::Source::Gguf(path);
    let err = inferno::load::Spec::read(&source, &opts, inferno::load::Target::Host).unwrap_err();
    assert_eq!(err.to_string(), "GGUF file's token_embd.weight has no dimensions");
}

/// template_edited: a tag written `{%}` (its `%}` overlapping its `{%`) panicked, slicing
/// backwards, where `{% generation %}` tags are rewritten before the template compiles: a
/// model folder with such a template crashed `play` and `serve` as they loaded it.
#[test]
fn template_tag_closing_inside_its_opening_panicked() {
    for src in ["{%} for t in tools %}", "{%}", "a{%", "{%-}x{%+%}", "{% generation %}{%}"] {
        match render(src) {
            Ok(out) => assert!(!out.contains("generation"), "{src}: {out}"),
            Err(e) => assert!(e.starts_with("chat template does not parse"), "{src}: {e}"),
        }
    }
}

/// template_generated: `{% break %}` inside a `{% with %}` inside a loop panics inside
/// minijinja 3.0.5 (`PopLoopFrame` unwraps the `with` block's frame as a loop's). The panic
/// stays on the render's thread: the render fails with one line, the process goes on.
#[test]
fn template_break_inside_with_panicked_inside_minijinja() {
    let src = "{% for i in range(3) %}{% with a = 1 %}{% break %}{% endwith %}{% endfor %}";
    assert_eq!(render(src).unwrap_err(), "the chat template's render panicked");
    assert_eq!(render("{% for i in range(3) %}{{ i }}{% endfor %}").unwrap(), "012");
}
