//! How `play` shows a turn: the answer on stdout as it streams, reasoning dimmed under a
//! "Thinking…" header (interactive) or on stderr (one-shot with `-v`), or not at all, and the
//! stats line after it.

use std::io::Write;

use crate::chat::{Part, TurnEnd, TurnEvent, TurnSink};
use crate::generate::Generation;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Where a turn's text goes.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// A person is watching: reasoning in the same stream, dimmed.
    pub interactive: bool,
    pub show_reasoning: bool,
}

/// A [`TurnSink`] that prints one turn (make a new one per turn).
pub struct Printer {
    out: Output,
    /// Inside dimmed reasoning on stdout (the dim must be reset before the answer).
    in_reasoning: bool,
    /// The "Thinking…" header was written this turn (it is written once).
    thought: bool,
}

impl Printer {
    pub fn new(out: Output) -> Self {
        Printer { out, in_reasoning: false, thought: false }
    }

    fn reasoning(&mut self, s: &str) -> std::io::Result<()> {
        if !self.out.show_reasoning {
            return Ok(());
        }
        if !self.out.interactive {
            // One-shot: stdout is the answer alone, for pipes.
            let mut e = std::io::stderr();
            write!(e, "{s}")?;
            return e.flush();
        }
        let mut o = std::io::stdout();
        if !self.in_reasoning {
            write!(o, "{DIM}{}", if self.thought { "" } else { "Thinking…\n" })?;
            self.in_reasoning = true;
            self.thought = true;
        }
        write!(o, "{s}")?;
        o.flush()
    }

    fn answer(&mut self, s: &str) -> std::io::Result<()> {
        let mut o = std::io::stdout();
        if self.in_reasoning {
            self.in_reasoning = false;
            write!(o, "{RESET}\n\n")?;
        }
        write!(o, "{s}")?;
        o.flush()
    }

    fn end(&mut self, end: &TurnEnd) -> std::io::Result<()> {
        if self.in_reasoning {
            write!(std::io::stdout(), "{RESET}")?;
            self.in_reasoning = false;
        }
        if end.cut_in_reasoning {
            eprintln!("(stopped while reasoning: raise --max-tokens or lower the effort)");
        }
        Ok(())
    }
}

impl TurnSink for Printer {
    fn event(&mut self, e: &TurnEvent) -> anyhow::Result<()> {
        match e {
            TurnEvent::Answer(s) => self.answer(s)?,
            // play runs no tools, so a preamble (what the model is about to call) is shown
            // with the reasoning around it, as it always was.
            TurnEvent::Reasoning(s) | TurnEvent::Preamble(s) | TurnEvent::ToolArguments(s) => {
                self.reasoning(s)?
            }
            TurnEvent::ToolCall { recipient } => self.reasoning(&format!(
                "\n(tool call to {recipient}: tools are not supported yet)\n"
            ))?,
            TurnEvent::MessageEnd(Part::Reasoning | Part::Preamble | Part::ToolCall) => {
                self.reasoning("\n")?
            }
            TurnEvent::MessageEnd(Part::Answer) => {}
            TurnEvent::End(end) => self.end(end)?,
        }
        Ok(())
    }
}

/// `ttft 41 ms · prefill 12 tokens at 1234 tok/s, 300 cached · decode 70.1 tok/s · 57 tokens ·
/// eos · context 312/8192`: the cached count shows what the prefix cache saved (a chat's
/// earlier turns, a resumed conversation).
pub fn stats_line(g: &Generation, context: usize) -> String {
    format!(
        "ttft {} ms · prefill {} tokens at {:.0} tok/s, {} cached · decode {:.1} tok/s · {} tokens · {} · context {}/{}",
        g.time_to_first_token.as_millis(),
        g.prefilled_tokens,
        g.prefill_tok_s(),
        g.prompt_tokens - g.prefilled_tokens,
        g.decode_tok_s(),
        g.tokens.len(),
        g.reason,
        g.prompt_tokens + g.tokens.len(),
        context
    )
}
