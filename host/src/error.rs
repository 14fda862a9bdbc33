//! The one error type that becomes an HTTP response.
//!
//! Invariant: bodies are the contract's JSON (`{"error": ...}`), internal details are logged
//! once here and never sent, a `detail` is at most [`MAX_DETAIL_BYTES`] (plus a truncation
//! marker), and nothing secret is ever part of a message.

use std::sync::LazyLock;

use axum::{
    Json,
    http::{HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde_json::json;
use tracing::Level;

use crate::telemetry::Repeated;

/// Longest `detail` sent in an error body; a longer one (a parser's message can be any size)
/// is cut at a character boundary and ends with a marker giving the full length.
pub const MAX_DETAIL_BYTES: usize = 4096;

/// `detail`, capped at [`MAX_DETAIL_BYTES`] (plus [`text::cap`]'s marker).
pub fn cap_detail(detail: &str) -> std::borrow::Cow<'_, str> {
    if detail.len() <= MAX_DETAIL_BYTES {
        return detail.into();
    }
    crate::text::cap(detail.to_owned(), MAX_DETAIL_BYTES).into()
}

/// An error answer from the ingest or admin API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("unknown source")]
    UnknownSource,
    #[error("invalid signature: {0}")]
    InvalidSignature(String),
    /// The body is over its cap (bytes).
    #[error("payload too large: over the {0}-byte cap")]
    PayloadTooLarge(u64),
    #[error("unparsable: {0}")]
    Unparsable(String),
    #[error("overloaded")]
    Overloaded { retry_after_secs: u64 },
    #[error("request body not received in time")]
    BodyTimeout,
    /// The client's connection was reset before its request's body ended: nobody reads the
    /// answer (a 400, for the record), and it is not counted as an ingest request.
    #[error("the client's connection was reset before the request's body ended")]
    ClientGone,
    #[error("unauthorized")]
    Unauthorized,
    /// A client refused for a while (429, with `Retry-After`): too many wrong admin tokens.
    #[error("too many requests: {detail}")]
    TooManyRequests {
        detail: String,
        retry_after_secs: u64,
    },
    #[error("not found: {0}")]
    NotFound(String),
    /// The path is served, but not with this method (405, with the `Allow` header).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A body sent with a `Content-Type` the route does not read (415; the detail says what to
    /// send).
    #[error("unsupported media type: {0}")]
    UnsupportedMediaType(String),
    /// The request is well-formed but the target's state refuses it (a rollback without a
    /// previous version).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A write that must name the version it replaces did not (`If-Match` missing).
    #[error("precondition required: {0}")]
    PreconditionRequired(String),
    /// The version a write named is no longer the current one: nothing was written (409, as a
    /// concurrent change; the body's `error` tells it from the other conflicts).
    #[error("version conflict: {0}")]
    VersionConflict(String),
    /// Logged, answered as a bare 500.
    #[error("internal error: {0:#}")]
    Internal(#[from] anyhow::Error),
}

/// How long a client is asked to wait when the database is busy.
const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// Only a filter the inbox refuses is the client's fault (400); a busy database is a transient
/// overload (503 with `Retry-After`); anything else is the host's fault (500, logged, nothing of
/// it sent).
impl From<crate::inbox::InboxError> for ApiError {
    fn from(e: crate::inbox::InboxError) -> Self {
        use crate::inbox::InboxError;
        match e {
            InboxError::InvalidFilter(message) => Self::BadRequest(message),
            // Every request a lasting fault refuses would write these (a full disk, a database
            // down): one line per period each, counting those left out.
            InboxError::Busy(cause) => {
                static BUSY: LazyLock<Repeated> = LazyLock::new(|| {
                    Repeated::new(Level::WARN, "database busy; asking the client to retry")
                });
                overloaded(&BUSY, &cause, "database busy; asking the client to retry")
            }
            InboxError::Unavailable(cause) => {
                static UNAVAILABLE: LazyLock<Repeated> = LazyLock::new(|| {
                    Repeated::new(
                        Level::WARN,
                        "database unavailable; asking the client to retry",
                    )
                });
                let line = "database unavailable; asking the client to retry";
                overloaded(&UNAVAILABLE, &cause, line)
            }
            other => Self::Internal(other.into()),
        }
    }
}

/// The 503 for a database that cannot take the request now, its line written through
/// `repeated`.
fn overloaded(repeated: &Repeated, cause: &dyn std::fmt::Display, line: &str) -> ApiError {
    if let Some(left_out) = repeated.write() {
        tracing::warn!(error = %cause, left_out, "{line}");
    }
    ApiError::Overloaded {
        retry_after_secs: BUSY_RETRY_AFTER_SECS,
    }
}

impl ApiError {
    /// The `error` of this refusal's body (`invalid_signature`, `overloaded`, ...): also its
    /// outcome name in the metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownSource => "unknown_source",
            Self::InvalidSignature(_) => "invalid_signature",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::Unparsable(_) => "unparsable",
            Self::Overloaded { .. } => "overloaded",
            Self::BodyTimeout => "body_timeout",
            Self::ClientGone => "client_gone",
            Self::Unauthorized => "unauthorized",
            Self::TooManyRequests { .. } => "too_many_requests",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::BadRequest(_) => "bad_request",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::Conflict(_) => "conflict",
            Self::PreconditionRequired(_) => "precondition_required",
            Self::VersionConflict(_) => "version_conflict",
            Self::Internal(_) => "internal",
        }
    }
}

/// The answer to a path no route serves: both listeners' fallback, so a client that got the
/// path wrong (`/hooks/github/`, `/admin/event`) is told so in the contract's shape.
pub async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

/// The text of a refusal axum's extractors wrote as plain text (a path, query or form that
/// does not parse), taken out of `response`; `None` for every other answer. Callers answer it
/// in their own shape (JSON, or a dashboard page) like every other refusal.
pub async fn plain_refusal(response: &mut Response) -> Option<String> {
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/plain"));
    if !response.status().is_client_error() || !plain {
        return None;
    }
    let body = std::mem::take(response.body_mut());
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// The answer to a served path asked with a method it does not take (axum adds `Allow`).
pub async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = self.code();
        let (status, body) = match &self {
            Self::UnknownSource => (StatusCode::NOT_FOUND, json!({"error": error})),
            Self::InvalidSignature(detail) => (
                StatusCode::UNAUTHORIZED,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::PayloadTooLarge(cap) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": error, "detail": format!("the body is over this endpoint's cap of {cap} bytes")}),
            ),
            Self::Unparsable(detail) => (
                StatusCode::BAD_REQUEST,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::Overloaded { .. } => (StatusCode::SERVICE_UNAVAILABLE, json!({"error": error})),
            Self::BodyTimeout => (StatusCode::REQUEST_TIMEOUT, json!({"error": error})),
            Self::ClientGone => (StatusCode::BAD_REQUEST, json!({"error": error})),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, json!({"error": error})),
            Self::TooManyRequests { detail, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::NotFound(what) => (
                StatusCode::NOT_FOUND,
                json!({"error": error, "detail": cap_detail(what)}),
            ),
            Self::MethodNotAllowed(what) => (
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error": error, "detail": cap_detail(what)}),
            ),
            Self::BadRequest(detail) => (
                StatusCode::BAD_REQUEST,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::UnsupportedMediaType(detail) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::Conflict(detail) => (
                StatusCode::CONFLICT,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::PreconditionRequired(detail) => (
                StatusCode::PRECONDITION_REQUIRED,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::VersionConflict(detail) => (
                StatusCode::CONFLICT,
                json!({"error": error, "detail": cap_detail(detail)}),
            ),
            Self::Internal(e) => {
                tracing::error!(error = %format!("{e:#}"), "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": error}))
            }
        };
        let mut response = (status, Json(body)).into_response();
        if let Self::Overloaded { retry_after_secs }
        | Self::TooManyRequests {
            retry_after_secs, ..
        } = self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::InboxError;

    /// Status, `Retry-After` and JSON body of `e`'s answer.
    async fn answer(e: InboxError) -> (StatusCode, Option<String>, serde_json::Value) {
        let response = ApiError::from(e).into_response();
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, retry_after, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn an_invalid_filter_is_a_bad_request_naming_it() {
        let (status, _, body) = answer(InboxError::InvalidFilter("no such state".into())).await;
        assert_eq!(
            (status, body),
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "bad_request", "detail": "no such state"})
            )
        );
    }

    #[tokio::test]
    async fn a_busy_database_is_a_503_with_retry_after() {
        let cause = std::sync::Arc::new(std::io::Error::other("database is locked"));
        let (status, retry_after, _) = answer(InboxError::Busy(cause)).await;
        assert_eq!(
            (status, retry_after.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
    }

    #[tokio::test]
    async fn an_unavailable_database_is_a_503_with_retry_after() {
        let cause = std::sync::Arc::new(std::io::Error::other("connection refused"));
        let (status, retry_after, body) = answer(InboxError::Unavailable(cause)).await;
        assert_eq!(
            (status, retry_after.as_deref(), body),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1"),
                json!({"error": "overloaded"})
            )
        );
    }

    #[tokio::test]
    async fn a_storage_error_is_a_bare_500() {
        let cause = std::sync::Arc::new(std::io::Error::other("disk I/O error at page 7"));
        let (status, _, body) = answer(InboxError::Storage(cause)).await;
        assert_eq!(
            (status, body),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal"})
            )
        );
    }

    #[tokio::test]
    async fn a_panicked_read_is_a_bare_500() {
        let panicked = tokio::spawn(async { panic!("secret detail") })
            .await
            .unwrap_err();
        let (status, _, body) = answer(InboxError::ReadTask(panicked)).await;
        assert_eq!(
            (status, body),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal"})
            )
        );
    }

    #[test]
    fn long_details_are_cut_on_a_char_boundary_with_a_marker() {
        assert_eq!(cap_detail("short"), "short");
        let long = "é".repeat(MAX_DETAIL_BYTES); // 2 bytes each
        let capped = cap_detail(&long);
        assert!(capped.len() <= MAX_DETAIL_BYTES + 64, "{}", capped.len());
        assert!(
            capped.ends_with(&format!(
                "… [truncated: {} of {} bytes dropped]",
                MAX_DETAIL_BYTES,
                2 * MAX_DETAIL_BYTES
            )),
            "{capped}"
        );
    }
}
