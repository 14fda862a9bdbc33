//! Leases in SQL: claim what is due, record how an attempt ended, take back what a vanished
//! worker held, with other nodes doing the same at the same time.
//!
//! Invariants:
//! - A claim locks the candidates it reads (`FOR UPDATE SKIP LOCKED`), so two nodes never
//!   lease one delivery; the head-of-key check reads every open delivery of the key, so a key
//!   whose head another node is leasing stays blocked; and should two heads of one key still
//!   be leased at once, the unique index on running keys refuses the second (its claim leaves
//!   that delivery for later: not claimable now, not an error). A claim leases its picks in one
//!   statement, and one by one only when the index refused that statement.
//! - A finish re-checks its lease (`state = 'running' AND attempts = token`) under the
//!   delivery's row lock, so a reclaim and a late result never both win; its attempt row and
//!   the delivery's next state are one transaction.
//! - A claim of a plugin with a `max_concurrency` leases no more than the cap less its
//!   deliveries running on any node, counted under one transaction lock all such claims take
//!   (`within_caps`), so two nodes never both fill its last slot.
//! - A reclaim skips the leases another transaction holds (a finish in progress).
//! - A finish that commits notifies the other nodes as it commits (a key it ran may have its
//!   next delivery due now).

use std::{
    collections::{HashMap, HashSet},
    sync::LazyLock,
    time::Instant,
};

use bytes::Bytes;
use tokio_postgres::types::ToSql;

use super::{
    Connections,
    batch::{self, Reply, Weigh},
    distinct_by_probes,
    error::is_unique_violation,
    state,
    statements::{Conn, Run, Tx},
    wakeup,
};
use crate::{
    ids::{EventId, PluginName, SourceName},
    inbox::{
        ClaimRequest, Claimed, Commits, Finish, Finished, InboxError,
        lease::{PASSES, Staleness, stale_reason, window_size},
        request::headers_from_json,
        state::Changed,
        store::{ClaimOutcome, Decide, Reclaimed},
    },
    model::{DeliveryState, Disposition},
};

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
/// fairly among the free workers; counts the candidates it marked stale on the way. With it,
/// the id of the transaction that leased them (`None` when nothing was leased), to learn
/// whether it committed should its `COMMIT`'s answer be lost ([`committed`]).
pub(super) async fn claim_due(
    tx: &Tx<'_>,
    request: &ClaimRequest,
) -> Result<(ClaimOutcome, Option<i64>), InboxError> {
    let mut handlers = request.wants();
    within_caps(tx, request, &mut handlers).await?;
    let mut stale = 0;
    // The transaction's set-up travels with its first statement (the first but for a capped
    // plugin's count): one round trip for both.
    let ((), mut first) = tokio::try_join!(
        super::generic_plans(tx),
        first_windows(tx, &handlers, request.now_ms)
    )?;
    let mut queues = Vec::with_capacity(handlers.len());
    for ((handler, _, want), window) in handlers.iter().zip(first.iter_mut()) {
        let queue = if *want == 0 {
            Vec::new()
        } else {
            let delivers = request.deliver_stale.contains(*handler);
            let window = std::mem::take(window);
            due_heads(
                tx,
                handler,
                delivers,
                request.now_ms,
                *want,
                window,
                &mut stale,
            )
            .await?
        };
        queues.push(queue);
    }
    let due: Vec<Vec<i64>> = queues
        .iter()
        .map(|queue| queue.iter().map(|c| c.due_ms).collect())
        .collect();
    // All the picks are leased in one statement; should the database refuse a keyed one
    // (another delivery of its key was leased at the same moment), each is leased on its own,
    // so the refusal costs that delivery alone.
    let picks: Vec<(&str, &Candidate)> = request
        .share_out(&handlers, &due)
        .into_iter()
        .map(|(lane, nth)| (handlers[lane].0, &queues[lane][nth]))
        .collect();
    let mut transaction = None;
    let leased = match lease_together(tx, request, &picks).await? {
        Some((mut together, xid)) => {
            transaction = xid;
            picks
                .iter()
                .filter_map(|(_, candidate)| together.remove(&candidate.id))
                .collect()
        }
        None => {
            let mut leased = Vec::new();
            for pick in &picks {
                if let Some((mut one, xid)) = lease_together(tx, request, &[*pick]).await? {
                    transaction = transaction.or(xid);
                    leased.extend(one.remove(&pick.1.id));
                }
            }
            leased
        }
    };
    Ok((ClaimOutcome { leased, stale }, transaction))
}

/// The advisory lock claims of plugins with a `max_concurrency` take (a constant of its own:
/// the migrations' is `…0001`, retention's `…0002`).
const CAP_LOCK: i64 = 0x686f_6f6b_6400_0003;

/// Holds each of `handlers` with a `max_concurrency` to it across the nodes: under one
/// transaction lock (one, so two claims never wait for each other's), its room becomes at most
/// the cap less its deliveries running on any node (leases of a node that died count until
/// they expire). Claims of capped plugins so take turns until their commits; the rest never
/// wait.
async fn within_caps(
    tx: &Tx<'_>,
    request: &ClaimRequest,
    handlers: &mut [(&str, usize, usize)],
) -> Result<(), InboxError> {
    let capped: Vec<&str> = handlers
        .iter()
        .filter(|(handler, _, want)| *want > 0 && request.caps.contains_key(*handler))
        .map(|(handler, _, _)| *handler)
        .collect();
    if capped.is_empty() {
        return Ok(());
    }
    // Two statements: at `READ COMMITTED` the count's snapshot is taken when it starts, so
    // after the lock, and sees what the claim that held it committed.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CAP_LOCK])
        .await?;
    let running: HashMap<String, i64> = tx
        .query(
            "SELECT handler, count(*) FROM deliveries
              WHERE state = 'running' AND handler = ANY($1) GROUP BY handler",
            &[&capped],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for (handler, room, want) in handlers.iter_mut() {
        let Some(cap) = request.caps.get(*handler) else {
            continue;
        };
        let running = running.get(*handler).copied().unwrap_or(0);
        let left = cap.saturating_sub(usize::try_from(running).unwrap_or(usize::MAX));
        *room = (*room).min(left);
        *want = (*want).min(left);
    }
    Ok(())
}

/// How long a claim whose `COMMIT` went unanswered (the connection lost as it was sent) asks
/// the database whether it committed: well within the leases' margin.
const COMMITTED_ASKED_FOR: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether transaction `xid`, whose `COMMIT` was sent but not answered, committed: asked on a
/// connection of its own (`txid_status`), again while the database is away or the transaction
/// still in progress, for at most [`COMMITTED_ASKED_FOR`]. `false` when that could not be
/// learnt: the caller then treats the claim as failed (its leases, if it did commit, expire and
/// are taken back, as any lost worker's).
pub(super) async fn committed(connections: &super::Connections, xid: i64) -> bool {
    let deadline = tokio::time::Instant::now() + COMMITTED_ASKED_FOR;
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        // Each ask within the deadline too: a pool or a server that does not answer would
        // otherwise hold it for as long as its connection waits, eating into the leases.
        let status = tokio::time::timeout_at(deadline, async {
            let connection = connections.get().await?;
            let row = connection
                .query_one("SELECT txid_status($1)", &[&xid])
                .await?;
            Ok::<Option<String>, InboxError>(row.get(0))
        })
        .await;
        match status
            .as_ref()
            .map(|asked| asked.as_ref().map(Option::as_deref))
        {
            Err(_elapsed) => return false,
            Ok(Ok(Some("committed"))) => return true,
            Ok(Ok(Some("aborted") | None)) => return false,
            _ if tokio::time::Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            _ => return false,
        }
    }
}

/// Leases `picks` (handler, candidate) in one statement; by delivery id, with the id of the
/// transaction that leased them (`None`: none leased). `None`, with nothing leased, when the
/// unique index on running keys refused one of them.
async fn lease_together(
    tx: &Tx<'_>,
    request: &ClaimRequest,
    picks: &[(&str, &Candidate)],
) -> Result<Option<(HashMap<i64, Claimed>, Option<i64>)>, InboxError> {
    if picks.is_empty() {
        return Ok(Some((HashMap::new(), None)));
    }
    // Only a keyed delivery can meet the unique index; its refusal must undo this statement
    // alone, not the claim's transaction. The savepoint is sent with the statement (one round
    // trip), and left to the `COMMIT` to release.
    let keyed = picks.iter().any(|(_, candidate)| candidate.key.is_some());
    let ids: Vec<i64> = picks.iter().map(|(_, c)| c.id).collect();
    let until: Vec<i64> = picks.iter().map(|(h, _)| request.lease_until(h)).collect();
    let params: [&(dyn ToSql + Sync); 3] = [&ids, &until, &request.now_ms];
    // A lease runs from when the database grants it: a claim whose transaction waited over a
    // second (for a lock, a slow server) has each lease moved on by the wait, as the
    // database's clock measures it from the transaction's start. Before, a claim that waited
    // longer than the lease granted leases already over, which another node took back at once
    // while the handler ran. (A shorter wait is within the lease's margin, and left alone.)
    let lease = tx.query(
        "UPDATE deliveries d SET state = 'running', attempts = d.attempts + 1,
             lease_until = u.until + CASE
                 WHEN clock_timestamp() - transaction_timestamp() > interval '1 second'
                 THEN (extract(epoch FROM clock_timestamp() - transaction_timestamp()) * 1000)::int8
                 ELSE 0 END,
             leased_at = $3, updated_at = $3
         FROM events e, unnest($1::bigint[], $2::bigint[]) AS u (id, until)
         WHERE d.id = u.id AND e.id = d.event
         RETURNING d.id, d.attempts, d.attempts - d.budget_base, e.event_id,
                   e.event_type, e.received_at, e.headers, e.body, txid_current()",
        &params,
    );
    let rows = if keyed {
        let (saved, rows) = tokio::join!(tx.batch_execute("SAVEPOINT lease_together"), lease);
        saved?;
        rows
    } else {
        lease.await
    };
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) if keyed && is_unique_violation(&e) => {
            tx.batch_execute(
                "ROLLBACK TO SAVEPOINT lease_together; RELEASE SAVEPOINT lease_together",
            )
            .await?;
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let picked: HashMap<i64, (&str, &Candidate)> =
        picks.iter().map(|&(h, c)| (c.id, (h, c))).collect();
    // The statement wrote, so its transaction has an id already: no cost to ask it.
    let xid = rows.first().map(|row| row.get::<_, i64>(8));
    let leased = rows
        .iter()
        .map(|row| {
            let id: i64 = row.get(0);
            let (handler, candidate) = picked[&id];
            let claim = claimed(row, request, handler, candidate);
            (id, claim)
        })
        .collect();
    Ok(Some((leased, xid)))
}

/// The newest sequence of key `$3` (source `$1`, handler `$2`) handled: `done` now, or done
/// once and in another state since (`DeliveryState::ONCE_DONE`: replayed, then waiting,
/// retrying, dead or discarded again), whose event was handled all the same. A test holds the
/// state list to that constant. Only a replay takes a delivery out of `done`, and it sets
/// `budget_base` to its attempts (at least one), so the second part reads only deliveries with
/// a `budget_base` (those replayed, and those with an attempt not counted: a state conflict's
/// re-run, one given back): a range of `deliveries_once_handled` (migration 12), not every
/// delivery of the key.
pub(super) const NEWEST_HANDLED: &str = "SELECT GREATEST(
     (SELECT MAX(sequence) FROM deliveries
      WHERE source = $1 AND handler = $2 AND ordering_key = $3 AND state = 'done'),
     (SELECT MAX(d.sequence) FROM deliveries d
      WHERE d.source = $1 AND d.handler = $2 AND d.ordering_key = $3 AND d.budget_base > 0
        AND d.state IN ('pending', 'running', 'retrying', 'dead', 'discarded')
        AND EXISTS (SELECT 1 FROM attempts a
                    WHERE a.delivery = d.id AND a.outcome = 'ok')))";

#[cfg(test)]
#[test]
fn the_newest_handled_state_list_is_delivery_state_once_done() {
    let quoted: Vec<String> = crate::model::DeliveryState::ONCE_DONE
        .iter()
        .map(|s| format!("'{s}'"))
        .collect();
    let list = format!("d.state IN ({})", quoted.join(", "));
    assert!(NEWEST_HANDLED.contains(&list), "{NEWEST_HANDLED}");
}

/// The `IN` list of `states` as SQL, so the planner can match the partial indexes' predicates.
fn sql_states(states: &[DeliveryState]) -> String {
    let names: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(", "))
}

/// Whether delivery `d` may run now: it has no key, or it is the earliest open delivery of its
/// key (by sequence, then arrival) and no delivery of its key runs.
fn head_sql() -> String {
    format!(
        "(d.ordering_key IS NULL OR (
            NOT EXISTS (SELECT 1 FROM deliveries p
                        WHERE p.handler = d.handler AND p.source = d.source
                          AND p.ordering_key = d.ordering_key AND p.state IN {open}
                          AND (COALESCE(p.sequence, 0), p.id) < (COALESCE(d.sequence, 0), d.id))
            AND NOT EXISTS (SELECT 1 FROM deliveries r
                            WHERE r.source = d.source AND r.handler = d.handler
                              AND r.ordering_key = d.ordering_key
                              AND r.ordering_key IS NOT NULL AND r.state = 'running')))",
        open = sql_states(&DeliveryState::OPEN),
    )
}

/// Windows of due deliveries: per handler `$1[i]` its earliest `$3[i]` due deliveries at `$2`
/// not in `$4`, tagged with `i` (from 1), each with whether it may run now. A claim's first
/// pass reads every handler's window in this one statement, whatever the number of handlers
/// (and of plugins with nothing waiting, such as parsers); a later pass, one handler's.
pub(super) static WINDOWS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT h.n, d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source, {head}
         FROM unnest($1::text[], $3::bigint[]) WITH ORDINALITY AS h (handler, size, n)
         CROSS JOIN LATERAL (
             SELECT id, handler, next_attempt_at, ordering_key, sequence, source
             FROM deliveries
             WHERE handler = h.handler AND state IN {waiting} AND next_attempt_at <= $2
               AND NOT (id = ANY($4))
             ORDER BY next_attempt_at, id LIMIT h.size) d
         ORDER BY h.n, d.next_attempt_at, d.id",
        head = head_sql(),
        waiting = sql_states(&DeliveryState::WAITING),
    )
});

/// A window of one handler's due deliveries: those that may run now, and how many were read.
#[derive(Default)]
struct Window {
    found: Vec<Candidate>,
    read: usize,
}

/// The window a claim's first pass looks at (see [`due_heads`]) for each handler that wants
/// deliveries, read in one statement; by handler, in `handlers`' order (empty where none is
/// wanted).
async fn first_windows(
    tx: &Tx<'_>,
    handlers: &[(&str, usize, usize)],
    now_ms: i64,
) -> Result<Vec<Window>, InboxError> {
    let wanted: Vec<(&str, usize)> = handlers
        .iter()
        .map(|&(handler, _, want)| (handler, if want > 0 { window_size(want) } else { 0 }))
        .collect();
    windows(tx, &wanted, now_ms, &[]).await
}

/// Per `(handler, size)` of `wanted`, in order, its window of up to `size` deliveries due at
/// `now_ms` and not in `taken` ([`WINDOWS_SQL`]); no round trip when every size is 0.
async fn windows(
    tx: &Tx<'_>,
    wanted: &[(&str, usize)],
    now_ms: i64,
    taken: &[i64],
) -> Result<Vec<Window>, InboxError> {
    let mut windows: Vec<Window> = wanted.iter().map(|_| Window::default()).collect();
    let (mut names, mut sizes, mut lanes) = (Vec::new(), Vec::new(), Vec::new());
    for (lane, &(handler, size)) in wanted.iter().enumerate() {
        if size > 0 {
            names.push(handler);
            sizes.push(size as i64);
            lanes.push(lane);
        }
    }
    if names.is_empty() {
        return Ok(windows);
    }
    let rows = tx
        .query(&WINDOWS_SQL, &[&names, &now_ms, &sizes, &taken])
        .await?;
    for row in rows {
        let window = &mut windows[lanes[(row.get::<_, i64>(0) - 1) as usize]];
        window.read += 1;
        if row.get::<_, bool>(6) {
            window.found.push(candidate(&row, 1));
        }
    }
    Ok(windows)
}

/// Handler `$1`'s deliveries that may run at `$2`, not in `$4`, the earliest `$3`: those
/// without a key, and the head of each key with open deliveries, found by walking the keys (one
/// index probe each) instead of the deliveries waiting behind them.
static KEY_HEADS_SQL: LazyLock<String> = LazyLock::new(|| {
    let open = sql_states(&DeliveryState::OPEN);
    let waiting = sql_states(&DeliveryState::WAITING);
    format!(
        "WITH RECURSIVE heads AS (
             (SELECT source, ordering_key, id FROM deliveries
              WHERE handler = $1 AND state IN {open} AND ordering_key IS NOT NULL
              ORDER BY source, ordering_key, COALESCE(sequence, 0), id LIMIT 1)
             UNION ALL
             SELECT n.* FROM heads h, LATERAL (
                 SELECT source, ordering_key, id FROM deliveries
                 WHERE handler = $1 AND state IN {open} AND ordering_key IS NOT NULL
                   AND (source, ordering_key) > (h.source, h.ordering_key)
                 ORDER BY source, ordering_key, COALESCE(sequence, 0), id LIMIT 1) n
         ),
         unkeyed AS (
             SELECT id FROM deliveries
             WHERE handler = $1 AND state IN {waiting} AND ordering_key IS NULL
               AND next_attempt_at <= $2 AND NOT (id = ANY($4))
             ORDER BY next_attempt_at, id LIMIT $3
         )
         SELECT d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source, {head}
         FROM deliveries d
         WHERE d.id IN (SELECT id FROM heads UNION ALL SELECT id FROM unkeyed)
           AND d.state IN {waiting} AND d.next_attempt_at <= $2 AND NOT (d.id = ANY($4))
         ORDER BY d.next_attempt_at, d.id LIMIT $3",
        head = head_sql(),
    )
});

/// Locks the first `$3` of `$1` (in its order) still due at `$2` that no other transaction has
/// locked.
///
/// The rows are found by primary key whatever the statistics say: the state and due checks are
/// wrapped in `IS TRUE` and the order is the array's, so no index on `state` or
/// `next_attempt_at` can serve them. Written plainly, a plan cached while the statistics said
/// nothing waits walked every waiting delivery's index entry per claim (~10 000 rows for 10
/// candidates, measured).
pub(super) static LOCK_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id FROM deliveries
         WHERE id = ANY($1) AND (state IN {waiting} AND next_attempt_at <= $2) IS TRUE
         ORDER BY array_position($1, id) LIMIT $3
         FOR UPDATE SKIP LOCKED",
        waiting = sql_states(&DeliveryState::WAITING),
    )
});

/// [`KEY_HEADS_SQL`]'s rows that may run now.
async fn key_heads(
    tx: &Tx<'_>,
    handler: &str,
    now_ms: i64,
    limit: usize,
    taken: &[i64],
) -> Result<Vec<Candidate>, InboxError> {
    let rows = tx
        .query(
            &KEY_HEADS_SQL,
            &[&handler, &now_ms, &(limit as i64), &taken],
        )
        .await?;
    Ok(rows
        .iter()
        .filter(|row| row.get::<_, bool>(5))
        .map(|row| candidate(row, 0))
        .collect())
}

/// The candidate in a candidate read's row, from column `first` on: id, due time, ordering
/// key, sequence, source.
fn candidate(row: &tokio_postgres::Row, first: usize) -> Candidate {
    Candidate {
        id: row.get(first),
        due_ms: row.get(first + 1),
        key: row.get(first + 2),
        sequence: row.get(first + 3),
        source: row.get(first + 4),
        stale: false,
    }
}

/// Up to `want` of `handler`'s due deliveries that may run now, oldest first, locked: per
/// `(source, ordering_key, handler)` only the earliest open one (by sequence, then arrival). One
/// older than a delivery already done for its key is marked `stale` on the way (counted in
/// `stale`) and skipped, unless the handler `delivers` stale events or a forced replay asked
/// for it. Deliveries another transaction has locked are passed over.
///
/// The earliest due deliveries are looked at first (a window a few times `want`); only when
/// that window is full of deliveries waiting behind their keys are the keys walked, so a claim
/// costs about `want` index probes when most due deliveries may run, and one per key when most
/// wait (never one per waiting delivery).
async fn due_heads(
    tx: &Tx<'_>,
    handler: &str,
    delivers: bool,
    now_ms: i64,
    want: usize,
    first: Window,
    stale: &mut usize,
) -> Result<Vec<Candidate>, InboxError> {
    let mut heads: Vec<Candidate> = Vec::new();
    let mut taken: Vec<i64> = Vec::new();
    let mut first = Some(first);
    for _ in 0..PASSES {
        let need = want - heads.len();
        if need == 0 {
            break;
        }
        let window = window_size(need);
        // The first pass's window was read with every handler's ([`first_windows`]).
        let (mut found, read) = match first.take() {
            Some(Window { found, read }) => (found, read),
            None => {
                let Window { found, read } = windows(tx, &[(handler, window)], now_ms, &taken)
                    .await?
                    .remove(0);
                (found, read)
            }
        };
        if found.len() < need && read == window {
            let seen: Vec<i64> = taken
                .iter()
                .chain(found.iter().map(|c| &c.id))
                .copied()
                .collect();
            let more = key_heads(tx, handler, now_ms, need, &seen).await?;
            found.extend(more);
            found.sort_by_key(|c| (c.due_ms, c.id));
        }
        if found.is_empty() {
            break; // nothing to lock: no round trip for it
        }
        let ids: Vec<i64> = found.iter().map(|c| c.id).collect();
        let locked: HashSet<i64> = tx
            .query(&LOCK_SQL, &[&ids, &now_ms, &(need as i64)])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let mut marked = false;
        for mut candidate in found.into_iter().filter(|c| locked.contains(&c.id)) {
            if heads.len() == want {
                break;
            }
            match staleness(tx, handler, delivers, &candidate, now_ms).await? {
                Staleness::Fresh => {}
                Staleness::Skipped => {
                    *stale += 1;
                    marked = true;
                    continue;
                }
                Staleness::Deliver => candidate.stale = true,
            }
            taken.push(candidate.id);
            heads.push(candidate);
        }
        if !marked {
            break;
        }
    }
    Ok(heads)
}

/// Whether a later delivery of `candidate`'s key (locked by this transaction) is already
/// done, and if so whether it is delivered all the same (`delivers`, or its forced replay) or
/// marked `stale` here.
async fn staleness(
    tx: &Tx<'_>,
    handler: &str,
    delivers: bool,
    candidate: &Candidate,
    now_ms: i64,
) -> Result<Staleness, InboxError> {
    let (Some(key), Some(sequence)) = (&candidate.key, candidate.sequence) else {
        return Ok(Staleness::Fresh);
    };
    // The newest sequence handled: `done` now, or done once and replayed since (waiting,
    // retrying, dead or discarded again), whose event was handled all the same.
    let newest_done: Option<i64> = tx
        .query_one(NEWEST_HANDLED, &[&candidate.source, &handler, key])
        .await?
        .get(0);
    let Some(done) = crate::dispatch::policy::superseded_by(sequence, newest_done) else {
        return Ok(Staleness::Fresh);
    };
    let forced = delivers
        || tx
            .query_one(
                "SELECT deliver_stale FROM deliveries WHERE id = $1",
                &[&candidate.id],
            )
            .await?
            .get::<_, bool>(0);
    if forced {
        return Ok(Staleness::Deliver);
    }
    tx.execute(
        "UPDATE deliveries SET state = 'stale', updated_at = $2, last_error = $3 WHERE id = $1",
        &[&candidate.id, &now_ms, &stale_reason(sequence, done, key)],
    )
    .await?;
    Ok(Staleness::Skipped)
}

/// The lease of `candidate` to `handler`, from a row returning, after the delivery's id, its
/// attempts, its budget used, and the event's id, type, arrival, headers and body.
fn claimed(
    row: &tokio_postgres::Row,
    request: &ClaimRequest,
    handler: &str,
    candidate: &Candidate,
) -> Claimed {
    let headers: String = row.get(6);
    Claimed {
        delivery_id: candidate.id,
        attempt: token(row.get(1)),
        budget_used: token(row.get(2)),
        leased_at_ms: request.now_ms,
        source: SourceName::new(candidate.source.as_str()),
        handler: PluginName::new(handler),
        event_id: EventId::new(row.get::<_, String>(3)),
        event_type: row.get(4),
        ordering_key: candidate.key.clone(),
        sequence: candidate.sequence.map(|s| s as u64),
        stale: candidate.stale,
        received_at_ms: row.get(5),
        headers: headers_from_json(&headers),
        body: Bytes::from(row.get::<_, Vec<u8>>(7)),
    }
}

/// An attempt count as stored (`BIGINT`) as the contract counts it.
fn token(stored: i64) -> u32 {
    u32::try_from(stored).unwrap_or(u32::MAX)
}

/// Appends `f` to the attempt history of its delivery.
async fn insert_attempt(tx: &Tx<'_>, f: &Finish) -> Result<(), InboxError> {
    tx.execute(
        "INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome, error_kind,
                               error, plugin_sha256)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &f.delivery_id,
            &i64::from(f.attempt),
            &f.started_at_ms,
            &f.finished_at_ms,
            &f.outcome.as_str(),
            &f.error_kind,
            &f.error,
            &f.plugin_sha256,
        ],
    )
    .await?;
    Ok(())
}

/// Records attempt `f` and moves its delivery on, if `f`'s lease is still the running one.
/// [`Finished::OverQuota`] has written nothing the caller should keep: it rolls back.
pub(super) async fn finish_attempt(tx: &Tx<'_>, f: &Finish) -> Result<Finished, InboxError> {
    let leased: Option<i64> = tx
        .query_opt(
            "SELECT attempts FROM deliveries WHERE id = $1 AND state = 'running' FOR UPDATE",
            &[&f.delivery_id],
        )
        .await?
        .map(|row| row.get(0));
    if leased != Some(i64::from(f.attempt)) {
        return Ok(Finished::LeaseLost);
    }
    let mut usage_delta = None;
    if matches!(f.disposition, Disposition::Done { .. }) && !f.state.is_empty() {
        // The keys it read or writes are locked first: a concurrent writer's commit is then
        // visible to the version check below, whichever node made it.
        let keys = f
            .state
            .versions
            .keys()
            .chain(f.state.writes.keys())
            .map(String::as_str)
            .collect();
        state::lock_keys(tx, f.plugin.as_str(), keys).await?;
        if let Some(Changed { key, seen, now }) =
            state::first_changed(tx, f.plugin.as_str(), &f.state.versions).await?
        {
            insert_attempt(tx, &f.conflicted(&key, seen, now)).await?;
            // Not counted against max_attempts: the budget is given back, not the attempt
            // number, which is the lease token and so never issued twice (a resend of this
            // record after its answer was lost must find the next lease another's).
            tx.execute(
                "UPDATE deliveries SET state = 'pending', budget_base = budget_base + 1,
                     next_attempt_at = $2, lease_until = NULL, updated_at = $2
                 WHERE id = $1",
                &[&f.delivery_id, &f.finished_at_ms],
            )
            .await?;
            return Ok(Finished::Conflict);
        }
        if !f.state.writes.is_empty() {
            let (delta, _) =
                state::apply_state(tx, f.plugin.as_str(), &f.state, f.finished_at_ms).await?;
            usage_delta = Some(delta);
        }
    }
    let (state, output, next_at) = f.next_state();
    tx.execute(
        "UPDATE deliveries SET state = $2, output = COALESCE($3, output), last_error = $4,
             next_attempt_at = $5, lease_until = NULL, updated_at = $6,
             budget_base = budget_base + $7
         WHERE id = $1",
        &[
            &f.delivery_id,
            &state.as_str(),
            &output,
            &f.last_error(),
            &next_at,
            &f.finished_at_ms,
            &i64::from(f.uncounted),
        ],
    )
    .await?;
    insert_attempt(tx, f).await?;
    if let Some(delta) = usage_delta
        && let Err(message) =
            state::add_usage(tx, f.plugin.as_str(), &f.state.limits, delta).await?
    {
        return Ok(Finished::OverQuota(message));
    }
    Ok(Finished::Recorded)
}

/// Whether `f` commits plugin state (its own transaction: it locks keys, may conflict or be
/// over quota); the rest share transactions ([`commit_finishes`]).
pub(super) fn commits_state(f: &Finish) -> bool {
    matches!(f.disposition, Disposition::Done { .. }) && !f.state.is_empty()
}

/// Records `f` in a transaction of its own.
pub(super) async fn finish_one(
    pool: &Connections,
    commits: &Commits,
    f: &Finish,
) -> Result<Finished, InboxError> {
    let started = Instant::now();
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // The set-up and the other nodes' notice (delivered if the finish commits) travel with the
    // finish's first statement: one round trip for all three.
    let ((), (), finished) = tokio::try_join!(
        super::generic_plans(&tx),
        async { Ok(tx.batch_execute(wakeup::NOTIFY).await?) },
        finish_attempt(&tx, f)
    )?;
    if let Finished::OverQuota(_) = finished {
        // Nothing of a refused commit stays (not even the usage row it locked).
        tx.rollback().await?;
    } else {
        tx.commit().await?;
        commits.committed(1, started);
    }
    Ok(finished)
}

impl Weigh for Finish {}

/// Records a batch of finishes that write no plugin state in one transaction and answers each:
/// one update moves on the deliveries whose lease is still the running one (the check
/// [`finish_attempt`] makes, as the update's own condition), and one insert gives those their
/// attempt rows. A batch refused for anything but the server being away or busy is recorded one
/// finish per transaction instead.
pub(super) async fn commit_finishes(
    pool: &Connections,
    commits: &Commits,
    mut batch: Vec<(Finish, Reply<Finished>)>,
) {
    batch.sort_by_key(|(f, _)| f.delivery_id);
    let finishes: Vec<&Finish> = batch.iter().map(|(f, _)| f).collect();
    let started = Instant::now();
    let together = finish_together(pool, &finishes).await;
    drop(finishes);
    for (f, reply) in batch::answer(commits, started, batch, together) {
        let _ = reply.send(finish_one(pool, commits, &f).await);
    }
}

/// The statement of [`finish_together`]: moves on each delivery whose lease is still the
/// finish's (`$1` delivery, `$2` attempt) and gives it its attempt row; returns the (delivery,
/// attempt) pairs recorded.
///
/// The lease check is the update's own condition: a row another transaction changes first (a
/// reclaim on another node) is checked again as that change left it, so a finish whose lease
/// was taken back updates nothing. The batch comes sorted by id, the order in which a plan
/// driven by the array meets the rows, as two batches' locks then are. Matched by (delivery,
/// attempt): a late finish of an earlier lease of the same delivery may share the batch, and
/// only the running lease's finish is recorded. A transaction that recorded one notifies `$13`
/// (the other nodes' wake-up) as it commits.
const FINISH_SQL: &str = "WITH u AS (
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                              $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], $10::text[],
                              $11::text[], $12::text[], $14::bigint[])
              AS u (id, attempt, state, output, last_error, next_at, started, ended, outcome,
                    error_kind, error, plugin_sha256, uncounted)
     ), moved AS (
         UPDATE deliveries d SET state = u.state, output = COALESCE(u.output, d.output),
             last_error = u.last_error, next_attempt_at = u.next_at, lease_until = NULL,
             updated_at = u.ended, budget_base = d.budget_base + u.uncounted
         FROM u
         WHERE d.id = u.id AND d.state = 'running' AND d.attempts = u.attempt
         RETURNING d.id, d.attempts
     ), recorded AS (
         INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome, error_kind,
                               error, plugin_sha256)
         SELECT u.id, u.attempt, u.started, u.ended, u.outcome, u.error_kind, u.error,
                u.plugin_sha256
         FROM moved JOIN u ON u.id = moved.id AND u.attempt = moved.attempts
         ORDER BY u.id
         RETURNING pg_notify($13, '')
     )
     SELECT id, attempts FROM moved";

/// [`commit_finishes`]' transaction, one statement sent with its `BEGIN` and `COMMIT`; what
/// became of each finish, in order.
async fn finish_together(
    pool: &Connections,
    finishes: &[&Finish],
) -> Result<Vec<Finished>, InboxError> {
    fn column<'a, T>(finishes: &[&'a Finish], value: impl Fn(&'a Finish) -> T) -> Vec<T> {
        finishes.iter().map(|f| value(f)).collect()
    }
    let moves = column(finishes, Finish::next_state);
    let ids = column(finishes, |f| f.delivery_id);
    let attempts = column(finishes, |f| i64::from(f.attempt));
    let states: Vec<&str> = moves.iter().map(|(state, _, _)| state.as_str()).collect();
    let outputs: Vec<&Option<String>> = moves.iter().map(|(_, output, _)| output).collect();
    let errors = column(finishes, Finish::last_error);
    let next: Vec<i64> = moves.iter().map(|(_, _, next_at)| *next_at).collect();
    let started = column(finishes, |f| f.started_at_ms);
    let ended = column(finishes, |f| f.finished_at_ms);
    let outcomes = column(finishes, |f| f.outcome.as_str());
    let kinds = column(finishes, |f| f.error_kind.as_deref());
    let messages = column(finishes, |f| f.error.as_deref());
    let shas = column(finishes, |f| f.plugin_sha256.as_deref());
    let uncounted = column(finishes, |f| i64::from(f.uncounted));
    let client = pool.get().await?;
    let updated: HashSet<(i64, i64)> = client
        .in_one_round_trip(
            super::BEGIN_GENERIC,
            FINISH_SQL,
            &[
                &ids,
                &attempts,
                &states,
                &outputs,
                &errors,
                &next,
                &started,
                &ended,
                &outcomes,
                &kinds,
                &messages,
                &shas,
                &wakeup::CHANNEL,
                &uncounted,
            ],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    Ok(finishes
        .iter()
        .map(|f| {
            if updated.contains(&(f.delivery_id, i64::from(f.attempt))) {
                Finished::Recorded
            } else {
                Finished::LeaseLost
            }
        })
        .collect())
}

/// Records the attempts whose lease ended before `now_ms` (and that no other transaction is
/// finishing) as abandoned at `now_ms`, moving each delivery where `decide(handler,
/// budget_used)` says.
pub(super) async fn take_back(
    tx: &Tx<'_>,
    now_ms: i64,
    decide: Decide,
) -> Result<Reclaimed, InboxError> {
    let rows = tx
        .query(
            "SELECT id, handler, attempts, attempts - budget_base, leased_at
             FROM deliveries WHERE state = 'running' AND lease_until < $1
             ORDER BY id
             FOR UPDATE SKIP LOCKED",
            &[&now_ms],
        )
        .await?;
    let abandoned: Vec<Finish> = rows
        .iter()
        .map(|row| {
            let handler: String = row.get(1);
            let disposition = decide(&handler, token(row.get(3)));
            Finish::abandoned(
                row.get(0),
                &handler,
                token(row.get(2)),
                row.get(4),
                now_ms,
                disposition,
            )
        })
        .collect();
    for finish in &abandoned {
        finish_attempt(tx, finish).await?;
    }
    Ok(Reclaimed::of(&abandoned))
}

/// The earliest `next_attempt_at` of a waiting delivery that is `bound` (`<= $1` or `> $1`):
/// each handler with waiting deliveries is found by one probe of `deliveries_waiting` past the
/// last one found (a loose index scan), and gives its earliest such time by one more. No index
/// on `(state, next_attempt_at)` is kept for this: every version of every delivery would write
/// to it, for a read made a few times a second.
fn earliest_waiting_sql(bound: &str) -> String {
    let waiting = sql_states(&DeliveryState::WAITING);
    let handlers = distinct_by_probes(
        "handlers",
        "handler",
        "deliveries",
        &format!("state IN {waiting}"),
    );
    format!(
        "{handlers}SELECT MIN(due.at) FROM handlers CROSS JOIN LATERAL (
             SELECT next_attempt_at AS at FROM deliveries
             WHERE state IN {waiting} AND handler = handlers.handler AND next_attempt_at {bound} $1
             ORDER BY next_attempt_at LIMIT 1
         ) due"
    )
}

pub(super) static OLDEST_DUE_SQL: LazyLock<String> = LazyLock::new(|| earliest_waiting_sql("<="));
static NEXT_DUE_SQL: LazyLock<String> = LazyLock::new(|| earliest_waiting_sql(">"));

/// When the waiting delivery due longest ago became due, if one is due at `now_ms` (one
/// waiting behind its ordering key's head counts: its event is not handled yet either).
pub(super) async fn oldest_due(client: &Conn, now_ms: i64) -> Result<Option<i64>, InboxError> {
    Ok(client.query_one(&OLDEST_DUE_SQL, &[&now_ms]).await?.get(0))
}

/// The earliest `next_attempt_at` after `after_ms` of a pending or retrying delivery.
pub(super) async fn next_due_after(
    client: &Conn,
    after_ms: i64,
) -> Result<Option<i64>, InboxError> {
    Ok(client.query_one(&NEXT_DUE_SQL, &[&after_ms]).await?.get(0))
}
