//! Quarantine in SQL: keep a request, resolve it, count and list the held ones.
//!
//! Invariant: reads of held requests by filter are answered from the `quarantine_held` index
//! alone, so they never read a body.

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};

use super::sql::{headers_from_json, headers_json};
use crate::{
    ids::SourceName,
    inbox::{InboxError, Quarantined, RawRequest, ReplayFilter},
};

/// Stores `request` from `source` as quarantined for `reason`; returns its id.
pub(super) fn insert(
    conn: &Connection,
    source: &SourceName,
    request: &RawRequest,
    reason: &str,
) -> Result<i64, InboxError> {
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
}

/// Marks quarantined request `id` resolved at `at_ms`, saying how, if it is still held; returns
/// whether it was (a concurrent replay or discard may have resolved it first).
pub(super) fn resolve(
    conn: &Connection,
    id: i64,
    at_ms: i64,
    resolution: &str,
) -> Result<bool, InboxError> {
    let resolved = conn
        .prepare_cached(
            "UPDATE quarantine SET resolved_at = ?2, resolution = ?3
             WHERE id = ?1 AND resolved_at IS NULL",
        )?
        .execute(params![id, at_ms, resolution])?;
    Ok(resolved == 1)
}

/// Quarantined requests not yet resolved.
pub(super) fn count_held(conn: &Connection) -> Result<i64, InboxError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL",
        [],
        |row| row.get(0),
    )?)
}

/// Ids of the unresolved requests matching `filter`'s source and time range, oldest first.
pub(super) fn held_ids(conn: &Connection, filter: &ReplayFilter) -> Result<Vec<i64>, InboxError> {
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
}

/// Quarantined request `id` with its body, if it is still unresolved.
pub(super) fn held(conn: &Connection, id: i64) -> Result<Option<Quarantined>, InboxError> {
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
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

    use super::super::{
        SqliteStore,
        writer::{WriterOptions, testing::hold},
    };
    use crate::{
        clock::Clock,
        config::Durability,
        ids::SourceName,
        inbox::{Inbox, contract::fixtures},
    };

    /// A recount of what is stored (after a replay; on a shared database, every second) while a
    /// quarantine write waits for its commit does not forget the write. Before, the recount
    /// dropped its slot and a second request was admitted past `max_held`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_recount_while_a_quarantine_write_waits_keeps_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let options = WriterOptions::new(Durability::Normal);
        let store = SqliteStore::open(&dir.path().join("hookd.db"), options).unwrap();
        let counts = store.counts_blocking();
        let inbox =
            Inbox::on_store(Arc::new(store.clone()), counts, Clock::system(), None).unwrap();
        let quarantine = |inbox: Inbox, reason: &str| {
            let reason = reason.to_owned();
            async move {
                let source = SourceName::new("s");
                inbox
                    .quarantine(source, fixtures::request(), reason, 1)
                    .await
            }
        };
        let (release, held) = hold(&store);
        let first = tokio::spawn(quarantine(inbox.clone(), "first"));
        while inbox.inner.quarantining.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            inbox.recount_quarantine().await.unwrap(),
            0,
            "nothing committed yet"
        );
        let second =
            tokio::time::timeout(Duration::from_secs(5), quarantine(inbox.clone(), "second")).await;
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert!(
            matches!(second, Ok(Ok(None))),
            "a second request was admitted past max_held = 1: {second:?}"
        );
        assert!(first.await.unwrap().unwrap().is_some());
        assert_eq!(inbox.quarantine_held(), 1);
    }

    /// A request replayed out of quarantine into a duplicate of another event's body is
    /// resolved naming that event; into a duplicate of its own id (stored before the source
    /// deduped by body, with another body), as accepted under that id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_duplicate_leaves_quarantine_naming_the_event_it_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let options = WriterOptions::new(Durability::Normal);
        let store = SqliteStore::open(&path, options).unwrap();
        let counts = store.counts_blocking();
        let inbox =
            Inbox::on_store(Arc::new(store.clone()), counts, Clock::system(), None).unwrap();
        let resolution = |id: i64| -> String {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row(
                    "SELECT resolution FROM quarantine WHERE id = ?1",
                    [id],
                    |row| row.get(0),
                )
                .unwrap()
        };
        fixtures::accept_body(&inbox, false, fixtures::event("b"), b"{\"n\":0}").await;
        fixtures::accept_body(&inbox, true, fixtures::event("a"), b"{\"n\":1}").await;
        for (id, expected) in [
            ("c", "a duplicate of the body of event a (parsed as c)"),
            ("b", "accepted as b"),
        ] {
            let held = fixtures::quarantine(&inbox, 10).await.unwrap();
            let body = b"{\"n\":1}";
            let accepted =
                fixtures::accept_body_from(&inbox, true, fixtures::event(id), body, Some(held))
                    .await;
            assert_eq!(accepted, crate::inbox::Accepted::Duplicate, "{id}");
            assert_eq!(resolution(held), expected);
        }
    }
}
