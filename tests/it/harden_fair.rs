//! Fair dispatch across handler plugins, against a running host: a slow handler with a large
//! backlog (`flaky` told to sleep, a real wall-clock wait through the WASI monotonic clock)
//! never keeps another handler's event waiting behind that backlog.
//!
//! Each test measures how long the other handler's event waited in the host's own records
//! (its first attempt's `started_at` minus the event's `received_at`), with the slow backlog
//! still far from drained, so a dispatcher that serves the oldest delivery first fails them.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{AdminApi, TestHost, plugins, sw_source};

/// Source `a` feeds the slow handler `slow`, source `b` feeds `quick`, source `c` feeds
/// `slow2`; all three are `flaky`, which sleeps as each event's body says.
fn config(workers: usize) -> String {
    let plugins = r#"
        [plugins.slow]
        wasm = "flaky"
        timeout_ms = 30000

        [plugins.slow2]
        wasm = "flaky"
        timeout_ms = 30000

        [plugins.quick]
        wasm = "flaky"
        "#;
    format!("[server]\nworkers = {workers}\n")
        + &sw_source("a", &["slow"], "")
        + &sw_source("b", &["quick"], "")
        + &sw_source("c", &["slow2"], plugins)
}

async fn start(workers: usize) -> TestHost {
    TestHost::start(&config(workers), &[("flaky", plugins::FLAKY)]).await
}

/// Posts `count` events to `source`, each asking the handler to sleep `sleep_ms`.
async fn backlog(host: &TestHost, source: &str, count: usize, sleep_ms: u64) {
    for i in 0..count {
        host.accept_event(
            source,
            &format!("{source}_{i}"),
            &json!({ "sleep_ms": sleep_ms }),
        )
        .await;
    }
}

/// How many of `source`'s events have their `handler` delivery in `state`.
async fn count(host: &TestHost, source: &str, handler: &str, state: &str) -> usize {
    let (status, body) = host
        .admin_get(&format!(
            "/admin/events?source={source}&handler={handler}&state={state}&limit=10000"
        ))
        .await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    body.as_array().unwrap().len()
}

/// Waits until `check` holds for the (running, pending) counts of `handler` on `source`.
async fn wait_counts(
    host: &TestHost,
    what: &str,
    deadline: Duration,
    check: impl Fn(&[(usize, usize)]) -> bool,
    lanes: &[(&str, &str)],
) -> Vec<(usize, usize)> {
    let until = Instant::now() + deadline;
    loop {
        let mut seen = Vec::new();
        for (source, handler) in lanes {
            seen.push((
                count(host, source, handler, "running").await,
                count(host, source, handler, "pending").await,
            ));
        }
        if check(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < until,
            "{what}: not within {deadline:?}; last (running, pending) per {lanes:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Posts one event for `quick`, waits for it to be done, and returns how long it waited before
/// its first attempt started (host clock, ms), with the delivery.
async fn quick_wait_ms(host: &TestHost, id: &str) -> (i64, Value) {
    host.accept_event("b", id, &json!({})).await;
    let d = host
        .wait_state("b", id, "quick", "done", Duration::from_secs(120))
        .await;
    let event = host.event("b", id).await.unwrap();
    let started = d["history"][0]["started_at"].as_i64().unwrap();
    (started - event["received_at"].as_i64().unwrap(), d)
}

/// With every worker busy on a slow backlog of 120 half-second attempts (15 s of work on 4
/// workers), another handler's event waits at most about one attempt, not for the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backlog_never_starves_another_handler() {
    let host = start(4).await;
    backlog(&host, "a", 120, 500).await;
    wait_counts(
        &host,
        "the slow backlog fills the workers",
        Duration::from_secs(30),
        |s| s[0].0 == 4,
        &[("a", "slow")],
    )
    .await;

    let (waited_ms, _) = quick_wait_ms(&host, "b_0").await;
    let done = count(&host, "a", "slow", "done").await;
    eprintln!("quick waited {waited_ms} ms; slow had {done} of 120 done");
    assert!(
        waited_ms <= 3_000,
        "quick's event waited {waited_ms} ms behind slow's backlog ({done} of 120 done)"
    );
    assert!(
        done < 80,
        "the backlog was mostly drained ({done} of 120) by then: the test proves nothing"
    );
}

/// Two handlers with backlogs of one-second attempts split the workers evenly, although one
/// backlog is older (15 s of work on 4 workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_backlogs_split_the_workers() {
    let host = start(4).await;
    backlog(&host, "a", 60, 1_000).await;
    backlog(&host, "c", 60, 1_000).await;
    let seen = wait_counts(
        &host,
        "both slow handlers run two attempts each",
        Duration::from_secs(20),
        |s| s[0].0 == 2 && s[1].0 == 2,
        &[("a", "slow"), ("c", "slow2")],
    )
    .await;
    eprintln!("(running, pending) of slow and slow2: {seen:?}");
    assert!(
        seen[0].1 >= 20,
        "the older backlog was mostly drained by then: {seen:?}"
    );
}

/// A handler alone with work borrows idle workers beyond its fair share (16 workers / 3
/// handler plugins = 5), but keeps one free for each idle handler (at most 16 / 8 = 2): an
/// event for one of those starts at once, not after one of the slow 8 s attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowing_handler_keeps_a_worker_free_for_idle_ones() {
    let host = start(16).await;
    backlog(&host, "a", 40, 8_000).await;
    let seen = wait_counts(
        &host,
        "the slow handler takes every worker but the two kept for idle handlers",
        Duration::from_secs(30),
        |s| s[0].0 == 14,
        &[("a", "slow")],
    )
    .await;
    assert!(seen[0].1 > 0, "it has more due work: {seen:?}");

    let (waited_ms, _) = quick_wait_ms(&host, "b_0").await;
    eprintln!("quick waited {waited_ms} ms beside 14 slow attempts");
    assert!(
        waited_ms <= 4_000,
        "quick's event waited {waited_ms} ms for a worker the slow handler held"
    );
    // The kept worker was not lent out meanwhile.
    let running = count(&host, "a", "slow", "running").await;
    assert!(running <= 14, "slow now runs {running} attempts");
}
