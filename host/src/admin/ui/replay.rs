//! Replay and discard from the dashboard, in two steps: the form first runs the action as a
//! dry run and shows how many deliveries it would touch; only the confirmation (`confirm=yes`)
//! replays or discards. Both actions share this one path: the form, the filter, the
//! confirmation page.
//!
//! Invariants:
//! - Both steps go through the action's service ([`crate::ingest::replay::run`],
//!   [`crate::retention::discard::run`]) with one [`ReplayFilter`] built here as
//!   `POST /admin/replay` builds its own (same bound, same rules), so the count shown is the
//!   count the confirmation acts on (unless deliveries change in between).
//! - A discard from the dashboard never widens: its filter names a handler and state `dead`
//!   (a dead letter or a group of them), so it never covers held quarantined requests
//!   ([`ReplayFilter::covers_quarantine`]); any other is refused and nothing is discarded.
//! - Every confirmed action is logged (how many matched and were acted on).

use std::sync::Arc;

use axum::{
    Extension, Form,
    extract::State,
    response::{IntoResponse, Redirect, Response},
};
use maud::{Markup, html};
use serde::Deserialize;

use super::{
    Ui, UiError, exact, format, given,
    layout::{self, Nav},
    local_path,
    session::SignedIn,
};
use crate::{
    admin::{MAX_REPLAY, handlers::parse_state},
    error::ApiError,
    inbox::ReplayFilter,
    ingest::replay,
    model::DeliveryState,
    retention::discard,
};

/// What a two-step form does to the deliveries it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Run them again (`POST /replay`).
    Replay,
    /// Close them as `discarded` (`POST /discard`).
    Discard,
}

impl Action {
    /// The route its form posts to.
    pub(super) fn path(self) -> &'static str {
        match self {
            Action::Replay => "/replay",
            Action::Discard => "/discard",
        }
    }

    /// The word on its buttons and confirmation heading.
    pub(super) fn verb(self) -> &'static str {
        match self {
            Action::Replay => "Replay",
            Action::Discard => "Discard",
        }
    }
}

/// What a replay or discard form sends; empty fields do not filter.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ActionForm {
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
    /// Where to go once done (a local path).
    #[serde(default)]
    back: String,
}

impl ActionForm {
    fn confirmed(&self) -> bool {
        self.confirm == "yes"
    }

    /// The filter both steps of `action` run. A discard's must name a handler and state
    /// `dead` (so it never reaches quarantine); any other is a 400.
    fn filter(&self, action: Action) -> Result<ReplayFilter, ApiError> {
        let filter = ReplayFilter {
            source: given(&self.source),
            handler: given(&self.handler),
            state: parse_state(given(&self.state).as_deref())?,
            event_ids: exact(&self.event_id).map(|id| vec![id]),
            since_ms: None,
            until_ms: None,
            error_kind: given(&self.error_kind),
            limit: MAX_REPLAY,
            dry_run: !self.confirmed(),
            force: self.force == "yes",
            orphaned: false,
            declared_handlers: None,
        };
        let dead_letters = filter.handler.is_some()
            && filter.state == Some(DeliveryState::Dead)
            && !filter.covers_quarantine();
        if action == Action::Discard && !dead_letters {
            return Err(ApiError::BadRequest(
                "a discard from the dashboard takes dead letters: it names a handler and state \
                 dead; nothing was discarded"
                    .into(),
            ));
        }
        Ok(filter)
    }
}

/// `POST /replay`.
pub(super) async fn replay(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    two_steps(&ui, &signed_in, &form, Action::Replay).await
}

/// `POST /discard`.
pub(super) async fn discard(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Form(form): Form<ActionForm>,
) -> Result<Response, UiError> {
    two_steps(&ui, &signed_in, &form, Action::Discard).await
}

/// Either step of `action`: the dry run's confirmation page, or, confirmed, the action and
/// back to where the form came from.
async fn two_steps(
    ui: &Ui,
    signed_in: &SignedIn,
    form: &ActionForm,
    action: Action,
) -> Result<Response, UiError> {
    let filter = form.filter(action)?;
    let back = local_path(given(&form.back).as_deref(), "/");
    let (matched, done) = match action {
        Action::Replay => {
            let report = replay::run(&ui.shared, filter).await?;
            (report.matched, report.replayed)
        }
        Action::Discard => {
            let report = discard::run(&ui.shared, filter).await?;
            (report.matched, report.discarded)
        }
    };
    if form.confirmed() {
        match action {
            Action::Replay => {
                tracing::info!(matched, replayed = done, "replayed from the dashboard");
            }
            Action::Discard => {
                tracing::info!(matched, discarded = done, "discarded from the dashboard");
            }
        }
        return Ok(Redirect::to(&back).into_response());
    }
    let done_after = ui.shared.config.retention.done_after;
    let body = confirmation(signed_in, form, action, matched, &back, done_after);
    let title = format!("{}?", action.verb());
    Ok(layout::page(&title, Nav::Events, signed_in, body).into_response())
}

/// The dry run's page: what the form filters by, how many deliveries match and what `action`
/// does to them, and the confirmation (the same form with `confirm=yes`).
fn confirmation(
    signed_in: &SignedIn,
    form: &ActionForm,
    action: Action,
    matched: usize,
    back: &str,
    done_after: Option<std::time::Duration>,
) -> Markup {
    let what = [
        ("Source", &form.source),
        ("Event id", &form.event_id),
        ("Handler", &form.handler),
        ("State", &form.state),
        ("Error kind", &form.error_kind),
    ];
    let one = matched == 1;
    let them = if one { "it" } else { "them" };
    let verb = action.verb().to_lowercase();
    html! {
        dl.envelope {
            @for (label, value) in what {
                @if !value.is_empty() { dt { (label) } dd { (value) } }
            }
        }
        @if matched == 0 {
            p.notice { "Nothing matches: no delivery would be " (verb) "ed." }
            p { a href=(back) { "Back" } }
        } @else {
            p.notice {
                strong { (matched) } " "
                @if one { "delivery matches" } @else { "deliveries match" }
                @if matched == MAX_REPLAY { " (the most one " (verb) " takes)" }
                ". "
                @match action {
                    Action::Replay => {
                        "Replaying sets " (them)
                        @if form.state == "retrying" {
                            " due now instead of after " @if one { "its" } @else { "their" }
                            " backoff, with the attempt budget " @if one { "it has." } @else { "they have." }
                        } @else {
                            " due now with a fresh attempt budget."
                        }
                        @if form.force == "yes" {
                            " Forced: the handler gets " (them)
                            " even if a newer sequence of the key is done (with the event marked stale)."
                        }
                    }
                    Action::Discard => {
                        "Discarding closes " (them) " as " code { "discarded" } ": no handler runs "
                        (them) "; "
                        @if let Some(after) = done_after {
                            @if one { "it is" } @else { "they are" } " pruned after "
                            code { "retention.done_after" } " (" (format::duration(i64::try_from(after.as_millis()).unwrap_or(i64::MAX))) "),"
                        } @else {
                            "retention keeps " (them) " (" code { "retention.done_after" } " is forever),"
                        }
                        " and until then a replay of state " code { "discarded" } " can still run " (them) "."
                    }
                }
            }
            form.inline method="post" action=(action.path()) {
                (layout::csrf_field(signed_in))
                input type="hidden" name="source" value=(form.source);
                input type="hidden" name="handler" value=(form.handler);
                input type="hidden" name="state" value=(form.state);
                input type="hidden" name="event_id" value=(form.event_id);
                input type="hidden" name="error_kind" value=(form.error_kind);
                input type="hidden" name="back" value=(back);
                input type="hidden" name="confirm" value="yes";
                input type="hidden" name="force" value=(form.force);
                @match action {
                    Action::Replay => button.primary type="submit" { "Replay " (matched) },
                    Action::Discard => button.danger type="submit" { "Discard " (matched) },
                }
            }
            " "
            a.button href=(back) { "Cancel" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(handler: &str, state: &str) -> ActionForm {
        ActionForm {
            source: "s".into(),
            handler: handler.into(),
            state: state.into(),
            ..ActionForm::default()
        }
    }

    /// A discard from the dashboard takes dead letters only: a form without a handler, or with
    /// another state, would reach held quarantined requests or other deliveries, and is
    /// refused; one it takes never covers quarantine.
    #[test]
    fn a_dashboard_discard_never_widens() {
        let taken = form("h", "dead").filter(Action::Discard).unwrap();
        assert!(!taken.covers_quarantine());
        assert!(taken.dry_run);
        for (handler, state) in [
            ("", "dead"),
            ("", ""),
            ("h", ""),
            ("h", "done"),
            (" ", "dead"),
        ] {
            let refused = form(handler, state).filter(Action::Discard);
            assert!(refused.is_err(), "{handler:?} {state:?}");
        }
        // A replay keeps its wider filters (a source's dead letters and held requests).
        assert!(
            form("", "")
                .filter(Action::Replay)
                .unwrap()
                .covers_quarantine()
        );
    }

    /// The confirmation names the action: its heading's verb, its button, what it does.
    #[test]
    fn the_confirmation_says_what_a_discard_does() {
        let signed_in = SignedIn::for_tests();
        let page = |matched| {
            confirmation(
                &signed_in,
                &form("h", "dead"),
                Action::Discard,
                matched,
                "/e",
                Some(std::time::Duration::from_secs(86_400)),
            )
            .into_string()
        };
        let two = page(2);
        assert!(two.contains("deliveries match"), "{two}");
        assert!(two.contains(r#"action="/discard""#), "{two}");
        assert!(two.contains("Discard 2"), "{two}");
        assert!(two.contains("pruned after"), "{two}");
        assert!(two.contains("(1 d)"), "{two}");
        assert!(page(0).contains("no delivery would be discarded"));
    }
}
