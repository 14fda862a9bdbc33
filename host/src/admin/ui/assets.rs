//! The dashboard's static files, compiled into the binary: one stylesheet, one small script,
//! one icon. No CDN, no web font, no build step: `cargo build` is the whole build.
//!
//! Invariant: only the files listed in [`FILES`] are served, with their own content type; they
//! hold nothing secret, so they are served without a session.

use axum::{
    extract::Path,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// Name, content type, content.
const FILES: [(&str, &str, &str); 3] = [
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("assets/app.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    ),
    ("icon.svg", "image/svg+xml", include_str!("assets/icon.svg")),
];

/// `GET /assets/{file}`.
pub(super) async fn serve(Path(file): Path<String>) -> Response {
    let Some((_, content_type, content)) = FILES.iter().find(|(name, ..)| *name == file) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut response = (*content).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}
