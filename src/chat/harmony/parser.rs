//! The model's side of harmony: sampled ids in, messages by channel out, as they stream.

use anyhow::Result;

use super::{CHANNEL, CONSTRAIN, Channel, HarmonyEncoding, HarmonyMessage, Role};
use crate::generate::TokenStream;

/// Why the assistant's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneReason {
    /// `<|return|>`: the answer is complete. Also when the model starts a message that is not
    /// the assistant's (`<|start|>user…`): its turn is over all the same.
    Return,
    /// `<|call|>`: the last message is a tool call waiting for its result.
    Call,
}

/// What one sampled token did to the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarmonyEvent {
    /// A message header was read. A missing channel reads as `final` (`commentary` when the
    /// message has a recipient).
    MessageStart {
        channel: Channel,
        recipient: Option<String>,
    },
    /// Content text, released as soon as it is complete UTF-8 (never markup).
    Text {
        channel: Channel,
        text: String,
    },
    MessageEnd {
        channel: Channel,
    },
    /// The turn is over; later tokens are ignored.
    Done {
        reason: DoneReason,
    },
}

enum State<'t> {
    /// Between messages: waiting for `<|start|>`.
    ExpectStart,
    /// Reading a header, up to `<|message|>`; `role` is known when the prompt wrote it.
    Header {
        role: Option<Role>,
        ids: Vec<u32>,
    },
    Content {
        message: HarmonyMessage,
        stream: TokenStream<'t>,
    },
    Done(DoneReason),
}

/// Streaming parser of an assistant turn: [`push`](Self::push) each sampled id, show the
/// events, call [`finish`](Self::finish) if sampling stopped for another reason (token budget,
/// Ctrl-C), then read [`messages`](Self::messages).
///
/// It is lenient where the model slips: a message interrupted by `<|start|>` or `<|channel|>`
/// ends there, text outside any message becomes a final message, a header without
/// `<|message|>` before the message ends is read as harmony's non-strict parser reads it, and
/// stray special tokens inside content are dropped. So no markup ever reaches a `Text` event.
pub struct HarmonyParser<'t> {
    enc: HarmonyEncoding<'t>,
    state: State<'t>,
    messages: Vec<HarmonyMessage>,
}

impl<'t> HarmonyParser<'t> {
    /// A parser positioned after `<|start|>assistant`.
    pub fn new(enc: HarmonyEncoding<'t>) -> Self {
        HarmonyParser {
            enc,
            state: State::Header { role: Some(Role::Assistant), ids: Vec::new() },
            messages: Vec::new(),
        }
    }

    /// Messages completed so far (content included; analysis too).
    pub fn messages(&self) -> &[HarmonyMessage] {
        &self.messages
    }

    pub fn into_messages(self) -> Vec<HarmonyMessage> {
        self.messages
    }

    /// How the turn ended, once it has.
    pub fn done(&self) -> Option<DoneReason> {
        match self.state {
            State::Done(r) => Some(r),
            _ => None,
        }
    }

    /// The channel of the message being read, if in its content.
    pub fn current_channel(&self) -> Option<&Channel> {
        match &self.state {
            State::Content { message, .. } => message.channel.as_ref(),
            _ => None,
        }
    }

    /// Feeds one sampled id.
    pub fn push(&mut self, id: u32) -> Result<Vec<HarmonyEvent>> {
        let mut events = Vec::new();
        self.step(id, &mut events)?;
        Ok(events)
    }

    /// Ends the turn where it stands (sampling stopped without `<|return|>`/`<|call|>`): flushes
    /// the message being read (an incomplete character comes out as U+FFFD) and closes it.
    pub fn finish(&mut self) -> Result<Vec<HarmonyEvent>> {
        let mut events = Vec::new();
        match std::mem::replace(&mut self.state, State::ExpectStart) {
            State::Content { message, stream } => self.close(message, stream, &mut events)?,
            State::Header { role, ids } => self.malformed_header(role, &ids, &mut events)?,
            done @ State::Done(_) => self.state = done,
            State::ExpectStart => {}
        }
        Ok(events)
    }

    fn step(&mut self, id: u32, events: &mut Vec<HarmonyEvent>) -> Result<()> {
        let ids = self.enc.ids;
        match std::mem::replace(&mut self.state, State::ExpectStart) {
            State::Done(r) => self.state = State::Done(r),
            State::ExpectStart => {
                if id == ids.start {
                    self.state = State::Header { role: None, ids: Vec::new() };
                } else if id == ids.channel {
                    // `<|start|>assistant` left out: read the header anyway.
                    self.state = State::Header { role: Some(Role::Assistant), ids: vec![id] };
                } else if id == ids.return_ || id == ids.call {
                    self.end_turn(id, events);
                } else if id == ids.message || !self.enc.is_special(id) {
                    // Text outside any message: show it as an answer rather than lose it.
                    self.state = State::Header { role: Some(Role::Assistant), ids: Vec::new() };
                    self.step(ids.message, events)?;
                    if id != ids.message {
                        self.step(id, events)?;
                    }
                }
            }
            State::Header { role, ids: mut header } => {
                if id == ids.message {
                    let (mut message, _) = self.parse_header(role, &header, true)?;
                    if message.role != Role::Assistant {
                        // The model began someone else's message (a user turn, a tool result):
                        // its own turn is over, and that text is not an answer.
                        self.end_turn(ids.return_, events);
                        return Ok(());
                    }
                    let channel = message.channel.clone().unwrap_or(Channel::Final);
                    message.channel = Some(channel.clone());
                    events.push(HarmonyEvent::MessageStart {
                        channel,
                        recipient: message.recipient.clone(),
                    });
                    self.state =
                        State::Content { message, stream: TokenStream::new(self.enc.tokenizer) };
                } else if id == ids.start {
                    self.state = State::Header { role: None, ids: Vec::new() };
                } else if id == ids.end || id == ids.return_ || id == ids.call {
                    self.malformed_header(role, &header, events)?;
                    if id != ids.end {
                        self.end_turn(id, events);
                    }
                } else {
                    header.push(id);
                    self.state = State::Header { role, ids: header };
                }
            }
            State::Content { mut message, mut stream } => {
                if !self.enc.is_special(id) {
                    // An id the tokenizer cannot decode is dropped, never a failed turn.
                    if let Some(text) = stream.push(id).unwrap_or(None) {
                        message.content.push_str(&text);
                        let channel = message.channel.clone().unwrap_or(Channel::Final);
                        events.push(HarmonyEvent::Text { channel, text });
                    }
                    self.state = State::Content { message, stream };
                } else if id == ids.end || id == ids.return_ || id == ids.call {
                    self.close(message, stream, events)?;
                    if id != ids.end {
                        self.end_turn(id, events);
                    }
                } else if id == ids.start || id == ids.channel {
                    // A new message without `<|end|>` first.
                    let role = message.role;
                    self.close(message, stream, events)?;
                    self.state = if id == ids.start {
                        State::Header { role: None, ids: Vec::new() }
                    } else {
                        State::Header { role: Some(role), ids: vec![id] }
                    };
                } else {
                    // Any other special token in content is not text: drop it.
                    self.state = State::Content { message, stream };
                }
            }
        }
        Ok(())
    }

    fn end_turn(&mut self, id: u32, events: &mut Vec<HarmonyEvent>) {
        let reason = if id == self.enc.ids.call { DoneReason::Call } else { DoneReason::Return };
        events.push(HarmonyEvent::Done { reason });
        self.state = State::Done(reason);
    }

    /// Flushes and records the message being read.
    fn close(
        &mut self,
        mut message: HarmonyMessage,
        mut stream: TokenStream<'t>,
        events: &mut Vec<HarmonyEvent>,
    ) -> Result<()> {
        let channel = message.channel.clone().unwrap_or(Channel::Final);
        if let Some(text) = stream.finish().unwrap_or(None) {
            message.content.push_str(&text);
            events.push(HarmonyEvent::Text { channel: channel.clone(), text });
        }
        events.push(HarmonyEvent::MessageEnd { channel });
        self.messages.push(message);
        Ok(())
    }

    /// A header that ended without `<|message|>`: as harmony's non-strict parser, keep its
    /// channel and take the words that are not header fields as the content.
    fn malformed_header(
        &mut self,
        role: Option<Role>,
        header: &[u32],
        events: &mut Vec<HarmonyEvent>,
    ) -> Result<()> {
        let (mut message, rest) = self.parse_header(role, header, false)?;
        if rest.is_empty() {
            return Ok(());
        }
        let channel = message.channel.clone().unwrap_or(Channel::Final);
        message.channel = Some(channel.clone());
        message.content = rest.clone();
        events.push(HarmonyEvent::MessageStart {
            channel: channel.clone(),
            recipient: message.recipient.clone(),
        });
        events.push(HarmonyEvent::Text { channel: channel.clone(), text: rest });
        events.push(HarmonyEvent::MessageEnd { channel });
        self.messages.push(message);
        Ok(())
    }

    /// Reads a header (harmony's `parse_header_from_string`): the channel after `<|channel|>`
    /// wherever it is, then whitespace-separated fields: the role (unless known), and from the
    /// end a content type and/or a `to=` recipient (unless `fields` is false: a malformed
    /// header's words are content). Returns the message with empty content and the words left
    /// over (which a well-formed header has none of).
    fn parse_header(
        &self,
        role: Option<Role>,
        header: &[u32],
        fields: bool,
    ) -> Result<(HarmonyMessage, String)> {
        // Ids the tokenizer cannot decode are left out, as in content.
        let known: Vec<u32> = header
            .iter()
            .copied()
            .filter(|&id| self.enc.tokenizer.id_to_token(id).is_some())
            .collect();
        let mut text = self.enc.tokenizer.decode(&known, false).unwrap_or_default();
        let mut channel = None;
        if let Some(at) = text.find(CHANNEL) {
            let after = &text[at + CHANNEL.len()..];
            let len = after.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(after.len());
            if len > 0 {
                channel = Some(Channel::parse(&after[..len]));
            }
            text = format!("{}{}", &text[..at], &after[len..]);
        }
        let text = without_markup(&text).replace(CONSTRAIN, &format!(" {CONSTRAIN}"));
        let mut parts: Vec<&str> = text.split_ascii_whitespace().collect();
        let mut name = None;
        let role = match role {
            Some(r) => r,
            None => match parts.first().map(|p| (p, Role::parse(p))) {
                Some((_, Some(r))) => r,
                Some((p, None)) if !p.starts_with("to=") => {
                    name = Some(p.to_string());
                    parts.remove(0);
                    Role::Tool
                }
                _ => Role::Assistant,
            },
        };
        if parts.first() == Some(&role.as_str()) {
            parts.remove(0);
        }
        let mut recipient = None;
        let mut content_type = None;
        if fields && let Some(last) = parts.pop() {
            if let Some(r) = last.strip_prefix("to=") {
                recipient = Some(r.to_string());
            } else if parts.is_empty() && !last.starts_with(CONSTRAIN) {
                recipient = Some(last.to_string());
            } else {
                content_type = Some(last.to_string());
                if let Some(r) = parts.pop() {
                    recipient = Some(r.strip_prefix("to=").unwrap_or(r).to_string());
                }
            }
        }
        // A content type left among the words (a malformed header's) is markup, not text.
        parts.retain(|p| !p.starts_with(CONSTRAIN));
        let rest = parts.join(" ");
        if channel.is_none() && recipient.is_some() {
            channel = Some(Channel::Commentary);
        }
        let message =
            HarmonyMessage { role, name, recipient, channel, content_type, content: String::new() };
        Ok((message, rest))
    }
}

/// A header's text with every special token but `<|constrain|>` turned into a space: a slip
/// such as a second `<|channel|>` or a reserved token never ends up in a recipient (a tool
/// name) or a content type.
fn without_markup(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("<|") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        match tail[2..].find("|>") {
            Some(end) => {
                let token = &tail[..end + 4];
                out.push_str(if token == CONSTRAIN { token } else { " " });
                rest = &tail[end + 4..];
            }
            None => {
                out.push(' ');
                rest = &tail[2..];
            }
        }
    }
    out.push_str(rest);
    out
}
