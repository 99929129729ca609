//! The HTTP surface: which path goes to which handler, the API key check (every path but
//! `/health` and the chat page's files, [`super::ui`]), CORS (only for the origins given), the body limit, a request count per
//! endpoint and status for `/metrics`, and OpenAI-shaped 404/405s for everything else.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::errors::ApiError;
use super::metrics::Gauges;
use super::state::AppState;
use super::{chat, completions, messages, responses};
use crate::error::{ErrorKind, fail};

pub fn router(
    state: Arc<AppState>,
    cors_origins: &[String],
    body_limit: usize,
    ui: bool,
) -> anyhow::Result<Router> {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/messages", post(messages::handle))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let mut app = Router::new().route("/health", get(health)).merge(api);
    if ui {
        app = app.merge(super::ui::routes());
    }
    let mut app = app
        .fallback(|req: Request| async move {
            unknown(&req, "no such endpoint");
            ApiError::not_found("no such endpoint")
        })
        .method_not_allowed_fallback(|req: Request| async move {
            unknown(&req, "method not allowed");
            ApiError::method_not_allowed()
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state);
    if !cors_origins.is_empty() {
        app = app.layer(cors(cors_origins)?);
    }
    Ok(app)
}

/// A request no route takes, logged: a client speaking an API this server lacks shows up
/// in the log rather than as silence. The path is cut and escaped (it is the client's text).
fn unknown(req: &Request, what: &str) {
    let path = req.uri().path();
    let mut shown: String = path.chars().take(200).flat_map(char::escape_default).collect();
    if path.chars().count() > 200 {
        shown.push('…');
    }
    tracing::warn!("{} {shown}: {what}", req.method());
}

fn cors(origins: &[String]) -> anyhow::Result<CorsLayer> {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o.trim_end_matches('/')).map_err(|_| {
                    fail(
                        ErrorKind::InvalidInput,
                        format!("--cors-origin {o:?} is not a valid origin"),
                    )
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(values)
    };
    Ok(CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]))
}

async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            // Anthropic's clients send the key as `x-api-key`.
            .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()));
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            if req.uri().path().starts_with("/v1/messages") {
                return messages::error_response(ApiError::unauthorized());
            }
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Equality in time independent of where the keys differ and of their lengths: both are
/// hashed (SHA-256), and the digests compared in constant time (`subtle`).
fn same(given: &[u8], key: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    Sha256::digest(given).as_slice().ct_eq(Sha256::digest(key).as_slice()).into()
}

async fn count(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let endpoint = match req.uri().path() {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/messages" | "/v1/messages/count_tokens" => "/v1/messages",
        p if p == "/v1/responses" || p.starts_with("/v1/responses/") => "/v1/responses",
        "/health" => "/health",
        "/metrics" => "/metrics",
        p if p == "/" || p.starts_with("/ui/") => "/ (chat page)",
        p if p == "/v1/models" || p.starts_with("/v1/models/") => "/v1/models",
        _ => "other",
    };
    let resp = next.run(req).await;
    state.metrics.count_request(endpoint, resp.status().as_u16());
    resp
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (status, text) = if state.is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if state.loaded().is_some() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    let mut resp = (status, axum::Json(json!({"status": text}))).into_response();
    if status != StatusCode::OK {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(5));
    }
    resp
}

fn model_object(state: &AppState) -> serde_json::Value {
    let mut m = json!({
        "id": state.model.id,
        "object": "model",
        "created": state.created,
        "owned_by": "inferno",
    });
    if let Some(r) = state.loaded() {
        m["max_model_len"] = r.engine.context().into();
        // Whether `reasoning_effort` applies (gpt-oss): the chat page offers it only then.
        m["reasoning"] = r.harmony.into();
    }
    m
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&state)]})).into_response()
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.model.check(Some(&id)) {
        Ok(()) => axum::Json(model_object(&state)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let g = Gauges {
        loaded: state.loaded().is_some(),
        engine: state.loaded().map(|r| r.engine.stats()),
        in_flight: state.in_flight(),
    };
    let body = state.metrics.render(&g);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_match_only_when_equal() {
        assert!(super::same(b"sk-secret", b"sk-secret"));
        for other in [&b""[..], b"sk-secreT", b"sk-secret ", b"sk-secre", b"x"] {
            assert!(!super::same(other, b"sk-secret"), "{other:?}");
        }
    }
}
