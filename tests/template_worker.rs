//! Chat templates rendered in worker processes (`inferno template-worker`): a template that
//! doubles a string each pass, or one that is merely slow, gets its one line quickly, the next
//! render still works, no worker is left a zombie, and the transformers fixtures render
//! byte-identically through a worker. The process-level checks through `inferno serve` are in
//! tests/serve_template.rs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, UNIX_EPOCH};

use inferno::error::{ErrorKind, kind_of};
use inferno::template::{ChatTemplate, Message, worker};
use serde_json::json;

/// Renders in workers from now on; the guard keeps the tests of this file one at a time (they
/// count and kill this process's children).
fn sandboxed() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    worker::enable(PathBuf::from(env!("CARGO_BIN_EXE_inferno")));
    guard
}

const DOUBLING: &str = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
const DOUBLING_DATA: &str = "{% macro p(l) %}{{ l }}{% endmacro %}{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = [ns.l, ns.l] %}{% set _ = p(ns.l) %}{% endfor %}";
/// 100 MB more on each pass (minijinja's largest repetition), within its step limit.
const GROWING: &str = "{% set ns = namespace(s='') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ('x' * 100000000) %}{% endfor %}{{ ns.s | length }}";
/// Each pass sorts 100,000 items in one instruction: seconds of work within little fuel.
const SLOW: &str =
    "{% for i in range(2000) %}{{ range(100000) | list | sort | length }}{% endfor %}";

fn hi() -> Vec<Message> {
    vec![Message::new("user", "hi")]
}

/// This process's children and their states (`R`, `S`, `Z`, …) from /proc.
fn children() -> BTreeMap<u32, char> {
    let mut out = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) S …`: the state follows the last ')'.
            let state = stat.rsplit(')').next().and_then(|r| r.trim().chars().next());
            out.insert(pid, state.unwrap_or('?'));
        }
    }
    out
}

fn assert_no_zombie() {
    let kids = children();
    assert!(kids.values().all(|&s| s != 'Z'), "zombie children: {kids:?}");
}

#[test]
fn a_template_that_doubles_a_string_gets_its_memory_line_and_the_next_render_works() {
    let _one = sandboxed();
    for src in [DOUBLING, GROWING] {
        let t = ChatTemplate::new(src, None, None).unwrap();
        let t0 = Instant::now();
        let err = t.render(&hi(), true, &json!(null)).unwrap_err();
        let took = t0.elapsed();
        assert_eq!(kind_of(&err), ErrorKind::Other, "{err}");
        assert_eq!(
            err.to_string(),
            "the model's chat template used more than 1024 MiB of memory for this conversation (a template that never ends?)",
            "{src}"
        );
        assert!(took < Duration::from_secs(5), "{src}: took {took:?}");
        let ok = ChatTemplate::new("{{ messages[0].content }}!", None, None).unwrap();
        assert_eq!(ok.render(&hi(), true, &json!(null)).unwrap(), "hi!");
    }
    assert_no_zombie();
}

#[test]
fn doubling_data_printed_into_a_macro_stops_at_a_limit() {
    let _one = sandboxed();
    // Printing 2^n items takes time as well as memory: whichever limit comes first.
    let t = ChatTemplate::new(DOUBLING_DATA, None, None).unwrap();
    let t = t.with_time_limit(Duration::from_secs(2));
    let t0 = Instant::now();
    let err = t.render(&hi(), true, &json!(null)).unwrap_err().to_string();
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    assert!(
        err.contains("used more than 1024 MiB") || err.contains("did not finish within 2s"),
        "{err}"
    );
    assert_no_zombie();
}

#[test]
fn a_slow_template_is_killed_at_its_deadline_and_leaves_no_zombie() {
    let _one = sandboxed();
    let t =
        ChatTemplate::new(SLOW, None, None).unwrap().with_time_limit(Duration::from_millis(500));
    let t0 = Instant::now();
    let err = t.render(&hi(), true, &json!(null)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(
        err.to_string(),
        "the model's chat template did not finish within 0.5s for this conversation (a template that never ends?)"
    );
    assert_no_zombie();
    // The killed worker burns no CPU: every child left is an idle worker, asleep.
    std::thread::sleep(Duration::from_millis(100));
    let kids = children();
    assert!(kids.len() <= 4, "{kids:?}");
    let ok = ChatTemplate::new("{{ messages | length }}", None, None).unwrap();
    assert_eq!(ok.render(&hi(), true, &json!(null)).unwrap(), "1");
}

#[test]
fn the_in_template_limits_still_apply_in_a_worker() {
    let _one = sandboxed();
    let cases = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "ran past its limit of 1000",
        ),
        ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "wrote more than"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested calls deeper than 64"),
        ("{% include '/etc/hostname' %}", "template not found"),
    ];
    for (src, want) in cases {
        let err = ChatTemplate::new(src, None, None).unwrap().render(&hi(), true, &json!(null));
        let err = err.unwrap_err().to_string();
        assert!(err.contains(want), "{src}: {err}");
    }
    let src = "{{ raise_exception('no system message') }}";
    let err = ChatTemplate::new(src, None, None).unwrap().render(&hi(), true, &json!(null));
    let err = err.unwrap_err();
    assert_eq!(kind_of(&err), ErrorKind::InvalidInput);
    assert_eq!(err.to_string(), "the chat template rejected the conversation: no system message");
}

#[test]
fn a_panic_inside_minijinja_is_one_line_and_the_worker_is_replaced() {
    let _one = sandboxed();
    let src = "{% for i in range(3) %}{% with a = 1 %}{% break %}{% endwith %}{% endfor %}";
    let err = ChatTemplate::new(src, None, None).unwrap().render(&hi(), true, &json!(null));
    assert_eq!(err.unwrap_err().to_string(), "the chat template's render panicked");
    let ok = ChatTemplate::new("{% for i in range(3) %}{{ i }}{% endfor %}", None, None).unwrap();
    assert_eq!(ok.render(&hi(), true, &json!(null)).unwrap(), "012");
    assert_no_zombie();
}

#[test]
fn the_fixtures_render_byte_identically_in_a_worker() {
    let _one = sandboxed();
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/chat_templates.json")).unwrap();
    let now = UNIX_EPOCH + Duration::from_secs(fx["now_unix"].as_u64().unwrap());
    let mut checked = 0;
    for case in fx["cases"].as_array().unwrap() {
        let t = &fx["templates"][case["template"].as_str().unwrap()];
        let token = |k: &str| t[k].as_str().map(str::to_string);
        let tmpl = ChatTemplate::new(
            t["source"].as_str().unwrap(),
            token("bos_token"),
            token("eos_token"),
        )
        .unwrap()
        .with_clock(move || now);
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = tmpl.render_values(&case["messages"], agp, &case["extra"]);
        let label = format!("{} / {}", case["template"], case["conversation"]);
        match (case["expected"].as_str(), got) {
            (Some(want), Ok(got)) => assert_eq!(got, want, "{label}"),
            (None, Err(e)) => {
                let msg = case["error"].as_str().unwrap();
                assert!(e.to_string().contains(msg), "{label}: {e}");
            }
            (_, other) => panic!("{label}: {other:?}"),
        }
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
}

#[test]
fn concurrent_renders_share_the_workers_and_a_killed_idle_worker_is_replaced() {
    let _one = sandboxed();
    let t =
        std::sync::Arc::new(ChatTemplate::new("{{ messages[0].content }}", None, None).unwrap());
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let t = t.clone();
            std::thread::spawn(move || {
                for j in 0..20 {
                    let text = format!("{i}-{j}");
                    let msgs = vec![Message::new("user", text.clone())];
                    assert_eq!(t.render(&msgs, true, &json!(null)).unwrap(), text);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let kids = children();
    assert!(!kids.is_empty() && kids.len() <= 4, "{kids:?}");
    for &pid in kids.keys() {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..8 {
        assert_eq!(t.render(&hi(), true, &json!(null)).unwrap(), "hi");
    }
}

/// Median time of `n` renders of a real template (SmolLM2's) over 3 messages, or `turns`
/// exchanges of 1 kB messages.
fn median_render(n: usize, turns: usize) -> Duration {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/chat_templates.json")).unwrap();
    let t = &fx["templates"]["smollm2-135m-instruct"];
    let tmpl = ChatTemplate::new(t["source"].as_str().unwrap(), None, None).unwrap();
    let mut msgs = vec![
        Message::new("system", "You are helpful."),
        Message::new("user", "What is the capital of France?"),
        Message::new("assistant", "Paris."),
    ];
    for _ in 0..turns {
        msgs.push(Message::new("user", "q".repeat(1000)));
        msgs.push(Message::new("assistant", "a".repeat(1000)));
    }
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            tmpl.render(&msgs, true, &json!(null)).unwrap();
            t0.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

/// In-process first, then through a worker (run it alone: `--ignored --exact render_latency`).
#[test]
#[ignore]
fn render_latency() {
    let here = [median_render(2000, 0), median_render(200, 100)];
    let _one = sandboxed();
    let t0 = Instant::now();
    median_render(1, 0);
    let first = t0.elapsed();
    let worker = [median_render(2000, 0), median_render(200, 100)];
    println!("median render of 3 messages: in-process {:?}, in a worker {:?}", here[0], worker[0]);
    println!(
        "median render of 203 messages (200 kB): in-process {:?}, in a worker {:?}",
        here[1], worker[1]
    );
    println!("first render, starting the worker: {first:?}");
}
