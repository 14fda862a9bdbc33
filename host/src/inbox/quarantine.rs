//! Verified requests whose envelope could not be produced: kept, bounded, and replayable.
//!
//! Invariants:
//! - Quarantine is bounded like the backlog: a slot is taken before the write, so concurrent
//!   requests cannot overshoot `max_held`.
//! - Reads of held requests by filter never read a body (a covering index answers them).

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    Inbox, InboxError, RawRequest, ReplayFilter,
    sql::{headers_from_json, headers_json},
};
use crate::ids::SourceName;

/// A quarantined request waiting to be parsed again.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub id: i64,
    pub source: SourceName,
    pub request: RawRequest,
}

/// Marks quarantined request `id` resolved at `at_ms`, saying how.
pub(super) fn resolve(
    conn: &Connection,
    id: i64,
    at_ms: i64,
    resolution: &str,
) -> Result<(), InboxError> {
    conn.prepare_cached("UPDATE quarantine SET resolved_at = ?2, resolution = ?3 WHERE id = ?1")?
        .execute(params![id, at_ms, resolution])?;
    Ok(())
}

/// Quarantined requests not yet resolved.
pub(super) fn count_held(conn: &Connection) -> Result<i64, InboxError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL",
        [],
        |row| row.get(0),
    )?)
}

impl Inbox {
    /// Keeps a verified request whose envelope could not be produced; returns its id, or `None`
    /// (nothing written) when `max_held` requests are already held: quarantine is bounded like
    /// the backlog. The slot is taken before the write, so concurrent requests cannot overshoot.
    pub async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
        max_held: u64,
    ) -> Result<Option<i64>, InboxError> {
        let max_held = i64::try_from(max_held).unwrap_or(i64::MAX);
        if !self.reserve_quarantine(max_held) {
            return Ok(None);
        }
        let written = self
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO quarantine (source, received_at, headers, body, reason)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![
                    source.as_str(),
                    request.received_at_ms,
                    headers_json(&request.headers),
                    &request.body[..],
                    reason
                ])?;
                Ok(conn.last_insert_rowid())
            })
            .await;
        if written.is_err() {
            self.release_quarantine();
        }
        written.map(Some)
    }

    /// Sets the held-quarantine count (the bound's measure) from the table: after a replay, whose
    /// accepts resolve quarantined requests in their own transactions.
    pub async fn recount_quarantine(&self) -> Result<i64, InboxError> {
        let held = self.quarantine_held_count().await?;
        self.set_quarantine_held(held);
        Ok(held)
    }

    /// Ids of the quarantined requests not yet resolved that match the replay filter's source
    /// and time range (at most `filter.limit`, oldest first). Reads no body.
    pub async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError> {
        self.read(move |conn| {
            let ids = conn
                // Answered from the `quarantine_held` index alone.
                .prepare_cached(
                    "SELECT id FROM quarantine
                     WHERE resolved_at IS NULL
                       AND (?1 IS NULL OR source = ?1)
                       AND (?2 IS NULL OR received_at >= ?2)
                       AND (?3 IS NULL OR received_at <= ?3)
                     ORDER BY id LIMIT ?4",
                )?
                .query_map(
                    params![
                        filter.source,
                        filter.since_ms,
                        filter.until_ms,
                        filter.limit as i64
                    ],
                    |r| r.get(0),
                )?
                .collect::<Result<_, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// How many quarantined requests [`Inbox::held_quarantine_ids`] would return. Reads no body.
    pub async fn held_quarantine_count(&self, filter: ReplayFilter) -> Result<usize, InboxError> {
        Ok(self.held_quarantine_ids(filter).await?.len())
    }

    /// One quarantined request with its body, if it is still unresolved.
    pub async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT source, received_at, headers, body FROM quarantine
                     WHERE id = ?1 AND resolved_at IS NULL",
                )?
                .query_row(params![id], |r| {
                    let headers: String = r.get(2)?;
                    let body: Vec<u8> = r.get(3)?;
                    Ok(Quarantined {
                        id,
                        source: SourceName::new(r.get::<_, String>(0)?),
                        request: RawRequest {
                            headers: headers_from_json(&headers),
                            body: Bytes::from(body),
                            received_at_ms: r.get(1)?,
                        },
                    })
                })
                .optional()?)
        })
        .await
    }

    /// Marks a quarantined request resolved without an event (its parser now says invalid/ignore).
    pub async fn resolve_quarantine(&self, id: i64, resolution: String) -> Result<(), InboxError> {
        let now = self.now_ms();
        self.write(move |conn| resolve(conn, id, now, &resolution))
            .await
    }

    /// Quarantined requests not yet resolved.
    pub async fn quarantine_held_count(&self) -> Result<i64, InboxError> {
        self.read(count_held).await
    }
}
