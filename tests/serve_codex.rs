//! The real Codex CLI (`@openai/codex`, pinned and installed by scripts/test.sh, which sets
//! INFERNO_CODEX) against `inferno serve` over the Responses API, on 127.0.0.1 only: a custom
//! provider in a temporary CODEX_HOME, `codex exec` with forced replies from the test queue
//! (`INFERNO_TEST_REPLIES`, Codex cannot add fields to its requests). One turn that answers;
//! one that calls Codex's shell tool, which Codex runs, sends the output back, and the forced
//! final answer is printed. Codex is killed if it runs past a bound.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::serve::Server;

const LIMIT: Duration = Duration::from_secs(300);

fn codex_bin() -> PathBuf {
    let bin = std::env::var_os("INFERNO_CODEX").map(PathBuf::from);
    match bin.filter(|b| b.exists()) {
        Some(b) => b,
        None => panic!(
            "INFERNO_CODEX does not name the Codex CLI: run scripts/test.sh, or `export INFERNO_CODEX=$(bash scripts/assets/codex-cli.sh)`"
        ),
    }
}

/// A server on `model` (the tiny gpt-oss unless given) whose replies are `replies`, in order;
/// `-v` logs the tool outputs each request brings back.
fn server(dir: &Path, replies: &[&str]) -> Server {
    server_on(&common::tiny_gpt_oss_full_vocab(), dir, replies)
}

fn server_on(model: &Path, dir: &Path, replies: &[&str]) -> Server {
    let file = dir.join("replies.json");
    std::fs::write(&file, serde_json::to_string(replies).unwrap()).unwrap();
    let args = ["--dtype", "f32", "--context", "16384", "--kv-tokens", "16384", "--max-seqs", "2"];
    Server::start(
        model,
        &args,
        &[
            ("INFERNO_TEST_HOOKS", "1"),
            ("INFERNO_TEST_REPLIES", file.to_str().unwrap()),
            ("INFERNO_LOG", "inferno=debug"),
        ],
    )
}

/// `codex exec PROMPT` with a CODEX_HOME whose provider is the server; killed past LIMIT.
fn codex(s: &Server, dir: &Path, prompt: &str) -> Output {
    codex_on(&common::tiny_gpt_oss_full_vocab(), s, dir, prompt)
}

fn codex_on(model: &Path, s: &Server, dir: &Path, prompt: &str) -> Output {
    let home = dir.join("codex-home");
    std::fs::create_dir_all(&home).unwrap();
    let alias = model.file_name().unwrap().to_str().unwrap().to_string();
    let config = format!(
        r#"model = "{alias}"
model_provider = "inferno"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"
[analytics]
enabled = false
[feedback]
enabled = false
[model_providers.inferno]
name = "inferno"
base_url = "{}/v1"
env_key = "INFERNO_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"#,
        s.url()
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mut child = Command::new(codex_bin())
        .args(["exec", "--skip-git-repo-check", prompt])
        .current_dir(&work)
        .env("CODEX_HOME", &home)
        .env("INFERNO_API_KEY", "unused")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn codex");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "codex ran past {LIMIT:?}:\n{}\n{}\n--- server ---\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                s.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the Codex CLI and the gpt-oss tokenizer: scripts/test.sh"
)]
fn codex_completes_a_turn() {
    let dir = tempfile::tempdir().unwrap();
    let s =
        server(dir.path(), &["<|channel|>final<|message|>Hello from inferno, forced.<|return|>"]);
    let out = codex(&s, dir.path(), "Say hello.");
    assert!(out.status.success(), "{}\n--- server ---\n{}", text(&out), s.log());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Hello from inferno, forced."), "{}", text(&out));
    assert!(s.log().contains("/v1/responses 200 stop (stream)"), "{}", s.log());
}

#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the Codex CLI and the gpt-oss tokenizer: scripts/test.sh"
)]
fn codex_runs_a_tool_call_and_sends_its_output_back() {
    // The command's output (42-ran) is not in its arguments: only running it makes it.
    let call = "<|channel|>analysis<|message|>Run the command.<|end|><|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json<|message|>{\"cmd\": \"echo $((6*7))-ran\"}<|call|>";
    let answer = "<|channel|>final<|message|>The command printed its line. Finished-7.<|return|>";
    tool_round_trip(&common::tiny_gpt_oss_full_vocab(), &[call, answer]);
}

/// Codex runs the tool call of the first reply on `model`, sends its output back, and prints
/// the second reply's answer.
fn tool_round_trip(model: &Path, replies: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let s = server_on(model, dir.path(), replies);
    let out = codex_on(model, &s, dir.path(), "Run echo for me.");
    assert!(out.status.success(), "{}\n--- server ---\n{}", text(&out), s.log());
    let log = s.log();
    let outputs: Vec<&str> = log.lines().filter(|l| l.contains("function_call_output")).collect();
    assert!(outputs.iter().any(|l| l.contains("42-ran")), "no tool output came back:\n{log}");
    assert!(log.contains("/v1/responses 200 tool_calls (stream)"), "{log}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Finished-7."), "{}", text(&out));
}

/// The same tool-call turn on Qwen3 (its real tokenizer and template): the call comes as a
/// Hermes `<tool_call>` block after its reasoning, which the server reads as Codex's function
/// call.
#[test]
#[cfg_attr(
    not(feature = "conformance"),
    ignore = "needs the Codex CLI and the Qwen3 tokenizer: scripts/test.sh"
)]
fn codex_runs_a_qwen3_tool_call_and_sends_its_output_back() {
    let model = common::tiny_qwen3_with_template(16384);
    // Queued replies end where their text does: <|im_end|> ends them as the model would.
    let call = "<think>\nRun the command.\n</think>\n\n<tool_call>\n{\"name\": \"exec_command\", \"arguments\": {\"cmd\": \"echo $((6*7))-ran\"}}\n</tool_call><|im_end|>";
    let answer =
        "<think>\nIt ran.\n</think>\n\nThe command printed its line. Finished-7.<|im_end|>";
    tool_round_trip(model.path(), &[call, answer]);
}
