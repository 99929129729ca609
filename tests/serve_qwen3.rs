//! Qwen3 through `inferno serve` with the official `openai` client: the tiny Qwen3 fixture
//! speaking through Qwen3's real tokenizer and chat template (tests/common), its replies forced
//! (`INFERNO_TEST_HOOKS`) so that they hold what a real Qwen3 writes: reasoning, Hermes
//! `<tool_call>` blocks, answers. The prompts a call's result and thinking-off render are
//! transformers' own (tests/fixtures/chat_templates.json), tokenized as the server tokenizes a
//! chat.

mod common;

use common::serve::Server;
use serde_json::json;

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the Qwen3 tokenizer: scripts/test.sh"
)]
fn qwen3_reasoning_tool_calls_and_structured_outputs_through_the_openai_client() {
    let dir = common::tiny_qwen3_with_template(4096);
    let s = Server::start(dir.path(), &["--context", "4096"], &[("INFERNO_TEST_HOOKS", "1")]);
    let round_trip = common::template_case("qwen3", |c| c["conversation"] == "tool_round_trip");
    let thinking_off = common::template_case("qwen3", |c| c["extra"]["enable_thinking"] == false);
    let r = s.python(
        "qwen3_replies",
        json!({
            "tools": round_trip["extra"]["tools"],
            "messages": round_trip["messages"],
            "thinking_messages": thinking_off["messages"],
        }),
    );
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let ids = |c: &serde_json::Value| {
        json!(tok.encode(c["expected"].as_str().unwrap(), false).unwrap().get_ids())
    };
    assert_eq!(r["with_result"], ids(&round_trip), "the call and its result, rendered");
    assert_eq!(r["thinking_off"], ids(&thinking_off), "enable_thinking false, rendered");
}
