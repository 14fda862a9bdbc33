//! Replay from the dashboard, in two steps: the form first runs the replay as a dry run and
//! shows how many deliveries it would touch; only the confirmation (`confirm=yes`) replays.
//!
//! Invariant: both steps go through [`crate::ingest::replay::run`] with one [`ReplayFilter`]
//! built here as `POST /admin/replay` builds its own (same bound, same rules), so the count
//! shown is the count the confirmation acts on (unless deliveries change in between).

use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::State,
    response::{IntoResponse, Redirect, Response},
};
use maud::html;
use serde::Deserialize;

use super::{
    Ui, UiError, exact, given,
    layout::{self, Nav},
    local_path,
    session::SignedIn,
};
use crate::{
    admin::{MAX_REPLAY, handlers::parse_state},
    inbox::ReplayFilter,
    ingest::replay,
};

/// What a replay form sends; empty fields do not filter.
#[derive(Debug, Deserialize)]
pub(super) struct ReplayForm {
    #[serde(default)]
    source: String,
    #[serde(default)]
    handler: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    event_id: String,
    #[serde(default)]
    error_kind: String,
    /// `yes` on the confirmation; anything else is the dry run.
    #[serde(default)]
    confirm: String,
    /// `yes`: deliver even if a newer sequence of the key is done (a forced replay).
    #[serde(default)]
    force: String,
    /// Where to go once replayed (a local path).
    #[serde(default)]
    back: String,
}

/// `POST /replay`.
pub(super) async fn replay(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Form(form): Form<ReplayForm>,
) -> Result<Response, UiError> {
    let confirmed = form.confirm == "yes";
    let filter = ReplayFilter {
        source: given(&form.source),
        handler: given(&form.handler),
        state: parse_state(given(&form.state).as_deref())?,
        event_ids: exact(&form.event_id).map(|id| vec![id]),
        since_ms: None,
        until_ms: None,
        error_kind: given(&form.error_kind),
        limit: MAX_REPLAY,
        dry_run: !confirmed,
        force: form.force == "yes",
        orphaned: false,
    };
    let back = local_path(given(&form.back).as_deref(), "/");
    let report = replay::run(&ui.shared, filter).await?;
    if confirmed {
        tracing::info!(
            matched = report.matched,
            replayed = report.replayed,
            "replayed from the dashboard"
        );
        return Ok(Redirect::to(&back).into_response());
    }
    let what = [
        ("Source", &form.source),
        ("Event id", &form.event_id),
        ("Handler", &form.handler),
        ("State", &form.state),
        ("Error kind", &form.error_kind),
    ];
    let body = html! {
        dl.envelope {
            @for (label, value) in what {
                @if !value.is_empty() { dt { (label) } dd { (value) } }
            }
        }
        @if report.matched == 0 {
            p.notice { "Nothing matches: no delivery would be replayed." }
            p { a href=(back) { "Back" } }
        } @else {
            p.notice {
                strong { (report.matched) } " "
                @if report.matched == 1 { "delivery matches" } @else { "deliveries match" }
                @if report.matched == MAX_REPLAY { " (the most one replay takes)" }
                ". Replaying sets " @if report.matched == 1 { "it" } @else { "them" }
                @if form.state == "retrying" {
                    " due now instead of after " @if report.matched == 1 { "its" } @else { "their" }
                    " backoff, with the attempt budget " @if report.matched == 1 { "it has." } @else { "they have." }
                } @else {
                    " due now with a fresh attempt budget."
                }
                @if form.force == "yes" {
                    " Forced: the handler gets " @if report.matched == 1 { "it" } @else { "them" }
                    " even if a newer sequence of the key is done (with the event marked stale)."
                }
            }
            form.inline method="post" action="/replay" {
                (layout::csrf_field(&signed_in))
                input type="hidden" name="source" value=(form.source);
                input type="hidden" name="handler" value=(form.handler);
                input type="hidden" name="state" value=(form.state);
                input type="hidden" name="event_id" value=(form.event_id);
                input type="hidden" name="error_kind" value=(form.error_kind);
                input type="hidden" name="back" value=(back);
                input type="hidden" name="confirm" value="yes";
                input type="hidden" name="force" value=(form.force);
                button.primary type="submit" { "Replay " (report.matched) }
            }
            " "
            a.button href=(back) { "Cancel" }
        }
    };
    Ok(layout::page("Replay?", Nav::Events, &signed_in, body).into_response())
}
