//! Dispatch semantics against a running host: retries, dead letters, replay, fan-out, ordering,
//! staleness, and transactional plugin state under concurrent duplicates.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    self, AdminApi, KEYED_BY_BODY, ProcessHost, TestHost, install_plugins, plugins, post_sw,
    sw_source,
};

/// A standard-webhooks source `s` (event id = `webhook-id`) with the given handlers, plus a
/// `generic`-parsed source `k` whose body carries `id`, `key` and `seq` (for ordering).
fn config(handlers: &[&str], extra: &str) -> String {
    sw_source("s", handlers, "") + &sw_source("k", handlers, KEYED_BY_BODY) + extra
}

async fn send(host: &TestHost, source: &str, id: &str, body: Value) -> Value {
    host.accept_event(source, id, &body).await
}

const WAIT: Duration = Duration::from_secs(60);

/// 200 events, each delivered twice at once, to a handler that increments a state counter:
/// every event is handled exactly once and no increment is lost or doubled. All of them write
/// one key, so the attempts take turns once they conflict instead of re-running each other:
/// without turns, this run re-ran 4 to 8 attempts per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_reach_the_counter_exactly_once_each() {
    const WORKERS: usize = 16;
    let config = format!(
        "[server]\nworkers = {WORKERS}\n{}",
        config(&["counter"], "")
    );
    let host = TestHost::start(&config, &[("counter", plugins::COUNTER)]).await;
    let started = std::time::Instant::now();
    let host = std::sync::Arc::new(host);
    let mut tasks = Vec::new();
    for i in 0..200 {
        for _ in 0..2 {
            let host = host.clone();
            tasks.push(tokio::spawn(async move {
                send(&host, "s", &format!("msg_{i}"), json!({"n": i})).await
            }));
        }
    }
    let mut new = 0;
    for task in tasks {
        if task.await.unwrap()["duplicate"] == false {
            new += 1;
        }
    }
    assert_eq!(new, 200, "exactly one of each pair is new");

    let mut counts = Vec::new();
    for i in 0..200 {
        let d = host
            .wait_state("s", &format!("msg_{i}"), "counter", "done", WAIT)
            .await;
        let output: Value = serde_json::from_str(d["output"].as_str().unwrap()).unwrap();
        counts.push(output["count"].as_u64().unwrap());
        crate::support::assert_ok_after_conflicts_only(&d, &format!("msg_{i}"));
    }
    counts.sort();
    assert_eq!(counts, (1..=200).collect::<Vec<_>>());
    let (_, metrics) = host.admin_get("/metrics").await;
    let conflicts = metrics
        .as_str()
        .unwrap()
        .lines()
        .find(|l| l.starts_with(r#"hookd_attempts_total{plugin="counter",outcome="conflict"}"#))
        .map_or(0.0, |l| {
            l.split_whitespace().last().unwrap().parse().unwrap()
        });
    // A plugin takes turns for HOT_FOR (2 s) after its last conflict, then runs its attempts
    // side by side again until one conflicts: one wave of conflicts per 2 s at most, each of
    // the attempts that started before the first conflict was recorded (13-18 with 16 workers
    // here; more on a loaded machine, whose run also lasts longer). Without turns this run
    // re-ran 876-1 698 attempts in under 2 s.
    let waves = 1 + started.elapsed().as_secs() / 2;
    let bound = 4 * WORKERS as u64 * waves;
    assert!(
        conflicts <= bound as f64,
        "{conflicts} conflict re-runs for 200 events in {:?} (at most {bound}): the hot key's \
         attempts did not take turns",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_back_off_then_succeed_and_permanent_errors_dead_letter_at_once() {
    let extra = "[plugins.flaky]\nbackoff_base_ms = 200\nbackoff_max_ms = 1000\nmax_attempts = 5";
    let host = TestHost::start(&config(&["flaky"], extra), &[("flaky", plugins::FLAKY)]).await;
    send(&host, "s", "msg_retry", json!({"fail_times": 2})).await;
    send(&host, "s", "msg_perm", json!({"permanent": true})).await;

    let d = host
        .wait_state("s", "msg_retry", "flaky", "done", WAIT)
        .await;
    assert_eq!(support::outcomes(&d), ["retry", "retry", "ok"]);
    assert_eq!(d["output"], r#"{"attempt":3}"#);
    // Backoff from the recorded history: base 200 ms doubled, with equal jitter (half fixed).
    let h = d["history"].as_array().unwrap();
    let gap =
        |a: usize| h[a + 1]["started_at"].as_i64().unwrap() - h[a]["finished_at"].as_i64().unwrap();
    assert!(gap(0) >= 100, "first retry waited {} ms", gap(0));
    assert!(gap(1) >= 200, "second retry waited {} ms", gap(1));

    let d = host
        .wait_state("s", "msg_perm", "flaky", "dead", WAIT)
        .await;
    assert_eq!(support::outcomes(&d), ["permanent"]);
}

/// A retry waiting out a long backoff (a downstream that was down, now fixed) runs at once when
/// replayed with `state: retrying`, keeping its attempt budget; `pending` and `running` are
/// still refused, naming what a replay takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_retrying_deliveries_runs_them_now_with_their_budget() {
    let extra =
        "[plugins.flaky]\nbackoff_base_ms = 3600000\nbackoff_max_ms = 3600000\nmax_attempts = 2";
    let host = TestHost::start(&config(&["flaky"], extra), &[("flaky", plugins::FLAKY)]).await;
    send(&host, "s", "msg_wait", json!({"fail_times": 2})).await;
    let waiting = host
        .wait_state("s", "msg_wait", "flaky", "retrying", WAIT)
        .await;
    let finished = waiting["history"][0]["finished_at"].as_i64().unwrap();
    let due = waiting["next_attempt_at"].as_i64().unwrap();
    assert!(due - finished >= 1_800_000, "{waiting:#}");

    for state in ["pending", "running"] {
        let (status, body) = host
            .admin_post("/admin/replay", json!({"state": state}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{state}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("retrying ones (run now)"), "{detail}");
    }
    let (status, body) = host
        .admin_post("/admin/replay", json!({"state": "retrying", "source": "s"}))
        .await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    // Its budget was kept: the second attempt, failing too, was its last (`max_attempts = 2`),
    // not the first of a fresh budget.
    let dead = host
        .wait_state("s", "msg_wait", "flaky", "dead", WAIT)
        .await;
    assert_eq!(support::outcomes(&dead), ["retry", "retry"]);
    // A dead delivery replayed gets a fresh one, as before.
    host.admin_post("/admin/replay", json!({"source": "s"}))
        .await;
    let done = host
        .wait_state("s", "msg_wait", "flaky", "done", WAIT)
        .await;
    assert_eq!(support::outcomes(&done), ["retry", "retry", "ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traps_dead_letter_after_max_attempts_and_replay_grants_a_fresh_budget() {
    let extra = "[plugins.crasher]\nbackoff_base_ms = 10\nbackoff_max_ms = 20\nmax_attempts = 3";
    let host = TestHost::start(
        &config(&["crasher"], extra),
        &[("crasher", plugins::CRASHER)],
    )
    .await;
    send(&host, "s", "msg_crash", json!({})).await;
    let d = host
        .wait_state("s", "msg_crash", "crasher", "dead", WAIT)
        .await;
    assert_eq!(support::outcomes(&d), ["trap", "trap", "trap"]);
    assert!(d["last_error"].as_str().unwrap().contains("trap"), "{d:#}");

    let (status, reply) = host
        .admin_post("/admin/replay", json!({"source": "s", "dry_run": true}))
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 1, "replayed": 0}))
    );
    let (status, reply) = host
        .admin_post("/admin/replay", json!({"event_ids": ["msg_crash"]}))
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    // A fresh budget of 3, and attempt numbers keep counting across the replay.
    let d = host
        .wait_delivery("s", "msg_crash", "crasher", WAIT, |d| {
            d["state"] == "dead" && d["attempts"] == 6
        })
        .await;
    let attempts: Vec<i64> = d["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3, 4, 5, 6]);
}

/// An attempt the host stopped (a timeout, a trap) may have acted before it was stopped (an
/// outbound call made): an at-most-once handler's is dead-lettered at once, never run again,
/// where an at-least-once instance of the same plugin retries it up to `max_attempts`. A
/// handler's own retry is retried under either mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_most_once_handler_is_never_run_again_after_an_attempt_the_host_stopped() {
    let instances = r#"
        [plugins.once]
        wasm = "flaky"
        delivery = "at-most-once"
        timeout_ms = 300
        memory_mib = 16
        max_attempts = 3
        backoff_base_ms = 10
        backoff_max_ms = 20
        [plugins.again]
        wasm = "flaky"
        timeout_ms = 300
        memory_mib = 16
        max_attempts = 3
        backoff_base_ms = 10
        backoff_max_ms = 20
        "#;
    let host = TestHost::start(
        &config(&["once", "again"], instances),
        &[("flaky", plugins::FLAKY)],
    )
    .await;
    send(&host, "s", "slow", json!({"sleep_ms": 5000})).await;
    send(&host, "s", "big", json!({"hold_mib": 64})).await;
    send(&host, "s", "asks", json!({"fail_times": 1})).await;
    for (event, outcome) in [("slow", "timeout"), ("big", "trap")] {
        let again = host.wait_state("s", event, "again", "dead", WAIT).await;
        assert_eq!(support::outcomes(&again), [outcome; 3], "{again:#}");
        let once = host.wait_state("s", event, "once", "dead", WAIT).await;
        assert_eq!(
            (support::outcomes(&once), &once["attempts"]),
            (vec![outcome], &json!(1)),
            "{once:#}"
        );
    }
    for handler in ["once", "again"] {
        let d = host.wait_state("s", "asks", handler, "done", WAIT).await;
        assert_eq!(support::outcomes(&d), ["retry", "ok"], "{handler}: {d:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_handler_never_holds_back_another() {
    let host = TestHost::start(
        &config(&["counter", "flaky"], ""),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await;
    send(&host, "s", "msg_fan", json!({"permanent": true})).await;
    host.wait_state("s", "msg_fan", "counter", "done", WAIT)
        .await;
    host.wait_state("s", "msg_fan", "flaky", "dead", WAIT).await;
}

/// Same ordering key: the later event waits while the earlier one retries; an event older than
/// one already done becomes `stale` and is never shown to the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_while_retrying_and_stale_events_are_never_handled() {
    let extra = "[plugins.flaky]\nbackoff_base_ms = 300\nbackoff_max_ms = 300";
    let plugins = [("flaky", plugins::FLAKY), ("generic", plugins::GENERIC)];
    let host = TestHost::start(&config(&["flaky"], extra), &plugins).await;
    send(
        &host,
        "k",
        "m1",
        json!({"id": "a", "key": "sub_1", "seq": 10, "fail_times": 2}),
    )
    .await;
    send(
        &host,
        "k",
        "m2",
        json!({"id": "b", "key": "sub_1", "seq": 20}),
    )
    .await;
    // Another key is not held back.
    send(
        &host,
        "k",
        "m3",
        json!({"id": "c", "key": "sub_2", "seq": 1}),
    )
    .await;
    let c = host.wait_state("k", "c", "flaky", "done", WAIT).await;

    let a = host.wait_state("k", "a", "flaky", "done", WAIT).await;
    let b = host.wait_state("k", "b", "flaky", "done", WAIT).await;
    let a_done = a["history"].as_array().unwrap().last().unwrap()["finished_at"]
        .as_i64()
        .unwrap();
    let b_start = b["history"][0]["started_at"].as_i64().unwrap();
    assert!(
        b_start >= a_done,
        "b started at {b_start} before a finished at {a_done}"
    );
    let c_start = c["history"][0]["started_at"].as_i64().unwrap();
    assert!(c_start < a_done, "the other key waited for sub_1");

    // Older than b (done at sequence 20): stale, zero attempts.
    send(
        &host,
        "k",
        "m4",
        json!({"id": "old", "key": "sub_1", "seq": 15}),
    )
    .await;
    let old = host.wait_state("k", "old", "flaky", "stale", WAIT).await;
    assert_eq!(old["attempts"], 0);
    assert!(old["history"].as_array().unwrap().is_empty());
}

/// Deliveries that are due but cannot run (their plugin is missing) must not turn the
/// dispatcher into a busy loop of empty claims, and an idle host makes no commits: the host
/// stays idle while they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_deliveries_do_not_spin_the_dispatcher_and_idle_commits_nothing() {
    let host = TestHost::start(
        &config(&["counter", "absent"], ""),
        &[("counter", plugins::COUNTER)],
    )
    .await;
    send(&host, "s", "msg_wait", json!({})).await;
    host.wait_state("s", "msg_wait", "counter", "done", WAIT)
        .await;
    let (_, metrics) = host.admin_get("/metrics").await;
    let (commits, before) = (support::commits(&metrics), support::rounds(&metrics));
    // The window is 2 s of the dispatcher looping: it closes only after four rounds, so a
    // stuck dispatcher cannot pass for an idle one.
    let window = Instant::now();
    let admin = async |p: &str| host.admin_get(p).await;
    let mut after = support::wait_rounds(admin, before, 4).await;
    while window.elapsed() < Duration::from_secs(2) {
        after = support::wait_rounds(admin, after, 1).await;
    }
    let spent = after - before;
    // An idle host looks for work at most a few times a second (IDLE_POLL).
    assert!(
        spent <= 20,
        "{spent} dispatcher rounds in 2 s while nothing could run"
    );
    let (_, metrics) = host.admin_get("/metrics").await;
    assert_eq!(
        support::commits(&metrics) - commits,
        0,
        "an idle host committed (claims and reclaim passes that changed nothing)"
    );
    let delivery = host
        .wait_state("s", "msg_wait", "absent", "pending", WAIT)
        .await;
    assert_eq!(delivery["attempts"], 0);
}

/// Voluntary context switches of each thread of process `pid` so far, by thread id: how often
/// its threads went to sleep, so how often something woke them.
fn wakeups(pid: u32) -> BTreeMap<String, u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let switches =
                support::status_field(&task.path().join("status"), "voluntary_ctxt_switches")?;
            Some((task.file_name().to_string_lossy().into_owned(), switches))
        })
        .collect()
}

/// The wake-ups between two [`wakeups`] readings, of the threads alive at the second (one that
/// ended meanwhile, such as an idle blocking-pool thread, takes its count with it; one that
/// started meanwhile counts all of its own).
fn woken_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .map(|(tid, n)| n.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum()
}

/// An idle host sleeps. Once its event is handled, the whole process wakes a few times a
/// second (the dispatcher's look for work, its housekeeping), not on every tick of the Wasm
/// runtime's epoch while no plugin runs: that clock used to wake it 500 times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_wakes_a_few_times_a_second() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("counter", plugins::COUNTER)]);
    let host = ProcessHost::start(dir.path(), &sw_source("s", &["counter"], "")).await;
    let (status, reply) = post_sw(host.ingest, "s", "msg_idle", b"{}").await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    host.wait_state("s", "msg_idle", "counter", "done", WAIT)
        .await;

    let (before, since) = (wakeups(host.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let woken = woken_between(&before, &wakeups(host.pid()));
    let per_second = woken as f64 / since.elapsed().as_secs_f64();
    assert!(
        per_second < 100.0,
        "an idle host woke {woken} times in {:?} ({per_second:.0}/s)",
        since.elapsed()
    );
}

/// A graceful stop under a backlog starts no more attempts: the producer looked at the stop only
/// when a round claimed nothing, so while claims kept finding work (free workers, and
/// deliveries falling due again as fast as they were claimed) attempts went on starting after
/// the stop, for as long as there was work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_under_a_backlog_starts_no_more_attempts() {
    // Every attempt asks for a retry, due again within 2 ms; more workers than deliveries.
    let settings = "[server]\nworkers = 400\n\
                    [plugins.h]\nwasm = \"flaky\"\nmax_attempts = 40\n\
                    backoff_base_ms = 1\nbackoff_max_ms = 2\n";
    let host = TestHost::start(&config(&["h"], settings), &[("flaky", plugins::FLAKY)]).await;
    const EVENTS: i64 = 200;
    for i in 0..EVENTS {
        send(&host, "s", &format!("e{i}"), json!({"fail_times": 1000})).await;
    }
    let database = host.dir.path().join("hookd.db");
    let db = rusqlite::Connection::open(&database).unwrap();
    let count = |sql: &str, at: i64| -> i64 { db.query_row(sql, [at], |r| r.get(0)).unwrap() };
    let deadline = Instant::now() + WAIT;
    while count("SELECT count(*) FROM attempts WHERE ?1 = ?1", 0) < 1000 {
        assert!(Instant::now() < deadline, "the handler never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let _dir = host.stop().await;
    let dead = count(
        "SELECT count(*) FROM deliveries WHERE state = 'dead' AND ?1 = ?1",
        0,
    );
    // An attempt leased in the round the stop came in may be stamped a moment after it (a
    // claim that waited over a second for the writer is stamped from when it ran).
    let after = count(
        "SELECT count(*) FROM attempts WHERE started_at > ?1 + 3000",
        stopped_at,
    );
    assert_eq!(
        after, 0,
        "attempts started after the stop ({dead} of {EVENTS} dead)"
    );
    assert!(
        dead < EVENTS,
        "every delivery ran out of attempts: nothing tested"
    );
}
