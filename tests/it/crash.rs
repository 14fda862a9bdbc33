//! Crash safety against the real `hookd serve` process: SIGKILL mid-processing, restart on the
//! same directory, and check what the inbox made of the attempts the kill cut short.
//!
//! Invariant checked: an attempt is counted at lease time and its state writes land only with
//! its `done`; a killed attempt is recorded as `abandoned` at the restart, then retried
//! (at-least-once) or dead-lettered and never re-run (at-most-once, or a handler the restarted
//! configuration no longer declares).

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{self, AdminApi, ProcessHost, install_plugins, plugins, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// Four workers and the standard-webhooks source `s` feeding `handlers`, then `plugins` (tables).
fn config(handlers: &[&str], plugins: &str) -> String {
    format!(
        "[server]\nworkers = 4\n{}",
        sw_source("s", handlers, plugins)
    )
}

/// `flaky` as the at-most-once instance `once`, its attempts given 10 s, its retries 100–200 ms.
const ONCE: &str = r#"
        [plugins.once]
        wasm = "flaky"
        delivery = "at-most-once"
        timeout_ms = 10000
        backoff_base_ms = 100
        backoff_max_ms = 200
        "#;

/// Asserts that delivery `d` is dead after one attempt, the one a kill cut short.
fn dead_after_its_one_abandoned_attempt(d: &Value) {
    assert_eq!(
        (&d["state"], &d["attempts"], support::outcomes(d)),
        (&json!("dead"), &json!(1), vec!["abandoned"]),
        "{d:#}"
    );
}

/// Signs `body` as standard-webhooks message `id` and POSTs it to source `s`; Ok only on a 202.
async fn post_event(ingest: SocketAddr, id: String, body: Value) -> anyhow::Result<Value> {
    let (status, reply) = support::post_sw(ingest, "s", &id, body.to_string().as_bytes()).await?;
    anyhow::ensure!(status == StatusCode::ACCEPTED, "{id}: {status} {reply}");
    Ok(reply)
}

/// How many events of source `s` have a delivery in `state`.
async fn list_len(host: &ProcessHost, state: &str) -> usize {
    let (status, list) = host
        .admin_get(&format!("/admin/events?source=s&state={state}&limit=10000"))
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list.as_array().unwrap().len()
}

fn now_ms() -> i64 {
    host::model::unix_ms(SystemTime::now())
}

fn install(dir: &Path, plugin: (&str, &str)) {
    install_plugins(dir, &[plugin]);
}

/// 200 events, each sent twice at once, to `counter`; SIGKILL once some are done while others
/// run, restart on the same database, resend what the kill cut off: every event is handled,
/// and the counter outputs are exactly 1..200. A killed attempt's state write never landed
/// (else a count would be missing) and no increment ran twice (else one would repeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_stays_exact_across_a_kill_mid_processing() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), ("counter", plugins::COUNTER));
    let config = config(
        &["counter"],
        r#"
        [plugins.counter]
        timeout_ms = 10000
        "#,
    );
    let first = ProcessHost::start(dir.path(), &config).await;
    let mut sends = Vec::new();
    for i in 0..200 {
        for _ in 0..2 {
            let (ingest, id) = (first.ingest, format!("msg_{i}"));
            sends.push(tokio::spawn(async move {
                let result = post_event(ingest, id.clone(), json!({"n": i})).await;
                (id, result)
            }));
        }
    }

    // Kill once some deliveries are done while others are running (the rest are pending).
    let deadline = Instant::now() + WAIT;
    let done_before_kill = loop {
        let done = list_len(&first, "done").await;
        if done > 0 && list_len(&first, "running").await > 0 {
            break done;
        }
        assert!(
            Instant::now() < deadline,
            "no moment with deliveries both done and running"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    first.kill();
    let killed_at = now_ms();
    assert!(
        done_before_kill < 200,
        "all 200 were done before the kill: nothing to check"
    );

    // What the provider saw: a 202 (durable), or an error (it will retry).
    let mut accepted_by_first = BTreeSet::new();
    let mut to_resend = Vec::new();
    for send in sends {
        let (id, result) = send.await.unwrap();
        match result {
            Ok(_) => {
                accepted_by_first.insert(id);
            }
            Err(_) => to_resend.push(id),
        }
    }

    let restarted_at = now_ms();
    let second = ProcessHost::start(dir.path(), &config).await;
    let resends: Vec<_> = to_resend
        .iter()
        .map(|id| {
            let (ingest, id) = (second.ingest, id.clone());
            let n: u64 = id["msg_".len()..].parse().unwrap();
            tokio::spawn(async move { post_event(ingest, id, json!({"n": n})).await })
        })
        .collect();
    for resend in resends {
        resend.await.unwrap().unwrap();
    }

    let deadline = Instant::now() + WAIT;
    loop {
        let done = list_len(&second, "done").await;
        if done == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all 200 were done after the restart: {done} are"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut counts = Vec::new();
    let (mut abandoned, mut resumed) = (0, 0);
    for i in 0..200 {
        let id = format!("msg_{i}");
        let d = second.delivery("s", &id, "counter").await.unwrap();
        assert_eq!(d["state"], "done", "{d:#}");
        let output: Value = serde_json::from_str(d["output"].as_str().unwrap()).unwrap();
        counts.push(output["count"].as_u64().unwrap());

        // One ok, last; before it only attempts the kill cut short, and conflicts.
        let outcomes = support::outcomes(&d);
        assert_eq!(outcomes.last(), Some(&"ok"), "{d:#}");
        assert_eq!(outcomes.iter().filter(|o| **o == "ok").count(), 1, "{d:#}");
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(*o, "ok" | "abandoned" | "conflict")),
            "{d:#}"
        );
        let history = d["history"].as_array().unwrap();
        let cut_short: Vec<&Value> = history
            .iter()
            .filter(|a| a["outcome"] == "abandoned")
            .collect();
        for a in &cut_short {
            assert_eq!(a["error_kind"], "lease_expired", "{d:#}");
            // Recorded by the second process's start-up reclaim, not before the kill.
            assert!(a["finished_at"].as_i64().unwrap() >= killed_at, "{d:#}");
        }
        // The attempt is counted at lease time: each run has its own number, a cut-short one's
        // and a conflict's too (a conflict gives back only the retry budget).
        assert_eq!(d["attempts"], history.len(), "{d:#}");
        let numbers: Vec<u64> = history
            .iter()
            .map(|a| a["attempt"].as_u64().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (1..=history.len() as u64).collect::<Vec<_>>(),
            "{d:#}"
        );
        abandoned += cut_short.len();
        let ok = history.last().unwrap();
        if accepted_by_first.contains(&id) && ok["started_at"].as_i64().unwrap() >= restarted_at {
            resumed += 1;
        }
    }
    counts.sort();
    assert_eq!(counts, (1..=200).collect::<Vec<_>>());
    // The kill really landed mid-processing: work the first process had accepted was finished
    // by the second.
    assert!(
        resumed > 0,
        "no delivery accepted before the kill was left for the restart \
         ({done_before_kill} done at the kill, {abandoned} abandoned)"
    );
    eprintln!(
        "kill after {done_before_kill} done; {} sends resent; {resumed} accepted deliveries \
         finished after the restart; {abandoned} attempts cut short by the kill",
        to_resend.len()
    );
}

/// Two instances of `flaky` on one source, each attempt writing state then sleeping 1.5 s,
/// killed while both run. After the restart the at-most-once one is dead with `abandoned` and
/// never runs again; the at-least-once one is retried and done, and its retry did not see the
/// killed attempt's state write (a later replay does see the retry's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_attempt_dead_letters_at_most_once_and_retries_at_least_once() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), ("flaky", plugins::FLAKY));
    let config = config(
        &["once", "twice"],
        &(ONCE.to_owned()
            + r#"
        [plugins.twice]
        wasm = "flaky"
        delivery = "at-least-once"
        timeout_ms = 10000
        backoff_base_ms = 100
        backoff_max_ms = 200
        "#),
    );
    let first = ProcessHost::start(dir.path(), &config).await;
    let body = json!({"sleep_ms": 1500, "remember": "last"});
    post_event(first.ingest, "slow".into(), body).await.unwrap();
    // Both attempts in flight at once (each sleeps 1.5 s), then the kill.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, event) = first.admin_get("/admin/events/s/slow").await;
        let running = event["deliveries"].as_array().map_or(0, |ds| {
            ds.iter().filter(|d| d["state"] == "running").count()
        });
        if running == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "never both running: {event:#}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill();

    let second = ProcessHost::start(dir.path(), &config).await;
    let once = second.delivery("s", "slow", "once").await.unwrap();
    assert_eq!(once["state"], "dead", "{once:#}");
    assert_eq!(support::outcomes(&once), ["abandoned"], "{once:#}");
    assert_eq!(once["history"][0]["error_kind"], "lease_expired");
    assert_eq!(once["attempts"], 1);

    let twice = second
        .wait_delivery("s", "slow", "twice", WAIT, |d| d["state"] == "done")
        .await;
    assert_eq!(support::outcomes(&twice), ["abandoned", "ok"], "{twice:#}");
    assert_eq!(twice["history"][0]["error_kind"], "lease_expired");
    assert_eq!(twice["attempts"], 2);
    let output =
        |d: &Value| -> Value { serde_json::from_str(d["output"].as_str().unwrap()).unwrap() };
    // Attempt 1 wrote `last = 1` before it was killed: that write never landed.
    assert_eq!(output(&twice), json!({"attempt": 2, "remembered": null}));

    // A replay of the done delivery sees attempt 2's committed write.
    let url = format!("http://{}/admin/replay", second.admin);
    let headers = [
        (
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {}", support::ADMIN_TOKEN)).unwrap(),
        ),
        (
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        ),
    ];
    let replay = json!({"state": "done", "handler": "twice", "event_ids": ["slow"]});
    let (status, _, reply) = support::send(
        Method::POST,
        &url,
        &headers,
        Bytes::from(replay.to_string()),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{reply:?}");
    let twice = second
        .wait_delivery("s", "slow", "twice", WAIT, |d| {
            d["state"] == "done" && d["attempts"] == 3
        })
        .await;
    assert_eq!(output(&twice), json!({"attempt": 3, "remembered": 2}));

    // Meanwhile (a retry, a replay and two 1.5 s attempts later) the at-most-once delivery
    // was never run again.
    let later = second.delivery("s", "slow", "once").await.unwrap();
    dead_after_its_one_abandoned_attempt(&later);
}

/// An at-most-once attempt cut short by a kill, then a restart whose configuration no longer
/// declares its handler: the delivery is dead (`abandoned`), not retried under the defaults
/// (at-least-once) a name the configuration lacks would get; declared again, the handler never
/// runs it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_then_a_configuration_without_the_handler_never_runs_an_attempt_twice() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), ("flaky", plugins::FLAKY));
    let with = config(&["once"], ONCE);
    let first = ProcessHost::start(dir.path(), &with).await;
    post_event(first.ingest, "slow".into(), json!({"sleep_ms": 3000}))
        .await
        .unwrap();
    first
        .wait_delivery("s", "slow", "once", WAIT, |d| d["state"] == "running")
        .await;
    first.kill();

    let without = ProcessHost::start(dir.path(), &config(&[], "")).await;
    let dead = without.delivery("s", "slow", "once").await.unwrap();
    dead_after_its_one_abandoned_attempt(&dead);
    without.kill();

    let again = ProcessHost::start(dir.path(), &with).await;
    // Longer than a retry's backoff and the attempt's 3 s: a re-run would have started by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = again.delivery("s", "slow", "once").await.unwrap();
    dead_after_its_one_abandoned_attempt(&later);
}

/// SIGHUP (what a service manager's "reload" and a closing terminal send) is taken and logged,
/// and the attempts running go on: its default action ended the process at once, and every
/// attempt it cut short was taken back at the next start (an at-most-once one dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_is_logged_and_cuts_nothing_short() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("flaky", plugins::FLAKY)]);
    let host = ProcessHost::start(dir.path(), &config(&["once"], ONCE)).await;
    post_event(host.ingest, "hup-1".into(), json!({"sleep_ms": 1500}))
        .await
        .unwrap();
    host.wait_delivery("s", "hup-1", "once", WAIT, |d| d["state"] == "running")
        .await;
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &host.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    host.wait_log("SIGHUP received and ignored", WAIT).await;
    let delivery = host.wait_state("s", "hup-1", "once", "done", WAIT).await;
    assert_eq!(delivery["attempts"], 1, "{delivery:#}");
}
