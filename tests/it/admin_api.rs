//! The admin listener's wire shapes, route by route, against a running host: every key of every
//! JSON answer and the JSON type of its value.
//!
//! Invariant checked: an answer's shape changes only if the contract does (a renamed, added,
//! dropped or retyped field fails the route's test).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{self, AdminApi, TestHost, plugins, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// Source `t` → `counter` (succeeds) and `flaky` (told to fail for good: dead at once); `twin`,
/// named by no source, is a second instance of the `flaky` file.
fn config() -> String {
    sw_source("t", &["counter", "flaky"], "") + "\n[plugins.twin]\nwasm = \"flaky\"\n"
}

async fn start() -> TestHost {
    TestHost::start(
        &config(),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await
}

/// A host holding one event, `e1`, whose `counter` delivery is done and `flaky` one dead.
pub(crate) async fn start_with_an_event() -> TestHost {
    let host = start().await;
    host.accept_event("t", "e1", &json!({"permanent": true}))
        .await;
    host.wait_state("t", "e1", "counter", "done", WAIT).await;
    host.wait_state("t", "e1", "flaky", "dead", WAIT).await;
    host
}

/// A host whose `flaky` file was replaced by a deploy, so it has a version to roll back to.
pub(crate) async fn start_with_a_previous_version() -> TestHost {
    let host = start().await;
    let file = host.path().join("plugins").join("flaky.wasm");
    let part = file.with_extension("part");
    std::fs::copy(plugins::CLASSIFIER, &part).unwrap();
    std::fs::rename(&part, &file).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, list) = host.admin_get("/admin/plugins").await;
        let flaky = list
            .as_array()
            .and_then(|l| l.iter().find(|p| p["name"] == "flaky"));
        if flaky.is_some_and(|p| p["previous"].as_array().is_some_and(|v| !v.is_empty())) {
            return host;
        }
        assert!(
            Instant::now() < deadline,
            "the new flaky.wasm was not loaded: {list:#}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `value` with every leaf replaced by its JSON type's name, arrays element by element.
fn shape(value: &Value) -> Value {
    match value {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(n) if n.is_f64() => json!("float"),
        Value::Number(_) => json!("integer"),
        Value::String(_) => json!("string"),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| (key.clone(), shape(value)))
                .collect(),
        ),
    }
}

/// `GET path` (with the token, which the open routes ignore): asserts a 200 and returns the answer.
async fn get(host: &TestHost, path: &str) -> Value {
    let (status, reply) = host.admin_get(path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {reply}");
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_has_its_shape() {
    let host = start().await;
    let reply = get(&host, "/healthz").await;
    assert_eq!(
        shape(&reply),
        json!({"backlog": "integer", "pooling_allocator": "bool", "status": "string"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_names_every_series() {
    let host = start().await;
    let url = format!("http://{}/metrics", host.admin);
    let (status, _, body) = support::send(Method::GET, &url, &[], Default::default())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let series: BTreeSet<String> = String::from_utf8(body.to_vec())
        .unwrap()
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.rsplit_once(' ').unwrap().0.to_owned())
        .collect();
    let expected: BTreeSet<String> = [
        "hookd_deliveries{state=\"pending\"}",
        "hookd_deliveries{state=\"running\"}",
        "hookd_deliveries{state=\"retrying\"}",
        "hookd_deliveries{state=\"done\"}",
        "hookd_deliveries{state=\"dead\"}",
        "hookd_deliveries{state=\"stale\"}",
        "hookd_deliveries{state=\"discarded\"}",
        "hookd_quarantined",
        "hookd_backlog",
        "hookd_inbox_commits_total",
    ]
    .map(str::to_owned)
    .into();
    // The series scrapers have always read are all still there (more were added since).
    let missing: Vec<_> = expected.difference(&series).collect();
    assert!(missing.is_empty(), "{missing:?} gone from {series:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_list_has_its_shape() {
    let host = start_with_an_event().await;
    let list = get(&host, "/admin/events").await;
    assert_eq!(
        shape(&list),
        json!([{
            "source": "string",
            "event_id": "string",
            "event_type": "string",
            "received_at": "integer",
            "states": {"counter": "string", "flaky": "string"},
        }])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_detail_has_its_shape() {
    let host = start_with_an_event().await;
    let detail = get(&host, "/admin/events/t/e1").await;
    let delivery = |error: &str| {
        json!({
            "handler": "string",
            "state": "string",
            "attempts": "integer",
            "output": if error == "null" { "string" } else { "null" },
            "last_error": error,
            "next_attempt_at": "null",
            "history": [{
                "attempt": "integer",
                "started_at": "integer",
                "finished_at": "integer",
                "outcome": "string",
                "error_kind": error,
                "error": error,
                "plugin_sha256": "string",
            }],
        })
    };
    assert_eq!(
        shape(&detail),
        json!({
            "source": "string",
            "event_id": "string",
            "event_type": "string",
            "ordering_key": "null",
            "sequence": "null",
            "received_at": "integer",
            // Deliveries in handler order: counter succeeded, flaky failed.
            "deliveries": [delivery("null"), delivery("string")],
        }),
        "{detail:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_answer_has_its_shape() {
    let host = start_with_an_event().await;
    let (status, reply) = host
        .admin_post("/admin/replay", json!({"event_ids": ["e1"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        shape(&reply),
        json!({"matched": "integer", "replayed": "integer"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_discard_answer_has_its_shape() {
    let host = start_with_an_event().await;
    let (status, reply) = host
        .admin_post("/admin/discard", json!({"event_ids": ["e1"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply, json!({"matched": 1, "discarded": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_list_has_its_shape() {
    let host = start_with_a_previous_version().await;
    let mut list = get(&host, "/admin/plugins").await;
    // `nodes` is keyed by node id (random per start): this node's live sha256 of each plugin.
    let node = get(&host, "/admin/nodes").await[0]["id"].clone();
    for plugin in list.as_array_mut().unwrap() {
        let nodes = plugin.as_object_mut().unwrap().remove("nodes").unwrap();
        let id = node.as_str().unwrap();
        assert_eq!(nodes, json!({id: plugin["sha256"]}), "{plugin:#}");
    }
    let plugin = |previous: Value, shared: Value| {
        json!({
            "error": "null",
            "exports": ["string"],
            "loaded_at": "integer",
            "name": "string",
            "previous": previous,
            "sha256": "string",
            "shared_with": shared,
            "wasm": "string",
            "wit_version": "string",
        })
    };
    let (previous, shared) = (json!(["string"]), json!(["string"]));
    assert_eq!(
        shape(&list),
        json!([
            plugin(json!([]), json!([])),
            plugin(previous.clone(), shared.clone()),
            plugin(previous, shared),
        ]),
        "{list:#}"
    );
    let shared_with: Vec<(&Value, &Value)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (&p["name"], &p["shared_with"]))
        .collect();
    assert_eq!(
        shared_with,
        [
            (&json!("counter"), &json!([])),
            (&json!("flaky"), &json!(["twin"])),
            (&json!("twin"), &json!(["flaky"])),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_list_has_its_shape() {
    let host = start().await;
    let list = get(&host, "/admin/nodes").await;
    assert_eq!(
        shape(&list),
        json!([{
            "admin_listen": "string",
            "alive": "bool",
            "id": "string",
            "in_flight": "integer",
            "last_heartbeat": "integer",
            "listen": "string",
            "plugins": {"counter": "string", "flaky": "string"},
            "started_at": "integer",
            "this_node": "bool",
        }]),
        "{list:#}"
    );
    assert_eq!(
        (list[0]["alive"].clone(), list[0]["this_node"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(list[0]["admin_listen"], host.admin.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollback_answer_has_its_shape() {
    let host = start_with_a_previous_version().await;
    let (status, reply) = host
        .admin_post("/admin/plugins/flaky/rollback", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        shape(&reply),
        json!({"name": "string", "sha256": "string", "instances": ["string", "string"]})
    );
    // Rolling back a shared file names every instance it changed.
    assert_eq!(reply["instances"], json!(["flaky", "twin"]), "{reply:#}");
    let (_, list) = host.admin_get("/admin/plugins").await;
    let live: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] != "counter")
        .map(|p| &p["sha256"])
        .collect();
    assert_eq!(live, [&reply["sha256"], &reply["sha256"]], "{list:#}");
}
