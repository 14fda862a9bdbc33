//! The quarantine page: each held request (verified, but its parser could not make an event
//! of it) with its reason, a replay of one request (parsed again with today's parser) and a
//! discard of one request (resolved as discarded, after the browser's confirmation).
//!
//! Invariants: the list reads no body ([`crate::inbox::Inbox::held_requests`]); a replay is
//! [`crate::ingest::replay::run_held`], the rules of every quarantine replay, and a discard
//! [`crate::retention::discard::run_held`], every discard's; either answers a request that is
//! not held (any more) with a 404.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Path, Query, State},
    response::{IntoResponse, Response},
};
use maud::html;
use serde::Deserialize;

use super::{
    Ui, UiError,
    events::event_path,
    layout::{self, Nav},
    session::SignedIn,
};
use crate::{
    error::ApiError,
    ingest::replay::{self, Reparsed},
    retention::discard,
};

/// Requests per page.
const PAGE: usize = 100;

#[derive(Debug, Deserialize)]
pub(super) struct PageQuery {
    before: Option<i64>,
}

/// `GET /quarantine`.
pub(super) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Query(params): Query<PageQuery>,
) -> Result<Response, UiError> {
    let held = ui.shared.inbox.held_requests(PAGE, params.before).await?;
    let next = (held.len() == PAGE)
        .then(|| held.last().map(|h| h.id))
        .flatten();
    let body = html! {
        p.muted { (ui.shared.inbox.quarantine_held()) " held in all." }
        @if held.is_empty() {
            p.notice.ok { "Nothing is held." }
        } @else {
            div.scroll { table.rows {
                thead { tr {
                    th scope="col" class="num" { "Id" }
                    th scope="col" { "Source" }
                    th scope="col" { "Received (UTC)" }
                    th scope="col" { "Reason" }
                    th scope="col" { span.muted { "Actions" } }
                } }
                tbody {
                    @for request in &held {
                        tr {
                            td.num data-label="Id" { (request.id) }
                            td data-label="Source" { (request.source) }
                            td data-label="Received" { (layout::time(request.received_at)) }
                            td.wrap.mono data-label="Reason" { (request.reason) }
                            td data-label="Actions" { div.buttons {
                                form.inline method="post" action={ "/quarantine/" (request.id) "/replay" } {
                                    (layout::csrf_field(&signed_in))
                                    button type="submit" aria-label={ "Replay request " (request.id) } { "Replay" }
                                }
                                form.inline method="post" action={ "/quarantine/" (request.id) "/discard" }
                                    data-confirm={ "Discard request " (request.id) " of " (request.source) "? It will never become an event." } {
                                    (layout::csrf_field(&signed_in))
                                    button.danger type="submit" aria-label={ "Discard request " (request.id) } { "Discard" }
                                }
                            } }
                        }
                    }
                }
            } }
        }
        nav.pager aria-label="Pages" {
            @if params.before.is_some() { a href="/quarantine" { "← Newest" } }
            @if let Some(id) = next { a href={ "/quarantine?before=" (id) } rel="next" { "Older →" } }
        }
    };
    Ok(layout::page("Quarantine", Nav::Quarantine, &signed_in, body).into_response())
}

/// `POST /quarantine/{id}/replay`: a page saying what became of the request (an event, a
/// resolution without one, or still held, and why).
pub(super) async fn replay(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Path(id): Path<i64>,
) -> Result<Response, UiError> {
    let (report, outcome) = replay::run_held(&ui.shared, id).await?;
    if report.matched == 0 {
        return Err(not_held(id));
    }
    tracing::info!(
        quarantine_id = id,
        replayed = report.replayed,
        "quarantined request replayed from the dashboard"
    );
    let said = html! {
        @match &outcome {
            Reparsed::Accepted { source, event_id, duplicate } => {
                "Parsed: it left quarantine as "
                @if *duplicate { "a duplicate of the stored event " } @else { "the new event " }
                a href=(event_path(source.as_str(), event_id)) { (event_id) } "."
            }
            Reparsed::Resolved(reason) => {
                "It left quarantine without becoming an event: " (reason)
            }
            Reparsed::Kept(reason) => {
                "It still cannot be parsed and stays held: " (reason)
            }
            Reparsed::Gone => {
                "It was resolved or discarded meanwhile, by another replay or a discard."
            }
        }
    };
    Ok(outcome_page(&signed_in, id, said))
}

/// `POST /quarantine/{id}/discard`: a page saying the request was discarded.
pub(super) async fn discard(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Path(id): Path<i64>,
) -> Result<Response, UiError> {
    let report = discard::run_held(&ui.shared, id).await?;
    if report.matched == 0 {
        return Err(not_held(id));
    }
    // Logged by the service, once.
    let said = html! {
        "Discarded: it left quarantine without becoming an event; retention deletes it after "
        code { "retention.done_after" } " (unless that is " code { "\"forever\"" } ")."
    };
    Ok(outcome_page(&signed_in, id, said))
}

/// The refusal of a replay or discard of a request that is not held.
fn not_held(id: i64) -> UiError {
    ApiError::NotFound(format!(
        "no quarantined request {id} is held (replayed or discarded already?)"
    ))
    .into()
}

/// The page saying what became of request `id`.
fn outcome_page(signed_in: &SignedIn, id: i64, said: maud::Markup) -> Response {
    let body = html! {
        p role="status" { (said) }
        p { a href="/quarantine" { "Back to the quarantine" } }
    };
    let title = format!("Quarantined request {id}");
    layout::page(&title, Nav::Quarantine, signed_in, body).into_response()
}
