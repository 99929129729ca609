//! A generation's deltas → Responses output items and the typed stream events: `reasoning`
//! (gpt-oss's analysis, as `reasoning_text` content with an empty summary), `message`
//! (`output_text`) and `function_call` items, each opened by `response.output_item.added`,
//! filled by its delta events and closed by `response.output_item.done`; the stream begins with
//! `response.created` and `response.in_progress` and ends with `response.completed`,
//! `response.incomplete` (the token budget ran out) or `response.failed` (after a flat `error`
//! event). A non-streamed request runs the same builder and keeps only the final object, so
//! both agree.

use serde_json::{Map, Value, json};

use super::super::errors::ApiError;
use super::super::generation::Outcome;
use crate::chat::reply::{Delta, FinishReason};

/// The item being filled.
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, args: String, index: usize },
}

pub struct Builder {
    pub id: String,
    created_at: u64,
    model: String,
    /// The request's fields the response repeats.
    echo: Map<String, Value>,
    items: Vec<Value>,
    open: Option<Open>,
    seq: u64,
}

impl Builder {
    pub fn new(id: String, model: String, echo: Map<String, Value>) -> Self {
        Builder {
            id,
            created_at: crate::util::unix_now(),
            model,
            echo,
            items: Vec::new(),
            open: None,
            seq: 0,
        }
    }

    /// The response object with this status.
    pub fn response(&self, status: &str, usage: Value) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items,
            "error": null,
            "incomplete_details": null,
            "usage": usage,
        });
        for (k, v) in &self.echo {
            r[k] = v.clone();
        }
        r
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.seq.into();
        self.seq += 1;
        fields
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let r = self.response("in_progress", Value::Null);
        let created = self.event("response.created", json!({"response": r}));
        let progress = self.event("response.in_progress", json!({"response": r}));
        vec![created, progress]
    }

    pub fn push(&mut self, d: Delta) -> Vec<Value> {
        let mut out = Vec::new();
        match d {
            Delta::Reasoning(t) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(&mut out, "completed");
                    let id = new_id("rs");
                    let item = json!({"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"});
                    self.added(&mut out, item);
                    let part = json!({"type": "reasoning_text", "text": ""});
                    self.part_event(&mut out, "response.content_part.added", &id, part);
                    self.open = Some(Open::Reasoning { id, text: String::new() });
                }
                let n = self.items.len();
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let f =
                        json!({"item_id": id, "output_index": n, "content_index": 0, "delta": t});
                    out.push(f);
                }
                self.stamp(&mut out, "response.reasoning_text.delta");
            }
            Delta::Content(t) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(&mut out, "completed");
                    let id = new_id("msg");
                    let item = json!({"id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": []});
                    self.added(&mut out, item);
                    let part = json!({"type": "output_text", "text": "", "annotations": []});
                    self.part_event(&mut out, "response.content_part.added", &id, part);
                    self.open = Some(Open::Message { id, text: String::new() });
                }
                let n = self.items.len();
                if let Some(Open::Message { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let f = json!({"item_id": id, "output_index": n, "content_index": 0, "delta": t, "logprobs": []});
                    out.push(f);
                }
                self.stamp(&mut out, "response.output_text.delta");
            }
            Delta::ToolStart { index, id: call_id, name } => {
                self.close(&mut out, "completed");
                let id = format!("fc_{}", call_id.trim_start_matches("call_"));
                let item = json!({"id": id, "type": "function_call", "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"});
                self.added(&mut out, item);
                self.open = Some(Open::Call { id, call_id, name, args: String::new(), index });
            }
            Delta::ToolArgs { index, text } => {
                let n = self.items.len();
                match &mut self.open {
                    Some(Open::Call { id, args, index: i, .. }) if *i == index => {
                        args.push_str(&text);
                        out.push(json!({"item_id": id, "output_index": n, "delta": text}));
                        self.stamp(&mut out, "response.function_call_arguments.delta");
                    }
                    // The `{}` filler for a call closed without arguments: it got `{}` then.
                    _ => {}
                }
            }
            Delta::Logprobs(_) => {}
        }
        out
    }

    /// The terminal events, and the final response object.
    pub fn finish(&mut self, o: &Outcome) -> (Vec<Value>, Value) {
        let mut out = Vec::new();
        let incomplete = o.finish == FinishReason::Length;
        self.close(&mut out, if incomplete { "incomplete" } else { "completed" });
        let (status, kind) = if incomplete {
            ("incomplete", "response.incomplete")
        } else {
            ("completed", "response.completed")
        };
        let mut r = self.response(status, usage(o));
        if incomplete {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        out.push(self.event(kind, json!({"response": r})));
        (out, r)
    }

    /// A flat `error` event, then `response.failed`.
    pub fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        let code = e.code.unwrap_or(if e.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request"
        });
        let error =
            self.event("error", json!({"code": code, "message": e.message, "param": e.param}));
        let mut r = self.response("failed", Value::Null);
        r["error"] = json!({"code": code, "message": e.message});
        vec![error, self.event("response.failed", json!({"response": r}))]
    }

    /// Gives the last of `out`, pushed without them, its type and sequence number.
    fn stamp(&mut self, out: &mut [Value], kind: &str) {
        if let Some(last) = out.last_mut().filter(|v| v.get("type").is_none()) {
            last["type"] = kind.into();
            last["sequence_number"] = self.seq.into();
            self.seq += 1;
        }
    }

    fn added(&mut self, out: &mut Vec<Value>, item: Value) {
        let f = json!({"output_index": self.items.len(), "item": item});
        out.push(self.event("response.output_item.added", f));
    }

    fn part_event(&mut self, out: &mut Vec<Value>, kind: &str, id: &str, part: Value) {
        let f = json!({"item_id": id, "output_index": self.items.len(), "content_index": 0, "part": part});
        out.push(self.event(kind, f));
    }

    /// Closes the open item: its `.done` events, and it joins the output.
    fn close(&mut self, out: &mut Vec<Value>, status: &str) {
        let n = self.items.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let f = json!({"item_id": id, "output_index": n, "content_index": 0, "text": text});
                out.push(self.event("response.reasoning_text.done", f));
                let part = json!({"type": "reasoning_text", "text": text});
                self.part_event(out, "response.content_part.done", &id, part.clone());
                json!({"id": id, "type": "reasoning", "summary": [], "content": [part], "status": status})
            }
            Some(Open::Message { id, text }) => {
                let f = json!({"item_id": id, "output_index": n, "content_index": 0, "text": text, "logprobs": []});
                out.push(self.event("response.output_text.done", f));
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.part_event(out, "response.content_part.done", &id, part.clone());
                json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": [part]})
            }
            Some(Open::Call { id, call_id, name, mut args, .. }) => {
                if args.is_empty() {
                    // Clients parse the arguments: none is `{}`.
                    args = "{}".into();
                    let f = json!({"item_id": id, "output_index": n, "delta": args});
                    out.push(self.event("response.function_call_arguments.delta", f));
                }
                let f = json!({"item_id": id, "output_index": n, "name": name, "arguments": args});
                out.push(self.event("response.function_call_arguments.done", f));
                json!({"id": id, "type": "function_call", "call_id": call_id, "name": name, "arguments": args, "status": status})
            }
        };
        let f = json!({"output_index": n, "item": item});
        out.push(self.event("response.output_item.done", f));
        self.items.push(item);
    }
}

/// `usage` of a response.
pub fn usage(o: &Outcome) -> Value {
    json!({
        "input_tokens": o.prompt_tokens,
        "input_tokens_details": {"cached_tokens": o.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": o.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": o.reasoning_tokens},
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    })
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}
