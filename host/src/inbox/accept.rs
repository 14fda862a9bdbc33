//! A verified request becomes an event: one row per event, one pending delivery per handler.
//!
//! Invariant: the event, its deliveries and (when it comes from quarantine) the quarantine row's
//! resolution are written in one savepoint; a duplicate `(source, event_id)` writes nothing but
//! that resolution.

use rusqlite::{Connection, params};

use super::{Inbox, InboxError, RawRequest, quarantine, sql::headers_json};
use crate::{
    ids::{PluginName, SourceName},
    model::Envelope,
};

/// An accept's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Stored now, with its deliveries.
    New,
    /// `(source, event_id)` was already stored: nothing new was written.
    Duplicate,
}

impl Inbox {
    /// Stores a new event and one pending delivery per handler, or reports a duplicate.
    /// `from_quarantine` marks that quarantined request resolved in the same transaction.
    pub async fn accept(
        &self,
        source: SourceName,
        envelope: Envelope,
        request: RawRequest,
        handlers: Vec<PluginName>,
        from_quarantine: Option<i64>,
    ) -> Result<Accepted, InboxError> {
        let handler_count = handlers.len() as i64;
        let event = NewEvent {
            source,
            envelope,
            request,
            handlers,
            from_quarantine,
        };
        let accepted = self.write(move |conn| store_event(conn, &event)).await?;
        if accepted == Accepted::New && handler_count > 0 {
            self.add_backlog(handler_count);
            self.wake_workers();
        }
        Ok(accepted)
    }

    /// Whether `(source, event_id)` is stored (lets an overloaded host still answer a
    /// provider's retry of a stored event with `duplicate`, not 503).
    pub async fn contains_event(
        &self,
        source: String,
        event_id: String,
    ) -> Result<bool, InboxError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT 1 FROM events WHERE source = ?1 AND event_id = ?2")?
                .exists(params![source, event_id])?)
        })
        .await
    }
}

/// What one accept writes.
struct NewEvent {
    source: SourceName,
    envelope: Envelope,
    request: RawRequest,
    handlers: Vec<PluginName>,
    from_quarantine: Option<i64>,
}

/// Inserts the event and its deliveries unless `(source, event_id)` is stored, and resolves the
/// quarantined request it came from either way.
fn store_event(conn: &Connection, new: &NewEvent) -> Result<Accepted, InboxError> {
    let NewEvent {
        source,
        envelope,
        request,
        handlers,
        from_quarantine,
    } = new;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                 received_at, headers, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (source, event_id) DO NOTHING",
        )?
        .execute(params![
            source.as_str(),
            envelope.event_id.as_str(),
            envelope.event_type,
            envelope.ordering_key,
            envelope.sequence.map(|s| s as i64),
            request.received_at_ms,
            headers_json(&request.headers),
            &request.body[..],
        ])?;
    let accepted = if inserted == 1 {
        let event = conn.last_insert_rowid();
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
    if let Some(id) = from_quarantine {
        let resolution = format!("accepted as {}", envelope.event_id);
        quarantine::resolve(conn, *id, request.received_at_ms, &resolution)?;
    }
    Ok(accepted)
}
