//! The interactive chat loop: streamed replies, a stats line after each, Ctrl+C stops a reply,
//! Ctrl+D or /exit leaves, persistent history, a few slash commands.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::{Chat, Output, stats_line, store};
use crate::chat::Dialogue;
use crate::generate::{Sampler, StopReason};

const HELP: &str = "\
/help                 this help
/exit                 leave (also Ctrl+D)
/clear                forget the conversation
/system <text>        set the system prompt (and clear the conversation)
/set <name> <value>   temperature, top_k, top_p, min_p, repeat_penalty, max_tokens, seed
/set                  show those settings
/stats [on|off]       show or hide the stats line
/save [NAME]          keep the conversation (as NAME, else the name it has)
/load NAME            continue a kept conversation
/list                 the kept conversations, the most recent first
/effort low|medium|high   gpt-oss reasoning effort
/think, /no_think     a thinking model's reasoning on or off (Qwen3)
/reasoning show|hide  show or hide the reasoning
\"\"\"                   start or end a multi-line message
Ctrl+C stops a reply in progress; on leaving, the conversation is kept as `last`.";

/// The REPL; `name` is the conversation's name when it was resumed (what `/save` reuses).
pub fn run(
    mut chat: Chat,
    mut dialogue: Dialogue,
    show_reasoning: bool,
    mut name: Option<String>,
) -> anyhow::Result<()> {
    let mut out = Output { interactive: true, show_reasoning };
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))?;
    let mut editor = DefaultEditor::new()?;
    let history = store::state_dir()
        .filter(|d| std::fs::create_dir_all(d).is_ok())
        .map(|d| d.join("history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let mut sampler = Sampler::new(chat.sampler.clone());
    let mut show_stats = true;
    loop {
        let line = match read_message(&mut editor) {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(ReadlineError::Interrupted) => {
                println!("(Ctrl+D or /exit to quit)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        if let Some(h) = &history {
            let _ = editor.save_history(h);
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(cmd) = trimmed.strip_prefix('/') {
            if keep(cmd, &mut chat, &mut dialogue, &mut sampler, &mut name) {
                continue;
            }
            match command(cmd, &mut chat, &mut dialogue, &mut sampler, &mut show_stats, &mut out) {
                Flow::Quit => break,
                Flow::Clear => chat.session.reset(),
                Flow::Continue => {}
            }
            continue;
        }
        interrupt.store(false, Ordering::SeqCst);
        let result = chat.turn(&mut dialogue, &line, &mut sampler, &interrupt, out);
        println!();
        match result {
            Ok(end) => {
                let reply = end.generation;
                if reply.reason == StopReason::ContextFull {
                    eprintln!(
                        "the context is full: /clear to start over, or restart with a larger --context"
                    );
                }
                if show_stats {
                    println!(
                        "\x1b[2m{}\x1b[0m",
                        stats_line(&reply, chat.session.engine().context())
                    );
                }
            }
            Err(e) => eprintln!("error: {e}"),
        }
    }
    // Kept on leaving, so yesterday's chat is `--resume` away. An empty one is not saved: a
    // quick look in and out would otherwise replace the last real conversation.
    let saved = chat.saved(&dialogue);
    if !saved.messages.is_empty() {
        match store::save(store::LAST, &saved) {
            Ok(_) => eprintln!("(kept as {}: inferno play … --resume continues it)", store::LAST),
            Err(e) => eprintln!("error: {e}"),
        }
    }
    Ok(())
}

/// `/save`, `/load` and `/list`; false for any other command. A `/load` brings the file's
/// settings, so the sampler starts anew from them.
fn keep(
    cmd: &str,
    chat: &mut Chat,
    dialogue: &mut Dialogue,
    sampler: &mut Sampler,
    name: &mut Option<String>,
) -> bool {
    let (verb, rest) = cmd.split_once(' ').map(|(a, b)| (a, b.trim())).unwrap_or((cmd, ""));
    match verb {
        "save" => {
            let chosen = match (rest, name.as_deref()) {
                ("", Some(n)) => n.to_string(),
                ("", None) => crate::template::strftime::strftime(
                    std::time::SystemTime::now(),
                    "chat-%Y-%m-%d-%H%M%S",
                ),
                (n, _) => n.to_string(),
            };
            match store::save(&chosen, &chat.saved(dialogue)) {
                Ok(path) => {
                    println!("(saved as {chosen}: {})", path.display());
                    *name = Some(chosen);
                }
                Err(e) => eprintln!("error: {e}"),
            }
        }
        "load" if rest.is_empty() => eprintln!("usage: /load NAME (/list shows them)"),
        "load" => {
            let loaded = store::load(rest).and_then(|saved| chat.resume(rest, &saved, dialogue));
            match loaded {
                Ok(notes) => {
                    notes.iter().for_each(|n| println!("{n}"));
                    *sampler = Sampler::new(chat.sampler.clone());
                    *name = Some(rest.to_string());
                }
                Err(e) => eprintln!("error: {e}"),
            }
        }
        "list" => match store::list() {
            Ok(names) if names.is_empty() => println!("(no saved conversations)"),
            Ok(names) => println!("{}", names.join("\n")),
            Err(e) => eprintln!("error: {e}"),
        },
        _ => return false,
    }
    true
}

/// One message: a line, or everything between two `"""` lines.
fn read_message(editor: &mut DefaultEditor) -> Result<Option<String>, ReadlineError> {
    let first = editor.readline(">>> ")?;
    let _ = editor.add_history_entry(first.as_str());
    if first.trim() != "\"\"\"" {
        return Ok(Some(first));
    }
    let mut lines = Vec::new();
    loop {
        let l = editor.readline("... ")?;
        if l.trim() == "\"\"\"" {
            return Ok(Some(lines.join("\n")));
        }
        lines.push(l);
    }
}

enum Flow {
    Continue,
    Clear,
    Quit,
}

fn command(
    cmd: &str,
    chat: &mut Chat,
    dialogue: &mut Dialogue,
    sampler: &mut Sampler,
    stats: &mut bool,
    out: &mut Output,
) -> Flow {
    let (name, rest) = cmd.split_once(' ').map(|(a, b)| (a, b.trim())).unwrap_or((cmd, ""));
    match name {
        "exit" | "quit" | "bye" => Flow::Quit,
        "help" | "?" => {
            println!("{HELP}");
            Flow::Continue
        }
        "clear" => {
            dialogue.clear();
            println!("(conversation cleared)");
            Flow::Clear
        }
        "effort" => {
            match rest.parse().and_then(|e| dialogue.set_effort(e)) {
                Ok(()) => println!("(reasoning effort {rest})"),
                Err(e) => eprintln!("error: {e}"),
            }
            Flow::Continue
        }
        "think" | "no_think" => {
            match dialogue.set_thinking(&chat.text, name == "think") {
                Ok(()) => println!("(thinking {})", if name == "think" { "on" } else { "off" }),
                Err(e) => eprintln!("error: {e}"),
            }
            Flow::Continue
        }
        "reasoning" => {
            match rest {
                "show" => out.show_reasoning = true,
                "hide" => out.show_reasoning = false,
                _ => {
                    eprintln!("usage: /reasoning show|hide");
                    return Flow::Continue;
                }
            }
            println!("(reasoning {})", if out.show_reasoning { "shown" } else { "hidden" });
            Flow::Continue
        }
        "system" => {
            dialogue.set_system((!rest.is_empty()).then(|| rest.to_string()));
            println!(
                "(system prompt {}; conversation cleared)",
                if rest.is_empty() { "removed" } else { "set" }
            );
            Flow::Clear
        }
        "stats" => {
            // Always answer: the line only shows after the next reply, so a silent toggle
            // looks like a command that did nothing.
            match rest {
                "" => *stats = !*stats,
                "on" => *stats = true,
                "off" => *stats = false,
                _ => {
                    eprintln!("usage: /stats [on|off]");
                    return Flow::Continue;
                }
            }
            println!("(stats {})", if *stats { "on" } else { "off" });
            Flow::Continue
        }
        "set" if rest.is_empty() => {
            let all: Vec<String> = SETTINGS
                .iter()
                .map(|n| format!("{n} {}", setting(chat, n).unwrap_or_default()))
                .collect();
            println!("({})", all.join(", "));
            Flow::Continue
        }
        "set" => {
            match set(rest, chat) {
                Ok(change) => {
                    *sampler = Sampler::new(chat.sampler.clone());
                    println!("({change})");
                }
                Err(e) => eprintln!("error: {e}"),
            }
            Flow::Continue
        }
        other => {
            eprintln!("unknown command /{other}; /help lists them");
            Flow::Continue
        }
    }
}

/// What `/set` can change, in the order `/set` lists them.
const SETTINGS: [&str; 7] =
    ["temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed"];

/// The current value of setting `name` as `/set` shows it (`off` for a filter that is off).
fn setting(chat: &Chat, name: &str) -> Option<String> {
    let s = &chat.sampler;
    let or_off = |v: Option<String>| v.unwrap_or_else(|| "off".to_string());
    Some(match name {
        "temperature" if s.is_greedy() => format!("{} (greedy)", s.temperature),
        "temperature" => s.temperature.to_string(),
        "top_k" => or_off(s.top_k.filter(|&k| k > 0).map(|k| k.to_string())),
        "top_p" => or_off(s.top_p.map(|p| p.to_string())),
        "min_p" => or_off(s.min_p.map(|p| p.to_string())),
        "repeat_penalty" => s.repeat_penalty.to_string(),
        "max_tokens" => chat.max_tokens.to_string(),
        "seed" => s.seed.to_string(),
        _ => return None,
    })
}

/// Applies `/set <name> <value>` and says what changed (`temperature 0.8 → 0.2`): a setting
/// only shows in later replies, so without an answer a typo and a change look alike.
fn set(args: &str, chat: &mut Chat) -> anyhow::Result<String> {
    let (name, value) = args
        .split_once(char::is_whitespace)
        .ok_or_else(|| anyhow::anyhow!("usage: /set <name> <value>"))?;
    let value = value.trim();
    let before = setting(chat, name).ok_or_else(|| {
        anyhow::anyhow!("unknown setting {name:?} (one of {})", SETTINGS.join(", "))
    })?;
    let number = |v: &str| -> anyhow::Result<f32> {
        v.parse().map_err(|_| anyhow::anyhow!("{name} takes a number, not {v:?}"))
    };
    let count = |v: &str| -> anyhow::Result<u64> {
        v.parse().map_err(|_| anyhow::anyhow!("{name} takes a whole number, not {v:?}"))
    };
    let mut cfg = chat.sampler.clone();
    let mut max_tokens = chat.max_tokens;
    match name {
        "temperature" => cfg.temperature = number(value)?,
        "top_k" => cfg.top_k = Some(usize::try_from(count(value)?)?).filter(|&k| k > 0),
        "top_p" => cfg.top_p = Some(number(value)?),
        "min_p" => cfg.min_p = Some(number(value)?),
        "repeat_penalty" => cfg.repeat_penalty = number(value)?,
        "seed" => cfg.seed = count(value)?,
        "max_tokens" => max_tokens = usize::try_from(count(value)?)?,
        other => anyhow::bail!("unknown setting {other:?}"),
    }
    cfg.validate()?;
    chat.sampler = cfg;
    chat.max_tokens = max_tokens;
    let after = setting(chat, name).unwrap_or_default();
    Ok(if after == before {
        format!("{name} {after}, unchanged")
    } else {
        format!("{name} {before} → {after}")
    })
}
