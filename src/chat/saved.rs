//! A conversation as `play` keeps it on disk: readable JSON with the messages, the system
//! prompt, gpt-oss's settings (reasoning effort, the date its system message carries), the
//! sampling settings and the model it was held with.
//!
//! Only text is saved, never token ids: loading re-renders the prompt with whatever model is
//! loaded, so a file from another model (or another chat format) still loads. A file a person
//! edited is checked as it is read (roles, channels, settings) and refused with one line.

use serde::{Deserialize, Serialize};

use super::Dialogue;
use super::harmony::Channel;
use crate::error::{ErrorKind, fail};
use crate::generate::SamplerConfig;

/// The file format's version, written so a later format can tell old files apart.
const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedChat {
    pub version: u32,
    /// The model's name as the banner shows it.
    pub model: String,
    /// `chat` (a chat template), `harmony` (gpt-oss) or `raw`: informative, loading follows the
    /// loaded model's format.
    pub format: String,
    /// The system prompt (gpt-oss: the developer instructions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// gpt-oss: low, medium or high.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// gpt-oss: the date in the system message, kept so a resumed chat renders the same prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    pub settings: Settings,
    pub messages: Vec<SavedMessage>,
}

/// What `/set` changes, and the penalties the flags set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
    pub max_tokens: usize,
}

/// A user or assistant message. gpt-oss's assistant messages carry their harmony channel as
/// the conversation holds it (`final` for answers; `analysis` for reasoning harmony still
/// sends back, `commentary` for preambles).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

impl SavedChat {
    /// The state of `dialogue` with its sampling settings, as held with `model`.
    pub fn of(
        dialogue: &Dialogue,
        model: &str,
        sampler: &SamplerConfig,
        max_tokens: usize,
    ) -> SavedChat {
        let settings = Settings {
            temperature: sampler.temperature,
            top_k: sampler.top_k,
            top_p: sampler.top_p,
            min_p: sampler.min_p,
            repeat_penalty: sampler.repeat_penalty,
            presence_penalty: sampler.presence_penalty,
            frequency_penalty: sampler.frequency_penalty,
            seed: sampler.seed,
            max_tokens,
        };
        let base = SavedChat {
            version: VERSION,
            model: model.to_string(),
            format: String::new(),
            system: None,
            reasoning_effort: None,
            date: None,
            settings,
            messages: Vec::new(),
        };
        match dialogue {
            Dialogue::Plain(c) => SavedChat {
                format: if c.raw { "raw" } else { "chat" }.to_string(),
                system: c.system.clone(),
                messages: c
                    .messages
                    .iter()
                    .map(|m| SavedMessage {
                        role: m.role.clone(),
                        content: m.content.clone(),
                        channel: None,
                    })
                    .collect(),
                ..base
            },
            Dialogue::Harmony(h) => SavedChat {
                format: "harmony".to_string(),
                system: h.instructions.clone(),
                reasoning_effort: Some(h.system.reasoning.to_string()),
                date: h.system.current_date.clone(),
                messages: h
                    .messages()
                    .iter()
                    .map(|m| SavedMessage {
                        role: m.role.as_str().to_string(),
                        content: m.content.clone(),
                        channel: m.channel.as_ref().map(|c| c.as_str().to_string()),
                    })
                    .collect(),
                ..base
            },
        }
    }

    /// Reads a file's text; any fault (not JSON, a missing field, a role other than user or
    /// assistant, a channel harmony lacks, settings out of range) is one line.
    pub fn parse(json: &str) -> anyhow::Result<SavedChat> {
        let bad = |m: String| fail(ErrorKind::InvalidInput, m);
        let saved: SavedChat = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if saved.version != VERSION {
            return Err(bad(format!("version {} (this inferno reads {VERSION})", saved.version)));
        }
        for (i, m) in saved.messages.iter().enumerate() {
            let n = i + 1;
            match (m.role.as_str(), m.channel.as_deref()) {
                ("user", None) | ("assistant", None) => {}
                ("assistant", Some("final" | "analysis" | "commentary")) => {}
                ("user" | "assistant", Some(c)) => {
                    return Err(bad(format!("message {n} has channel {c:?}")));
                }
                (role, _) => {
                    return Err(bad(format!(
                        "message {n} has role {role:?} (user or assistant; the system prompt \
                         is the \"system\" field)"
                    )));
                }
            }
        }
        saved.sampler(0)?;
        if let Some(e) = &saved.reasoning_effort {
            e.parse::<super::harmony::ReasoningEffort>()?;
        }
        Ok(saved)
    }

    pub fn to_json(&self) -> String {
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The saved sampling settings, with `repeat_last_n` (which play does not change), validated.
    pub fn sampler(&self, repeat_last_n: usize) -> anyhow::Result<SamplerConfig> {
        let s = &self.settings;
        let cfg = SamplerConfig {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repeat_penalty,
            repeat_last_n,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            seed: s.seed,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Replaces `dialogue`'s history and system prompt with the saved ones, in the loaded
    /// model's format: a harmony file's reasoning is left out of a chat-template model's
    /// history, a chat-template file's answers become harmony final messages.
    pub fn restore(&self, dialogue: &mut Dialogue) -> anyhow::Result<()> {
        dialogue.set_system(self.system.clone());
        match dialogue {
            Dialogue::Plain(c) => {
                for m in &self.messages {
                    match (m.role.as_str(), m.channel.as_deref()) {
                        ("user", _) => c.push_user(&m.content),
                        ("assistant", None | Some("final")) => c.push_assistant(&m.content),
                        _ => {}
                    }
                }
            }
            Dialogue::Harmony(h) => {
                if let Some(e) = &self.reasoning_effort {
                    h.set_reasoning(e.parse()?);
                }
                if self.date.is_some() {
                    h.system.current_date = self.date.clone();
                }
                for m in &self.messages {
                    match (m.role.as_str(), m.channel.as_deref().map(Channel::parse)) {
                        ("user", _) => h.push_user(&m.content),
                        ("assistant", Some(Channel::Analysis)) => {
                            h.push_assistant_reasoning(&m.content)
                        }
                        ("assistant", Some(Channel::Commentary)) => {
                            h.push_assistant_preamble(&m.content)
                        }
                        _ => h.push_assistant_final(&m.content),
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "saved_tests.rs"]
mod tests;
