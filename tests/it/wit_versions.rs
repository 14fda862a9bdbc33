//! WIT versions: components built against `hookd:plugin@0.1.0` and `@0.2.0` (checked in,
//! never rebuilt) load and behave as before on this host; a 0.2.0 parser answers a provider's
//! challenge itself with `respond`, nothing stored; `/admin/plugins` names each plugin's
//! version. (A 0.2.0 handler given stale events: `ordering.rs`.)

use std::{path::Path, time::Duration};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use crate::{
    ingest::metric_reads,
    support::{self, AdminApi, TestHost, plugins},
};

const WAIT: Duration = Duration::from_secs(60);

/// A checked-in component of an older WIT `version` (`v0.1.0`, `v0.2.0`; see the README
/// beside each).
pub(crate) fn fixture(version: &str, name: &str) -> String {
    Path::new(plugins::WORKSPACE_ROOT)
        .join("tests/fixtures")
        .join(version)
        .join(format!("{name}.wasm"))
        .display()
        .to_string()
}

/// The checked-in 0.2.0 `responder`.
fn responder() -> String {
    fixture("v0.2.0", "responder")
}

/// A `none` source `custom` parsed by the 0.2.0 `responder`, whose answers are capped at 1 KiB.
const RESPONDER: &str = r#"
[sources.custom]
scheme = "none"
parser = "responder"

[plugins.responder]
wasm = "responder"
output_kib = 1
"#;

/// POSTs `body` (JSON) to `/hooks/custom?{query}`; the status, headers and raw body.
async fn post_custom(
    host: &TestHost,
    query: &str,
    body: &Value,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let url = format!("http://{}/hooks/custom?{query}", host.ingest);
    let headers = [(
        HeaderName::from_static("content-type"),
        HeaderValue::from_static("application/json"),
    )];
    support::send(Method::POST, &url, &headers, Bytes::from(body.to_string()))
        .await
        .unwrap()
}

/// The `/admin/plugins` entry of instance `name`.
async fn plugin(host: &TestHost, name: &str) -> Value {
    let (status, list) = host.admin_get("/admin/plugins").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no plugin {name} in {list:#}"))
}

/// The old SDK's handler keeps its state across events on the new host: its counts go 1, 2, 3
/// exactly as they did when 0.1.0 was the only version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_built_against_wit_0_1_0_runs_and_keeps_its_state() {
    let config = format!(
        r#"
        [sources.s]
        scheme = "standard-webhooks"
        secrets = ["{}"]
        handlers = ["counter"]
        "#,
        support::SW_SECRET
    );
    let host = TestHost::start(&config, &[("counter", &fixture("v0.1.0", "counter"))]).await;
    for n in 1..=3 {
        let id = format!("evt_{n}");
        host.accept_event("s", &id, &json!({"n": n})).await;
        let delivery = host.wait_state("s", &id, "counter", "done", WAIT).await;
        assert_eq!(
            delivery["output"],
            format!(r#"{{"count":{n}}}"#),
            "{delivery:#}"
        );
    }
    host.stop().await;
}

/// The old SDK's parser still extracts its envelope: the event is stored under the id and
/// type the 0.1.0 `github` parser gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parser_built_against_wit_0_1_0_still_parses() {
    let config = r#"
        [sources.gh]
        scheme = "none"
        parser = "github"
    "#;
    let host = TestHost::start(config, &[("github", &fixture("v0.1.0", "github"))]).await;
    let headers = [
        (
            HeaderName::from_static("x-github-delivery"),
            HeaderValue::from_static("d-0001"),
        ),
        (
            HeaderName::from_static("x-github-event"),
            HeaderValue::from_static("issues"),
        ),
    ];
    let (status, reply) = host
        .post("gh", &headers, &support::github_issue(7, "t", "b"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let event = host
        .event("gh", "d-0001")
        .await
        .expect("the event is stored");
    assert_eq!(event["event_type"], "issues.opened", "{event:#}");
    host.stop().await;
}

/// A 0.2.0 parser's `respond` reaches the provider as-is (status, headers, body), and the
/// parser was given the request's method and query. (The tests below run today's build of the
/// same parser.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wit_0_2_0_parser_answers_a_custom_challenge_with_respond() {
    let host = TestHost::start(RESPONDER, &[("responder", &responder())]).await;
    let challenge = json!({"type": "challenge", "challenge": "c-123"});
    let (status, headers, body) = post_custom(&host, "probe=1&x=%20", &challenge).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-challenge"], "answered");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"challenge": "c-123", "method": "POST", "query": "probe=1&x=%20"})
    );
    host.stop().await;
}

/// A request the parser answered is not stored: no event, nothing quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_parser_answered_is_not_stored() {
    let host = TestHost::start(RESPONDER, &[("responder", plugins::RESPONDER)]).await;
    let challenge = json!({"type": "challenge", "challenge": "c-1"});
    let (status, _, _) = post_custom(&host, "", &challenge).await;
    assert_eq!(status, StatusCode::OK);
    // An event after it is stored, so the list below is known to be up to date.
    let headers = [(
        HeaderName::from_static("x-event-id"),
        HeaderValue::from_static("e-1"),
    )];
    let (status, reply) = host.post("custom", &headers, br#"{"type":"event"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let (_, events) = host.admin_get("/admin/events?source=custom").await;
    let ids: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e-1"], "{events:#}");
    metric_reads(&host, "hookd_quarantined", 0).await;
    host.stop().await;
}

/// An answer over the plugin's output cap is never sent: the parse counts as failed and the
/// request is quarantined (202), like any parser output over its cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parser_answer_over_the_output_cap_is_not_sent() {
    let host = TestHost::start(RESPONDER, &[("responder", plugins::RESPONDER)]).await;
    let (status, _, body) = post_custom(&host, "", &json!({"type": "big", "size": 2048})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        support::json_or_text(&body),
        json!({"accepted": true, "quarantined": true})
    );
    host.stop().await;
}

/// A parser's answer carries `X-Content-Type-Options: nosniff` whatever the parser set, and a
/// 204, 205 or 304 goes without the body HTTP says it has none of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parser_answer_is_nosniff_and_bodiless_where_http_says() {
    let host = TestHost::start(RESPONDER, &[("responder", plugins::RESPONDER)]).await;
    for (status, body) in [(204, ""), (205, ""), (304, ""), (200, "no body, please")] {
        let asked = json!({"type": "status", "status": status});
        let (got, headers, sent) = post_custom(&host, "", &asked).await;
        assert_eq!(got.as_u16(), status);
        assert_eq!(sent, body.as_bytes(), "{status}");
        assert_eq!(
            headers.get("x-content-type-options").unwrap(),
            "nosniff",
            "{status}: {headers:?}"
        );
        let length = headers.get("content-length").map(|v| v.to_str().unwrap());
        let expected = match status {
            200 => Some("15"),
            205 => Some("0"),
            _ => None,
        };
        assert_eq!(length, expected, "{status}: {headers:?}");
    }
    host.stop().await;
}

/// `/admin/plugins` names the WIT version each plugin was built against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_plugins_shows_each_plugin_s_wit_version() {
    let config = format!(
        "{RESPONDER}\n[sources.s]\nscheme = \"none\"\nhandlers = [\"counter\"]\n\
         [sources.t]\nscheme = \"none\"\nhandlers = [\"flaky\"]\n"
    );
    let host = TestHost::start(
        &config,
        &[
            ("counter", &fixture("v0.1.0", "counter")),
            ("responder", &responder()),
            ("flaky", plugins::FLAKY),
        ],
    )
    .await;
    assert_eq!(plugin(&host, "counter").await["wit_version"], "0.1.0");
    assert_eq!(plugin(&host, "responder").await["wit_version"], "0.2.0");
    assert_eq!(plugin(&host, "flaky").await["wit_version"], "0.3.0");
    host.stop().await;
}

/// A component of a WIT version this hookd does not know is refused at load, and the error
/// names the version it exports and the versions hookd loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_of_an_unknown_wit_version_is_refused_naming_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = wat::parse_str(
        r#"(component
             (instance $handler)
             (export "hookd:plugin/handler@0.9.0" (instance $handler)))"#,
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    std::fs::write(dir.path().join("plugins/future.wasm"), wasm).unwrap();
    let config = "[sources.s]\nscheme = \"none\"\nhandlers = [\"future\"]\n";
    let host = TestHost::start_in(dir, config).await;
    let entry = plugin(&host, "future").await;
    let error = entry["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("hookd:plugin/handler@0.9.0")
            && error.contains("it loads 0.1.0, 0.2.0, 0.3.0"),
        "{entry:#}"
    );
    assert_eq!(entry["wit_version"], Value::Null, "{entry:#}");
    host.stop().await;
}
