//! Read models: what the admin API and the CLI show of events, deliveries and attempts.
//!
//! Invariant: these are plain data with public fields; they know nothing of any wire format (the
//! admin API converts them into its own types), and reading them never writes.

use std::collections::BTreeMap;

use super::{Inbox, InboxError};
use crate::model::DeliveryState;

/// Filters for `GET /admin/events`.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub source: Option<String>,
    pub state: Option<DeliveryState>,
    pub handler: Option<String>,
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

impl Inbox {
    /// Events, newest first, with each handler's delivery state.
    pub async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError> {
        self.store().list_events(filter).await
    }

    /// One event with every delivery and its full attempt history.
    pub async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError> {
        self.store().event_detail(source, event_id).await
    }

    /// Deliveries in each of `states` (`/metrics`; each counted through an index on the state).
    pub async fn state_counts(
        &self,
        states: &[DeliveryState],
    ) -> Result<Vec<(String, i64)>, InboxError> {
        self.store().state_counts(states.to_vec()).await
    }
}
