//! The admin API and its CLI against a running host: the bearer token on every `/admin/*`
//! route, the event list's filters and limit, the detail and replay shapes, the per-call replay
//! bound, `hookd events` / `hookd replay`, and deliveries that wait for a missing plugin.
//!
//! Invariant checked: nothing under `/admin/` answers or acts without the right token.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    process::Output,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{
    self, ADMIN_TOKEN, AdminApi, Scheme, TestHost, hookd_cli, plugins, sw_source,
};

const WAIT: Duration = Duration::from_secs(60);

/// Source `s` → `counter`; source `t` → `counter` and `flaky` (fan-out).
fn config() -> String {
    sw_source("s", &["counter"], "") + &sw_source("t", &["counter", "flaky"], "")
}

async fn send_event(host: &TestHost, source: &str, id: &str, body: Value) {
    host.accept_event(source, id, &body).await;
}

/// One admin request with exactly the `Authorization` header given (or none).
async fn call(
    admin: SocketAddr,
    method: Method,
    path: &str,
    authorization: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    if let Some(auth) = authorization {
        headers.push((header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap()));
    }
    if body.is_some() {
        headers.push((
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ));
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let url = format!("http://{admin}{path}");
    let (status, _, body) = support::send(method, &url, &headers, body).await.unwrap();
    (status, support::json_or_text(&body))
}

fn event_ids(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect()
}

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// The CLI in this test's working directory.
async fn hookd(args: &[&str]) -> Output {
    hookd_cli(Path::new("."), args).await
}

/// The JSON a successful CLI call printed.
fn printed(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "hookd failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Every `/admin/*` route answers 401 `{"error":"unauthorized"}` to a missing or wrong token
/// (and does nothing: a replay asked with a wrong token replays nothing); the right one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_refuses_a_missing_or_wrong_token() {
    let host = TestHost::start(
        &config(),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await;
    send_event(&host, "t", "dead_one", json!({"permanent": true})).await;
    host.wait_state("t", "dead_one", "flaky", "dead", WAIT)
        .await;

    // (method, path, body, status with the right token)
    let routes: [(Method, &str, Option<Value>, StatusCode); 5] = [
        (Method::GET, "/admin/events", None, StatusCode::OK),
        (
            Method::GET,
            "/admin/events/t/dead_one",
            None,
            StatusCode::OK,
        ),
        (
            Method::POST,
            "/admin/replay",
            Some(json!({"event_ids": ["dead_one"]})),
            StatusCode::OK,
        ),
        (Method::GET, "/admin/plugins", None, StatusCode::OK),
        // Authorized, but flaky has no previous version to go back to.
        (
            Method::POST,
            "/admin/plugins/flaky/rollback",
            None,
            StatusCode::CONFLICT,
        ),
    ];
    // No bearer token: refused on every route. Wrong ones: the check every route shares, tried
    // on the replay (each counts against this address: five would lock it out for 5 minutes).
    let none = [
        None,
        Some("Bearer ".to_string()),
        Some(ADMIN_TOKEN.to_string()),
        Some(format!("Basic {ADMIN_TOKEN}")),
    ];
    let wrong = [
        Some("Bearer not-the-token".to_string()),
        Some(format!("Bearer {ADMIN_TOKEN}x")),
        Some(format!("Bearer {}", &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1])),
    ];
    for (method, path, body, _) in &routes {
        let tried = if *path == "/admin/replay" {
            &wrong[..]
        } else {
            &[]
        };
        for auth in none.iter().chain(tried) {
            let (status, reply) = call(
                host.admin,
                method.clone(),
                path,
                auth.as_deref(),
                body.clone(),
            )
            .await;
            assert_eq!(
                (status, &reply),
                (StatusCode::UNAUTHORIZED, &json!({"error": "unauthorized"})),
                "{method} {path} with Authorization {auth:?}"
            );
        }
    }
    // The refused replay did nothing.
    let d = host
        .wait_state("t", "dead_one", "flaky", "dead", WAIT)
        .await;
    assert_eq!(d["attempts"], 1, "{d:#}");

    let right = format!("Bearer {ADMIN_TOKEN}");
    for (method, path, body, expected) in routes {
        let (status, reply) = call(host.admin, method.clone(), path, Some(&right), body).await;
        assert_eq!(status, expected, "{method} {path}: {reply}");
    }
    // The authorized replay did run it again.
    host.wait_delivery("t", "dead_one", "flaky", WAIT, |d| {
        d["state"] == "dead" && d["attempts"] == 2
    })
    .await;

    // Probes and scrapers need no token.
    for path in ["/healthz", "/metrics"] {
        let (status, reply) = call(host.admin, Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}: {reply}");
    }
}

/// `GET /admin/events` filters by source, state and handler (state and handler on the same
/// delivery) and honours `limit`, newest first; the detail and replay answers have the
/// contract's shape; replaying an open state is a 400 that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_list_filters_and_replay_answers_have_the_contract_shape() {
    let host = TestHost::start(
        &config(),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await;
    // Sent one after the other, so their order is the arrival order.
    for id in ["a1", "a2", "a3"] {
        send_event(&host, "s", id, json!({})).await;
    }
    send_event(&host, "t", "b1", json!({"permanent": true})).await;
    send_event(&host, "t", "b2", json!({})).await;
    for id in ["a1", "a2", "a3"] {
        host.wait_state("s", id, "counter", "done", WAIT).await;
    }
    for (id, flaky) in [("b1", "dead"), ("b2", "done")] {
        host.wait_state("t", id, "counter", "done", WAIT).await;
        host.wait_state("t", id, "flaky", flaky, WAIT).await;
    }

    let table: [(&str, &[&str]); 11] = [
        ("", &["b2", "b1", "a3", "a2", "a1"]),
        ("?source=s", &["a3", "a2", "a1"]),
        ("?source=t", &["b2", "b1"]),
        ("?state=dead", &["b1"]),
        ("?state=pending", &[]),
        ("?handler=flaky", &["b2", "b1"]),
        ("?handler=flaky&state=done", &["b2"]),
        // b1 has a dead delivery, but not to counter.
        ("?handler=counter&state=dead", &[]),
        ("?source=s&handler=flaky", &[]),
        ("?limit=2", &["b2", "b1"]),
        ("?source=s&state=done&handler=counter&limit=1", &["a3"]),
    ];
    for (query, expected) in table {
        let (status, list) = host.admin_get(&format!("/admin/events{query}")).await;
        assert_eq!(status, StatusCode::OK, "{query}: {list}");
        assert_eq!(event_ids(&list), expected, "/admin/events{query}");
    }

    let (_, list) = host.admin_get("/admin/events?source=t").await;
    let b1 = &list[1];
    assert_eq!(
        keys(b1),
        BTreeSet::from(["source", "event_id", "event_type", "received_at", "states"])
    );
    assert_eq!(b1["source"], "t");
    assert!(b1["received_at"].as_i64().unwrap() > 0, "{b1}");
    assert_eq!(b1["states"], json!({"counter": "done", "flaky": "dead"}));

    let (status, reply) = host.admin_get("/admin/events?state=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        reply["detail"].as_str().unwrap().contains("sleeping"),
        "{reply}"
    );

    // The detail: every delivery with its full history, each attempt naming the plugin version.
    let detail = host.event("t", "b1").await.unwrap();
    assert_eq!(
        keys(&detail),
        BTreeSet::from([
            "source",
            "event_id",
            "event_type",
            "ordering_key",
            "sequence",
            "received_at",
            "deliveries"
        ])
    );
    let flaky = detail["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["handler"] == "flaky")
        .unwrap();
    assert_eq!(
        keys(flaky),
        BTreeSet::from([
            "handler",
            "state",
            "attempts",
            "output",
            "last_error",
            "next_attempt_at",
            "history"
        ])
    );
    assert_eq!(
        (&flaky["state"], &flaky["attempts"], &flaky["output"]),
        (&json!("dead"), &json!(1), &Value::Null)
    );
    let attempt = &flaky["history"][0];
    assert_eq!(
        keys(attempt),
        BTreeSet::from([
            "attempt",
            "started_at",
            "finished_at",
            "outcome",
            "error_kind",
            "error",
            "plugin_sha256"
        ])
    );
    assert_eq!(
        (
            &attempt["attempt"],
            &attempt["outcome"],
            &attempt["error_kind"]
        ),
        (&json!(1), &json!("permanent"), &json!("permanent"))
    );
    let (_, plugins) = host.admin_get("/admin/plugins").await;
    let flaky_sha = plugins
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "flaky")
        .unwrap()["sha256"]
        .clone();
    assert!(flaky_sha.is_string(), "{plugins:#}");
    assert_eq!(attempt["plugin_sha256"], flaky_sha);
    let (status, _) = host.admin_get("/admin/events/t/no_such_event").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Replay selections (dry runs: they count and change nothing).
    let future = host::model::unix_ms(SystemTime::now()) + 3_600_000;
    let table = [
        (json!({}), 1),
        (json!({"source": "s"}), 0),
        (json!({"source": "t", "handler": "flaky"}), 1),
        (json!({"state": "done"}), 6),
        (
            json!({"state": "done", "handler": "counter", "source": "s"}),
            3,
        ),
        (json!({"state": "done", "event_ids": ["a1", "b1"]}), 2),
        (json!({"state": "done", "since": future}), 0),
        (json!({"state": "done", "until": 0}), 0),
        (json!({"state": "stale"}), 0),
    ];
    for (mut filter, matched) in table {
        filter["dry_run"] = json!(true);
        let (status, reply) = host.admin_post("/admin/replay", filter.clone()).await;
        assert_eq!(
            (status, reply),
            (StatusCode::OK, json!({"matched": matched, "replayed": 0})),
            "{filter}"
        );
    }
    let d = host.wait_state("t", "b1", "flaky", "dead", WAIT).await;
    assert_eq!(d["attempts"], 1, "a dry run replayed something: {d:#}");

    // Pending (due already) and running deliveries cannot be replayed; retrying ones can (run
    // now), and there are none here.
    let (status, reply) = host
        .admin_post(
            "/admin/replay",
            json!({"state": "retrying", "dry_run": true}),
        )
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 0, "replayed": 0}))
    );
    for state in ["pending", "running"] {
        let (status, reply) = host
            .admin_post("/admin/replay", json!({"state": state}))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{state}: {reply}");
        assert_eq!(reply["error"], "bad_request");
        let detail = reply["detail"].as_str().unwrap();
        assert!(
            detail.contains(state) && detail.contains("dead"),
            "{state}: {detail}"
        );
    }
    for (body, needle) in [
        (json!({"source": "nope"}), "unknown source \"nope\""),
        (json!({"handler": "flakey"}), "unknown handler \"flakey\""),
        (json!({"state": "sleeping"}), "sleeping"),
    ] {
        for route in ["/admin/replay", "/admin/discard"] {
            let (status, reply) = host.admin_post(route, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{route} {body}: {reply}");
            assert!(
                reply["detail"].as_str().unwrap().contains(needle),
                "{route}: {reply}"
            );
        }
    }
}

/// One replay call touches at most [`host::admin::MAX_REPLAY`] deliveries; the rest are left
/// for the next call. The dead deliveries are seeded through the inbox's own API (accept,
/// lease, record a permanent failure), since 10 001 handler runs would take minutes in a debug
/// build; their handler's plugin is absent, so replayed ones wait instead of running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replay_call_touches_at_most_max_replay_deliveries() {
    use host::{
        config::Durability,
        ids::{EventId, PluginName, SourceName},
        inbox::{ClaimRequest, Finish, Finished, Inbox, RawRequest},
        model::{AttemptOutcome, Disposition, Envelope},
        verify::Verifier,
    };

    let max = host::admin::MAX_REPLAY;
    let seeded = max + 1;
    let dir = tempfile::tempdir().unwrap();
    let inbox = Inbox::open(&dir.path().join("hookd.db"), Durability::Normal).unwrap();
    let verifier = Verifier::new(Scheme::None, Vec::new(), Duration::from_secs(300)).unwrap();
    let now = host::model::unix_ms(SystemTime::now());
    let accepts: Vec<_> = (0..seeded)
        .map(|i| {
            let verified = verifier
                .verify(
                    http::HeaderMap::new(),
                    Bytes::from_static(b"{}"),
                    SystemTime::now(),
                )
                .unwrap();
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let envelope = Envelope {
                    event_id: EventId::new(format!("e{i}")),
                    event_type: "seeded".into(),
                    ordering_key: None,
                    sequence: None,
                };
                inbox
                    .accept(
                        SourceName::new("s"),
                        envelope,
                        RawRequest::from_verified(verified, now),
                        vec![PluginName::new("gone")],
                        None,
                    )
                    .await
            })
        })
        .collect();
    for accept in accepts {
        accept.await.unwrap().unwrap();
    }
    let claimed = inbox
        .claim(ClaimRequest {
            caps: Default::default(),
            now_ms: now,
            limit: seeded,
            capacity: [("gone".to_string(), seeded)].into(),
            lease_ms: Default::default(),
            fairness: Default::default(),
            deliver_stale: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), seeded);
    let finishes: Vec<_> = claimed
        .into_iter()
        .map(|claim| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                inbox
                    .finish(Finish {
                        delivery_id: claim.delivery_id,
                        attempt: claim.attempt,
                        started_at_ms: now,
                        finished_at_ms: now,
                        outcome: AttemptOutcome::Permanent,
                        error_kind: Some("permanent".into()),
                        error: Some("seeded".into()),
                        plugin_sha256: None,
                        disposition: Disposition::Dead,
                        plugin: claim.handler,
                        state: Default::default(),
                        uncounted: false,
                    })
                    .await
            })
        })
        .collect();
    for finish in finishes {
        assert_eq!(finish.await.unwrap().unwrap(), Finished::Recorded);
    }
    inbox.close();

    let config = "[sources.s]\nscheme = \"none\"\nhandlers = [\"gone\"]\n";
    let host = TestHost::start_in(dir, config).await;
    let calls = [
        (json!({"dry_run": true}), max, 0),
        (json!({"handler": "gone"}), max, max),
        (json!({"handler": "gone"}), 1, 1),
        (json!({"handler": "gone"}), 0, 0),
    ];
    for (body, matched, replayed) in calls {
        let (status, reply) = host.admin_post("/admin/replay", body.clone()).await;
        assert_eq!(
            (status, reply),
            (
                StatusCode::OK,
                json!({"matched": matched, "replayed": replayed})
            ),
            "{body}"
        );
    }
    // Replayed, and waiting for their plugin: all pending, none dead.
    let pending = format!("hookd_deliveries{{state=\"pending\"}} {seeded}");
    support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &[&pending, "hookd_deliveries{state=\"dead\"} 0"],
    )
    .await;
}

/// `hookd events` and `hookd replay` print the API's JSON and exit 0 with the right token, and
/// exit non-zero (without echoing the token, and without acting) with a wrong or missing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_and_replay_commands_wrap_the_admin_api() {
    let host = TestHost::start(
        &config(),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await;
    send_event(&host, "s", "a1", json!({})).await;
    send_event(&host, "t", "b1", json!({"permanent": true})).await;
    host.wait_state("s", "a1", "counter", "done", WAIT).await;
    host.wait_state("t", "b1", "flaky", "dead", WAIT).await;
    host.wait_state("t", "b1", "counter", "done", WAIT).await;

    let url = format!("http://{}", host.admin);
    let admin = ["--admin-url", url.as_str(), "--token", ADMIN_TOKEN];
    let with = |args: &[&'static str]| -> Vec<&str> {
        args.iter().copied().chain(admin.iter().copied()).collect()
    };

    let listed = printed(&hookd(&with(&["events", "--source", "t"])).await);
    let (_, api) = host.admin_get("/admin/events?source=t").await;
    assert_eq!(listed, api);
    assert_eq!(event_ids(&listed), ["b1"]);

    // A full page says how to get the next one; `--before` gets it.
    let first = hookd(&with(&["events", "--state", "done", "--limit", "1"])).await;
    assert_eq!(event_ids(&printed(&first)), ["b1"]);
    let hint = String::from_utf8_lossy(&first.stderr).into_owned();
    let before = hint
        .split("--before ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no --before in {hint:?}"))
        .to_owned();
    let next: Vec<&str> = [
        "events", "--state", "done", "--limit", "1", "--before", &before,
    ]
    .into_iter()
    .chain(admin)
    .collect();
    let second = hookd(&next).await;
    assert_eq!(event_ids(&printed(&second)), ["a1"]);
    let filtered = printed(&hookd(&with(&["events", "--event-id", "a1", "--since", "1"])).await);
    assert_eq!(event_ids(&filtered), ["a1"]);

    let shown = printed(&hookd(&with(&["events", "t", "b1"])).await);
    assert_eq!(shown, host.event("t", "b1").await.unwrap());

    let dry = printed(&hookd(&with(&["replay", "--source", "t", "--dry-run"])).await);
    assert_eq!(dry, json!({"matched": 1, "replayed": 0}));

    // Wrong or missing token: non-zero exit, 401 named, token not echoed, nothing replayed.
    let wrong_token = "not-the-admin-token-5c1d";
    for (args, hint) in [
        (
            vec!["replay", "--source", "t", "--token", wrong_token],
            None,
        ),
        (vec!["events", "--token", wrong_token], None),
        (vec!["replay", "--source", "t"], Some("no token given")),
    ] {
        let mut args = args;
        args.extend(["--admin-url", url.as_str()]);
        let output = hookd(&args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded: {stderr}");
        assert!(stderr.contains("401"), "{args:?}: {stderr}");
        assert!(!stderr.contains(wrong_token), "{args:?} echoed the token");
        assert!(output.stdout.is_empty(), "{args:?} printed something");
        if let Some(hint) = hint {
            assert!(stderr.contains(hint), "{args:?}: {stderr}");
        }
    }
    let d = host.wait_state("t", "b1", "flaky", "dead", WAIT).await;
    assert_eq!(d["attempts"], 1, "{d:#}");

    let real = printed(&hookd(&with(&["replay", "--source", "t"])).await);
    assert_eq!(real, json!({"matched": 1, "replayed": 1}));
    host.wait_delivery("t", "b1", "flaky", WAIT, |d| {
        d["state"] == "dead" && d["attempts"] == 2
    })
    .await;
}

/// A command whose reader went away (`hookd events | head -0`) ends quietly with success, as
/// `cat` does, instead of panicking with a backtrace ("failed printing to stdout").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_reader_is_gone_ends_quietly() {
    let host = TestHost::start(&config(), &[("counter", plugins::COUNTER)]).await;
    send_event(&host, "s", "a1", json!({})).await;
    let url = format!("http://{}", host.admin);
    let output = tokio::task::spawn_blocking(move || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        std::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
            .args(["events", "--admin-url", &url, "--token", ADMIN_TOKEN])
            .env_remove("HOOKD_CONFIG")
            .stdout(writer)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A handler whose plugin file is absent gets no attempts: its deliveries stay `pending` (not
/// dead) while another handler of the same events completes, and run once the file appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wait_for_a_missing_plugin_then_run_when_it_appears() {
    let host = TestHost::start(&config(), &[("counter", plugins::COUNTER)]).await;
    let (_, plugins_list) = host.admin_get("/admin/plugins").await;
    let flaky = plugins_list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "flaky")
        .unwrap()
        .clone();
    assert!(flaky["sha256"].is_null(), "{flaky:#}");
    // What is missing, and what plugins_dir holds instead (a plugin renamed in the
    // configuration and not on disk is the usual cause).
    let error = flaky["error"].as_str().unwrap();
    assert!(
        error.contains("flaky.wasm does not exist (plugins_dir holds counter.wasm;"),
        "{error}"
    );

    let ids = ["w1", "w2", "w3"];
    for id in ids {
        send_event(&host, "t", id, json!({})).await;
    }
    // counter's deliveries of the same events were claimed and done: a claim pass that could
    // have taken flaky's (due at the same time) has run.
    for id in ids {
        host.wait_state("t", id, "counter", "done", WAIT).await;
    }
    for id in ids {
        let d = host.wait_state("t", id, "flaky", "pending", WAIT).await;
        assert_eq!(d["attempts"], 0, "{d:#}");
        assert_eq!(d["history"], json!([]), "{d:#}");
    }
    let (_, pending) = host
        .admin_get("/admin/events?handler=flaky&state=pending")
        .await;
    assert_eq!(event_ids(&pending), ["w3", "w2", "w1"]);

    // The plugin appears: the host loads it and the waiting deliveries run, first attempt.
    support::install_plugins(&host.path(), &[("flaky", plugins::FLAKY)]);
    for id in ids {
        let d = host.wait_state("t", id, "flaky", "done", WAIT).await;
        assert_eq!(d["attempts"], 1, "{d:#}");
        assert_eq!(d["output"], r#"{"attempt":1}"#);
    }
    let (_, list) = host.admin_get("/admin/plugins").await;
    let flaky = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "flaky")
        .unwrap();
    assert!(
        flaky["sha256"].is_string() && flaky["error"].is_null(),
        "{flaky:#}"
    );
}
