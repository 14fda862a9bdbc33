//! Read models in SQL: event listings, one event's detail, deliveries per state, and the
//! inbox's counters.
//!
//! Invariant: every query here only reads.

use std::collections::BTreeMap;

use deadpool_postgres::Client;

use super::state_names;
use crate::{
    inbox::{
        AttemptRecord, DeliveryDetail, EventDetail, EventFilter, EventSummary, InboxError,
        store::Counts,
    },
    model::DeliveryState,
};

/// The backlog (deliveries in an open state) and the held quarantine, in one statement.
pub(super) async fn counts(client: &Client) -> Result<Counts, InboxError> {
    let row = client
        .query_one(
            &client
                .prepare_cached(
                    "SELECT (SELECT COUNT(*) FROM deliveries WHERE state = ANY($1)),
                    (SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL)",
                )
                .await?,
            &[&state_names(&DeliveryState::OPEN)],
        )
        .await?;
    Ok(Counts {
        backlog: row.get(0),
        quarantined: row.get(1),
    })
}

/// Events, newest first, with each handler's delivery state (one query: the page of events
/// joined with their deliveries).
pub(super) async fn list_events(
    client: &Client,
    filter: &EventFilter,
) -> Result<Vec<EventSummary>, InboxError> {
    let rows = client
        .query(
            &client
                .prepare_cached(
                    "WITH page AS (
                 SELECT e.id, e.source, e.event_id, e.event_type, e.received_at FROM events e
                 WHERE ($1::text IS NULL OR e.source = $1)
                   AND ($2::text IS NULL AND $3::text IS NULL OR EXISTS (
                        SELECT 1 FROM deliveries d WHERE d.event = e.id
                          AND ($2 IS NULL OR d.state = $2) AND ($3 IS NULL OR d.handler = $3)))
                 ORDER BY e.id DESC LIMIT $4)
             SELECT p.id, p.source, p.event_id, p.event_type, p.received_at, d.handler, d.state
             FROM page p LEFT JOIN deliveries d ON d.event = p.id
             ORDER BY p.id DESC",
                )
                .await?,
            &[
                &filter.source,
                &filter.state.map(|s| s.as_str()),
                &filter.handler,
                &(filter.limit as i64),
            ],
        )
        .await?;
    // Rows come grouped by event: a new id starts the next summary.
    let mut events: Vec<(i64, EventSummary)> = Vec::new();
    for r in rows {
        let id: i64 = r.get(0);
        if events.last().is_none_or(|(last, _)| *last != id) {
            let summary = EventSummary {
                source: r.get(1),
                event_id: r.get(2),
                event_type: r.get(3),
                received_at: r.get(4),
                states: BTreeMap::new(),
            };
            events.push((id, summary));
        }
        let handler: Option<String> = r.get(5);
        if let (Some(handler), Some((_, summary))) = (handler, events.last_mut()) {
            summary.states.insert(handler, r.get(6));
        }
    }
    Ok(events.into_iter().map(|(_, summary)| summary).collect())
}

/// One event with every delivery and its full attempt history.
pub(super) async fn event_detail(
    client: &Client,
    source: &str,
    event_id: &str,
) -> Result<Option<EventDetail>, InboxError> {
    let Some(event) = client
        .query_opt(
            &client
                .prepare_cached(
                    "SELECT id, source, event_id, event_type, ordering_key, sequence, received_at,
                    pruned_at
             FROM events WHERE source = $1 AND event_id = $2",
                )
                .await?,
            &[&source, &event_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let id: i64 = event.get(0);
    let mut detail = EventDetail {
        source: event.get(1),
        event_id: event.get(2),
        event_type: event.get(3),
        ordering_key: event.get(4),
        sequence: event.get(5),
        received_at: event.get(6),
        pruned_at: event.get(7),
        deliveries: Vec::new(),
    };
    let deliveries = client
        .query(
            &client
                .prepare_cached(
                    "SELECT id, handler, state, attempts, output, last_error, next_attempt_at
             FROM deliveries WHERE event = $1 ORDER BY id",
                )
                .await?,
            &[&id],
        )
        .await?;
    let attempts = client
        .query(
            &client.prepare_cached("SELECT a.delivery, a.attempt, a.started_at, a.finished_at, a.outcome, a.error_kind,
                    a.error, a.plugin_sha256
             FROM attempts a JOIN deliveries d ON d.id = a.delivery
             WHERE d.event = $1 ORDER BY a.id").await?,
            &[&id],
        )
        .await?;
    for r in deliveries {
        let delivery_id: i64 = r.get(0);
        let state: String = r.get(2);
        let waiting = DeliveryState::parse(&state).is_some_and(DeliveryState::is_waiting);
        let history = attempts
            .iter()
            .filter(|a| a.get::<_, i64>(0) == delivery_id)
            .map(|a| AttemptRecord {
                attempt: a.get(1),
                started_at: a.get(2),
                finished_at: a.get(3),
                outcome: a.get(4),
                error_kind: a.get(5),
                error: a.get(6),
                plugin_sha256: a.get(7),
            })
            .collect();
        detail.deliveries.push(DeliveryDetail {
            handler: r.get(1),
            attempts: r.get(3),
            output: r.get(4),
            last_error: r.get(5),
            next_attempt_at: if waiting { Some(r.get(6)) } else { None },
            state,
            history,
        });
    }
    Ok(Some(detail))
}

/// Deliveries per state.
pub(super) async fn state_counts(
    client: &Client,
    states: &[DeliveryState],
) -> Result<Vec<(String, i64)>, InboxError> {
    let rows = client
        .query(
            &client
                .prepare_cached(
                    "SELECT state, COUNT(*) FROM deliveries WHERE state = ANY($1) GROUP BY state",
                )
                .await?,
            &[&state_names(states)],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
