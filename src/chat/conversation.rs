//! A conversation with a model that speaks through a Hugging Face chat template (or raw text),
//! and how it becomes prompt ids. gpt-oss's harmony conversations are [`super::harmony::HarmonyChat`];
//! [`super::turn::Dialogue`] holds either and runs the turns.

use serde_json::json;

use crate::load::text::TextSide;
use crate::template::Message;

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

    /// Takes back the last user message and anything after it (a turn that failed).
    pub fn undo_turn(&mut self) {
        if let Some(at) = self.messages.iter().rposition(|m| m.role == "user") {
            self.messages.truncate(at);
        }
    }

    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// Forgets the oldest turn (its user message and the replies up to the next user message);
    /// false when there is no turn before the last user message to drop.
    pub fn drop_oldest_turn(&mut self) -> bool {
        match self.messages.iter().skip(1).position(|m| m.role == "user") {
            Some(next) => {
                self.messages.drain(..next + 1);
                true
            }
            None => false,
        }
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
