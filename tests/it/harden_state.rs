//! Bounded plugin state and bounded error text, against hostile handlers (`hoarder`).
//!
//! Invariants checked: an attempt that writes more state than its caps is refused at the write
//! that crosses them, with the cap named in the attempt's error, before the host buffers (or the
//! database receives) the rest; a plugin's total is refused once reached and deletes free it;
//! a healthy source's ingest is not stalled by big state commits; a handler's reason is stored
//! and logged capped, and logged with its control characters escaped.

use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    self, AdminApi, ProcessHost, TestHost, install_plugins, outcomes, plugins, sw_source,
};

const WAIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1024 * 1024;

/// A `[server]` table, a standard-webhooks source `s` feeding `handlers` and a source `ok`
/// feeding none, then `plugins` (tables).
fn config(handlers: &[&str], plugins: &str) -> String {
    "[server]\n".to_owned() + &sw_source("s", handlers, "") + &sw_source("ok", &[], plugins)
}

/// POSTs `body` as message `id` to `source`, signed now; returns the status and how long the
/// answer took.
async fn post(ingest: SocketAddr, source: &str, id: &str, body: &Value) -> (StatusCode, Duration) {
    let body = body.to_string();
    let started = Instant::now();
    let (status, _) = support::post_sw(ingest, source, id, body.as_bytes())
        .await
        .unwrap();
    (status, started.elapsed())
}

/// The database's bytes on disk: the file, its WAL and its shared-memory index.
fn database_bytes(dir: &Path) -> u64 {
    ["hookd.db", "hookd.db-wal", "hookd.db-shm"]
        .iter()
        .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
        .map(|m| m.len())
        .sum()
}

/// One attempt writing 1 500 × 1 MiB (and one writing 1 500 tiny keys) is refused at the write
/// that crosses the attempt's cap; the host's peak memory and the database stay small.
/// Without the caps the host buffered the whole 1.5 GiB (twice) and committed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_writing_1500_mib_is_refused_and_memory_and_disk_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("hoarder", plugins::HOARDER)]);
    let text = config(&["hoarder"], "[plugins.hoarder]\nmax_attempts = 3");
    let host = ProcessHost::start(dir.path(), &text).await;

    let big = json!({"keys": 1500, "value_bytes": MIB, "prefix": "big"});
    assert_eq!(
        post(host.ingest, "s", "big", &big).await.0,
        StatusCode::ACCEPTED
    );
    let many = json!({"keys": 1500, "value_bytes": 1, "prefix": "many"});
    assert_eq!(
        post(host.ingest, "s", "many", &many).await.0,
        StatusCode::ACCEPTED
    );

    // Over an attempt's caps is dead at once: the same event would write the same again.
    let d = host.wait_state("s", "big", "hoarder", "dead", WAIT).await;
    assert_eq!(outcomes(&d), ["permanent"], "{d:#}");
    let attempt = &d["history"][0];
    assert_eq!(attempt["error_kind"], "state_limit", "{d:#}");
    let error = attempt["error"].as_str().unwrap();
    assert!(
        error.contains("\"big/3\"")
            && error.contains("plugins.hoarder.attempt_state_kib = 4096 (4194304 bytes)"),
        "the error names the write and the cap: {error}"
    );
    let d = host.wait_state("s", "many", "hoarder", "dead", WAIT).await;
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("\"many/1000\"")
            && error.contains("plugins.hoarder.attempt_state_keys = 1000"),
        "{error}"
    );

    let peak = support::status_kib(host.pid(), "VmHWM") * 1024;
    let disk = database_bytes(dir.path());
    eprintln!(
        "hookd peak RSS {} MiB, database + WAL {} KiB",
        peak / MIB,
        disk / 1024
    );
    assert!(peak < 400 * MIB, "hookd's peak RSS was {} MiB", peak / MIB);
    assert!(
        disk < 16 * MIB,
        "the database and its WAL hold {disk} bytes"
    );
}

/// While hoarders commit as much state as their caps allow (and one tries 1.5 GiB), a healthy
/// source's events are still acknowledged promptly: no one commit holds more than a few MiB
/// of state, and small writes go ahead of queued big ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_source_is_acked_promptly_while_hoarders_commit() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("hoarder", plugins::HOARDER)]);
    // `filler`: 3 × 1 MiB per attempt, just under the 4 MiB attempt cap.
    let text = config(
        &["hoarder", "filler"],
        "[plugins.hoarder]\nmax_attempts = 1\n\
         [plugins.filler]\nwasm = \"hoarder\"\nconfig = { keys = 3, value_bytes = 1048576 }",
    );
    let host = ProcessHost::start(dir.path(), &text).await;

    const EVENTS: usize = 48;
    let big = json!({"keys": 1500, "value_bytes": MIB});
    // The hoarders' events are sent while the probe runs, so the probe overlaps their
    // attempts however fast those commit.
    let ingest = host.ingest;
    let hoarders = tokio::spawn(async move {
        let mut latencies = Vec::new();
        for i in 0..EVENTS {
            // The first event also gets a 1.5 GiB attempt (from its body); the rest only fill.
            let body = if i == 0 { big.clone() } else { json!({}) };
            let (status, took) = post(ingest, "s", &format!("h{i}"), &body).await;
            assert_eq!(status, StatusCode::ACCEPTED);
            latencies.push(took);
        }
        latencies
    });
    let started = Instant::now();
    let mut probed = Vec::new();
    loop {
        let id = format!("probe{}", probed.len());
        let (status, took) = post(host.ingest, "ok", &id, &json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        probed.push(took);
        let (_, metrics) = host.admin_get("/metrics").await;
        let metrics = metrics.as_str().unwrap_or_default().to_owned();
        let drained = metrics.lines().any(|l| l == "hookd_backlog 0");
        if (hoarders.is_finished() && drained) || started.elapsed() > WAIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let probes = probed.len();
    let mut latencies = hoarders.await.unwrap();
    latencies.extend(probed);
    let mut sorted = latencies.clone();
    sorted.sort();
    let slowest = *sorted.last().unwrap();
    eprintln!(
        "{} acks ({probes} of them probes, sent meanwhile), median {:?}, slowest {slowest:?}; \
         hoarding took {:?}",
        sorted.len(),
        sorted[sorted.len() / 2],
        started.elapsed()
    );
    assert!(probes >= 3, "the probe ran while the hoarders did");
    let mut worst: Vec<(usize, Duration)> = latencies.iter().copied().enumerate().collect();
    worst.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
    eprintln!(
        "slowest acks (index, time): {:?}",
        &worst[..5.min(worst.len())]
    );
    // Generous for a loaded 2-core box; one commit of everything an attempt wrote took ~11 s.
    assert!(
        slowest < Duration::from_secs(5),
        "an ack took {slowest:?} while hoarders committed: {latencies:?}"
    );
    for i in 1..EVENTS {
        host.wait_state("s", &format!("h{i}"), "filler", "done", WAIT)
            .await;
    }
    host.wait_state("s", "h0", "hoarder", "dead", WAIT).await;
}

/// The plugin's total (10 keys, 1 MiB here) refuses the write that would cross it, as a
/// retryable `state_quota` failure naming the limit; deletes still work at the total and
/// free room, after which the refused event succeeds on replay.
#[tokio::test]
async fn the_plugin_total_refuses_once_reached_and_deletes_free_it() {
    let text = config(
        &["hoarder"],
        "[plugins.hoarder]\nmax_attempts = 1\nstate_max_keys = 10\nstate_max_mib = 1",
    );
    let host = TestHost::start(&text, &[("hoarder", plugins::HOARDER)]).await;
    let run = |id: &'static str, body: Value, state: &'static str| {
        let host = &host;
        async move {
            host.accept_event("s", id, &body).await;
            host.wait_state("s", id, "hoarder", state, WAIT).await
        }
    };

    run(
        "fill",
        json!({"keys": 10, "value_bytes": 100, "prefix": "a"}),
        "done",
    )
    .await;
    let d = run("over", json!({"keys": 1, "prefix": "b"}), "dead").await;
    assert_eq!(outcomes(&d), ["retry"], "{d:#}");
    assert_eq!(d["history"][0]["error_kind"], "state_quota");
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("would hold 11 keys")
            && error.contains("plugins.hoarder.state_max_keys = 10"),
        "{error}"
    );

    // At the total, deletes work; then the refused event fits.
    run(
        "free",
        json!({"keys": 10, "prefix": "a", "delete": true}),
        "done",
    )
    .await;
    let (status, reply) = host
        .admin_post(
            "/admin/replay",
            json!({"event_ids": ["over"], "handler": "hoarder"}),
        )
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    host.wait_state("s", "over", "hoarder", "done", WAIT).await;

    // The byte total: 2 × 600 000 bytes do not fit in 1 MiB.
    let d = run(
        "heavy",
        json!({"keys": 2, "value_bytes": 600_000, "prefix": "c"}),
        "dead",
    )
    .await;
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("plugins.hoarder.state_max_mib = 1 (1048576 bytes)"),
        "{error}"
    );
}

/// A 50 MB reason that starts with a forged log line and a terminal escape is stored capped
/// (a few KiB, with a marker) and logged capped and escaped, as are the plugin's own log lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mb_reason_is_stored_and_logged_capped_and_escaped() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("hoarder", plugins::HOARDER)]);
    let text = config(
        &["hoarder"],
        r#"[plugins.hoarder]
        memory_mib = 256
        config = { keys = 0, reason_bytes = 50000000, log = "plugin says\n2026-01-01T00:00:00Z ERROR hookd: forged log line\u001b[31m" }"#,
    );
    let host = ProcessHost::start(dir.path(), &text).await;
    assert_eq!(
        post(host.ingest, "s", "liar", &json!({})).await.0,
        StatusCode::ACCEPTED
    );
    let d = host.wait_state("s", "liar", "hoarder", "dead", WAIT).await;

    let (status, event) = host.admin_get("/admin/events/s/liar").await;
    assert_eq!(status, StatusCode::OK);
    let response = event.to_string().len();
    assert!(
        response < 64 * 1024,
        "the admin response is {response} bytes"
    );
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.len() < 4096 + 64,
        "stored reason of {} bytes",
        error.len()
    );
    assert!(
        error.starts_with("hoarder gives up\n2026-01-01T00:00:00Z ERROR hookd: forged line")
            && error.ends_with("… [truncated: 49995904 of 50000000 bytes dropped]"),
        "{}",
        &error[..200]
    );
    assert!(d["last_error"].as_str().unwrap().len() < 4096 + 128);

    // The log: the reason once, capped; nothing in it starts a line of its own.
    let log = host.wait_log("forged line", WAIT).await;
    assert!(
        log.len() < 256 * 1024,
        "the log grew to {} bytes",
        log.len()
    );
    assert!(
        log.contains("hoarder gives up\\n2026-01-01T00:00:00Z ERROR hookd: forged line\\u{1b}[2J"),
        "the reason is logged escaped:\n{log}"
    );
    assert!(
        log.contains("plugin says\\n2026-01-01T00:00:00Z ERROR hookd: forged log line\\u{1b}[31m"),
        "the plugin's log line is logged escaped:\n{log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z")),
        "a forged line reached the log:\n{log}"
    );
    assert!(
        !log.contains("\x1b[2J"),
        "a terminal escape reached the log"
    );
}

/// An empty state key is refused when written (`permanent`, `state_limit`): no admin path or
/// dashboard link can name it, so an operator could never read, fix or delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_state_key_is_refused_when_written() {
    let text = format!(
        "{}\n[plugins.scenario]\nmax_attempts = 1\n",
        sw_source("s", &["scenario"], "")
    );
    let host = TestHost::start(&text, &[("scenario", plugins::SCENARIO)]).await;
    host.accept_event("s", "empty-key", &json!({"do": "count", "key": ""}))
        .await;
    let d = host
        .wait_state("s", "empty-key", "scenario", "dead", WAIT)
        .await;
    let first = &d["history"][0];
    assert_eq!(
        (&first["outcome"], &first["error_kind"]),
        (&json!("permanent"), &json!("state_limit")),
        "{d:#}"
    );
    let error = first["error"].as_str().unwrap();
    assert!(error.contains(r#"state key "" is empty"#), "{d:#}");
}

/// A state key holding a NUL (U+0000) is refused at the handler's call, naming why, on every
/// backend (PostgreSQL cannot store one; on it the attempt failed with only a backtrace), and
/// a reason holding one is kept with it shown as `\u{0}`. Such a key, like one over the 1 KiB
/// cap, fails the attempt for good (`permanent`, `state_limit`, as the per-attempt caps do):
/// it would fail again on every retry (it was a `trap`, retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_key_holding_a_nul_is_refused_and_a_reasons_nul_is_kept_escaped() {
    let text = format!(
        "{}\n[plugins.scenario]\nmax_attempts = 1\n",
        sw_source("s", &["scenario"], "")
    );
    let host = TestHost::start(&text, &[("scenario", plugins::SCENARIO)]).await;
    host.accept_event("s", "nul-key", &json!({"do": "count", "key": "n\u{0}k"}))
        .await;
    let d = host
        .wait_state("s", "nul-key", "scenario", "dead", WAIT)
        .await;
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains(r#"state key "n\u{0}k" holds a NUL character (U+0000)"#),
        "{d:#}"
    );
    let kind = |d: &Value| {
        let first = &d["history"][0];
        (first["outcome"].clone(), first["error_kind"].clone())
    };
    assert_eq!(
        kind(&d),
        (json!("permanent"), json!("state_limit")),
        "{d:#}"
    );
    let long = "k".repeat(2000);
    host.accept_event("s", "long-key", &json!({"do": "count", "key": long}))
        .await;
    let d = host
        .wait_state("s", "long-key", "scenario", "dead", WAIT)
        .await;
    assert_eq!(
        kind(&d),
        (json!("permanent"), json!("state_limit")),
        "{d:#}"
    );
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("of 2000 bytes exceeds the 1024-byte cap on a key"),
        "{d:#}"
    );
    host.accept_event("s", "nul-op", &json!({"do": "a\u{0}b"}))
        .await;
    let d = host
        .wait_state("s", "nul-op", "scenario", "dead", WAIT)
        .await;
    assert_eq!(d["history"][0]["error"], "unknown op a\\u{0}b", "{d:#}");
}

/// Every distinct key an attempt reads is kept until its commit checks its version, so reads
/// are bounded too: 4 × `attempt_state_keys` distinct keys (40 here). Before, one attempt read
/// 3 million absent keys, the host grew to 3.3 GB, and the commit's checks stalled every
/// accept behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_reading_more_keys_than_its_cap_is_refused() {
    let text = config(
        &["hoarder"],
        "[plugins.hoarder]\nmax_attempts = 1\nattempt_state_keys = 10",
    );
    let host = TestHost::start(&text, &[("hoarder", plugins::HOARDER)]).await;
    host.accept_event("s", "within", &json!({"reads": 40, "keys": 1}))
        .await;
    host.wait_state("s", "within", "hoarder", "done", WAIT)
        .await;
    host.accept_event("s", "over", &json!({"reads": 41, "keys": 1}))
        .await;
    let d = host.wait_state("s", "over", "hoarder", "dead", WAIT).await;
    let error = d["history"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("state read of key \"over/r40\" refused: the attempt would read more than 40 distinct keys (4 × plugins.hoarder.attempt_state_keys)"),
        "{d:#}"
    );
}
