//! Errors as the OpenAI API reports them: a status and `{"error": {"message", "type", "param",
//! "code"}}`. Clients (the `openai` SDKs, Open WebUI) read `error.message` and branch on the
//! status, so every failure the server can answer, from bad JSON to a full queue, goes out in
//! this shape: handlers return `Result<_, ApiError>` and never panic on request data.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{ErrorKind, kind_of};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for 503 (a full queue, a model still loading).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: malformed JSON, a bad value, a prompt longer than the context.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.param = Some(param.to_string());
        e
    }

    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or incorrect API key: send it as `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
        );
        e.code = Some("invalid_api_key");
        e
    }

    pub fn model_not_found(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model {model:?} does not exist here: this server serves {served:?}"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this path",
        )
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", message)
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(retry_after);
        e.code = Some("overloaded");
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// A failure from the shared code (rendering, tokenizing, submitting): the user's fault
    /// (400) when its kind says invalid input, else the server's (500).
    pub fn from_anyhow(err: &anyhow::Error) -> Self {
        let message = format!("{err:#}");
        match kind_of(err) {
            ErrorKind::InvalidInput | ErrorKind::NotFound => Self::bad_request(message),
            _ => Self::internal(message),
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// A request body, or 413 past the limit.
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large("the request body is larger than the server accepts")
        } else {
            ApiError::bad_request(format!("reading the request body: {}", e.body_text()))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fail;

    #[test]
    fn kinds_map_to_statuses() {
        let e = ApiError::from_anyhow(&fail(ErrorKind::InvalidInput, "the prompt is empty"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.body()["error"]["message"], "the prompt is empty");
        let e = ApiError::from_anyhow(&anyhow::anyhow!("CUDA failed"));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.body()["error"]["type"], "server_error");
    }

    #[test]
    fn busy_carries_retry_after() {
        let resp = ApiError::unavailable("queue full", 2).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }
}
