//! Plugin state through the admin API and `hookd state`, on a running host with the `counter`
//! plugin: the count after events, an edit at the right version (and refusals of a missing or
//! stale one), and the next event counting on from the edited value.
//!
//! Invariant checked: an edit writes only at the version it names, and what it writes is what
//! the handler reads next.

use std::{path::Path, time::Duration};

use http::{HeaderName, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, AdminApi, TestHost, admin_call_with, hookd_cli, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// Source `s` → `counter`.
async fn start() -> TestHost {
    let config = sw_source("s", &["counter"], "");
    TestHost::start(&config, &[("counter", crate::support::plugins::COUNTER)]).await
}

/// Sends event `id` and waits until `counter` has handled it; returns the count it output.
async fn count_event(host: &TestHost, id: &str) -> u64 {
    host.accept_event("s", id, &json!({})).await;
    let delivery = host.wait_state("s", id, "counter", "done", WAIT).await;
    let output: Value = serde_json::from_str(delivery["output"].as_str().unwrap()).unwrap();
    output["count"].as_u64().unwrap()
}

/// One admin call with the token and `headers`: status, `ETag`, body.
async fn call(
    host: &TestHost,
    method: Method,
    path: &str,
    headers: &[(HeaderName, &str)],
    body: Option<Value>,
) -> (StatusCode, Option<String>, Value) {
    let (status, answer_headers, body) =
        admin_call_with(host.admin, method, path, Some(ADMIN_TOKEN), headers, body)
            .await
            .unwrap();
    let etag = answer_headers
        .get(header::ETAG)
        .map(|v| v.to_str().unwrap().to_owned());
    (status, etag, body)
}

const COUNT: &str = "/admin/plugins/counter/state/count";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_count_is_read_and_edited_at_its_version_and_counting_goes_on_from_the_edit() {
    let host = start().await;
    for id in ["a", "b", "c"] {
        count_event(&host, id).await;
    }

    // Listed with its size, version and when written; read as JSON with its version as ETag.
    let (status, _, list) = call(
        &host,
        Method::GET,
        "/admin/plugins/counter/state",
        &[],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let listed = &list["keys"][0];
    assert_eq!(
        (&list["plugin"], &listed["key"], &listed["size"]),
        (&json!("counter"), &json!("count"), &json!(1))
    );
    assert!(
        listed["updated_at"].as_i64().is_some_and(|at| at > 0),
        "{list}"
    );
    assert_eq!(list["next_after"], Value::Null);
    let (status, etag, value) = call(&host, Method::GET, COUNT, &[], None).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    assert_eq!(
        (&value["encoding"], &value["value"]),
        (&json!("json"), &json!(3))
    );
    let version = value["version"].as_i64().unwrap();
    assert_eq!(etag, Some(format!("\"{version}\"")));

    // A write naming no version, a stale one, or creating a key that exists, writes nothing.
    let ten = Some(json!({"encoding": "json", "value": 10}));
    let (status, _, refused) = call(&host, Method::PUT, COUNT, &[], ten.clone()).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{refused}");
    assert_eq!(refused["error"], "precondition_required");
    let stale = format!("\"{}\"", version - 1);
    let (status, _, refused) = call(
        &host,
        Method::PUT,
        COUNT,
        &[(header::IF_MATCH, &stale)],
        ten.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"], "version_conflict");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("plugin counter") && detail.contains(&format!("version {version}")),
        "{detail}"
    );
    let (status, _, _) = call(
        &host,
        Method::PUT,
        COUNT,
        &[(header::IF_NONE_MATCH, "*")],
        ten.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, _, unchanged) = call(&host, Method::GET, COUNT, &[], None).await;
    assert_eq!(unchanged["value"], 3);

    // At the right version it is written, with a new version, and the next event goes on from it.
    let (status, etag, written) = call(
        &host,
        Method::PUT,
        COUNT,
        &[(header::IF_MATCH, &format!("\"{version}\""))],
        ten,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{written}");
    let edited = written["version"].as_i64().unwrap();
    assert!(edited > version, "{written}");
    assert_eq!(etag, Some(format!("\"{edited}\"")));
    assert_eq!(count_event(&host, "d").await, 11);

    // Deleted at its version, it is gone, and counting starts again.
    let (_, etag, _) = call(&host, Method::GET, COUNT, &[], None).await;
    let (status, _, deleted) = call(
        &host,
        Method::DELETE,
        COUNT,
        &[(header::IF_MATCH, &etag.unwrap())],
        None,
    )
    .await;
    assert_eq!(
        (status, &deleted["version"]),
        (StatusCode::OK, &json!(0)),
        "{deleted}"
    );
    let (status, _, missing) = call(&host, Method::GET, COUNT, &[], None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    assert!(
        missing["detail"]
            .as_str()
            .unwrap()
            .contains("plugin counter has no state key \"count\"")
    );
    assert_eq!(count_event(&host, "e").await, 1);

    // Bytes that are not JSON travel as base64, and come back exactly.
    let blob = "/admin/plugins/counter/state/raw%2Fblob";
    let body = Some(json!({"encoding": "base64", "value": "AP8="}));
    let (status, _, _) = call(
        &host,
        Method::PUT,
        blob,
        &[(header::IF_NONE_MATCH, "*")],
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, _, value) = call(&host, Method::GET, blob, &[], None).await;
    assert_eq!(
        (&value["key"], &value["encoding"], &value["value"]),
        (&json!("raw/blob"), &json!("base64"), &json!("AP8="))
    );
    let (_, _, page) = call(
        &host,
        Method::GET,
        "/admin/plugins/counter/state?prefix=raw/&limit=1",
        &[],
        None,
    )
    .await;
    assert_eq!(page["keys"][0]["key"], "raw/blob");
    assert_eq!(page["next_after"], "raw/blob");
    // `limit=0` asks for nothing: an empty page with no next one.
    let (status, _, page) = call(
        &host,
        Method::GET,
        "/admin/plugins/counter/state?limit=0",
        &[],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&page["keys"], &page["next_after"]),
        (&json!([]), &Value::Null)
    );

    // A key holding a NUL (which no plugin can write, and PostgreSQL cannot store) is refused
    // as a write, a prefix or a cursor, and read as absent.
    let nul_put = call(
        &host,
        Method::PUT,
        "/admin/plugins/counter/state/n%00k",
        &[(header::IF_NONE_MATCH, "*")],
        Some(json!({"encoding": "json", "value": 1})),
    )
    .await;
    assert_eq!(nul_put.0, StatusCode::BAD_REQUEST, "{:?}", nul_put.2);
    assert!(
        nul_put.2["detail"]
            .as_str()
            .unwrap()
            .contains("may not hold a NUL character"),
        "{:?}",
        nul_put.2
    );
    for path in [
        "/admin/plugins/counter/state?prefix=%00",
        "/admin/plugins/counter/state?after=a%00",
    ] {
        let (status, _, body) = call(&host, Method::GET, path, &[], None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    let (status, _, _) = call(
        &host,
        Method::GET,
        "/admin/plugins/counter/state/a%00",
        &[],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // An unknown instance is named.
    let (status, _, unknown) =
        call(&host, Method::GET, "/admin/plugins/nope/state", &[], None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        unknown["detail"].as_str().unwrap().contains("\"nope\""),
        "{unknown}"
    );
}

/// A parser has no state: a value written for an instance that only parses would be read by
/// nothing (before, it was taken, and counted against the instance's quota), so it is refused
/// naming the plugin; a delete is still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_for_an_instance_that_only_parses_is_refused() {
    let config = sw_source("s", &["counter"], "parser = \"generic\"");
    let host = TestHost::start(
        &config,
        &[
            ("counter", crate::support::plugins::COUNTER),
            ("generic", crate::support::plugins::GENERIC),
        ],
    )
    .await;
    let value = json!({"encoding": "json", "value": 1});
    let (status, _, refused) = call(
        &host,
        Method::PUT,
        "/admin/plugins/generic/state/k",
        &[(header::IF_NONE_MATCH, "*")],
        Some(value.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("plugin generic is only a parser"),
        "{detail}"
    );
    let (status, _, list) = call(
        &host,
        Method::GET,
        "/admin/plugins/generic/state",
        &[],
        None,
    )
    .await;
    assert_eq!(
        (status, &list["keys"]),
        (StatusCode::OK, &json!([])),
        "{list}"
    );
    let (status, _, _) = call(
        &host,
        Method::PUT,
        "/admin/plugins/counter/state/k",
        &[(header::IF_NONE_MATCH, "*")],
        Some(value),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the handler's state is still written"
    );
}

/// The CLI in the host's directory, with its config (for the token) and admin URL.
async fn hookd_state(host: &TestHost, args: &[&str]) -> std::process::Output {
    let url = format!("http://{}", host.admin);
    let config = host.path().join("hookd.toml");
    let mut all = vec!["state"];
    all.extend(args);
    all.extend(["--config", config.to_str().unwrap(), "--admin-url", &url]);
    hookd_cli(Path::new("."), &all).await
}

/// What a successful command printed, as JSON.
fn printed(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "hookd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hookd_state_lists_gets_sets_and_deletes() {
    let host = start().await;
    count_event(&host, "a").await;
    count_event(&host, "b").await;

    let list = printed(&hookd_state(&host, &["list", "counter", "--prefix", "co"]).await);
    assert_eq!(list["keys"][0]["key"], "count");
    let got = printed(&hookd_state(&host, &["get", "counter", "count"]).await);
    assert_eq!(got["value"], 2);
    let version = got["version"].as_i64().unwrap().to_string();

    // A stale version is refused with the server's 409; the value stays.
    let stale = hookd_state(&host, &["set", "counter", "count", "41", "--if-match", "1"]).await;
    let stderr = String::from_utf8_lossy(&stale.stderr);
    assert!(
        !stale.status.success() && stderr.contains("409") && stderr.contains("version_conflict"),
        "{stderr}"
    );
    // Without --if-match only a new key may be set.
    let exists = hookd_state(&host, &["set", "counter", "count", "41"]).await;
    assert!(String::from_utf8_lossy(&exists.stderr).contains("409"));

    let set = printed(
        &hookd_state(
            &host,
            &["set", "counter", "count", "41", "--if-match", &version],
        )
        .await,
    );
    assert!(
        set["version"].as_i64().unwrap() > version.parse().unwrap(),
        "{set}"
    );
    assert_eq!(count_event(&host, "c").await, 42);

    // A value from a file, stored as its bytes.
    let file = host.path().join("value.bin");
    std::fs::write(&file, [0u8, 1, 2]).unwrap();
    let created = printed(
        &hookd_state(
            &host,
            &["set", "counter", "bytes", "--file", file.to_str().unwrap()],
        )
        .await,
    );
    let got = printed(&hookd_state(&host, &["get", "counter", "bytes"]).await);
    assert_eq!(
        (&got["encoding"], &got["value"]),
        (&json!("base64"), &json!("AAEC"))
    );
    // JSON as an editor saves it, a line break after it: stored with the line break.
    let file = host.path().join("value.json");
    std::fs::write(&file, "{\"a\":1}\n").unwrap();
    printed(
        &hookd_state(
            &host,
            &["set", "counter", "edited", "--file", file.to_str().unwrap()],
        )
        .await,
    );
    let got = printed(&hookd_state(&host, &["get", "counter", "edited"]).await);
    assert_eq!(
        (&got["encoding"], &got["value"], &got["size"]),
        (&json!("base64"), &json!("eyJhIjoxfQo="), &json!(8))
    );

    let version = created["version"].to_string();
    let deleted = printed(
        &hookd_state(
            &host,
            &["delete", "counter", "bytes", "--if-match", &version],
        )
        .await,
    );
    assert_eq!(deleted["version"], 0);
    let gone = hookd_state(&host, &["get", "counter", "bytes"]).await;
    assert!(String::from_utf8_lossy(&gone.stderr).contains("404"));
}
