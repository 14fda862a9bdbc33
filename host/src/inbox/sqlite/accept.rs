//! Accept in SQL: the event row, its payload row (headers and body, in `payloads`), its delivery
//! rows, and the quarantine resolution.
//!
//! Invariant: all of it runs in the one savepoint of its writer job; the insert is
//! `ON CONFLICT DO NOTHING`, so the unique indexes decide a duplicate: `(source, event_id)`,
//! and `(source, body_sha256)` for a source that dedupes by body (the only other unique index
//! on `events`).

use rusqlite::{Connection, OptionalExtension, params};

use super::quarantine;
use crate::inbox::{Accepted, InboxError, quarantine::accepted_as, store::NewEvent};

/// Inserts the event and its deliveries unless `(source, event_id)` is stored, and resolves the
/// quarantined request it came from either way; writes nothing if that request is no longer
/// held. `headers` is the request's headers as stored
/// ([`headers_json`](super::sql::headers_json)), made before the job reaches the writer.
pub(super) fn store_event(
    conn: &Connection,
    new: &NewEvent,
    headers: &str,
) -> Result<Accepted, InboxError> {
    let NewEvent {
        source,
        envelope,
        request,
        handlers,
        body_sha256,
        from_quarantine,
        now_ms,
    } = new;
    if let Some(id) = from_quarantine {
        // Which stored event another id's body makes this one a duplicate of, if any, and its
        // own id is not stored (a duplicate of its id is that); the writer is the only one:
        // what this reads is what the insert meets.
        let body_of: Option<String> = match body_sha256 {
            Some(digest) => conn
                .prepare_cached(
                    "SELECT event_id FROM events
                     WHERE source = ?1 AND body_sha256 = ?2 AND event_id <> ?3
                       AND NOT EXISTS (SELECT 1 FROM events WHERE source = ?1 AND event_id = ?3)",
                )?
                .query_row(
                    params![source.as_str(), &digest[..], envelope.event_id.as_str()],
                    |row| row.get(0),
                )
                .optional()?,
            None => None,
        };
        let resolution = accepted_as(envelope.event_id.as_str(), body_of.as_deref());
        if !quarantine::resolve(conn, *id, *now_ms, &resolution)? {
            return Ok(Accepted::AlreadyResolved);
        }
    }
    let inserted = conn
        .prepare_cached(
            "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                 received_at, headers, body, body_sha256)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, '[]', X'', ?7)
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![
            source.as_str(),
            envelope.event_id.as_str(),
            envelope.event_type,
            envelope.ordering_key,
            envelope.sequence.map(|s| s as i64),
            request.received_at_ms,
            body_sha256.as_ref().map(|digest| &digest[..]),
        ])?;
    let accepted = if inserted == 1 {
        let event = conn.last_insert_rowid();
        conn.prepare_cached("INSERT INTO payloads (event, headers, body) VALUES (?1, ?2, ?3)")?
            .execute(params![event, headers, &request.body[..]])?;
        let mut insert = conn.prepare_cached(
            "INSERT INTO deliveries (event, source, handler, ordering_key, sequence,
                                     state, next_attempt_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
        )?;
        for handler in handlers {
            insert.execute(params![
                event,
                source.as_str(),
                handler.as_str(),
                envelope.ordering_key,
                envelope.sequence.map(|s| s as i64),
                request.received_at_ms,
            ])?;
        }
        Accepted::New
    } else {
        Accepted::Duplicate
    };
    Ok(accepted)
}

/// Whether `(source, event_id)` is stored.
pub(super) fn contains_event(
    conn: &Connection,
    source: &str,
    event_id: &str,
) -> Result<bool, InboxError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM events WHERE source = ?1 AND event_id = ?2")?
        .exists(params![source, event_id])?)
}
