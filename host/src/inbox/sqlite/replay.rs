//! Replay in SQL: select the deliveries a filter matches, and set them due again (finished
//! ones with a fresh budget, retrying ones now).
//!
//! Invariants:
//! - The select runs on a read connection, never on the writer: over a large inbox it can take
//!   a second, and the writer is what every `202` waits for. A dry run is the select alone.
//! - The update, on the writer, re-checks what the select found (the state, and that the event
//!   is not pruned), so a delivery that changed in between is left alone; `budget_base` moves
//!   up to `attempts`, which keeps counting (it is the lease token), for finished deliveries
//!   only.

use rusqlite::{Connection, params};

use crate::{
    inbox::{InboxError, ReplayFilter},
    model::DeliveryState,
};

/// Sets deliveries `ids`, which [`matching_deliveries`] found in `state` for `filter`, due at
/// `now_ms`, finished ones with a fresh budget; returns how many it replayed (those still in
/// `state`, of an event not pruned meanwhile).
pub(super) fn replay_ids(
    conn: &Connection,
    ids: &[i64],
    filter: &ReplayFilter,
    state: DeliveryState,
    now_ms: i64,
) -> Result<usize, InboxError> {
    if state == DeliveryState::Retrying {
        // Due now, with its attempt budget as it is (and forced, if asked); one due (and
        // forced) already is matched, not replayed, so replays racing for it count it once.
        let mut update = conn.prepare_cached(
            "UPDATE deliveries SET next_attempt_at = MIN(next_attempt_at, ?2), updated_at = ?2,
                 deliver_stale = MAX(deliver_stale, ?3)
             WHERE id = ?1 AND state = 'retrying'
               AND (next_attempt_at > ?2 OR (?3 AND NOT deliver_stale))",
        )?;
        let mut replayed = 0;
        for id in ids {
            replayed += update.execute(params![id, now_ms, filter.force])?;
        }
        return Ok(replayed);
    }
    let mut update = conn.prepare_cached(
        "UPDATE deliveries SET state = 'pending', budget_base = attempts,
             next_attempt_at = ?2, lease_until = NULL, updated_at = ?2, deliver_stale = ?3
         WHERE id = ?1 AND state = ?4
           AND (SELECT pruned_at FROM events WHERE events.id = deliveries.event) IS NULL",
    )?;
    let mut replayed = 0;
    for id in ids {
        replayed += update.execute(params![id, now_ms, filter.force, state.as_str()])?;
    }
    Ok(replayed)
}

/// The deliveries in `state` that `filter` selects, oldest first, at most `filter.limit`; those
/// of pruned events never (their payload is gone).
pub(super) fn matching_deliveries(
    conn: &Connection,
    filter: &ReplayFilter,
    state: DeliveryState,
) -> Result<Vec<i64>, InboxError> {
    let ids_json = filter
        .event_ids
        .as_ref()
        .map(|ids| serde_json::to_string(ids).expect("strings serialize"));
    let handlers_json = filter
        .declared_handlers
        .as_ref()
        .map(|names| serde_json::to_string(names).expect("strings serialize"));
    let ids = conn
        .prepare_cached(
            "SELECT d.id FROM deliveries d JOIN events e ON e.id = d.event
             WHERE d.state = ?1 AND e.pruned_at IS NULL
               AND (?2 IS NULL OR d.source = ?2)
               AND (?3 IS NULL OR d.handler = ?3)
               AND (?4 IS NULL OR e.event_id IN (SELECT value FROM json_each(?4)))
               AND (?5 IS NULL OR e.received_at >= ?5)
               AND (?6 IS NULL OR e.received_at <= ?6)
               AND (?8 IS NULL OR (SELECT a.error_kind FROM attempts a WHERE a.delivery = d.id
                                   ORDER BY a.id DESC LIMIT 1) = ?8)
               AND (?9 IS NULL OR d.handler IN (SELECT value FROM json_each(?9)))
             ORDER BY d.id LIMIT ?7",
        )?
        .query_map(
            params![
                state.as_str(),
                filter.source,
                filter.handler,
                ids_json,
                filter.since_ms,
                filter.until_ms,
                filter.limit as i64,
                filter.error_kind,
                handlers_json,
            ],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?;
    Ok(ids)
}
