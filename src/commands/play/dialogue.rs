//! One turn of a chat, whatever the model's format: HF chat templates (text streamed as
//! decoded) or gpt-oss harmony (token ids parsed by channel: reasoning shown dimmed under its
//! own header or hidden, the answer normally, and only the answer kept in the history).

use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::time::SystemTime;

use crate::chat::harmony::{
    Channel, HarmonyChat, HarmonyEncoding, HarmonyEvent, ReasoningEffort, SystemConfig,
};
use crate::engine::text::TextSide;
use crate::error::{ErrorKind, fail};
use crate::generate::{Generation, Sampler, Session, StopConditions, StopReason};

use super::Conversation;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Where a turn's text goes.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// A person is watching: reasoning in the same stream, dimmed.
    pub interactive: bool,
    pub show_reasoning: bool,
}

pub enum Dialogue {
    Plain(Conversation),
    Harmony(HarmonyChat),
}

impl Dialogue {
    /// Harmony when the tokenizer has its control tokens (gpt-oss) and the text is not raw.
    pub fn for_model(
        text: &TextSide,
        system: Option<String>,
        raw: bool,
        effort: ReasoningEffort,
    ) -> Dialogue {
        if !raw && HarmonyEncoding::new(&text.tokenizer).is_ok() {
            let cfg = SystemConfig { reasoning: effort, ..SystemConfig::default() }
                .with_date(SystemTime::now());
            return Dialogue::Harmony(HarmonyChat::new(cfg, system));
        }
        Dialogue::Plain(Conversation::new(system, raw || text.template.is_none()))
    }

    pub fn effort(&self) -> Option<ReasoningEffort> {
        match self {
            Dialogue::Harmony(h) => Some(h.system.reasoning),
            Dialogue::Plain(_) => None,
        }
    }

    pub fn clear(&mut self) {
        match self {
            Dialogue::Plain(c) => c.clear(),
            Dialogue::Harmony(h) => h.clear(),
        }
    }

    pub fn set_system(&mut self, system: Option<String>) {
        match self {
            Dialogue::Plain(c) => c.system = system,
            Dialogue::Harmony(h) => h.set_instructions(system),
        }
        self.clear();
    }

    pub fn set_effort(&mut self, effort: ReasoningEffort) -> anyhow::Result<()> {
        match self {
            Dialogue::Harmony(h) => {
                h.set_reasoning(effort);
                Ok(())
            }
            Dialogue::Plain(_) => Err(fail(
                ErrorKind::InvalidInput,
                "reasoning effort applies to gpt-oss models only",
            )),
        }
    }

    /// Runs one user turn and streams the reply to `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn turn(
        &mut self,
        session: &mut Session,
        text: &TextSide,
        user: &str,
        sampler: &mut Sampler,
        cond: StopConditions,
        interrupt: &AtomicBool,
        out: Output,
    ) -> anyhow::Result<Generation> {
        match self {
            Dialogue::Plain(c) => {
                c.push_user(user);
                let ids = match c.prompt_ids(text) {
                    Ok(ids) => ids,
                    Err(e) => {
                        c.messages.pop();
                        return Err(e);
                    }
                };
                let mut stdout = std::io::stdout();
                let reply =
                    session.generate(&text.tokenizer, &ids, sampler, cond, interrupt, &mut |t| {
                        stdout.write_all(t.as_bytes())?;
                        stdout.flush()?;
                        Ok(())
                    });
                match reply {
                    Ok(r) => {
                        c.push_assistant(&r.text);
                        Ok(r)
                    }
                    Err(e) => {
                        c.messages.pop();
                        Err(e)
                    }
                }
            }
            Dialogue::Harmony(h) => {
                h.push_user(user);
                let result =
                    harmony_turn(h, session, text, sampler, cond.max_tokens, interrupt, out);
                if result.is_err() {
                    h.undo_turn();
                }
                result
            }
        }
    }
}

fn harmony_turn(
    chat: &mut HarmonyChat,
    session: &mut Session,
    text: &TextSide,
    sampler: &mut Sampler,
    max_tokens: usize,
    interrupt: &AtomicBool,
    out: Output,
) -> anyhow::Result<Generation> {
    let enc = HarmonyEncoding::new(&text.tokenizer)?;
    let ids = chat.prompt_ids(&enc)?;
    let mut parser = enc.parser();
    let mut printer = Printer::new(out);
    let mut reply = session.generate_tokens(&ids, sampler, max_tokens, interrupt, &mut |id| {
        for event in parser.push(id)? {
            printer.event(&event)?;
        }
        Ok(parser.done().map(|_| StopReason::Eos(id)))
    })?;
    for event in parser.finish()? {
        printer.event(&event)?;
    }
    printer.end()?;
    if matches!(reply.reason, StopReason::MaxTokens)
        && parser.current_channel() == Some(&Channel::Analysis)
    {
        eprintln!("(stopped while reasoning: raise --max-tokens or lower the effort)");
    }
    chat.record_reply(parser.messages());
    reply.text = printer.answer;
    Ok(reply)
}

/// Prints harmony events: the answer normally, reasoning dimmed under a header (interactive)
/// or to stderr (one-shot with `--verbose`), markup never.
struct Printer {
    out: Output,
    in_reasoning: bool,
    thought: bool,
    answer: String,
}

impl Printer {
    fn new(out: Output) -> Self {
        Printer { out, in_reasoning: false, thought: false, answer: String::new() }
    }

    fn reasoning(&mut self, s: &str) -> std::io::Result<()> {
        if !self.out.show_reasoning {
            return Ok(());
        }
        if self.out.interactive {
            let mut o = std::io::stdout();
            if !self.in_reasoning {
                write!(o, "{DIM}{}", if self.thought { "" } else { "Thinking…\n" })?;
                self.in_reasoning = true;
                self.thought = true;
            }
            write!(o, "{s}")?;
            o.flush()
        } else {
            let mut e = std::io::stderr();
            write!(e, "{s}")?;
            e.flush()
        }
    }

    fn leave_reasoning(&mut self) -> std::io::Result<()> {
        if self.in_reasoning {
            self.in_reasoning = false;
            write!(std::io::stdout(), "{RESET}\n\n")?;
        }
        Ok(())
    }

    fn event(&mut self, e: &HarmonyEvent) -> std::io::Result<()> {
        match e {
            HarmonyEvent::Text { channel: Channel::Final, text } => {
                self.leave_reasoning()?;
                self.answer.push_str(text);
                let mut o = std::io::stdout();
                write!(o, "{text}")?;
                o.flush()
            }
            HarmonyEvent::Text { text, .. } => self.reasoning(text),
            HarmonyEvent::MessageStart { channel: Channel::Commentary, recipient: Some(r) } => {
                self.reasoning(&format!("\n(tool call to {r}: tools are not supported yet)\n"))
            }
            HarmonyEvent::MessageEnd { channel } if *channel != Channel::Final => {
                self.reasoning("\n")
            }
            _ => Ok(()),
        }
    }

    fn end(&mut self) -> std::io::Result<()> {
        if self.in_reasoning {
            write!(std::io::stdout(), "{RESET}")?;
            self.in_reasoning = false;
        }
        Ok(())
    }
}
