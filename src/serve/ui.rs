//! The chat page: `GET /` and its files under `/ui/`, built into the binary from `ui/` beside
//! this file (so the page works offline and always matches the server that serves it). The page
//! calls the same `/v1` API as any client, with the same key.
//!
//! The page and its files are served without the API key, on purpose: a browser's navigation to
//! `http://host:8080/` cannot send an `Authorization` header, so a protected page could never
//! load to ask for the key. Nothing here is secret: the files are the same bytes in every
//! inferno binary and hold no model name, conversation or key (those come from the API, which
//! stays protected, or stay in the browser). `--no-ui` removes the routes.
//!
//! Every answer forbids loading anything from elsewhere (Content-Security-Policy: scripts,
//! styles, images and requests from this origin only, no inline script, no framing), and
//! carries an ETag, so a reload revalidates with a 304 rather than downloading again.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::errors::ApiError;
use super::state::AppState;

/// Scripts, styles, images and API calls from this origin only; nothing inline, no plugins,
/// no forms posting elsewhere, not framed by other sites.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct File {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

const FILES: &[File] = &[
    File {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("ui/index.html"),
    },
    File {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("ui/style.css"),
    },
    File { name: "app.js", content_type: JS, body: include_bytes!("ui/app.js") },
    File { name: "api.js", content_type: JS, body: include_bytes!("ui/api.js") },
    File { name: "store.js", content_type: JS, body: include_bytes!("ui/store.js") },
    File { name: "view.js", content_type: JS, body: include_bytes!("ui/view.js") },
    File { name: "markdown.js", content_type: JS, body: include_bytes!("ui/markdown.js") },
    File { name: "icon.svg", content_type: "image/svg+xml", body: include_bytes!("ui/icon.svg") },
];

/// `GET /` and `GET /ui/{file}`.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|headers: HeaderMap| async move { serve("index.html", &headers) }))
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&file, &headers)
            }),
        )
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(file) = FILES.iter().find(|f| f.name == name) else {
        return ApiError::not_found("no such file of the chat page").into_response();
    };
    let etag = etag();
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut resp =
        if fresh { StatusCode::NOT_MODIFIED.into_response() } else { file.body.into_response() };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(file.content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Revalidated on every load: a new binary's page is never mixed with an old cached file.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// One tag for all the files (they change together, with the binary): a hash of their bytes.
fn etag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        // FNV-1a: stable across Rust versions, unlike std's hasher (no new dependency needed).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in FILES.iter().flat_map(|f| f.name.as_bytes().iter().chain(f.body)) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("\"{h:016x}\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_page_names_is_served() {
        let index = std::str::from_utf8(FILES[0].body).unwrap();
        let js: String = FILES
            .iter()
            .filter(|f| f.content_type == JS)
            .map(|f| f.name)
            .collect::<Vec<_>>()
            .join(" ");
        // What index.html links and what the modules import must exist here (a 404 at run time
        // would leave a blank page).
        let named = index
            .split("/ui/")
            .skip(1)
            .chain(
                FILES
                    .iter()
                    .filter(|f| f.content_type == JS)
                    .flat_map(|f| std::str::from_utf8(f.body).unwrap().split("from \"./").skip(1)),
            )
            .map(|rest| rest.split(['"', '?']).next().unwrap());
        for name in named {
            assert!(FILES.iter().any(|f| f.name == name), "{name} is not served ({js})");
        }
    }

    #[test]
    fn revalidation_answers_304() {
        let mut headers = HeaderMap::new();
        assert_eq!(serve("app.js", &headers).status(), StatusCode::OK);
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_str(etag()).unwrap());
        let resp = serve("app.js", &headers);
        assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(resp.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        assert_eq!(serve("../Cargo.toml", &headers).status(), StatusCode::NOT_FOUND);
    }
}
