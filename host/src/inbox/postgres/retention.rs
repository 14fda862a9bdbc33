//! Retention and discard in SQL for a database several nodes share: prune finished events'
//! payloads, forget pruned ids, delete resolved quarantine; close dead deliveries and held
//! quarantined requests.
//!
//! Invariants:
//! - One batch is one short transaction that first takes [`PRUNE_LOCK`] with
//!   `pg_try_advisory_xact_lock`: while one node prunes, another node's batch returns at once
//!   (`busy`) instead of walking the same rows, and nodes never wait on each other for it.
//! - An event is pruned only under its row lock (`FOR UPDATE OF e SKIP LOCKED`) and only if,
//!   in that statement, none of its deliveries is outside `DeliveryState::FINISHED` or finished
//!   after the cut-off. A replay locks the events it selects (`FOR SHARE`, re-checking
//!   `pruned_at IS NULL` once it has the lock), so a replay and a prune of one event are
//!   serialised: a replayed delivery is never left with a pruned payload.
//! - Every row is found through an index (`events_unpruned`, `events_pruned`,
//!   `quarantine_held`, the deliveries' `(event, handler)` key), at most `limit` of each kind.

use super::{
    replay::matching_deliveries,
    state_names,
    statements::{Run, Tx},
};
use crate::{
    inbox::{
        InboxError, Pruned, ReplayFilter,
        retention::{DISCARDED_RESOLUTION, PruneBatch},
    },
    model::DeliveryState,
};

/// The advisory lock one pruning batch runs under, cluster-wide (any constant, the same in
/// every hookd; the migrations' is `…0001`).
const PRUNE_LOCK: i64 = 0x686f_6f6b_6400_0002;

/// Runs one batch of retention in `tx` (see `Store::prune`).
pub(super) async fn prune(tx: &Tx<'_>, batch: &PruneBatch) -> Result<Pruned, InboxError> {
    let locked: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&PRUNE_LOCK])
        .await?
        .get(0);
    if !locked {
        return Ok(Pruned {
            busy: true,
            ..Pruned::default()
        });
    }
    let (events, next) = prune_payloads(tx, batch).await?;
    let forgotten = match batch.forget_before {
        Some(before) => forget(tx, before, batch.limit).await?,
        None => 0,
    };
    let quarantine = tx
        .execute(
            "DELETE FROM quarantine WHERE id IN (
                     SELECT id FROM quarantine
                     WHERE resolved_at IS NOT NULL AND resolved_at < $1
                     ORDER BY resolved_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
            &[&batch.finished_before, &(batch.limit as i64)],
        )
        .await? as usize;
    Ok(Pruned {
        events,
        forgotten,
        quarantine,
        next,
        cut_short: false,
        busy: false,
    })
}

/// Walks up to `limit` events not yet pruned from `batch.after` and prunes the finished ones;
/// returns how many it pruned and where the walk stopped (`None`: it reached the cut-off).
async fn prune_payloads(
    tx: &Tx<'_>,
    batch: &PruneBatch,
) -> Result<(usize, Option<(i64, i64)>), InboxError> {
    let (after_at, after_id) = batch.after.unwrap_or((i64::MIN, i64::MIN));
    let walked: Vec<(i64, i64)> = tx
        .query(
            "SELECT received_at, id FROM events
                 WHERE pruned_at IS NULL AND received_at < $1 AND (received_at, id) > ($2, $3)
                 ORDER BY received_at, id LIMIT $4",
            &[
                &batch.finished_before,
                &after_at,
                &after_id,
                &(batch.limit as i64),
            ],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let ids: Vec<i64> = walked.iter().map(|&(_, id)| id).collect();
    let locked: Vec<i64> = tx
        .query(
            "SELECT e.id FROM events e
                 WHERE e.id = ANY($1) AND e.pruned_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event = e.id
                                     AND (d.state <> ALL($2) OR d.updated_at >= $3))
                 FOR UPDATE OF e SKIP LOCKED",
            &[
                &ids,
                &state_names(&DeliveryState::FINISHED),
                &batch.finished_before,
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Checked again in a statement of its own: its snapshot is taken after the locks were
    // granted, so a replay that reopened one of these events and committed while this walk's
    // first statement ran (it locks the event only `FOR SHARE`, which a lock taken after it
    // does not see) leaves that event alone.
    let finished: Vec<i64> = tx
        .query(
            "UPDATE events e SET headers = '[]', body = '', pruned_at = $4
                 WHERE e.id = ANY($1) AND e.pruned_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event = e.id
                                     AND (d.state <> ALL($2) OR d.updated_at >= $3))
                 RETURNING e.id",
            &[
                &locked,
                &state_names(&DeliveryState::FINISHED),
                &batch.finished_before,
                &batch.now_ms,
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !finished.is_empty() {
        // But for the `ok` attempt of a delivery not `done` now (replayed since, then
        // discarded): it says its event was handled, which keeps older events of its key stale.
        tx.execute(
            "DELETE FROM attempts a USING deliveries d
                 WHERE a.delivery = d.id AND d.event = ANY($1)
                   AND NOT (a.outcome = 'ok' AND d.state <> 'done')",
            &[&finished],
        )
        .await?;
        tx.execute(
            "UPDATE deliveries SET output = NULL, last_error = NULL WHERE event = ANY($1)",
            &[&finished],
        )
        .await?;
    }
    let next = (walked.len() >= batch.limit)
        .then(|| walked.last().copied())
        .flatten();
    Ok((finished.len(), next))
}

/// Deletes up to `limit` events pruned before `before`, with their delivery rows.
async fn forget(tx: &Tx<'_>, before: i64, limit: usize) -> Result<usize, InboxError> {
    let ids: Vec<i64> = tx
        .query(
            "SELECT id FROM events WHERE pruned_at IS NOT NULL AND pruned_at < $1
                 ORDER BY pruned_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            &[&before, &(limit as i64)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    // The attempts a prune kept (an `ok` one of a delivery that is not `done`) go first: they
    // reference their delivery.
    tx.execute(
        "DELETE FROM attempts a USING deliveries d WHERE a.delivery = d.id AND d.event = ANY($1)",
        &[&ids],
    )
    .await?;
    tx.execute("DELETE FROM deliveries WHERE event = ANY($1)", &[&ids])
        .await?;
    tx.execute("DELETE FROM events WHERE id = ANY($1)", &[&ids])
        .await?;
    Ok(ids.len())
}

/// Sets the dead deliveries `filter` matches to `discarded` at `now_ms` (none on a dry run).
pub(super) async fn discard(
    tx: &Tx<'_>,
    filter: &ReplayFilter,
    now_ms: i64,
) -> Result<(usize, usize), InboxError> {
    let state = filter.discardable_state()?;
    let ids = matching_deliveries(tx, filter, state).await?;
    if filter.dry_run {
        return Ok((ids.len(), 0));
    }
    let discarded = tx
        .execute(
            "UPDATE deliveries SET state = 'discarded', lease_until = NULL, updated_at = $2
                 WHERE id = ANY($1) AND state = $3",
            &[&ids, &now_ms, &state.as_str()],
        )
        .await?;
    Ok((ids.len(), discarded as usize))
}

/// Resolves the quarantined requests `ids` as discarded at `now_ms`, those still held.
pub(super) async fn discard_quarantine(
    tx: &Tx<'_>,
    ids: &[i64],
    now_ms: i64,
) -> Result<usize, InboxError> {
    let discarded = tx
        .execute(
            "UPDATE quarantine SET resolved_at = $2, resolution = $3
                 WHERE id = ANY($1) AND resolved_at IS NULL",
            &[&ids, &now_ms, &DISCARDED_RESOLUTION],
        )
        .await?;
    Ok(discarded as usize)
}
