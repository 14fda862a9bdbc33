//! Read models in SQL: event listings, one event's detail, deliveries per state, dead-letter
//! groups, held requests, and the inbox's counters.
//!
//! Invariant: every query here only reads.

use std::{collections::BTreeMap, sync::LazyLock};

use bytes::Bytes;
use tokio_postgres::types::ToSql;

use super::{
    distinct_by_probes, state_names,
    statements::{Conn, Run},
};
use crate::{
    inbox::{
        AttemptRecord, DeadLetterGroup, DeliveryDetail, EventDetail, EventFilter, EventSummary,
        HeldRequest, InboxError, request::headers_from_json, store::Counts,
    },
    model::DeliveryState,
};

/// The backlog (deliveries in an open state) and the held quarantine, in one statement.
pub(super) async fn counts(client: &Conn) -> Result<Counts, InboxError> {
    let row = client
        .query_one(
            "SELECT (SELECT COUNT(*) FROM deliveries WHERE state = ANY($1)),
                    (SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL)",
            &[&state_names(&DeliveryState::OPEN)],
        )
        .await?;
    Ok(Counts {
        backlog: row.get(0),
        quarantined: row.get(1),
    })
}

/// Events matching `filter`, newest first, with each handler's delivery state: the page's ids
/// first ([`page_ids`]), then the page joined with its deliveries, in one statement.
pub(super) async fn list_events(
    client: &Conn,
    filter: &EventFilter,
) -> Result<Vec<EventSummary>, InboxError> {
    let (page, mut values) = page_ids(filter);
    values.push(Box::new(filter.limit as i64));
    let sql = format!(
        "WITH page(id) AS ({page} LIMIT ${})
         SELECT e.id, e.source, e.event_id, e.event_type, e.received_at, d.handler, d.state
         FROM page p JOIN events e ON e.id = p.id LEFT JOIN deliveries d ON d.event = e.id
         ORDER BY e.id DESC",
        values.len()
    );
    let params: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect();
    let rows = client.query(&sql, &params).await?;
    // Rows come grouped by event: a new id starts the next summary.
    let mut events: Vec<EventSummary> = Vec::new();
    for r in rows {
        let id: i64 = r.get(0);
        if events.last().is_none_or(|last| last.cursor != id) {
            events.push(EventSummary {
                source: r.get(1),
                event_id: r.get(2),
                event_type: r.get(3),
                received_at: r.get(4),
                states: BTreeMap::new(),
                cursor: id,
            });
        }
        let handler: Option<String> = r.get(5);
        if let (Some(handler), Some(summary)) = (handler, events.last_mut()) {
            summary.states.insert(handler, r.get(6));
        }
    }
    Ok(events)
}

/// Every source with an event stored, each found by one probe of `events_source_id` past the
/// last one found: a handful of probes, whatever the number of events.
static SOURCES_STORED: LazyLock<String> = LazyLock::new(|| {
    distinct_by_probes("stored", "source", "events", "TRUE") + "SELECT source FROM stored"
});

/// The ids of the events `filter` selects, newest first, as a statement built from the
/// conditions it gives (a condition left out is not in the SQL, so the plan is made for what
/// filters), and its parameters. A state filter walks the `deliveries_state_event` index from
/// the newest event down, so a rare state (dead) is found without visiting every event.
pub(super) fn page_ids(filter: &EventFilter) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
    let mut values: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    let mut conditions: Vec<String> = Vec::new();
    let bind = |values: &mut Vec<Box<dyn ToSql + Sync + Send>>,
                value: Box<dyn ToSql + Sync + Send>| {
        values.push(value);
        format!("${}", values.len())
    };
    let by_state = filter.state.is_some();
    let id = if by_state { "d.event" } else { "e.id" };
    if let Some(state) = filter.state {
        let p = bind(&mut values, Box::new(state.as_str()));
        conditions.push(format!("d.state = {p}"));
    }
    let text_columns = [
        ("e.source", &filter.source),
        ("e.event_type", &filter.event_type),
        ("e.event_id", &filter.event_id),
    ];
    for (column, value) in text_columns {
        if let Some(value) = value {
            let p = bind(&mut values, Box::new(value.clone()));
            conditions.push(format!("{column} = {p}"));
        }
    }
    // An event id without its source is looked up in `(source, event_id)`, the dedupe index,
    // once per source stored (no index of its own for every accept to write): the events come
    // from a lateral probe per source, which `OFFSET 0` keeps the planner from flattening into
    // a scan of every event.
    let events = match (&filter.event_id, &filter.source) {
        (Some(event_id), None) => {
            let p = bind(&mut values, Box::new(event_id.clone()));
            format!(
                "(({sources}) stored CROSS JOIN LATERAL (
                     SELECT * FROM events WHERE source = stored.source AND event_id = {p} OFFSET 0
                 ) e)",
                sources = *SOURCES_STORED
            )
        }
        _ => "events e".to_owned(),
    };
    if let Some(since) = filter.since_ms {
        let p = bind(&mut values, Box::new(since));
        conditions.push(format!("e.received_at >= {p}"));
    }
    if let Some(until) = filter.until_ms {
        let p = bind(&mut values, Box::new(until));
        conditions.push(format!("e.received_at <= {p}"));
    }
    if let Some(before) = filter.before {
        let p = bind(&mut values, Box::new(before));
        conditions.push(format!("{id} < {p}"));
    }
    if let Some(handler) = &filter.handler {
        let p = bind(&mut values, Box::new(handler.clone()));
        conditions.push(if by_state {
            format!("d.handler = {p}")
        } else {
            format!("EXISTS (SELECT 1 FROM deliveries d WHERE d.event = e.id AND d.handler = {p})")
        });
    }
    let mut sql = if by_state {
        format!("SELECT DISTINCT d.event FROM deliveries d JOIN {events} ON e.id = d.event")
    } else {
        format!("SELECT e.id FROM {events}")
    };
    if !conditions.is_empty() {
        sql += " WHERE ";
        sql += &conditions.join(" AND ");
    }
    sql += &format!(" ORDER BY {id} DESC");
    (sql, values)
}

/// One event with every delivery and its full attempt history.
pub(super) async fn event_detail(
    client: &Conn,
    source: &str,
    event_id: &str,
) -> Result<Option<EventDetail>, InboxError> {
    let Some(event) = client
        .query_opt(
            "SELECT id, source, event_id, event_type, ordering_key, sequence, received_at,
                    pruned_at, headers, body
             FROM events WHERE source = $1 AND event_id = $2",
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
        headers: headers_from_json(event.get(8)),
        body: Bytes::from(event.get::<_, Vec<u8>>(9)),
        deliveries: Vec::new(),
    };
    let deliveries = client
        .query(
            "SELECT id, handler, state, attempts, output, last_error, next_attempt_at
             FROM deliveries WHERE event = $1 ORDER BY id",
            &[&id],
        )
        .await?;
    let attempts = client
        .query(
            "SELECT a.delivery, a.attempt, a.started_at, a.finished_at, a.outcome, a.error_kind,
                    a.error, a.plugin_sha256
             FROM attempts a JOIN deliveries d ON d.id = a.delivery
             WHERE d.event = $1 ORDER BY a.id",
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
    client: &Conn,
    states: &[DeliveryState],
) -> Result<Vec<(String, i64)>, InboxError> {
    let rows = client
        .query(
            "SELECT state, COUNT(*) FROM deliveries WHERE state = ANY($1) GROUP BY state",
            &[&state_names(states)],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Dead deliveries grouped by handler and their last attempt's error kind, largest group first.
pub(super) async fn dead_letter_groups(client: &Conn) -> Result<Vec<DeadLetterGroup>, InboxError> {
    let rows = client
        .query(
            "SELECT handler, kind, COUNT(*), MIN(updated_at), MAX(updated_at),
                            MAX(last_error)
                     FROM (SELECT d.handler, d.updated_at, d.last_error,
                                  (SELECT a.error_kind FROM attempts a WHERE a.delivery = d.id
                                   ORDER BY a.id DESC LIMIT 1) AS kind
                           FROM deliveries d WHERE d.state = $1) g
                     GROUP BY handler, kind
                     ORDER BY COUNT(*) DESC, handler, kind",
            &[&DeliveryState::Dead.as_str()],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadLetterGroup {
            handler: r.get(0),
            error_kind: r.get(1),
            count: r.get(2),
            first_ms: r.get(3),
            last_ms: r.get(4),
            example_error: r.get(5),
        })
        .collect())
}

/// Unresolved quarantined requests, newest first, without headers or bodies.
pub(super) async fn held_requests(
    client: &Conn,
    limit: usize,
    before_id: Option<i64>,
) -> Result<Vec<HeldRequest>, InboxError> {
    let rows = client
        .query(
            "SELECT id, source, received_at, reason FROM quarantine
                     WHERE resolved_at IS NULL AND id < $1
                     ORDER BY id DESC LIMIT $2",
            &[&before_id.unwrap_or(i64::MAX), &(limit as i64)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| HeldRequest {
            id: r.get(0),
            source: r.get(1),
            received_at: r.get(2),
            reason: r.get(3),
        })
        .collect())
}
