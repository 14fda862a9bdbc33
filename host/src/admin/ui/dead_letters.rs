//! The dead letters page: dead deliveries grouped by handler and the error kind of their last
//! attempt, each group with its count, a replay and a discard of the whole group (dry run
//! first, [`super::replay`]).
//!
//! Invariant: the groups are the inbox's ([`crate::inbox::Inbox::dead_letter_groups`]); a
//! group's replay and discard filter by exactly its handler, `dead` and its error kind, so a
//! group without an error kind (which no filter can name) has neither.

use std::sync::Arc;

use axum::{
    Extension,
    extract::State,
    response::{IntoResponse, Response},
};
use maud::html;

use super::{
    Ui, UiError,
    layout::{self, Nav},
    replay::Action,
    session::SignedIn,
};
use crate::cli::client::query;

/// Characters of a group's example error shown.
const EXAMPLE_CHARS: usize = 300;

/// `GET /dead-letters`.
pub(super) async fn page(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
) -> Result<Response, UiError> {
    let groups = ui.shared.inbox.dead_letter_groups().await?;
    let body = html! {
        @if groups.is_empty() {
            p.notice.ok { "No dead letters." }
        } @else {
            div.scroll { table.rows {
                thead { tr {
                    th scope="col" { "Handler" }
                    th scope="col" { "Error kind" }
                    th scope="col" class="num" { "Count" }
                    th scope="col" { "Died (UTC)" }
                    th scope="col" { "Example error" }
                    th scope="col" { span.muted { "Actions" } }
                } }
                tbody {
                    @for group in &groups {
                        @let kind = group.error_kind.as_deref().unwrap_or("");
                        @let events = format!("/events{}", query(&[
                            ("handler", Some(group.handler.clone())),
                            ("state", Some("dead".to_owned())),
                        ]));
                        tr {
                            td data-label="Handler" { (group.handler) }
                            td data-label="Error kind" { @if kind.is_empty() { span.muted { "none" } } @else { code { (kind) } } }
                            td.num data-label="Count" { (group.count) }
                            td data-label="Died" { (layout::time(group.first_ms))
                                @if group.last_ms != group.first_ms { " – " (layout::time(group.last_ms)) } }
                            td.wrap.mono data-label="Example" {
                                @if let Some(error) = &group.example_error {
                                    (error.chars().take(EXAMPLE_CHARS).collect::<String>())
                                    @if error.chars().count() > EXAMPLE_CHARS { "…" }
                                }
                            }
                            td data-label="Actions" { div.buttons {
                                a href=(events) { "Events" }
                                @if !kind.is_empty() {
                                    @for action in [Action::Replay, Action::Discard] {
                                        form.inline method="post" action=(action.path()) {
                                            (layout::csrf_field(&signed_in))
                                            input type="hidden" name="handler" value=(group.handler);
                                            input type="hidden" name="state" value="dead";
                                            input type="hidden" name="error_kind" value=(kind);
                                            input type="hidden" name="back" value="/dead-letters";
                                            button type="submit"
                                                aria-label={ (action.verb()) " the " (group.count) " " (kind) " dead letters of " (group.handler) } {
                                                (action.verb()) " group…"
                                            }
                                        }
                                    }
                                }
                            } }
                        }
                    }
                }
            } }
        }
    };
    Ok(layout::page("Dead letters", Nav::DeadLetters, &signed_in, body).into_response())
}
