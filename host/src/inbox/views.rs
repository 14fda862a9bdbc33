//! Read models: what the admin API, the dashboard and the CLI show of events, deliveries,
//! attempts, dead letters and held requests.
//!
//! Invariant: these are plain data with public fields; they know nothing of any wire format (the
//! admin API and the dashboard convert them into their own shapes), and reading them never
//! writes.

use std::collections::BTreeMap;

use super::{Inbox, InboxError};
use crate::{model::DeliveryState, text};

/// Filters for `GET /admin/events` and the dashboard's event list: every given field must
/// match (a state or handler: some delivery of the event has it).
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub source: Option<String>,
    pub state: Option<DeliveryState>,
    pub handler: Option<String>,
    pub event_type: Option<String>,
    /// Exactly this provider event id.
    pub event_id: Option<String>,
    /// Received at or after, in unix ms.
    pub since_ms: Option<i64>,
    /// Received at or before, in unix ms.
    pub until_ms: Option<i64>,
    /// The page after this cursor ([`EventSummary::cursor`] of the previous page's last event):
    /// only events stored before it.
    pub before: Option<i64>,
    pub limit: usize,
}

/// One event in a listing, with each handler's delivery state.
#[derive(Debug, Clone)]
pub struct EventSummary {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub received_at: i64,
    /// Handler → delivery state.
    pub states: BTreeMap<String, String>,
    /// Where this event stands in the listing's order (newest first): the next page is
    /// [`EventFilter::before`] the last one's cursor.
    pub cursor: i64,
}

/// One event with every delivery and its full attempt history.
#[derive(Debug, Clone)]
pub struct EventDetail {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<i64>,
    pub received_at: i64,
    /// When retention dropped its payload (headers, body, outputs, attempts); `None` while kept.
    pub pruned_at: Option<i64>,
    /// The request's headers as stored (names lower-case, arrival order).
    pub headers: Vec<crate::model::Header>,
    /// The request's body as received.
    pub body: bytes::Bytes,
    pub deliveries: Vec<DeliveryDetail>,
}

/// One `(event, handler)` delivery.
#[derive(Debug, Clone)]
pub struct DeliveryDetail {
    pub handler: String,
    pub state: String,
    pub attempts: i64,
    pub output: Option<String>,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub history: Vec<AttemptRecord>,
}

/// One recorded attempt of a delivery.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub attempt: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub outcome: String,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    pub plugin_sha256: Option<String>,
}

/// The dead deliveries of one handler whose last attempt failed with one error kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterGroup {
    pub handler: String,
    /// The last attempt's `error_kind` (`None`: it recorded none).
    pub error_kind: Option<String>,
    pub count: i64,
    /// When the earliest and the latest of them died (their last update), unix ms.
    pub first_ms: i64,
    pub last_ms: i64,
    /// One of their last errors, as an example.
    pub example_error: Option<String>,
}

/// A quarantined request still held, without its headers or body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRequest {
    pub id: i64,
    pub source: String,
    pub received_at: i64,
    /// Why it could not be parsed.
    pub reason: String,
}

impl Inbox {
    /// Events, newest first, with each handler's delivery state.
    pub async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError> {
        // No stored name holds a NUL (and PostgreSQL cannot compare one).
        let names = [
            &filter.source,
            &filter.handler,
            &filter.event_type,
            &filter.event_id,
        ];
        if names
            .iter()
            .any(|name| name.as_deref().is_some_and(text::has_nul))
        {
            return Ok(Vec::new());
        }
        self.store().list_events(filter).await
    }

    /// One event with every delivery and its full attempt history.
    pub async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError> {
        if text::has_nul(&source) || text::has_nul(&event_id) {
            return Ok(None);
        }
        self.store().event_detail(source, event_id).await
    }

    /// Deliveries in each of `states` (`/metrics`; each counted through an index on the state).
    pub async fn state_counts(
        &self,
        states: &[DeliveryState],
    ) -> Result<Vec<(String, i64)>, InboxError> {
        self.store().state_counts(states.to_vec()).await
    }

    /// Dead deliveries grouped by handler and their last attempt's error kind, largest group
    /// first.
    pub async fn dead_letter_groups(&self) -> Result<Vec<DeadLetterGroup>, InboxError> {
        self.store().dead_letter_groups().await
    }

    /// Held quarantined requests, newest first, at most `limit`, those stored before
    /// `before_id` when given.
    pub async fn held_requests(
        &self,
        limit: usize,
        before_id: Option<i64>,
    ) -> Result<Vec<HeldRequest>, InboxError> {
        self.store().held_requests(limit, before_id).await
    }
}
