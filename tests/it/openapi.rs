//! The admin API's OpenAPI document against the running host: it is served behind the token,
//! and real answers of every documented operation validate against the schema the document
//! gives for their status and content type.
//!
//! Invariant checked: an answer whose status, content type or body the document does not
//! describe fails the test, so the document cannot drift from what the host sends.

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{
    admin_api::{start_with_a_previous_version, start_with_an_event},
    support::{ADMIN_TOKEN, TestHost, admin_call, admin_call_with},
};

/// The document, fetched with the token.
async fn document(host: &TestHost) -> Value {
    let (status, doc) = admin_call(
        host.admin,
        Method::GET,
        "/admin/openapi.json",
        Some(ADMIN_TOKEN),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{doc}");
    doc
}

/// Checks that `body`, answered with `status` to `method path` (documented as `template`), is
/// described by `doc`: the status is listed and the body validates against its JSON schema.
fn check(doc: &Value, method: &str, template: &str, status: StatusCode, body: &Value) {
    let response = &doc["paths"][template][method]["responses"][status.as_str()];
    assert!(
        response.is_object(),
        "{method} {template} answered {status}, which the document does not list: {body}"
    );
    let Some(schema) = response["content"]["application/json"]["schema"].as_object() else {
        panic!("{method} {template} {status} has no JSON schema: {response}");
    };
    // The schema, evaluated inside the document so its `$ref`s to components resolve.
    let mut root = doc.as_object().unwrap().clone();
    root.extend(schema.clone());
    let validator = jsonschema::draft202012::new(&Value::Object(root)).unwrap();
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{method} {template} {status}: {errors:?}\n{body:#}"
    );
}

/// Calls `method path` with the token (and `body`), then [`check`]s the answer; returns it.
async fn call(
    host: &TestHost,
    doc: &Value,
    method: Method,
    (path, template): (&str, &str),
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (status, answer) = admin_call(host.admin, method.clone(), path, Some(ADMIN_TOKEN), body)
        .await
        .unwrap();
    check(
        doc,
        &method.as_str().to_lowercase(),
        template,
        status,
        &answer,
    );
    (status, answer)
}

#[tokio::test]
async fn the_document_is_behind_the_token() {
    let host = start_with_an_event().await;
    let (status, body) = admin_call(host.admin, Method::GET, "/admin/openapi.json", None, None)
        .await
        .unwrap();
    assert_eq!(
        (status, body),
        (StatusCode::UNAUTHORIZED, json!({"error": "unauthorized"}))
    );
}

#[tokio::test]
async fn every_documented_answer_validates_against_the_document() {
    let host = start_with_an_event().await;
    let doc = document(&host).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let get = |path, template| call(&host, &doc, Method::GET, (path, template), None);
    let events = "/admin/events";
    let detail = "/admin/events/{source}/{event_id}";
    let answers = [
        get("/healthz", "/healthz").await,
        get("/readyz", "/readyz").await,
        get(events, events).await,
        get(
            "/admin/events?state=dead&source=t&handler=flaky&limit=5",
            events,
        )
        .await,
        get("/admin/events?state=nope", events).await,
        get("/admin/events/t/e1", detail).await,
        get("/admin/events/t/missing", detail).await,
        get("/admin/plugins", "/admin/plugins").await,
        get("/admin/nodes", "/admin/nodes").await,
        get("/admin/openapi.json", "/admin/openapi.json").await,
    ];
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 400, 200, 404, 200, 200, 200]);

    let replay = ("/admin/replay", "/admin/replay");
    let post = |route, body| call(&host, &doc, Method::POST, route, body);
    let answers = [
        post(replay, Some(json!({"dry_run": true}))).await,
        // An optional body may be JSON `null`: no filter, as without a body.
        post(replay, Some(Value::Null)).await,
        post(replay, Some(json!({"source": "t", "state": "dead"}))).await,
        post(replay, Some(json!({"source": "nope"}))).await,
        post(replay, Some(json!({"state": "nope"}))).await,
        post(
            (
                "/admin/plugins/nope/rollback",
                "/admin/plugins/{name}/rollback",
            ),
            None,
        )
        .await,
        post(
            (
                "/admin/plugins/counter/rollback",
                "/admin/plugins/{name}/rollback",
            ),
            None,
        )
        .await,
    ];
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 400, 400, 404, 409]);
}

#[tokio::test]
async fn a_rollback_answer_validates_against_the_document() {
    let host = start_with_a_previous_version().await;
    let doc = document(&host).await;
    let rollback = (
        "/admin/plugins/flaky/rollback",
        "/admin/plugins/{name}/rollback",
    );
    let (status, _) = call(&host, &doc, Method::POST, rollback, None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_routes_answers_validate_against_the_document() {
    // `counter` has counted `e1`: its state holds `count`.
    let host = start_with_an_event().await;
    let doc = document(&host).await;
    let keys = "/admin/plugins/{name}/state";
    let key = "/admin/plugins/{name}/state/{key}";
    let count = "/admin/plugins/counter/state/count";
    let state_call = async |method: Method,
                            path: &str,
                            template: &str,
                            headers: &[(http::HeaderName, &str)],
                            body| {
        let (status, answer_headers, answer) = admin_call_with(
            host.admin,
            method.clone(),
            path,
            Some(ADMIN_TOKEN),
            headers,
            body,
        )
        .await
        .unwrap();
        check(
            &doc,
            &method.as_str().to_lowercase(),
            template,
            status,
            &answer,
        );
        (status.as_u16(), answer_headers, answer)
    };
    let get = |path, template| state_call(Method::GET, path, template, &[], None);
    let (status, _, list) = get("/admin/plugins/counter/state?prefix=c&limit=5", keys).await;
    assert_eq!(status, 200, "{list}");
    let (status, etag, value) = get(count, key).await;
    assert_eq!((status, &value["value"]), (200, &json!(1)), "{value}");
    let etag = etag[http::header::ETAG].to_str().unwrap().to_owned();
    let statuses = [
        get("/admin/plugins/nope/state", keys).await.0,
        get("/admin/plugins/counter/state/missing", key).await.0,
    ];
    assert_eq!(statuses, [404, 404]);

    let put = Method::PUT;
    let seven = || Some(json!({"encoding": "json", "value": 7}));
    let if_match = [(http::header::IF_MATCH, etag.as_str())];
    let version = value["version"].as_i64().unwrap();
    let stale_tag = format!("\"{}\"", version + 1000);
    let stale = [(http::header::IF_MATCH, stale_tag.as_str())];
    let statuses = [
        state_call(put.clone(), count, key, &[], seven()).await.0,
        state_call(put.clone(), count, key, &stale, seven()).await.0,
        state_call(
            put.clone(),
            count,
            key,
            &if_match,
            Some(json!({"encoding": "base64", "value": 7})),
        )
        .await
        .0,
        state_call(put.clone(), count, key, &if_match, seven())
            .await
            .0,
        state_call(Method::DELETE, count, key, &[], None).await.0,
        state_call(Method::DELETE, count, key, &stale, None).await.0,
    ];
    assert_eq!(statuses, [428, 409, 400, 200, 428, 409]);
    let (_, etag, _) = get(count, key).await;
    let etag = etag[http::header::ETAG].to_str().unwrap().to_owned();
    let (status, _, deleted) = state_call(
        Method::DELETE,
        count,
        key,
        &[(http::header::IF_MATCH, &etag)],
        None,
    )
    .await;
    assert_eq!((status, &deleted["version"]), (200, &json!(0)));
}
