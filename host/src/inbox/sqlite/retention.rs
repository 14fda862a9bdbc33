//! Retention and discard in SQL: prune finished events' payloads, forget pruned ids, delete
//! resolved quarantine; close dead deliveries and held quarantined requests.
//!
//! Invariants:
//! - A batch is one writer job (one savepoint of a group commit), stops once it has run for its
//!   `budget` (saying where), and touches at most `limit` rows of each kind, each found through
//!   an index (`events_unpruned`, `events_pruned`, `quarantine_held`, the deliveries'
//!   `(event, handler)` key), never by a table scan. Each of its parts (the walk, with half
//!   the budget; the forgetting; the resolved quarantine) does at least one row, so none is
//!   starved by another's backlog.
//! - A payload is deleted as a row of `payloads`, so the pages it took are reused (see
//!   `prune_event`).
//! - An event is pruned only if none of its deliveries is outside `DeliveryState::FINISHED` and
//!   none finished after the cut-off; the writer being the only connection that writes, no
//!   replay or claim can come between that check and the prune.
//! - A discard's select runs on a read connection (see `replay`), its update on the writer,
//!   re-checking what the select found (the state and an unpruned event, or a request still
//!   held).

use std::time::Instant;

use rusqlite::{Connection, params};

use super::sql::finished_states;
use crate::{
    inbox::{
        InboxError, PruneCursor, Pruned,
        retention::{DISCARDED_RESOLUTION, PruneBatch},
    },
    model::DeliveryState,
};

/// Runs one batch of retention (see `Store::prune`): the walk over the events not yet pruned
/// for the first half of the budget, then the forgetting, then the resolved quarantine, each
/// at least one row whatever the time (so none waits on the others: a walk over thousands of
/// dead letters, which it passes without pruning, cannot hold the forgetting back).
pub(super) fn prune(conn: &Connection, batch: &PruneBatch) -> Result<Pruned, InboxError> {
    let started = Instant::now();
    let deadline = started + batch.budget;
    let (events, next) = prune_payloads(conn, batch, started + batch.budget / 2)?;
    let (forgotten, forgetting_cut) = match batch.forget_before {
        Some(before) => forget(conn, before, batch.limit, deadline)?,
        None => (0, false),
    };
    let (quarantine, quarantine_cut) =
        delete_resolved(conn, batch.finished_before, batch.limit, deadline)?;
    Ok(Pruned {
        events,
        forgotten,
        quarantine,
        next,
        cut_short: forgetting_cut || quarantine_cut,
        busy: false,
    })
}

/// Deletes up to `limit` quarantined requests resolved before `before`, oldest first, one at
/// a time (each may hold a body of up to `max_body_bytes`).
fn delete_resolved(
    conn: &Connection,
    before: i64,
    limit: usize,
    deadline: Instant,
) -> Result<(usize, bool), InboxError> {
    let mut delete = conn.prepare_cached("DELETE FROM quarantine WHERE id = ?1")?;
    each_until(
        conn,
        "SELECT id FROM quarantine
         WHERE resolved_at IS NOT NULL AND resolved_at < ?1
         ORDER BY resolved_at LIMIT ?2",
        (before, limit),
        deadline,
        |id| Ok(delete.execute([id]).map(drop)?),
    )
}

/// Runs `each` on the ids `select` finds (its parameters `before` and the limit), in order,
/// stopping after the first at `deadline`; returns how many it ran on and whether it stopped
/// early.
fn each_until(
    conn: &Connection,
    select: &str,
    (before, limit): (i64, usize),
    deadline: Instant,
    mut each: impl FnMut(i64) -> Result<(), InboxError>,
) -> Result<(usize, bool), InboxError> {
    let ids: Vec<i64> = conn
        .prepare_cached(select)?
        .query_map(params![before, limit as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for (i, &id) in ids.iter().enumerate() {
        each(id)?;
        if i + 1 < ids.len() && Instant::now() >= deadline {
            return Ok((i + 1, true));
        }
    }
    Ok((ids.len(), false))
}

/// Events the walk reads per step: a batch its budget stops has read little ahead.
const WALK_STEP: usize = 32;

/// Walks up to `limit` events not yet pruned from `batch.after` and prunes the finished ones,
/// stopping early at `deadline`; returns how many it pruned and where the walk stopped (`None`:
/// it reached the cut-off).
fn prune_payloads(
    conn: &Connection,
    batch: &PruneBatch,
    deadline: Instant,
) -> Result<(usize, PruneCursor), InboxError> {
    let mut walk = conn.prepare_cached(
        "SELECT received_at, id FROM events
         WHERE pruned_at IS NULL AND received_at < ?1 AND (received_at, id) > (?2, ?3)
         ORDER BY received_at, id LIMIT ?4",
    )?;
    let mut unfinished = conn.prepare_cached(concat!(
        "SELECT EXISTS (SELECT 1 FROM deliveries WHERE event = ?1
                          AND (state NOT IN ",
        finished_states!(),
        " OR updated_at >= ?2))"
    ))?;
    let mut cursor = batch.after.unwrap_or((i64::MIN, i64::MIN));
    let (mut walked, mut pruned) = (0, 0);
    loop {
        let step = WALK_STEP.min(batch.limit - walked);
        let events: Vec<(i64, i64)> = walk
            .query_map(
                params![batch.finished_before, cursor.0, cursor.1, step as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .collect::<Result<_, _>>()?;
        for &(at, id) in &events {
            let busy: bool =
                unfinished.query_row(params![id, batch.finished_before], |r| r.get(0))?;
            if !busy {
                prune_event(conn, id, batch.now_ms)?;
                pruned += 1;
            }
            walked += 1;
            cursor = (at, id);
            if Instant::now() >= deadline {
                return Ok((pruned, Some(cursor)));
            }
        }
        if events.len() < step {
            return Ok((pruned, None)); // reached the cut-off
        }
        if walked >= batch.limit {
            return Ok((pruned, Some(cursor)));
        }
    }
}

/// Drops event `id`'s payload, its deliveries' outputs and errors, and their attempts, but
/// for the `ok` attempt of a delivery that is not `done` now (replayed since, then discarded):
/// that row is what says its event was handled, which keeps older events of its ordering key
/// stale (`lease::NEWEST_ONCE_DONE`). A `done` delivery says so by its state.
///
/// The payload's `payloads` row is deleted whole: its pages go to the freelist, where new
/// events reuse them, and no index of `events` is touched (the row is updated in place, only
/// `pruned_at` changes, which moves it between the two partial indexes). An event stored
/// before `payloads` existed has its payload in `events` and is shrunk in place.
fn prune_event(conn: &Connection, id: i64, now_ms: i64) -> Result<(), InboxError> {
    conn.prepare_cached(
        "DELETE FROM attempts WHERE delivery IN (SELECT id FROM deliveries WHERE event = ?1)
             AND NOT (outcome = 'ok' AND delivery IN (
                 SELECT id FROM deliveries WHERE event = ?1 AND state <> 'done'))",
    )?
    .execute([id])?;
    conn.prepare_cached("UPDATE deliveries SET output = NULL, last_error = NULL WHERE event = ?1")?
        .execute([id])?;
    conn.prepare_cached("DELETE FROM payloads WHERE event = ?1")?
        .execute([id])?;
    conn.prepare_cached(
        "UPDATE events SET headers = '[]', body = X'', pruned_at = ?2 WHERE id = ?1",
    )?
    .execute(params![id, now_ms])?;
    Ok(())
}

/// Deletes up to `limit` events pruned before `before`, with their delivery rows, stopping
/// after the first at `deadline`; returns how many it deleted and whether it stopped early.
fn forget(
    conn: &Connection,
    before: i64,
    limit: usize,
    deadline: Instant,
) -> Result<(usize, bool), InboxError> {
    // The attempts a prune kept (an `ok` one of a delivery that is not `done`) go first: they
    // reference their delivery.
    let mut attempts = conn.prepare_cached(
        "DELETE FROM attempts WHERE delivery IN (SELECT id FROM deliveries WHERE event = ?1)",
    )?;
    let mut deliveries = conn.prepare_cached("DELETE FROM deliveries WHERE event = ?1")?;
    let mut events = conn.prepare_cached("DELETE FROM events WHERE id = ?1")?;
    each_until(
        conn,
        "SELECT id FROM events WHERE pruned_at IS NOT NULL AND pruned_at < ?1
         ORDER BY pruned_at LIMIT ?2",
        (before, limit),
        deadline,
        |id| {
            attempts.execute([id])?;
            deliveries.execute([id])?;
            events.execute([id])?;
            Ok(())
        },
    )
}

/// Sets deliveries `ids`, which [`matching_deliveries`](super::replay::matching_deliveries)
/// found in `state`, to `discarded` at `now_ms`, those still in `state` (of an event not pruned
/// meanwhile, as the select never picks one); returns how many.
pub(super) fn discard_ids(
    conn: &Connection,
    ids: &[i64],
    state: DeliveryState,
    now_ms: i64,
) -> Result<usize, InboxError> {
    let mut update = conn.prepare_cached(
        "UPDATE deliveries SET state = 'discarded', lease_until = NULL, updated_at = ?2
         WHERE id = ?1 AND state = ?3
           AND (SELECT pruned_at FROM events WHERE events.id = deliveries.event) IS NULL",
    )?;
    let mut discarded = 0;
    for id in ids {
        discarded += update.execute(params![id, now_ms, state.as_str()])?;
    }
    Ok(discarded)
}

/// Resolves the held quarantined requests `ids` (as [`quarantine::held_ids`] found them) as
/// discarded, those still held; returns how many.
pub(super) fn discard_held(
    conn: &Connection,
    ids: &[i64],
    now_ms: i64,
) -> Result<usize, InboxError> {
    let mut resolve = conn.prepare_cached(
        "UPDATE quarantine SET resolved_at = ?2, resolution = ?3
         WHERE id = ?1 AND resolved_at IS NULL",
    )?;
    let mut discarded = 0;
    for id in ids {
        discarded += resolve.execute(params![id, now_ms, DISCARDED_RESOLUTION])?;
    }
    Ok(discarded)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rusqlite::{Connection, params};

    use super::{super::connection::in_memory, prune};
    use crate::inbox::{PruneCursor, Pruned, retention::PruneBatch};

    fn db() -> Connection {
        in_memory()
    }

    /// `n` events received at `at` (as accept stores them), each with a 2 KB body and one
    /// `done` delivery.
    fn finished_events(conn: &Connection, first: usize, n: usize, at: i64) {
        let body = vec![7u8; 2048];
        for i in first..first + n {
            conn.execute(
                "INSERT INTO events (source, event_id, event_type, received_at, headers, body)
                 VALUES ('s', ?1, 't', ?2, '[]', X'')",
                params![format!("e{i}"), at],
            )
            .unwrap();
            let event = conn.last_insert_rowid();
            conn.execute(
                "INSERT INTO payloads (event, headers, body) VALUES (?1, '[[\"x\",\"y\"]]', ?2)",
                params![event, body],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO deliveries (event, source, handler, state, next_attempt_at,
                                         updated_at, output)
                 VALUES (?1, 's', 'h', 'done', ?2, ?2, '{\"ok\":true}')",
                params![event, at],
            )
            .unwrap();
        }
    }

    fn pages(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap()
    }

    fn batch(now_ms: i64, budget: Duration, after: PruneCursor) -> PruneBatch {
        PruneBatch {
            now_ms,
            finished_before: now_ms,
            forget_before: Some(now_ms + 1),
            limit: 500,
            budget,
            after,
        }
    }

    /// One batch in a transaction of its own, as the writer runs it.
    fn run(conn: &Connection, batch: &PruneBatch) -> Pruned {
        conn.execute_batch("BEGIN").unwrap();
        let pruned = prune(conn, batch).unwrap();
        conn.execute_batch("COMMIT").unwrap();
        pruned
    }

    fn prune_all(conn: &Connection, now_ms: i64) -> usize {
        let mut pruned = 0;
        let mut after = None;
        loop {
            let done = run(
                conn,
                &PruneBatch {
                    forget_before: None,
                    ..batch(now_ms, Duration::from_secs(60), after)
                },
            );
            pruned += done.events;
            after = done.next;
            if after.is_none() {
                return pruned;
            }
        }
    }

    #[test]
    fn pruned_payloads_free_their_pages_for_new_events() {
        let conn = db();
        finished_events(&conn, 0, 2_000, 1_000);
        let full = pages(&conn);
        assert_eq!(prune_all(&conn, 2_000), 2_000);
        let kept: (String, i64, i64) = conn
            .query_row(
                "SELECT event_id, pruned_at, (SELECT COUNT(*) FROM payloads) FROM events
                 WHERE id = 7",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(kept, ("e6".to_string(), 2_000, 0));
        // As many new events again: they fill the pages the pruned payloads gave back, so the
        // database grows by a fraction of what the first ones took (shrunk in place in
        // `events`, the payloads' pages would stay and the database would double).
        finished_events(&conn, 2_000, 2_000, 3_000);
        let grown = pages(&conn) - full;
        assert!(
            grown * 4 < full,
            "{full} pages for the first events, then {grown} more for as many again"
        );
        let orphans: i64 = conn
            .query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(orphans, 0);
    }

    #[test]
    fn a_batch_stops_once_it_has_used_its_budget_and_says_where() {
        let conn = db();
        finished_events(&conn, 0, 10, 1_000);
        // No time at all: each batch still makes progress, one event pruned and one forgotten,
        // and says it has more.
        let first = run(&conn, &batch(2_000, Duration::ZERO, None));
        assert_eq!((first.events, first.forgotten), (1, 1));
        assert_eq!(first.next, Some((1_000, 1)));
        assert!(first.more(500));
        let second = run(&conn, &batch(2_000, Duration::ZERO, first.next));
        assert_eq!((second.events, second.next), (1, Some((1_000, 2))));
        // With time, one batch finishes the walk, then forgets what was pruned.
        let rest = run(&conn, &batch(2_000, Duration::from_secs(60), second.next));
        assert_eq!((rest.events, rest.forgotten, rest.next), (8, 8, None));
        assert!(!rest.more(500));
    }

    /// `n` events received at `at` (the only ones received then) whose one delivery is `dead`:
    /// never pruned, walked by every round.
    fn dead_events(conn: &Connection, first: usize, n: usize, at: i64) {
        finished_events(conn, first, n, at);
        conn.execute(
            "UPDATE deliveries SET state = 'dead' WHERE event IN
                 (SELECT id FROM events WHERE received_at = ?1)",
            [at],
        )
        .unwrap();
    }

    #[test]
    fn forgetting_goes_on_behind_a_walk_over_dead_letters() {
        let conn = db();
        finished_events(&conn, 0, 50, 1_000);
        assert_eq!(prune_all(&conn, 2_000), 50);
        // Dead letters received after them, which every round's walk passes without pruning.
        dead_events(&conn, 50, 200, 3_000);
        // Batches out of time before their walk is through (as behind thousands of dead letters
        // on a loaded machine), run as `retention::run` does: the ids pruned long ago are
        // forgotten all the same.
        let (mut forgotten, mut after) = (0, None);
        for _ in 0..1_000 {
            let done = run(&conn, &batch(10_000, Duration::ZERO, after));
            forgotten += done.forgotten;
            after = done.next;
            if forgotten == 50 {
                break;
            }
        }
        assert_eq!(forgotten, 50);
        let dead: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM events WHERE pruned_at IS NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(dead, 200, "dead letters are never pruned");
    }

    #[test]
    fn resolved_quarantine_is_deleted_within_the_budget() {
        let conn = db();
        let body = vec![1u8; 64 * 1024];
        for i in 0..20 {
            conn.execute(
                "INSERT INTO quarantine (source, received_at, headers, body, reason, resolved_at,
                                         resolution)
                 VALUES ('s', ?1, '[]', ?2, 'x', ?1, 'discarded by an operator')",
                params![1_000 + i, body],
            )
            .unwrap();
        }
        let first = run(&conn, &batch(2_000, Duration::ZERO, None));
        assert_eq!(first.quarantine, 1);
        assert!(first.cut_short && first.more(500));
        let rest = run(&conn, &batch(2_000, Duration::from_secs(60), None));
        assert_eq!(rest.quarantine, 19);
        assert!(!rest.more(500));
    }
}
