//! The web console: one page and the files it loads, embedded in the binary and served at `/ui/` on the HTTP
//! port. The page is a client of the REST API (`rest.rs`) like any other: it sends the user's token as a bearer
//! header and the API scopes, checks and forwards every call. Nothing here reads queue state or tokens.
//!
//! Every answer carries a Content-Security-Policy that allows scripts, styles and connections to this origin
//! only (no inline script or style, no frames, no forms posting elsewhere), `nosniff`, and `no-referrer`.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The policy of every console answer: this origin only, nothing inline, never framed.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");
const ICON: &str = include_str!("ui/icon.svg");

/// One embedded file with its content type.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The files change with the binary: revalidate rather than keep an old script after an upgrade.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// The console's routes, as `openapi::UI_ROUTES` lists them.
pub fn routes() -> Router {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/ui/icon.svg", get(|| async { asset("image/svg+xml", ICON) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget of the issue: a page and what it loads under 200 KB.
    const PAGE_BUDGET_BYTES: usize = 200 * 1024;

    #[test]
    fn the_page_and_its_files_fit_the_budget_and_have_nothing_inline() {
        assert!(INDEX.len() + SCRIPT.len() + STYLE.len() + ICON.len() < PAGE_BUDGET_BYTES);
        // The policy forbids inline code: the page would silently lose it.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("style=") && !INDEX.contains("onclick"));
        assert!(!INDEX.contains("http://") && !INDEX.contains("https://"), "nothing fetched from elsewhere");
    }
}
