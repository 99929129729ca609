//! A conversation with a model that speaks through a Hugging Face chat template (or raw text),
//! and how it becomes prompt ids. gpt-oss's harmony conversations are [`super::harmony::HarmonyChat`];
//! [`super::turn::Dialogue`] holds either and runs the turns.

use serde_json::json;

use crate::load::text::TextSide;
use crate::template::{ChatTemplate, Message};

pub struct Conversation {
    pub system: Option<String>,
    pub messages: Vec<Message>,
    /// Raw completion: the user text is the prompt (no chat template, no history).
    pub raw: bool,
    /// A thinking model's switch (the template's `enable_thinking`, Qwen3's), when set; the
    /// template's default otherwise.
    pub thinking: Option<bool>,
}

impl Conversation {
    pub fn new(system: Option<String>, raw: bool) -> Self {
        Conversation { system, messages: Vec::new(), raw, thinking: None }
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

    /// The chat rendered by `template` with a generation prompt (and the thinking switch, when
    /// set).
    pub fn render(&self, template: &ChatTemplate) -> anyhow::Result<String> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(Message::new("system", s));
        }
        all.extend(self.messages.iter().cloned());
        let vars = match self.thinking {
            Some(on) => json!({ "enable_thinking": on }),
            None => json!({}),
        };
        template.render(&all, true, &vars)
    }

    /// Prompt ids for the model: the rendered chat with a generation prompt, or the raw text.
    pub fn prompt_ids(&self, text: &TextSide) -> anyhow::Result<Vec<u32>> {
        match (&text.template, self.raw) {
            (Some(template), false) => text.encode_chat(&self.render(template)?),
            _ => {
                let last = self.messages.last().map(|m| m.content.as_str()).unwrap_or("");
                text.encode_raw(last)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::Tokenizer;
    use tokenizers::models::wordlevel::WordLevel;

    use super::*;
    use crate::chat::Dialogue;
    use crate::chat::harmony::ReasoningEffort;

    /// Qwen3's switch as its template reads it: an empty reasoning block when thinking is off.
    const THINKING: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
        {% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and \
        enable_thinking is false %}<think></think>{% endif %}{% endif %}";

    fn text(template: &str) -> TextSide {
        let vocab = [("x".to_string(), 0)].into_iter().collect();
        let model = WordLevel::builder().vocab(vocab).unk_token("x".into()).build().unwrap();
        let template = Some(ChatTemplate::new(template, None, None).unwrap());
        TextSide { tokenizer: Tokenizer::new(model), template, eos_ids: Vec::new() }
    }

    #[test]
    fn the_thinking_switch_reaches_the_template() {
        let text = text(THINKING);
        let mut d = Dialogue::for_model(&text, None, false, ReasoningEffort::Medium);
        let Dialogue::Plain(c) = &mut d else { panic!("a plain dialogue") };
        c.push_user("hi");
        let template = text.template.as_ref().unwrap();
        assert_eq!(c.render(template).unwrap(), "<user>hi<assistant>", "the template's default");
        d.set_thinking(&text, false).unwrap();
        let Dialogue::Plain(c) = &d else { panic!("a plain dialogue") };
        assert_eq!(c.render(template).unwrap(), "<user>hi<assistant><think></think>");
        d.set_thinking(&text, true).unwrap();
        let Dialogue::Plain(c) = &d else { panic!("a plain dialogue") };
        assert_eq!(c.render(template).unwrap(), "<user>hi<assistant>");
    }

    #[test]
    fn a_template_without_the_switch_refuses_it_in_one_line() {
        let text = text("{% for m in messages %}{{ m.content }}{% endfor %}");
        let mut d = Dialogue::for_model(&text, None, false, ReasoningEffort::Medium);
        let err = d.set_thinking(&text, false).unwrap_err().to_string();
        assert_eq!(err, "this model's chat template has no thinking switch (enable_thinking)");
    }
}
