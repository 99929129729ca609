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
    for tail in ["", "{% set c %}{{ ns.l }}{% endset %}", "{{ ns.l == ns.l }}", "{{ [ns.l, ns.l] | sort | length }}", "{{ ns.l | tojson }}", "{{ ns.l | string | length }}"] {
        let src = format!(
            "{{% set ns = namespace(l=[]) %}}{{% for i in range(100000) %}}{{% set ns.l = {wrap} %}}{{% endfor %}}{tail}"
        );
        // Runs out of fuel in the loop, or prints what it nested: no crash either way.
        match render(&src) {
            Ok(_) => {}
            Err(e) => assert!(e.contains("limit") || e.contains("nested more than 1000"), "{tail}: {e}"),
        }
        let src = format!(
            "{{% set ns = namespace(l=[]) %}}{{% for i in range(60000) %}}{{% set ns.l = {wrap} %}}{{% endfor %}}{tail}"
        );
        match render(&src) {
            Ok(_) => {}
            Err(e) => assert!(e.contains("limit") || e.contains("nested more than 1000"), "{tail}: {e}"),
        }
    }
}
