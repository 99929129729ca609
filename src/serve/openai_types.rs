//! The request bodies of the OpenAI API as the server reads them. Only what the server uses
//! is declared; unknown fields are ignored (serde's default), as every OpenAI-compatible server
//! does, so a client sending newer fields keeps working. Values are checked in
//! [`super::params`]; here only their JSON types.

use serde::Deserialize;
use serde_json::Value;

use super::errors::ApiError;

/// Parses a request body, with OpenAI-style 400s for bad JSON or a wrong field type.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

/// `"stop"`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Fields both endpoints share: sampling, limits, streaming.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Not in OpenAI's API; vLLM and llama.cpp accept it (`-1` or 0: off).
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<i64>,
    /// Free text for the caller's own tracking; logged with `-v`.
    pub user: Option<String>,
    /// vLLM's extension: logprob tokens as `token_id:ID` (exact even where text is ambiguous).
    pub return_tokens_as_token_ids: Option<bool>,
    /// Structured output (see [`super::constraint`]): OpenAI's format, vLLM's fields.
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
    /// Test hook (honoured only when the server runs with `INFERNO_TEST_HOOKS=1`): the reply's
    /// tokens are this text's ids instead of sampled ones (see [`super::hooks`]).
    pub x_inferno_force_reply: Option<String>,
    /// Test hook: the reply starts with this text's ids, then is sampled as usual (and under
    /// the request's constraint): e.g. a gpt-oss analysis message before a constrained answer.
    pub x_inferno_force_prefix: Option<String>,
    /// Test hook: the harmony system message's date (`YYYY-MM-DD`), to compare prompts with
    /// fixtures rendered by openai-harmony.
    pub x_inferno_date: Option<String>,
    /// Test hook: the response carries the prompt's ids (`x_inferno_prompt_ids`).
    pub x_inferno_prompt_ids: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<ChatMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub reasoning_effort: Option<String>,
    /// Variables for the model's chat template, as vLLM, SGLang and llama.cpp's server take
    /// them (Qwen3's `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// ollama's spelling of `reasoning_effort`.
    pub reasoning: Option<ReasoningField>,
    /// Predicted Outputs: `{"type": "content", "content": TEXT or text parts}`.
    pub prediction: Option<Prediction>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Prediction {
    #[serde(rename = "type")]
    pub kind: String,
    pub content: Content,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReasoningField {
    pub effort: Option<String>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
    /// An earlier reply's reasoning: either name is accepted (clients disagree).
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
}

impl ChatMessage {
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning_content.as_deref().or(self.reasoning.as_deref()).filter(|s| !s.is_empty())
    }
}

/// A message's content: a string or a list of parts (only text parts are supported).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl Content {
    /// The text, parts joined without separator (as OpenAI concatenates them).
    pub fn text(&self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text" | "input_text" | "output_text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                "messages",
                                format!(
                                    "content parts of type {kind:?} are not supported: this model reads text only"
                                ),
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// One `tool_calls[]` entry of an earlier assistant message.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// A JSON string as OpenAI sends it; an object is accepted too and written as JSON.
    #[serde(default)]
    pub arguments: Value,
}

impl FunctionCallIn {
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(s) => s.clone(),
            Value::Null => "{}".to_string(),
            other => other.to_string(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: Option<Value>,
    pub logprobs: Option<Value>,
    pub echo: Option<bool>,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_ignored_and_types_checked() {
        let r: ChatRequest = parse(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                 "frobnicate": {"x": 1}, "stop": "END", "temperature": 0}"#,
        )
        .unwrap();
        assert_eq!(r.common.stop.unwrap().into_vec(), ["END"]);
        assert_eq!(r.common.temperature, Some(0.0));
        let e = parse::<ChatRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = parse::<ChatRequest>(b"{not json").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert!(parse::<ChatRequest>(b"[1, 2]").is_err());
        assert!(parse::<ChatRequest>(br#"{"model": "m"}"#).is_err(), "messages is required");
    }

    #[test]
    fn content_parts_join_and_images_are_refused() {
        let c: Content = serde_json::from_str(
            r#"[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]"#,
        )
        .unwrap();
        assert_eq!(c.text().unwrap(), "ab");
        let c: Content =
            serde_json::from_str(r#"[{"type": "image_url", "image_url": {"url": "x"}}]"#).unwrap();
        assert!(c.text().unwrap_err().message.contains("image_url"));
    }
}
