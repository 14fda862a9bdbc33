//! Read models in SQL: event listings, one event's detail, deliveries per state, dead-letter
//! groups, held requests.
//!
//! Invariant: every query here only reads, on a pooled read connection.

use std::collections::BTreeMap;

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter, types::Value};

use super::sql::{distinct_by_seeks, headers_from_json};
use crate::{
    inbox::{
        AttemptRecord, DeadLetterGroup, DeliveryDetail, EventDetail, EventFilter, EventSummary,
        HeldRequest, InboxError,
    },
    model::DeliveryState,
};

/// Events matching `filter`, newest first, with each handler's delivery state: the page's ids
/// first ([`page_ids`]), then the page joined with its deliveries, in one statement.
pub(super) fn list_events(
    conn: &Connection,
    filter: &EventFilter,
) -> Result<Vec<EventSummary>, InboxError> {
    let (page, mut values) = page_ids(filter);
    values.push(Value::Integer(filter.limit as i64));
    let sql = format!(
        "WITH page(id) AS ({page} LIMIT ?{})
         SELECT e.id, e.source, e.event_id, e.event_type, e.received_at, d.handler, d.state
         FROM page p JOIN events e ON e.id = p.id LEFT JOIN deliveries d ON d.event = e.id
         ORDER BY e.id DESC",
        values.len()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(values))?;
    // Rows come grouped by event: a new id starts the next summary.
    let mut events: Vec<EventSummary> = Vec::new();
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        if events.last().is_none_or(|last| last.cursor != id) {
            events.push(EventSummary {
                source: r.get(1)?,
                event_id: r.get(2)?,
                event_type: r.get(3)?,
                received_at: r.get(4)?,
                states: BTreeMap::new(),
                cursor: id,
            });
        }
        let handler: Option<String> = r.get(5)?;
        if let (Some(handler), Some(summary)) = (handler, events.last_mut()) {
            summary.states.insert(handler, r.get(6)?);
        }
    }
    Ok(events)
}

/// Every source with an event stored, each found by one seek of `events_source_id` (a skip
/// scan): a handful, whatever the number of events.
const SOURCES_STORED: &str = concat!(
    "WITH RECURSIVE ",
    distinct_by_seeks!("stored", "source", "events", "", ""),
    " SELECT source FROM stored WHERE source IS NOT NULL"
);

/// The ids of the events `filter` selects, newest first, as a statement built from the
/// conditions it gives (a condition left out is not in the SQL, so the planner sees only
/// what filters and picks its index for that), and its parameters. A state filter walks the
/// `deliveries_state_event` index from the newest event down, so a rare state (dead) is found
/// without visiting every event; otherwise the events are walked by id (or by the index of
/// the column they are filtered on).
fn page_ids(filter: &EventFilter) -> (String, Vec<Value>) {
    let mut values: Vec<Value> = Vec::new();
    let mut conditions: Vec<String> = Vec::new();
    let bind = |values: &mut Vec<Value>, value: Value| {
        values.push(value);
        format!("?{}", values.len())
    };
    let by_state = filter.state.is_some();
    let id = if by_state { "d.event" } else { "e.id" };
    if let Some(state) = filter.state {
        let p = bind(&mut values, Value::Text(state.as_str().to_owned()));
        conditions.push(format!("d.state = {p}"));
    }
    let text_columns = [
        ("e.source", &filter.source),
        ("e.event_type", &filter.event_type),
        ("e.event_id", &filter.event_id),
    ];
    for (column, value) in text_columns {
        if let Some(value) = value {
            let p = bind(&mut values, Value::Text(value.clone()));
            conditions.push(format!("{column} = {p}"));
        }
    }
    if filter.event_id.is_some() && filter.source.is_none() {
        // The event id is looked up in `(source, event_id)`, the dedupe index, once per source
        // stored: one index fewer for every accept to write.
        conditions.push(format!("e.source IN ({SOURCES_STORED})"));
    }
    if let Some(since) = filter.since_ms {
        let p = bind(&mut values, Value::Integer(since));
        conditions.push(format!("e.received_at >= {p}"));
    }
    if let Some(until) = filter.until_ms {
        let p = bind(&mut values, Value::Integer(until));
        conditions.push(format!("e.received_at <= {p}"));
    }
    if let Some(before) = filter.before {
        let p = bind(&mut values, Value::Integer(before));
        conditions.push(format!("{id} < {p}"));
    }
    if let Some(handler) = &filter.handler {
        let p = bind(&mut values, Value::Text(handler.clone()));
        conditions.push(if by_state {
            format!("d.handler = {p}")
        } else {
            format!("EXISTS (SELECT 1 FROM deliveries d WHERE d.event = e.id AND d.handler = {p})")
        });
    }
    let from = if by_state {
        "SELECT DISTINCT d.event FROM deliveries d JOIN events e ON e.id = d.event"
    } else {
        "SELECT e.id FROM events e"
    };
    let mut sql = from.to_owned();
    if !conditions.is_empty() {
        sql += " WHERE ";
        sql += &conditions.join(" AND ");
    }
    sql += &format!(" ORDER BY {id} DESC");
    (sql, values)
}

/// One event with every delivery and its full attempt history.
pub(super) fn event_detail(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> Result<Option<EventDetail>, InboxError> {
    let event = conn
        .query_row(
            "SELECT e.id, e.source, e.event_id, e.event_type, e.ordering_key, e.sequence,
                    e.received_at, e.pruned_at, COALESCE(p.headers, e.headers),
                    COALESCE(p.body, e.body)
             FROM events e LEFT JOIN payloads p ON p.event = e.id
             WHERE e.source = ?1 AND e.event_id = ?2",
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
                        headers: headers_from_json(&r.get::<_, String>(8)?),
                        body: Bytes::from(r.get::<_, Vec<u8>>(9)?),
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

/// Dead deliveries grouped by handler and their last attempt's error kind (found through the
/// `deliveries_state_event` index, then one `attempts_delivery` probe each), largest group
/// first.
pub(super) fn dead_letter_groups(conn: &Connection) -> Result<Vec<DeadLetterGroup>, InboxError> {
    Ok(conn
        .prepare_cached(
            "SELECT handler, kind, COUNT(*), MIN(updated_at), MAX(updated_at), MAX(last_error)
             FROM (SELECT d.handler, d.updated_at, d.last_error,
                          (SELECT a.error_kind FROM attempts a WHERE a.delivery = d.id
                           ORDER BY a.id DESC LIMIT 1) AS kind
                   FROM deliveries d WHERE d.state = ?1)
             GROUP BY handler, kind
             ORDER BY COUNT(*) DESC, handler, kind",
        )?
        .query_map([DeliveryState::Dead.as_str()], |r| {
            Ok(DeadLetterGroup {
                handler: r.get(0)?,
                error_kind: r.get(1)?,
                count: r.get(2)?,
                first_ms: r.get(3)?,
                last_ms: r.get(4)?,
                example_error: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// Unresolved quarantined requests, newest first, without headers or bodies.
pub(super) fn held_requests(
    conn: &Connection,
    limit: usize,
    before_id: Option<i64>,
) -> Result<Vec<HeldRequest>, InboxError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, source, received_at, reason FROM quarantine
             WHERE resolved_at IS NULL AND id < ?1
             ORDER BY id DESC LIMIT ?2",
        )?
        .query_map(params![before_id.unwrap_or(i64::MAX), limit as i64], |r| {
            Ok(HeldRequest {
                id: r.get(0)?,
                source: r.get(1)?,
                received_at: r.get(2)?,
                reason: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::{
        super::{connection::in_memory, sql::query_plan},
        list_events, page_ids,
    };
    use crate::inbox::EventFilter;

    fn filter(event_id: &str) -> EventFilter {
        EventFilter {
            event_id: Some(event_id.into()),
            limit: 50,
            ..EventFilter::default()
        }
    }

    /// A filter by provider event id alone is one seek of the dedupe index per stored source
    /// (there is no index on the event id by itself), and finds the event in every source.
    #[test]
    fn an_event_id_is_found_by_seeks_of_the_dedupe_index() {
        let conn = in_memory();
        for (n, source) in ["a", "b", "c"].iter().cycle().take(300).enumerate() {
            conn.execute(
                "INSERT INTO events (source, event_id, event_type, received_at, headers, body)
                 VALUES (?1, ?2, 't', ?3, '[]', x'')",
                params![source, format!("e{}", n % 100), n as i64],
            )
            .unwrap();
        }
        conn.execute_batch("ANALYZE").unwrap();
        let (sql, _) = page_ids(&filter("e7"));
        let plan = query_plan(&conn, &sql);
        assert!(
            plan.contains("sqlite_autoindex_events_1 (source=? AND event_id=?)"),
            "{plan}"
        );
        assert!(!plan.contains("SCAN e"), "{plan}");
        let found = list_events(&conn, &filter("e7")).unwrap();
        let mut sources: Vec<_> = found.iter().map(|e| e.source.as_str()).collect();
        sources.sort();
        assert_eq!(sources, ["a", "b", "c"]);
        assert!(list_events(&conn, &filter("nope")).unwrap().is_empty());
    }
}
