//! What only the PostgreSQL store promises, tested against a real server: its guarantees
//! between nodes (each node an inbox with a pool of its own on one database) under concurrent
//! accepts, claims, finishes and start-ups, and what its connection errors say.
//!
//! Every test runs on the multi-thread runtime: a test database is dropped while the runtime
//! still runs, and on one thread a connection the inbox was still opening would hold that
//! `DROP DATABASE` until the server's `authentication_timeout`.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{
    PostgresStore, TestDatabase,
    schema::{MIGRATION_LOCK, MIGRATIONS},
    statements::{self, Run},
    testdb,
};
use crate::{
    clock::Clock,
    config::{Durability, Pooler},
    inbox::{
        Accepted, Finished, Inbox, InboxError, OpenOptions, WriterOptions,
        contract::fixtures::{self, HANDLER, LEASED_MS, done, event, finished, keyed, lease},
    },
    model::{Disposition, StateChanges},
};

/// Two nodes on `db`.
async fn nodes(db: &TestDatabase) -> [Inbox; 2] {
    [fixtures::open(db).await, fixtures::open(db).await]
}

/// State traffic that read `key` absent and writes `value` to it.
fn write_new(key: &str, value: u8) -> StateChanges {
    StateChanges {
        versions: [(key.to_owned(), 0)].into(),
        writes: [(key.to_owned(), Some(vec![value]))].into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_accepts_store_one_event() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let nodes = nodes(&db).await;
    let accepts: Vec<_> = (0..8)
        .map(|i| {
            let inbox = nodes[i % 2].clone();
            tokio::spawn(async move { fixtures::accept(&inbox, event("a")).await })
        })
        .collect();
    let mut new = 0;
    for accept in accepts {
        new += usize::from(accept.await.unwrap() == Accepted::New);
    }
    assert_eq!(new, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_sharing_commits_are_each_answered_for_their_own_event() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let nodes = nodes(&db).await;
    // 400 requests at once on two nodes, for 100 events (each sent four times): batched
    // together, in every order, and still each event is new exactly once.
    let accepts: Vec<_> = (0..400)
        .map(|i| {
            let inbox = nodes[i % 2].clone();
            let id = format!("e{}", (i * 7) % 100);
            tokio::spawn(async move { (id.clone(), fixtures::accept(&inbox, event(&id)).await) })
        })
        .collect();
    let mut new = std::collections::BTreeMap::<String, usize>::new();
    for accept in accepts {
        let (id, accepted) = accept.await.unwrap();
        *new.entry(id).or_default() += usize::from(accepted == Accepted::New);
    }
    assert_eq!(new.len(), 100);
    assert!(new.values().all(|n| *n == 1), "{new:?}");
    let stored = nodes[0]
        .list_events(crate::inbox::EventFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.len(), 100, "each event stored once");
    assert!(
        stored.iter().all(|e| e.states.len() == 1),
        "one delivery per event"
    );
    assert!(
        nodes[0].commits() + nodes[1].commits() < 400,
        "the requests shared commits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_database_refuses_fails_alone() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    // A NUL cannot be stored in a PostgreSQL text column: that event's insert fails, and it
    // must not take the events batched with it down.
    accept_forty_where_one_fails(&inbox, "bad\0id").await;
}

/// Accepts 40 events at once on `inbox` (so batched together): `e0`, `e1`, … but the 21st is
/// `odd`; `odd` alone must fail, every other be new.
async fn accept_forty_where_one_fails(inbox: &Inbox, odd: &str) {
    let accepts: Vec<_> = (0..40)
        .map(|i| {
            let inbox = inbox.clone();
            let id = if i == 20 {
                odd.to_owned()
            } else {
                format!("e{i}")
            };
            tokio::spawn(async move {
                let accepted = inbox
                    .accept(
                        crate::ids::SourceName::new(fixtures::SOURCE),
                        event(&id),
                        fixtures::request(),
                        vec![crate::ids::PluginName::new(HANDLER)],
                        None,
                    )
                    .await;
                (i, accepted)
            })
        })
        .collect();
    for accept in accepts {
        let (i, accepted) = accept.await.unwrap();
        if i == 20 {
            assert!(accepted.is_err(), "{accepted:?}");
        } else {
            assert_eq!(accepted.unwrap(), Accepted::New, "e{i}");
        }
    }
}

/// Makes every transaction that wrote a row of `table` matching `condition` fail at its
/// `COMMIT`, not at the statement: a deferred constraint trigger, checked only at commit.
async fn refuse_at_commit(client: &tokio_postgres::Client, table: &str, condition: &str) {
    client
        .batch_execute(&format!(
            "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
             CREATE CONSTRAINT TRIGGER refuse_at_commit
                 AFTER INSERT OR UPDATE ON {table} DEFERRABLE INITIALLY DEFERRED
                 FOR EACH ROW WHEN ({condition}) EXECUTE FUNCTION refuse_at_commit();"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_is_answered_by_its_commit_not_by_its_statement() {
    let Some((db, inbox, client)) = store_and_client().await else {
        return;
    };
    // The batch's statement succeeds for every event; its COMMIT fails for `late`'s sake.
    // Answered from the statement, all 40 would be `New` and `late` would be lost.
    refuse_at_commit(&client, "events", "NEW.event_id = 'late'").await;
    accept_forty_where_one_fails(&inbox, "late").await;
    let stored: i64 = client
        .query_one("SELECT count(*) FROM events WHERE event_id = 'late'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 0);
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_is_answered_by_its_commit_not_by_its_statement() {
    let Some((db, inbox, client)) = store_and_client().await else {
        return;
    };
    let claimed = fixtures::lease_many(&inbox, 20).await;
    // Recording `e7` done fails at its transaction's COMMIT, after the statement succeeded.
    let e7 = claimed
        .iter()
        .find(|c| c.event_id.as_str() == "e7")
        .unwrap();
    let condition = format!("NEW.state = 'done' AND NEW.id = {}", e7.delivery_id);
    refuse_at_commit(&client, "deliveries", &condition).await;
    let finishes: Vec<_> = claimed
        .iter()
        .map(|claim| {
            let record = finished(claim, Disposition::Done { output: None });
            let (inbox, id) = (inbox.clone(), claim.event_id.to_string());
            tokio::spawn(async move { (id, inbox.finish(record).await) })
        })
        .collect();
    for finish in finishes {
        let (id, finished) = finish.await.unwrap();
        if id == "e7" {
            assert!(finished.is_err(), "{finished:?}");
        } else {
            assert_eq!(finished.unwrap(), Finished::Recorded, "{id}");
        }
    }
    for claim in &claimed {
        let detail = fixtures::detail(&inbox, claim.event_id.as_str()).await;
        let delivery = &detail.deliveries[0];
        let expected = if claim.event_id.as_str() == "e7" {
            ("running", 0)
        } else {
            ("done", 1)
        };
        assert_eq!(
            (delivery.state.as_str(), delivery.history.len()),
            expected,
            "{}",
            claim.event_id
        );
    }
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishes_sharing_a_commit_each_check_their_own_lease() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    let claimed = fixtures::lease_many(&inbox, 20).await;
    // Every fourth result carries a token that is not its lease's (a stale worker's).
    let finishes: Vec<_> = claimed
        .iter()
        .enumerate()
        .map(|(i, claim)| {
            let mut record = finished(claim, Disposition::Done { output: None });
            if i % 4 == 0 {
                record.attempt += 1;
            }
            let inbox = inbox.clone();
            tokio::spawn(async move { (i, inbox.finish(record).await.unwrap()) })
        })
        .collect();
    for finish in finishes {
        let (i, finished) = finish.await.unwrap();
        let expected = if i % 4 == 0 {
            Finished::LeaseLost
        } else {
            Finished::Recorded
        };
        assert_eq!(finished, expected, "finish {i}");
    }
    for (i, claim) in claimed.iter().enumerate() {
        let detail = fixtures::detail(&inbox, claim.event_id.as_str()).await;
        let delivery = &detail.deliveries[0];
        let (state, attempts) = if i % 4 == 0 {
            ("running", 0)
        } else {
            ("done", 1)
        };
        assert_eq!(
            (delivery.state.as_str(), delivery.history.len()),
            (state, attempts),
            "{}",
            claim.event_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_run_one_delivery_of_a_key_at_a_time_in_order() {
    const EVENTS: u64 = 12;
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let nodes = nodes(&db).await;
    for sequence in 1..=EVENTS {
        fixtures::accept(&nodes[0], keyed(&format!("e{sequence}"), "k", sequence)).await;
    }
    let running = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let claimers: Vec<_> = (0..4)
        .map(|i| {
            let inbox = nodes[i % 2].clone();
            let (running, overlaps, ran) = (running.clone(), overlaps.clone(), ran.clone());
            tokio::spawn(async move {
                while ran.lock().unwrap().len() < EVENTS as usize {
                    let claimed = fixtures::claim(&inbox, LEASED_MS).await;
                    for claim in claimed {
                        if running.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        ran.lock().unwrap().push(claim.sequence.unwrap());
                        running.store(false, Ordering::SeqCst);
                        let record = finished(&claim, Disposition::Done { output: None });
                        assert_eq!(inbox.finish(record).await.unwrap(), Finished::Recorded);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let all = async {
        for claimer in claimers {
            claimer.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every delivery ran within a minute");
    let ran = ran.lock().unwrap().clone();
    assert_eq!(
        (overlaps.load(Ordering::SeqCst), ran),
        (0, (1..=EVENTS).collect::<Vec<_>>())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_a_second_running_delivery_of_one_key() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    fixtures::accept(&inbox, keyed("first", "k", 1)).await;
    fixtures::accept(&inbox, keyed("second", "k", 2)).await;
    fixtures::claim(&inbox, LEASED_MS).await;
    // Whatever a claim decided, the index has the last word.
    let forced = testdb::connect(db.url())
        .await
        .execute(
            "UPDATE deliveries SET state = 'running' WHERE state = 'pending'",
            &[],
        )
        .await;
    let refused = forced.expect_err("a second running delivery of key k");
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
    );
}

/// A claim leases its picks in one statement. When the unique index on running keys refuses
/// that statement (another transaction ran a delivery of a picked key at the same moment), the
/// claim leases its picks one by one: the refused delivery waits, the others are leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_database_refuses_costs_that_delivery_alone() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    fixtures::accept(&inbox, keyed("head", "k", 1)).await;
    fixtures::accept(&inbox, keyed("next", "k", 2)).await;
    fixtures::accept(&inbox, keyed("other", "j", 1)).await;
    fixtures::accept(&inbox, event("plain")).await;
    // Another transaction runs `next`, out of turn, and commits only once the claim's lease of
    // `head` waits on it: the claim read key k with nothing running.
    let mut other = testdb::connect(db.url()).await;
    let out_of_turn = other.transaction().await.unwrap();
    out_of_turn
        .execute(
            "UPDATE deliveries SET state = 'running'
             WHERE event = (SELECT id FROM events WHERE event_id = 'next')",
            &[],
        )
        .await
        .unwrap();
    let claim = tokio::spawn({
        let inbox = inbox.clone();
        async move { fixtures::claim(&inbox, LEASED_MS).await }
    });
    // The claim's lease of `head` waits on the other transaction.
    wait_for_a_lock_wait(&db).await;
    out_of_turn.commit().await.unwrap();
    let mut leased: Vec<String> = claim
        .await
        .unwrap()
        .iter()
        .map(|c| c.event_id.to_string())
        .collect();
    leased.sort();
    assert_eq!(leased, ["other", "plain"]);
    let head = fixtures::detail(&inbox, "head").await.deliveries[0].clone();
    assert_eq!((head.state.as_str(), head.attempts), ("pending", 0));
}

/// Behind PgBouncer in transaction mode a server connection keeps the named statements another
/// client left on it (a node run without `database_pooler`, any other program). tokio-postgres
/// names the statements it prepares `s0`, `s1`, … from one counter per process, so another
/// process's leftovers are the very names this one's next statements would take: planted here
/// on every server connection of the pool (PgBouncer's `default_pool_size` is 4 in
/// `.ci/pgbouncer.sh`), they refused a node's migration and its statements (`prepared statement
/// "sN" already exists`). hookd's own statements never collide with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_another_client_left_on_pooled_connections_do_not_collide() {
    let Some(db) = TestDatabase::behind_pooler().await else {
        return;
    };
    // The counter's last value: the name of a statement prepared now, read in its transaction.
    let mut probe = testdb::connect(db.url()).await;
    let tx = probe.transaction().await.unwrap();
    let _kept = tx.prepare("SELECT 1").await.unwrap();
    let named = tx
        .simple_query(
            "SELECT max(substr(name, 2)::bigint) FROM pg_prepared_statements
             WHERE NOT from_sql AND name ~ '^s[0-9]+$'",
        )
        .await
        .unwrap();
    let last: usize = named
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
            _ => None,
        })
        .expect("the statement just prepared is listed");
    drop(tx);
    let plant: String = (last + 1..last + 5_000)
        .map(|n| format!("PREPARE s{n} AS SELECT 1;"))
        .collect();
    on_every_pooled_connection(&db, &plant).await;
    let inbox = fixtures::open(&db).await;
    fixtures::dead_letter(&inbox, "b").await;
    assert_eq!(
        fixtures::detail(&inbox, "b").await.deliveries[0].state,
        "dead"
    );
}

/// A node behind PgBouncer in transaction mode without `database_pooler` keeps statements
/// prepared that the pooler runs on other server connections: what fails for it (its start, or
/// its accepts) fails as the database unavailable (503, never a 500), saying what to set, and
/// nothing it acknowledged is missing. To make the loss certain, the statements are deallocated
/// on every server connection of the pool (PgBouncer's `default_pool_size` is 4 in
/// `.ci/pgbouncer.sh`) once each of the node's connections has prepared its accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_transaction_pooler_without_the_setting_is_told_what_to_set() {
    let Some(db) = TestDatabase::behind_pooler().await else {
        return;
    };
    let options = OpenOptions {
        writer: WriterOptions::new(Durability::Normal),
        clock: Clock::system(),
        pooler: Pooler::None,
    };
    let said = |e: &InboxError| {
        matches!(e, InboxError::Unavailable(_))
            && e.to_string().contains("database_pooler = \"transaction\"")
    };
    let inbox = match Inbox::open_postgres(db.url(), options).await {
        Ok(inbox) => inbox,
        Err(e) => {
            assert!(
                e.to_string().contains("database_pooler = \"transaction\""),
                "{e}"
            );
            return;
        }
    };
    // Whether `id` was accepted; a refusal must say what to set.
    let accept = async |id: &str| -> bool {
        let accepted = inbox
            .accept(
                fixtures::SOURCE.into(),
                event(id),
                fixtures::request(),
                vec![],
                None,
            )
            .await;
        accepted.map_err(|e| assert!(said(&e), "{e}")).is_ok()
    };
    let mut stored = Vec::new();
    for i in 0..64 {
        let id = format!("before-{i}");
        if accept(&id).await {
            stored.push(id);
        }
    }
    on_every_pooled_connection(&db, "DEALLOCATE ALL").await;
    let mut refused = 0;
    for i in 0..16 {
        let id = format!("after-{i}");
        if accept(&id).await {
            stored.push(id);
        } else {
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "every accept went through with its statements deallocated"
    );
    let checked = fixtures::open(&db).await;
    for id in stored {
        let detail = checked
            .event_detail(fixtures::SOURCE.into(), id.clone())
            .await
            .unwrap();
        assert!(detail.is_some(), "{id} was acknowledged, so it is stored");
    }
}

/// A replay selects its deliveries, then sets them due. A discard of a selected one that commits
/// in between (here: on another connection, holding the row until the replay's update waits on
/// it) wins: the update re-checks the state it selected, so the discarded delivery stays
/// discarded and is never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_discarded_while_a_replay_selected_it_stays_discarded() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    fixtures::dead_letter(&inbox, "x").await;
    let mut other = testdb::connect(db.url()).await;
    let discard = other.transaction().await.unwrap();
    discard
        .execute("UPDATE deliveries SET state = 'discarded'", &[])
        .await
        .unwrap();
    let replay = tokio::spawn({
        let inbox = inbox.clone();
        async move {
            let dead = crate::inbox::ReplayFilter {
                limit: 100,
                ..Default::default()
            };
            inbox.replay(dead).await.unwrap()
        }
    });
    wait_for_a_lock_wait(&db).await;
    discard.commit().await.unwrap();
    let (matched, replayed) = replay.await.unwrap();
    let delivery = fixtures::detail(&inbox, "x").await.deliveries[0].clone();
    assert_eq!(
        (matched, replayed, delivery.state.as_str()),
        (1, 0, "discarded")
    );
}

/// Runs `sql` (by the simple protocol) on every server connection of PgBouncer's pool for
/// `db` (`default_pool_size` is 4 in `.ci/pgbouncer.sh`): in four transactions open at once, so
/// each holds one of them.
async fn on_every_pooled_connection(db: &TestDatabase, sql: &str) {
    let mut clients = Vec::new();
    for _ in 0..4 {
        let client = testdb::connect(db.url()).await;
        client.batch_execute("BEGIN").await.unwrap();
        client.batch_execute(sql).await.unwrap();
        clients.push(client);
    }
    for client in &clients {
        client.batch_execute("COMMIT").await.unwrap();
    }
}

/// Returns once a statement on `db` waits for a row lock (within 30 s, or panics).
async fn wait_for_a_lock_wait(db: &TestDatabase) {
    let watcher = testdb::connect(db.url()).await;
    let waiting = async {
        loop {
            let row = watcher
                .query_one(
                    "SELECT COUNT(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            if row.get::<_, i64>(0) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("a statement waits on another transaction's lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_after_another_node_reclaimed_its_lease_is_lost_and_writes_no_state() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let [worker, reclaimer] = nodes(&db).await;
    let claimed = lease(&worker, "a").await;
    let expired = claimed.leased_at_ms + crate::inbox::DEFAULT_LEASE_MS + 1;
    let retry = move |_: &str, _: u32| Disposition::RetryAt { at_ms: expired };
    reclaimer.reclaim_expired(expired, retry).await.unwrap();
    let late = worker.finish(done(&claimed, write_new("k", 1))).await;
    assert_eq!(
        (
            late.unwrap(),
            worker.state_stat_blocking(HANDLER, "k").unwrap()
        ),
        (Finished::LeaseLost, (None, 0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_concurrent_writers_of_one_key_one_conflicts_and_the_other_is_kept() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let nodes = nodes(&db).await;
    // Several rounds, each a pair of attempts that read one new key and write it at once.
    for round in 0..5u8 {
        let key = format!("k{round}");
        let a = lease(&nodes[0], &format!("a{round}")).await;
        let b = lease(&nodes[0], &format!("b{round}")).await;
        let (first, second) = tokio::join!(
            nodes[0].finish(done(&a, write_new(&key, 1))),
            nodes[1].finish(done(&b, write_new(&key, 2))),
        );
        let (first, second) = (first.unwrap(), second.unwrap());
        let kept = match (&first, &second) {
            (Finished::Recorded, Finished::Conflict) => 1,
            (Finished::Conflict, Finished::Recorded) => 2,
            other => panic!("round {round}: one commits and one conflicts, not {other:?}"),
        };
        let (value, _) = nodes[1].state_get_blocking(HANDLER, &key).unwrap();
        assert_eq!(value, Some(vec![kept]), "round {round}");
        // The conflicted one is due again; run it out of the way for the next round.
        let again = fixtures::claim(&nodes[0], LEASED_MS + 5).await.remove(0);
        nodes[0]
            .finish(finished(&again, Disposition::Dead))
            .await
            .unwrap();
    }
    let usage = nodes[0].state_usage_blocking(HANDLER).unwrap();
    assert_eq!(usage.keys, 5, "every kept write is counted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_by_two_nodes_at_once_both_succeed() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let (first, second) = tokio::join!(
        PostgresStore::connect(db.url(), 2, Pooler::None),
        PostgresStore::connect(db.url(), 2, Pooler::None)
    );
    first.unwrap();
    second.unwrap();
    assert_eq!(recorded_version(&db).await, MIGRATIONS.len() as i64);
}

/// The current schema version of `db`.
async fn recorded_version(db: &TestDatabase) -> i64 {
    testdb::connect(db.url())
        .await
        .query_one("SELECT version FROM hookd_schema", &[])
        .await
        .unwrap()
        .get(0)
}

/// A node that waited for another's migrations reads what they committed, even where the
/// database's default isolation would have kept its snapshot from before the wait (and failed
/// it with `could not serialize access`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_waiting_for_anothers_migration_starts_whatever_the_default_isolation() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    db.set_default("default_transaction_isolation", "repeatable read")
        .await;
    let mut other = testdb::connect(db.url()).await;
    let holder = other.transaction().await.unwrap();
    holder
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .unwrap();
    let url = db.url().to_owned();
    let waiting =
        tokio::spawn(async move { PostgresStore::connect(&url, 1, Pooler::None).await.is_ok() });
    let watcher = testdb::connect(db.url()).await;
    loop {
        let queued: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if queued > 0 {
            break;
        }
        assert!(!waiting.is_finished(), "the node did not wait for the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What the other node's first migration step commits while this one waits.
    holder
        .batch_execute(
            "CREATE TABLE hookd_schema (one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), \
             version BIGINT NOT NULL); INSERT INTO hookd_schema (version) VALUES (0)",
        )
        .await
        .unwrap();
    holder.commit().await.unwrap();
    assert!(waiting.await.unwrap(), "the waiting node failed to start");
    assert_eq!(recorded_version(&db).await, MIGRATIONS.len() as i64);
}

/// Every transaction, whichever way it is sent, runs at `READ COMMITTED`, the level the
/// store's statements are written for, whatever the database's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transaction_is_read_committed_whatever_the_default_isolation() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    db.set_default("default_transaction_isolation", "serializable")
        .await;
    let level = "SELECT current_setting('transaction_isolation')";
    // Outside a transaction: hookd's own session setting, unless the URL's options set one.
    let store = PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
    let conn = store.client().await.unwrap();
    let outside: String = conn.plain().query_one(level, &[]).await.unwrap().get(0);
    assert_eq!(outside, "read committed");
    let url = format!(
        "{}{}options=-c%20default_transaction_isolation%3Dserializable",
        db.url(),
        if db.url().contains('?') { '&' } else { '?' }
    );
    let store = PostgresStore::connect(&url, 1, Pooler::None).await.unwrap();
    let mut conn = store.client().await.unwrap();
    let outside: String = conn.plain().query_one(level, &[]).await.unwrap().get(0);
    assert_eq!(outside, "serializable", "the URL's own setting is kept");
    // Inside one, whichever way it is begun: `READ COMMITTED` all the same.
    for begin in [statements::BEGIN, super::BEGIN_GENERIC] {
        let rows = conn.in_one_round_trip(begin, level, &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, String>(0), "read committed", "{begin}");
    }
    let tx = conn.transaction().await.unwrap();
    let inside: String = tx.query_one(level, &[]).await.unwrap().get(0);
    assert_eq!(inside, "read committed");
}

/// A setting of the URL's `options` is recognised by its exact name, however it is written, so
/// hookd's own is sent unless the URL sets that very one (`jit_above_cost` once kept `jit=off`
/// from being sent).
#[test]
fn a_urls_option_is_recognised_by_its_exact_name() {
    for (options, jit) in [
        ("-c jit=on", true),
        ("-cjit=on", true),
        ("--jit=on", true),
        ("-c statement_timeout=5s -c jit=on", true),
        ("-c jit_above_cost=0", false),
        ("-c jit_provider=llvmjit --enable-seqscan=off", false),
        ("", false),
    ] {
        assert_eq!(super::sets_option(options, "jit"), jit, "{options}");
    }
    assert!(super::sets_option(
        "--default-transaction-isolation=serializable",
        "default_transaction_isolation"
    ));
}

/// No statement of hookd's is compiled by PostgreSQL's JIT, whatever the database asks (here:
/// JIT for every plan): outside a transaction and in the claim's and the finish's transactions,
/// and those also behind a pooler in transaction mode, to which no session setting can be sent.
/// With JIT, a claim behind a large backlog spent 17–400 ms compiling a statement that runs in
/// under 1 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_of_hookds_is_jit_compiled_whatever_the_database_asks() {
    let explain = "EXPLAIN ANALYZE SELECT sum(x) FROM generate_series(1, 10) x";
    let compiled = |rows: Vec<tokio_postgres::Row>| {
        rows.iter()
            .any(|row| row.get::<_, String>(0).trim_start().starts_with("JIT:"))
    };
    for (db, pooler) in [
        (TestDatabase::fresh().await, Pooler::None),
        (TestDatabase::behind_pooler().await, Pooler::Transaction),
    ] {
        let Some(db) = db else {
            return;
        };
        db.set_default("jit", "on").await;
        db.set_default("jit_above_cost", "0").await;
        let other = testdb::connect(db.url()).await;
        let available: bool = other
            .query_one("SELECT pg_jit_available()", &[])
            .await
            .unwrap()
            .get(0);
        if !available {
            println!("skipped: this PostgreSQL server has no JIT");
            return;
        }
        let rows = other.query(explain, &[]).await.unwrap();
        assert!(
            compiled(rows),
            "another client's statement is compiled here"
        );
        let store = PostgresStore::connect(db.url(), 1, pooler).await.unwrap();
        let mut conn = store.client().await.unwrap();
        if pooler == Pooler::None {
            let rows = conn.plain().query(explain, &[]).await.unwrap();
            assert!(!compiled(rows), "outside a transaction");
        }
        let rows = conn
            .in_one_round_trip(super::BEGIN_GENERIC, explain, &[])
            .await
            .unwrap();
        assert!(!compiled(rows), "a finish's batch ({pooler:?})");
        let tx = conn.transaction().await.unwrap();
        super::generic_plans(&tx).await.unwrap();
        let rows = tx.plain().query(explain, &[]).await.unwrap();
        assert!(!compiled(rows), "a claim ({pooler:?})");
    }
}

/// Learning a statement's types behind a pooler in transaction mode, a caller that gives up
/// waiting (here: the `PREPARE` waits for a lock) leaves its connection in no transaction: once
/// the server gets to it, the connection is idle, and what it runs next commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_description_given_up_leaves_no_transaction_open() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let store = PostgresStore::connect(db.url(), 1, Pooler::Transaction)
        .await
        .unwrap();
    let conn = store.client().await.unwrap();
    let pid: i32 = conn
        .plain()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let locker = testdb::connect(db.url()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let sql = "SELECT count(*) FROM events WHERE id > $1";
    let given_up =
        tokio::time::timeout(Duration::from_millis(500), conn.query_one(sql, &[&0_i64])).await;
    assert!(given_up.is_err(), "the description waited for the lock");
    locker.batch_execute("COMMIT").await.unwrap();
    let state = async {
        loop {
            let state: Option<String> = locker
                .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
                .await
                .unwrap()
                .get(0);
            if state.as_deref() != Some("active") {
                return state;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let state = tokio::time::timeout(Duration::from_secs(10), state)
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("idle"));
    // The connection goes on: its next statement runs, and nothing is left prepared.
    let count: i64 = conn.query_one(sql, &[&0_i64]).await.unwrap().get(0);
    assert_eq!(count, 0);
    let prepared: i64 = conn
        .plain()
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'hookd_describe_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(prepared, 0);
}

/// A database at the latest version is only read at start-up: a role that may read and write
/// rows but create nothing (the schema migrated by its owner) starts hookd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_database_starts_for_a_role_that_may_create_nothing() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    fixtures::open(&db).await.close();
    let owner = testdb::connect(db.url()).await;
    owner
        .batch_execute("REVOKE CREATE ON SCHEMA public FROM pg_database_owner, PUBLIC")
        .await
        .unwrap();
    let refused = owner
        .batch_execute("CREATE TABLE IF NOT EXISTS hookd_schema (one BOOLEAN)")
        .await;
    assert!(refused.is_err(), "the role may still create tables");
    PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
    assert_eq!(recorded_version(&db).await, MIGRATIONS.len() as i64);
}

/// A role that may not do all a node does (here: delete quarantined requests, draw state
/// versions) is refused at start-up, each missing privilege named; it used to start and fail
/// later, a plugin's state never committing and its attempt run again as after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_privileges_a_node_needs_is_refused_at_start_naming_them() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    fixtures::open(&db).await.close();
    let owner = testdb::connect(db.url()).await;
    owner
        .batch_execute(
            "REVOKE DELETE ON quarantine FROM CURRENT_USER;
             REVOKE USAGE, UPDATE ON SEQUENCE plugin_state_versions FROM CURRENT_USER",
        )
        .await
        .unwrap();
    let Err(e @ InboxError::MissingPrivileges { .. }) =
        PostgresStore::connect(db.url(), 1, Pooler::None).await
    else {
        panic!("a role without DELETE and USAGE started");
    };
    assert!(
        e.to_string()
            .contains("it lacks plugin_state_versions (USAGE), quarantine (DELETE) ("),
        "{e}"
    );
    // What no statement needs is not asked for (attempts are never updated), and a sequence
    // is drawn from with UPDATE as well as with USAGE.
    owner
        .batch_execute(
            "GRANT DELETE ON quarantine TO CURRENT_USER;
             GRANT UPDATE ON SEQUENCE plugin_state_versions TO CURRENT_USER;
             REVOKE UPDATE ON attempts FROM CURRENT_USER",
        )
        .await
        .unwrap();
    PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_a_newer_hookd_is_refused() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    fixtures::open(&db).await.close();
    testdb::connect(db.url())
        .await
        .execute("UPDATE hookd_schema SET version = 999", &[])
        .await
        .unwrap();
    let refused = PostgresStore::connect(db.url(), 1, Pooler::None).await;
    assert!(
        matches!(refused, Err(InboxError::SchemaTooNew { found: 999, .. })),
        "{:?}",
        refused.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_reclaim_is_refused_on_a_shared_database() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    lease(&inbox, "a").await;
    let refused = inbox.reclaim_all_at_startup(|_, _| Disposition::Dead).await;
    assert!(
        matches!(refused, Err(InboxError::NotSingleNode)),
        "{refused:?}"
    );
}

/// Options for an inbox opened directly (not through the test database).
fn options() -> OpenOptions {
    OpenOptions {
        writer: WriterOptions::new(Durability::Normal),
        clock: Clock::system(),
        pooler: Pooler::None,
    }
}

/// `e` as a user and a log see it: its message and its debug form.
fn shown(e: &InboxError) -> String {
    format!("{e} {e:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_auth_failed_and_never_show_the_password() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let url = db.url_with_password("wrong-s3cret-password");
    let Err(e) = Inbox::open_postgres(&url, options()).await else {
        panic!("a wrong password must be refused");
    };
    assert!(
        matches!(e, InboxError::AuthFailed { .. }) && !shown(&e).contains("s3cret"),
        "{}",
        shown(&e)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unreachable_and_never_shows_the_password() {
    // Port 1 on the loopback: nothing listens there, no server is needed.
    let url = "postgres://hookd:s3cret-password@127.0.0.1:1/hookd?connect_timeout=2";
    let Err(e) = Inbox::open_postgres(url, options()).await else {
        panic!("nothing listens on port 1");
    };
    assert!(
        matches!(e, InboxError::Unreachable { .. }) && !shown(&e).contains("s3cret"),
        "{}",
        shown(&e)
    );
}

/// How the sessions named `application` connect to `db`'s database: how many use TLS and how
/// many do not, as the server sees them.
async fn sessions_by_tls(client: &tokio_postgres::Client, application: &str) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
             FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_database_is_what_sslmode_and_sslrootcert_ask() {
    let Some((db, _inbox, client)) = store_and_client().await else {
        return;
    };
    let ca = testdb::server_ca().expect("the test server's CA is given with its URL");
    let by_name = db.url().replacen("@127.0.0.1:", "@localhost:", 1);
    assert_ne!(by_name, db.url(), "the test server is at 127.0.0.1");
    let ca_query = format!(
        "sslrootcert={}",
        percent_encoding::utf8_percent_encode(&ca, percent_encoding::NON_ALPHANUMERIC)
    );
    // (URL, TLS sessions expected) for each that connects; the listener and the pool's
    // connections all count.
    for (i, (url, tls)) in [
        (format!("{by_name}?sslmode=verify-full&{ca_query}"), true),
        (format!("{}?sslmode=verify-ca&{ca_query}", db.url()), true),
        (format!("{}?sslmode=require", db.url()), true),
        (format!("{}?sslmode=require&{ca_query}", db.url()), true),
        // libpq's default, `prefer`: TLS when the server offers it.
        (db.url().to_owned(), true),
        (format!("{}?sslmode=disable", db.url()), false),
    ]
    .into_iter()
    .enumerate()
    {
        let application = format!("hookd_tls_{i}");
        let url = format!(
            "{url}{}application_name={application}",
            if url.contains('?') { "&" } else { "?" }
        );
        let inbox = Inbox::open_postgres(&url, options())
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        inbox.oldest_due().await.unwrap();
        let (encrypted, plain) = sessions_by_tls(&client, &application).await;
        if tls {
            assert!(
                encrypted >= 1 && plain == 0,
                "{url}: {encrypted} TLS, {plain} plain"
            );
        } else {
            assert!(
                encrypted == 0 && plain >= 1,
                "{url}: {encrypted} TLS, {plain} plain"
            );
        }
        inbox.close();
    }
    // Refused: the name is not the certificate's, or the CA is not trusted.
    for (url, says) in [
        (
            format!("{}?sslmode=verify-full&{ca_query}", db.url()),
            "not valid for name",
        ),
        (format!("{by_name}?sslmode=verify-full"), "UnknownIssuer"),
        (format!("{by_name}?sslmode=verify-ca"), "UnknownIssuer"),
    ] {
        let Err(e) = Inbox::open_postgres(&url, options()).await else {
            panic!("{url}: connected");
        };
        let shown = shown(&e);
        assert!(
            matches!(e, InboxError::Unreachable { .. })
                && shown.contains(says)
                && !shown.contains("hookd:hookd@"),
            "{url}: {shown}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_url_is_invalid_and_never_shows_the_password() {
    let url = "postgres://hookd:s3cret-password@127.0.0.1:port/hookd";
    let Err(e) = Inbox::open_postgres(url, options()).await else {
        panic!("a port must be a number");
    };
    assert!(
        matches!(e, InboxError::InvalidUrl { .. }) && !shown(&e).contains("s3cret"),
        "{}",
        shown(&e)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_of_work_on_one_node_wakes_another() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let [a, b] = nodes(&db).await;
    let mut waiting = Box::pin(b.store().work_notified());
    let early = tokio::time::timeout(Duration::from_millis(200), &mut waiting).await;
    assert!(early.is_err(), "nothing was notified yet");
    a.store().notify_work().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("b hears a's notice");
}

/// Waits until `inbox` has no wake-up left over (a permit stored while nobody waited).
async fn no_wake_up_pending(inbox: &Inbox) {
    while tokio::time::timeout(Duration::from_millis(300), inbox.work_arrived())
        .await
        .is_ok()
    {}
}

/// Whether `action` on one node wakes `other`'s dispatcher within a few seconds.
async fn wakes(other: &Inbox, action: impl Future<Output = ()>) -> bool {
    no_wake_up_pending(other).await;
    let woken = other.work_arrived();
    action.await;
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_and_a_finish_on_one_node_wake_the_other() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let [a, b] = nodes(&db).await;
    // Told by the accept's and the finish's own transactions, as they commit: no notice of
    // their own is sent for them.
    let accepted = wakes(&b, async {
        assert_eq!(fixtures::accept(&a, event("e1")).await, Accepted::New);
    })
    .await;
    assert!(accepted, "an accept on a wakes b");
    let claim = lease(&a, "e1").await;
    let finished = wakes(&b, async {
        let record = finished(&claim, Disposition::Done { output: None });
        assert_eq!(a.finish(record).await.unwrap(), Finished::Recorded);
    })
    .await;
    assert!(finished, "a finish on a wakes b");
    // A finish that commits plugin state has a transaction of its own.
    fixtures::accept(&a, event("e2")).await;
    let claim = lease(&a, "e2").await;
    let committed = wakes(&b, async {
        let record = done(&claim, write_new("k", 1));
        assert_eq!(a.finish(record).await.unwrap(), Finished::Recorded);
    })
    .await;
    assert!(committed, "a finish writing state on a wakes b");
}

/// The one-event path (a batch's fallback, when the shared statement was refused) notifies in
/// its own transaction too: nothing else tells the other nodes of the event it stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_on_the_one_event_path_wakes_the_other_node() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let a = PostgresStore::connect(db.url(), 2, Pooler::None)
        .await
        .unwrap();
    let b = fixtures::open(&db).await;
    let woken = wakes(&b, async {
        let new = crate::inbox::store::NewEvent {
            source: crate::ids::SourceName::new(fixtures::SOURCE),
            envelope: event("e1"),
            request: fixtures::request(),
            handlers: vec![crate::ids::PluginName::new(HANDLER)],
            body_sha256: None,
            from_quarantine: None,
            now_ms: fixtures::RECEIVED_MS,
        };
        let accepted = super::accept::one(&a.connections, &a.commits, &new).await;
        assert_eq!(accepted.unwrap(), Accepted::New);
    })
    .await;
    assert!(woken, "a one-event accept wakes the other node");
}

/// Accepts `n` events without a key on `inbox`, 200 at a time.
async fn accept_many(inbox: &Inbox, n: usize) {
    for start in (0..n).step_by(200) {
        let accepts: Vec<_> = (start..n.min(start + 200))
            .map(|i| {
                let inbox = inbox.clone();
                tokio::spawn(async move { fixtures::accept(&inbox, event(&format!("e{i}"))).await })
            })
            .collect();
        for accept in accepts {
            assert_eq!(accept.await.unwrap(), Accepted::New);
        }
    }
}

/// A database that refuses new connections while hookd runs (taken offline: `ALLOW_CONNECTIONS
/// false`, a server error of no connection class) is the server away: an accept is
/// `Unavailable` (a 503; an attempt's record is sent again), not a storage error (a 500, and
/// the record given up, so the attempt ran again after its lease). Once it takes them again,
/// so does the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_new_connections_is_the_server_away() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    fixtures::accept(&inbox, event("before")).await;
    db.refuse_connections(true).await;
    // The first tries meet the pooled connections the server ended; the later ones, new
    // connections it refuses.
    for i in 0..5 {
        let refused = inbox
            .accept(
                fixtures::SOURCE.into(),
                event(&format!("during-{i}")),
                fixtures::request(),
                vec![HANDLER.into()],
                None,
            )
            .await;
        assert!(
            matches!(&refused, Err(InboxError::Unavailable(_))),
            "try {i}: {refused:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(inbox.ready(Duration::from_secs(5)).await.is_err());
    db.refuse_connections(false).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let again = inbox
            .accept(
                fixtures::SOURCE.into(),
                event("after"),
                fixtures::request(),
                vec![HANDLER.into()],
                None,
            )
            .await;
        match again {
            Ok(accepted) => break assert_eq!(accepted, Accepted::New),
            Err(InboxError::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A database that cannot take a write for now is not a storage fault. A read-only one (a
/// failover that landed on a standby, a demoted primary) is the server away, and a statement
/// cancelled by its `statement_timeout` while a lock held it is busy: each a 503, an attempt's
/// record sent again. Before, both were a 500, and the record given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_is_away_and_a_cancelled_statement_busy() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let inbox = fixtures::open(&db).await;
    fixtures::accept(&inbox, event("before")).await;
    // New sessions take a database's defaults: end the ones the store has.
    let renew_sessions = || async {
        db.refuse_connections(true).await;
        db.refuse_connections(false).await;
    };
    // Accepts until one fails as `expected` says (the first may meet an ended session).
    let accept_until = |expected: fn(&InboxError) -> bool| {
        let inbox = &inbox;
        async move {
            for i in 0..60 {
                let result = inbox
                    .accept(
                        fixtures::SOURCE.into(),
                        event(&format!("e-{i}")),
                        fixtures::request(),
                        vec![HANDLER.into()],
                        None,
                    )
                    .await;
                match result {
                    Err(e) if expected(&e) => return,
                    Err(InboxError::Unavailable(e)) if !e.to_string().contains("read-only") => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    other => panic!("try {i}: {other:?}"),
                }
            }
            panic!("never refused as expected");
        }
    };

    db.set_default("default_transaction_read_only", "on").await;
    renew_sessions().await;
    accept_until(|e| {
        matches!(e, InboxError::Unavailable(why) if why.to_string().contains("read-only transaction"))
    })
    .await;

    db.set_default("default_transaction_read_only", "off").await;
    db.set_default("statement_timeout", "300ms").await;
    renew_sessions().await;
    let locker = testdb::connect(db.url()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    accept_until(
        |e| matches!(e, InboxError::Busy(why) if why.to_string().contains("statement timeout")),
    )
    .await;
    locker.batch_execute("ROLLBACK").await.unwrap();
}

/// A lease runs from when the database grants it: a claim that waited longer than its lease
/// (here for a lock on the events table, as behind a slow or busy server) grants a lease that
/// still has its length ahead of it. Before, the lease was measured from the claim's `now`,
/// taken before the wait, so it was over when granted, and another node took it back at once
/// while the handler ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_runs_from_when_the_claim_is_granted() {
    let Some((db, inbox, client)) = store_and_client().await else {
        return;
    };
    fixtures::accept(&inbox, event("waited")).await;
    let locker = testdb::connect(db.url()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut request = fixtures::claim_request(inbox.clock().now_ms(), 1, &[(HANDLER, 1)]);
    request.lease_ms = [(HANDLER.to_string(), 1_000)].into();
    let claiming = {
        let inbox = inbox.clone();
        tokio::spawn(async move { inbox.claim(request).await })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    locker.batch_execute("COMMIT").await.unwrap();
    let claimed = claiming.await.unwrap().unwrap();
    assert_eq!(claimed.len(), 1);
    assert_lease_ahead(&client, claimed[0].delivery_id).await;
}

/// The same when the claim waited for a connection of its pool (all busy, as under load)
/// before its transaction began, which the statement's own measure of its wait does not see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_runs_from_when_the_claim_is_granted_after_waiting_for_a_connection() {
    use crate::inbox::store::Store as _;
    let Some((db, inbox, client)) = store_and_client().await else {
        return;
    };
    fixtures::accept(&inbox, event("waited")).await;
    let store = PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
    let busy = store.client().await.unwrap();
    let mut request = fixtures::claim_request(inbox.clock().now_ms(), 1, &[(HANDLER, 1)]);
    request.lease_ms = [(HANDLER.to_string(), 1_000)].into();
    let store = Arc::new(store);
    let claiming = {
        let store = store.clone();
        tokio::spawn(async move { store.claim(request).await })
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    drop(busy);
    let claimed = claiming.await.unwrap().unwrap().leased;
    assert_eq!(claimed.len(), 1);
    assert_lease_ahead(&client, claimed[0].delivery_id).await;
}

/// Asserts that delivery `id`'s lease has more than half a second of its 1 s ahead of it, by
/// the database server's clock.
async fn assert_lease_ahead(client: &tokio_postgres::Client, id: i64) {
    let left: i64 = client
        .query_one(
            "SELECT lease_until - (extract(epoch FROM clock_timestamp()) * 1000)::int8
             FROM deliveries WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(left > 500, "the lease has {left} ms left once granted");
}

/// A relay to the server of `url` that passes everything both ways, except that once `armed`,
/// the next `COMMIT` a client sends is passed on and its connection then cut before the answer
/// comes back: the server commits, the client never hears so. Returns `url` through the relay
/// (without TLS, so the relay can read the messages).
async fn relay_losing_a_commits_answer(url: &str, armed: Arc<AtomicBool>) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (head, rest) = url.split_once('@').unwrap();
    let (server, path) = rest.split_once('/').unwrap();
    let upstream: std::net::SocketAddr = server.parse().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let cut = Arc::new(AtomicBool::new(false));
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let armed = armed.clone();
            let cutting = cut.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                    let commit = buf[..n].windows(7).any(|w| w == b"COMMIT\0");
                    if commit && armed.swap(false, Ordering::SeqCst) {
                        cutting.store(true, Ordering::SeqCst);
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if cutting.load(Ordering::SeqCst) {
                        // Let the server commit, then drop both halves unanswered.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                    if cut.load(Ordering::SeqCst)
                        || client_write.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    format!("{head}@{relay}/{path}?sslmode=disable")
}

/// A claim whose `COMMIT` was carried out but never answered (the connection lost as it was
/// sent) runs the leases it took: the database is asked whether the claim's transaction
/// committed. Before, the claim failed, and its leases stood with no worker until they expired
/// and were taken back as abandoned (an at-most-once delivery dead-lettered that never ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_commit_went_unanswered_runs_what_it_leased() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let armed = Arc::new(AtomicBool::new(false));
    let url = relay_losing_a_commits_answer(db.url(), armed.clone()).await;
    let inbox = Inbox::open_postgres(&url, options()).await.unwrap();
    fixtures::accept(&inbox, event("unanswered")).await;
    armed.store(true, Ordering::SeqCst);
    let request = fixtures::claim_request(inbox.clock().now_ms(), 1, &[(HANDLER, 1)]);
    let claimed = inbox.claim(request).await.expect("the claim committed");
    assert!(!armed.load(Ordering::SeqCst), "no COMMIT was cut");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].event_id.as_str(), "unanswered");
    assert_eq!(fixtures::state_of(&inbox, "unanswered").await, "running");
    // And it is this claim's to finish: its lease token holds.
    let recorded = inbox
        .finish(finished(&claimed[0], Disposition::Done { output: None }))
        .await
        .unwrap();
    assert_eq!(recorded, Finished::Recorded);
    inbox.close();
}

/// A failed statement's error says what the server said, not only "db error" (which is all a
/// `tokio_postgres::Error` shows of itself): the dispatcher's and the pruner's log lines print
/// the error's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_statement_says_what_the_server_said() {
    let Some((_db, _inbox, client)) = store_and_client().await else {
        return;
    };
    let e = client
        .execute("SELECT * FROM no_such_table", &[])
        .await
        .unwrap_err();
    let text = InboxError::from(e).to_string();
    assert!(
        text.starts_with("storage error: db error: ERROR: ")
            && text.contains(r#"relation "no_such_table" does not exist"#),
        "{text}"
    );
}

/// A fresh database, a store open on it, and a client of its own (`None` without a server).
async fn store_and_client() -> Option<(TestDatabase, Inbox, tokio_postgres::Client)> {
    let db = TestDatabase::fresh().await?;
    let inbox = fixtures::open(&db).await;
    let client = testdb::connect(db.url()).await;
    Some((db, inbox, client))
}

/// PostgreSQL's plan for `sql` (`EXPLAIN`), one node per line.
async fn plan_of(client: &tokio_postgres::Client, sql: &str) -> String {
    let lines: Vec<String> = client
        .query(&format!("EXPLAIN {sql}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    lines.join("\n")
}

/// What the planner believes and how often `table` was analyzed (by anyone).
async fn statistics_of(client: &tokio_postgres::Client, table: &str) -> (f32, i64) {
    let row = client
        .query_one(
            "SELECT c.reltuples, s.analyze_count + s.autoanalyze_count
             FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
             WHERE c.relname = $1",
            &[&table],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_that_outgrew_their_statistics_are_analyzed_on_a_small_sample_and_then_left_alone() {
    let Some((_db, inbox, client)) = store_and_client().await else {
        return;
    };
    // Autovacuum would analyze them too, some time within its minute: only the store may here.
    client
        .batch_execute(
            "ALTER TABLE deliveries SET (autovacuum_enabled = false);
             ALTER TABLE events SET (autovacuum_enabled = false)",
        )
        .await
        .unwrap();
    accept_many(&inbox, 1_500).await;
    // The store looks every second (the statistics system's counts lag by about as much).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Both tables, each analyzed on its own (one may be seen before the other).
    let analyzed = loop {
        let (believed, analyzes) = statistics_of(&client, "deliveries").await;
        let (events, _) = statistics_of(&client, "events").await;
        if believed >= 1_500.0 && events >= 1_500.0 {
            break analyzes;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "deliveries still believed to hold {believed} rows, events {events}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // On a small sample: 1 500 distinct event ids, a histogram of at most 11 bounds (the
    // server's default target would have made it 101), and the server's default untouched.
    let bounds: i32 = client
        .query_one(
            "SELECT array_length(histogram_bounds, 1) FROM pg_stats
             WHERE tablename = 'events' AND attname = 'event_id'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        bounds <= 11,
        "the store's analysis drew {bounds} histogram bounds"
    );
    let target: String = client
        .query_one("SHOW default_statistics_target", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(target, "100");
    // At a steady size the statistics stay as they are.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(statistics_of(&client, "deliveries").await.1, analyzed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_locks_its_candidates_by_primary_key_whatever_the_statistics_say() {
    let Some((_db, inbox, client)) = store_and_client().await else {
        return;
    };
    accept_many(&inbox, 2_000).await;
    // Statistics taken while nothing waited, then 2 000 deliveries waiting: what a busy
    // database looks like between two analyzes.
    client
        .batch_execute(
            "UPDATE deliveries SET state = 'done';
             ANALYZE deliveries;
             UPDATE deliveries SET state = 'pending';
             SET plan_cache_mode = force_generic_plan",
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!("PREPARE lock AS {}", *super::lease::LOCK_SQL))
        .await
        .unwrap();
    let plan = plan_of(
        &client,
        "EXECUTE lock(ARRAY[1990, 1995, 2000]::bigint[], 9000000000000000, 3)",
    )
    .await;
    // By primary key, as an index scan or a bitmap of it (the planner may pick either), and
    // through no other index.
    assert!(plan.contains("deliveries_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    let other_index = plan
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .find(|word| word.starts_with("deliveries_") && *word != "deliveries_pkey");
    assert_eq!(other_index, None, "{plan}");
}

/// A claim reads the first window of every handler in one statement: per handler, a range of
/// the waiting index read in order as far as its window, never a scan of every delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_first_windows_are_one_range_of_the_waiting_index_per_handler() {
    let Some((_db, inbox, client)) = store_and_client().await else {
        return;
    };
    accept_many(&inbox, 2_000).await;
    client
        .batch_execute(&format!(
            "ANALYZE deliveries;
             SET plan_cache_mode = force_generic_plan;
             PREPARE windows AS {}",
            *super::lease::WINDOWS_SQL
        ))
        .await
        .unwrap();
    let plan = plan_of(
        &client,
        &format!(
            "EXECUTE windows(ARRAY['{HANDLER}', 'parser'], 9000000000000000, ARRAY[36, 36]::bigint[], ARRAY[]::bigint[])"
        ),
    )
    .await;
    assert!(plan.contains("deliveries_waiting"), "{plan}");
    assert!(!plan.contains("Seq Scan on deliveries"), "{plan}");
    let rows = client
        .query(
            &format!(
                "EXECUTE windows(ARRAY['parser', '{HANDLER}'], 9000000000000000, ARRAY[5, 3]::bigint[], ARRAY[]::bigint[])"
            ),
            &[],
        )
        .await
        .unwrap();
    let lanes: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(
        lanes,
        [2, 2, 2],
        "three of {HANDLER}'s, none of the parser's"
    );
}

/// A filter by provider event id alone probes the dedupe index once per stored source (there is
/// no index on the event id by itself, so accepts write one index fewer), and finds the event in
/// every source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_id_is_found_by_probes_of_the_dedupe_index() {
    let Some((_db, inbox, client)) = store_and_client().await else {
        return;
    };
    client
        .batch_execute(
            "INSERT INTO events (source, event_id, event_type, received_at, headers, body)
             SELECT (ARRAY['a', 'b', 'c'])[n % 3 + 1], 'e' || (n / 3), 't', n, '[]', ''
             FROM generate_series(0, 8999) AS n;
             ANALYZE events;",
        )
        .await
        .unwrap();
    let filter = |event_id: &str| crate::inbox::EventFilter {
        event_id: Some(event_id.into()),
        limit: 50,
        ..Default::default()
    };
    let (page, values) = super::views::page_ids(&filter("e7"));
    // Every parameter is the event id.
    let page = (1..=values.len())
        .rev()
        .fold(page, |sql, n| sql.replace(&format!("${n}"), "'e7'"));
    let plan = plan_of(&client, &page).await;
    assert!(plan.contains("events_source_event_id_key"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
    let found = inbox.list_events(filter("e7")).await.unwrap();
    let mut sources: Vec<_> = found.iter().map(|e| e.source.as_str()).collect();
    sources.sort();
    assert_eq!(sources, ["a", "b", "c"]);
    assert!(inbox.list_events(filter("nope")).await.unwrap().is_empty());
}

/// A claim's stale check on a key reads that key's entries alone, whatever the other keys and
/// states hold: each part a range of a partial index (`done` ones, and replayed ones), never a
/// scan of every delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_newest_handled_sequence_is_read_from_the_keys_own_entries() {
    let Some((_db, _inbox, client)) = store_and_client().await else {
        return;
    };
    // 20 000 keyed deliveries over 1 000 keys (key `k{n % 1000}`, sequence `n`), done, dead,
    // discarded or waiting by turns (`n / 1000`), one in five of them replayed (a
    // `budget_base`), with an `ok` attempt each.
    client
        .batch_execute(
            "INSERT INTO events (source, event_id, event_type, received_at, headers, body)
             SELECT 's', 'e' || n, 't', n, '[]', '' FROM generate_series(1, 20000) AS n;
             INSERT INTO deliveries (event, source, handler, state, next_attempt_at, updated_at,
                                     ordering_key, sequence, attempts, budget_base)
             SELECT n, 's', 'h',
                    (ARRAY['done', 'dead', 'discarded', 'pending'])[(n / 1000) % 4 + 1], n, n,
                    'k' || (n % 1000), n, 1, CASE WHEN (n / 1000) % 5 = 4 THEN 1 ELSE 0 END
             FROM generate_series(1, 20000) AS n;
             INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome)
             SELECT id, 1, 0, 1, 'ok' FROM deliveries;
             ANALYZE events; ANALYZE deliveries; ANALYZE attempts;
             SET plan_cache_mode = force_generic_plan;",
        )
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "PREPARE newest(text, text, text) AS {}",
            super::lease::NEWEST_HANDLED
        ))
        .await
        .unwrap();
    let plan = plan_of(&client, "EXECUTE newest('s', 'h', 'k485')").await;
    assert!(plan.contains("deliveries_done_sequence"), "{plan}");
    assert!(plan.contains("deliveries_once_handled"), "{plan}");
    assert!(!plan.contains("Seq Scan on deliveries"), "{plan}");
    assert!(!plan.contains("deliveries_pkey"), "{plan}");
    // Key k485: done newest at 16 485; replayed and waiting since at 19 485, which wins.
    let newest: i64 = client
        .query_one("EXECUTE newest('s', 'h', 'k485')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(newest, 19_485);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earliest_waiting_delivery_is_found_by_probes_of_the_waiting_index() {
    let Some((_db, inbox, client)) = store_and_client().await else {
        return;
    };
    // Many finished deliveries (which must not count, nor be walked), and a few waiting or
    // running ones of three handlers, at times far before and after now.
    let future = 4_000_000_000_000_i64;
    client
        .batch_execute(&format!(
            "INSERT INTO events (source, event_id, event_type, received_at, headers, body)
             SELECT 's', 'e' || n, 't', n, '[]', '' FROM generate_series(1, 6000) AS n;
             INSERT INTO deliveries (event, source, handler, state, next_attempt_at, updated_at)
             SELECT n, 's', 'h' || (n % 3), 'done', n, n FROM generate_series(1, 5990) AS n;
             INSERT INTO deliveries (event, source, handler, state, next_attempt_at, updated_at)
             VALUES (5991, 's', 'h1', 'running', 2000, 0),
                    (5992, 's', 'h2', 'pending', 5000, 0),
                    (5993, 's', 'h3', 'retrying', 3000, 0),
                    (5994, 's', 'h1', 'pending', {future} + 7, 0),
                    (5995, 's', 'h3', 'retrying', {future} + 3, 0);
             ANALYZE events; ANALYZE deliveries;"
        ))
        .await
        .unwrap();
    assert_eq!(inbox.oldest_due().await.unwrap(), Some(3000));
    let now = crate::model::unix_ms(std::time::SystemTime::now());
    assert_eq!(inbox.next_due_after(now).await.unwrap(), Some(future + 3));
    assert_eq!(
        inbox.next_due_after(future + 3).await.unwrap(),
        Some(future + 7)
    );
    assert_eq!(inbox.next_due_after(future + 7).await.unwrap(), None);

    let plan = plan_of(&client, &super::lease::OLDEST_DUE_SQL.replace("$1", "0")).await;
    assert!(plan.contains("deliveries_waiting"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// Without the URL saying otherwise, a connection gives up connecting, and notices a server
/// gone silent, in seconds; what the URL sets is kept.
#[test]
fn a_url_without_timeouts_gets_hookds_and_one_with_them_keeps_its_own() {
    let (defaults, _) =
        super::connection_config("postgres://u@db.example/hookd", Pooler::None).unwrap();
    assert_eq!(
        defaults.get_connect_timeout(),
        Some(&super::CONNECT_TIMEOUT)
    );
    assert_eq!(
        defaults.get_tcp_user_timeout(),
        Some(&super::TCP_USER_TIMEOUT)
    );
    assert_eq!(defaults.get_keepalives_idle(), super::KEEPALIVE_IDLE);
    let (own, _) = super::connection_config(
        "postgres://u@db.example/hookd?connect_timeout=3&tcp_user_timeout=5&keepalives_idle=30",
        Pooler::None,
    )
    .unwrap();
    assert_eq!(own.get_connect_timeout(), Some(&Duration::from_secs(3)));
    assert_eq!(own.get_tcp_user_timeout(), Some(&Duration::from_secs(5)));
    assert_eq!(own.get_keepalives_idle(), Duration::from_secs(30));
}

/// A session of hookd's that sits inside a transaction (its node froze, or lost its network,
/// mid-transaction) is ended by the server after 30 s, freeing its locks for the other nodes;
/// a URL that sets its own value keeps it, and behind a pooler (which refuses startup
/// options) nothing is sent. Before, such a session held its row and key locks until
/// the server's TCP keepalive gave up: two hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_idle_in_a_transaction_is_ended_by_the_server() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    async fn show(conn: &super::statements::Conn) -> String {
        let row = conn
            .plain()
            .query_one("SHOW idle_in_transaction_session_timeout", &[])
            .await
            .unwrap();
        row.get(0)
    }
    let store = PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
    assert_eq!(show(&store.client().await.unwrap()).await, "30s");
    let url = format!(
        "{}{}options=-c%20idle_in_transaction_session_timeout%3D300",
        db.url(),
        if db.url().contains('?') { '&' } else { '?' }
    );
    let store = PostgresStore::connect(&url, 1, Pooler::None).await.unwrap();
    let conn = store.client().await.unwrap();
    assert_eq!(show(&conn).await, "300ms");
    // The server does end such a session: its next statement finds it gone.
    conn.batch_execute("BEGIN").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(conn.batch_execute("SELECT 1").await.is_err());
    for pooler in [Pooler::Session, Pooler::Transaction] {
        let (pooled, _) =
            super::connection_config("postgres://u@db.example/hookd", pooler).unwrap();
        assert_eq!(pooled.get_options(), None, "{pooler:?}");
    }
}

/// Publishes file `sha` (its bytes: the name's) of plugin `h` from `store`.
async fn publish_file(
    store: &dyn crate::inbox::cluster::ClusterStore,
    sha: &str,
) -> crate::inbox::cluster::Release {
    let bytes = bytes::Bytes::from(sha.as_bytes().to_vec());
    let release = store.publish("h", sha, Some(bytes), "n").await.unwrap();
    assert_eq!(release.sha256, sha);
    release
}

/// The plugin files `db` stores, by sha256.
async fn plugin_files(db: &TestDatabase) -> Vec<String> {
    testdb::connect(db.url())
        .await
        .query("SELECT sha256 FROM plugin_files ORDER BY sha256", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A release keeps the cluster's history of its file: a new version pushes the one it
/// replaces (at most five kept, a version coming back leaving its older place), and the newest
/// earlier version coming back is a step back that drops the one it replaces. Every node reads
/// the same history, whichever node published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_one_history_of_its_file_for_every_node() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let [one, two] = nodes(&db).await;
    let (one, two) = (one.cluster().unwrap(), two.cluster().unwrap());
    let publish = async |store: &Arc<dyn crate::inbox::cluster::ClusterStore>, sha: &str| {
        publish_file(store.as_ref(), sha).await.previous
    };
    assert!(publish(&one, "a").await.is_empty());
    assert_eq!(publish(&two, "b").await, ["a"]);
    assert_eq!(publish(&one, "c").await, ["b", "a"]);
    // A step back (a rollback, or the newest earlier file written again): "c" is dropped.
    assert_eq!(publish(&two, "b").await, ["a"]);
    for sha in ["c", "d", "e", "f", "g"] {
        publish(&one, sha).await;
    }
    assert_eq!(publish(&two, "h").await, ["g", "f", "e", "d", "c"]);
    // An older version written again is new: it leaves its place and the live one is pushed.
    assert_eq!(publish(&one, "e").await, ["h", "g", "f", "d", "c"]);
    let releases = two.releases().await.unwrap();
    assert_eq!(releases[0].previous, ["h", "g", "f", "d", "c"]);
    // The files kept are the ones a release names: "a" and "b", pushed out of the history,
    // are gone; a rollback drops the one it steps back from.
    assert_eq!(plugin_files(&db).await, ["c", "d", "e", "f", "g", "h"]);
    let back = two.roll_back("h", "e", "h", "n").await.unwrap().unwrap();
    assert_eq!(back.previous, ["g", "f", "d", "c"]);
    assert_eq!(plugin_files(&db).await, ["c", "d", "f", "g", "h"]);
}

/// Deleting files no release names is housekeeping: when it cannot (a file held by another
/// transaction past the delete's lock timeout, as another node's publish holds the file it
/// names), the release moves all the same and the file waits for the next move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_whose_housekeeping_waits_on_a_lock_still_moves_the_release() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let node = fixtures::open(&db).await;
    let node = node.cluster().unwrap();
    for sha in ["a", "b", "c", "d", "e", "f"] {
        publish_file(node.as_ref(), sha).await;
    }
    // "a" leaves the history with the next publish, while another transaction holds it.
    let mut holder = testdb::connect(db.url()).await;
    let held = holder.transaction().await.unwrap();
    held.query(
        "SELECT 1 FROM plugin_files WHERE sha256 = 'a' FOR KEY SHARE",
        &[],
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(publish_file(node.as_ref(), "g").await.sha256, "g");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(plugin_files(&db).await.len(), 7, "\"a\" kept while held");
    held.rollback().await.unwrap();
    let release = publish_file(node.as_ref(), "h").await;
    assert_eq!(release.previous, ["g", "f", "e", "d", "c"]);
    assert_eq!(
        plugin_files(&db).await.len(),
        6,
        "\"a\" and \"b\" gone with the next move"
    );
}

/// A node whose role may not delete plugin files (the grants asked for before hookd deleted
/// them) still publishes: the files are kept, and nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_delete_plugin_files_keeps_them_and_publishes() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let node = fixtures::open(&db).await;
    let node = node.cluster().unwrap();
    testdb::connect(db.url())
        .await
        .batch_execute("REVOKE DELETE ON plugin_files FROM CURRENT_USER")
        .await
        .unwrap();
    for sha in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        publish_file(node.as_ref(), sha).await;
    }
    assert_eq!(plugin_files(&db).await.len(), 8);
    assert_eq!(node.releases().await.unwrap()[0].sha256, "h");
}

/// A rollback steps back only from the release it read: after another node published or
/// rolled back in between, it changes nothing (before, it published the version it had
/// picked, undoing the other node's release at once on every node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_steps_back_only_from_the_release_it_read() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let [one, two] = nodes(&db).await;
    let (one, two) = (one.cluster().unwrap(), two.cluster().unwrap());
    for sha in ["a", "b", "c"] {
        let bytes = bytes::Bytes::from(sha.as_bytes().to_vec());
        one.publish("h", sha, Some(bytes), "n").await.unwrap();
    }
    // Node two read "c" with "b" before it, then node one published "d".
    let bytes = bytes::Bytes::from_static(b"d");
    one.publish("h", "d", Some(bytes), "n").await.unwrap();
    assert_eq!(two.roll_back("h", "c", "b", "two").await.unwrap(), None);
    assert_eq!(two.releases().await.unwrap()[0].sha256, "d");
    // Read afresh: "d" steps back to "c", once.
    let back = two.roll_back("h", "d", "c", "two").await.unwrap().unwrap();
    assert_eq!(
        (back.sha256.as_str(), back.previous),
        ("c", vec!["b".to_owned(), "a".to_owned()])
    );
    assert_eq!(one.roll_back("h", "d", "c", "one").await.unwrap(), None);
}

/// A session on `url` that listens on hookd's channel as a node's listener does, then reads
/// nothing more while its connection stays up (a node frozen): its pid, its client, and its
/// connection, which the caller drives again with [`drain`] or drops to close.
async fn frozen_listener(
    url: &str,
) -> (
    i32,
    tokio_postgres::Client,
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
) {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let pid = {
        let listen = async {
            let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
            client.batch_execute("LISTEN hookd_work").await?;
            Ok::<i32, tokio_postgres::Error>(row.get(0))
        };
        tokio::pin!(listen);
        loop {
            tokio::select! {
                pid = &mut listen => break pid.unwrap(),
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => {
                    assert!(matches!(message, Some(Ok(_))), "{message:?}");
                }
            }
        }
    };
    (pid, client, connection)
}

/// Reads what `connection` is sent, as a listener that runs again does, until it closes.
async fn drain(
    connection: &mut tokio_postgres::Connection<
        tokio_postgres::Socket,
        tokio_postgres::tls::NoTlsStream,
    >,
) {
    while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
        message.unwrap();
    }
}

/// Fills the listening sessions' sockets: 3 000 notices of ~8 kB (distinct, so none is folded
/// into another), far more than a socket's buffers hold.
async fn flood_notices(client: &tokio_postgres::Client) {
    client
        .execute(
            "SELECT count(pg_notify('hookd_work', i::text || repeat('x', 7900)))
             FROM generate_series(1, 3000) i",
            &[],
        )
        .await
        .unwrap();
}

/// The pids of the listening sessions of the database `client` is on that the server is blocked
/// sending to, waiting up to 10 s for exactly `want` (sorted).
async fn blocked_listeners(client: &tokio_postgres::Client, want: &[i32]) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = client
            .query(
                "SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event = 'ClientWrite'
                   AND query = 'LISTEN hookd_work' ORDER BY pid",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        if pids == want || tokio::time::Instant::now() >= deadline {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the server has a session of pid `pid`.
async fn session_alive(client: &tokio_postgres::Client, pid: i32) -> bool {
    let sessions: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get(0);
    sessions > 0
}

/// Whether the session of pid `pid` is gone within 10 s (it exits soon after it is told to).
async fn session_ends(client: &tokio_postgres::Client, pid: i32) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while session_alive(client, pid).await {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_stops_reading_is_ended_once_seen_blocked_at_every_look_for_long() {
    let Some((db, b, client)) = store_and_client().await else {
        return;
    };
    let store = PostgresStore::connect(db.url(), 1, Pooler::None)
        .await
        .unwrap();
    let conn = store.client().await.unwrap();
    let (frozen, _frozen_client, mut connection) = frozen_listener(db.url()).await;
    let mut stuck = super::wakeup::Stuck::default();
    let (start, long) = (tokio::time::Instant::now(), Duration::from_secs(30));
    let at = |secs: u64| start + Duration::from_secs(secs);
    let look = async |stuck: &mut super::wakeup::Stuck, secs: u64| -> Vec<i32> {
        let looked = stuck.look(&conn, at(secs), long).await.unwrap();
        assert!(looked.refused.is_none(), "{:?}", looked.refused);
        looked.ended.into_iter().map(|e| e.pid).collect()
    };

    // Blocked, then reading again before it was seen so for long: never ended.
    flood_notices(&client).await;
    assert_eq!(blocked_listeners(&client, &[frozen]).await, [frozen]);
    assert!(look(&mut stuck, 0).await.is_empty());
    assert!(look(&mut stuck, 29).await.is_empty());
    let unblocked = tokio::select! {
        () = drain(&mut connection) => unreachable!("the connection stays up"),
        pids = blocked_listeners(&client, &[]) => pids,
    };
    assert!(unblocked.is_empty(), "{unblocked:?}");
    assert!(look(&mut stuck, 31).await.is_empty(), "it reads again");
    // Blocked again: its time counts from this look, not from the first.
    flood_notices(&client).await;
    assert_eq!(blocked_listeners(&client, &[frozen]).await, [frozen]);
    assert!(look(&mut stuck, 32).await.is_empty());
    assert!(look(&mut stuck, 61).await.is_empty());
    assert!(session_alive(&client, frozen).await);
    assert_eq!(look(&mut stuck, 62).await, [frozen]);
    assert!(
        session_ends(&client, frozen).await,
        "the frozen listener is ended"
    );
    // The frozen node learns it when it runs again (its connection ends, with an error or
    // closed, after what was sent before), and would listen anew.
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {}
    })
    .await
    .expect("the ended session's connection ends");
    // The nodes' own listeners, which read theirs, were left alone and still hear work.
    let listeners: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query = 'LISTEN hookd_work'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listeners, 2, "the two stores' listeners");
    let heard = wakes(&b, async {
        client.batch_execute("NOTIFY hookd_work").await.unwrap();
    })
    .await;
    assert!(heard);
}

/// An accept of `id` with `body` from the fixtures' source, deduping by body or not.
fn new_event(id: &str, body: &'static [u8], dedupes: bool) -> crate::inbox::store::NewEvent {
    use sha2::Digest as _;
    crate::inbox::store::NewEvent {
        source: crate::ids::SourceName::new(fixtures::SOURCE),
        envelope: event(id),
        request: crate::inbox::RawRequest {
            body: bytes::Bytes::from_static(body),
            ..fixtures::request()
        },
        handlers: vec![crate::ids::PluginName::new(HANDLER)],
        body_sha256: dedupes.then(|| sha2::Sha256::digest(body).into()),
        from_quarantine: None,
        now_ms: fixtures::RECEIVED_MS,
    }
}

/// One batch statement with two ids of one body stores the first and answers the second a
/// duplicate, in the statement itself (no error, no fallback to one accept at a time); and an
/// event whose insert a unique index other than the id's and the body's skipped (the primary
/// key, its identity sequence set back) fails, batched or alone, rather than be answered a
/// duplicate of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_deduping_by_body_is_a_duplicate_only_of_a_stored_event() {
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let store = PostgresStore::connect(db.url(), 2, Pooler::None)
        .await
        .unwrap();
    let (a, b, c) = (
        new_event("a", b"{\"n\":1}", true),
        new_event("b", b"{\"n\":1}", true),
        new_event("c", b"{\"n\":2}", true),
    );
    let batched = super::accept::in_one_transaction(&store.connections, &[&a, &b, &c]).await;
    assert_eq!(
        batched.unwrap(),
        [Accepted::New, Accepted::Duplicate, Accepted::New]
    );
    // The next event gets an id that is taken (c's).
    let client = testdb::connect(db.url()).await;
    let set_back = async || {
        client
            .batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER TABLE events ALTER COLUMN id RESTART WITH %s',
                     (SELECT id FROM events WHERE event_id = 'c')); END $$",
            )
            .await
            .unwrap();
    };
    let d = new_event("d", b"{\"n\":3}", true);
    set_back().await;
    let e = super::accept::in_one_transaction(&store.connections, &[&d])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("s/d"), "{e}");
    set_back().await;
    let e = super::accept::one(&store.connections, &store.commits, &d)
        .await
        .unwrap_err();
    assert!(matches!(e, InboxError::Storage(_)), "{e}");
    // Without a body digest the id alone decides, and the taken key is an error as it always
    // was.
    let f = new_event("f", b"{\"n\":4}", false);
    set_back().await;
    assert!(
        super::accept::one(&store.connections, &store.commits, &f)
            .await
            .is_err()
    );
    let stored: i64 = client
        .query_one("SELECT count(*) FROM events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 2, "a and c");
}

/// A batch of accepts that deadlocks with another node's transaction (each inserting a body the
/// other holds, under other ids) is not refused as a whole: its error sends its requests to be
/// accepted again one at a time, which then find the other's events stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_accepts_that_deadlocks_is_accepted_again_one_at_a_time() {
    use sha2::Digest as _;
    let Some(db) = TestDatabase::fresh().await else {
        return;
    };
    let store = Arc::new(
        PostgresStore::connect(db.url(), 2, Pooler::None)
            .await
            .unwrap(),
    );
    let (x, y): (&[u8], &[u8]) = (b"{\"x\":1}", b"{\"y\":1}");
    let insert = "INSERT INTO events (source, event_id, event_type, received_at, headers, body,
                                      body_sha256)
                  VALUES ($1, $2, 't', 1, '[]', ''::bytea, $3)";
    let digest = |body: &[u8]| sha2::Sha256::digest(body).to_vec();
    let other = testdb::connect(db.url()).await;
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(insert, &[&fixtures::SOURCE, &"x", &digest(x)])
        .await
        .unwrap();
    // The batch inserts a (body y), then waits for the other's body x under b.
    let batch = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let (a, b) = (
                new_event("a", b"{\"y\":1}", true),
                new_event("b", b"{\"x\":1}", true),
            );
            super::accept::in_one_transaction(&store.connections, &[&a, &b]).await
        })
    };
    let watcher = testdb::connect(db.url()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while watcher
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the batch never waited"
        );
        // Soon after: PostgreSQL looks for the cycle `deadlock_timeout` (1 s) into a wait, so
        // the batch, waiting first, is the one it ends.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The other now waits for the batch's body y: a cycle, which PostgreSQL breaks by ending
    // the batch (it has waited longer, so it looks for the cycle first).
    other
        .execute(insert, &[&fixtures::SOURCE, &"y", &digest(y)])
        .await
        .unwrap();
    let e = batch.await.unwrap().unwrap_err();
    assert!(
        matches!(e, InboxError::Storage(_)) && e.to_string().contains("one at a time"),
        "{e}"
    );
    other.batch_execute("COMMIT").await.unwrap();
    for (id, body) in [("a", b"{\"y\":1}"), ("b", b"{\"x\":1}")] {
        let accepted = super::accept::one(
            &store.connections,
            &store.commits,
            &new_event(id, body, true),
        )
        .await
        .unwrap();
        assert_eq!(accepted, Accepted::Duplicate, "{id}");
    }
}
