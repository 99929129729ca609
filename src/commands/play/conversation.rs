//! The conversation state of `play` and how it becomes prompt ids.

use serde_json::json;

use crate::chat::Message;
use crate::engine::text::TextSide;
use crate::generate::Generation;

pub struct Conversation {
    pub system: Option<String>,
    pub messages: Vec<Message>,
    /// Raw completion: the user text is the prompt (no chat template, no history).
    pub raw: bool,
}

impl Conversation {
    pub fn new(system: Option<String>, raw: bool) -> Self {
        Conversation { system, messages: Vec::new(), raw }
    }

    pub fn push_user(&mut self, text: &str) {
        self.messages.push(Message::new("user", text));
    }

    pub fn push_assistant(&mut self, text: &str) {
        self.messages.push(Message::new("assistant", text));
    }

    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// Prompt ids for the model: the rendered chat with a generation prompt, or the raw text.
    pub fn prompt_ids(&self, text: &TextSide) -> anyhow::Result<Vec<u32>> {
        match (&text.template, self.raw) {
            (Some(template), false) => {
                let mut all = Vec::with_capacity(self.messages.len() + 1);
                if let Some(s) = &self.system {
                    all.push(Message::new("system", s));
                }
                all.extend(self.messages.iter().cloned());
                let rendered = template.render(&all, true, &json!({}))?;
                text.encode_chat(&rendered)
            }
            _ => {
                let last = self.messages.last().map(|m| m.content.as_str()).unwrap_or("");
                text.encode_raw(last)
            }
        }
    }
}

/// `ttft 41 ms · prefill 1234 tok/s · decode 70.1 tok/s · 57 tokens · eos · context 312/8192`
pub fn stats_line(g: &Generation, context: usize) -> String {
    format!(
        "ttft {} ms · prefill {:.0} tok/s · decode {:.1} tok/s · {} tokens · {} · context {}/{}",
        g.time_to_first_token.as_millis(),
        g.prefill_tok_s(),
        g.decode_tok_s(),
        g.tokens.len(),
        g.reason,
        g.prompt_tokens + g.tokens.len(),
        context
    )
}
