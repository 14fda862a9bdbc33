//! Read models in SQL: event listings, one event's detail, deliveries per state.
//!
//! Invariant: every query here only reads, on a pooled read connection.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    inbox::{AttemptRecord, DeliveryDetail, EventDetail, EventFilter, EventSummary, InboxError},
    model::DeliveryState,
};

/// Events, newest first, with each handler's delivery state (one query: the page of events
/// joined with their deliveries).
pub(super) fn list_events(
    conn: &Connection,
    filter: &EventFilter,
) -> Result<Vec<EventSummary>, InboxError> {
    let mut stmt = conn.prepare_cached(
        "WITH page AS (
             SELECT e.id, e.source, e.event_id, e.event_type, e.received_at FROM events e
             WHERE (?1 IS NULL OR e.source = ?1)
               AND (?2 IS NULL AND ?3 IS NULL OR EXISTS (
                    SELECT 1 FROM deliveries d WHERE d.event = e.id
                      AND (?2 IS NULL OR d.state = ?2) AND (?3 IS NULL OR d.handler = ?3)))
             ORDER BY e.id DESC LIMIT ?4)
         SELECT p.id, p.source, p.event_id, p.event_type, p.received_at, d.handler, d.state
         FROM page p LEFT JOIN deliveries d ON d.event = p.id
         ORDER BY p.id DESC",
    )?;
    let mut rows = stmt.query(params![
        filter.source,
        filter.state.map(|s| s.as_str()),
        filter.handler,
        filter.limit as i64
    ])?;
    // Rows come grouped by event: a new id starts the next summary.
    let mut events: Vec<(i64, EventSummary)> = Vec::new();
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        if events.last().is_none_or(|(last, _)| *last != id) {
            let summary = EventSummary {
                source: r.get(1)?,
                event_id: r.get(2)?,
                event_type: r.get(3)?,
                received_at: r.get(4)?,
                states: BTreeMap::new(),
            };
            events.push((id, summary));
        }
        let handler: Option<String> = r.get(5)?;
        if let (Some(handler), Some((_, summary))) = (handler, events.last_mut()) {
            summary.states.insert(handler, r.get(6)?);
        }
    }
    Ok(events.into_iter().map(|(_, summary)| summary).collect())
}

/// One event with every delivery and its full attempt history.
pub(super) fn event_detail(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> Result<Option<EventDetail>, InboxError> {
    let event = conn
        .query_row(
            "SELECT id, source, event_id, event_type, ordering_key, sequence, received_at,
                    pruned_at
             FROM events WHERE source = ?1 AND event_id = ?2",
            params![source, event_id],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    EventDetail {
                        source: r.get(1)?,
                        event_id: r.get(2)?,
                        event_type: r.get(3)?,
                        ordering_key: r.get(4)?,
                        sequence: r.get(5)?,
                        received_at: r.get(6)?,
                        pruned_at: r.get(7)?,
                        deliveries: Vec::new(),
                    },
                ))
            },
        )
        .optional()?;
    let Some((id, mut detail)) = event else {
        return Ok(None);
    };
    let deliveries: Vec<(i64, DeliveryDetail)> = conn
        .prepare_cached(
            "SELECT id, handler, state, attempts, output, last_error, next_attempt_at
             FROM deliveries WHERE event = ?1 ORDER BY id",
        )?
        .query_map([id], |r| {
            let state: String = r.get(2)?;
            let waiting = DeliveryState::parse(&state).is_some_and(DeliveryState::is_waiting);
            Ok((
                r.get(0)?,
                DeliveryDetail {
                    handler: r.get(1)?,
                    attempts: r.get(3)?,
                    output: r.get(4)?,
                    last_error: r.get(5)?,
                    next_attempt_at: if waiting { Some(r.get(6)?) } else { None },
                    state,
                    history: Vec::new(),
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut history = conn.prepare_cached(
        "SELECT attempt, started_at, finished_at, outcome, error_kind, error, plugin_sha256
         FROM attempts WHERE delivery = ?1 ORDER BY id",
    )?;
    for (delivery_id, mut delivery) in deliveries {
        delivery.history = history
            .query_map([delivery_id], |r| {
                Ok(AttemptRecord {
                    attempt: r.get(0)?,
                    started_at: r.get(1)?,
                    finished_at: r.get(2)?,
                    outcome: r.get(3)?,
                    error_kind: r.get(4)?,
                    error: r.get(5)?,
                    plugin_sha256: r.get(6)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        detail.deliveries.push(delivery);
    }
    Ok(Some(detail))
}

/// Deliveries in each of `states`, one index range each.
pub(super) fn state_counts(
    conn: &Connection,
    states: &[DeliveryState],
) -> Result<Vec<(String, i64)>, InboxError> {
    let mut count = conn.prepare_cached("SELECT COUNT(*) FROM deliveries WHERE state = ?1")?;
    states
        .iter()
        .map(|state| {
            let n = count.query_row([state.as_str()], |r| r.get(0))?;
            Ok((state.as_str().to_owned(), n))
        })
        .collect()
}
