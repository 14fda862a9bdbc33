//! End to end: a signed webhook goes in, is parsed by a Wasm parser, stored once,
//! handled by a Wasm handler, and its output is visible through the admin API.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::json;

use crate::support::{self, AdminApi, ProcessHost, Scheme, TestHost, plugins};

const GITHUB_SOURCE: &str = r#"
[sources.github]
scheme = "github"
secrets = ["gh-secret"]
parser = "github"
handlers = ["classifier"]

[plugins.classifier]
config = { labels = "bug,feature,question,other" }
"#;

async fn post_github(
    host: &TestHost,
    secret: &str,
    delivery: &str,
    body: &[u8],
) -> (StatusCode, serde_json::Value) {
    let headers = support::github_headers(secret, delivery, "issues", body);
    host.post("github", &headers, body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_issue_is_accepted_once_classified_and_visible() {
    let host = TestHost::start(
        GITHUB_SOURCE,
        &[
            ("github", plugins::GITHUB),
            ("classifier", plugins::CLASSIFIER),
        ],
    )
    .await;
    let body = support::github_issue(
        7,
        "App crashes on start",
        "It throws an exception and the screen is broken",
    );

    let (status, reply) = post_github(&host, "gh-secret", "delivery-1", &body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(
        reply,
        json!({"accepted": true, "duplicate": false, "event_id": "delivery-1"})
    );

    // The provider retries: same delivery id, same bytes.
    let (status, reply) = post_github(&host, "gh-secret", "delivery-1", &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        reply,
        json!({"accepted": true, "duplicate": true, "event_id": "delivery-1"})
    );

    let (status, reply) = post_github(&host, "not-the-secret", "delivery-2", &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply["error"], "invalid_signature");
    assert!(!reply.to_string().contains("gh-secret"));

    let delivery = host
        .wait_state(
            "github",
            "delivery-1",
            "classifier",
            "done",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(delivery["attempts"], 1, "{delivery:#}");
    let output: serde_json::Value =
        serde_json::from_str(delivery["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["label"], "bug", "{output}");
    assert_eq!(output["via"], "keywords");
    let history = delivery["history"].as_array().unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0]["outcome"], "ok");
    assert_eq!(history[0]["plugin_sha256"].as_str().unwrap().len(), 64);

    let event = host.event("github", "delivery-1").await.unwrap();
    assert_eq!(event["event_type"], "issues.opened");
    assert_eq!(event["ordering_key"], "acme/widgets#7");
    // The rejected request was never stored.
    assert!(host.event("github", "delivery-2").await.is_none());
}

/// The published vectors, end to end over HTTP, with a tolerance wide enough for their old
/// timestamps (the signature math is what is checked here; tolerance is tested on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_signature_vectors_are_accepted_over_http() {
    let config = r#"
        [sources.gh]
        scheme = "github"
        secrets = ["It's a Secret to Everybody"]
        [sources.sw]
        scheme = "standard-webhooks"
        secrets = ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
        tolerance_secs = 2000000000
    "#;
    let host = TestHost::start(config, &[]).await;
    let h = |name: &'static str, value: &str| {
        (
            HeaderName::from_static(name),
            HeaderValue::from_str(value).unwrap(),
        )
    };

    // GH-1
    let gh = [
        h(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        ),
        h("x-github-delivery", "gh-1"),
        h("x-github-event", "ping"),
    ];
    let (status, reply) = host.post("gh", &gh, b"Hello, World!").await;
    assert_eq!(
        (status, reply["event_id"].as_str()),
        (StatusCode::ACCEPTED, Some("gh-1")),
        "{reply}"
    );
    let (status, _) = host.post("gh", &gh, b"Hello, World?").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // SW-1 and SW-2 (two secrets configured: rotation), and SW-2's near miss.
    let cases = [
        (
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            "1649367553",
            r#"{"email":"test@example.com","username":"test_user"}"#,
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
            StatusCode::ACCEPTED,
        ),
        (
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            r#"{"test": 2432232314}"#,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            StatusCode::ACCEPTED,
        ),
        (
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            r#"{"test": 2432232314}"#,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=",
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (id, ts, body, signature, expected) in cases {
        let headers = [
            h("webhook-id", id),
            h("webhook-timestamp", ts),
            h("webhook-signature", signature),
        ];
        let (status, reply) = host.post("sw", &headers, body.as_bytes()).await;
        assert_eq!(status, expected, "{id} {signature}: {reply}");
    }
    let _ = UNIX_EPOCH;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_does_not_match_the_wit_is_refused_with_a_clear_error() {
    let config = r#"
        [sources.m]
        scheme = "none"
        parser = "mismatch"
    "#;
    let host = TestHost::start(config, &[("mismatch", plugins::MISMATCH)]).await;
    let (status, list) = host.admin_get("/admin/plugins").await;
    assert_eq!(status, StatusCode::OK);
    let plugin = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "mismatch")
        .unwrap();
    let error = plugin["error"].as_str().unwrap_or_default();
    assert!(plugin["sha256"].is_null(), "{plugin:#}");
    assert!(
        error.contains("mismatch.wasm")
            && error.contains("hookd:plugin/parser")
            && error.contains("does not match"),
        "{error}"
    );

    // Its source quarantines instead of losing the request.
    let (status, reply) = host.post("m", &[], br#"{"id":"x"}"#).await;
    assert_eq!(
        (status, reply),
        (
            StatusCode::ACCEPTED,
            json!({"accepted": true, "quarantined": true})
        )
    );
}

/// `hookd new handler` makes a crate outside the workspace (the SDK by path) whose own unit test
/// passes under `cargo test`, and which `hookd dev` builds and serves from its own directory with
/// its generated hookd.toml: a signed event reaches the handler, and a saved edit is rebuilt and
/// hot-swapped into the running host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_handler_passes_its_test_and_handles_an_event_under_hookd_dev() {
    let root = std::path::Path::new(plugins::WORKSPACE_ROOT);
    // One target directory for every run: the SDK and its dependencies compile once, then only
    // the scaffolded crate does (its path changes with each temporary directory).
    let target = root.join("target/scaffold-test");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("scaffolded");
    let dir_arg = dir.to_str().unwrap();

    let new = ["new", "handler", "scaffolded", "--path", dir_arg];
    let created = support::hookd_cli(tmp.path(), &new).await;
    assert!(created.status.success(), "{created:?}");
    // The command it prints signs with the generated secret without printing it.
    let printed = String::from_utf8_lossy(&created.stdout);
    let (secret, _) =
        support::scaffold_config(&std::fs::read_to_string(dir.join("hookd.toml")).unwrap());
    assert!(
        printed.contains("hookd send --config hookd.toml --source scaffolded -")
            && !printed.contains(&secret),
        "{printed}"
    );
    // Never over what is there.
    let again = support::hookd_cli(tmp.path(), &new).await;
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && stderr.contains("is not empty"),
        "{stderr}"
    );

    let tested = tokio::process::Command::new(env!("CARGO"))
        .current_dir(&dir)
        .arg("test")
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success()
            && stdout.contains("each_event_type_is_counted_in_state ... ok")
            && stdout.contains("a_failed_notification_is_retried_and_counts_nothing ... ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );

    // Its hookd.toml as generated, on free ports and with the tests' admin token.
    let generated = std::fs::read_to_string(dir.join("hookd.toml")).unwrap();
    let (secret, config) = support::scaffold_config(&generated);
    let target_env = target.to_str().unwrap();
    let host = ProcessHost::start_dev(&dir, &config, &[("CARGO_TARGET_DIR", target_env)]).await;

    let body = br#"{"type":"order.paid"}"#;
    let headers = support::sign(
        &Scheme::StandardWebhooks,
        &secret,
        "evt_1",
        body,
        SystemTime::now(),
    );
    let (status, reply) = host.post("scaffolded", &headers, body).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let delivery = host
        .wait_state(
            "scaffolded",
            "evt_1",
            "scaffolded",
            "done",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        delivery["output"],
        r#"{"count":1,"event_type":"order.paid"}"#
    );
    host.wait_log(
        "hello: evt_1 is order.paid number 1",
        Duration::from_secs(10),
    )
    .await;
    let first = delivery["history"][0]["plugin_sha256"].clone();

    // Save an edit, as the author would: `hookd dev` rebuilds the crate and the running host
    // hot-swaps it; the next event runs the new build.
    let lib = dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edited = source.replace("{} is {} number {count}", "{} is {} event number {count}");
    assert_ne!(edited, source, "the scaffold changed; update this test");
    std::fs::write(&lib, edited).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let (_, plugins) = host.admin_get("/admin/plugins").await;
        let live = &plugins[0]["sha256"];
        if !live.is_null() && *live != first {
            assert!(plugins[0]["error"].is_null(), "{plugins:#}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edit was not rebuilt and swapped in: {plugins:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let headers = support::sign(
        &Scheme::StandardWebhooks,
        &secret,
        "evt_2",
        body,
        SystemTime::now(),
    );
    let (status, reply) = host.post("scaffolded", &headers, body).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let delivery = host
        .wait_state(
            "scaffolded",
            "evt_2",
            "scaffolded",
            "done",
            Duration::from_secs(30),
        )
        .await;
    assert_ne!(
        delivery["history"][0]["plugin_sha256"], first,
        "{delivery:#}"
    );
    host.wait_log(
        "hello: evt_2 is order.paid event number 2",
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sources_and_oversized_bodies_get_the_contract_answers() {
    let config = "[server]\nmax_body_bytes = 1024\n[sources.open]\nscheme = \"none\"\n";
    let host = TestHost::start(config, &[]).await;
    let (status, reply) = host.post("nope", &[], b"{}").await;
    assert_eq!(
        (status, reply),
        (StatusCode::NOT_FOUND, json!({"error": "unknown_source"}))
    );
    let (status, reply) = host.post("open", &[], &vec![b'x'; 2048]).await;
    assert_eq!(
        (status, reply),
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"error": "payload_too_large", "detail": "the body is over this endpoint's cap of 1024 bytes"})
        )
    );
    // No parser and no id header: a clear 400, nothing stored.
    let (status, reply) = host.post("open", &[], b"{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reply["error"], "unparsable");
}
