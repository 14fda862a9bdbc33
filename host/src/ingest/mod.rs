//! The HTTP edge: `POST /hooks/{source}` → raw body (capped, timed) → provider handshake
//! ([`handshake`], answered and never stored) → verify → envelope → durable accept → 202; and
//! `GET /hooks/{source}` for providers whose handshake is a `GET`.
//!
//! Invariants:
//! - The signature is checked over the exact bytes received, before anything parses them.
//! - Bodies are read under [`body`]'s limits: the source's cap, one in-memory budget for all
//!   requests (503 when exhausted, never an unbounded buffer), idle/rate/total timeouts.
//! - A 2xx is sent only after the inbox's commit holding the request returned.
//! - Nothing verified is dropped: a parser that traps, times out or is missing quarantines the
//!   raw request (202 `quarantined`), to be parsed again by `POST /admin/replay`.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Instant, SystemTime},
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path, Request, State},
    http::{HeaderMap, StatusCode, Uri, request::Parts},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::json;

use crate::{
    Shared,
    config::SourceConfig,
    error::ApiError,
    ids::{EventId, SourceName},
    inbox::{Accepted, InboxError, RawRequest},
    model::Envelope,
    runtime::{CallContext, CallError, ParseRequest, ParseVerdict, ParserResponse},
    telemetry::Repeated,
    text,
    verify::Reply,
};

pub mod body;
mod handshake;
pub mod replay;

use body::{BodyBudget, BodyLimits};

/// The largest sequence hookd stores (SQLite integers are signed 64-bit).
pub const MAX_SEQUENCE: u64 = i64::MAX as u64;

/// The longest event id, event type or ordering key hookd stores, in bytes. Providers' are tens
/// of bytes; without a bound a sender could make every event list row carry a body-sized type.
pub const MAX_ENVELOPE_FIELD_BYTES: usize = 1024;

/// What the ingest handler shares: the host, the in-flight body budget of this listener, and
/// each source's limiters of the lines anyone may cause.
#[derive(Clone)]
struct Edge {
    shared: Arc<Shared>,
    budget: Arc<BodyBudget>,
    lines: Arc<HashMap<SourceName, SourceLines>>,
}

/// A source's lines that its requests write, one per period per source (so a flood to one
/// source leaves another its own line): what a source without a signature, or a handshake
/// without one, lets anyone send at request rate.
struct SourceLines {
    /// A request its parser refused.
    unparsable: Repeated,
    /// A provider's handshake answered.
    handshake: Repeated,
    /// A request its parser failed on, quarantined (a parser that traps on some body: anyone
    /// may send that body to a source without a signature).
    quarantined: Repeated,
    /// A request refused since the quarantine is full.
    quarantine_full: Repeated,
    /// A request refused since the host's plugin memory is exhausted.
    plugin_memory: Repeated,
}

impl SourceLines {
    fn new(source: &SourceName) -> Self {
        let line = |level, what: &str| Repeated::new(level, format!("{what}, source {source}"));
        let (info, warn) = (tracing::Level::INFO, tracing::Level::WARN);
        Self {
            unparsable: line(info, "request refused as unparsable (400)"),
            handshake: line(info, "provider handshake answered"),
            quarantined: line(warn, "request quarantined"),
            quarantine_full: line(warn, "quarantine full: request refused"),
            plugin_memory: line(
                warn,
                "request refused: the host's plugin memory is exhausted",
            ),
        }
    }
}

impl Edge {
    /// Whether `source`'s `line` is to be written now, with the count of those left out since
    /// the last ([`Repeated::write`]); never for a name that is not a configured source's.
    fn written(&self, source: &SourceName, line: fn(&SourceLines) -> &Repeated) -> Option<u64> {
        self.lines.get(source).map(line).and_then(Repeated::write)
    }
}

/// The ingest routes.
pub fn router(shared: Arc<Shared>) -> Router {
    let server = &shared.config.server;
    let budget = BodyBudget::new(
        server.max_inflight_body_bytes,
        server.max_inflight_body_bytes_per_ip,
    );
    let lines = Arc::new(
        shared
            .config
            .sources
            .values()
            .map(|source| (source.name.clone(), SourceLines::new(&source.name)))
            .collect(),
    );
    let edge = Edge {
        shared,
        budget,
        lines,
    };
    Router::new()
        .route(
            "/hooks/{source}",
            post(receive)
                .get(handshake::get)
                .fallback(handshake::other_method),
        )
        .fallback(crate::error::no_route)
        .method_not_allowed_fallback(crate::error::wrong_method)
        .layer(axum::middleware::from_fn_with_state(
            edge.clone(),
            count_the_rest,
        ))
        .with_state(edge)
}

/// Set on a response whose answer [`receive`] counted (or that is a `GET` handshake, which is
/// not counted by design), so [`count_the_rest`] does not count it again.
#[derive(Clone, Copy)]
struct Counted;

/// Counts every answer of the listener that [`receive`] did not: a path that is no route
/// (404 `not_found`), a method a source does not take (405 `method_not_allowed`), a source
/// name that is not UTF-8 (400 `bad_request`), under source `""`. A refusal axum's extractors
/// wrote as plain text is answered as JSON, as every other refusal.
async fn count_the_rest(
    State(edge): State<Edge>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let started = Instant::now();
    let mut response = next.run(request).await;
    if response.extensions_mut().remove::<Counted>().is_some() {
        return response;
    }
    if let Some(text) = crate::error::plain_refusal(&mut response).await {
        response = ApiError::BadRequest(text).into_response();
    }
    let outcome = match response.status() {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        status if status.is_client_error() => "bad_request",
        _ => "internal",
    };
    edge.shared
        .telemetry
        .ingest_answered("", outcome, started.elapsed());
    response
}

/// How long a request waits for its accept's commit before it is answered 503 instead: a
/// shared database that stopped answering (an old primary's address gone dark), or a disk
/// under the embedded one that stopped (frozen, a stalled device).
const STORE_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits for `accept` (owned, so that it can go on alone) at most [`STORE_ANSWER`]; past it,
/// the provider is told to retry rather than held for as long as TCP's own timeouts or a
/// stalled disk. Were the event committed after all, the retry is a duplicate; a 202 still
/// follows only a returned commit. An accept nobody waits for any more (past the answer time,
/// or its client gone, which drops the request's handler) runs to its end in a task of its
/// own, so the inbox's in-process counters and its dispatcher's wake-up see it through.
async fn within_store_answer<T: std::fmt::Debug + Send + 'static>(
    accept: impl Future<Output = Result<T, InboxError>> + Send + 'static,
) -> Result<T, ApiError> {
    let mut accept = RunsToItsEnd(Some(Box::pin(accept)));
    let running = accept.0.as_mut().expect("set above");
    match tokio::time::timeout(STORE_ANSWER, running).await {
        Ok(accepted) => {
            accept.0 = None;
            Ok(accepted?)
        }
        Err(_) => {
            tracing::warn!(
                waited_secs = STORE_ANSWER.as_secs(),
                "the database did not answer the accept in time: answered 503"
            );
            Err(ApiError::Overloaded {
                retry_after_secs: 1,
            })
        }
    }
}

/// An accept under way (boxed: it is moved into a task if dropped before its end).
type Accepting<T> = std::pin::Pin<Box<dyn Future<Output = Result<T, InboxError>> + Send>>;

/// An accept under way, handed to a task of its own if dropped before its end.
struct RunsToItsEnd<T: std::fmt::Debug + Send + 'static>(Option<Accepting<T>>);

impl<T: std::fmt::Debug + Send + 'static> Drop for RunsToItsEnd<T> {
    fn drop(&mut self) {
        let Some(accept) = self.0.take() else { return };
        // A future that panicked while polled cannot be polled again; outside a runtime there
        // is nothing to run it on (in a runtime shutting down, the task is dropped unrun: the
        // writer's queue still answers or fails a job already queued).
        if std::thread::panicking() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            match accept.await {
                Ok(stored) => tracing::info!(
                    ?stored,
                    "a request no longer waiting for its answer (a 503 for want of time, or \
                     its client gone) was stored after all: the provider's retry is a duplicate"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "the accept of a request no longer waiting for its answer failed"
                ),
            }
        });
    }
}

/// What the envelope step decided.
#[derive(Debug)]
pub enum EnvelopeOutcome {
    Envelope(Envelope),
    /// The request is malformed (400) — the parser's or the host's message.
    Invalid(String),
    /// Not an event worth storing (200).
    Ignore(String),
    /// The parser could not run to a verdict: keep the raw request for a later replay.
    Quarantine(String),
    /// The parser could not run for want of the host's shared plugin memory, which the calls in
    /// flight held: nothing is stored, and the provider is told to retry (503).
    Overloaded(String),
    /// Not an event: the parser's own answer (e.g. to a provider's handshake), sent as-is;
    /// nothing is stored.
    Respond(ParserResponse),
}

/// How a request was answered, for the metrics: an answer's outcome name (see
/// [`crate::telemetry::INGEST_OUTCOMES`]), or a refusal (named by its body's `error`).
type Answered = Result<(&'static str, Response), ApiError>;

/// Every log line of a request runs in its span: the source as requested, and the event id
/// once the envelope names it. Every answer is counted, by source and outcome, with its time.
///
/// The request is taken whole and its parts moved out: axum's `HeaderMap` and `Uri`
/// extractors would each copy theirs, on every request.
///
/// The span is `error`-level, as every span that gives log lines their context: enabled under
/// any filter that lets a line through, so a log filtered to warnings still names the source.
#[tracing::instrument(
    name = "receive", level = "error", skip_all, fields(source = source.as_str(), event)
)]
async fn receive(
    State(edge): State<Edge>,
    Path(source): Path<String>,
    request: Request,
) -> Response {
    let (
        Parts {
            uri,
            headers,
            extensions,
            ..
        },
        body,
    ) = request.into_parts();
    let client = crate::server::Client::of(&extensions);
    let started = Instant::now();
    // A signature's timestamp is checked against this machine's own clock, which needs no
    // agreement between nodes; the receipt time stored is the inbox's (on a shared database
    // the database server's), since it is when the event's deliveries become due.
    let received = SystemTime::now();
    let received_at_ms = edge.shared.inbox.clock().now_ms();
    let Some(config) = edge.shared.config.sources.get(source.as_str()) else {
        // Not a label: the name is the requester's, not the configuration's.
        edge.shared.telemetry.ingest_answered(
            "",
            ApiError::UnknownSource.code(),
            started.elapsed(),
        );
        return counted(ApiError::UnknownSource.into_response());
    };
    let answered = answer(
        &edge,
        config,
        (received, received_at_ms),
        uri,
        headers,
        body,
        client,
    )
    .await;
    let (outcome, response) = match answered {
        Ok(answer) => answer,
        // Reset before its body ended, as one gone before its answer was ready: not counted.
        Err(e @ ApiError::ClientGone) => return counted(e.into_response()),
        Err(e) => (e.code(), e.into_response()),
    };
    edge.shared
        .telemetry
        .ingest_answered(config.name.as_str(), outcome, started.elapsed());
    counted(response)
}

/// `response`, marked as counted (see [`count_the_rest`]).
pub(super) fn counted(mut response: Response) -> Response {
    response.extensions_mut().insert(Counted);
    response
}

/// [`receive`] for a configured source, `received` at this machine's time and at the inbox's
/// (in unix milliseconds).
async fn answer(
    edge @ Edge { shared, budget, .. }: &Edge,
    source: &Arc<SourceConfig>,
    (received, received_at_ms): (SystemTime, i64),
    uri: Uri,
    headers: HeaderMap,
    body: Body,
    client: Option<&crate::server::Client>,
) -> Answered {
    let limits = BodyLimits::new(&shared.config.server, source.max_body_bytes);
    let declared = body::declared_length(&headers);
    // Held until the request is answered, or an accept that holds the body ends: the bytes live
    // that long.
    let (body, reservation) = body::read(body, declared, limits, budget, client).await?;

    if let Some(answer) = handshake::post(edge, source, &uri, &headers, &body, received) {
        return Ok(answer);
    }
    let verified = source
        .verifier
        .verify(headers, body, received)
        .map_err(|e| {
            if e.is_malformed_request() {
                // Signed, but its event id is unusable: the sender's bug, not a forgery.
                ApiError::Unparsable(e.to_string())
            } else {
                ApiError::InvalidSignature(e.to_string())
            }
        })?;
    let request = RawRequest::from_verified(verified, received_at_ms);
    let query = uri.query().unwrap_or_default().to_owned();
    match envelope_of(shared, source, "POST", &query, &request).await {
        EnvelopeOutcome::Envelope(envelope) => {
            let event_id = envelope.event_id.clone();
            tracing::Span::current().record("event", event_id.as_str());
            // Decided before the request moves into the inbox; sent only once it is stored.
            let ack = source.verifier.accepted_reply(request.body());
            let max_backlog = shared.config.server.max_backlog;
            let Some(admission) = shared.inbox.admit(max_backlog, source.handlers.len()) else {
                // Over the bound: refuse new work, but a retry of a stored event is still
                // just a duplicate (refusing it would only make the provider retry again).
                // Waited on no longer than an accept: a database that stopped answering gets a
                // 503 (a read has nothing to see through, so it is simply dropped then).
                let asked = shared
                    .inbox
                    .contains_event(source.name.to_string(), event_id.to_string());
                let Ok(stored) = tokio::time::timeout(STORE_ANSWER, asked).await else {
                    tracing::warn!(
                        waited_secs = STORE_ANSWER.as_secs(),
                        "the database did not answer a duplicate check in time: answered 503"
                    );
                    return Err(ApiError::Overloaded {
                        retry_after_secs: 1,
                    });
                };
                let stored = stored?;
                if !stored {
                    return Err(ApiError::Overloaded {
                        retry_after_secs: 5,
                    });
                }
                return Ok(("duplicate", accepted_response(ack, &event_id, true)));
            };
            let inbox = shared.inbox.clone();
            let source = Arc::clone(source);
            let accepted = within_store_answer(async move {
                // The body's bytes stay counted for as long as the accept holds them, past a
                // 503 too (in-flight memory stays bounded while the database is stuck).
                let _held = (reservation, admission);
                inbox.accept_from(&source, envelope, request, None).await
            })
            .await?;
            let duplicate = accepted == Accepted::Duplicate;
            let outcome = if duplicate { "duplicate" } else { "accepted" };
            Ok((outcome, accepted_response(ack, &event_id, duplicate)))
        }
        EnvelopeOutcome::Invalid(detail) => {
            // Worth a line, as the parser's author may be the one to fix (the sender gets the
            // same detail); at most one per 10 s per source, since a source without a
            // signature lets anyone send these.
            let written = edge.written(&source.name, |lines| &lines.unparsable);
            if let Some(left_out) = written {
                tracing::info!(
                    detail = &*crate::error::cap_detail(&detail),
                    left_out,
                    "request refused as unparsable (400)"
                );
            }
            Err(ApiError::Unparsable(detail))
        }
        EnvelopeOutcome::Ignore(reason) => {
            // The parser's words, as long as it likes: capped like an invalid one's detail.
            tracing::debug!(
                reason = &*crate::error::cap_detail(&reason),
                "request ignored by its parser"
            );
            let body = json!({"accepted": false, "ignored": true});
            Ok(("ignored", (StatusCode::OK, Json(body)).into_response()))
        }
        EnvelopeOutcome::Respond(answer) => Ok(("responded", parser_answer(answer))),
        EnvelopeOutcome::Overloaded(reason) => {
            let written = edge.written(&source.name, |lines| &lines.plugin_memory);
            if let Some(left_out) = written {
                tracing::warn!(
                    reason,
                    left_out,
                    "request refused: the host's plugin memory is exhausted"
                );
            }
            Err(ApiError::Overloaded {
                retry_after_secs: 1,
            })
        }
        EnvelopeOutcome::Quarantine(reason) => {
            // Bounded like the backlog: a parser broken under a storm of requests must not
            // fill the disk; the provider gets a 503 and retries later.
            let max_held = shared.config.server.max_backlog;
            let (inbox, name, why) = (shared.inbox.clone(), source.name.clone(), reason.clone());
            let kept = within_store_answer(async move {
                let _held = reservation;
                inbox.quarantine(name, request, why, max_held).await
            })
            .await?;
            let Some(quarantine_id) = kept else {
                let written = edge.written(&source.name, |lines| &lines.quarantine_full);
                if let Some(left_out) = written {
                    tracing::warn!(
                        reason,
                        max_held,
                        left_out,
                        "quarantine full: request refused"
                    );
                }
                return Err(ApiError::Overloaded {
                    retry_after_secs: 5,
                });
            };
            // At most one line per 10 s per source: each is in the quarantine's list anyway.
            let written = edge.written(&source.name, |lines| &lines.quarantined);
            if let Some(left_out) = written {
                tracing::warn!(quarantine_id, reason, left_out, "request quarantined");
            }
            let body = json!({"accepted": true, "quarantined": true});
            Ok((
                "quarantined",
                (StatusCode::ACCEPTED, Json(body)).into_response(),
            ))
        }
    }
}

/// The answer to a stored event: the provider's own shape where its scheme has one
/// ([`crate::verify::Verifier::accepted_reply`], discord), else hookd's `202`.
fn accepted_response(ack: Option<Reply>, event_id: &EventId, duplicate: bool) -> Response {
    if let Some(reply) = ack {
        return handshake::answered(reply);
    }
    /// Serialised straight from the fields (building a `serde_json::Value` map first cost a
    /// few allocations per request).
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        accepted: bool,
        duplicate: bool,
        event_id: &'a EventId,
    }
    let body = Stored {
        accepted: true,
        duplicate,
        event_id,
    };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// A parser's `respond`, as the provider receives it (the runtime checked its status and
/// headers and capped its size): with `X-Content-Type-Options: nosniff`, as every answer of
/// hookd's own (a parser's own value replaced), and without a body (nor its `Content-Length`)
/// on a 204, 205 or 304, which HTTP says have none.
fn parser_answer(answer: ParserResponse) -> Response {
    let ParserResponse {
        status,
        mut headers,
        body,
    } = answer;
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    if matches!(
        status,
        StatusCode::NO_CONTENT | StatusCode::RESET_CONTENT | StatusCode::NOT_MODIFIED
    ) {
        return (status, headers).into_response();
    }
    (status, headers, body).into_response()
}

/// [`envelope_of`] a stored `POST` (quarantine replay): its query was not kept, so the parser
/// sees none.
pub async fn envelope(
    shared: &Shared,
    source: &SourceConfig,
    request: &RawRequest,
) -> EnvelopeOutcome {
    envelope_of(shared, source, "POST", "", request).await
}

/// Produces the envelope of a verified request: the source's parser plugin (given the request's
/// `method` and `query`), or without one the scheme's own delivery-id header.
pub async fn envelope_of(
    shared: &Shared,
    source: &SourceConfig,
    method: &str,
    query: &str,
    request: &RawRequest,
) -> EnvelopeOutcome {
    let Some(parser) = &source.parser else {
        return within_limits(envelope_from_headers(source, request), None);
    };
    let plugin = shared.config.plugin(parser);
    let Some(loaded) = shared.registry.get(&plugin.wasm) else {
        return EnvelopeOutcome::Quarantine(format!(
            "parser plugin {parser} ({}.wasm) is not loaded",
            plugin.wasm
        ));
    };
    let ctx = CallContext {
        plugin: parser.clone(),
        config: Arc::new(plugin.config.clone()),
        event: None,
        // Unless set, the budget grows with the body, so a large genuine event (GitHub sends
        // up to 25 MB) is parsed rather than quarantined for want of memory or time.
        limits: plugin.parser_limits(request.body().len()),
    };
    // Boxed: the call's future is kilobytes, and inline it would be moved with every request's
    // future, parser or not.
    let verdict = Box::pin(shared.runtime.parse(
        &loaded.plugin,
        &ctx,
        ParseRequest {
            source: &source.name,
            method,
            query,
            headers: request.headers(),
            body: request.body(),
            received_at_ms: request.received_at_ms(),
        },
    ))
    .await;
    match verdict {
        Ok(ParseVerdict::Envelope(envelope)) => {
            within_limits(EnvelopeOutcome::Envelope(envelope), Some(parser))
        }
        Ok(ParseVerdict::Invalid(message)) => EnvelopeOutcome::Invalid(message),
        Ok(ParseVerdict::Ignore(message)) => EnvelopeOutcome::Ignore(message),
        Ok(ParseVerdict::Respond(answer)) => EnvelopeOutcome::Respond(answer),
        Err(CallError::HostMemory(reason) | CallError::NoMemoryToStart(reason)) => {
            EnvelopeOutcome::Overloaded(format!("parser plugin {parser} could not run: {reason}"))
        }
        Err(e) => EnvelopeOutcome::Quarantine(format!(
            "parser plugin {parser} (sha256 {}) failed: {}: {e}",
            loaded.plugin.sha256(),
            e.kind()
        )),
    }
}

/// `outcome`, unless it is an envelope hookd cannot store as it is: a 400 naming what and who
/// gave it (`parser`, else the request). A `sequence` over [`MAX_SEQUENCE`] would wrap negative
/// as SQLite's signed integer and make every older event of its key look newer; an id, type or
/// key over [`MAX_ENVELOPE_FIELD_BYTES`] is refused with its size.
fn within_limits(outcome: EnvelopeOutcome, parser: Option<&str>) -> EnvelopeOutcome {
    let EnvelopeOutcome::Envelope(envelope) = &outcome else {
        return outcome;
    };
    let from = || parser.map_or("the request".to_owned(), |p| format!("parser plugin {p}"));
    if let Some(sequence) = envelope.sequence.filter(|&s| s > MAX_SEQUENCE) {
        return EnvelopeOutcome::Invalid(format!(
            "{} returned sequence {sequence}, over the largest hookd stores ({MAX_SEQUENCE}, \
             2^63 - 1)",
            from()
        ));
    }
    let fields = [
        ("event id", envelope.event_id.as_str()),
        ("event type", envelope.event_type.as_str()),
        (
            "ordering key",
            envelope.ordering_key.as_deref().unwrap_or_default(),
        ),
    ];
    for (field, value) in fields {
        if text::has_nul(value) {
            // PostgreSQL's text holds none; altered, the id would name another event.
            return EnvelopeOutcome::Invalid(format!(
                "{} gave an {field} holding a NUL character (U+0000), which hookd does not store",
                from()
            ));
        }
        if value.len() > MAX_ENVELOPE_FIELD_BYTES {
            return EnvelopeOutcome::Invalid(format!(
                "{} gave an {field} of {} bytes, over the {MAX_ENVELOPE_FIELD_BYTES} hookd stores",
                from(),
                value.len()
            ));
        }
    }
    outcome
}

/// A JSON object's top-level string `type`, read without building the document (building a
/// `serde_json::Value` of a whole body was a tenth of ingest's CPU).
fn json_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    let typed: Typed = serde_json::from_slice(body).ok()?;
    typed.kind.map(std::borrow::Cow::into_owned)
}

fn envelope_from_headers(source: &SourceConfig, request: &RawRequest) -> EnvelopeOutcome {
    let header = |name: &str| {
        request
            .headers()
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let scheme = source.verifier.scheme();
    let Some(id_header) = scheme.id_header() else {
        return EnvelopeOutcome::Invalid(format!(
            "source {} has no parser and scheme {} has no event-id header: configure `parser`",
            source.name,
            scheme.name()
        ));
    };
    let Some(event_id) = scheme
        .id_headers()
        .find_map(&header)
        .filter(|v| !v.is_empty())
    else {
        return EnvelopeOutcome::Invalid(format!("missing the {id_header} header (the event id)"));
    };
    // The scheme's type header, else a JSON body's `type` (standard-webhooks puts it there).
    let event_type = scheme
        .type_header()
        .and_then(|h| header(h).map(str::to_owned))
        .or_else(|| json_type(request.body()))
        .unwrap_or_else(|| "unknown".into());
    EnvelopeOutcome::Envelope(Envelope {
        event_id: EventId::new(event_id),
        event_type,
        ordering_key: None,
        sequence: None,
    })
}

#[cfg(test)]
mod tests {
    use super::{Accepted, ApiError, json_type, within_store_answer};

    /// An accept the database does not answer is a 503 after the answer time, and still runs
    /// to its end afterwards.
    #[tokio::test(start_paused = true)]
    async fn an_accept_past_the_answer_time_is_a_503_and_still_runs_to_its_end() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (finished, ended) = tokio::sync::oneshot::channel();
        let answer = within_store_answer(async move {
            let _ = released.await;
            let _ = finished.send(());
            Ok(Accepted::New)
        })
        .await;
        assert!(
            matches!(answer, Err(ApiError::Overloaded { .. })),
            "{answer:?}"
        );
        release.send(()).unwrap();
        ended.await.expect("the accept cut short ran to its end");
        let answer = within_store_answer(async { Ok(Accepted::Duplicate) }).await;
        assert!(matches!(answer, Ok(Accepted::Duplicate)), "{answer:?}");
    }

    /// An accept whose request is dropped before the commit answers (its client gone: hyper
    /// drops the handler) still runs to its end, so what follows a commit (the backlog's count,
    /// the dispatcher's wake-up) is not skipped for an event that was stored.
    #[tokio::test(start_paused = true)]
    async fn an_accept_whose_client_left_still_runs_to_its_end() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (finished, ended) = tokio::sync::oneshot::channel();
        let waiting = within_store_answer(async move {
            let _ = released.await;
            let _ = finished.send(());
            Ok(Accepted::New)
        });
        // The client leaves a second in.
        let left = tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await;
        assert!(left.is_err(), "answered before the commit");
        release.send(()).unwrap();
        ended
            .await
            .expect("the accept of a request dropped ran to its end");
    }

    #[test]
    fn the_type_of_a_json_body_is_its_top_level_string_type() {
        let body = br#"{"data":{"type":"inner","n":[1,2,{"x":null}]},"type":"invoice.paid"}"#;
        assert_eq!(json_type(body).as_deref(), Some("invoice.paid"));
        // Escapes are decoded (the value is then not borrowed from the body).
        assert_eq!(
            json_type(br#"{"type":"a\"b\u00e9"}"#).as_deref(),
            Some("a\"bé")
        );
        for untyped in [
            &br#"{"data":{"type":"inner"}}"#[..],
            br#"{"type":7}"#,
            br#"{"type":null}"#,
            br#"["type","x"]"#,
            b"not json",
            br#"{"type":"x""#,
        ] {
            assert_eq!(
                json_type(untyped),
                None,
                "{}",
                String::from_utf8_lossy(untyped)
            );
        }
    }
}
