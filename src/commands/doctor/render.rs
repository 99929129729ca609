//! The human-readable report: one line per fact, `ok`/`!!` marks, a `fix:` line under each
//! problem, so it reads on a terminal and pastes into an issue.

use std::fmt::Write;

use super::Report;
use crate::util::human_bytes;

pub fn human(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "inferno {} doctor\n", r.version);
    section(&mut s, "GPU and CUDA", &r.gpu.lines());
    section(&mut s, "Hugging Face cache", &cache_lines(r));
    let models: Vec<Line> = r.models.iter().map(|m| m.line()).collect();
    if !models.is_empty() {
        section(&mut s, "Cached models (memory plan)", &models);
    }
    section(
        &mut s,
        "Switches (INFERNO_* environment variables)",
        &super::switches::lines(&r.switches),
    );
    if r.problems.is_empty() {
        let _ = writeln!(s, "No problems found.");
    } else {
        let _ = writeln!(s, "{} problem(s):", r.problems.len());
        for p in &r.problems {
            let _ = writeln!(s, "  !! {}\n     fix: {}", p.what, p.fix);
        }
    }
    s
}

/// One reported fact: fine, or a problem (its fix is listed at the end).
pub struct Line {
    pub ok: bool,
    pub text: String,
}

impl Line {
    pub fn ok(text: impl Into<String>) -> Line {
        Line { ok: true, text: text.into() }
    }
    pub fn bad(text: impl Into<String>) -> Line {
        Line { ok: false, text: text.into() }
    }
}

fn section(s: &mut String, title: &str, lines: &[Line]) {
    let _ = writeln!(s, "{title}");
    for l in lines {
        let _ = writeln!(s, "  {} {}", if l.ok { "ok" } else { "!!" }, l.text);
    }
    let _ = writeln!(s);
}

fn cache_lines(r: &Report) -> Vec<Line> {
    let c = &r.cache;
    let mut out = Vec::new();
    if !c.exists {
        out.push(Line::ok(format!("{} (not created yet: no downloads)", c.root.display())));
    } else if c.error.is_some() {
        out.push(Line::bad(format!("{} cannot be read", c.root.display())));
    } else {
        out.push(Line::ok(format!(
            "{}: {} model revision(s), {}",
            c.root.display(),
            c.models,
            human_bytes(c.size_bytes)
        )));
    }
    for b in &c.broken {
        out.push(Line::bad(b.clone()));
    }
    out.push(Line::ok(if c.hf_token_set {
        "HF_TOKEN is set (gated and private repositories can be downloaded)".to_string()
    } else {
        "HF_TOKEN is not set (needed only for gated or private repositories)".to_string()
    }));
    if c.offline {
        out.push(Line::ok("HF_HUB_OFFLINE is on: downloads use the cache only"));
    }
    out
}
