//! Leases in SQL: claim what is due, record how an attempt ended, take back what a vanished
//! worker held.
//!
//! Invariants:
//! - The head-of-key check is a `NOT EXISTS` read followed by the lease's update; it is
//!   race-free because SQLite has one writer and every claim runs on it.
//! - An attempt row and its delivery's next state are written in the one savepoint of the
//!   writer job.
//! - The lease token is `deliveries.attempts`: a finish whose attempt is not the running one's
//!   writes nothing.

use std::collections::HashSet;

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};

use super::{
    sql::{
        distinct_by_seeks, each_waiting_state, headers_from_json, once_done_states, open_states,
        waiting_states,
    },
    state::{apply_state, first_changed},
    walks,
};
use crate::{
    ids::{EventId, PluginName, SourceName},
    inbox::{
        ClaimRequest, Claimed, Finish, Finished, InboxError,
        lease::{PASSES, Staleness, stale_reason, window_size},
        state::Changed,
        store::{ClaimOutcome, Decide, Reclaimed},
    },
    model::Disposition,
};

/// Deliveries in an open state: the backlog, counted at open.
pub(super) fn count_open(conn: &Connection) -> Result<i64, InboxError> {
    Ok(conn.query_row(
        concat!(
            "SELECT COUNT(*) FROM deliveries WHERE state IN ",
            open_states!()
        ),
        [],
        |row| row.get(0),
    )?)
}

/// Appends `f` to the attempt history of `delivery`.
fn insert_attempt(conn: &Connection, delivery: i64, f: &Finish) -> Result<(), InboxError> {
    conn.prepare_cached(
        "INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome, error_kind,
                               error, plugin_sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        delivery,
        f.attempt,
        f.started_at_ms,
        f.finished_at_ms,
        f.outcome.as_str(),
        f.error_kind,
        f.error,
        f.plugin_sha256
    ])?;
    Ok(())
}

/// Records the attempts whose lease ends before `expired_before` as abandoned at `now_ms` and
/// moves each delivery where `decide(handler, budget_used)` says.
pub(super) fn take_back(
    conn: &Connection,
    now_ms: i64,
    expired_before: i64,
    decide: &Decide,
) -> Result<Reclaimed, InboxError> {
    let rows: Vec<(i64, String, u32, u32, Option<i64>)> = conn
        .prepare_cached(
            "SELECT id, handler, attempts, attempts - budget_base, leased_at
             FROM deliveries WHERE state = 'running' AND lease_until < ?1",
        )?
        .query_map([expired_before], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut abandoned = Vec::with_capacity(rows.len());
    for (id, handler, attempt, used, leased_at) in &rows {
        let disposition = decide(handler, *used);
        let finish = Finish::abandoned(*id, handler, *attempt, *leased_at, now_ms, disposition);
        finish_attempt(conn, &finish, 0)?; // abandoned: no state to stamp
        abandoned.push(finish);
    }
    Ok(Reclaimed::of(&abandoned))
}

/// A due delivery that may be leased: the head of its key, if it has one.
struct Candidate {
    id: i64,
    due_ms: i64,
    key: Option<String>,
    sequence: Option<i64>,
    source: String,
    /// Superseded by a done sequence of its key, and delivered all the same.
    stale: bool,
}

/// Leases what `request` may have now: each handler's oldest claimable deliveries, shared out
/// fairly among the free workers; counts the candidates it marked stale on the way.
pub(super) fn claim_due(
    conn: &Connection,
    request: &ClaimRequest,
) -> Result<ClaimOutcome, InboxError> {
    // Per handler, its oldest claimable deliveries, as many as it could be given; then the
    // free workers are shared out fairly among them.
    let handlers = request.wants();
    let mut stale = 0;
    let mut queues = Vec::with_capacity(handlers.len());
    let mut looks = Vec::with_capacity(handlers.len());
    for (handler, _, want) in &handlers {
        let (queue, looked) = if *want == 0 {
            (Vec::new(), Looked::Window)
        } else {
            let delivers = request.deliver_stale.contains(*handler);
            due_heads(conn, handler, delivers, request.now_ms, *want, &mut stale)?
        };
        queues.push(queue);
        looks.push(looked);
    }
    let due: Vec<Vec<i64>> = queues
        .iter()
        .map(|queue| queue.iter().map(|c| c.due_ms).collect())
        .collect();
    let mut claimed = Vec::new();
    // Per handler, its keyed candidates the share-out left waiting.
    let mut left: Vec<usize> = queues
        .iter()
        .map(|queue| queue.iter().filter(|c| c.key.is_some()).count())
        .collect();
    for (lane, nth) in request.share_out(&handlers, &due) {
        let candidate = &queues[lane][nth];
        claimed.push(lease(conn, request, handlers[lane].0, candidate)?);
        left[lane] -= usize::from(candidate.key.is_some());
    }
    // A look past the window that found, and leased, every head there was is remembered; one
    // that did not is forgotten, so the next one walks.
    for (lane, looked) in looks.into_iter().enumerate() {
        let handler = handlers[lane].0;
        match looked {
            Looked::Window => {}
            Looked::Past { since, complete } if complete && left[lane] == 0 => {
                walks::remember(conn, handler, request.now_ms, since)?
            }
            Looked::Past { .. } => walks::forget(conn, handler)?,
        }
    }
    Ok(ClaimOutcome {
        leased: claimed,
        stale,
    })
}

/// `p` is an open delivery of `d`'s key: same handler, source and ordering key, a range of
/// `deliveries_open_keys` (the state list is that index's own, so SQLite may read it).
macro_rules! open_of_key {
    () => {
        concat!(
            "p.handler = d.handler AND p.source = d.source AND p.ordering_key = d.ordering_key
             AND p.state IN ",
            open_states!()
        )
    };
}

/// Whether keyed delivery `d` heads its key: none of the key's open deliveries runs or comes
/// before it (by sequence, then arrival). Three seeks of `deliveries_open_keys`, however long
/// the key's queue.
macro_rules! heads_its_key {
    () => {
        concat!(
            "(NOT EXISTS (SELECT 1 FROM deliveries p INDEXED BY deliveries_open_keys WHERE ",
            open_of_key!(),
            " AND p.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM deliveries p INDEXED BY deliveries_open_keys WHERE ",
            open_of_key!(),
            " AND p.state IN ",
            waiting_states!(),
            " AND COALESCE(p.sequence, 0) < COALESCE(d.sequence, 0))
              AND NOT EXISTS (SELECT 1 FROM deliveries p INDEXED BY deliveries_open_keys WHERE ",
            open_of_key!(),
            " AND p.state IN ",
            waiting_states!(),
            " AND COALESCE(p.sequence, 0) = COALESCE(d.sequence, 0) AND p.id < d.id))"
        )
    };
}

/// One waiting state's deliveries of handler `?1` due at `?2`, with a key or without
/// (`$key`: `IS NOT NULL` or `IS NULL`), read as a range of `$index` in `(due, id)` order: a
/// candidate's columns, then `$columns`, of those that meet `$more` too.
macro_rules! due_in {
    ($state:literal, $index:literal, $key:literal, [$($columns:expr),*], [$($more:expr),*]) => {
        concat!(
            "SELECT d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source",
            $(", ", $columns,)*
            " FROM deliveries d INDEXED BY ", $index, "
             WHERE d.handler = ?1 AND d.state = '",
            $state,
            "' AND d.ordering_key ", $key, " AND d.next_attempt_at <= ?2"
            $(, $more)*
        )
    };
}

/// One waiting state's due keyed deliveries of handler `?1` at `?2`, in `(due, id)` order, each
/// with whether it heads its key: a range of `deliveries_keyed_due`.
macro_rules! keyed_due_in {
    ($state:literal) => {
        due_in!(
            $state,
            "deliveries_keyed_due",
            "IS NOT NULL",
            [heads_its_key!()],
            []
        )
    };
}

/// A claim's window over handler `?1`'s keyed deliveries due at `?2`: the earliest `?3`, each
/// with whether it heads its key. The waiting states' arms are merged in order (`UNION ALL …
/// ORDER BY`), so a claim reads this handler's rows only, and only as far as the window.
pub(super) const KEYED_DUE: &str =
    concat!(each_waiting_state!(keyed_due_in), " ORDER BY 2, 1 LIMIT ?3");

/// One waiting state's keyed deliveries of handler `?1` due at `?2` that came due after `?5`
/// and head their key, of those there by then (`id <= ?4`; later ones are read by id): a range
/// of `deliveries_keyed_due`.
macro_rules! keyed_due_since_in {
    ($state:literal) => {
        due_in!(
            $state,
            "deliveries_keyed_due",
            "IS NOT NULL",
            [],
            [
                " AND d.next_attempt_at > ?5 AND d.id <= ?4 AND ",
                heads_its_key!()
            ]
        )
    };
}

/// Handler `?1`'s keyed deliveries that may run at `?2` among those that can have come to head
/// their key since a complete walk ([`super::walks`]): arrived since it (`id > ?4`, a range of
/// the table itself, every handler's) or come due since it (after `?5`); the earliest `?3`.
/// What it reads grows with what arrived and came due since the record last moved on (at most
/// [`super::walks::WALK_AT_LEAST_EVERY_MS`] ago), not with the keys.
pub(super) const KEYED_SINCE: &str = concat!(
    each_waiting_state!(keyed_due_since_in),
    " UNION SELECT d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source
       FROM deliveries d NOT INDEXED
       WHERE d.id > ?4 AND d.handler = ?1 AND d.ordering_key IS NOT NULL
         AND d.state IN ",
    waiting_states!(),
    " AND d.next_attempt_at <= ?2 AND ",
    heads_its_key!(),
    " ORDER BY 2, 1 LIMIT ?3"
);

/// One waiting state's due deliveries without a key of handler `?1` at `?2`: a range of
/// `deliveries_unkeyed_due`.
macro_rules! unkeyed_due_in {
    ($state:literal) => {
        due_in!($state, "deliveries_unkeyed_due", "IS NULL", [], [])
    };
}

/// Handler `?1`'s earliest `?3` deliveries without a key due at `?2`: each heads itself, so
/// they are read apart from the keyed ones, never behind them.
pub(super) const UNKEYED_DUE: &str = concat!(
    each_waiting_state!(unkeyed_due_in),
    " ORDER BY 2, 1 LIMIT ?3"
);

/// The earliest delivery of key `k` in waiting state `$state` (by sequence, then arrival): one
/// seek of `deliveries_open_keys`.
macro_rules! first_of_key_in {
    ($state:literal) => {
        concat!(
            "(SELECT x.id FROM deliveries x INDEXED BY deliveries_open_keys
              WHERE x.handler = ?1 AND x.source = k.source AND x.ordering_key = k.ordering_key
                AND x.state IN ",
            open_states!(),
            " AND x.state = '",
            $state,
            "' ORDER BY COALESCE(x.sequence, 0), x.id LIMIT 1)"
        )
    };
}

/// `deliveries_open_keys` as handler `?1`'s walk reads it: open deliveries with a key, named
/// by that index's own condition.
macro_rules! open_keys_of_handler {
    () => {
        concat!(
            "FROM deliveries n INDEXED BY deliveries_open_keys
             WHERE n.handler = ?1 AND n.state IN ",
            open_states!(),
            " AND n.ordering_key IS NOT NULL"
        )
    };
}

/// Handler `?1`'s keyed deliveries that may run at `?2`, the earliest `?3`: the head of each key
/// with open deliveries, found by walking those keys (each the next value of the index,
/// read from it alone: its sources, then each source's keys), not the deliveries waiting
/// behind them. A key's head is its earliest waiting delivery, if none of its deliveries runs
/// and it is due.
pub(super) const KEY_HEADS: &str = concat!(
    "WITH RECURSIVE sources(source) AS (
         SELECT (SELECT MIN(n.source) ",
    open_keys_of_handler!(),
    ")
         UNION ALL
         SELECT (SELECT MIN(n.source) ",
    open_keys_of_handler!(),
    " AND n.source > s.source)
         FROM sources s WHERE s.source IS NOT NULL
     ),
     keys(source, ordering_key) AS (
         SELECT s.source, (SELECT MIN(n.ordering_key) ",
    open_keys_of_handler!(),
    " AND n.source = s.source)
         FROM sources s WHERE s.source IS NOT NULL
         UNION ALL
         SELECT k.source, (SELECT MIN(n.ordering_key) ",
    open_keys_of_handler!(),
    " AND n.source = k.source AND n.ordering_key > k.ordering_key)
         FROM keys k WHERE k.ordering_key IS NOT NULL
     ),
     heads(id) AS (
         SELECT CASE
                    WHEN r.id IS NULL THEN w.id
                    WHEN w.id IS NULL THEN r.id
                    WHEN (COALESCE(r.sequence, 0), r.id) < (COALESCE(w.sequence, 0), w.id)
                        THEN r.id
                    ELSE w.id
                END
         FROM keys k
              LEFT JOIN deliveries w ON w.id = ",
    first_of_key_in!("pending"),
    "
              LEFT JOIN deliveries r ON r.id = ",
    first_of_key_in!("retrying"),
    "
         WHERE k.ordering_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM deliveries x INDEXED BY deliveries_open_keys
                           WHERE x.handler = ?1 AND x.source = k.source
                             AND x.ordering_key = k.ordering_key AND x.state IN ",
    open_states!(),
    " AND x.state = 'running')
     )
     SELECT d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source
     FROM heads JOIN deliveries d ON d.id = heads.id
     WHERE d.next_attempt_at <= ?2
     ORDER BY d.next_attempt_at, d.id LIMIT ?3"
);

/// The newest `done` sequence of key `?3` (source `?1`, handler `?2`): the top of the key's
/// range of `deliveries_done_sequence`.
pub(super) const NEWEST_DONE: &str = "SELECT sequence FROM deliveries
     WHERE source = ?1 AND handler = ?2 AND ordering_key = ?3 AND state = 'done'
       AND sequence IS NOT NULL
     ORDER BY sequence DESC LIMIT 1";

/// The newest sequence of key `?3` (source `?1`, handler `?2`) among deliveries that were done
/// once and are not now: replayed, and waiting, retrying, dead or discarded since. Their event
/// was handled, so they still make older ones stale. Only a replay takes a delivery out of
/// `done`, and it gives it a `budget_base` (so does an attempt not counted): the key's range
/// of `deliveries_once_handled`, and a look at the attempts of each one there; the key's dead
/// letters that never ran to the end are passed over without one.
pub(super) const NEWEST_ONCE_DONE: &str = concat!(
    "SELECT MAX(d.sequence) FROM deliveries d INDEXED BY deliveries_once_handled
     WHERE d.source = ?1 AND d.handler = ?2 AND d.ordering_key = ?3 AND d.budget_base > 0
       AND d.state IN ",
    once_done_states!(),
    " AND d.sequence IS NOT NULL
       AND EXISTS (SELECT 1 FROM attempts a WHERE a.delivery = d.id AND a.outcome = 'ok')"
);

/// A candidate from the columns of a candidate read (id, due time, ordering key, sequence,
/// source).
fn candidate(r: &rusqlite::Row<'_>) -> rusqlite::Result<Candidate> {
    Ok(Candidate {
        id: r.get(0)?,
        due_ms: r.get(1)?,
        key: r.get(2)?,
        sequence: r.get(3)?,
        source: r.get(4)?,
        stale: false,
    })
}

/// How far a claim looked past its window at one handler's keyed deliveries.
#[derive(Clone, Copy, Debug)]
enum Looked {
    /// Not past it: the window held enough heads, or every due keyed delivery.
    Window,
    /// Past it, by walking the keys or (`since`) by reading what changed since a complete walk;
    /// `complete` if that found every head that may run (no more than wanted) and marked none
    /// stale.
    Past {
        since: Option<walks::Since>,
        complete: bool,
    },
}

/// Up to `want` of `handler`'s due deliveries that may run now, oldest first: per
/// `(source, ordering_key, handler)` only the earliest open one (by sequence, then arrival). One
/// older than a delivery already done for its key is marked `stale` on the way (counted in
/// `stale`) and skipped, unless the handler `delivers` stale events or a forced replay asked
/// for it.
///
/// Deliveries without a key are read apart (each may run). Of the keyed ones, the earliest due
/// are looked at first (a window a few times `want`); only when that window is full of
/// deliveries waiting behind their keys are the keys walked, so a claim costs about `want`
/// seeks when most due deliveries may run, and a few per key with open deliveries when most
/// wait (never one per waiting delivery). After a complete walk, what arrived or came due since
/// is read instead ([`walks`]), until something clears its record.
fn due_heads(
    conn: &Connection,
    handler: &str,
    delivers: bool,
    now_ms: i64,
    want: usize,
    stale: &mut usize,
) -> Result<(Vec<Candidate>, Looked), InboxError> {
    // Rows of `sql`, each with whether it heads its key (its sixth column if `checked`).
    let read =
        |sql: &str, checked: bool, limit: usize| -> Result<Vec<(Candidate, bool)>, InboxError> {
            Ok(conn
                .prepare_cached(sql)?
                .query_map(params![handler, now_ms, limit as i64], |r| {
                    Ok((candidate(r)?, !checked || r.get::<_, bool>(5)?))
                })?
                .collect::<Result<_, _>>()?)
        };
    let mut heads: Vec<Candidate> = read(UNKEYED_DUE, false, want)?
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let mut taken: HashSet<i64> = HashSet::new();
    let mut keyed = 0;
    let mut looked = Looked::Window;
    let mut since = walks::remembered(conn, handler, now_ms)?;
    for _ in 0..PASSES {
        let need = want - keyed;
        if need == 0 {
            break;
        }
        // Whether this pass read past the window and found every head there was.
        let mut complete = None;
        let found: Vec<Candidate> = if let Some(walk) = since.take() {
            // Only the first pass: one that marks a head stale clears the record.
            let rows: Vec<Candidate> = conn
                .prepare_cached(KEYED_SINCE)?
                .query_map(
                    params![
                        handler,
                        now_ms,
                        need as i64 + 1,
                        walk.newest_id,
                        walk.checked_at
                    ],
                    candidate,
                )?
                .collect::<Result<_, _>>()?;
            complete = Some(rows.len() <= need);
            looked = Looked::Past {
                since: Some(walk),
                complete: false,
            };
            rows
        } else {
            // Heads taken by an earlier pass are still waiting, so read again: look past them.
            let window = window_size(need) + taken.len();
            let rows = read(KEYED_DUE, true, window)?;
            let full = rows.len() == window;
            let mut found: Vec<Candidate> = rows
                .into_iter()
                .filter(|(c, head)| *head && !taken.contains(&c.id))
                .map(|(c, _)| c)
                .collect();
            if found.len() < need && full {
                let seen: HashSet<i64> = found.iter().map(|c| c.id).collect();
                let limit = need + taken.len();
                let more = read(KEY_HEADS, false, limit)?;
                complete = Some(more.len() < limit);
                looked = Looked::Past {
                    since: None,
                    complete: false,
                };
                found.extend(
                    more.into_iter()
                        .map(|(c, _)| c)
                        .filter(|c| !taken.contains(&c.id) && !seen.contains(&c.id)),
                );
                found.sort_by_key(|c| (c.due_ms, c.id));
            }
            found
        };
        let mut marked = false;
        for mut candidate in found {
            if keyed == want {
                break;
            }
            match staleness(conn, handler, delivers, &candidate, now_ms)? {
                Staleness::Fresh => {}
                Staleness::Skipped => {
                    *stale += 1;
                    marked = true;
                    continue;
                }
                Staleness::Deliver => candidate.stale = true,
            }
            taken.insert(candidate.id);
            heads.push(candidate);
            keyed += 1;
        }
        if let Looked::Past { complete: c, .. } = &mut looked {
            *c = complete == Some(true) && !marked;
        }
        if !marked {
            break;
        }
    }
    heads.sort_by_key(|c| (c.due_ms, c.id));
    heads.truncate(want);
    // A keyed head cut for earlier deliveries without a key was found and is not leased.
    if let Looked::Past { complete, .. } = &mut looked
        && heads.iter().filter(|c| c.key.is_some()).count() < keyed
    {
        *complete = false;
    }
    Ok((heads, looked))
}

/// Whether a later delivery of `candidate`'s key is already done, and if so whether it is
/// delivered all the same (`delivers`, or its forced replay) or marked `stale` here.
fn staleness(
    conn: &Connection,
    handler: &str,
    delivers: bool,
    candidate: &Candidate,
    now_ms: i64,
) -> Result<Staleness, InboxError> {
    let (Some(key), Some(sequence)) = (&candidate.key, candidate.sequence) else {
        return Ok(Staleness::Fresh);
    };
    let newest_done: Option<i64> = conn
        .prepare_cached(NEWEST_DONE)?
        .query_row(params![candidate.source, handler, key], |r| r.get(0))
        .optional()?;
    let once_done: Option<i64> = conn
        .prepare_cached(NEWEST_ONCE_DONE)?
        .query_row(params![candidate.source, handler, key], |r| r.get(0))?;
    let newest_done = newest_done.max(once_done);
    let Some(done) = crate::dispatch::policy::superseded_by(sequence, newest_done) else {
        return Ok(Staleness::Fresh);
    };
    let forced = || {
        conn.prepare_cached("SELECT deliver_stale FROM deliveries WHERE id = ?1")?
            .query_row([candidate.id], |r| r.get::<_, bool>(0))
    };
    if delivers || forced()? {
        return Ok(Staleness::Deliver);
    }
    conn.prepare_cached(
        "UPDATE deliveries SET state = 'stale', updated_at = ?2, last_error = ?3
         WHERE id = ?1",
    )?
    .execute(params![
        candidate.id,
        now_ms,
        stale_reason(sequence, done, key)
    ])?;
    Ok(Staleness::Skipped)
}

/// Leases `candidate` to a worker: the attempt is counted now.
fn lease(
    conn: &Connection,
    request: &ClaimRequest,
    handler: &str,
    candidate: &Candidate,
) -> Result<Claimed, InboxError> {
    let (attempt, budget_used, event) = conn
        .prepare_cached(
            "UPDATE deliveries SET state = 'running', attempts = attempts + 1,
                 lease_until = ?2, leased_at = ?3, updated_at = ?3
             WHERE id = ?1
             RETURNING attempts, attempts - budget_base, event",
        )?
        .query_row(
            params![candidate.id, request.lease_until(handler), request.now_ms],
            |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )?;
    let claim = conn
        .prepare_cached(
            "SELECT e.event_id, e.event_type, e.received_at, COALESCE(p.headers, e.headers),
                    COALESCE(p.body, e.body)
             FROM events e LEFT JOIN payloads p ON p.event = e.id WHERE e.id = ?1",
        )?
        .query_row([event], |r| {
            let headers: String = r.get(3)?;
            let body: Vec<u8> = r.get(4)?;
            Ok(Claimed {
                delivery_id: candidate.id,
                attempt,
                budget_used,
                leased_at_ms: request.now_ms,
                source: SourceName::new(candidate.source.as_str()),
                handler: PluginName::new(handler),
                event_id: EventId::new(r.get::<_, String>(0)?),
                event_type: r.get(1)?,
                ordering_key: candidate.key.clone(),
                sequence: candidate.sequence.map(|s| s as u64),
                stale: candidate.stale,
                received_at_ms: r.get(2)?,
                headers: headers_from_json(&headers),
                body: Bytes::from(body),
            })
        })?;
    Ok(claim)
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod claim_tests;

/// Records attempt `f` and moves its delivery on, if `f`'s lease is still the running one;
/// its state writes, if it commits any, are stamped `stamp` (see `state::apply_state`).
pub(super) fn finish_attempt(
    conn: &Connection,
    f: &Finish,
    stamp: i64,
) -> Result<Finished, InboxError> {
    let leased: Option<u32> = conn
        .prepare_cached("SELECT attempts FROM deliveries WHERE id = ?1 AND state = 'running'")?
        .query_row([f.delivery_id], |r| r.get(0))
        .optional()?;
    if leased != Some(f.attempt) {
        return Ok(Finished::LeaseLost);
    }
    if matches!(f.disposition, Disposition::Done { .. }) && !f.state.is_empty() {
        if let Some(Changed { key, seen, now }) =
            first_changed(conn, f.plugin.as_str(), &f.state.versions)?
        {
            let conflict = f.conflicted(&key, seen, now);
            insert_attempt(conn, f.delivery_id, &conflict)?;
            // Not counted against max_attempts: the budget is given back, not the attempt
            // number, which is the lease token and so never issued twice (a resend of this
            // record after its answer was lost must find the next lease another's).
            conn.prepare_cached(
                "UPDATE deliveries SET state = 'pending', budget_base = budget_base + 1,
                     next_attempt_at = ?2, lease_until = NULL, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![f.delivery_id, f.finished_at_ms])?;
            return Ok(Finished::Conflict);
        }
        if !f.state.writes.is_empty()
            && let Err(message) =
                apply_state(conn, f.plugin.as_str(), &f.state, f.finished_at_ms, stamp)?
        {
            return Ok(Finished::OverQuota(message));
        }
    }
    let (state, output, next_at) = f.next_state();
    let last_error = f.last_error();
    conn.prepare_cached(
        "UPDATE deliveries SET state = ?2, output = COALESCE(?3, output), last_error = ?4,
             next_attempt_at = ?5, lease_until = NULL, updated_at = ?6,
             budget_base = budget_base + ?7
         WHERE id = ?1",
    )?
    .execute(params![
        f.delivery_id,
        state.as_str(),
        output,
        last_error,
        next_at,
        f.finished_at_ms,
        i64::from(f.uncounted),
    ])?;
    insert_attempt(conn, f.delivery_id, f)?;
    Ok(Finished::Recorded)
}

/// The earliest `next_attempt_at` of a delivery in `$state` that is `$bound ?1`, per handler
/// of the walk over the deliveries with a key (`keyed`) or without one (`unkeyed`): one seek
/// of that walk's index, `deliveries_keyed_due` or `deliveries_unkeyed_due`.
macro_rules! earliest_of_handler {
    (keyed, $state:literal, $bound:literal) => {
        earliest_of_handler!(@ "keyed", "ordering_key IS NOT NULL", $state, $bound)
    };
    (unkeyed, $state:literal, $bound:literal) => {
        earliest_of_handler!(@ "unkeyed", "ordering_key IS NULL", $state, $bound)
    };
    (@ $walk:literal, $filter:literal, $state:literal, $bound:literal) => {
        concat!(
            "SELECT (SELECT MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_",
            $walk,
            "_due WHERE handler = h.handler AND ",
            $filter,
            " AND state = '",
            $state,
            "' AND next_attempt_at ",
            $bound,
            " ?1) AS due
             FROM ",
            $walk,
            " h WHERE h.handler IS NOT NULL"
        )
    };
}
macro_rules! keyed_by {
    ($state:literal) => {
        earliest_of_handler!(keyed, $state, "<=")
    };
}
macro_rules! unkeyed_by {
    ($state:literal) => {
        earliest_of_handler!(unkeyed, $state, "<=")
    };
}
macro_rules! keyed_after {
    ($state:literal) => {
        earliest_of_handler!(keyed, $state, ">")
    };
}
macro_rules! unkeyed_after {
    ($state:literal) => {
        earliest_of_handler!(unkeyed, $state, ">")
    };
}

/// The earliest waiting delivery whose due time the arms pick (`keyed_by` and `unkeyed_by`, or
/// `keyed_after` and `unkeyed_after`): per handler, due index and waiting state, one seek (the
/// handlers with deliveries with a key, and without one, found by a skip scan of each index).
macro_rules! earliest_waiting {
    ($keyed:ident, $unkeyed:ident) => {
        concat!(
            "WITH RECURSIVE ",
            distinct_by_seeks!(
                "keyed",
                "handler",
                "deliveries INDEXED BY deliveries_keyed_due",
                " WHERE ordering_key IS NOT NULL",
                "ordering_key IS NOT NULL AND "
            ),
            ", ",
            distinct_by_seeks!(
                "unkeyed",
                "handler",
                "deliveries INDEXED BY deliveries_unkeyed_due",
                " WHERE ordering_key IS NULL",
                "ordering_key IS NULL AND "
            ),
            " SELECT MIN(due) FROM (",
            each_waiting_state!($keyed),
            " UNION ALL ",
            each_waiting_state!($unkeyed),
            ")"
        )
    };
}

/// The earliest waiting delivery due by `?1`. No index on `(state, next_attempt_at)` is kept
/// for it: every change of every delivery's state would rewrite its entry there, for a read
/// made a few times a second.
pub(super) const OLDEST_DUE: &str = earliest_waiting!(keyed_by, unkeyed_by);

/// The earliest waiting delivery due after `?1`, as [`OLDEST_DUE`].
pub(super) const NEXT_DUE_AFTER: &str = earliest_waiting!(keyed_after, unkeyed_after);

/// When the waiting delivery due longest ago became due, if one is due at `now_ms` (one
/// waiting behind its ordering key's head counts: its event is not handled yet either).
pub(super) fn oldest_due(conn: &Connection, now_ms: i64) -> Result<Option<i64>, InboxError> {
    Ok(conn
        .prepare_cached(OLDEST_DUE)?
        .query_row([now_ms], |row| row.get(0))?)
}

/// The earliest `next_attempt_at` after `after_ms` of a pending or retrying delivery.
pub(super) fn next_due_after(conn: &Connection, after_ms: i64) -> Result<Option<i64>, InboxError> {
    Ok(conn
        .prepare_cached(NEXT_DUE_AFTER)?
        .query_row([after_ms], |row| row.get(0))?)
}
