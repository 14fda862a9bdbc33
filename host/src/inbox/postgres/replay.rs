//! Replay in SQL: select the deliveries a filter matches, and set them due again (finished
//! ones with a fresh budget, retrying ones now).
//!
//! Invariant: the update re-checks the state it selected, so a delivery that left it between
//! the select and the update (leased, discarded, or replayed and run by any node; under READ
//! COMMITTED the update sees that row's latest commit) is left alone; `budget_base` moves up to
//! `attempts`, which keeps counting (it is the lease token), for finished deliveries only.

use super::statements::{Run, Tx};
use crate::{
    inbox::{InboxError, ReplayFilter},
    model::DeliveryState,
};

/// Sets the deliveries `filter` matches due at `now_ms`, finished ones with a fresh budget
/// (none on a dry run); returns `(matched, replayed)`.
pub(super) async fn replay_matching(
    tx: &Tx<'_>,
    filter: &ReplayFilter,
    now_ms: i64,
) -> Result<(usize, usize), InboxError> {
    let state = filter.replayed_state()?;
    let ids = matching_deliveries(tx, filter, state).await?;
    if filter.dry_run {
        return Ok((ids.len(), 0));
    }
    if state == DeliveryState::Retrying {
        // Due now, with its attempt budget as it is (and forced, if asked); one due (and
        // forced) already is matched, not replayed, so replays racing for it on any nodes
        // count it once.
        let replayed = tx
            .execute(
                "UPDATE deliveries SET next_attempt_at = LEAST(next_attempt_at, $2),
                     updated_at = $2, deliver_stale = deliver_stale OR $3
                 WHERE id = ANY($1) AND state = 'retrying'
                   AND (next_attempt_at > $2 OR ($3 AND NOT deliver_stale))",
                &[&ids, &now_ms, &filter.force],
            )
            .await?;
        return Ok((ids.len(), replayed as usize));
    }
    let replayed = tx
        .execute(
            "UPDATE deliveries SET state = 'pending', budget_base = attempts,
                 next_attempt_at = $2, lease_until = NULL, updated_at = $2, deliver_stale = $4
             WHERE id = ANY($1) AND state = $3",
            &[&ids, &now_ms, &state.as_str(), &filter.force],
        )
        .await?;
    Ok((ids.len(), replayed as usize))
}

/// The deliveries in `state` that `filter` selects, oldest first, at most `filter.limit`; those
/// of pruned events never (their payload is gone). Their events are locked `FOR SHARE` until
/// the transaction ends, so a prune (which locks them for update) cannot come in between, and a
/// prune that committed while this waited for the lock is seen (`pruned_at` is re-checked).
pub(super) async fn matching_deliveries(
    tx: &Tx<'_>,
    filter: &ReplayFilter,
    state: DeliveryState,
) -> Result<Vec<i64>, InboxError> {
    Ok(tx
        .query(
            "SELECT d.id FROM deliveries d JOIN events e ON e.id = d.event
             WHERE d.state = $1 AND e.pruned_at IS NULL
               AND ($2::text IS NULL OR d.source = $2)
               AND ($3::text IS NULL OR d.handler = $3)
               AND ($4::text[] IS NULL OR e.event_id = ANY($4))
               AND ($5::bigint IS NULL OR e.received_at >= $5)
               AND ($6::bigint IS NULL OR e.received_at <= $6)
               AND ($8::text IS NULL OR (SELECT a.error_kind FROM attempts a
                                         WHERE a.delivery = d.id
                                         ORDER BY a.id DESC LIMIT 1) = $8)
               AND ($9::text[] IS NULL OR d.handler = ANY($9))
             ORDER BY d.id LIMIT $7
             FOR SHARE OF e",
            &[
                &state.as_str(),
                &filter.source,
                &filter.handler,
                &filter.event_ids,
                &filter.since_ms,
                &filter.until_ms,
                &(filter.limit as i64),
                &filter.error_kind,
                &filter.declared_handlers,
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}
