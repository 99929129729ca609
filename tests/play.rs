//! `inferno play` driven as a user drives it: one-shot prompts, stdin, and an interactive
//! two-turn chat in a pseudo-terminal with Ctrl+C in the middle of a reply. Runs on the CPU
//! (`--cpu`) with the real SmolLM2-135M-Instruct weights, greedy, and compares the replies with
//! transformers' greedy output on the same weights (tests/fixtures/smollm2_reference.json).

mod common;

use std::path::PathBuf;
use std::process::Command;

use rexpect::session::spawn_command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_inferno")
}

/// The real GGUF converted to an HF folder by `inferno convert` (once per test process).
fn model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::process_tempdir();
        let gguf =
            common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
        let out =
            Command::new(bin()).arg("convert").arg(&gguf).arg(&dir).output().expect("convert");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        dir
    })
    .clone()
}

/// transformers' greedy reply to chat case `i`, up to the end-of-turn token.
fn reference_reply(i: usize) -> String {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/smollm2_reference.json")).unwrap();
    let cases: Vec<&serde_json::Value> =
        fx["greedy"].as_array().unwrap().iter().filter(|c| c["kind"] == "chat").collect();
    let text = cases[i]["text"].as_str().unwrap();
    text.split("<|im_end|>").next().unwrap().to_string()
}

fn play(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.arg("play").arg(model_dir()).args(["--cpu", "--temperature", "0"]).args(args);
    cmd.env("XDG_STATE_HOME", std::env::temp_dir().join("inferno-test-state"));
    if let Some(input) = stdin {
        use std::io::Write;
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        return child.wait_with_output().unwrap();
    }
    cmd.output().expect("run play")
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn one_shot_prints_only_the_reply_and_matches_transformers() {
    let out = play(&["--max-tokens", "40", "--prompt", "What is the capital of Germany?"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), reference_reply(0));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn stdin_prompt_with_a_system_prompt() {
    let out = play(
        &["--max-tokens", "40", "--system", "You are a concise assistant."],
        Some("Name three primary colors."),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), reference_reply(1));
}

/// `echo "…" | inferno play` asks what `--prompt "…"` asks: the newline `echo` adds is not part
/// of the message. Kept, the template rendered "…France?\n" and SmolLM2 answered otherwise.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_prompt_on_stdin_is_the_same_prompt_as_with_prompt() {
    let question = "What is the capital of France?";
    let args = ["-v", "--max-tokens", "40"];
    let given = play(&[&args[..], &["--prompt", question]].concat(), None);
    for input in [format!("{question}\n"), format!("{question}\r\n")] {
        let piped = play(&args, Some(&input));
        for out in [&given, &piped] {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        assert_eq!(common::stdout(&piped), common::stdout(&given), "{input:?}");
        // The stats line (-v) ends "context USED/MAX", USED = prompt + reply tokens: with equal
        // replies, equal prompt lengths.
        let context = |o: &std::process::Output| {
            let err = common::stderr(o);
            err.rsplit_once("context ").map(|(_, c)| c.trim().to_string()).unwrap_or(err)
        };
        assert_eq!(context(&piped), context(&given), "{input:?}");
    }
    // Nothing to answer: a clear error, not a reply to an empty message.
    let empty = play(&[], Some("\n"));
    assert_eq!(empty.status.code(), Some(2), "{}", common::stderr(&empty));
    assert!(common::stderr(&empty).contains("stdin is empty"), "{}", common::stderr(&empty));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn raw_completion_continues_the_text() {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/smollm2_reference.json")).unwrap();
    let case =
        fx["greedy"].as_array().unwrap().iter().find(|c| c["prompt"] == "1, 2, 3, 4,").unwrap();
    let steps = case["tokens"].as_array().unwrap().len().to_string();
    let out = play(&["--raw", "--max-tokens", &steps, "--prompt", "1, 2, 3, 4,"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        case["text"].as_str().unwrap().trim_end()
    );
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn errors_are_one_line_with_exit_codes() {
    let cache = tempfile::tempdir().unwrap();
    let out =
        common::inferno(cache.path(), None, &["play", "org/not-here", "--cpu", "-p", "hi"], &[]);
    assert_eq!(out.status.code(), Some(3));
    let err = common::stderr(&out);
    assert!(err.contains("inferno download org/not-here") && err.lines().count() == 1, "{err}");
    // No GPU here and no --cpu: a clear error, never a silent CPU run.
    if std::env::var_os("INFERNO_GPU_TESTS").is_none() {
        let dir = model_dir();
        let out =
            common::inferno(cache.path(), None, &["play", dir.to_str().unwrap(), "-p", "hi"], &[]);
        assert_eq!(out.status.code(), Some(8), "{}", common::stderr(&out));
        // The GPU build finds only the stub libcuda it links against in CI, or none at all; a
        // CPU-only build says what it was built without.
        let why = if cfg!(feature = "cuda") { "no NVIDIA driver" } else { "built without CUDA" };
        assert!(common::stderr(&out).contains(why), "{}", common::stderr(&out));
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn interactive_two_turn_chat_and_ctrl_c() {
    let mut cmd = Command::new(bin());
    cmd.arg("play").arg(model_dir()).args(["--cpu", "--temperature", "0", "--max-tokens", "400"]);
    cmd.env("XDG_STATE_HOME", tempfile::tempdir().unwrap().keep());
    let mut p = spawn_command(cmd, Some(60_000)).expect("spawn in a pty");
    p.exp_string("/help").unwrap();
    p.exp_string(">>> ").unwrap();

    p.send_line("What is the capital of Germany?").unwrap();
    p.exp_string(&reference_reply(0)).unwrap();
    // (rexpect reads bytes: the "·" separators are matched as \S+)
    p.exp_regex(r"decode [0-9.]+ tok/s \S+ \d+ tokens \S+ eos").unwrap();
    p.exp_string(">>> ").unwrap();

    // Second turn: the model sees the first (it answers in context; we check the turn completes).
    p.send_line("And the capital of France?").unwrap();
    p.exp_regex(r"tokens \S+ (eos|max tokens) \S+ context \d+/8192").unwrap();
    p.exp_string(">>> ").unwrap();

    // Ctrl+C in the middle of a long reply returns to the prompt.
    p.send_line("Write a very long story about a dragon who learns to bake bread.").unwrap();
    // Past the echo of the typed line, then some reply text: the reply is streaming now.
    p.exp_string("bake bread.").unwrap();
    p.exp_regex(r"\n[^\n]*[A-Za-z]+ [A-Za-z]+ [A-Za-z]+ ").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("interrupted").unwrap();
    p.exp_string(">>> ").unwrap();

    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

/// `/stats` and `/set` answer every time: a setting only shows in later replies, so a silent
/// command looks like one that did nothing.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn stats_and_set_say_what_they_did() {
    let mut cmd = Command::new(bin());
    cmd.arg("play").arg(model_dir()).args(["--cpu", "--temperature", "0", "--max-tokens", "400"]);
    cmd.env("XDG_STATE_HOME", tempfile::tempdir().unwrap().keep());
    let mut p = spawn_command(cmd, Some(60_000)).expect("spawn in a pty");
    p.exp_string(">>> ").unwrap();

    p.send_line("/stats").unwrap();
    p.exp_string("(stats off)").unwrap();
    p.exp_string(">>> ").unwrap();
    p.send_line("What is the capital of Germany?").unwrap();
    p.exp_string(&reference_reply(0)).unwrap();
    let after_reply = p.exp_string(">>> ").unwrap();
    assert!(!after_reply.contains("tok/s"), "stats line while off: {after_reply:?}");
    p.send_line("/stats").unwrap();
    p.exp_string("(stats on)").unwrap();
    p.send_line("/stats maybe").unwrap();
    p.exp_string("usage: /stats [on|off]").unwrap();
    p.send_line("/reasoning hide").unwrap();
    p.exp_string("(reasoning hidden)").unwrap();

    // (rexpect reads bytes: the "→" is matched as \S+)
    p.send_line("/set max_tokens 6").unwrap();
    p.exp_regex(r"\(max_tokens 400 \S+ 6\)").unwrap();
    p.send_line("/set temperature 0.2").unwrap();
    p.exp_regex(r"\(temperature 0 \(greedy\) \S+ 0\.2\)").unwrap();
    p.send_line("/set temperature 0").unwrap();
    p.exp_regex(r"\(temperature 0\.2 \S+ 0 \(greedy\)\)").unwrap();
    p.send_line("/set top_k 0").unwrap();
    p.exp_regex(r"\(top_k 40 \S+ off\)").unwrap();
    p.send_line("/set top_k 0").unwrap();
    p.exp_string("(top_k off, unchanged)").unwrap();
    p.send_line("/set temperature warm").unwrap();
    p.exp_string("error: temperature takes a number, not \"warm\"").unwrap();
    p.send_line("/set top_p 2").unwrap();
    p.exp_string("error: top-p must be in (0, 1], not 2").unwrap();
    p.send_line("/set colour 3").unwrap();
    p.exp_string("error: unknown setting \"colour\"").unwrap();
    p.send_line("/set").unwrap();
    p.exp_regex(
        r"\(temperature 0 \(greedy\), top_k off, top_p 0\.95, min_p 0\.05, repeat_penalty 1, max_tokens 6, seed \d+\)",
    )
    .unwrap();

    // The stats line is back, and the new max_tokens holds.
    p.send_line("And the capital of France?").unwrap();
    p.exp_regex(r"decode [0-9.]+ tok/s \S+ 6 tokens \S+ max tokens").unwrap();
    p.exp_string(">>> ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}

/// A play session in a pseudo-terminal with its own state folder (conversations, history).
fn pty_play(state: &std::path::Path, args: &[&str]) -> rexpect::session::PtySession {
    let mut cmd = Command::new(bin());
    cmd.arg("play").arg(model_dir()).args(["--cpu", "--temperature", "0"]);
    cmd.args(args).env("XDG_STATE_HOME", state);
    spawn_command(cmd, Some(120_000)).expect("spawn in a pty")
}

/// Sends `message` and returns (the reply as shown, the numbers of its stats line: prefilled
/// tokens, cached tokens, context used).
fn exchange(p: &mut rexpect::session::PtySession, message: &str) -> (String, [usize; 3]) {
    p.send_line(message).unwrap();
    p.exp_string(message).unwrap();
    // (rexpect reads bytes: the "·" separators are matched as \S+)
    let (reply, _) = p.exp_regex(r"ttft \d+ ms \S+ prefill ").unwrap();
    let numbers = p.exp_string(">>> ").unwrap();
    let re =
        regex::Regex::new(r"^(\d+) tokens at \d+ tok/s, (\d+) cached .* context (\d+)/").unwrap();
    let caps = re.captures(&numbers).unwrap_or_else(|| panic!("stats line: {numbers:?}"));
    let n = |i: usize| caps[i].parse::<usize>().unwrap();
    let ansi = regex::Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap();
    (ansi.replace_all(&reply, "").trim().to_string(), [n(1), n(2), n(3)])
}

/// A conversation saved and resumed: chat, `/save`, quit, `--resume`, and the next turn is the
/// one an uninterrupted chat gives (greedy), prefilling only the new message.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_saved_conversation_resumes_as_if_never_left() {
    let state = tempfile::tempdir().unwrap();
    let first = "What is the capital of Germany?";
    let second = "And the capital of France?";

    let mut p = pty_play(state.path(), &["--max-tokens", "60"]);
    p.exp_string(">>> ").unwrap();
    let (reply, _) = exchange(&mut p, first);
    assert_eq!(reply, reference_reply(0));
    p.send_line("/save ../geo").unwrap();
    p.exp_string("is not a conversation name").unwrap();
    p.send_line("/load nothing-saved").unwrap();
    p.exp_string("no saved conversation \"nothing-saved\"").unwrap();
    p.send_line("/save geo").unwrap();
    p.exp_string("(saved as geo: ").unwrap();
    p.send_line("/list").unwrap();
    p.exp_regex(r"\ngeo\r?\n").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_string("(kept as last").unwrap();
    p.exp_eof().unwrap();
    let file = state.path().join("inferno/conversations/geo.json");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["messages"][1]["content"], reference_reply(0));
    assert_eq!(saved["settings"]["temperature"], 0.0);

    let mut p = pty_play(state.path(), &["--max-tokens", "60", "--resume", "geo"]);
    p.exp_string("(resumed geo: 2 messages").unwrap();
    p.exp_string(">>> ").unwrap();
    let (resumed, [prefilled, cached, _]) = exchange(&mut p, second);
    // The first turn came from the prefix cache; only the new message (and the partial block
    // before it) was run.
    assert!(cached >= 32 && prefilled < 40, "prefilled {prefilled}, cached {cached}");
    p.send_line("/list").unwrap();
    p.exp_regex(r"\nlast\r?\ngeo\r?\n").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();

    let mut p = pty_play(state.path(), &["--max-tokens", "60"]);
    p.exp_string(">>> ").unwrap();
    exchange(&mut p, first);
    let (uninterrupted, _) = exchange(&mut p, second);
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(resumed, uninterrupted);
    assert!(!resumed.is_empty());
}

fn conversation_json(model: &str, role: &str) -> String {
    serde_json::json!({
        "version": 1,
        "model": model,
        "format": "chat",
        "settings": {
            "temperature": 0.0, "top_k": null, "top_p": null, "min_p": null,
            "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "seed": 1, "max_tokens": 40
        },
        "messages": [
            {"role": role, "content": "What is the capital of Germany?"},
            {"role": "assistant", "content": "Berlin."}
        ]
    })
    .to_string()
}

/// A corrupt or hand-edited file, a name that leaves the folder, a name not saved: one line
/// each and play's exit codes for bad input (2) and a missing thing (3), before the model loads.
/// Another model's file loads with a warning.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn bad_conversation_files_and_names_are_one_line() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("inferno/conversations");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("corrupt.json"), "{ \"version\": 1, \"messages\": [").unwrap();
    std::fs::write(dir.join("robot.json"), conversation_json("m", "robot")).unwrap();
    std::fs::write(dir.join("other.json"), conversation_json("someone/else", "user")).unwrap();
    let run = |name: &str| {
        let mut cmd = Command::new(bin());
        cmd.arg("play").arg(model_dir()).args(["--cpu", "-p", "hi", "--resume", name]);
        cmd.env("XDG_STATE_HOME", state.path()).output().unwrap()
    };
    for (name, code, says) in [
        ("corrupt", 2, "corrupt.json: EOF while parsing"),
        ("robot", 2, "message 1 has role \"robot\""),
        ("../../etc/passwd", 2, "is not a conversation name"),
        ("..", 2, "is not a conversation name"),
        ("a\u{7}b", 2, "is not a conversation name"),
        ("not-saved", 3, "no saved conversation \"not-saved\""),
    ] {
        let out = run(name);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{name}: {err}");
        assert!(err.contains(says) && err.lines().count() == 1, "{name}: {err}");
    }
    let out = run("other");
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: other was saved with someone/else; continuing it with "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!common::stdout(&out).trim().is_empty());
}

/// Past the context, play drops the oldest turns with a notice and keeps answering (it used to
/// refuse: "the prompt is N tokens, the context holds M").
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_conversation_longer_than_the_context_drops_its_oldest_turns() {
    let state = tempfile::tempdir().unwrap();
    let mut p = pty_play(state.path(), &["--context", "128", "--max-tokens", "24"]);
    p.exp_string(">>> ").unwrap();
    let questions = [
        "What is the capital of Germany?",
        "Name three primary colors.",
        "What is the capital of France?",
        "How many legs does a spider have?",
        "What is the largest planet?",
        "What is the capital of Italy?",
    ];
    let context = regex::Regex::new(r"context (\d+)/128").unwrap();
    let mut dropped = 0;
    for q in questions {
        p.send_line(q).unwrap();
        p.exp_string(q).unwrap();
        let (before, _) = p.exp_regex(r"ttft \d+ ms").unwrap();
        if before.contains("(the conversation outgrew the 128-token context: dropped the oldest") {
            dropped += 1;
        }
        let rest = p.exp_string(">>> ").unwrap();
        let used: usize = context.captures(&rest).unwrap()[1].parse().unwrap();
        assert!(used <= 128, "{rest}");
    }
    assert!(dropped >= 2, "turns were dropped {dropped} times");
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
}
