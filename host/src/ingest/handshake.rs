//! Provider set-up handshakes at the HTTP edge: `GET /hooks/{source}` and the handshake step of
//! `POST /hooks/{source}`, answered synchronously from the source's verifier.
//!
//! Invariants:
//! - A handshake is answered here and never reaches the inbox: nothing of it is stored.
//! - `GET` is answered only for schemes whose provider proves the endpoint with a `GET`
//!   ([`verify::SchemeKind::answers_get`]); for every other source it is 405.
//! - What is answered, and whether a token or signature holds, is decided by `verify` alone;
//!   this file only maps its answer and its refusals (401 signature, 403 verify token, 400
//!   malformed) onto HTTP. Every answer carries `X-Content-Type-Options: nosniff`, because it
//!   echoes text the caller chose.
//!
//! [`verify::SchemeKind::answers_get`]: crate::verify::SchemeKind::answers_get

use std::time::SystemTime;

use axum::{
    Json,
    extract::{Path, Query, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{
    config::SourceConfig,
    error::ApiError,
    verify::{HandshakeError, Reply},
};

/// `GET /hooks/{source}`: the provider's `GET` handshake, or 405 for a scheme without one.
#[tracing::instrument(
    name = "handshake", level = "error", skip_all, fields(source = source.as_str())
)]
pub(super) async fn get(
    State(edge): State<super::Edge>,
    Path(source): Path<String>,
    uri: Uri,
) -> Response {
    let started = std::time::Instant::now();
    let (label, refusal, response) = answer_get(&edge, &source, &uri);
    let shared = &edge.shared;
    // An answered handshake is not counted among the ingest answers (a provider's set-up step,
    // not an event); a refusal is, as on `POST`.
    if let Some(outcome) = refusal {
        shared
            .telemetry
            .ingest_answered(label, outcome, started.elapsed());
    }
    super::counted(response)
}

/// The answer to a `GET`, with the source label to count it under and, for a refusal, its
/// outcome.
fn answer_get<'c>(
    edge: &'c super::Edge,
    source: &str,
    uri: &Uri,
) -> (&'c str, Option<&'static str>, Response) {
    let Some(source) = edge.shared.config.sources.get(source) else {
        let refusal = ApiError::UnknownSource;
        return ("", Some(refusal.code()), refusal.into_response());
    };
    let label = source.name.as_str();
    let not_allowed = || {
        let scheme = source.verifier.scheme().name();
        let detail = format!("scheme {scheme} has no GET handshake; events are POSTed");
        let refusal = ApiError::MethodNotAllowed(detail);
        (label, Some(refusal.code()), with_allow(refusal, "POST"))
    };
    if !source.verifier.scheme().kind().answers_get() {
        return not_allowed();
    }
    let Ok(Query(query)) = Query::<Vec<(String, String)>>::try_from_uri(uri) else {
        let refusal = ApiError::BadRequest("the query string is not valid form encoding".into());
        return (label, Some(refusal.code()), refusal.into_response());
    };
    match source.verifier.answer_get(&query) {
        Ok(Some(reply)) => (label, None, handshake_answered(edge, source, reply)),
        Ok(None) => not_allowed(),
        Err(e) => {
            let (outcome, response) = refused(&e);
            (label, Some(outcome), response)
        }
    }
}

/// Any other method on `/hooks/{source}`: the contract's 405, its `Allow` naming what the
/// source takes (`GET` and `HEAD` only for a scheme with a `GET` handshake).
/// Counted under the source when it is a configured one, else (by [`super::count_the_rest`])
/// under `""`.
pub(super) async fn other_method(
    State(super::Edge { shared, .. }): State<super::Edge>,
    Path(source): Path<String>,
    method: Method,
    uri: Uri,
) -> Response {
    let started = std::time::Instant::now();
    let source = shared.config.sources.get(source.as_str());
    let answers_get = source.is_some_and(|source| source.verifier.scheme().kind().answers_get());
    let allow = if answers_get { "GET,HEAD,POST" } else { "POST" };
    let refusal = crate::error::wrong_method(method, uri).await;
    let Some(source) = source else {
        return with_allow(refusal, allow);
    };
    shared
        .telemetry
        .ingest_answered(source.name.as_str(), refusal.code(), started.elapsed());
    super::counted(with_allow(refusal, allow))
}

/// A 405 `refusal` with its `Allow` header (set here, axum keeps it instead of its own).
fn with_allow(refusal: ApiError, allow: &'static str) -> Response {
    let mut response = refusal.into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// The handshake step of `POST /hooks/{source}`, before the request is verified as an event:
/// if the request is a handshake, its outcome (`responded`, or the refusal's) and response.
pub(super) fn post(
    edge: &super::Edge,
    source: &SourceConfig,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    received: SystemTime,
) -> Option<(&'static str, Response)> {
    // A query that is not form encoding carries no handshake parameter.
    let query = Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map(|Query(query)| query)
        .unwrap_or_default();
    match source.verifier.answer_post(&query, headers, body, received) {
        Ok(reply) => reply.map(|reply| ("responded", handshake_answered(edge, source, reply))),
        Err(e) => Some(refused(&e)),
    }
}

/// A handshake's answer, logged at most once per period per source: several handshakes need
/// no signature (Twitter's CRC, Microsoft Graph's and Dropbox's challenges), so anyone may send
/// them at request rate.
fn handshake_answered(edge: &super::Edge, source: &SourceConfig, reply: Reply) -> Response {
    let written = edge.written(&source.name, |lines| &lines.handshake);
    if let Some(left_out) = written {
        tracing::info!(left_out, "provider handshake answered");
    }
    answered(reply)
}

/// `200` with `reply`: a handshake's answer, or the provider's own acknowledgement of a stored
/// event.
pub(super) fn answered(reply: Reply) -> Response {
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(reply.content_type),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ];
    (StatusCode::OK, headers, reply.body).into_response()
}

/// A refused handshake: its outcome (the answer's `error`) and its response. Logged at debug
/// only, as a refused event is not logged: anyone can send one, at request rate.
fn refused(e: &HandshakeError) -> (&'static str, Response) {
    tracing::debug!(error = %e, "provider handshake refused");
    let refusal = match e.status() {
        StatusCode::UNAUTHORIZED => ApiError::InvalidSignature(e.to_string()),
        StatusCode::FORBIDDEN => {
            let response = (
                StatusCode::FORBIDDEN,
                Json(json!({"error": "forbidden", "detail": e.to_string()})),
            );
            return ("forbidden", response.into_response());
        }
        _ => ApiError::BadRequest(e.to_string()),
    };
    (refusal.code(), refusal.into_response())
}
