//! Structured outputs through `inferno serve` and the real `openai` client, validated by the
//! real `jsonschema` package (tests/python/structured_client.py): twenty JSON schemas with the
//! real SmolLM2-135M-Instruct weights on the CPU, greedy and sampled, streamed and not;
//! json_object, regex, choice and Lark grammars (vLLM's field names), on chat and completions;
//! pydantic through `chat.completions.parse`; bad values as 400s naming the field; forced tool
//! calls (`tool_choice` required and named) on a Llama 3.1 template model; and gpt-oss (tiny,
//! random weights), whose final answer follows the schema after free reasoning.

mod common;

use common::serve::Server;
use serde_json::json;

fn smollm2() -> Server {
    let model = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    Server::start(&model, &["--context", "1024", "--kv-tokens", "16384", "--max-seqs", "8"], &[])
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn twenty_json_schemas_validate_greedy_and_sampled() {
    let s = smollm2();
    let r = s.python_script("structured_client.py", "json_schemas", json!({"max_tokens": 300}));
    assert_eq!(r["replies"].as_array().map(Vec::len), Some(40), "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the SmolLM2 GGUF: scripts/test.sh"
)]
fn json_object_regex_choice_grammar_pydantic_and_bad_values() {
    let s = smollm2();
    let r = s.python_script("structured_client.py", "other_formats", json!({}));
    assert!(r["pet"]["kind"] == "cat" || r["pet"]["kind"] == "dog", "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the Llama 2 tokenizer: scripts/test.sh"
)]
fn forced_tool_calls_name_an_offered_tool_with_valid_arguments() {
    let dir = common::tiny_llama_with_template("llama3_1-8b-instruct");
    let s = Server::start(dir.path(), &["--context", "1024"], &[]);
    let r = s.python_script("structured_client.py", "forced_tools", json!({}));
    let calls = r["calls"].as_array().unwrap();
    assert!(calls.len() >= 6, "{r}");
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the python clients and the gpt-oss tokenizer: scripts/test.sh"
)]
fn gpt_oss_answers_follow_the_schema_after_free_reasoning() {
    let model = common::tiny_gpt_oss_full_vocab();
    let s = Server::start(
        &model,
        &["--dtype", "f32", "--context", "2048", "--kv-tokens", "8192"],
        &[("INFERNO_TEST_HOOKS", "1")],
    );
    let r = s.python_script("structured_client.py", "harmony_json", json!({}));
    assert_eq!(r["replies"].as_array().map(Vec::len), Some(10), "{r}");
    // The schema is in the developer message, under `# Response Formats` (openai-harmony).
    let tok = tokenizers::Tokenizer::from_file(common::asset(
        "gptoss-tokenizer.json",
        "scripts/assets/gptoss-tokenizer.sh",
    ))
    .unwrap();
    let ids: Vec<u32> =
        r["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let prompt = tok.decode(&ids, false).unwrap();
    assert!(
        prompt.contains("<|start|>developer<|message|># Response Formats\n\n## s15\n\n{"),
        "{prompt}"
    );
}
