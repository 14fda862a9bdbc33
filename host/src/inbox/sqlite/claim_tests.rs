//! `claim_due` against a real schema with rows inserted as SQL (so these are the SQLite room's
//! own tests): per-handler lookups feed the fair share-out, each handler's deliveries are
//! leased oldest first, per-key heads and staleness still hold.

use rusqlite::{Connection, OptionalExtension, params};

use super::{
    super::{
        connection::{in_memory, open_connection},
        schema,
        sql::query_plan,
    },
    KEY_HEADS, KEYED_DUE, KEYED_SINCE, NEWEST_DONE, NEWEST_ONCE_DONE, NEXT_DUE_AFTER, OLDEST_DUE,
    UNKEYED_DUE, claim_due, next_due_after, oldest_due,
};
use crate::{
    config::Durability,
    dispatch::fair::Fairness,
    inbox::{ClaimRequest, contract::fixtures, store::ClaimOutcome},
};

fn db() -> Connection {
    in_memory()
}

/// One event of source `s` with one delivery to `handler`, due at `due`, in `state`; returns
/// the delivery id.
fn delivery(
    conn: &Connection,
    handler: &str,
    due: i64,
    key: Option<&str>,
    sequence: Option<i64>,
    state: &str,
) -> i64 {
    delivery_of(conn, "s", handler, due, key, sequence, state)
}

/// [`delivery`] of an event of `source`.
fn delivery_of(
    conn: &Connection,
    source: &str,
    handler: &str,
    due: i64,
    key: Option<&str>,
    sequence: Option<i64>,
    state: &str,
) -> i64 {
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    conn.execute(
        "INSERT INTO events (source, event_id, event_type, ordering_key, sequence, received_at,
                             headers, body)
         VALUES (?5, ?1, 't', ?2, ?3, ?4, '[]', x'')",
        params![format!("e{n}"), key, sequence, due, source],
    )
    .unwrap();
    let event = conn.last_insert_rowid();
    conn.execute(
        "INSERT INTO deliveries (event, source, handler, ordering_key, sequence, state,
                                 next_attempt_at, updated_at)
         VALUES (?1, ?7, ?2, ?3, ?4, ?5, ?6, ?6)",
        params![event, handler, key, sequence, state, due, source],
    )
    .unwrap();
    conn.last_insert_rowid()
}

fn request(limit: usize, handlers: &[(&str, usize)], fairness: Fairness) -> ClaimRequest {
    ClaimRequest {
        caps: Default::default(),
        fairness,
        ..fixtures::claim_request(1_000_000, limit, handlers)
    }
}

/// The ids of the deliveries one claim of `req` leases, in lease order.
fn leased_ids(conn: &Connection, req: &ClaimRequest) -> Vec<i64> {
    let leased = claim_due(conn, req).unwrap().leased;
    leased.iter().map(|c| c.delivery_id).collect()
}

fn running(pairs: &[(&str, usize)]) -> Fairness {
    let mut fairness = Fairness::new(64, 2);
    for (handler, n) in pairs {
        fairness.running.insert(handler.to_string(), *n);
        fairness.held_for.insert(handler.to_string());
    }
    fairness
}

#[test]
fn an_old_backlog_never_hides_another_handlers_delivery() {
    let conn = db();
    for i in 0..1_000 {
        delivery(&conn, "slow", i, None, None, "pending");
    }
    let quick = delivery(&conn, "quick", 5_000, None, None, "pending");
    // The one free worker goes to the handler with nothing running, not the oldest delivery.
    let req = request(
        1,
        &[("slow", 64), ("quick", 64)],
        running(&[("slow", 63), ("quick", 0)]),
    );
    let ClaimOutcome {
        leased: claimed,
        stale,
    } = claim_due(&conn, &req).unwrap();
    assert_eq!(stale, 0);
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        [quick]
    );
    assert_eq!(claimed[0].attempt, 1);
}

#[test]
fn each_handler_is_leased_oldest_first_and_the_workers_are_split() {
    let conn = db();
    let mut slow = Vec::new();
    let mut quick = Vec::new();
    for i in 0..10 {
        slow.push(delivery(&conn, "slow", i, None, None, "pending"));
    }
    for i in 0..10 {
        quick.push(delivery(&conn, "quick", 100 + i, None, None, "pending"));
    }
    let req = request(
        6,
        &[("slow", 64), ("quick", 64)],
        running(&[("slow", 0), ("quick", 0)]),
    );
    let claimed = claim_due(&conn, &req).unwrap().leased;
    let of = |handler: &str| -> Vec<i64> {
        claimed
            .iter()
            .filter(|c| c.handler.as_str() == handler)
            .map(|c| c.delivery_id)
            .collect()
    };
    assert_eq!(of("slow"), slow[..3]);
    assert_eq!(of("quick"), quick[..3]);
    // Leased rows are running; the rest wait.
    let running: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM deliveries WHERE state = 'running'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(running, 6);
}

#[test]
fn a_handler_at_its_cap_is_not_claimed() {
    let conn = db();
    delivery(&conn, "capped", 0, None, None, "pending");
    let other = delivery(&conn, "other", 10, None, None, "pending");
    let req = request(
        4,
        &[("capped", 0), ("other", 64)],
        running(&[("capped", 2)]),
    );
    let claimed = claim_due(&conn, &req).unwrap().leased;
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        [other]
    );
}

/// Only a key's head is leased, and heads older than a sequence done for their key are marked
/// `stale` and passed over: as many as a claim's passes reach (each pass hands the key on to
/// its next delivery), the rest by the claims after it; none is leased.
#[test]
fn one_head_per_key_and_stale_heads_are_passed_over() {
    let conn = db();
    // Key k: 1..=12 open, 50 already done, so every open one is stale; one more key-less.
    for seq in 1..=12 {
        delivery(&conn, "h", seq, Some("k"), Some(seq), "pending");
    }
    delivery(&conn, "h", 0, Some("k"), Some(50), "done");
    // Key j: two open, in order: only the first may run.
    let j1 = delivery(&conn, "h", 20, Some("j"), Some(1), "pending");
    delivery(&conn, "h", 21, Some("j"), Some(2), "pending");
    let free = delivery(&conn, "h", 30, None, None, "pending");
    let req = request(8, &[("h", 64)], running(&[]));
    let ClaimOutcome {
        leased: claimed,
        mut stale,
    } = claim_due(&conn, &req).unwrap();
    assert!(stale >= 4, "{stale} marked stale by the first claim");
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        [j1, free]
    );
    loop {
        let next = claim_due(&conn, &req).unwrap();
        assert!(next.leased.is_empty(), "{:?}", next.leased.len());
        if next.stale == 0 {
            break;
        }
        stale += next.stale;
    }
    assert_eq!(stale, 12);
}

#[test]
fn deliveries_not_yet_due_wait() {
    let conn = db();
    delivery(&conn, "h", 2_000_000, None, None, "retrying");
    let due = delivery(&conn, "h", 999_999, None, None, "retrying");
    let claimed = claim_due(&conn, &request(4, &[("h", 64)], running(&[])))
        .unwrap()
        .leased;
    assert_eq!(
        claimed.iter().map(|c| c.delivery_id).collect::<Vec<_>>(),
        [due]
    );
}

/// A claim's cost does not grow with the backlog: on a database holding other handlers'
/// deliveries and long key histories (the planner left to itself read every waiting delivery
/// of every handler through `deliveries_due` and sorted them, on each claim), its window is
/// index ranges of its own handler merged in order, each key check a seek, and the walk over
/// the keys a few seeks per key.
#[test]
fn a_claim_reads_index_ranges_never_the_whole_backlog() {
    let conn = db();
    for n in 0..200 {
        let key = format!("k{}", n % 4);
        delivery(&conn, "busy", n, Some(&key), Some(n), "pending");
        delivery(&conn, "busy", n, Some(&key), Some(n), "done");
        delivery(&conn, "busy", n, None, None, "retrying");
    }
    conn.execute_batch("ANALYZE").unwrap();
    for sql in [
        KEYED_DUE,
        UNKEYED_DUE,
        NEWEST_DONE,
        NEWEST_ONCE_DONE,
        KEY_HEADS,
    ] {
        let plan = query_plan(&conn, sql);
        assert!(!plan.contains("SCAN deliveries"), "a full scan in:\n{plan}");
        assert!(!plan.contains("SCAN d "), "a full scan in:\n{plan}");
        if sql != KEY_HEADS {
            // (The walk sorts the heads it found, one per key.)
            assert!(!plan.contains("TEMP B-TREE"), "a sort in:\n{plan}");
        }
    }
    for (sql, index, ranges) in [
        (KEYED_DUE, "deliveries_keyed_due", 2),
        (UNKEYED_DUE, "deliveries_unkeyed_due", 2),
    ] {
        let plan = query_plan(&conn, sql);
        assert!(plan.contains("MERGE"), "{plan}");
        assert_eq!(plan.matches(index).count(), ranges, "{plan}");
    }
    // Three probes of the key per waiting state: one running, one earlier sequence, one
    // earlier arrival at the same sequence.
    let window = query_plan(&conn, KEYED_DUE);
    assert_eq!(
        window.matches("deliveries_open_keys").count(),
        6,
        "{window}"
    );
    assert!(query_plan(&conn, NEWEST_DONE).contains("deliveries_done_sequence"));
    assert!(query_plan(&conn, NEWEST_ONCE_DONE).contains("deliveries_once_handled"));
    let walk = query_plan(&conn, KEY_HEADS);
    for step in walk.lines().filter(|step| step.contains("deliveries")) {
        assert!(
            step.contains("SEARCH")
                && (step.contains("deliveries_open_keys") || step.contains("INTEGER PRIMARY KEY")),
            "{step} in:\n{walk}"
        );
    }
}

/// The due-heads statement is compiled once per connection: a claim rebinds the clock, the
/// page size and the page's start, and none of them makes SQLite compile it again. (SQLite plans
/// `LIMIT ?` with the value bound, and re-compiled the statement whenever it changed: on the
/// writer, as much work again as the claim itself.)
#[test]
fn a_claim_reuses_its_compiled_statement_whatever_it_binds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookd.db");
    std::fs::File::create(&path).unwrap();
    let conn = open_connection(&path, Durability::Full).unwrap();
    schema::migrate(&conn).unwrap();
    for n in 0..20 {
        delivery(&conn, "h", n, Some("k"), Some(n), "pending");
        delivery(&conn, "h", n, None, None, "retrying");
    }
    let mut statement = conn.prepare(KEYED_DUE).unwrap();
    for (now, page) in [(5, 4), (9, 8), (19, 64), (7, 1)] {
        let mut rows = statement.query(params!["h", now, page]).unwrap();
        let mut read = 0;
        while rows.next().unwrap().is_some() {
            read += 1;
        }
        drop(rows);
        assert!(read > 0 && read <= page, "{read} rows for a page of {page}");
        assert_eq!(
            statement.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "compiled again after binding now = {now}, page = {page}"
        );
    }
}

/// The earliest waiting delivery (the dispatcher's timer, the lag gauge) is a seek of
/// `deliveries_keyed_due` and of `deliveries_unkeyed_due` per handler and waiting state,
/// whatever else the table holds: no
/// index over every delivery's state and due time is kept for it, since every change of state
/// would rewrite its entry there.
#[test]
fn the_earliest_waiting_delivery_is_a_seek_per_handler_and_state() {
    let conn = db();
    for n in 0..300 {
        delivery(&conn, ["a", "b", "c"][n % 3], n as i64, None, None, "done");
    }
    delivery(&conn, "a", 2_000, None, None, "running");
    delivery(&conn, "b", 5_000, Some("k"), Some(1), "pending");
    delivery(&conn, "c", 3_000, None, None, "retrying");
    delivery(&conn, "a", 9_007, None, None, "pending");
    delivery(&conn, "c", 9_003, None, None, "retrying");
    delivery(&conn, "d", 1_000, None, None, "dead");
    conn.execute_batch("ANALYZE").unwrap();
    assert_eq!(oldest_due(&conn, 8_000).unwrap(), Some(3_000));
    assert_eq!(oldest_due(&conn, 2_999).unwrap(), None);
    assert_eq!(next_due_after(&conn, 8_000).unwrap(), Some(9_003));
    assert_eq!(next_due_after(&conn, 9_003).unwrap(), Some(9_007));
    assert_eq!(next_due_after(&conn, 9_007).unwrap(), None);
    for sql in [OLDEST_DUE, NEXT_DUE_AFTER] {
        let plan = query_plan(&conn, sql);
        for step in plan.lines().filter(|step| step.contains("deliveries")) {
            assert!(
                step.starts_with("SEARCH") && step.contains("_due"),
                "{step} in:\n{plan}"
            );
        }
        // Per index, the handlers' walk and the two states' seeks per handler.
        assert_eq!(plan.matches("deliveries_keyed_due").count(), 4, "{plan}");
        assert_eq!(plan.matches("deliveries_unkeyed_due").count(), 4, "{plan}");
    }
}

/// A claim queued behind a held writer (a stalled disk) leases from when it ran: its
/// `leased_at` and lease end are moved on by the wait. Before, they ran from when it was asked
/// for, so a wait longer than the lease's margin granted a lease short or already over, and
/// the next reclaim took it back while its handler ran (a delivery run twice, or an
/// at-most-once one dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_the_writer_leases_from_when_it_ran() {
    use crate::inbox::store::Store as _;
    const NOW: i64 = 1_000_000;
    const LEASE: i64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let options = super::super::writer::WriterOptions::new(Durability::Normal);
    let store = super::super::SqliteStore::open(&dir.path().join("hookd.db"), options).unwrap();
    store
        .write(|conn| Ok(delivery(conn, "h", NOW, None, None, "pending")))
        .await
        .unwrap();
    let (release, held) = super::super::writer::testing::hold(&store);
    let mut request = fixtures::claim_request(NOW, 1, &[("h", 1)]);
    request.lease_ms.insert("h".to_owned(), LEASE);
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(request).await }
    });
    let waited = std::time::Duration::from_millis(2_500);
    tokio::time::sleep(waited).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    let ClaimOutcome { leased, .. } = claim.await.unwrap().unwrap();
    assert_eq!(leased.len(), 1);
    let waited_ms = waited.as_millis() as i64;
    assert!(
        leased[0].leased_at_ms >= NOW + waited_ms,
        "leased at {} after waiting {waited_ms} ms from {NOW}",
        leased[0].leased_at_ms
    );
    let until: i64 = store
        .write(|conn| Ok(conn.query_row("SELECT lease_until FROM deliveries", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert!(
        until >= NOW + waited_ms + LEASE,
        "a {LEASE} ms lease asked for at {NOW} and granted {waited_ms} ms later ends at {until}"
    );
    // A claim that did not wait keeps the time it was asked at (the tests' fixed clocks).
    let request = fixtures::claim_request(NOW, 1, &[("h", 1)]);
    assert!(matches!(
        request.ran_after(std::time::Duration::from_millis(10)),
        std::borrow::Cow::Borrowed(r) if r.now_ms == NOW
    ));
}

/// SQLite's virtual machine steps `sqls` took on `conn` since last asked, in all.
fn vm_steps(conn: &Connection, sqls: &[&str]) -> i32 {
    sqls.iter()
        .map(|sql| {
            let statement = conn.prepare_cached(sql).unwrap();
            let steps = statement.get_status(rusqlite::StatementStatus::VmStep);
            statement.reset_status(rusqlite::StatementStatus::VmStep);
            steps
        })
        .sum()
}

/// A claim's work does not grow with one key's backlog: with thousands of deliveries waiting
/// behind a key's running head, it looks at a window of them, then walks the keys (a few
/// seeks each). Before, it read every one of them, on the writer, on every claim (11.6–20.6 ms for
/// 20 000). Counted in SQLite's virtual machine steps, the same for 200 waiting as for 5 000.
#[test]
fn a_claim_past_one_keys_long_queue_does_not_read_it() {
    let steps = |queued: i64| -> i32 {
        let conn = db();
        conn.execute_batch("BEGIN").unwrap();
        delivery(&conn, "h", 0, Some("hot"), Some(0), "running");
        for i in 1..=queued {
            delivery(&conn, "h", i, Some("hot"), Some(i), "pending");
        }
        let mut others = Vec::new();
        for i in 0..10 {
            let key = format!("k{i}");
            others.push(delivery(
                &conn,
                "h",
                10_000 + i,
                Some(&key),
                Some(1),
                "pending",
            ));
        }
        let free = delivery(&conn, "h", 20_000, None, None, "pending");
        conn.execute_batch("COMMIT").unwrap();
        let req = request(8, &[("h", 64)], running(&[("h", 1)]));
        let leased = leased_ids(&conn, &req);
        // The other keys' heads, oldest first, then the one without a key once they are out.
        assert_eq!(leased, others[..8], "{queued} queued behind the hot key");
        let again = claim_due(&conn, &req).unwrap().leased;
        let ids: Vec<i64> = again.iter().map(|c| c.delivery_id).collect();
        assert_eq!(ids, [others[8], others[9], free]);
        vm_steps(&conn, &[KEYED_DUE, UNKEYED_DUE, KEY_HEADS])
    };
    let (short, long) = (steps(200), steps(5_000));
    assert!(
        long < short * 2,
        "{long} steps with 5 000 queued behind one key against {short} with 200"
    );
}

/// The walk over the keys goes from one source to the next: keys of several sources (one
/// named like another's key, one key name in two sources, each its own key) are each found
/// once, in due order, behind a window full of one source's blocked key.
#[test]
fn the_walk_over_the_keys_finds_every_sources_keys() {
    let conn = db();
    delivery_of(&conn, "b", "h", 0, Some("hot"), Some(0), "running");
    for i in 1..=100 {
        delivery_of(&conn, "b", "h", i, Some("hot"), Some(i), "pending");
    }
    let mut heads = Vec::new();
    for (due, source, key) in [
        (500, "c", "k"),
        (501, "a", "k"),
        (502, "b", "a"),
        (503, "c", "b"),
        (504, "a", "z"),
        (505, "b", "k"),
    ] {
        heads.push(delivery_of(
            &conn,
            source,
            "h",
            due,
            Some(key),
            Some(1),
            "pending",
        ));
        // A second of each key waits behind its head.
        delivery_of(&conn, source, "h", due + 100, Some(key), Some(2), "pending");
    }
    let req = request(8, &[("h", 64)], running(&[("h", 1)]));
    assert_eq!(leased_ids(&conn, &req), heads);
}

/// `key_walks`' record of `handler`, if any: (`checked_at`, `newest_id`).
fn record(conn: &Connection, handler: &str) -> Option<(i64, i64)> {
    conn.query_row(
        "SELECT checked_at, newest_id FROM key_walks WHERE handler = ?1",
        [handler],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .unwrap()
}

/// A claim of up to `want` of `handler`'s deliveries at `now`.
fn claim_at(now: i64, want: usize, handler: &str) -> ClaimRequest {
    ClaimRequest {
        fairness: running(&[]),
        ..fixtures::claim_request(now, want, &[(handler, want)])
    }
}

/// 10 000 keys each waiting on a head whose retry is not due (a downstream outage) and one
/// delivery behind each: a claim walks them all and finds nothing to run. The claims after it
/// read what arrived or came due since instead, in SQLite's virtual machine steps a small
/// fraction of the walk's (before, each took the walk's ~32 ms of the writer again), and still
/// find a new key's delivery, one that arrived behind a blocked key (no), a head whose retry
/// came due, and, after its head finished, the delivery waiting behind it.
#[test]
fn after_a_walk_that_found_nothing_a_claim_reads_what_changed_since() {
    let conn = db();
    conn.execute_batch("BEGIN").unwrap();
    let mut heads = Vec::new();
    let mut behind = Vec::new();
    for k in 0..10_000 {
        let key = format!("k{k}");
        heads.push(delivery(
            &conn,
            "h",
            5_000_000 + k,
            Some(&key),
            Some(1),
            "retrying",
        ));
        behind.push(delivery(
            &conn,
            "h",
            30_000 + k,
            Some(&key),
            Some(2),
            "pending",
        ));
    }
    conn.execute_batch("COMMIT").unwrap();
    let steps = || vm_steps(&conn, &[KEYED_DUE, KEY_HEADS, KEYED_SINCE]);
    let now = 1_000_000;
    assert_eq!(leased_ids(&conn, &claim_at(now, 8, "h")), [0i64; 0]);
    let walk = steps();
    assert!(record(&conn, "h").is_some());
    // Arrivals: one behind a blocked key, one of a new key.
    delivery(&conn, "h", now + 5, Some("k7"), Some(3), "pending");
    let new_key = delivery(&conn, "h", now + 6, Some("new"), Some(1), "pending");
    assert_eq!(leased_ids(&conn, &claim_at(now + 10, 8, "h")), [new_key]);
    let since = steps();
    assert!(
        since * 50 < walk,
        "{since} steps after the walk against its {walk}"
    );
    // A head's retry comes due.
    assert_eq!(leased_ids(&conn, &claim_at(now + 20, 8, "h")), [0i64; 0]);
    conn.execute(
        "UPDATE deliveries SET next_attempt_at = ?2 WHERE id = ?1",
        params![heads[3], now + 25],
    )
    .unwrap();
    assert_eq!(leased_ids(&conn, &claim_at(now + 30, 8, "h")), [heads[3]]);
    assert!(steps() * 50 < walk, "the claims after the walk read little");
    // It finishes: the delivery behind it, due long before the record, may run now, so the
    // record is cleared and the next claim walks.
    conn.execute(
        "UPDATE deliveries SET state = 'done' WHERE id = ?1",
        [heads[3]],
    )
    .unwrap();
    assert_eq!(record(&conn, "h"), None);
    assert_eq!(leased_ids(&conn, &claim_at(now + 40, 8, "h")), [behind[3]]);
}

/// A claim rolled back (its batch redone, its commit failed) takes its record with it: the
/// deliveries it leased wait again, due before any record, and the next claim finds them.
#[test]
fn a_claim_rolled_back_leaves_no_record() {
    let conn = db();
    delivery(&conn, "h", 0, Some("hot"), Some(0), "running");
    for i in 1..=100 {
        delivery(&conn, "h", i, Some("hot"), Some(i), "pending");
    }
    let other = delivery(&conn, "h", 500, Some("k"), Some(1), "pending");
    conn.execute_batch("SAVEPOINT job").unwrap();
    assert_eq!(leased_ids(&conn, &claim_at(1_000, 4, "h")), [other]);
    assert!(record(&conn, "h").is_some());
    conn.execute_batch("ROLLBACK TO job; RELEASE job").unwrap();
    assert_eq!(record(&conn, "h"), None);
    assert_eq!(leased_ids(&conn, &claim_at(1_010, 4, "h")), [other]);
}

/// A delivery id can be given again once the highest is deleted (`INTEGER PRIMARY KEY`, no
/// `AUTOINCREMENT`): deleting one at or past the record's newest clears the record, or a
/// delivery that arrived since, with the deleted one's id, would be taken for an old one.
#[test]
fn deleting_the_newest_delivery_clears_the_record() {
    let conn = db();
    delivery(&conn, "h", 0, Some("hot"), Some(0), "running");
    for i in 1..=100 {
        delivery(&conn, "h", i, Some("hot"), Some(i), "pending");
    }
    let newest = delivery(&conn, "h", 200, None, None, "done");
    assert_eq!(leased_ids(&conn, &claim_at(1_000, 4, "h")), [0i64; 0]);
    assert_eq!(record(&conn, "h"), Some((1_000, newest)));
    conn.execute("DELETE FROM deliveries WHERE id = ?1", [newest])
        .unwrap();
    assert_eq!(record(&conn, "h"), None);
    let arrived = delivery(&conn, "h", 900, Some("k"), Some(1), "pending");
    assert_eq!(arrived, newest, "the id is given again");
    assert_eq!(leased_ids(&conn, &claim_at(1_010, 4, "h")), [arrived]);
}

/// The read of what changed since a walk is ranges: of the table by id past the record's
/// newest, and of `deliveries_keyed_due` past its clock; each row's key checked by seeks.
#[test]
fn the_read_since_a_walk_is_ranges_of_the_table_and_the_due_index() {
    let conn = db();
    for n in 0..200 {
        delivery(
            &conn,
            "h",
            n,
            Some(&format!("k{}", n % 4)),
            Some(n),
            "pending",
        );
        delivery(&conn, "h", n, None, None, "retrying");
    }
    conn.execute_batch("ANALYZE").unwrap();
    let plan = query_plan(&conn, KEYED_SINCE);
    assert!(!plan.contains("SCAN"), "a scan in:\n{plan}");
    assert!(
        plan.contains("SEARCH d USING INTEGER PRIMARY KEY (rowid>?)"),
        "{plan}"
    );
    assert_eq!(
        plan.matches("SEARCH d USING INDEX deliveries_keyed_due")
            .count(),
        2,
        "{plan}"
    );
}

/// The record's triggers against a claim that walks: after every one of a random run of
/// writes (arrivals, in and out of order, due or later; runs ending done, dead, retried sooner
/// or later, given back; discards, replays, retries moved earlier, deletions; claims rolled
/// back; the clock moving on and stepping back; two handlers sharing fewer free workers than
/// they could take), a claim using the record leases exactly what the same claim
/// with no record (a walk) would. A trigger that missed a write a head could start running
/// after would fail it (each of their conditions left out fails it).
#[test]
fn a_claim_using_the_record_leases_what_a_walk_would() {
    let conn = db();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |n: u64| -> u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let handlers = ["h", "g"];
    let mut now: i64 = 1_000_000;
    let mut sequence = 0;
    let ids = |conn: &Connection, condition: &str| -> Vec<i64> {
        conn.prepare(&format!(
            "SELECT id FROM deliveries WHERE {condition} ORDER BY id"
        ))
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    // A key's head runs or retries with a queue behind it, so claims walk.
    for handler in handlers {
        delivery(&conn, handler, now, Some("hot"), Some(0), "running");
        for i in 1..=80 {
            delivery(
                &conn,
                handler,
                now - 1_000 + i,
                Some("hot"),
                Some(i),
                "pending",
            );
        }
    }
    let (mut used, mut compared) = (0, 0);
    for step in 0..8_000 {
        let pick = |conn: &Connection, condition: &str, n: &mut dyn FnMut(u64) -> u64| {
            let found = ids(conn, condition);
            (!found.is_empty()).then(|| found[n(found.len() as u64) as usize])
        };
        match next(12) {
            0..=2 => {
                let handler = handlers[next(2) as usize];
                sequence += 1;
                let seq = if next(10) == 0 {
                    sequence - 5
                } else {
                    sequence
                };
                let key = (next(8) != 0).then(|| format!("k{}", next(12)));
                let due = now + next(3_000) as i64 - 2_000;
                let source = ["s", "t"][next(2) as usize];
                delivery_of(
                    &conn,
                    source,
                    handler,
                    due,
                    key.as_deref(),
                    Some(seq),
                    "pending",
                );
            }
            3 | 4 => {
                if let Some(id) = pick(&conn, "state = 'running'", &mut next) {
                    let (state, due) = match next(5) {
                        0 => ("done", now),
                        1 => ("dead", now),
                        2 => ("retrying", now + next(3_000) as i64 - 1_000),
                        3 => ("pending", now),
                        _ => ("retrying", now + 5_000),
                    };
                    conn.execute(
                        "UPDATE deliveries SET state = ?2, next_attempt_at = ?3, lease_until = NULL
                         WHERE id = ?1",
                        params![id, state, due],
                    )
                    .unwrap();
                }
            }
            5 => {
                let condition =
                    ["state IN ('pending', 'retrying')", "state = 'retrying'"][next(2) as usize];
                if let Some(id) = pick(&conn, condition, &mut next) {
                    let state = ["discarded", "dead"][next(2) as usize];
                    conn.execute(
                        "UPDATE deliveries SET state = ?2 WHERE id = ?1",
                        params![id, state],
                    )
                    .unwrap();
                }
            }
            6 => {
                let condition = "state IN ('done', 'dead', 'discarded', 'stale')";
                if let Some(id) = pick(&conn, condition, &mut next) {
                    conn.execute(
                        "UPDATE deliveries SET state = 'pending', next_attempt_at = ?2,
                                               deliver_stale = 1
                         WHERE id = ?1",
                        params![id, now - next(2_000) as i64],
                    )
                    .unwrap();
                }
            }
            7 => {
                if let Some(id) = pick(&conn, "state = 'retrying'", &mut next) {
                    conn.execute(
                        "UPDATE deliveries SET next_attempt_at = ?2 WHERE id = ?1",
                        params![id, now - next(2_000) as i64],
                    )
                    .unwrap();
                }
            }
            8 => {
                if let Some(id) = pick(&conn, "1", &mut next) {
                    conn.execute("DELETE FROM deliveries WHERE id = ?1", [id])
                        .unwrap();
                }
            }
            // The clock moves on, and now and then steps back.
            9 if next(6) == 0 => now -= next(400) as i64,
            9 => now += next(700) as i64,
            _ => {
                // Both handlers, the free workers sometimes fewer than they could take.
                let rooms = [1 + next(4) as usize, next(4) as usize];
                let req = ClaimRequest {
                    fairness: running(&[]),
                    ..fixtures::claim_request(
                        now,
                        1 + next(6) as usize,
                        &[("h", rooms[0]), ("g", rooms[1])],
                    )
                };
                // Every record is used, however old: the walk every second would hide a
                // write the triggers missed.
                conn.execute("UPDATE key_walks SET walked_at = ?1", [now])
                    .unwrap();
                // What a walk finds: the same claim with no record, undone.
                conn.execute_batch("SAVEPOINT walk; DELETE FROM key_walks")
                    .unwrap();
                let walked = claim_due(&conn, &req).unwrap();
                conn.execute_batch("ROLLBACK TO walk; RELEASE walk")
                    .unwrap();
                used += handlers
                    .iter()
                    .filter(|h| record(&conn, h).is_some())
                    .count();
                conn.execute_batch("SAVEPOINT claim").unwrap();
                let claimed = claim_due(&conn, &req).unwrap();
                let ids = |o: &ClaimOutcome| -> Vec<i64> {
                    o.leased.iter().map(|c| c.delivery_id).collect()
                };
                // Which heads a claim marks stale on its way depends on how it found them;
                // the claims are compared where neither marked one.
                if walked.stale == 0 && claimed.stale == 0 {
                    assert_eq!(
                        ids(&claimed),
                        ids(&walked),
                        "step {step}, now {now}, {rooms:?}"
                    );
                    compared += 1;
                }
                if next(10) == 0 {
                    conn.execute_batch("ROLLBACK TO claim").unwrap();
                }
                conn.execute_batch("RELEASE claim").unwrap();
            }
        }
    }
    assert!(
        used > 150 && compared > 1_000,
        "{used} claims used a record, {compared} compared"
    );
}

/// What a claim costs behind long queues, in a release build (a benchmark, not run by default):
/// `cargo test --release -p host --lib claim_cost_behind_long_queues -- --ignored --nocapture`.
/// Three shapes of one handler's backlog: one key with 20 000 deliveries queued behind its
/// running head and 10 other keys due; the same with 900 other keys; 10 000 keys each with a
/// delivery due behind a head whose retry is not due yet, 64 more arriving behind them before
/// each claim (ingest going on through a downstream outage). Each claim asks for 8; printed are
/// the first claim (it compiles the statements) and the median of the five after it.
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn claim_cost_behind_long_queues() {
    let shapes: [(&str, i64, i64, usize); 3] = [
        ("one key 20 000 deep, 10 other keys", 20_000, 10, 8),
        ("one key 20 000 deep, 900 other keys", 20_000, 900, 8),
        ("10 000 keys, each head retrying later", 0, 10_000, 0),
    ];
    for (shape, queued, keys, leases) in shapes {
        let conn = db();
        conn.execute_batch("BEGIN").unwrap();
        delivery(&conn, "h", 0, Some("hot"), Some(0), "running");
        for i in 1..=queued {
            delivery(&conn, "h", i, Some("hot"), Some(i), "pending");
        }
        for k in 0..keys {
            let key = format!("k{k}");
            if leases == 0 {
                delivery(&conn, "h", 5_000_000, Some(&key), Some(1), "retrying");
            }
            delivery(&conn, "h", 30_000 + k, Some(&key), Some(2), "pending");
        }
        conn.execute_batch("COMMIT").unwrap();
        let mut took = Vec::new();
        for claim in 0..6 {
            let now = 1_000_000 + claim;
            if leases == 0 {
                for n in 0..64 {
                    let key = format!("k{}", (claim * 64 + n) * 37 % keys);
                    delivery(&conn, "h", now, Some(&key), Some(3 + claim), "pending");
                }
            }
            let req = ClaimRequest {
                fairness: running(&[("h", 1)]),
                ..fixtures::claim_request(now, 8, &[("h", 64)])
            };
            let started = std::time::Instant::now();
            let leased = claim_due(&conn, &req).unwrap().leased;
            took.push(started.elapsed());
            assert_eq!(leased.len(), leases, "{shape}");
            // Back to waiting, so each claim finds the same.
            conn.execute_batch(
                "UPDATE deliveries SET state = 'pending' WHERE state = 'running' AND ordering_key <> 'hot'",
            )
            .unwrap();
        }
        let first = took.remove(0);
        took.sort();
        eprintln!(
            "{shape}: the first claim takes {first:?}, the claims after it {:?} (median of 5)",
            took[2]
        );
    }
}
