//! Ordering and retry timing at their edges, against a running host: a lower sequence that
//! arrives while a higher one of its key is running, and a retry delay as long as the config
//! and a plugin can make it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{self, AdminApi, KEYED_BY_BODY, TestHost, plugins, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// A `generic`-parsed source `k` (body fields `id`, `key`, `seq`) handled by `flaky`.
fn config(flaky: &str) -> String {
    sw_source("k", &["flaky"], KEYED_BY_BODY) + "\n[plugins.flaky]\n" + flaky
}

async fn start(flaky: &str) -> TestHost {
    let plugins = [("flaky", plugins::FLAKY), ("generic", plugins::GENERIC)];
    TestHost::start(&config(flaky), &plugins).await
}

async fn send(host: &TestHost, id: &str, body: Value) {
    host.accept_event("k", id, &body).await;
}

/// A key runs one delivery at a time even when a lower sequence arrives while a higher one
/// runs; once the higher one is done the lower one is stale and never handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_sequence_arriving_mid_attempt_waits_then_goes_stale() {
    let host = start("").await;
    send(
        &host,
        "m1",
        json!({"id": "hi", "key": "sub", "seq": 20, "sleep_ms": 3000}),
    )
    .await;
    host.wait_state("k", "hi", "flaky", "running", WAIT).await;
    send(&host, "m2", json!({"id": "lo", "key": "sub", "seq": 10})).await;

    let hi = host.wait_state("k", "hi", "flaky", "done", WAIT).await;
    let lo = host
        .wait_delivery("k", "lo", "flaky", WAIT, |d| d["state"] != "pending")
        .await;
    assert_eq!(
        lo["state"], "stale",
        "lo ran beside hi instead of waiting: lo {lo:#}, hi {hi:#}"
    );
    assert_eq!(lo["attempts"], 0, "{lo:#}");
}

/// The longest retry delay a config (`backoff_max_ms`) and a plugin (`retry_after`) can ask
/// for means "much later": the retry is not scheduled in the past and run again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_retry_delay_is_not_a_retry_storm() {
    let max = u64::MAX;
    let host = start(&format!("backoff_max_ms = {max}\nmax_attempts = 5")).await;
    send(
        &host,
        "m1",
        json!({"id": "e", "key": "sub", "seq": 1, "fail_times": 4, "after_ms": max}),
    )
    .await;
    let first = host.wait_state("k", "e", "flaky", "retrying", WAIT).await;
    // Rounds of the dispatcher (claims and reclaim passes) in which a retry due now would run.
    let (_, metrics) = host.admin_get("/metrics").await;
    support::wait_rounds(
        async |p: &str| host.admin_get(p).await,
        support::rounds(&metrics),
        6,
    )
    .await;
    let later = host.event("k", "e").await.unwrap();
    let later = &later["deliveries"][0];
    assert_eq!(later["state"], "retrying", "{later:#}");
    assert_eq!(later["attempts"], 1, "re-run at once: {later:#}");
    let next = later["next_attempt_at"].as_i64().unwrap();
    let finished = first["history"][0]["finished_at"].as_i64().unwrap();
    assert!(
        next > finished,
        "retry scheduled at {next}, before {finished}"
    );
}

/// Stale events are each handler's choice. Three handlers of one source see `old` (sequence 10)
/// arrive after `new` (20) of its key was handled: `sync` (the default, `skip`) never runs it;
/// `tally` (`on_stale = "deliver"`) counts it, told it is stale; `legacy`, a handler built
/// against WIT 0.2.0 with `deliver`, counts it without the flag (it has none). A replay of the
/// skipped one goes stale again; a forced replay delivers it, marked stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_stale_deliver_hands_a_late_event_over_and_a_forced_replay_delivers_a_skipped_one() {
    let config = sw_source("k", &["sync", "tally", "legacy"], KEYED_BY_BODY)
        + r#"
        [plugins.sync]
        wasm = "counter"
        [plugins.tally]
        wasm = "counter"
        on_stale = "deliver"
        [plugins.legacy]
        wasm = "counter-0.2.0"
        on_stale = "deliver"
        "#;
    let legacy = crate::wit_versions::fixture("v0.2.0", "counter");
    let plugins = [
        ("counter", plugins::COUNTER),
        ("counter-0.2.0", legacy.as_str()),
        ("generic", plugins::GENERIC),
    ];
    let host = TestHost::start(&config, &plugins).await;
    send(&host, "m1", json!({"id": "new", "key": "acct", "seq": 20})).await;
    for handler in ["sync", "tally", "legacy"] {
        host.wait_state("k", "new", handler, "done", WAIT).await;
    }
    send(&host, "m2", json!({"id": "old", "key": "acct", "seq": 10})).await;
    let finished = |d: &Value| d["state"] != "pending" && d["state"] != "running";
    let output =
        |d: &Value| -> Value { serde_json::from_str(d["output"].as_str().unwrap()).unwrap() };

    let tally = host
        .wait_delivery("k", "old", "tally", WAIT, finished)
        .await;
    assert_eq!(tally["state"], "done", "{tally:#}");
    assert_eq!(
        output(&tally),
        json!({"count": 2, "stale": true}),
        "{tally:#}"
    );
    let legacy = host
        .wait_delivery("k", "old", "legacy", WAIT, finished)
        .await;
    assert_eq!(legacy["state"], "done", "{legacy:#}");
    assert_eq!(output(&legacy), json!({"count": 2}), "{legacy:#}");
    let sync = host.wait_delivery("k", "old", "sync", WAIT, finished).await;
    assert_eq!(
        (&sync["state"], &sync["attempts"]),
        (&json!("stale"), &json!(0)),
        "{sync:#}"
    );

    // A plain replay is decided again by the ordering rule: stale, never run.
    let only_sync = json!({"handler": "sync", "state": "stale", "event_ids": ["old"]});
    let (_, answer) = host.admin_post("/admin/replay", only_sync.clone()).await;
    assert_eq!(answer["replayed"], 1, "{answer:#}");
    let sync = host.wait_delivery("k", "old", "sync", WAIT, finished).await;
    assert_eq!(
        (&sync["state"], &sync["attempts"]),
        (&json!("stale"), &json!(0)),
        "{sync:#}"
    );

    // A forced one delivers it, marked stale.
    let mut forced = only_sync;
    forced["force"] = true.into();
    let (_, answer) = host.admin_post("/admin/replay", forced).await;
    assert_eq!(answer["replayed"], 1, "{answer:#}");
    let sync = host.wait_state("k", "old", "sync", "done", WAIT).await;
    assert_eq!(
        output(&sync),
        json!({"count": 2, "stale": true}),
        "{sync:#}"
    );
    host.stop().await;
}
