//! Download progress on stderr: a bar per file in flight plus a total, with bytes, speed and
//! ETA. When stderr is not a terminal there are no bars, only one line per finished file, so logs
//! stay readable.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::util::human_bytes;

pub struct Progress {
    multi: Option<MultiProgress>,
    total: Option<ProgressBar>,
}

impl Progress {
    /// `total_bytes` counts every selected file, `already` the bytes already in the cache.
    pub fn new(total_bytes: u64, already: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { multi: None, total: None };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let total = multi.add(ProgressBar::new(total_bytes));
        total.set_style(style(
            "{prefix:>12.bold} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        ));
        total.set_prefix("total");
        total.set_position(already);
        Progress { multi: Some(multi), total: Some(total) }
    }

    pub fn file(&self, name: &str, size: u64) -> FileProgress {
        let bar = self.multi.as_ref().map(|m| {
            let bar = m.insert_from_back(1, ProgressBar::new(size));
            bar.set_style(style(
                "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            ));
            bar.set_prefix(short(name, 12));
            bar
        });
        FileProgress { bar, total: self.total.clone(), name: name.to_string(), size, pos: 0 }
    }

    /// A message above the bars (or a plain line without them).
    pub fn println(&self, msg: &str) {
        match &self.multi {
            Some(m) => {
                let _ = m.println(msg);
            }
            None => eprintln!("{msg}"),
        }
    }

    pub fn finish(&self) {
        if let Some(t) = &self.total {
            t.finish();
        }
    }
}

pub struct FileProgress {
    bar: Option<ProgressBar>,
    total: Option<ProgressBar>,
    name: String,
    size: u64,
    pos: u64,
}

impl FileProgress {
    /// Moves to an absolute position (after a resume or a restart), keeping the total in step.
    pub fn set_position(&mut self, pos: u64) {
        if let Some(t) = &self.total {
            if pos >= self.pos {
                t.inc(pos - self.pos);
            } else {
                t.set_position(t.position().saturating_sub(self.pos - pos));
            }
        }
        if let Some(b) = &self.bar {
            b.set_position(pos);
        }
        self.pos = pos;
    }

    pub fn inc(&mut self, n: u64) {
        self.set_position(self.pos + n);
    }

    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        }
    }

    /// Ends this file's bar; without bars prints `<verb> <file> (<size>)`.
    pub fn done(self, verb: &str) {
        match &self.bar {
            Some(b) => b.finish_and_clear(),
            None => eprintln!("{verb} {} ({})", self.name, human_bytes(self.size)),
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// The tail of a long file name, so bars stay on one line.
fn short(name: &str, width: usize) -> String {
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= width {
        name.to_string()
    } else {
        let tail: String = chars[chars.len() - (width - 1)..].iter().collect();
        format!("…{tail}")
    }
}
