//! Retention and discard in SQL: prune finished events' payloads, forget pruned ids, delete
//! resolved quarantine; close dead deliveries and held quarantined requests.
//!
//! Invariants:
//! - A batch is one writer job (one savepoint of a group commit) and touches at most `limit`
//!   rows of each kind, each found through an index (`events_unpruned`, `events_pruned`,
//!   `quarantine_held`, the deliveries' `(event, handler)` key), never by a table scan.
//! - An event is pruned only if none of its deliveries is outside `DeliveryState::FINISHED` and
//!   none finished after the cut-off; the writer being the only connection that writes, no
//!   replay or claim can come between that check and the prune.

use rusqlite::{Connection, params};

use super::{quarantine, replay::matching_deliveries, sql::finished_states};
use crate::inbox::{
    InboxError, Pruned, ReplayFilter,
    retention::{DISCARDED_RESOLUTION, PruneBatch},
};

/// Runs one batch of retention (see `Store::prune`).
pub(super) fn prune(conn: &Connection, batch: &PruneBatch) -> Result<Pruned, InboxError> {
    let (events, next) = prune_payloads(conn, batch)?;
    let forgotten = match batch.forget_before {
        Some(before) => forget(conn, before, batch.limit)?,
        None => 0,
    };
    let quarantine = conn
        .prepare_cached(
            "DELETE FROM quarantine WHERE id IN (
                 SELECT id FROM quarantine
                 WHERE resolved_at IS NOT NULL AND resolved_at < ?1
                 ORDER BY resolved_at LIMIT ?2)",
        )?
        .execute(params![batch.finished_before, batch.limit as i64])?;
    Ok(Pruned {
        events,
        forgotten,
        quarantine,
        next,
        busy: false,
    })
}

/// Walks up to `limit` events not yet pruned from `batch.after` and prunes the finished ones;
/// returns how many it pruned and where the walk stopped (`None`: it reached the cut-off).
fn prune_payloads(
    conn: &Connection,
    batch: &PruneBatch,
) -> Result<(usize, Option<(i64, i64)>), InboxError> {
    let (after_at, after_id) = batch.after.unwrap_or((i64::MIN, i64::MIN));
    let walked: Vec<(i64, i64)> = conn
        .prepare_cached(
            "SELECT received_at, id FROM events
             WHERE pruned_at IS NULL AND received_at < ?1 AND (received_at, id) > (?2, ?3)
             ORDER BY received_at, id LIMIT ?4",
        )?
        .query_map(
            params![
                batch.finished_before,
                after_at,
                after_id,
                batch.limit as i64
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?
        .collect::<Result<_, _>>()?;
    let mut unfinished = conn.prepare_cached(concat!(
        "SELECT EXISTS (SELECT 1 FROM deliveries WHERE event = ?1
                          AND (state NOT IN ",
        finished_states!(),
        " OR updated_at >= ?2))"
    ))?;
    let mut pruned = 0;
    for &(_, id) in &walked {
        let busy: bool = unfinished.query_row(params![id, batch.finished_before], |r| r.get(0))?;
        if !busy {
            prune_event(conn, id, batch.now_ms)?;
            pruned += 1;
        }
    }
    let next = (walked.len() >= batch.limit)
        .then(|| walked.last().copied())
        .flatten();
    Ok((pruned, next))
}

/// Drops event `id`'s payload, its deliveries' outputs and errors, and their attempts.
fn prune_event(conn: &Connection, id: i64, now_ms: i64) -> Result<(), InboxError> {
    conn.prepare_cached(
        "DELETE FROM attempts WHERE delivery IN (SELECT id FROM deliveries WHERE event = ?1)",
    )?
    .execute([id])?;
    conn.prepare_cached("UPDATE deliveries SET output = NULL, last_error = NULL WHERE event = ?1")?
        .execute([id])?;
    conn.prepare_cached(
        "UPDATE events SET headers = '[]', body = X'', pruned_at = ?2 WHERE id = ?1",
    )?
    .execute(params![id, now_ms])?;
    Ok(())
}

/// Deletes up to `limit` events pruned before `before`, with their delivery rows.
fn forget(conn: &Connection, before: i64, limit: usize) -> Result<usize, InboxError> {
    let ids: Vec<i64> = conn
        .prepare_cached(
            "SELECT id FROM events WHERE pruned_at IS NOT NULL AND pruned_at < ?1
             ORDER BY pruned_at LIMIT ?2",
        )?
        .query_map(params![before, limit as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut deliveries = conn.prepare_cached("DELETE FROM deliveries WHERE event = ?1")?;
    let mut events = conn.prepare_cached("DELETE FROM events WHERE id = ?1")?;
    for id in &ids {
        deliveries.execute([id])?;
        events.execute([id])?;
    }
    Ok(ids.len())
}

/// Sets the dead deliveries `filter` matches to `discarded` at `now_ms` (none on a dry run).
pub(super) fn discard(
    conn: &Connection,
    filter: &ReplayFilter,
    now_ms: i64,
) -> Result<(usize, usize), InboxError> {
    let ids = matching_deliveries(conn, filter, filter.discardable_state()?)?;
    if filter.dry_run {
        return Ok((ids.len(), 0));
    }
    let mut update = conn.prepare_cached(
        "UPDATE deliveries SET state = 'discarded', lease_until = NULL, updated_at = ?2
         WHERE id = ?1 AND state = 'dead'",
    )?;
    let mut discarded = 0;
    for id in &ids {
        discarded += update.execute(params![id, now_ms])?;
    }
    Ok((ids.len(), discarded))
}

/// Resolves the held quarantined requests `filter` matches as discarded (none on a dry run).
pub(super) fn discard_quarantine(
    conn: &Connection,
    filter: &ReplayFilter,
    now_ms: i64,
) -> Result<(usize, usize), InboxError> {
    let ids = quarantine::held_ids(conn, filter)?;
    if filter.dry_run {
        return Ok((ids.len(), 0));
    }
    let mut resolve = conn.prepare_cached(
        "UPDATE quarantine SET resolved_at = ?2, resolution = ?3
         WHERE id = ?1 AND resolved_at IS NULL",
    )?;
    let mut discarded = 0;
    for id in &ids {
        discarded += resolve.execute(params![id, now_ms, DISCARDED_RESOLUTION])?;
    }
    Ok((ids.len(), discarded))
}
