//! The accept loop, with the limits that keep slow or many clients from holding the server.
//!
//! `axum::serve` gives hyper no timer, so hyper's header read timeout is off (a client that
//! sends its headers one byte a minute holds its connection forever) and it accepts every
//! connection it can. This loop serves the same router over HTTP/1.1 with:
//! - at most `max_connections` open at once: past that, new ones wait in the kernel's backlog
//!   until one closes (the process never runs out of file descriptors);
//! - `idle` for a request's head to arrive, counted from when the connection is ready for one
//!   (so it is also how long an idle keep-alive connection stays open), and the most time
//!   between two pieces of a request body (a stalled upload ends with 400);
//! - a request head of at most [`MAX_HEAD_BYTES`] (hyper answers 431 past it), and hyper's
//!   default of at most 100 headers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// The largest request line and headers together, in bytes (what nginx allows by default is
/// 8 kB per header line; API keys and cookies fit many times over).
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// How long an accept error (out of descriptors, say) pauses the loop before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub idle: Duration,
}

/// Serves `app` on `listener` until `shutdown` completes, then waits for the open connections
/// to finish their requests (each closes after its current one).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let app = app.layer(RequestBodyTimeoutLayer::new(limits.idle));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.idle).max_header_size(MAX_HEAD_BYTES);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = accept(&listener, &permits) => a,
        };
        let Some((stream, permit)) = accepted else { continue };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Errors here are the client's (a reset, a bad head hyper already answered).
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The next connection once fewer than the limit are open; `None` after an accept error.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> Option<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    // The semaphore is never closed.
    let permit = permits.clone().acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, _)) => Some((stream, permit)),
        Err(e) => {
            tracing::warn!("accepting a connection: {e}");
            tokio::time::sleep(ACCEPT_RETRY).await;
            None
        }
    }
}
