//! `GET /metrics` against a running host: the counters and histograms move with real traffic
//! (ingest by source and outcome, attempts, retries, dead letters, outbound requests, plugin
//! loads), the database-derived gauges follow the inbox, and every series the host exports is
//! documented in the README.

use std::{collections::BTreeSet, time::Duration};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{self, AdminApi, TestHost, plugins, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// The value of the series `series` (name with its labels, as rendered), if present.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

/// A client whose connection is reset in the middle of its body is not counted (nobody reads
/// the answer), as one gone before its answer was ready is not. One that closes only its
/// sending side mid-body still reads its answer (a half-closed connection is served): a 400
/// saying the body ended early, counted as a `bad_request`, as a malformed body (a chunk size
/// that is not hex) is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_mid_body_is_not_counted_and_a_cut_or_malformed_body_is() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = TestHost::start(&sw_source("s", &[], ""), &[]).await;
    let head = b"POST /hooks/s HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123";
    for _ in 0..3 {
        let mut socket = tokio::net::TcpStream::connect(host.ingest).await.unwrap();
        socket.write_all(head).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket.set_zero_linger().unwrap(); // dropped: a reset, not a close
    }
    let answer = |request: &'static [u8], half_close: bool| {
        let ingest = host.ingest;
        async move {
            let mut socket = tokio::net::TcpStream::connect(ingest).await.unwrap();
            socket.write_all(request).await.unwrap();
            if half_close {
                socket.shutdown().await.unwrap();
            }
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(WAIT, socket.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    let cut = answer(head, true).await;
    assert!(cut.starts_with("HTTP/1.1 400"), "{cut}");
    assert!(
        cut.contains("ended after 4 of its declared 100 bytes"),
        "{cut}"
    );
    let malformed =
        b"POST /hooks/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
    let malformed = answer(malformed, false).await;
    assert!(malformed.starts_with("HTTP/1.1 400"), "{malformed}");
    let metrics = support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &["hookd_ingest_requests_total{source=\"s\",outcome=\"bad_request\"} 2"],
    )
    .await;
    let gone = metrics.lines().find(|l| l.contains("client_gone"));
    assert_eq!(gone, None, "a reset was counted");
}

/// Traffic of every kind moves exactly the series it should: three answered requests of
/// source `s` (accepted, duplicate, a bad signature), one for an unknown source, a delivery that
/// is retried once then done, one dead-lettered at once, and a handler whose outbound request
/// the host refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_with_traffic() {
    let config = sw_source("s", &["flaky"], "")
        + &sw_source("n", &["netprobe"], "")
        + "\n[sources.sl]\nscheme = \"slack\"\nsecrets = [\"slack-secret\"]\n"
        + "\n[plugins.flaky]\nbackoff_base_ms = 10\nbackoff_max_ms = 10\n";
    let host = TestHost::start(
        &config,
        &[("flaky", plugins::FLAKY), ("netprobe", plugins::NETPROBE)],
    )
    .await;

    host.accept_event("s", "retried", &json!({"fail_times": 1}))
        .await;
    let again = host
        .accept_event("s", "retried", &json!({"fail_times": 1}))
        .await;
    assert_eq!(again["duplicate"], true);
    let (status, _) = support::post_hook(
        host.ingest,
        "s",
        &[
            ("webhook-id", "forged"),
            ("webhook-timestamp", "1"),
            ("webhook-signature", "v1,AAAA"),
        ]
        .map(|(name, value)| {
            (
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            )
        }),
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = support::post_sw(host.ingest, "nosuch", "x", b"{}")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A forged handshake is a refusal, not a handshake answered.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let (status, _) = support::post_hook(
        host.ingest,
        "sl",
        &[
            (
                HeaderName::from_static("x-slack-request-timestamp"),
                HeaderValue::from_str(&now).unwrap(),
            ),
            (
                HeaderName::from_static("x-slack-signature"),
                HeaderValue::from_static("v0=00"),
            ),
        ],
        br#"{"type":"url_verification","challenge":"c"}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Refusals outside a source's POST are counted too: under the source when it is one (a
    // method it does not take, a GET for a scheme without a GET handshake), else under
    // source "" (paths that are no route, a source name that is not UTF-8, answered as JSON).
    let ingest = format!("http://{}", host.ingest);
    for (method, path, status) in [
        (Method::PUT, "/hooks/s", StatusCode::METHOD_NOT_ALLOWED),
        (Method::GET, "/hooks/s", StatusCode::METHOD_NOT_ALLOWED),
        (Method::PUT, "/hooks/nosuch", StatusCode::METHOD_NOT_ALLOWED),
        (Method::GET, "/hooks/nosuch", StatusCode::NOT_FOUND),
        (Method::POST, "/hooks", StatusCode::NOT_FOUND),
        (Method::POST, "/hooks/s/", StatusCode::NOT_FOUND),
        (Method::POST, "/hooks/%ff", StatusCode::BAD_REQUEST),
    ] {
        let (got, headers, body) = support::send(
            method.clone(),
            &format!("{ingest}{path}"),
            &[],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(got, status, "{method} {path}");
        let body: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("{method} {path}: {headers:?} {body:?}"));
        assert!(body["error"].is_string(), "{method} {path}: {body}");
    }
    host.accept_event("s", "doomed", &json!({"permanent": true}))
        .await;
    host.accept_event("n", "probe", &json!({"urls": ["http://127.0.0.1:9/"]}))
        .await;

    host.wait_state("s", "retried", "flaky", "done", WAIT).await;
    host.wait_state("s", "doomed", "flaky", "dead", WAIT).await;
    host.wait_state("n", "probe", "netprobe", "done", WAIT)
        .await;

    let metrics = support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &[
            r#"hookd_deliveries{state="done"} 2"#,
            r#"hookd_deliveries{state="dead"} 1"#,
            r#"hookd_deliveries{state="pending"} 0"#,
            r#"hookd_oldest_due_seconds 0"#,
            r#"hookd_quarantined 0"#,
            r#"hookd_backlog 0"#,
        ],
    )
    .await;
    let expect = [
        (
            r#"hookd_ingest_requests_total{source="s",outcome="accepted"}"#,
            2.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="s",outcome="duplicate"}"#,
            1.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="s",outcome="invalid_signature"}"#,
            1.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="s",outcome="quarantined"}"#,
            0.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="n",outcome="accepted"}"#,
            1.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="s",outcome="method_not_allowed"}"#,
            2.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="sl",outcome="invalid_signature"}"#,
            1.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="sl",outcome="responded"}"#,
            0.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="",outcome="unknown_source"}"#,
            2.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="",outcome="method_not_allowed"}"#,
            1.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="",outcome="not_found"}"#,
            2.0,
        ),
        (
            r#"hookd_ingest_requests_total{source="",outcome="bad_request"}"#,
            1.0,
        ),
        (r#"hookd_ingest_duration_seconds_count{source="s"}"#, 6.0),
        (
            r#"hookd_attempts_total{plugin="flaky",outcome="retry"}"#,
            1.0,
        ),
        (r#"hookd_attempts_total{plugin="flaky",outcome="ok"}"#, 1.0),
        (
            r#"hookd_attempts_total{plugin="flaky",outcome="permanent"}"#,
            1.0,
        ),
        (
            r#"hookd_attempts_total{plugin="flaky",outcome="trap"}"#,
            0.0,
        ),
        (
            r#"hookd_attempt_duration_seconds_count{plugin="flaky"}"#,
            3.0,
        ),
        (r#"hookd_retries_scheduled_total{plugin="flaky"}"#, 1.0),
        (r#"hookd_dead_letters_total{plugin="flaky"}"#, 1.0),
        (
            r#"hookd_outbound_requests_total{plugin="netprobe",result="denied"}"#,
            1.0,
        ),
        (
            r#"hookd_outbound_requests_total{plugin="netprobe",result="ok"}"#,
            0.0,
        ),
        (
            r#"hookd_plugin_loads_total{file="flaky",result="loaded"}"#,
            1.0,
        ),
    ];
    for (series, want) in expect {
        assert_eq!(
            value(&metrics, series),
            Some(want),
            "{series} in\n{metrics}"
        );
    }
    // Histograms: every request in the bucket past the slowest bound, none below zero.
    let inf = value(
        &metrics,
        r#"hookd_ingest_duration_seconds_bucket{source="s",le="+Inf"}"#,
    );
    assert_eq!(inf, Some(6.0), "{metrics}");
    let commits = value(&metrics, "hookd_inbox_commits_total").unwrap();
    let batches = value(&metrics, "hookd_inbox_commit_batch_size_count").unwrap();
    let ops = value(&metrics, "hookd_inbox_commit_batch_size_sum").unwrap();
    assert!(commits >= 5.0 && batches >= 5.0, "{metrics}");
    // Three accepts and at least four finishes were committed, sharing commits or not.
    assert!(ops >= 7.0, "{ops} operations in {batches} commits");
    // The live version of each file, as the admin API reports it.
    let (_, listed) = host.admin_get("/admin/plugins").await;
    let flaky = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "flaky")
        .unwrap();
    let sha = support::sha(flaky).unwrap();
    let info = format!(r#"hookd_plugin_info{{file="flaky",sha256="{sha}"}}"#);
    assert_eq!(value(&metrics, &info), Some(1.0), "{metrics}");
    // The process itself.
    assert!(value(&metrics, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(value(&metrics, "process_open_fds").unwrap() >= 3.0);
    // CPU seconds as measured, not cut to whole seconds (a gauge: `metrics` counters are
    // integers); no address-space limit is -1, not a limit of 0 bytes.
    assert!(
        metrics.contains("# TYPE process_cpu_seconds_total gauge\n"),
        "{metrics}"
    );
    let cpu = value(&metrics, "process_cpu_seconds_total").unwrap();
    assert!(cpu > 0.0, "{cpu}");
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let unlimited = limits
        .lines()
        .any(|l| l.starts_with("Max address space") && l.contains("unlimited"));
    let max = value(&metrics, "process_virtual_memory_max_bytes").unwrap();
    assert_eq!(max < 0.0, unlimited, "{max}: {limits}");
    // Nothing a request chose becomes a label.
    assert!(!metrics.contains("nosuch") && !metrics.contains("forged"));
}

/// The lag gauge grows while a due delivery waits (its plugin is not loaded), and is read
/// from the sample, not by a query per scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_due_delivery_shows_how_far_dispatch_lags() {
    let host = TestHost::start(&sw_source("s", &["absent"], ""), &[]).await;
    host.accept_event("s", "waits", &json!({})).await;
    support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &[r#"hookd_deliveries{state="pending"} 1"#],
    )
    .await;
    let lag = |metrics: &str| value(metrics, "hookd_oldest_due_seconds").unwrap();
    let (_, first) = host.admin_get("/metrics").await;
    let first = lag(first.as_str().unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, later) = host.admin_get("/metrics").await;
    let later = lag(later.as_str().unwrap());
    assert!(
        later >= first + 1.0,
        "the lag went from {first} s to {later} s"
    );
}

/// Every series `/metrics` exports has a line in the README's metrics table, and every
/// `hookd_` name in that table is exported: the documented list cannot drift from the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exported_series_is_documented() {
    let host = TestHost::start(
        &sw_source("s", &["flaky"], ""),
        &[("flaky", plugins::FLAKY)],
    )
    .await;
    host.accept_event("s", "one", &json!({})).await;
    host.wait_state("s", "one", "flaky", "done", WAIT).await;
    let (_, metrics) = host.admin_get("/metrics").await;
    let exported: BTreeSet<String> = metrics
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let section = readme
        .split("\n### Metrics\n")
        .nth(1)
        .expect("the README has a Metrics section")
        .split("\n#")
        .next()
        .unwrap();
    let documented: BTreeSet<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l.split('`').next().unwrap().to_owned())
        .collect();
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in the README: {undocumented:?}"
    );
    let missing: Vec<_> = documented
        .iter()
        .filter(|name| name.starts_with("hookd_"))
        .filter(|name| !exported.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "documented but not exported: {missing:?}"
    );

    // The Grafana dashboard the README ships queries only series that exist.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/grafana-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            for word in words.filter(|w| w.starts_with("hookd_") || w.starts_with("process_")) {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| word.strip_suffix(suffix))
                    .filter(|base| exported.contains(*base))
                    .unwrap_or(word);
                queried.insert(base.to_owned());
            }
        }
    }
    let unknown: Vec<_> = queried.difference(&exported).collect();
    assert!(unknown.is_empty(), "the dashboard queries {unknown:?}");
    assert!(queried.len() >= 12, "{queried:?}");
}

/// Every configured source's and handler's counters exist at 0 from the start: a series that
/// first appears at 1 is an increase `rate()` and `increase()` never see, so an alert on the
/// first dead letter after a restart stayed silent.
#[tokio::test]
async fn configured_sources_and_handlers_are_counted_from_zero() {
    let host = TestHost::start(
        &sw_source("s", &["flaky"], ""),
        &[("flaky", plugins::FLAKY)],
    )
    .await;
    let (_, metrics) = host.admin_get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    for series in [
        r#"hookd_ingest_requests_total{source="s",outcome="accepted"}"#,
        r#"hookd_attempts_total{plugin="flaky",outcome="ok"}"#,
        r#"hookd_dead_letters_total{plugin="flaky"}"#,
        r#"hookd_retries_scheduled_total{plugin="flaky"}"#,
    ] {
        assert_eq!(value(&metrics, series), Some(0.0), "{series}:\n{metrics}");
    }
}
