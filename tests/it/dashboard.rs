//! The operator's dashboard in a real browser: Debian's Chromium, headless, driven by
//! Playwright (`tests/browser/dashboard.mjs`) against a real host seeded through real HTTP.
//!
//! The script signs in (a wrong token first, refused), finds an event by id and opens it,
//! replays a dead letter (dry-run count first) and sees it become `done`, discards another
//! (dry-run count first) and sees it `discarded`, discards a held quarantined request and sees
//! it leave the list, edits the plugin's
//! state key (and sees a save at a stale version refused), rolls a plugin back, checks that a POST without (or with a wrong) CSRF token is refused and that the
//! token never appears in a URL, signs out, and saves a screenshot of every page (desktop and
//! phone) to `target/dashboard-screenshots/`. This test then checks the same outcomes through
//! the admin API. A second test posts the dashboard's discard forms over plain HTTP: refused
//! without the CSRF token, and refused when they would reach more than dead letters.
//!
//! Needs `/usr/bin/chromium` and `tests/browser/node_modules` (`npm ci --prefix
//! tests/browser`); without them it says it is skipped, unless `HOOKD_TEST_BROWSER_REQUIRED=1`
//! (set by `.ci/run`, which installs both), when it fails instead.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::json;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};

use crate::support::{
    self, ADMIN_TOKEN, AdminApi, TestHost, plugins, post_sw, replace_atomically, sha, sw_source,
};

const WAIT: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("browser")
}

/// Whether Chromium and Playwright are here; panics if they must be and are not.
fn browser_available() -> bool {
    let playwright = browser_dir().join("node_modules/playwright-core");
    let missing: Vec<String> = [Path::new(CHROMIUM), playwright.as_path()]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let required = std::env::var("HOOKD_TEST_BROWSER_REQUIRED").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "HOOKD_TEST_BROWSER_REQUIRED=1 but {} missing (apt-get install -y chromium; npm ci --prefix tests/browser)",
        missing.join(" and ")
    );
    eprintln!(
        "skipped: the dashboard browser test needs {} (apt-get install -y chromium; npm ci --prefix tests/browser)",
        missing.join(" and ")
    );
    false
}

/// A host with source `t` → handler `h`, the flaky plugin (a `{"permanent": true}` body dies
/// at once), and source `q`, whose parser always traps, so what it receives is held in
/// quarantine.
async fn start_host() -> TestHost {
    let config = sw_source("t", &["h"], "")
        + &sw_source("q", &[], "parser = \"trapper\"")
        + "\n[plugins.h]\nmax_attempts = 1\n";
    TestHost::start(
        &config,
        &[("h", plugins::FLAKY), ("trapper", plugins::TRAPPER)],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser() {
    if !browser_available() {
        return;
    }
    let host = start_host().await;
    for i in 1..=3 {
        host.accept_event(
            "t",
            &format!("evt-ok-{i}"),
            &json!({"n": i, "note": "<b>hi</b>"}),
        )
        .await;
    }
    // Two dead letters of one group: one to replay, one to discard.
    for id in ["evt-dead", "evt-discard"] {
        host.accept_event(
            "t",
            id,
            &json!({"permanent": true, "why": "<script>alert(1)</script>"}),
        )
        .await;
        host.wait_state("t", id, "h", "dead", WAIT).await;
    }
    // Two held requests: one to discard, one that stays.
    for id in ["held-1", "held-2"] {
        let (status, reply) = post_sw(host.ingest, "q", id, b"{\"x\":1}").await.unwrap();
        assert_eq!(reply["quarantined"], true, "{status} {reply}");
    }

    // A deploy replaces `h` with a handler that succeeds: the dead letter can be replayed, and
    // the flaky version is the one to roll back to.
    let flaky_sha = sha(&host.plugin("h").await).expect("h is loaded");
    replace_atomically(
        &host.path().join("plugins/h.wasm"),
        &std::fs::read(plugins::COUNTER).unwrap(),
    );
    let deployed = host
        .wait_plugin("h", "the counter version loads", WAIT, |p| {
            sha(p).is_some_and(|s| s != flaky_sha)
        })
        .await;
    let deployed_sha = sha(&deployed).unwrap();

    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new("node")
        .arg(browser_dir().join("dashboard.mjs"))
        .env("HOOKD_URL", format!("http://{}", host.admin))
        .env("HOOKD_TOKEN", ADMIN_TOKEN)
        .env("HOOKD_SOURCE", "t")
        .env("HOOKD_DEAD_EVENT", "evt-dead")
        .env("HOOKD_DISCARD_EVENT", "evt-discard")
        .env("HOOKD_PLUGIN", "h")
        .env("HOOKD_PREVIOUS_SHA", &flaky_sha)
        .env("HOOKD_CHROMIUM", CHROMIUM)
        .env("HOOKD_PROFILE_DIR", profile.path())
        .env("HOOKD_SCREENSHOTS", &screenshots)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(240), output)
        .await
        .expect("the browser script finishes within 4 minutes")
        .expect("node runs");
    assert!(
        output.status.success(),
        "the browser script failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // What the browser did, seen from the server.
    host.wait_state("t", "evt-dead", "h", "done", WAIT).await;
    host.wait_state("t", "evt-discard", "h", "discarded", WAIT)
        .await;
    let session = support::dashboard_session(host.admin).await;
    let (_, quarantine) = dashboard_get(&host, &session, "/quarantine").await;
    assert!(
        quarantine.contains("1 held in all."),
        "one discarded, one still held: {quarantine}"
    );
    let (_, count) = host.admin_get("/admin/plugins/h/state/count").await;
    assert_eq!(
        count["value"], 5,
        "the edit saved, the stale one did not: {count}"
    );
    let after = host.plugin("h").await;
    assert_eq!(sha(&after), Some(flaky_sha), "rolled back: {after}");
    // The version rolled back from is not a rollback target (the next one goes further back).
    assert!(
        !after["previous"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| *s == deployed_sha),
        "{after}"
    );
}

/// A GET of the dashboard's `path` with the session cookie `session`: status and page.
async fn dashboard_get(
    host: &TestHost,
    session: &[(HeaderName, HeaderValue)],
    path: &str,
) -> (StatusCode, String) {
    let url = format!("http://{}{path}", host.admin);
    let (status, _, body) = support::send(Method::GET, &url, session, Bytes::new())
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A form POST to the dashboard's `path` with the session cookie `session`: status, headers
/// and page.
async fn dashboard_post(
    host: &TestHost,
    session: &[(HeaderName, HeaderValue)],
    path: &str,
    form: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, String) {
    let url = format!("http://{}{path}", host.admin);
    let mut headers = session.to_vec();
    headers.push((
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    ));
    let body = form
        .iter()
        .map(|(name, value)| format!("{name}={}", form_encode(value)))
        .collect::<Vec<_>>()
        .join("&");
    let (status, headers, body) = support::send(Method::POST, &url, &headers, Bytes::from(body))
        .await
        .unwrap();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// `text` as a form value: every byte but ASCII letters, digits and `-._~/` percent-encoded.
fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text between `before` and the next `after` in `page`.
fn between<'a>(page: &'a str, before: &str, after: &str) -> &'a str {
    let start = page
        .find(before)
        .unwrap_or_else(|| panic!("no {before:?} in {page}"))
        + before.len();
    let len = page[start..].find(after).unwrap();
    &page[start..start + len]
}

/// The dashboard's discard forms over plain HTTP: without the session's CSRF token they are
/// refused and discard nothing; a dead-letter discard that would name no handler (and so reach
/// held quarantined requests) is refused too; with the token, the dry run counts, the
/// confirmation discards, and a held request is discarded once (then it is not held: 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_discard_needs_the_csrf_token_and_takes_only_what_it_names() {
    let host = start_host().await;
    host.accept_event("t", "d1", &json!({"permanent": true}))
        .await;
    host.wait_state("t", "d1", "h", "dead", WAIT).await;
    let (status, reply) = post_sw(host.ingest, "q", "held-1", b"{}").await.unwrap();
    assert_eq!(reply["quarantined"], true, "{status} {reply}");

    let session = support::dashboard_session(host.admin).await;
    let (status, page) = dashboard_get(&host, &session, "/quarantine").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let csrf = between(&page, "name=\"csrf\" value=\"", "\"").to_owned();
    let csrf = csrf.as_str();
    let held = between(&page, "action=\"/quarantine/", "/replay\"").to_owned();
    let held_discard = format!("/quarantine/{held}/discard");
    let dead_letter = [
        ("handler", "h"),
        ("state", "dead"),
        ("error_kind", "permanent"),
        ("back", "/dead-letters"),
    ];
    let still_held = async || {
        let (_, page) = dashboard_get(&host, &session, "/quarantine").await;
        page.contains("1 held in all.")
    };

    // Without the token (or with a wrong one): refused, nothing discarded.
    let wrong = "0".repeat(64);
    for token in [vec![], vec![("csrf", wrong.as_str())]] {
        let form = [&dead_letter[..], &[("confirm", "yes")], &token].concat();
        let (status, _, page) = dashboard_post(&host, &session, "/discard", &form).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
        let (status, _, page) = dashboard_post(&host, &session, &held_discard, &token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    }
    host.wait_state("t", "d1", "h", "dead", WAIT).await;
    assert!(still_held().await);

    // A discard naming no handler, or another state, would reach further than dead letters
    // (a source's held requests): refused, nothing discarded.
    for form in [
        vec![("source", "q"), ("confirm", "yes"), ("csrf", csrf)],
        vec![
            ("source", "t"),
            ("state", "dead"),
            ("confirm", "yes"),
            ("csrf", csrf),
        ],
        vec![
            ("handler", "h"),
            ("state", "done"),
            ("confirm", "yes"),
            ("csrf", csrf),
        ],
    ] {
        let (status, _, page) = dashboard_post(&host, &session, "/discard", &form).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{form:?}: {page}");
        assert!(page.contains("nothing was discarded"), "{page}");
    }
    host.wait_state("t", "d1", "h", "dead", WAIT).await;
    assert!(still_held().await);

    // With the token: the dry run counts and discards nothing...
    let dry = [&dead_letter[..], &[("csrf", csrf)]].concat();
    let (status, _, page) = dashboard_post(&host, &session, "/discard", &dry).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<strong>1</strong> delivery matches"),
        "{page}"
    );
    assert!(page.contains("Discard 1"), "{page}");
    host.wait_state("t", "d1", "h", "dead", WAIT).await;
    // ...and the confirmation discards, then goes back.
    let (status, headers, page) = dashboard_post(
        &host,
        &session,
        "/discard",
        &[dry, vec![("confirm", "yes")]].concat(),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(headers[header::LOCATION], "/dead-letters");
    host.wait_state("t", "d1", "h", "discarded", WAIT).await;
    assert!(
        still_held().await,
        "a dead-letter discard leaves quarantine alone"
    );

    // A held request is discarded once; then it is not held.
    let form = [("csrf", csrf)];
    let (status, _, page) = dashboard_post(&host, &session, &held_discard, &form).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("Discarded"), "{page}");
    let (_, quarantine) = dashboard_get(&host, &session, "/quarantine").await;
    assert!(quarantine.contains("0 held in all."), "{quarantine}");
    let (status, _, page) = dashboard_post(&host, &session, &held_discard, &form).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(
        page.contains(&format!("no quarantined request {held} is held")),
        "{page}"
    );
}

/// A state save whose text is not JSON is refused on the key's page with the text kept; when
/// the key has also changed since the form was shown, the page says so, since its form is at
/// the current version and would not refuse text made on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_state_save_says_when_the_key_changed_meanwhile() {
    let host = start_host().await;
    let key = "/admin/plugins/h/state/k";
    let put = async |precondition: (HeaderName, &str), value: i64| {
        let (status, headers, body) = support::admin_call_with(
            host.admin,
            Method::PUT,
            key,
            Some(ADMIN_TOKEN),
            &[precondition],
            Some(json!({"encoding": "json", "value": value})),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        headers[header::ETAG]
            .to_str()
            .unwrap()
            .trim_matches('"')
            .to_owned()
    };
    let shown = put((header::IF_NONE_MATCH, "*"), 1).await;
    let session = support::dashboard_session(host.admin).await;
    let (status, page) = dashboard_get(&host, &session, "/plugins/h/state/k").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let csrf = between(&page, "name=\"csrf\" value=\"", "\"").to_owned();
    let save = async |version: &str| {
        let form = [
            ("csrf", csrf.as_str()),
            ("version", version),
            ("encoding", "json"),
            ("value", "{\"total\": 5,"),
        ];
        dashboard_post(&host, &session, "/plugins/h/state/k", &form).await
    };

    let (status, _, page) = save(&shown).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("Your edit was not saved"), "{page}");
    assert!(page.contains("{&quot;total&quot;: 5,"), "{page}");
    assert!(!page.contains("has also changed"), "{page}");

    put((header::IF_MATCH, &format!("\"{shown}\"")), 2).await;
    let (status, _, page) = save(&shown).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(
        page.contains("The key has also changed since you opened it"),
        "{page}"
    );
}

/// A bidi control in an event id reorders only the id, in the page's `<title>` and heading
/// too, which no style isolates: the id is written between FIRST STRONG ISOLATE and POP
/// DIRECTIONAL ISOLATE in the title, in a `<bdi>` in the heading (before, the override ran on past the id, over ` · hookd`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_id_s_bidi_controls_stay_inside_it_in_the_title() {
    let config = sw_source("g", &[], support::KEYED_BY_BODY);
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;
    let id = "abc\u{202e}dcba";
    let body = json!({"id": id, "key": "k", "seq": 1}).to_string();
    let (status, reply) = post_sw(host.ingest, "g", "m-1", body.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let session = support::dashboard_session(host.admin).await;
    let path = format!("/events/g/{}", form_encode(id));
    let (status, page) = dashboard_get(&host, &session, &path).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let isolated = format!("Event \u{2068}{id}\u{2069}");
    assert_eq!(between(&page, "<title>", " · hookd"), isolated, "{page}");
    assert_eq!(
        between(&page, "<h1>", "</h1>"),
        format!("Event <bdi>{id}</bdi>"),
        "{page}"
    );
}

/// An event whose id is `..` (or `.`) has a page the dashboard links to and a browser can reach:
/// a browser resolves such a path segment away (`/events/g/..` is `/events/`, `%2E%2E` too),
/// so the link carries a NUL after it (`..%00`), which no id can hold. Before, the list linked
/// `/events/g/..`, and neither the page nor its replay and discard could be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_id_is_a_dot_segment_has_a_page_a_browser_can_reach() {
    let config = sw_source("g", &[], support::KEYED_BY_BODY);
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;
    let session = support::dashboard_session(host.admin).await;
    for (n, id) in ["..", "."].into_iter().enumerate() {
        let body = json!({"id": id, "key": "k", "seq": n}).to_string();
        let (status, reply) = post_sw(host.ingest, "g", &format!("m-{n}"), body.as_bytes())
            .await
            .unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        let link = format!("/events/g/{id}%00");
        let (_, list) = dashboard_get(&host, &session, "/events?source=g").await;
        assert!(list.contains(&format!("href=\"{link}\"")), "{list}");
        let (status, page) = dashboard_get(&host, &session, &link).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.contains(&format!("Event <bdi>{id}</bdi>")), "{page}");
    }
}

/// A form over its cap is answered as the dashboard's error page, like the dashboard's other
/// refusals, the sign-in form's too (the one form read without a session): before, both were
/// answered the API's JSON, which a browser shows as raw text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_over_its_cap_is_answered_as_a_page() {
    let host = start_host().await;
    let session = support::dashboard_session(host.admin).await;
    let long = "x".repeat(20_000);
    for (session, path) in [(&[][..], "/sign-in"), (&session[..], "/replay")] {
        let (status, headers, page) =
            dashboard_post(&host, session, path, &[("token", &long)]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {page}");
        let kind = headers[header::CONTENT_TYPE].to_str().unwrap();
        assert!(kind.starts_with("text/html"), "{path}: {kind} {page}");
        assert!(page.contains("role=\"alert\""), "{path}: {page}");
    }
}
