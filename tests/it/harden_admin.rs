//! The admin listener against hostile browsers and careless configurations, and quarantine
//! replay against large bodies: black-box, over HTTP, mostly against a real `hookd serve`.
//!
//! Invariants checked: the admin API always requires a token (a missing one is generated into
//! an owner-only file the CLI finds); a cross-origin browser request or a foreign `Host` (DNS
//! rebinding) is refused with 403 and acts on nothing; a weak token off loopback and a broken
//! config line stop the start without echoing a secret; replay holds one quarantined body at a
//! time and a dry run reads none; quarantine is bounded by `max_backlog` (503 `overloaded`); a
//! replay or discard filter sent where it is not read (a query string, a body without a JSON
//! `Content-Type`) is refused and acts on nothing; a state `PUT` of any body under the listener's
//! cap is answered by the value check, in JSON.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{
    self, ADMIN_TOKEN, AdminApi, ProcessHost, TestHost, free_port, free_ports, hookd_cli,
    install_plugins, json_or_text, plugins, replace_atomically, sha, sw_source,
};

const WAIT: Duration = Duration::from_secs(60);

/// `hookd serve` on `config` that must refuse to start: its exit status and stderr.
async fn serve_refused(config: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hookd.toml"), config).unwrap();
    let path = dir.path().join("hookd.toml");
    let output = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hookd"))
            .args(["serve", "--config"])
            .arg(&path)
            .env_remove("HOOKD_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting hookd");
        let deadline = Instant::now() + WAIT;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("hookd kept running on a config it should refuse");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    // The temporary directory's random name could contain a short token by chance: name it
    // `<dir>`, so "the output does not show the token" checks only what hookd wrote.
    let stderr =
        String::from_utf8_lossy(&output.stderr).replace(&*dir.path().to_string_lossy(), "<dir>");
    (output.status, stderr)
}

/// Signs `body` as standard-webhooks message `id` and POSTs it to `/hooks/{source}`.
async fn post_signed(
    ingest: SocketAddr,
    source: &str,
    id: &str,
    body: &[u8],
) -> (StatusCode, http::HeaderMap, Value) {
    let (status, headers, reply) = support::send_sw(ingest, source, id, body).await.unwrap();
    (status, headers, json_or_text(&reply))
}

/// A config with no `admin_token` anywhere: hookd generates one into `<database>.admin-token`
/// (mode 0600) and says where in its log; requests without it are 401, with it 200; the CLI
/// finds it through the config file (named, or `hookd.toml` in the working directory), and a
/// restart keeps the same token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_a_token_generates_an_owner_only_token_file_that_is_then_required() {
    let dir = tempfile::tempdir().unwrap();
    let config = "database = \"data/hookd.db\"\n";
    let host = ProcessHost::start_exact(dir.path(), config).await;
    let file = dir.path().join("data/hookd.db.admin-token");
    let log = host.log();
    assert!(
        log.contains(&file.display().to_string()),
        "the start does not say where the token is:\n{log}"
    );
    let token = std::fs::read_to_string(&file).expect("the token file");
    let token = token.trim();
    assert!(token.len() >= 32, "{token:?}");
    assert!(!log.contains(token), "the log shows the token:\n{log}");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");
    }

    for (method, path, body) in [
        (Method::GET, "/admin/events", None),
        (Method::GET, "/admin/plugins", None),
        (
            Method::POST,
            "/admin/replay",
            Some(json!({"dry_run": true})),
        ),
    ] {
        for wrong in [None, Some("change-me"), Some("")] {
            let (status, reply) = host.admin(method.clone(), path, wrong, body.clone()).await;
            assert_eq!(
                (status, reply),
                (StatusCode::UNAUTHORIZED, json!({"error": "unauthorized"})),
                "{method} {path} with {wrong:?}"
            );
        }
        let (status, reply) = host.admin(method.clone(), path, Some(token), body).await;
        assert_eq!(status, StatusCode::OK, "{method} {path}: {reply}");
    }

    // The CLI finds the token: through --config, or hookd.toml in the working directory.
    let url = format!("http://{}", host.admin);
    let config_path = dir.path().join("hookd.toml");
    let elsewhere = tempfile::tempdir().unwrap();
    for (cwd, args) in [
        (
            elsewhere.path(),
            vec![
                "events",
                "--admin-url",
                url.as_str(),
                "--config",
                config_path.to_str().unwrap(),
            ],
        ),
        (dir.path(), vec!["plugins", "--admin-url", url.as_str()]),
    ] {
        let output = hookd_cli(cwd, &args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(
            !stderr.contains(token) && !String::from_utf8_lossy(&output.stdout).contains(token)
        );
    }
    // Without any way to find it the CLI says how to pass it.
    let output = hookd_cli(elsewhere.path(), &["events", "--admin-url", url.as_str()]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("401") && stderr.contains("--token"),
        "{stderr}"
    );

    // A restart reuses the token.
    drop(host);
    let host = ProcessHost::start_exact(dir.path(), config).await;
    let (status, reply) = host
        .admin(Method::GET, "/admin/events", Some(token), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

/// A browser page cannot drive the admin API: a foreign `Origin` (or `Sec-Fetch-Site:
/// cross-site`) on `POST /admin/replay` and `POST /admin/plugins/{name}/rollback` is a 403 that
/// changes nothing, even with the right token; a rebinding-style `Host: evil.example:<port>` is
/// a 403 on every `/admin/*` route. The CLI and plain clients (no Origin, Host = the address)
/// work; `/healthz` and `/metrics` answer any Host but no foreign Origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_requests_and_foreign_hosts_are_refused() {
    let config = sw_source("t", &["flaky"], "[plugins.flaky]\nmax_attempts = 1");
    let host = TestHost::start(&config, &[("flaky", plugins::FLAKY)]).await;
    host.accept_event("t", "dead_one", &json!({"permanent": true}))
        .await;
    host.wait_state("t", "dead_one", "flaky", "dead", WAIT)
        .await;
    // Give flaky a previous version, so a rollback would succeed if it were let through.
    let first_sha = sha(&host.plugin("flaky").await).unwrap();
    let mut bytes = std::fs::read(plugins::FLAKY).unwrap();
    // A custom section (id 0, name "x", no payload) makes it a distinct, valid file.
    bytes.extend_from_slice(&[0, 2, 1, b'x']);
    replace_atomically(&host.path().join("plugins/flaky.wasm"), &bytes);
    let second_sha = sha(&host
        .wait_plugin("flaky", "loading the new flaky", WAIT, |p| {
            sha(p).is_some_and(|s| s != first_sha)
        })
        .await)
    .unwrap();

    let auth = (
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).unwrap(),
    );
    let json_type = (
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let call = |method: Method, path: &str, extra: Vec<(HeaderName, HeaderValue)>, body: &str| {
        let url = format!("http://{}{path}", host.admin);
        let mut headers = vec![auth.clone(), json_type.clone()];
        headers.extend(extra);
        let body = Bytes::from(body.to_owned());
        async move {
            let (status, _, reply) = support::send(method, &url, &headers, body).await.unwrap();
            (status, json_or_text(&reply))
        }
    };
    let h = |name: &'static str, value: &str| {
        (
            HeaderName::from_static(name),
            HeaderValue::from_str(value).unwrap(),
        )
    };
    let replay = r#"{"event_ids":["dead_one"]}"#;
    let browsers = [
        vec![h("origin", "https://evil.example")],
        vec![h("origin", "null")],
        vec![h(
            "origin",
            &format!("http://localhost:{}", host.admin.port() + 1),
        )],
        vec![h("sec-fetch-site", "cross-site")],
    ];
    for extra in &browsers {
        for (path, body) in [
            ("/admin/replay", replay),
            ("/admin/plugins/flaky/rollback", ""),
        ] {
            let (status, reply) = call(Method::POST, path, extra.clone(), body).await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "POST {path} with {extra:?}: {reply}"
            );
            assert_eq!(reply["error"], "forbidden", "{reply}");
        }
    }
    let rebinding = format!("evil.example:{}", host.admin.port());
    for (method, path, body) in [
        (Method::GET, "/admin/events", ""),
        (Method::GET, "/admin/events/t/dead_one", ""),
        (Method::GET, "/admin/plugins", ""),
        (Method::POST, "/admin/replay", replay),
        (Method::POST, "/admin/plugins/flaky/rollback", ""),
    ] {
        let (status, reply) = call(method.clone(), path, vec![h("host", &rebinding)], body).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{method} {path} with Host {rebinding}: {reply}"
        );
    }
    // Nothing was replayed or rolled back.
    let d = host
        .wait_state("t", "dead_one", "flaky", "dead", WAIT)
        .await;
    assert_eq!(d["attempts"], 1, "{d:#}");
    let (_, list) = host.admin_get("/admin/plugins").await;
    assert_eq!(list[0]["sha256"], second_sha.as_str(), "{list:#}");

    // Probes: any Host, but no foreign Origin.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, _) = call(Method::GET, path, vec![h("host", &rebinding)], "").await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let (status, _) = call(Method::GET, path, browsers[0].clone(), "").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    // `localhost` and a same-origin Origin are fine.
    let local = format!("localhost:{}", host.admin.port());
    let (status, reply) = call(
        Method::GET,
        "/admin/events",
        vec![h("host", &local), h("origin", &format!("http://{local}"))],
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");

    // The CLI sends no Origin: replay and rollback work.
    let url = format!("http://{}", host.admin);
    let cwd = tempfile::tempdir().unwrap();
    let admin = ["--admin-url", url.as_str(), "--token", ADMIN_TOKEN];
    for args in [
        vec!["replay", "--event-id", "dead_one"],
        vec!["plugins", "rollback", "flaky"],
    ] {
        let mut args = args;
        args.extend(admin);
        let output = hookd_cli(cwd.path(), &args).await;
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    host.wait_delivery("t", "dead_one", "flaky", WAIT, |d| d["attempts"] == 2)
        .await;
    let (_, list) = host.admin_get("/admin/plugins").await;
    assert_eq!(list[0]["sha256"], first_sha.as_str(), "{list:#}");
}

/// On a non-loopback `admin_listen`, a placeholder or short token stops the start with an error
/// naming `server.admin_token` (and not showing the token); so does a missing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_token_on_a_public_address_refuses_to_start() {
    for token in ["change-me", "x", "changeme-changeme-changeme"] {
        let [listen, admin] = free_ports();
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"0.0.0.0:{}\"\nadmin_token = \"{token}\"\n",
            listen.port(),
            admin.port()
        );
        let (status, stderr) = serve_refused(&config).await;
        assert!(!status.success(), "{token}: {stderr}");
        assert!(stderr.contains("server.admin_token"), "{token}: {stderr}");
        assert!(
            !stderr.contains(token),
            "{token}: the error shows the token: {stderr}"
        );
    }
    let config = format!(
        "[server]\nadmin_listen = \"0.0.0.0:{}\"\n",
        free_port().port()
    );
    let (status, stderr) = serve_refused(&config).await;
    assert!(
        !status.success() && stderr.contains("server.admin_token"),
        "{stderr}"
    );
}

/// A config file broken on a line that holds a secret: the start fails naming the line and the
/// key, and the secret appears nowhere in the output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_error_on_a_secret_line_does_not_show_the_secret() {
    let cases = [
        (
            "[sources.gh]\nscheme = \"github\"\nsecrets = [\"gh-hush-4b1d9e\"\nhandlers = []\n",
            "gh-hush-4b1d9e",
            "sources.gh.secrets",
        ),
        (
            "[server]\nadmin_token = \"adm-hush-77c0e2\ndatabase = \"x.db\"\n",
            "adm-hush-77c0e2",
            "server.admin_token",
        ),
        (
            "[sources.gh]\nscheme = \"github\"\nsecrets = \"gh-hush-4b1d9e\"\n",
            "gh-hush-4b1d9e",
            "secrets",
        ),
    ];
    for (config, secret, key) in cases {
        let (status, stderr) = serve_refused(config).await;
        assert!(!status.success(), "{stderr}");
        assert!(
            !stderr.contains(secret),
            "{config:?}: the error shows the secret: {stderr}"
        );
        assert!(
            stderr.contains(key) && stderr.contains("line "),
            "{config:?}: {stderr}"
        );
    }
}

/// 40 quarantined requests of 5 MiB each (200 MiB): a dry-run replay counts all 40 without
/// reading a body, and a real replay parses them one at a time; hookd's peak RSS during each
/// stays far below what holding them all would take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_streams_quarantined_bodies_and_a_dry_run_reads_none() {
    const COUNT: usize = 40;
    const BODY_BYTES: usize = 5 << 20;
    // What one replay may add to the peak: a handful of bodies, far below all of them.
    const CEILING_KIB: u64 = 96 * 1024;

    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("trap", plugins::TRAPPER)]);
    let config = format!(
        "admin_token = \"{ADMIN_TOKEN}\"\ndurability = \"normal\"\n{}",
        sw_source("q", &[], "parser = \"trap\"")
    );
    let host = ProcessHost::start_exact(dir.path(), &config).await;
    let mut body = br#"{"id":"big","type":"test.event","pad":""#.to_vec();
    body.resize(BODY_BYTES - 2, b'x');
    body.extend_from_slice(b"\"}");
    for i in 0..COUNT {
        let (status, _, reply) = post_signed(host.ingest, "q", &format!("big-{i}"), &body).await;
        assert_eq!(
            (status, &reply),
            (
                StatusCode::ACCEPTED,
                &json!({"accepted": true, "quarantined": true})
            ),
            "request {i}"
        );
    }

    let host = &host;
    let replay = |dry_run: bool| async move {
        host.reset_peak();
        let (rss, peak) = host.memory_kib();
        assert!(
            peak <= rss + 4096,
            "VmHWM was not reset: rss {rss} KiB, peak {peak} KiB"
        );
        let started = Instant::now();
        let (status, reply) = host
            .admin(
                Method::POST,
                "/admin/replay",
                Some(ADMIN_TOKEN),
                Some(json!({"source": "q", "dry_run": dry_run})),
            )
            .await;
        let (_, after) = host.memory_kib();
        eprintln!(
            "replay dry_run={dry_run}: {reply}, rss before {rss} KiB, peak during {after} KiB \
             (+{} KiB), {:?}",
            after.saturating_sub(rss),
            started.elapsed()
        );
        assert_eq!(status, StatusCode::OK, "{reply}");
        (reply, after.saturating_sub(rss))
    };

    let (reply, grew) = replay(true).await;
    assert_eq!(reply, json!({"matched": COUNT, "replayed": 0}));
    assert!(
        grew < 16 * 1024,
        "a dry run grew the peak RSS by {grew} KiB"
    );

    // The parser still traps: every body is read and parsed again, and all stay quarantined.
    let (reply, grew) = replay(false).await;
    assert_eq!(reply, json!({"matched": COUNT, "replayed": 0}));
    assert!(
        grew < CEILING_KIB,
        "replaying {COUNT} × {BODY_BYTES} bytes grew the peak RSS by {grew} KiB"
    );
    let held = format!("hookd_quarantined {COUNT}");
    support::metrics_with(
        async |path: &str| host.admin(Method::GET, path, None, None).await,
        &[&held],
    )
    .await;
}

/// A source `q` parsed by plugin `flip` (installed as the trapping parser: every request is
/// quarantined until the file is replaced) from the body's `id` and `type`.
const FLIP_PARSER: &str = r#"parser = "flip"

[plugins.flip]
config = { id_pointer = "/id", type_pointer = "/type" }"#;

/// Posts event `id` to source `q` and checks that it was quarantined.
async fn post_quarantined(host: &TestHost, id: &str) {
    let body = json!({"id": id, "type": "test.event"}).to_string();
    let (status, _, reply) = post_signed(host.ingest, "q", id, body.as_bytes()).await;
    assert_eq!(
        (status, reply),
        (
            StatusCode::ACCEPTED,
            json!({"accepted": true, "quarantined": true})
        ),
        "{id}"
    );
}

/// Replaces the trapping parser `flip` with the `generic` one and waits until it is live.
async fn fix_the_parser(host: &TestHost) {
    let trapper_sha = sha(&host.plugin("flip").await).unwrap();
    replace_atomically(
        &host.path().join("plugins/flip.wasm"),
        &std::fs::read(plugins::GENERIC).unwrap(),
    );
    host.wait_plugin("flip", "loading the new parser", WAIT, |p| {
        sha(p).is_some_and(|s| s != trapper_sha)
    })
    .await;
}

/// Quarantine is bounded by `max_backlog`: once that many requests are held, the next one is a
/// 503 `{"error":"overloaded"}` with `Retry-After` (the provider retries later); when a replay
/// has emptied the quarantine, requests are quarantined again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_beyond_max_backlog_is_overloaded() {
    let config = "[server]\nmax_backlog = 3\n".to_owned() + &sw_source("q", &[], FLIP_PARSER);
    let host = TestHost::start(&config, &[("flip", plugins::TRAPPER)]).await;
    let body = |id: &str| json!({"id": id, "type": "test.event"}).to_string();
    for i in 0..3 {
        post_quarantined(&host, &format!("q-{i}")).await;
    }
    for id in ["q-3", "q-4"] {
        let (status, headers, reply) = post_signed(host.ingest, "q", id, body(id).as_bytes()).await;
        assert_eq!(
            (status, &reply),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error": "overloaded"})
            ),
            "{id}"
        );
        assert!(
            headers.contains_key(header::RETRY_AFTER),
            "{id}: {headers:?}"
        );
    }
    support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &["hookd_quarantined 3"],
    )
    .await;

    // Fix the parser and replay: the three are accepted and the quarantine is empty again.
    fix_the_parser(&host).await;
    let (status, reply) = host
        .admin_post("/admin/replay", json!({"source": "q"}))
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 3, "replayed": 3}))
    );
    // The trapper is back (rollback): new requests are quarantined again, up to the bound.
    let (status, reply) = host
        .admin_post("/admin/plugins/flip/rollback", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    for (id, expected) in [
        ("q-5", StatusCode::ACCEPTED),
        ("q-6", StatusCode::ACCEPTED),
        ("q-7", StatusCode::ACCEPTED),
        ("q-8", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let (status, _, reply) = post_signed(host.ingest, "q", id, body(id).as_bytes()).await;
        assert_eq!(status, expected, "{id}: {reply}");
    }
}

/// Two replays and a discard racing for the same quarantined requests: each request leaves
/// quarantine once, and is counted once, by the call that resolved it. Before, both replays
/// parsed and counted most requests (37 "replayed" for 20), and a replay could turn a request
/// the discard had just closed into an event, answered as discarded and delivered anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replays_and_a_discard_resolve_each_quarantined_request_once() {
    const COUNT: usize = 30;
    let config = sw_source("q", &[], FLIP_PARSER);
    let host = TestHost::start(&config, &[("flip", plugins::TRAPPER)]).await;
    for i in 0..COUNT {
        post_quarantined(&host, &format!("r-{i}")).await;
    }
    fix_the_parser(&host).await;

    let filter = json!({"source": "q"});
    let (first, second, discard) = tokio::join!(
        host.admin_post("/admin/replay", filter.clone()),
        host.admin_post("/admin/replay", filter.clone()),
        host.admin_post("/admin/discard", filter.clone()),
    );
    let count = |(status, reply): &(StatusCode, Value), field: &str| {
        assert_eq!(*status, StatusCode::OK, "{reply}");
        reply[field].as_u64().unwrap_or_else(|| panic!("{reply}")) as usize
    };
    let replayed = count(&first, "replayed") + count(&second, "replayed");
    let discarded = count(&discard, "discarded");
    assert_eq!(
        replayed + discarded,
        COUNT,
        "replays {first:?} and {second:?}, discard {discard:?}"
    );
    // Exactly the replayed requests became events; the discarded ones did not.
    let (status, events) = host.admin_get("/admin/events?source=q&limit=100").await;
    assert_eq!(status, StatusCode::OK, "{events}");
    let stored = events.as_array().map_or(0, Vec::len);
    assert_eq!(stored, replayed, "{events}");
    support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &["hookd_quarantined 0"],
    )
    .await;
}

/// A replay or discard filter sent where the API does not read it, in the query string or as a
/// body without a JSON `Content-Type`, is refused (400 naming the parameters, 415) in the API's
/// JSON and acts on nothing: it used to be ignored, and the call replayed or discarded every dead
/// delivery. No body, or an empty one, still means "no filter".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_or_discard_filter_outside_a_json_body_is_refused_and_acts_on_nothing() {
    let config = sw_source("t", &["flaky"], "[plugins.flaky]\nmax_attempts = 1");
    let host = TestHost::start(&config, &[("flaky", plugins::FLAKY)]).await;
    let dead = ["dead_one", "dead_two"];
    for id in dead {
        host.accept_event("t", id, &json!({"permanent": true}))
            .await;
        host.wait_state("t", id, "flaky", "dead", WAIT).await;
    }
    let auth = (
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).unwrap(),
    );
    let post = |path: String, content_type: Option<&'static str>, body: &'static str| {
        let url = format!("http://{}{path}", host.admin);
        let mut headers = vec![auth.clone()];
        if let Some(content_type) = content_type {
            headers.push((header::CONTENT_TYPE, HeaderValue::from_static(content_type)));
        }
        async move {
            let (status, answer_headers, reply) = support::send(
                Method::POST,
                &url,
                &headers,
                Bytes::from_static(body.as_bytes()),
            )
            .await
            .unwrap();
            let json = answer_headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v == "application/json");
            assert!(json, "POST {path}: {answer_headers:?} {reply:?}");
            (status, json_or_text(&reply))
        }
    };
    let filter = r#"{"dry_run":true,"event_ids":["nothing"]}"#;
    for route in ["/admin/replay", "/admin/discard"] {
        // In the query string, alone or beside a JSON body.
        for (content_type, body) in [(None, ""), (Some("application/json"), filter)] {
            let path = format!("{route}?dry_run=true&source=nosuch");
            let (status, reply) = post(path.clone(), content_type, body).await;
            assert_eq!(
                (status, &reply["error"]),
                (StatusCode::BAD_REQUEST, &json!("bad_request")),
                "POST {path} with {body:?}: {reply}"
            );
            let detail = reply["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains("\"dry_run\", \"source\"") && detail.contains("JSON body"),
                "{detail}"
            );
        }
        // A body without a JSON Content-Type.
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let (status, reply) = post(route.to_owned(), content_type, filter).await;
            assert_eq!(
                (status, &reply["error"]),
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    &json!("unsupported_media_type")
                ),
                "POST {route} with Content-Type {content_type:?}: {reply}"
            );
            let detail = reply["detail"].as_str().unwrap_or_default();
            assert!(
                detail.contains("Content-Type: application/json"),
                "{detail}"
            );
        }
    }
    // Nothing was replayed (each is dead after its one attempt) or discarded.
    for id in dead {
        let d = host.wait_state("t", id, "flaky", "dead", WAIT).await;
        assert_eq!(d["attempts"], 1, "{d:#}");
    }
    let (status, reply) = host
        .admin_post("/admin/discard", json!({"dry_run": true}))
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 2, "discarded": 0}))
    );
    // No body is still no filter: everything dead is discarded.
    let (status, reply) = post("/admin/discard".to_owned(), None, "").await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 2, "discarded": 2}))
    );
}

/// A state `PUT` whose body is over axum's default 2 MiB but under the admin listener's cap is
/// read whole and answered by the value check, a 400 in JSON naming the 1 MiB value cap (it used
/// to be a `413 text/plain` from the extractor's own limit); so is `hookd state set --file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_put_over_2_mib_is_answered_by_the_value_cap_in_json() {
    let config = sw_source("s", &["counter"], "");
    let host = TestHost::start(&config, &[("counter", plugins::COUNTER)]).await;
    const KEY: &str = "/admin/plugins/counter/state/big";
    // Not UTF-8, so base64: 2 133 336 characters.
    let value = vec![0xff_u8; 1_600_000];
    let body = serde_json::to_value(host::admin::api::StatePut::of(&value)).unwrap();
    assert!(body.to_string().len() > 2 * 1024 * 1024);
    let (status, headers, reply) = support::admin_call_with(
        host.admin,
        Method::PUT,
        KEY,
        Some(ADMIN_TOKEN),
        &[(header::IF_NONE_MATCH, "*")],
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(
        (status, headers.get(header::CONTENT_TYPE)),
        (
            StatusCode::BAD_REQUEST,
            Some(&HeaderValue::from_static("application/json"))
        ),
        "{reply}"
    );
    assert_eq!(
        reply,
        json!({
            "error": "bad_request",
            "detail": "plugin counter, state key \"big\": a value of 1600000 bytes is over the \
                       1048576-byte cap",
        })
    );

    // The CLI with a 2 MB file is told the same, and so is one with a file far over what the
    // listener reads (it got a broken pipe, which said nothing of why).
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://{}", host.admin);
    for size in [2_000_000, 20_000_000] {
        let file = dir.path().join("value.bin");
        std::fs::write(&file, vec![0xff_u8; size]).unwrap();
        let output = hookd_cli(
            dir.path(),
            &[
                "state",
                "set",
                "counter",
                "big",
                "--file",
                file.to_str().unwrap(),
                "--admin-url",
                &url,
                "--token",
                ADMIN_TOKEN,
            ],
        )
        .await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success()
                && stderr.contains(&format!(
                    "a value of {size} bytes is over the 1048576-byte cap"
                )),
            "{stderr}"
        );
    }
    // Nothing was written.
    let (status, reply) = host.admin_get(KEY).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{reply}");
}

/// Every answer of the admin listener carries the browser-facing security headers: pages,
/// JSON, refusals and the fallbacks for a path or method no route takes (they lacked them,
/// served outside the dashboard's own routes). Static assets alone may be cached. A page asked
/// for without a session, by GET or HEAD alike, goes to the sign-in form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_listener_answer_carries_the_security_headers() {
    let host = TestHost::start(&sw_source("s", &[], ""), &[]).await;
    let token = Some(ADMIN_TOKEN);
    type Case<'a> = (
        Method,
        &'a str,
        Option<&'a str>,
        &'a [(HeaderName, &'a str)],
        u16,
    );
    let cases: [Case; 7] = [
        (Method::GET, "/sign-in", None, &[], 200),
        (Method::GET, "/nonexistent", None, &[], 404),
        (Method::OPTIONS, "/events", None, &[], 405),
        (Method::DELETE, "/admin/events", token, &[], 405),
        (Method::GET, "/admin/events", token, &[], 200),
        (Method::GET, "/admin/events", None, &[], 401),
        (
            Method::GET,
            "/metrics",
            None,
            &[(header::ORIGIN, "https://evil.example")],
            403,
        ),
    ];
    for (method, path, token, extra, status) in cases {
        let (got, headers, _) =
            support::admin_call_with(host.admin, method.clone(), path, token, extra, None)
                .await
                .unwrap();
        assert_eq!(got.as_u16(), status, "{method} {path}");
        let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(
            csp.contains("frame-ancestors 'none'"),
            "{method} {path}: {csp}"
        );
        assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY", "{method} {path}");
        assert_eq!(
            headers[header::X_CONTENT_TYPE_OPTIONS],
            "nosniff",
            "{method} {path}"
        );
        assert_eq!(
            headers[header::CACHE_CONTROL],
            "no-store",
            "{method} {path}"
        );
    }
    // A page without a session sends a HEAD where its GET goes: to the sign-in form.
    for method in [Method::GET, Method::HEAD] {
        let (got, headers, _) =
            support::admin_call_with(host.admin, method.clone(), "/", None, &[], None)
                .await
                .unwrap();
        assert_eq!(got, StatusCode::SEE_OTHER, "{method} /");
        assert_eq!(headers[header::LOCATION], "/sign-in", "{method} /");
    }
}

/// A query the dashboard cannot read (a malformed number) is its own error page, HTML with
/// the security headers, like every refusal of it; before, axum answered it as plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_dashboard_query_is_an_error_page() {
    let host = TestHost::start(&sw_source("s", &[], ""), &[]).await;
    let base = format!("http://{}", host.admin);
    let with_session = support::dashboard_session(host.admin).await;
    for path in ["/events?before=abc", "/quarantine?before=-x"] {
        let (status, headers, body) = support::send(
            Method::GET,
            &format!("{base}{path}"),
            &with_session,
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        let kind = headers[header::CONTENT_TYPE].to_str().unwrap();
        assert!(kind.starts_with("text/html"), "{path}: {kind}");
        let page = String::from_utf8_lossy(&body);
        assert!(
            page.contains("role=\"alert\"") && page.contains("before"),
            "{path}: {page}"
        );
        assert!(
            headers.contains_key(header::CONTENT_SECURITY_POLICY),
            "{path}"
        );
    }
}

/// Behind a TLS-terminating proxy that passes the `Host` on (named in `admin_hosts`) and says
/// `X-Forwarded-Proto: https`, the browser's `Origin` is `https://<Host>`: signing in works and
/// the session cookie is `Secure`. Before, only `http://<Host>` passed, so every dashboard
/// form, sign-in first, was refused as cross-origin behind such a proxy. Another origin still
/// is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_signs_in_behind_a_tls_terminating_proxy() {
    let config =
        "[server]\nadmin_hosts = [\"hookd.example\"]\n".to_owned() + &sw_source("s", &[], "");
    let host = TestHost::start(&config, &[]).await;
    let sign_in = |origin: &'static str| {
        let url = format!("http://{}/sign-in", host.admin);
        let headers = [
            (header::HOST, HeaderValue::from_static("hookd.example")),
            (header::ORIGIN, HeaderValue::from_static(origin)),
            (
                HeaderName::from_static("x-forwarded-proto"),
                HeaderValue::from_static("https"),
            ),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            ),
        ];
        async move {
            let body = Bytes::from(format!("token={ADMIN_TOKEN}"));
            support::send(Method::POST, &url, &headers, body)
                .await
                .unwrap()
        }
    };
    let (status, headers, body) = sign_in("https://hookd.example").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{}", json_or_text(&body));
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let (status, headers, _) = sign_in("https://evil.example").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(!headers.contains_key(header::SET_COOKIE));
}

/// Five wrong admin tokens from one address lock it out of every token check of the listener
/// for five minutes: its next API request is 429 `too_many_requests` with `Retry-After`
/// whatever token it carries (a right guess is not told), and so is its dashboard sign-in;
/// another address is not affected, and the lockout is logged once. Before, the API answered
/// 67 000 guesses a second without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_admin_tokens_lock_the_address_out() {
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(dir.path(), &sw_source("s", &[], "")).await;
    for n in 0..5 {
        let (status, _) = support::admin_call(
            host.admin,
            Method::GET,
            "/admin/events",
            Some("not-the-token"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "wrong token {n}");
    }
    let (status, headers, reply) = support::admin_call_with(
        host.admin,
        Method::GET,
        "/admin/events",
        Some(ADMIN_TOKEN),
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        (status, &reply["error"]),
        (StatusCode::TOO_MANY_REQUESTS, &json!("too_many_requests")),
        "{reply}"
    );
    let retry: u64 = headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=300).contains(&retry), "Retry-After {retry}");

    let sign_in = support::send(
        Method::POST,
        &format!("http://{}/sign-in", host.admin),
        &[(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        )],
        Bytes::from(format!("token={ADMIN_TOKEN}")),
    )
    .await
    .unwrap();
    assert_eq!(sign_in.0, StatusCode::TOO_MANY_REQUESTS);

    // Another address, the right token: served.
    let mut stream = {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 4, 1], 0))).unwrap();
        socket.connect(host.admin).await.unwrap()
    };
    let request = format!(
        "GET /admin/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Connection: close\r\n\r\n",
        host.admin
    );
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let log = host.log();
    let lines = log
        .matches("address locked out after too many wrong tokens")
        .count();
    assert_eq!(lines, 1, "{log}");
}

/// A client without the admin token cannot spend the admin listener's body budget: a body is
/// read only for a request with the token (or a dashboard session), and a sign-in form only up
/// to its small cap. Before, every request's body was read (and budgeted) before the token was
/// looked at, so a few anonymous connections sending large bodies slowly, to any path, had the
/// operators' own replays, state writes and sign-ins answered 503 for as long as they went on.
/// An empty sign-in form (it guessed nothing, and is not counted) writes no log line either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_token_cannot_spend_the_operators_body_budget() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nmax_inflight_body_bytes = 1048576\nmax_body_bytes = 262144\n{}",
        sw_source("s", &[], "")
    );
    let host = ProcessHost::start(dir.path(), &config).await;
    // Each declares 400 000 bytes and sends nearly all of them at once (the pace the body
    // rules ask), then holds the rest back: three of them were more than the budget.
    let mut hoarders = Vec::new();
    for (method, path, answer) in [
        ("POST", "/admin/replay", "401"),
        ("PUT", "/admin/plugins/counter/state/k", "401"),
        ("POST", "/healthz", "405"),
        ("POST", "/replay", "403"),
        ("POST", "/sign-in", "413"),
        ("POST", "/nowhere", "404"),
    ] {
        let mut stream = tokio::net::TcpStream::connect(host.admin).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 400000\r\n\
             Content-Type: application/json\r\n\r\n",
            host.admin
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let _ = stream.write_all(&vec![b' '; 390_000]).await;
        hoarders.push((path, answer, stream));
    }
    // Each is answered at once, from its head, its body unread.
    for (path, answer, stream) in &mut hoarders {
        let mut start = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut start))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer while its body is held"))
            .unwrap();
        let start = String::from_utf8_lossy(&start).into_owned();
        assert_eq!(start, format!("HTTP/1.1 {answer}"), "{path}");
    }
    // Sign-in forms, the one body read without the token, are read under a budget of their
    // own with a share per address: 80 of them held from 16 addresses (1.2 MB, more than the
    // listener's budget) take none of the operators' budget, and of five from one address at
    // least one is refused (four of 15 KB fill its 64 KiB share).
    let mut forms = Vec::new();
    for i in 0..80u8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 5, 1 + i / 5], 0)))
            .unwrap();
        let mut stream = socket.connect(host.admin).await.unwrap();
        let head = format!(
            "POST /sign-in HTTP/1.1\r\nHost: {}\r\nContent-Length: 15000\r\n\
             Content-Type: application/x-www-form-urlencoded\r\n\r\ntoken=",
            host.admin
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let _ = stream.write_all(&vec![b'x'; 14_000]).await;
        forms.push(stream);
    }
    let mut refused = 0;
    for stream in &mut forms[..5] {
        let mut start = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut start));
        // The held ones end with 408 once they stall; the refused one, 503, at once.
        if let Ok(Ok(_)) = read.await
            && &start == b"HTTP/1.1 503"
        {
            refused += 1;
        }
    }
    assert!(refused >= 1, "five forms from one address all held");
    // The operator's own write goes through.
    let (status, reply) = support::admin_call(
        host.admin,
        Method::POST,
        "/admin/replay",
        Some(ADMIN_TOKEN),
        Some(json!({"source": "s", "dry_run": true})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{reply}");
    // So does a sign-in (its form well under the cap).
    let url = format!("http://{}/sign-in", host.admin);
    let form = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    )];
    let sign_in = |token: &str| {
        support::send(
            Method::POST,
            &url,
            &form,
            Bytes::from(format!("token={token}")),
        )
    };
    assert_eq!(sign_in(ADMIN_TOKEN).await.unwrap().0, StatusCode::SEE_OTHER);
    drop((hoarders, forms));

    // Together: each refusal waits a second before it is answered.
    let refusals: Vec<_> = ["", "", "", "", "", "", "", "", "", "", "a-wrong-one"]
        .into_iter()
        .map(|token| {
            let (url, form) = (url.clone(), form.clone());
            tokio::spawn(async move {
                let body = Bytes::from(format!("token={token}"));
                support::send(Method::POST, &url, &form, body)
                    .await
                    .unwrap()
                    .0
            })
        })
        .collect();
    for refusal in refusals {
        assert_eq!(refusal.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    let log = host.log();
    let lines = log.matches("dashboard sign-in refused").count();
    assert_eq!(lines, 1, "only the wrong token is logged: {log}");
}
