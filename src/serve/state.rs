//! What every handler shares: the model once loaded ([`Ready`]), the names it answers to, the
//! API key, the admission limit, the metrics and the shutdown signal.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

use super::errors::ApiError;
use super::metrics::Metrics;
use crate::engine::core::Engine;
use crate::load::ModelInfo;
use crate::load::text::TextSide;

/// The loaded model: the engine (its thread owns the weights), the tokenizer and template.
pub struct Ready {
    pub engine: Engine,
    pub text: TextSide,
    pub info: ModelInfo,
    /// gpt-oss: chats are rendered and parsed as harmony.
    pub harmony: bool,
    /// Tokens of KV the pool holds over all sequences.
    pub kv_tokens: usize,
    /// The grammar compiler for structured output, built on first use
    /// ([`super::constraint::grammars`]); the error if this model cannot have one.
    pub grammars: OnceLock<Result<Arc<crate::engine::constraint::Grammars>, String>>,
}

/// The names a request's `model` may use: the id as served (the model argument) and a short
/// alias (its last path component without `@rev` or `.gguf`).
#[derive(Debug, Clone)]
pub struct ModelIds {
    pub id: String,
    pub alias: Option<String>,
}

impl ModelIds {
    pub fn from_name(name: &str) -> ModelIds {
        let id = name.trim_end_matches('/').to_string();
        let last = id.rsplit('/').next().unwrap_or(&id);
        let last = last.split('@').next().unwrap_or(last);
        let last = last.strip_suffix(".gguf").unwrap_or(last);
        let alias = (!last.is_empty() && last != id).then(|| last.to_string());
        ModelIds { id, alias }
    }

    /// A request may leave `model` out or empty (one model is served), else name it.
    pub fn check(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            None | Some("") => Ok(()),
            Some(m) if m == self.id || self.alias.as_deref() == Some(m) => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m, &self.id)),
        }
    }
}

pub struct AppState {
    pub model: ModelIds,
    pub api_key: Option<String>,
    /// Requests running or waiting at most: `--max-seqs` + `--max-waiting`.
    pub capacity: usize,
    pub metrics: Metrics,
    pub shutdown: watch::Receiver<bool>,
    /// Unix time the server started (`created` of /v1/models).
    pub created: u64,
    /// `INFERNO_TEST_HOOKS=1`: test-only request fields are honoured.
    pub hooks: bool,
    /// Seconds between SSE keep-alive comments (10; `INFERNO_SSE_KEEP_ALIVE_SECS` for tests).
    pub keep_alive: u64,
    /// Test hook: replies forced on requests that name none (`INFERNO_TEST_REPLIES`).
    pub test_replies: Mutex<VecDeque<String>>,
    /// Stored Responses-API responses (`previous_response_id`, `GET /v1/responses/{id}`).
    pub responses: super::responses::Store,
    ready: OnceLock<Arc<Ready>>,
    in_flight: AtomicUsize,
}

impl AppState {
    pub fn new(
        model: ModelIds,
        api_key: Option<String>,
        capacity: usize,
        shutdown: watch::Receiver<bool>,
        responses: super::responses::Store,
    ) -> Self {
        let hooks = crate::switches::test_hooks();
        AppState {
            model,
            api_key: api_key.filter(|k| !k.is_empty()),
            capacity,
            metrics: Metrics::default(),
            shutdown,
            created: crate::util::unix_now(),
            hooks,
            keep_alive: crate::switches::sse_keep_alive_secs(),
            test_replies: Mutex::new(if hooks {
                super::hooks::queued_replies()
            } else {
                VecDeque::new()
            }),
            responses,
            ready: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
        }
    }

    pub fn set_ready(&self, ready: Arc<Ready>) {
        let _ = self.ready.set(ready);
    }

    pub fn loaded(&self) -> Option<&Arc<Ready>> {
        self.ready.get()
    }

    /// The model, or 503 while it loads.
    pub fn ready(&self) -> Result<Arc<Ready>, ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::unavailable("the server is shutting down", 5));
        }
        self.ready
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("the model is still loading", 5))
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// A place among the running and waiting requests, or 503 when the queue is full.
    pub fn admit(self: &Arc<Self>) -> Result<Slot, ApiError> {
        let prev = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(self.clone());
        if prev >= self.capacity {
            return Err(ApiError::unavailable(
                format!(
                    "the server is busy: {prev} requests are running or waiting (--max-waiting)"
                ),
                1,
            ));
        }
        Ok(slot)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// A request's place; dropping it frees the place.
pub struct Slot(Arc<AppState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves once the server begins shutting down.
pub async fn shutdown_started(mut rx: watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        // The sender is gone without a shutdown: never resolve.
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_aliases() {
        let m = ModelIds::from_name("openai/gpt-oss-20b");
        assert_eq!(m.alias.as_deref(), Some("gpt-oss-20b"));
        assert!(m.check(Some("openai/gpt-oss-20b")).is_ok());
        assert!(m.check(Some("gpt-oss-20b")).is_ok());
        assert!(m.check(None).is_ok());
        assert_eq!(m.check(Some("gpt-4o")).unwrap_err().status.as_u16(), 404);
        let m = ModelIds::from_name("/models/SmolLM2.Q4_1.gguf");
        assert_eq!(m.alias.as_deref(), Some("SmolLM2.Q4_1"));
        let m = ModelIds::from_name("org/name@v2");
        assert_eq!(m.alias.as_deref(), Some("name"));
        assert_eq!(ModelIds::from_name("plain").alias, None);
    }
}
