//! The events pages: the filtered, cursor-paginated list, and one event's detail (envelope,
//! headers, body, every delivery with its attempt timeline, and replay or discard).
//!
//! Invariants:
//! - The list asks the inbox exactly as `GET /admin/events` does (one [`EventFilter`]), a page
//!   of [`PAGE`] at a time, never a count of everything.
//! - A body is shown up to [`MAX_BODY_SHOWN`] bytes; headers that carry credentials
//!   (`authorization`, cookies) are shown as `[redacted]`; everything is escaped.
//! - A delivery's buttons post to the two-step replay and discard ([`super::replay`]) with
//!   its source, event id, handler and state: discard only for a `dead` one.

use std::sync::Arc;

use axum::{
    Extension,
    extract::{Query, State},
    response::{IntoResponse, Response},
};
use maud::{Markup, html};
use serde::Deserialize;

use super::{
    Ui, UiError, exact, format, given,
    layout::{self, Nav},
    replay::Action,
    session::SignedIn,
};
use crate::{
    admin::handlers::{next_page, parse_state},
    cli::client::{percent_encode, query},
    error::ApiError,
    inbox::{DeliveryDetail, EventFilter, EventSummary},
    model::DeliveryState,
};

/// Events per page.
const PAGE: usize = 50;
/// Body bytes shown on the detail page; the rest is cut (the page says so).
const MAX_BODY_SHOWN: usize = 64 * 1024;
/// Headers whose values are credentials, shown redacted: every header whose name says it
/// carries one (`Cookie`, `Authorization`, GitLab's `X-Gitlab-Token`, an `X-Webhook-Secret`,
/// an `Api-Key`, an `X-AccessKey`, an `X-Session`, ...), read without its `-` and `_`.
const REDACTED_WORDS: [&str; 10] = [
    "cookie",
    "auth",
    "token",
    "secret",
    "passw",
    "apikey",
    "accesskey",
    "privatekey",
    "credential",
    "session",
];

/// Whether header `name` (lower case, as stored) is shown as `[redacted]`.
fn redacted_header(name: &str) -> bool {
    let name = name.replace(['-', '_'], "");
    REDACTED_WORDS.iter().any(|word| name.contains(word))
}

/// The list's query string: the filter form's fields (empty fields do not filter).
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    source: String,
    #[serde(default)]
    handler: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    event_type: String,
    /// An exact event id.
    #[serde(default)]
    q: String,
    /// `datetime-local` values, UTC.
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    before: Option<i64>,
}

impl ListQuery {
    fn filter(&self) -> Result<EventFilter, ApiError> {
        let time = |name: &str, text: &str| {
            given(text)
                .map(|t| {
                    format::parse_datetime_local(&t).ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "{name} {t:?} is not a time like 2026-01-31T23:59"
                        ))
                    })
                })
                .transpose()
        };
        Ok(EventFilter {
            source: given(&self.source),
            state: parse_state(given(&self.state).as_deref())?,
            handler: given(&self.handler),
            event_type: given(&self.event_type),
            event_id: exact(&self.q),
            since_ms: time("since", &self.since)?,
            until_ms: time("until", &self.until)?,
            before: self.before,
            limit: PAGE,
        })
    }

    /// This query's link with `before` set to `cursor` (`None`: the first page).
    fn page_link(&self, cursor: Option<i64>) -> String {
        let pairs = [
            ("source", given(&self.source)),
            ("handler", given(&self.handler)),
            ("state", given(&self.state)),
            ("event_type", given(&self.event_type)),
            ("q", exact(&self.q)),
            ("since", given(&self.since)),
            ("until", given(&self.until)),
            ("before", cursor.map(|c| c.to_string())),
        ];
        format!("/events{}", query(&pairs))
    }
}

/// The detail page's path of an event.
pub(super) fn event_path(source: &str, event_id: &str) -> String {
    format!(
        "/events/{}/{}",
        percent_encode(source),
        super::path_segment(event_id)
    )
}

/// `GET /events`.
pub(super) async fn list(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    Query(params): Query<ListQuery>,
) -> Result<Response, UiError> {
    let filter = params.filter()?;
    let first_page = filter.before.is_none();
    let events = ui.shared.inbox.list_events(filter).await?;
    let next = next_page(&events, PAGE);
    let config = &ui.shared.config;
    let sources: Vec<String> = config.sources.keys().map(|s| s.to_string()).collect();
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let mut handlers: Vec<&str> = config
        .sources
        .values()
        .flat_map(|s| s.handlers.iter().map(|h| h.as_str()))
        .collect();
    handlers.sort_unstable();
    handlers.dedup();
    let select = |name: &str, label: &str, options: &[&str], chosen: &str| {
        html! {
            label { (label)
                select name=(name) {
                    option value="" { "any" }
                    @for option in options {
                        option value=(option) selected[*option == chosen] { (option) }
                    }
                }
            }
        }
    };
    let states = DeliveryState::ALL.map(DeliveryState::as_str);
    let body = html! {
        form.filters method="get" action="/events" role="search" aria-label="Filter events" {
            label { "Event id"
                input type="search" name="q" value=(params.q) placeholder="exact id";
            }
            (select("source", "Source", &sources, &params.source))
            (select("handler", "Handler", &handlers, &params.handler))
            (select("state", "Delivery state", &states, &params.state))
            label { "Event type"
                input type="text" name="event_type" value=(params.event_type);
            }
            label { "Received from (UTC)"
                input type="datetime-local" name="since" value=(params.since);
            }
            label { "Received until (UTC)"
                input type="datetime-local" name="until" value=(params.until);
            }
            div.actions {
                button.primary type="submit" { "Filter" }
                a.button href="/events" { "Clear" }
            }
        }
        @if events.is_empty() {
            p.notice { "No event matches." }
        } @else {
            div.scroll {
                table.rows {
                    caption.muted { "Newest first" @if !first_page { " (older page)" } }
                    thead { tr {
                        th scope="col" { "Received (UTC)" }
                        th scope="col" { "Source" }
                        th scope="col" { "Event id" }
                        th scope="col" { "Type" }
                        th scope="col" { "Deliveries" }
                    } }
                    tbody {
                        @for event in &events { (row(event)) }
                    }
                }
            }
        }
        nav.pager aria-label="Pages" {
            @if !first_page { a href=(params.page_link(None)) { "← Newest" } }
            @if let Some(cursor) = next { a href=(params.page_link(Some(cursor))) rel="next" { "Older →" } }
        }
    };
    Ok(layout::page("Events", Nav::Events, &signed_in, body).into_response())
}

fn row(event: &EventSummary) -> Markup {
    html! {
        tr {
            td data-label="Received" { (layout::time(event.received_at)) }
            td data-label="Source" { (event.source) }
            td.wrap data-label="Event id" { a href=(event_path(&event.source, &event.event_id)) { (event.event_id) } }
            td.wrap data-label="Type" { (event.event_type) }
            td data-label="Deliveries" { div.states {
                @for (handler, state) in &event.states {
                    span { (handler) ": " (layout::badge(state)) }
                }
            } }
        }
    }
}

/// `GET /events/{source}/{event_id}`.
pub(super) async fn detail(
    State(ui): State<Arc<Ui>>,
    Extension(signed_in): Extension<SignedIn>,
    super::Named(source, event_id): super::Named,
) -> Result<Response, UiError> {
    let Some(event) = ui
        .shared
        .inbox
        .event_detail(source.clone(), event_id.clone())
        .await?
    else {
        return Err(
            ApiError::NotFound(format!("no event {event_id:?} from source {source:?}")).into(),
        );
    };
    let here = event_path(&event.source, &event.event_id);
    let (body_text, cut) = shown_body(&event.body);
    // Retention kept the record (for dedupe and ordering), not the payload: the page says so
    // rather than show an empty request, and offers no replay (a pruned event has nothing to
    // deliver).
    let pruned = event.pruned_at;
    let body = html! {
        @if let Some(at) = pruned {
            p.notice role="status" {
                "Retention removed this event's headers, body and attempt history "
                (layout::time(at))
                ". Its record stays, so a resend is still a duplicate; it cannot be replayed."
            }
        }
        section aria-labelledby="envelope" {
            h2 #envelope { "Envelope" }
            dl.envelope {
                dt { "Source" } dd { (event.source) }
                dt { "Event id" } dd.mono { (event.event_id) }
                dt { "Type" } dd { (event.event_type) }
                dt { "Ordering key" } dd { (event.ordering_key.as_deref().unwrap_or("—")) }
                dt { "Sequence" } dd { (event.sequence.map_or("—".to_owned(), |s| s.to_string())) }
                dt { "Received" } dd { (layout::time(event.received_at)) }
            }
        }
        section aria-labelledby="deliveries" {
            h2 #deliveries { "Deliveries" }
            @if event.deliveries.is_empty() { p.muted { "This source has no handlers." } }
            @for delivery in &event.deliveries {
                (delivery_section(&signed_in, &event.source, &event.event_id, &here, delivery, pruned.is_none()))
            }
        }
        @if pruned.is_none() {
        section aria-labelledby="headers" {
            h2 #headers { "Headers" }
            div.scroll { table {
                thead { tr { th scope="col" { "Name" } th scope="col" { "Value" } } }
                tbody {
                    @for (name, value) in &event.headers {
                        tr {
                            td.mono { (name) }
                            td.mono.wrap {
                                @if redacted_header(name) { "[redacted]" }
                                @else { (value) }
                            }
                        }
                    }
                }
            } }
        }
        section aria-labelledby="body-title" {
            h2 #body-title { "Body "
                span.muted { "(" (event.body.len()) " bytes)" }
                " " button type="button" data-copy="body" hidden { "Copy" }
            }
            @if cut { p.notice { "Only the first " (MAX_BODY_SHOWN / 1024) " KiB are shown." } }
            pre.body #body tabindex="0" aria-label="Request body" { (body_text) }
        }
        }
    };
    let page = layout::page_naming(
        "Event ",
        event.event_id.as_str(),
        Nav::Events,
        &signed_in,
        body,
    );
    Ok(page.into_response())
}

/// The body as shown: JSON indented (a `clientState` string, Microsoft Graph's shared secret,
/// redacted, wherever and however often it occurs), else the bytes as text; cut at
/// [`MAX_BODY_SHOWN`].
fn shown_body(body: &[u8]) -> (String, bool) {
    let json = serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    let text = match std::str::from_utf8(body) {
        // Indented, not re-encoded: numbers, escapes and repeated keys as received; only as
        // much as is shown.
        Ok(text) if json => format::indent_json(
            text,
            |key| key.eq_ignore_ascii_case("clientstate"),
            MAX_BODY_SHOWN,
        ),
        // A cut may split a character: shown as U+FFFD, and the notice says it is cut.
        _ => String::from_utf8_lossy(&body[..body.len().min(MAX_BODY_SHOWN + 1)]).into_owned(),
    };
    if text.len() <= MAX_BODY_SHOWN {
        return (text, false);
    }
    let mut end = MAX_BODY_SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// Which of a delivery's buttons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Button {
    /// "Replay…" ("Run now…" for a retrying one).
    Replay,
    /// "Deliver anyway…", for a stale one: a forced replay.
    DeliverAnyway,
    /// "Discard…", for a dead one.
    Discard,
}

/// The button that replays or discards one delivery (`[source, event id, handler, state,
/// back]`) after the dry run's confirmation.
fn delivery_button(
    signed_in: &SignedIn,
    [source, event_id, handler, state, back]: [&str; 5],
    button: Button,
) -> Markup {
    let action = match button {
        Button::Discard => Action::Discard,
        Button::Replay | Button::DeliverAnyway => Action::Replay,
    };
    html! {
        form.inline method="post" action=(action.path()) {
            (layout::csrf_field(signed_in))
            input type="hidden" name="source" value=(source);
            input type="hidden" name="event_id" value=(event_id);
            input type="hidden" name="handler" value=(handler);
            input type="hidden" name="state" value=(state);
            input type="hidden" name="back" value=(back);
            @match button {
                Button::DeliverAnyway => {
                    input type="hidden" name="force" value="yes";
                    button type="submit"
                        title="Deliver it to the handler although a newer sequence of its key is done" {
                        "Deliver anyway…"
                    }
                }
                Button::Discard => {
                    button type="submit" title="Close it as discarded: no handler runs it" {
                        "Discard…"
                    }
                }
                Button::Replay if state == "retrying" => {
                    button type="submit" title="Run its next attempt now instead of after its backoff" {
                        "Run now…"
                    }
                }
                Button::Replay => { button type="submit" { "Replay…" } }
            }
        }
    }
}

fn delivery_section(
    signed_in: &SignedIn,
    source: &str,
    event_id: &str,
    here: &str,
    delivery: &DeliveryDetail,
    replayable: bool,
) -> Markup {
    let state = DeliveryState::parse(&delivery.state);
    // Finished: replayed with a fresh budget; retrying: run now, with the budget it has.
    let replayable =
        replayable && state.is_some_and(|s| !s.is_open() || s == DeliveryState::Retrying);
    let output_id = format!("output-{}", delivery.handler);
    html! {
        article.delivery aria-label={ "Delivery to " (delivery.handler) } {
            header {
                h3 { (delivery.handler) }
                (layout::badge(&delivery.state))
                span.muted { (delivery.attempts) " attempt" @if delivery.attempts != 1 { "s" } }
                @if let Some(next) = delivery.next_attempt_at {
                    span.muted { "next attempt " (layout::time(next)) }
                }
                @if replayable {
                    @let fields = [source, event_id, delivery.handler.as_str(), delivery.state.as_str(), here];
                    (delivery_button(signed_in, fields, Button::Replay))
                    @if state == Some(DeliveryState::Stale) {
                        (delivery_button(signed_in, fields, Button::DeliverAnyway))
                    }
                    @if state == Some(DeliveryState::Dead) {
                        (delivery_button(signed_in, fields, Button::Discard))
                    }
                }
            }
            @if let Some(error) = &delivery.last_error {
                p { strong { "Last error: " } span.mono { (error) } }
            }
            @if let Some(output) = &delivery.output {
                p { strong { "Output " } button type="button" data-copy=(output_id) hidden { "Copy" } }
                pre.body id=(output_id) { (shown_body(output.as_bytes()).0) }
            }
            @if !delivery.history.is_empty() {
                div.scroll { table {
                    caption.muted { "Attempts" }
                    thead { tr {
                        th scope="col" class="num" { "#" }
                        th scope="col" { "Started (UTC)" }
                        th scope="col" class="num" { "Duration" }
                        th scope="col" { "Outcome" }
                        th scope="col" { "Error" }
                        th scope="col" { "Plugin sha256" }
                    } }
                    tbody {
                        @for attempt in &delivery.history {
                            tr {
                                td.num { (attempt.attempt) }
                                td { (layout::time(attempt.started_at)) }
                                td.num { (format::duration(attempt.finished_at - attempt.started_at)) }
                                td { (layout::badge(&attempt.outcome)) }
                                td.wrap {
                                    @if let Some(kind) = &attempt.error_kind { code { (kind) } " " }
                                    @if let Some(error) = &attempt.error { span.mono { (error) } }
                                }
                                td.sha {
                                    @if let Some(sha) = &attempt.plugin_sha256 {
                                        abbr title=(sha) { (format::short_sha(sha)) }
                                    } @else { "—" }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event id is searched as sent: one that begins or ends with spaces is findable
    /// (trimmed, it named another id or none), while the other filters are trimmed.
    #[test]
    fn the_event_id_filter_is_exact_and_the_others_trimmed() {
        let query = ListQuery {
            q: " leading and trailing ".into(),
            source: " gen ".into(),
            ..ListQuery::default()
        };
        let filter = query.filter().unwrap();
        assert_eq!(filter.event_id.as_deref(), Some(" leading and trailing "));
        assert_eq!(filter.source.as_deref(), Some("gen"));
        assert_eq!(ListQuery::default().filter().unwrap().event_id, None);
    }

    /// A dead (or other finished) delivery has its replay button, a retrying one its "run
    /// now"; a pending or running one, or one of a pruned event, none. Only a dead one can be
    /// discarded.
    #[test]
    fn a_retrying_delivery_can_be_run_now_and_a_pending_one_cannot() {
        let signed_in = SignedIn::for_tests();
        let page = |state: &str, replayable: bool| {
            let delivery = DeliveryDetail {
                handler: "h".into(),
                state: state.into(),
                attempts: 1,
                output: None,
                last_error: None,
                next_attempt_at: Some(0),
                history: Vec::new(),
            };
            delivery_section(&signed_in, "s", "e", "/e", &delivery, replayable).into_string()
        };
        assert!(page("retrying", true).contains("Run now…"));
        let dead = page("dead", true);
        assert!(dead.contains("Replay…"), "{dead}");
        assert!(dead.contains(r#"action="/discard""#), "{dead}");
        for state in ["done", "stale", "discarded", "retrying"] {
            let html = page(state, true);
            assert!(!html.contains(r#"action="/discard""#), "{state}: {html}");
        }
        for (state, replayable) in [
            ("pending", true),
            ("running", true),
            ("retrying", false),
            ("dead", false),
        ] {
            let html = page(state, replayable);
            assert!(!html.contains(r#"action="/replay""#), "{state}: {html}");
            assert!(!html.contains(r#"action="/discard""#), "{state}: {html}");
        }
    }

    #[test]
    fn headers_that_carry_credentials_are_redacted_by_name() {
        for name in [
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key",
            "api-key",
            "x-gitlab-token",
            "x-auth-token",
            "x-webhook-secret",
            "x-password",
            "x-api_key",
            "x_auth_token",
            "x-access-key",
            "x-amz-access_key",
            "x-private-key",
            "x-privatekey",
            "x-accesskey",
            "x-credential",
            "x-session",
            "set-cookie",
            "x-passwd",
        ] {
            assert!(redacted_header(name), "{name}");
        }
        for name in [
            "content-type",
            "x-github-event",
            "x-hub-signature-256",
            "webhook-id",
            "user-agent",
        ] {
            assert!(!redacted_header(name), "{name}");
        }
    }
}
