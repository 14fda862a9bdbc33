//! Quarantine in SQL: keep a request, resolve it, count and list the held ones.
//!
//! Invariant: reads of held requests by filter select only ids (the `quarantine_held` index
//! covers them), so they never read a body.

use bytes::Bytes;

use super::statements::{Conn, Run, Tx};
use crate::{
    ids::SourceName,
    inbox::{
        InboxError, Quarantined, RawRequest, ReplayFilter,
        request::{headers_from_json, headers_json},
    },
};

/// Stores `request` from `source` as quarantined for `reason`; returns its id.
pub(super) async fn insert(
    tx: &Tx<'_>,
    source: &SourceName,
    request: &RawRequest,
    reason: &str,
) -> Result<i64, InboxError> {
    let row = tx
        .query_one(
            "INSERT INTO quarantine (source, received_at, headers, body, reason)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
            &[
                &source.as_str(),
                &request.received_at_ms,
                &headers_json(&request.headers),
                &&request.body[..],
                &reason,
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// Marks quarantined request `id` resolved at `at_ms`, saying how, if it is still held; returns
/// whether it was (a concurrent replay or discard, on any node, may have resolved it first: the
/// row's lock makes the later one see it resolved).
pub(super) async fn resolve(
    tx: &Tx<'_>,
    id: i64,
    at_ms: i64,
    resolution: &str,
) -> Result<bool, InboxError> {
    let resolved = tx
        .execute(
            "UPDATE quarantine SET resolved_at = $2, resolution = $3
             WHERE id = $1 AND resolved_at IS NULL",
            &[&id, &at_ms, &resolution],
        )
        .await?;
    Ok(resolved == 1)
}

/// Quarantined requests not yet resolved.
pub(super) async fn count_held(client: &Conn) -> Result<i64, InboxError> {
    let row = client
        .query_one(
            "SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Ids of the unresolved requests matching `filter`'s source and time range, oldest first.
pub(super) async fn held_ids(client: &Conn, filter: &ReplayFilter) -> Result<Vec<i64>, InboxError> {
    let rows = client
        .query(
            "SELECT id FROM quarantine
             WHERE resolved_at IS NULL
               AND ($1::text IS NULL OR source = $1)
               AND ($2::bigint IS NULL OR received_at >= $2)
               AND ($3::bigint IS NULL OR received_at <= $3)
             ORDER BY id LIMIT $4",
            &[
                &filter.source,
                &filter.since_ms,
                &filter.until_ms,
                &(filter.limit as i64),
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Quarantined request `id` with its body, if it is still unresolved.
pub(super) async fn held(client: &Conn, id: i64) -> Result<Option<Quarantined>, InboxError> {
    let row = client
        .query_opt(
            "SELECT source, received_at, headers, body FROM quarantine
             WHERE id = $1 AND resolved_at IS NULL",
            &[&id],
        )
        .await?;
    Ok(row.map(|r| Quarantined {
        id,
        source: SourceName::new(r.get::<_, String>(0)),
        request: RawRequest {
            headers: headers_from_json(r.get(2)),
            body: Bytes::from(r.get::<_, Vec<u8>>(3)),
            received_at_ms: r.get(1),
        },
    }))
}
