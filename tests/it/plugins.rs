//! Plugins in production, against a running host: hostile plugins are contained with the right
//! outcome while ingest keeps acknowledging; plugin files are replaced, corrupted, rolled back,
//! fixed after a dead letter and deleted while events flow; compiled code is cached across
//! restarts; `hookd dev` rebuilds a changed plugin crate and the host hot-swaps it.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    self, AdminApi, ProcessHost, TestHost, install_plugins, plugins, replace_atomically, sha,
    sw_source,
};

const WAIT: Duration = Duration::from_secs(60);
/// A correctness bound, not a speed claim: an acknowledgement that takes this long means
/// ingest was starved.
const ACK_BOUND: Duration = Duration::from_secs(2);

/// Signs and posts an event to source `source`; returns the status and how long it took.
async fn post(host: &TestHost, source: &str, id: &str, body: &Value) -> (StatusCode, Duration) {
    let started = Instant::now();
    let (status, _) = host.post_event(source, id, body).await;
    (status, started.elapsed())
}

async fn send(host: &TestHost, id: &str) {
    let (status, _) = post(host, "s", id, &json!({"n": id})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{id}");
}

fn plugin_file(host: &TestHost, stem: &str) -> PathBuf {
    host.path().join("plugins").join(format!("{stem}.wasm"))
}

/// Overwrites `file` in place with `wasm`'s bytes in 64 KiB writes a few milliseconds apart
/// (each pause far shorter than the reloader's settle time).
fn write_slowly(file: &Path, wasm: &str) {
    use std::io::Write as _;
    let bytes = std::fs::read(wasm).unwrap();
    let mut out = std::fs::File::create(file).unwrap();
    for chunk in bytes.chunks(64 * 1024) {
        out.write_all(chunk).unwrap();
        out.flush().unwrap();
        std::thread::sleep(Duration::from_millis(4));
    }
}

/// The attempts of a delivery: (outcome, error_kind, error, plugin_sha256).
fn history(delivery: &Value) -> Vec<(String, String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    delivery["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                text(&a["outcome"]),
                text(&a["error_kind"]),
                text(&a["error"]),
                text(&a["plugin_sha256"]),
            )
        })
        .collect()
}

/// Spinner, hog, deep and flood run (four spinners at once, more than the wasm pool has
/// threads) while a healthy source is posted to: every post is acknowledged within the bound,
/// the healthy deliveries complete, and each hostile attempt ends with its own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_are_contained_while_a_healthy_source_keeps_acknowledging() {
    let extra = sw_source(
        "bad",
        &["spinner", "hog", "deep", "flood"],
        r#"
        [plugins.spinner]
        timeout_ms = 1500
        max_attempts = 1
        [plugins.hog]
        max_attempts = 1
        memory_mib = 32
        [plugins.deep]
        max_attempts = 1
        [plugins.flood]
        max_attempts = 1
    "#,
    );
    let host = TestHost::start(
        &sw_source("s", &["counter"], &extra),
        &[
            ("counter", plugins::COUNTER),
            ("spinner", plugins::SPINNER),
            ("hog", plugins::HOG),
            ("deep", plugins::DEEP),
            ("flood", plugins::FLOOD),
        ],
    )
    .await;
    for i in 0..4 {
        let (status, took) = post(&host, "bad", &format!("bad_{i}"), &json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(
            took < ACK_BOUND,
            "hostile event {i} acknowledged in {took:?}"
        );
    }
    // The healthy source, while the spinners hold their attempts for 1.5 s each.
    for i in 0..25 {
        let (status, took) = post(&host, "s", &format!("ok_{i}"), &json!({"i": i})).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(
            took < ACK_BOUND,
            "healthy event {i} acknowledged in {took:?}"
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    for i in 0..25 {
        host.wait_state("s", &format!("ok_{i}"), "counter", "done", WAIT)
            .await;
    }

    let dead = |handler: &'static str, id: &'static str| {
        let host = &host;
        async move {
            let d = host.wait_state("bad", id, handler, "dead", WAIT).await;
            let h = history(&d);
            assert_eq!(h.len(), 1, "{handler}: {d:#}");
            h.into_iter().next().unwrap()
        }
    };
    for i in 0..4 {
        let id: &'static str = ["bad_0", "bad_1", "bad_2", "bad_3"][i];
        let (outcome, kind, error, _) = dead("spinner", id).await;
        assert_eq!(
            (outcome.as_str(), kind.as_str()),
            ("timeout", "timeout"),
            "{error}"
        );
        // Naming the setting to raise.
        assert!(
            error.contains("timed out after 1.5s (timeout_ms)"),
            "{error}"
        );

        let (outcome, kind, error, _) = dead("hog", id).await;
        assert_eq!(
            (outcome.as_str(), kind.as_str()),
            ("trap", "trap"),
            "{error}"
        );
        assert!(
            error.contains("memory limit exceeded") && error.contains("33554432"),
            "hog: {error}"
        );

        let (outcome, kind, error, _) = dead("deep", id).await;
        assert_eq!(
            (outcome.as_str(), kind.as_str()),
            ("trap", "trap"),
            "{error}"
        );
        assert!(error.contains("stack overflow"), "deep: {error}");

        let (outcome, kind, error, _) = dead("flood", id).await;
        assert_eq!(
            (outcome.as_str(), kind.as_str()),
            ("trap", "output_too_large"),
            "{error}"
        );
        assert!(
            error.contains("10000000 bytes exceeds the 65536-byte cap (output_kib)"),
            "flood: {error}"
        );
    }
    // The host is still fine afterwards.
    send(&host, "after").await;
    host.wait_state("s", "after", "counter", "done", WAIT).await;
}

/// The flood's 10 MB of logs leave the host as at most its log budget plus one truncation
/// marker (checked in the real process's log); `output_kib` raises the output cap per instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_logs_are_truncated_with_a_marker_and_the_output_cap_is_per_instance() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("flood", plugins::FLOOD)]);
    let config = sw_source(
        "s",
        &["flood", "roomy"],
        "[plugins.flood]\nmax_attempts = 1\n\
         [plugins.roomy]\nwasm = \"flood\"\nmax_attempts = 1\noutput_kib = 16384\nlog_kib = 1",
    );
    let host = ProcessHost::start(dir.path(), &config).await;
    let (status, reply) = support::post_sw(host.ingest, "s", "flood_1", b"{}")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");

    let deadline = Instant::now() + WAIT;
    let deliveries = loop {
        let (_, event) = host.admin_get("/admin/events/s/flood_1").await;
        let finished = event["deliveries"].as_array().is_some_and(|ds| {
            ds.len() == 2
                && ds
                    .iter()
                    .all(|d| d["state"] == "dead" || d["state"] == "done")
        });
        if finished {
            break event["deliveries"].as_array().unwrap().clone();
        }
        assert!(Instant::now() < deadline, "flood never finished: {event:#}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let of = |name: &str| deliveries.iter().find(|d| d["handler"] == name).unwrap();
    let flood = of("flood");
    assert_eq!(flood["state"], "dead", "{flood:#}");
    assert_eq!(flood["history"][0]["error_kind"], "output_too_large");
    assert!(flood["output"].is_null(), "{flood:#}");
    let roomy = of("roomy");
    assert_eq!(roomy["state"], "done", "{roomy:#}");
    assert_eq!(roomy["output"].as_str().map(str::len), Some(10_000_000));

    // Both attempts logged 10 MB; each may leave at most its cap (64 KiB, 1 KiB) + markers.
    let log = std::fs::read_to_string(dir.path().join("hookd.log")).unwrap();
    assert_eq!(
        log.matches("[log output truncated: per-call log cap reached]")
            .count(),
        2,
        "expected one truncation marker per attempt"
    );
    let flood_lines = log.matches("flood line ").count();
    assert_eq!(flood_lines, 2, "lines after the cap were not dropped");
    assert!(
        log.len() < 200 * 1024,
        "hookd.log is {} bytes: the logs were not capped",
        log.len()
    );

    // 200 000 empty lines per attempt: each line costs the budget its own share too, so they
    // are cut at the same cap (about 500 and 8 lines) instead of writing tens of MB.
    let (status, reply) = support::post_sw(host.ingest, "s", "flood_2", b"empty-lines")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    for handler in ["flood", "roomy"] {
        let d = host.wait_state("s", "flood_2", handler, "done", WAIT).await;
        assert_eq!(d["output"], "logged", "{d:#}");
    }
    let grown = std::fs::read_to_string(dir.path().join("hookd.log")).unwrap();
    assert_eq!(
        grown
            .matches("[log output truncated: per-call log cap reached]")
            .count(),
        4,
        "expected one truncation marker per attempt"
    );
    assert!(
        grown.len() - log.len() < 200 * 1024,
        "the empty lines added {} bytes to hookd.log: their lines were not counted",
        grown.len() - log.len()
    );
    drop(host);
}

/// Events keep flowing while the handler's file is overwritten in place, slowly (as a `cp`
/// over a slow disk or network would): the half-written file is never loaded (no error ever
/// shows), no delivery fails, old attempts ran the old sha, and once the new sha is live every
/// new attempt runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_plugin_under_load_fails_no_delivery_and_new_attempts_run_the_new_sha() {
    let host = Arc::new(
        TestHost::start(
            &sw_source("s", &["h"], "[plugins.h]\nmax_attempts = 1"),
            &[("h", plugins::FLAKY)],
        )
        .await,
    );
    let old = sha(&host.plugin("h").await).unwrap();
    let file = plugin_file(&host, "h");

    let poster = {
        let host = host.clone();
        tokio::spawn(async move {
            for i in 0..120 {
                send(&host, &format!("load_{i}")).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // Let some events go through the old version, then overwrite the file in place.
    host.wait_state("s", "load_10", "h", "done", WAIT).await;
    let writer = tokio::task::spawn_blocking(move || write_slowly(&file, plugins::CLASSIFIER));
    // Until the new version is live, the old one serves and no load error appears.
    let deadline = Instant::now() + WAIT;
    let new = loop {
        let status = host.plugin("h").await;
        assert!(
            status["error"].is_null(),
            "a partial file was loaded: {status:#}"
        );
        if let Some(new) = sha(&status).filter(|s| *s != old) {
            break new;
        }
        assert!(Instant::now() < deadline, "no swap: {status:#}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        writer.is_finished(),
        "the file was loaded before it was written"
    );
    writer.await.unwrap();
    let swapped_at = Instant::now();
    let mut after_swap = Vec::new();
    for i in 0..10 {
        let id = format!("after_{i}");
        send(&host, &id).await;
        after_swap.push(id);
    }
    poster.await.unwrap();

    let mut ran = std::collections::BTreeMap::<String, usize>::new();
    let ids = (0..120)
        .map(|i| format!("load_{i}"))
        .chain(after_swap.clone());
    for id in ids {
        let d = host.wait_state("s", &id, "h", "done", WAIT).await;
        let h = history(&d);
        assert_eq!(h.len(), 1, "{id} needed more than one attempt: {d:#}");
        let (outcome, _, _, ran_sha) = &h[0];
        assert_eq!(outcome, "ok", "{id}: {d:#}");
        assert!(ran_sha == &old || ran_sha == &new, "{id} ran {ran_sha}");
        // The output says which plugin ran, independently of the recorded sha.
        let output = d["output"].as_str().unwrap();
        let by_output = if output.contains("\"label\"") {
            &new
        } else {
            &old
        };
        assert_eq!(ran_sha, by_output, "{id}: output {output} vs sha {ran_sha}");
        if after_swap.contains(&id) {
            assert_eq!(
                ran_sha, &new,
                "{id} was posted after the swap ({swapped_at:?})"
            );
        }
        *ran.entry(ran_sha.clone()).or_default() += 1;
    }
    assert!(ran.get(&old).copied().unwrap_or(0) >= 11, "{ran:?}");
    assert!(ran.get(&new).copied().unwrap_or(0) >= 10, "{ran:?}");
}

/// A truncated file, a file of random bytes and a component without the configured role never
/// evict the working version; the error names the file and the reason; a good file clears it.
/// A replacement with the same size and modification time is noticed all the same, and a
/// directory in the file's place is refused, not taken for a removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_file_keeps_the_old_version_live_and_reports_the_error() {
    let host = TestHost::start(&sw_source("s", &["h"], ""), &[("h", plugins::FLAKY)]).await;
    let v1 = sha(&host.plugin("h").await).unwrap();
    let file = plugin_file(&host, "h");

    let good = std::fs::read(plugins::CLASSIFIER).unwrap();
    std::fs::write(&file, &good[..good.len() / 2]).unwrap();
    let status = host
        .wait_plugin("h", "the truncated file's error", WAIT, |p| {
            !p["error"].is_null()
        })
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains(&file.display().to_string()) && error.contains("refused"),
        "{error}"
    );
    assert_eq!(sha(&status).as_deref(), Some(v1.as_str()), "{status:#}");
    send(&host, "while_truncated").await;
    let d = host
        .wait_state("s", "while_truncated", "h", "done", WAIT)
        .await;
    assert_eq!(history(&d)[0].3, v1);

    // A good file clears the error and goes live.
    replace_atomically(&file, &std::fs::read(plugins::CLASSIFIER).unwrap());
    let status = host
        .wait_plugin("h", "the good file", WAIT, |p| {
            p["error"].is_null() && sha(p).is_some_and(|s| s != v1)
        })
        .await;
    let v2 = sha(&status).unwrap();
    assert_eq!(status["previous"], json!([v1]));

    // Random bytes: refused, v2 stays.
    let noise: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &noise).unwrap();
    let status = host
        .wait_plugin("h", "the random file's error", WAIT, |p| {
            !p["error"].is_null()
        })
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("h.wasm") && error.contains("not a valid WebAssembly component"),
        "{error}"
    );
    assert_eq!(sha(&status).as_deref(), Some(v2.as_str()));
    send(&host, "while_noise").await;
    let d = host.wait_state("s", "while_noise", "h", "done", WAIT).await;
    assert_eq!(history(&d)[0].3, v2);

    // A valid component without the role the source uses it in (a parser where a handler is
    // configured) is refused too: loaded, it would dead-letter every event.
    replace_atomically(&file, &std::fs::read(plugins::GITHUB).unwrap());
    let status = host
        .wait_plugin("h", "the parser-only file's error", WAIT, |p| {
            p["error"].as_str().is_some_and(|e| e.contains("role"))
        })
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("does not export the handler role that sources.s.handlers (h) uses it as")
            && error.contains("(it exports: parser)"),
        "{error}"
    );
    assert_eq!(sha(&status).as_deref(), Some(v2.as_str()), "{status:#}");
    send(&host, "while_parser_only").await;
    let d = host
        .wait_state("s", "while_parser_only", "h", "done", WAIT)
        .await;
    assert_eq!(history(&d)[0].3, v2);

    // A file renamed into place with the same size and modification time as the one before it
    // (as reproducible builds make them) is still a change: here one of noise, refused.
    replace_atomically(&file, &good);
    host.wait_plugin("h", "v2's bytes again", WAIT, |p| p["error"].is_null())
        .await;
    let before = std::fs::metadata(&file).unwrap();
    let twin = file.with_extension("wasm.twin");
    let mut same_size = noise.clone();
    same_size.resize(good.len(), 0);
    std::fs::write(&twin, &same_size).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&twin)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
    assert_eq!(std::fs::metadata(&twin).unwrap().len(), before.len());
    std::fs::rename(&twin, &file).unwrap();
    let status = host
        .wait_plugin("h", "the same-size, same-mtime file's error", WAIT, |p| {
            !p["error"].is_null()
        })
        .await;
    assert_eq!(sha(&status).as_deref(), Some(v2.as_str()), "{status:#}");

    // A directory in the file's place is refused, naming what it is; it is not the file's
    // removal, so v2 stays live.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let status = host
        .wait_plugin("h", "the directory's error", WAIT, |p| {
            p["error"]
                .as_str()
                .is_some_and(|e| e.contains("a directory"))
        })
        .await;
    assert_eq!(sha(&status).as_deref(), Some(v2.as_str()), "{status:#}");
    send(&host, "while_a_directory").await;
    let d = host
        .wait_state("s", "while_a_directory", "h", "done", WAIT)
        .await;
    assert_eq!(history(&d)[0].3, v2);
}

/// `POST /admin/plugins/{name}/rollback` makes the previous version live; the file on disk is
/// still the newer one, and an unknown plugin or one without history is refused. Each rollback
/// goes one version further back: the version rolled back from is not a rollback target, so
/// pressing it twice never brings the bad version back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_makes_the_previous_sha_live() {
    let config = sw_source("s", &["h"], "") + "\n[plugins.b]\nwasm = \"broken\"\n";
    let host = TestHost::start(&config, &[("h", plugins::FLAKY)]).await;
    let v1 = sha(&host.plugin("h").await).unwrap();
    let (status, reply) = host
        .admin_post("/admin/plugins/h/rollback", json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    assert_eq!(reply["error"], "conflict", "{reply}");
    let (status, _) = host
        .admin_post("/admin/plugins/nope/rollback", json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A file hookd never loaded (here: empty) has nothing to go back to: 404, naming the
    // instance asked for and its file.
    std::fs::write(plugin_file(&host, "broken"), b"").unwrap();
    host.wait_plugin("b", "the refusal", WAIT, |p| p["error"].is_string())
        .await;
    let (status, reply) = host
        .admin_post("/admin/plugins/b/rollback", json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reply}");
    assert!(
        reply["detail"]
            .as_str()
            .unwrap()
            .starts_with("plugin b: plugin file \"broken\" was never loaded ("),
        "{reply}"
    );

    let mut versions = vec![v1.clone()];
    for wasm in [plugins::CLASSIFIER, plugins::COUNTER] {
        replace_atomically(&plugin_file(&host, "h"), &std::fs::read(wasm).unwrap());
        let last = versions.last().unwrap().clone();
        let status = host
            .wait_plugin("h", "the swap", WAIT, |p| sha(p).is_some_and(|s| s != last))
            .await;
        versions.push(sha(&status).unwrap());
    }
    let v2 = versions[1].clone();
    assert_eq!(host.plugin("h").await["previous"], json!([v2, v1]));

    // v3 -> v2 (v3 is dropped from the targets), then v2 -> v1; `loaded_at` says when the
    // version went live again, not when it was first loaded.
    for (back, left) in [(&v2, json!([v1])), (&v1, json!([]))] {
        let asked = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let (status, reply) = host
            .admin_post("/admin/plugins/h/rollback", json!({}))
            .await;
        assert_eq!(
            (status, reply),
            (
                StatusCode::OK,
                json!({"name": "h", "sha256": back, "instances": ["h"]})
            )
        );
        let live = host.plugin("h").await;
        assert_eq!(live["previous"], left);
        assert!(live["loaded_at"].as_i64().unwrap() >= asked, "{live:#}");
        if back == &v2 {
            send(&host, "on_v2").await;
            let d = host.wait_state("s", "on_v2", "h", "done", WAIT).await;
            assert_eq!(history(&d)[0].3, v2);
        }
    }
    let (status, _) = host
        .admin_post("/admin/plugins/h/rollback", json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a third rollback had nowhere to go"
    );
    let status = host.plugin("h").await;
    assert_eq!(sha(&status).as_deref(), Some(v1.as_str()));
    assert_eq!(status["previous"], json!([]), "{status:#}");
    send(&host, "on_v1").await;
    let d = host.wait_state("s", "on_v1", "h", "done", WAIT).await;
    assert_eq!(history(&d)[0].3, v1);
    assert!(
        d["output"].as_str().unwrap().contains("\"attempt\""),
        "{d:#}"
    );
}

/// A crasher dead-letters; its file is replaced by a working handler; replay completes on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_event_replays_to_done_after_the_file_is_fixed() {
    let extra = "[plugins.h]\nmax_attempts = 2\nbackoff_base_ms = 10\nbackoff_max_ms = 20";
    let host = TestHost::start(&sw_source("s", &["h"], extra), &[("h", plugins::CRASHER)]).await;
    let crasher = sha(&host.plugin("h").await).unwrap();
    send(&host, "doomed").await;
    let d = host.wait_state("s", "doomed", "h", "dead", WAIT).await;
    let h = history(&d);
    assert_eq!(h.len(), 2, "{d:#}");
    assert!(
        h.iter().all(|(o, _, _, s)| o == "trap" && s == &crasher),
        "{h:?}"
    );

    replace_atomically(
        &plugin_file(&host, "h"),
        &std::fs::read(plugins::FLAKY).unwrap(),
    );
    let fixed = sha(&host
        .wait_plugin("h", "the fix", WAIT, |p| {
            sha(p).is_some_and(|s| s != crasher)
        })
        .await)
    .unwrap();
    let (status, reply) = host
        .admin_post("/admin/replay", json!({"event_ids": ["doomed"]}))
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    let d = host.wait_state("s", "doomed", "h", "done", WAIT).await;
    let h = history(&d);
    assert_eq!(h.len(), 3, "{d:#}");
    assert_eq!((h[2].0.as_str(), h[2].3.as_str()), ("ok", fixed.as_str()));
}

/// Deleting the file unloads the plugin: its deliveries wait (not claimed, not dead-lettered)
/// until the file is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_file_unloads_the_plugin_and_its_deliveries_wait() {
    let host = TestHost::start(&sw_source("s", &["h"], ""), &[("h", plugins::FLAKY)]).await;
    let v1 = sha(&host.plugin("h").await).unwrap();
    let file = plugin_file(&host, "h");
    std::fs::remove_file(&file).unwrap();
    let status = host
        .wait_plugin("h", "the unload", WAIT, |p| p["sha256"].is_null())
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("h.wasm") && error.contains("removed"),
        "{error}"
    );
    assert_eq!(status["previous"], json!([v1]));

    send(&host, "waiting").await;
    // A negative check needs a window: for four rounds of the dispatcher (about two seconds)
    // nothing claims it.
    let (_, metrics) = host.admin_get("/metrics").await;
    support::wait_rounds(
        async |p: &str| host.admin_get(p).await,
        support::rounds(&metrics),
        4,
    )
    .await;
    let d = host
        .wait_delivery("s", "waiting", "h", WAIT, |_| true)
        .await;
    assert_eq!(
        (d["state"].as_str(), d["attempts"].as_i64()),
        (Some("pending"), Some(0)),
        "{d:#}"
    );

    replace_atomically(&file, &std::fs::read(plugins::FLAKY).unwrap());
    let d = host.wait_state("s", "waiting", "h", "done", WAIT).await;
    assert_eq!(history(&d).len(), 1, "{d:#}");
    assert_eq!(history(&d)[0].3, v1);
    assert!(host.plugin("h").await["error"].is_null());
}

/// Compiled code lands in the host-private cache keyed by the file's sha256; a restart uses it;
/// a corrupt entry is compiled again (and rewritten) instead of failing the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_artifacts_are_cached_and_a_corrupt_entry_is_recompiled() {
    let config = sw_source("s", &["h"], "");
    let host = TestHost::start(&config, &[("h", plugins::FLAKY)]).await;
    let v1 = sha(&host.plugin("h").await).unwrap();
    let cache = host.path().join(".hookd-cache");
    let entries = || -> Vec<PathBuf> {
        std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
            .collect()
    };
    let found = entries();
    assert_eq!(found.len(), 1, "{found:?}");
    let entry = found[0].clone();
    assert!(
        entry
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&v1),
        "{entry:?} is not keyed by {v1}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&cache), mode(&entry)), (0o700, 0o600));
    }
    // Every compile writes its entry anew (temporary file + rename: a new inode), so an entry
    // that keeps its inode across a restart was loaded, not compiled.
    let inode = |p: &Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).unwrap().ino()
    };
    let first = inode(&entry);

    let host = TestHost::start_in(host.stop().await, &config).await;
    let status = host.plugin("h").await;
    assert_eq!(sha(&status).as_deref(), Some(v1.as_str()), "{status:#}");
    assert_eq!(inode(&entry), first, "the warm restart compiled again");

    let dir = host.stop().await;
    let corrupt = b"\x7fELF but not really an artifact";
    std::fs::write(&entry, corrupt).unwrap();
    let host = TestHost::start_in(dir, &config).await;
    let status = host.plugin("h").await;
    assert_eq!(sha(&status).as_deref(), Some(v1.as_str()), "{status:#}");
    assert!(status["error"].is_null(), "{status:#}");
    let rewritten = std::fs::read(&entry).unwrap();
    assert!(
        rewritten != corrupt && rewritten.len() > 100_000,
        "the corrupt entry was not replaced by a fresh compile"
    );
    // (Not by inode: the fresh file may reuse the number the refused one freed.)
    send(&host, "after_restart").await;
    let d = host
        .wait_state("s", "after_restart", "h", "done", WAIT)
        .await;
    assert_eq!(history(&d)[0].3, v1);
    assert_eq!(entries(), [entry]);
}

/// A plugin whose load failed for a reason of the moment (here its compile process, which fails
/// the first time) is loaded again, its file unchanged, and its events are handled: before, it
/// stayed unloaded until its file changed or hookd restarted (and a cluster node that adopted a
/// version that way gave its file back the old version and ran that one for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_failed_for_a_reason_of_the_moment_is_tried_again() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("h", plugins::FLAKY)]);
    let (compiler, marker) = (
        dir.path().join("compiler.sh"),
        dir.path().join("failed-once"),
    );
    std::fs::write(
        &compiler,
        format!(
            "#!/bin/sh\nif [ ! -e {marker:?} ]; then : > {marker:?}; exit 70; fi\nexec {:?} \"$@\"\n",
            env!("CARGO_BIN_EXE_hookd"),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&compiler, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = format!(
        "[server]\nadmin_token = \"{}\"\ncompiler = {compiler:?}\n{}\n[plugins.h]\nwasm = \"h\"\n",
        support::ADMIN_TOKEN,
        sw_source("s", &["h"], ""),
    );
    let host = ProcessHost::start_exact(dir.path(), &config).await;
    assert!(marker.exists(), "the first compile ran, and failed");
    let (status, reply) = support::post_sw(host.ingest, "s", "e1", b"{}")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    host.wait_state("s", "e1", "h", "done", WAIT).await;
    let log = host.log();
    assert!(log.contains("compiling"), "the failure was logged: {log}");
}
