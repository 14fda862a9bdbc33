//! Retention and discard, black-box: a host with a one-second `done_after` prunes a finished
//! event (seen through the admin API), still answers its resend as a duplicate, never prunes a
//! dead delivery, and lets an operator discard dead deliveries and held quarantined requests
//! over HTTP, after which the discarded work is pruned like finished work.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    ADMIN_TOKEN, AdminApi, ProcessHost, TestHost, admin_call, plugins, post_sw, sw_source,
};

const WAIT: Duration = Duration::from_secs(60);

/// `t` → `counter` (succeeds), `f` → `flaky` (fails for good when told), `q` → a parser that
/// is not installed (every request is quarantined); payloads kept one second.
fn config() -> String {
    sw_source("t", &["counter"], "")
        + &sw_source("f", &["flaky"], "")
        + &sw_source("q", &[], "parser = \"absent\"")
        + "\n[retention]\ndone_after = \"1s\"\ninterval = \"100ms\"\n"
}

/// Waits until `source/event_id`'s detail says its payload was pruned; returns the detail.
async fn wait_pruned(host: &TestHost, source: &str, event_id: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let detail = host.event(source, event_id).await;
        if let Some(detail) = &detail
            && detail.get("pruned_at").is_some_and(Value::is_i64)
        {
            return detail.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{source}/{event_id} was not pruned in {WAIT:?}: {detail:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The dashboard's page at `path`, signed in with the admin token.
async fn dashboard_page(host: &TestHost, path: &str) -> String {
    let with_session = crate::support::dashboard_session(host.admin).await;
    let (status, _, body) = crate::support::send(
        http::Method::GET,
        &format!("http://{}{path}", host.admin),
        &with_session,
        bytes::Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{path}");
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pruned_event_is_still_a_duplicate_and_dead_work_waits_for_a_discard() {
    let host = TestHost::start(
        &config(),
        &[("counter", plugins::COUNTER), ("flaky", plugins::FLAKY)],
    )
    .await;

    // A finished event loses its payload and history, keeps its id and its delivery's state.
    host.accept_event("t", "e1", &json!({"n": 1})).await;
    host.wait_state("t", "e1", "counter", "done", WAIT).await;
    let pruned = wait_pruned(&host, "t", "e1").await;
    let delivery = &pruned["deliveries"][0];
    assert_eq!(
        (
            &delivery["state"],
            &delivery["output"],
            &delivery["history"]
        ),
        (&json!("done"), &Value::Null, &json!([])),
        "{pruned:#}"
    );
    let resend = host.accept_event("t", "e1", &json!({"n": 1})).await;
    assert_eq!(resend["duplicate"], json!(true), "{resend}");
    // The dashboard says what retention did, instead of showing an empty request with a
    // replay that would find nothing.
    let page = dashboard_page(&host, "/events/t/e1").await;
    assert!(page.contains("Retention removed"), "{page}");
    assert!(!page.contains("Replay"), "{page}");
    assert!(!page.contains("Request body"), "{page}");

    // A dead delivery is never pruned, however long it waits.
    host.accept_event("f", "d1", &json!({"permanent": true}))
        .await;
    host.wait_state("f", "d1", "flaky", "dead", WAIT).await;
    host.accept_event("t", "e2", &json!({"n": 2})).await;
    wait_pruned(&host, "t", "e2").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dead = host.event("f", "d1").await.unwrap();
    assert!(dead.get("pruned_at").is_none(), "{dead:#}");
    assert_eq!(
        dead["deliveries"][0]["history"].as_array().unwrap().len(),
        1
    );

    // Discard takes only dead deliveries, and says what it matched and closed.
    let (status, refused) = host
        .admin_post("/admin/discard", json!({"state": "done"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, dry) = host
        .admin_post("/admin/discard", json!({"source": "f", "dry_run": true}))
        .await;
    assert_eq!(
        (status, dry),
        (StatusCode::OK, json!({"matched": 1, "discarded": 0}))
    );
    let (status, closed) = host
        .admin_post("/admin/discard", json!({"source": "f"}))
        .await;
    assert_eq!(
        (status, closed),
        (StatusCode::OK, json!({"matched": 1, "discarded": 1}))
    );
    host.wait_state("f", "d1", "flaky", "discarded", WAIT).await;
    // Discarded work is finished work: pruned after done_after.
    wait_pruned(&host, "f", "d1").await;

    // A held quarantined request is discarded by source (it has no handler or event id yet).
    let (status, reply) = post_sw(host.ingest, "q", "x1", b"{}").await.unwrap();
    assert_eq!(
        (status, &reply["quarantined"]),
        (StatusCode::ACCEPTED, &json!(true))
    );
    let (status, closed) = host
        .admin_post("/admin/discard", json!({"source": "q"}))
        .await;
    assert_eq!(
        (status, closed),
        (StatusCode::OK, json!({"matched": 1, "discarded": 1}))
    );
    let (_, again) = host
        .admin_post("/admin/discard", json!({"source": "q", "dry_run": true}))
        .await;
    assert_eq!(again, json!({"matched": 0, "discarded": 0}));
}

/// A handler removed from the configuration leaves deliveries nothing will run: they still
/// count in the backlog, and a replay cannot take them (it says how to deal with them). A
/// discard naming that handler with state `pending` closes them and frees the backlog; a name
/// neither configured nor stored is still refused as a typo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_deliveries_of_a_removed_handler_can_be_discarded() {
    let dir = tempfile::tempdir().unwrap();
    // `flaky` is declared, but its file is absent: its deliveries wait as `pending`.
    let with = sw_source("s", &["flaky"], "");
    let host = ProcessHost::start(dir.path(), &with).await;
    for id in ["w-1", "w-2", "w-3"] {
        let (status, reply) = post_sw(host.ingest, "s", id, b"{}").await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    }
    host.kill();
    let without = sw_source("s", &[], "");
    let host = ProcessHost::start(dir.path(), &without).await;
    let health = |host: &ProcessHost| {
        let host = host.admin;
        async move {
            let (_, health) = admin_call(host, http::Method::GET, "/healthz", None, None)
                .await
                .unwrap();
            health["backlog"].as_i64()
        }
    };
    assert_eq!(health(&host).await, Some(3));
    let post = |path: &'static str, body: Value| {
        host.admin(http::Method::POST, path, Some(ADMIN_TOKEN), Some(body))
    };
    let (status, reply) = post("/admin/replay", json!({"handler": "flaky"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert!(
        reply["detail"]
            .as_str()
            .unwrap()
            .contains("declare it again"),
        "{reply}"
    );
    let (status, reply) = post(
        "/admin/discard",
        json!({"handler": "flaky", "state": "pending"}),
    )
    .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 3, "discarded": 3}))
    );
    assert_eq!(health(&host).await, Some(0));
    let (status, reply) = post(
        "/admin/discard",
        json!({"handler": "flakey", "state": "pending"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
}

/// A replay naming no handler takes the dead letters of the handlers the configuration
/// declares and passes over a removed one's: queued again, nothing would ever run them, and
/// they would leave the dead letters an operator watches for a `pending` nobody serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_every_handler_passes_over_a_removed_handlers_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::install_plugins(dir.path(), &[("flaky", plugins::FLAKY)]);
    let table = |name: &str| format!("\n[plugins.{name}]\nwasm = \"flaky\"\n");
    let with = sw_source("s", &["kept", "gone"], "") + &table("kept") + &table("gone");
    let host = ProcessHost::start(dir.path(), &with).await;
    let (status, reply) = post_sw(host.ingest, "s", "p-1", br#"{"permanent": true}"#)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    for handler in ["kept", "gone"] {
        host.wait_delivery("s", "p-1", handler, WAIT, |d| d["state"] == "dead")
            .await;
    }
    host.kill();

    let without = sw_source("s", &["kept"], "") + &table("kept");
    let host = ProcessHost::start(dir.path(), &without).await;
    let (status, reply) = host
        .admin(
            http::Method::POST,
            "/admin/replay",
            Some(ADMIN_TOKEN),
            Some(json!({})),
        )
        .await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"matched": 1, "replayed": 1}))
    );
    host.wait_delivery("s", "p-1", "kept", WAIT, |d| {
        d["state"] == "dead" && d["attempts"] == 2
    })
    .await;
    let gone = host.delivery("s", "p-1", "gone").await.unwrap();
    assert_eq!(
        (&gone["state"], &gone["attempts"]),
        (&json!("dead"), &json!(1)),
        "{gone:#}"
    );
}

/// A source removed from the configuration leaves its dead letters and held quarantined
/// requests behind; a discard naming it still closes them (its name is known: things are
/// stored under it), a replay naming it is refused, and a name never stored is still a typo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_sources_dead_letters_and_held_requests_can_be_discarded_by_its_name() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::install_plugins(dir.path(), &[("flaky", plugins::FLAKY)]);
    let kept = sw_source("kept", &[], "");
    let with = kept.clone()
        + &sw_source("gone", &["flaky"], "")
        + &sw_source("held", &[], "parser = \"absent\"");
    let host = ProcessHost::start(dir.path(), &with).await;
    let (status, reply) = post_sw(host.ingest, "gone", "g-1", br#"{"permanent": true}"#)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let (status, reply) = post_sw(host.ingest, "held", "h-1", b"{}").await.unwrap();
    assert_eq!(reply["quarantined"], true, "{status} {reply}");
    host.wait_delivery("gone", "g-1", "flaky", WAIT, |d| d["state"] == "dead")
        .await;
    host.kill();

    let host = ProcessHost::start(dir.path(), &kept).await;
    let post = |path: &'static str, body: Value| {
        host.admin(http::Method::POST, path, Some(ADMIN_TOKEN), Some(body))
    };
    let (status, reply) = post("/admin/replay", json!({"source": "gone"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    for source in ["gone", "held"] {
        let (status, reply) = post("/admin/discard", json!({"source": source})).await;
        assert_eq!(
            (status, reply),
            (StatusCode::OK, json!({"matched": 1, "discarded": 1})),
            "{source}"
        );
    }
    let gone = host.delivery("gone", "g-1", "flaky").await.unwrap();
    assert_eq!(gone["state"], "discarded", "{gone:#}");
    let (status, reply) = post("/admin/discard", json!({"source": "never"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
}
