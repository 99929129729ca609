//! Hugging Face chat templates, rendered the way transformers renders them.
//!
//! A model's prompt format lives in a Jinja template (`chat_template.jinja`, or
//! `tokenizer_config.json`'s `chat_template`). A prompt that differs from the one the model was
//! trained on by a single newline degrades it quietly, so the environment mirrors transformers'
//! `_compile_jinja_template` + `render_jinja_template`:
//!
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline of the template dropped, no
//!   autoescaping, loop controls (`break`/`continue`);
//! - globals `raise_exception(msg)` (rendering fails with `msg`) and `strftime_now(fmt)` (UTC:
//!   see [`mod@strftime`]; injectable with [`ChatTemplate::with_clock`] for tests);
//! - `tojson` with HF's signature and Python's `json.dumps` output ([`pyjson`]);
//! - Python string/dict/list methods (`.strip()`, `.split()`, `.items()`, …) through
//!   minijinja-contrib's pycompat;
//! - context: `messages`, `tools` and `documents` (none unless given), `add_generation_prompt`,
//!   `bos_token`/`eos_token` when known, and any `extra` variables (e.g. `reasoning_effort`).
//!
//! Tests compare against transformers' own output: `tests/fixtures/chat_templates.json`, made
//! by `scripts/fixtures/chat_templates.py`.
//!
//! A template is part of what a model's files hold, loaded and compiled with its tokenizer
//! (`load::text`), so it sits below both loading and the chats (`chat`) that render it. It is
//! code from whoever published the model, so it runs sandboxed: the environment has no loader
//! (`include`, `import` and `extends` find no template but itself, and no file), no function
//! that reads files or the network, and each render is bounded in work, output and depth
//! ([`limits`]), and in memory and time by running in a worker process ([`worker`]).

mod limits;
pub mod pyjson;
pub mod strftime;
pub mod worker;

use crate::error::{ErrorKind, fail};
use anyhow::{Context, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error as JinjaError, ErrorKind as JinjaErrorKind, Value};
use pyjson::tojson_filter;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use strftime::strftime;

/// One chat message as templates see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
}

type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

const NAME: &str = "chat_template";

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template as given, for the render worker to compile.
    source: Arc<str>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    clock: Clock,
    /// How long a render may take ([`limits::RENDER_TIME`] unless set).
    time_limit: Duration,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Whether the template reads the variable `name` (a switch such as Qwen3's
    /// `enable_thinking`): its name appears in the source.
    pub fn mentions(&self, name: &str) -> bool {
        self.source.contains(name)
    }

    /// Compiles `source`; a syntax error is reported here, not at the first render.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .context("building the chat template syntax")?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_recursion_limit(limits::MAX_DEPTH);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        // Jinja2: `none is iterable` is false (minijinja iterates none as empty), so templates'
        // `tools is iterable and tools | length > 0` must short-circuit on a missing tool list.
        env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
        env.add_function("raise_exception", |msg: String| -> Result<Value, JinjaError> {
            Err(JinjaError::new(JinjaErrorKind::InvalidOperation, RAISED).with_source(Raised(msg)))
        });
        let mut t = ChatTemplate {
            env,
            source: source.into(),
            bos_token,
            eos_token,
            clock: Arc::new(SystemTime::now),
            time_limit: limits::RENDER_TIME,
        };
        t.set_clock(SystemTime::now);
        t.env.add_template_owned(NAME, rewrite_generation_tags(source)).map_err(|e| {
            fail(ErrorKind::InvalidInput, format!("chat template does not parse: {}", describe(&e)))
        })?;
        Ok(t)
    }

    /// Replaces the clock behind `strftime_now` (tests freeze the date with this).
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.set_clock(clock);
        self
    }

    /// Replaces the time a render may take (10 s): a render past it fails with one line.
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    fn set_clock(&mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) {
        let clock: Clock = Arc::new(clock);
        self.clock = clock.clone();
        self.env.add_function("strftime_now", move |fmt: String| strftime(clock(), &fmt));
    }

    /// True when the template reads the context variable `name` (e.g. `tools`: whether the
    /// model's template can render tool definitions at all).
    pub fn uses_variable(&self, name: &str) -> bool {
        self.env.get_template(NAME).is_ok_and(|t| t.undeclared_variables(false).contains(name))
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders the prompt for `messages`. `extra` is a JSON object of further template
    /// variables (`reasoning_effort`, `tools`, `enable_thinking`, …) or null; it may override
    /// `bos_token`, `eos_token`, `tools` and `documents`, not `messages` or
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Value,
    ) -> Result<String> {
        self.render_values(&serde_json::to_value(messages)?, add_generation_prompt, extra)
    }

    /// [`Self::render`] for messages given as JSON objects, with the fields beyond `role` and
    /// `content` that tool-using templates read (`tool_calls`, `tool_call_id`, `name`).
    pub fn render_values(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Value,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert("tools".into(), serde_json::Value::Null);
        ctx.insert("documents".into(), serde_json::Value::Null);
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), b.clone().into());
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), e.clone().into());
        }
        match extra {
            serde_json::Value::Null => {}
            serde_json::Value::Object(m) => {
                ctx.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())))
            }
            _ => {
                return Err(fail(
                    ErrorKind::InvalidInput,
                    "chat template variables must be a JSON object",
                ));
            }
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        self.render_bounded(ctx, self.time_limit)
    }

    /// Renders with the context `ctx` in a render worker ([`worker`]), or in-process where
    /// there is none, waiting at most `deadline` for it.
    fn render_bounded(
        &self,
        ctx: serde_json::Map<String, serde_json::Value>,
        deadline: Duration,
    ) -> Result<String> {
        let budget = limits::Budget::for_input(serde_json::to_vec(&ctx)?.len());
        // A worker's `strftime_now` reads the time the render started.
        let now = (self.clock)().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let req = worker::Request {
            source: self.source.to_string(),
            bos_token: self.bos_token.clone(),
            eos_token: self.eos_token.clone(),
            ctx,
            now_ns: now.as_nanos(),
            time_ms: deadline.as_millis().min(u64::MAX as u128) as u64,
        };
        if let Some(rendered) = worker::render(&req, budget, deadline) {
            return rendered;
        }
        self.render_in_process(req.ctx, deadline)
    }

    /// Renders with the context `ctx` on a render thread of this process
    /// ([`limits::on_render_thread`]), waiting at most `deadline` for it.
    fn render_in_process(
        &self,
        ctx: serde_json::Map<String, serde_json::Value>,
        deadline: Duration,
    ) -> Result<String> {
        let env = self.env.clone();
        limits::on_render_thread(move || render_within_budget(env, &ctx), deadline)?
    }

    /// The template of a model directory's files: `chat_template.jinja` if there is one, else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}`, of
    /// which "default" is used); `bos_token`/`eos_token` from `tokenizer_config.json` (a string
    /// or an AddedToken object `{"content": …}`).
    pub fn from_files(
        tokenizer_config: &serde_json::Value,
        chat_template_jinja: Option<&str>,
    ) -> Result<Self> {
        let source = match chat_template_jinja {
            Some(s) => s.to_string(),
            None => template_from_config(tokenizer_config)?,
        };
        let token = |name: &str| match &tokenizer_config[name] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => {
                o.get("content").and_then(|c| c.as_str()).map(str::to_string)
            }
            _ => None,
        };
        Self::new(&source, token("bos_token"), token("eos_token"))
    }
}

/// Renders the chat template of `env` with the context `ctx` within the [`limits::Budget`] its
/// size allows.
fn render_within_budget(
    mut env: Environment<'static>,
    ctx: &serde_json::Map<String, serde_json::Value>,
) -> Result<String> {
    let budget = limits::Budget::for_input(serde_json::to_vec(ctx)?.len());
    // Fuel is the environment's setting: each render has its own copy (the templates and
    // functions inside are shared, not copied).
    env.set_fuel(Some(budget.fuel));
    let tmpl = env.get_template(NAME).context("chat template missing from its environment")?;
    let mut out = limits::Capped::new(budget.output);
    let rendered = tmpl.render_captured_to(Value::from(minijinja::value::Serde(ctx)), &mut out);
    if let Err(e) = rendered {
        return Err(match (limits::exceeded(&e, &out, budget), raised_message(&e)) {
            (Some(limit), _) => fail(ErrorKind::Other, limit),
            (None, Some(msg)) => fail(
                ErrorKind::InvalidInput,
                format!("the chat template rejected the conversation: {msg}"),
            ),
            (None, None) => {
                fail(ErrorKind::InvalidInput, format!("chat template failed: {}", describe(&e)))
            }
        });
    }
    String::from_utf8(out.buf).context("the chat template wrote invalid UTF-8")
}

/// transformers' `{% generation %}…{% endgeneration %}` (its AssistantTracker extension) only
/// marks assistant text for training masks and renders its body unchanged; minijinja has no
/// such tag, so it becomes `{% if true %}…{% endif %}`, keeping any whitespace control.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // The closing `%}` after the opening `{%`: in `{%}`, the `%` is the opener's.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            rest = tag;
            break;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn template_from_config(cfg: &serde_json::Value) -> Result<String> {
    match &cfg["chat_template"] {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Array(list) => {
            let named = |want: &str| {
                list.iter()
                    .find(|t| t["name"].as_str() == Some(want))
                    .and_then(|t| t["template"].as_str())
                    .map(str::to_string)
            };
            named("default").ok_or_else(|| {
                let names: Vec<&str> = list.iter().filter_map(|t| t["name"].as_str()).collect();
                fail(
                    ErrorKind::InvalidInput,
                    format!(
                        "the model has several chat templates ({}) and none is named \"default\"",
                        names.join(", ")
                    ),
                )
            })
        }
        serde_json::Value::Null => Err(fail(
            ErrorKind::InvalidInput,
            "the model has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)",
        )),
        _ => Err(fail(
            ErrorKind::InvalidInput,
            "tokenizer_config.json: chat_template is neither a string nor a list",
        )),
    }
}

/// Detail text marking errors that come from `raise_exception`.
const RAISED: &str = "raise_exception";

/// The message passed to `raise_exception`, carried as the error's source.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raised_message(e: &JinjaError) -> Option<String> {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        src = s.source();
    }
    None
}

/// One line: minijinja's message with the template line, and its causes.
fn describe(e: &JinjaError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
