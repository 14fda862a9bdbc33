//! What hookd's log says and how: context from spans, no colour codes in a file, and JSON
//! lines for log shippers. Each test runs the real `hookd serve` with stderr in a file.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{AdminApi as _, ProcessHost, install_plugins, plugins, post_sw, sw_source};

const WAIT: Duration = Duration::from_secs(60);
const GREETING: &str = "guest says hello";

/// Source `s` → handler `h` (`hoarder`, which logs the body's `log` text); source `q` names a
/// parser no file provides, so its requests are quarantined.
fn config() -> String {
    sw_source("s", &["h"], "")
        + &sw_source("q", &[], "parser = \"absent\"\n")
        + "[plugins.absent]\nconfig = { id_pointer = \"/id\" }\n"
}

async fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> ProcessHost {
    install_plugins(dir, &[("h", plugins::HOARDER)]);
    ProcessHost::start_with_env(dir, &config(), env).await
}

async fn log_from_the_guest(host: &ProcessHost) -> String {
    let body = json!({ "log": GREETING, "keys": 0 }).to_string();
    let (status, reply) = post_sw(host.ingest, "s", "log-1", body.as_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{status} {reply}");
    host.wait_log(GREETING, WAIT).await
}

/// A plugin's log line names the plugin, the event and the attempt without the plugin (or the
/// host) writing them: they come from the `attempt` and `call` spans it ran in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_log_line_carries_the_attempt_and_the_plugin_from_its_spans() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[]).await;
    let log = log_from_the_guest(&host).await;
    let line = log.lines().find(|l| l.contains(GREETING)).unwrap();
    // The event id is untrusted text: written quoted and escaped, never raw.
    for field in [
        "handler=h",
        "event=\"log-1\"",
        "attempt=1",
        "plugin=h",
        "role=handler",
    ] {
        assert!(line.contains(field), "{field} missing from {line:?}");
    }
}

/// stderr is a file here, not a terminal: no ANSI escape codes in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_to_a_file_has_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[]).await;
    let log = log_from_the_guest(&host).await;
    assert!(!log.contains('\u{1b}'), "escape codes in:\n{log}");
}

/// Parses every line of a JSON log, failing on the first that is not one JSON object.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let value: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            assert!(value.is_object(), "not an object: {l:?}");
            value
        })
        .collect()
}

/// The lines of the JSON log `log` whose message is `message`.
fn lines_saying(log: &str, message: &str) -> Vec<Value> {
    json_lines(log)
        .into_iter()
        .filter(|l| l["fields"]["message"] == message)
        .collect()
}

/// The first line of `host`'s JSON log whose message contains `needle`, once there is one.
async fn line_containing(host: &ProcessHost, needle: &str) -> Value {
    let log = host.wait_log(needle, WAIT).await;
    json_lines(&log)
        .into_iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle))
        })
        .unwrap_or_else(|| panic!("no line's message says {needle:?} in:\n{log}"))
}

/// The span named `name` among the spans a JSON log line ran in.
fn span<'a>(line: &'a Value, name: &str) -> &'a Value {
    line["spans"]
        .as_array()
        .and_then(|spans| spans.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no {name} span in {line}"))
}

/// With `HOOKD_LOG_FORMAT=json`, every line is one JSON object, and a guest's line carries its
/// attempt and call spans as data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_with_the_attempts_spans() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[("HOOKD_LOG_FORMAT", "json")]).await;
    let log = log_from_the_guest(&host).await;
    let lines = json_lines(&log);
    let guest = lines
        .iter()
        .find(|l| l["fields"]["message"] == GREETING)
        .unwrap_or_else(|| panic!("no guest line in {log}"));
    assert_eq!(guest["level"], "WARN", "{guest}");
    let attempt = span(guest, "attempt");
    assert_eq!(attempt["handler"], "h", "{guest}");
    assert_eq!(attempt["event"], "log-1", "{guest}");
    assert_eq!(attempt["attempt"], 1, "{guest}");
    assert_eq!(span(guest, "call")["plugin"], "h", "{guest}");
}

/// An ingest log line carries the `receive` span: the source it was posted to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_log_line_names_its_source_from_the_receive_span() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[("HOOKD_LOG_FORMAT", "json")]).await;
    let (status, reply) = post_sw(host.ingest, "q", "held-1", b"{}").await.unwrap();
    assert!(status.is_success(), "{status} {reply}");
    let log = host.wait_log("request quarantined", WAIT).await;
    let lines = json_lines(&log);
    let held = lines
        .iter()
        .find(|l| l["fields"]["message"] == "request quarantined")
        .unwrap();
    assert_eq!(span(held, "receive")["source"], "q", "{held}");
    // The id a replay or a discard of it names.
    assert!(held["fields"]["quarantine_id"].is_number(), "{held}");
}

/// A delivery dead-lettered says so, in its attempt's span (source, event, handler), and a
/// replay of it is logged with what it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_and_its_replay_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("f", plugins::FLAKY)]);
    let config = sw_source("s", &["f"], "");
    let host =
        ProcessHost::start_with_env(dir.path(), &config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    let body = json!({"permanent": true}).to_string();
    let (status, reply) = post_sw(host.ingest, "s", "doomed", body.as_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{status} {reply}");
    let log = host.wait_log("delivery dead-lettered", WAIT).await;
    let lines = json_lines(&log);
    let dead = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("delivery dead-lettered"))
        })
        .unwrap();
    assert_eq!(dead["fields"]["outcome"], "permanent", "{dead}");
    let attempt = span(dead, "attempt");
    assert_eq!(
        (&attempt["source"], &attempt["event"], &attempt["handler"]),
        (&json!("s"), &json!("doomed"), &json!("f")),
        "{dead}"
    );
    let (status, reply) = host
        .admin(
            http::Method::POST,
            "/admin/replay",
            Some(crate::support::ADMIN_TOKEN),
            Some(json!({"source": "s"})),
        )
        .await;
    assert_eq!(
        (status, reply),
        (http::StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    let log = host.wait_log("replayed deliveries", WAIT).await;
    let lines = json_lines(&log);
    let replayed = lines
        .iter()
        .find(|l| l["fields"]["message"] == "replayed deliveries")
        .unwrap();
    assert_eq!(
        (
            &replayed["fields"]["source"],
            &replayed["fields"]["state"],
            &replayed["fields"]["deliveries"]
        ),
        (&json!("s"), &json!("dead"), &json!(1)),
        "{replayed}"
    );
}

/// A quarantined request was acknowledged (202), so when a replay finds its parser now refuses
/// it (here `generic` reading an id at `/id`, which the request has not) and resolves it without
/// an event, the log says so: the source, the quarantine id and the parser's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_request_its_parser_now_refuses_is_logged_when_a_replay_resolves_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[("HOOKD_LOG_FORMAT", "json")]).await;
    let (status, reply) = post_sw(host.ingest, "q", "held-2", b"{}").await.unwrap();
    assert!(status.is_success(), "{status} {reply}");
    host.wait_log("request quarantined", WAIT).await;

    install_plugins(dir.path(), &[("absent", plugins::GENERIC)]);
    host.wait_plugin("absent", "its file loading", WAIT, |p| {
        p["sha256"].is_string()
    })
    .await;
    let (status, reply) = host
        .admin(
            http::Method::POST,
            "/admin/replay",
            Some(crate::support::ADMIN_TOKEN),
            Some(json!({"source": "q"})),
        )
        .await;
    assert_eq!(
        (status, reply),
        (http::StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    let log = host
        .wait_log("quarantined request resolved without an event", WAIT)
        .await;
    let lines = json_lines(&log);
    let line = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("quarantined request resolved"))
        })
        .unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["fields"]["source"], "q", "{line}");
    assert!(line["fields"]["quarantine_id"].is_number(), "{line}");
    let reason = line["fields"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("parser now says: "), "{line}");
}

/// Filtered to warnings (`HOOKD_LOG=warn`), the log keeps its context: a guest's warning still
/// carries its attempt and call spans, an ingest warning its request's source. (The spans are
/// `error`-level; at their default, `info`, the filter turned them off with the info lines.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_keep_their_spans_when_the_log_is_filtered_to_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("HOOKD_LOG_FORMAT", "json"), ("HOOKD_LOG", "warn")];
    let host = start(dir.path(), &env).await;
    let (status, reply) = post_sw(host.ingest, "q", "held-1", b"{}").await.unwrap();
    assert!(status.is_success(), "{status} {reply}");
    host.wait_log("request quarantined", WAIT).await;
    let log = log_from_the_guest(&host).await;
    let lines = json_lines(&log);
    assert!(
        lines
            .iter()
            .all(|l| l["level"] == "WARN" || l["level"] == "ERROR"),
        "a line under the warning level in:\n{log}"
    );
    let held = lines
        .iter()
        .find(|l| l["fields"]["message"] == "request quarantined")
        .unwrap_or_else(|| panic!("no quarantine line in {log}"));
    assert_eq!(span(held, "receive")["source"], "q", "{held}");
    let guest = lines
        .iter()
        .find(|l| l["fields"]["message"] == GREETING)
        .unwrap_or_else(|| panic!("no guest line in {log}"));
    assert_eq!(span(guest, "attempt")["event"], "log-1", "{guest}");
    assert_eq!(span(guest, "call")["plugin"], "h", "{guest}");
}

/// Any web page open in the operator's browser can send cross-origin requests to the admin
/// listener without end, with paths as long as it likes: each is refused (403), but they write
/// one line per period between them, counting the rest, and a line quotes at most 256 bytes of
/// the path. (Before, a line each, the whole path in it: 60 KB of log per request.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_cross_origin_admin_requests_cannot_flood_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let host = start(dir.path(), &[("HOOKD_LOG_FORMAT", "json")]).await;
    let path = format!("/admin/events/{}", "a".repeat(20_000));
    for _ in 0..40 {
        let (status, _, _) = crate::support::admin_call_with(
            host.admin,
            http::Method::GET,
            &path,
            None,
            &[(http::header::ORIGIN, "http://evil.example")],
            None,
        )
        .await
        .unwrap();
        assert_eq!(status, http::StatusCode::FORBIDDEN);
    }
    let log = host.log();
    let refused: Vec<Value> = lines_saying(&log, "admin request refused");
    assert_eq!(refused.len(), 1, "{log}");
    let quoted = refused[0]["fields"]["path"].as_str().unwrap();
    assert!(
        quoted.starts_with("/admin/events/aaa") && quoted.len() <= 256 + "…".len(),
        "{quoted}"
    );
    assert!(log.len() < 16 * 1024, "{} bytes of log", log.len());
}

/// The line giving a refused certificate's exact reason (the code the plugin gets carries no
/// text) names the source, the event and the plugin from its spans, as every line of an attempt
/// does, though the request runs outside the call's own poll. (Before, it had no spans.) It is
/// written at most once per 10 s for a plugin, and those left out are counted in a line of
/// their own: a call may make as many requests to such a host as its time allows (before, 30
/// requests wrote 30 lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_certificate_is_logged_with_its_attempt() {
    use crate::tls::{Pki, TlsServer, allow_localhost, hello};
    let server = TlsServer::start(Pki::new().leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("netprobe", plugins::NETPROBE)]);
    let config = sw_source(
        "p",
        &["netprobe"],
        &format!(
            "[plugins.netprobe]\nmax_attempts = 1\n{}\n",
            allow_localhost(port)
        ),
    );
    let host =
        ProcessHost::start_with_env(dir.path(), &config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    let urls: Vec<String> = (0..30)
        .map(|i| format!("https://localhost:{port}/ok?{i}"))
        .collect();
    let body = json!({ "urls": urls }).to_string();
    let (status, reply) = post_sw(host.ingest, "p", "tls-1", body.as_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{status} {reply}");
    let refused = &line_containing(&host, "UnknownIssuer").await;
    assert_eq!(span(refused, "attempt")["event"], "tls-1", "{refused}");
    assert_eq!(span(refused, "attempt")["source"], "p", "{refused}");
    assert_eq!(span(refused, "call")["plugin"], "netprobe", "{refused}");
    let more = line_containing(
        &host,
        "outbound request failed in the TLS handshake, plugin netprobe: 29 more",
    )
    .await;
    assert_eq!(more["fields"]["left_out"], 29, "{more}");
    let log = host.log();
    assert_eq!(log.matches("UnknownIssuer").count(), 1, "{log}");
}

/// A plugin file that fails to load is named by its file, and its line names the configured
/// instances that load it too, when they are named otherwise (`[plugins.h] wasm = "absent"`):
/// the operator looks for `h` in the configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_load_names_the_instances_that_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = sw_source("s", &["h"], "[plugins.h]\nwasm = \"absent\"\n");
    let host =
        ProcessHost::start_with_env(dir.path(), &config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    let missing = &line_containing(&host, "does not exist").await;
    assert_eq!(missing["fields"]["plugin"], "absent", "{missing}");
    assert_eq!(missing["fields"]["instances"], "h", "{missing}");
}

/// A parser's 400 is logged at most once per 10 s for each source: a flood of refusals on one
/// source (anyone can send them to a source without a signature) leaves another source's
/// refusal its own line. (Before, one limiter for all sources: the second source's was only
/// counted in the first's `left_out`.) Those left out after a source's last line are reported
/// by a line of their own once its 10 s are over, naming the source (before, only a later
/// refusal's line would have counted them, and none came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parsers_refusals_are_logged_for_each_source() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("rambler", plugins::RAMBLER)]);
    let config = "[sources.r1]\nscheme = \"none\"\nparser = \"rambler\"\n\
                  [sources.r2]\nscheme = \"none\"\nparser = \"rambler\"\n";
    let host =
        ProcessHost::start_with_env(dir.path(), config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    for source in ["r1", "r1", "r1", "r2"] {
        let (status, reply) = host.post(source, &[], b"{}").await.unwrap();
        assert_eq!(status, http::StatusCode::BAD_REQUEST, "{reply}");
    }
    let log = host.log();
    let refused: Vec<Value> = lines_saying(&log, "request refused as unparsable (400)");
    let sources: Vec<&Value> = refused
        .iter()
        .map(|l| &span(l, "receive")["source"])
        .collect();
    assert_eq!(sources, [&json!("r1"), &json!("r2")], "{log}");
    let more = line_containing(
        &host,
        "request refused as unparsable (400), source r1: 2 more",
    )
    .await;
    assert_eq!(
        (&more["level"], &more["fields"]["left_out"]),
        (&json!("INFO"), &json!(2)),
        "{more}"
    );
    assert!(
        !host.log().contains("(400), source r2:"),
        "nothing left out of r2's"
    );
}

/// A quarantined request, and one refused since the quarantine is full, is logged at most once
/// per 10 s for each source, those left out counted: a body its parser fails on can be sent by
/// anyone to a source without a signature, and each wrote a warning before (and, the
/// quarantine full, one per request at no storage cost at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantined_requests_are_logged_once_per_period_for_each_source() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[server]\nmax_backlog = 3\n\
                  [sources.q1]\nscheme = \"none\"\nparser = \"absent\"\n\
                  [sources.q2]\nscheme = \"none\"\nparser = \"absent\"\n\
                  [plugins.absent]\nconfig = { id_pointer = \"/id\" }\n";
    let host =
        ProcessHost::start_with_env(dir.path(), config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    for (source, status) in [
        ("q1", 202),
        ("q1", 202),
        ("q1", 202),
        ("q2", 503),
        ("q2", 503),
    ] {
        let (got, reply) = host.post(source, &[], b"{}").await.unwrap();
        assert_eq!(got.as_u16(), status, "{source}: {reply}");
    }
    let held = line_containing(&host, "request quarantined, source q1: 2 more").await;
    assert_eq!(
        (&held["level"], &held["fields"]["left_out"]),
        (&json!("WARN"), &json!(2)),
        "{held}"
    );
    let full = line_containing(&host, "quarantine full: request refused, source q2: 1 more").await;
    assert_eq!(full["fields"]["left_out"], 1, "{full}");
    let log = host.log();
    let written = |message| -> Vec<Value> {
        lines_saying(&log, message)
            .iter()
            .map(|l| span(l, "receive")["source"].clone())
            .collect()
    };
    assert_eq!(written("request quarantined"), [json!("q1")], "{log}");
    assert_eq!(
        written("quarantine full: request refused"),
        [json!("q2")],
        "{log}"
    );
}

/// An answered handshake is logged at most once per 10 s for each source: Twitter's CRC and
/// Microsoft Graph's validation carry no signature, so anyone can send them at request rate
/// (each wrote a line before: 27 MB of log in 3 s of `wrk` against one source).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_handshakes_are_logged_once_per_period_for_each_source() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[sources.tw]\nscheme = \"twitter\"\nsecrets = [\"consumer\"]\n\
                  [sources.graph]\nscheme = \"msgraph\"\nclient_state = \"state-42\"\n";
    let host =
        ProcessHost::start_with_env(dir.path(), config, &[("HOOKD_LOG_FORMAT", "json")]).await;
    let requests = [
        (http::Method::GET, "tw?crc_token=a"),
        (http::Method::GET, "tw?crc_token=b"),
        (http::Method::GET, "tw?crc_token=c"),
        (http::Method::POST, "graph?validationToken=x"),
        (http::Method::POST, "graph?validationToken=y"),
    ];
    for (method, path) in &requests {
        let url = format!("http://{}/hooks/{path}", host.ingest);
        let (status, _, body) = crate::support::send(method.clone(), &url, &[], Default::default())
            .await
            .unwrap();
        assert_eq!(status, http::StatusCode::OK, "{path}: {body:?}");
    }
    let log = host.log();
    let answered: Vec<Value> = lines_saying(&log, "provider handshake answered");
    let sources: Vec<&Value> = answered
        .iter()
        // A GET is answered in its own span; a POST's handshake step in the request's.
        .zip(["handshake", "receive"])
        .map(|(l, span_name)| &span(l, span_name)["source"])
        .collect();
    assert_eq!(
        (answered.len(), sources),
        (2, vec![&json!("tw"), &json!("graph")]),
        "{log}"
    );
}
