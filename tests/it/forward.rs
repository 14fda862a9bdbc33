//! The example `forward` handler, black-box: a verified event reaches a local service byte for
//! byte with the configured and passed-on headers and hookd's `Idempotency-Key`; a service
//! that answers 503 with `Retry-After` gets the event again when it asked, not on the backoff
//! schedule; an answer's status decides however large its body; a duplicate webhook is forwarded once; over `https` with a private CA, the
//! service's token is added by the host.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http::{HeaderValue, StatusCode};
use serde_json::{Value, json};

use crate::outbound::{Mock, Reply, header, output};
use crate::support::{self, AdminApi, SW_SECRET, Scheme, TestHost, plugins, sw_source};
use crate::tls::{Pki, TlsServer, allow_localhost, hello};

const WAIT: Duration = Duration::from_secs(60);

/// A `standard-webhooks` source `p` whose events `forward` relays to `mock`, with `config`
/// (inline-table keys after `url`) and `extra` keys of the plugin's table.
async fn forwarding_host(mock: &Mock, config: &str, extra: &str) -> TestHost {
    let port = mock.port();
    let plugin = format!(
        r#"
        [plugins.forward]
        allow_hosts = ["127.0.0.1:{port}"]
        {extra}
        config = {{ url = "http://127.0.0.1:{port}/inbox"{config} }}
        "#
    );
    TestHost::start(
        &sw_source("p", &["forward"], &plugin),
        &[("forward", plugins::FORWARD)],
    )
    .await
}

async fn post(host: &TestHost, id: &str, body: &[u8]) -> Value {
    let (status, reply) = host
        .post_signed("p", &Scheme::StandardWebhooks, SW_SECRET, id, body)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    reply
}

/// The service sees the provider's exact bytes (odd spacing and non-ASCII included), the
/// configured method and extra header, the one provider header listed in `pass_headers` (and
/// not the signature, which is not listed), and the key that makes retries idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_forwarded_byte_for_byte_with_the_configured_headers() {
    let mock = Mock::start(|_, _| Reply::new(StatusCode::OK, "thanks")).await;
    let host = forwarding_host(
        &mock,
        r#", method = "PUT", pass_headers = "webhook-id", headers = '{"x-team": "payments"}'"#,
        "",
    )
    .await;
    let body = "{ \"type\":\"order.paid\",  \"note\": \"café ☕\"\n}".as_bytes();
    post(&host, "evt-1", body).await;

    let delivery = host.wait_state("p", "evt-1", "forward", "done", WAIT).await;
    assert_eq!(output(&delivery), json!({"status": 200}));
    let seen = mock.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let call = &seen[0];
    assert_eq!(call.path, "/inbox");
    assert_eq!(&call.body[..], body);
    assert_eq!(header(call, "x-team"), ["payments"]);
    assert_eq!(header(call, "webhook-id"), ["evt-1"]);
    assert_eq!(header(call, "content-type"), ["application/json"]);
    assert_eq!(header(call, "x-hookd-event-id"), ["evt-1"]);
    assert_eq!(header(call, "idempotency-key"), ["p:evt-1:forward"]);
    assert!(header(call, "webhook-signature").is_empty(), "{call:?}");
}

/// With a ten-minute backoff, only the service's `Retry-After` can bring the second attempt
/// within the test's wait; its `0` is taken as the soonest a wish may ask, a second, so the
/// retry budget is not spent at once: the delivery is `retry` then `ok`, the calls at least a
/// second apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_with_retry_after_is_retried_when_the_service_asked() {
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let mock = Mock::start({
        let calls = calls.clone();
        move |index, _| {
            calls.lock().unwrap().push(Instant::now());
            if index == 0 {
                let mut reply = Reply::new(StatusCode::SERVICE_UNAVAILABLE, "busy");
                reply
                    .headers
                    .push((http::header::RETRY_AFTER, HeaderValue::from_static("0")));
                reply
            } else {
                Reply::new(StatusCode::OK, "")
            }
        }
    })
    .await;
    let host = forwarding_host(
        &mock,
        "",
        "backoff_base_ms = 600000\nbackoff_max_ms = 600000",
    )
    .await;
    post(&host, "evt-2", br#"{"n":2}"#).await;

    let delivery = host.wait_state("p", "evt-2", "forward", "done", WAIT).await;
    assert_eq!(
        crate::support::outcomes(&delivery),
        ["retry", "ok"],
        "{delivery:#}"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    let gap = calls[1] - calls[0];
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
}

/// A service that answers with a body over the SDK's 8 MiB response cap has still answered:
/// its status decides, a 500 a retry and a 200 `done`. Before, `forward` read the whole body
/// before its status, and a 200 with a large body was dead-lettered after the service had
/// applied the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_is_judged_by_its_status() {
    let large = vec![b'x'; 9 << 20];
    let mock = Mock::start(move |index, _| {
        let status = if index == 0 {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        Reply::new(status, large.clone())
    })
    .await;
    let host = forwarding_host(&mock, "", "backoff_base_ms = 100\nbackoff_max_ms = 100").await;
    post(&host, "evt-big", br#"{"n":9}"#).await;

    let delivery = host
        .wait_state("p", "evt-big", "forward", "done", WAIT)
        .await;
    assert_eq!(
        crate::support::outcomes(&delivery),
        ["retry", "ok"],
        "{delivery:#}"
    );
    assert_eq!(output(&delivery), json!({"status": 200}));
    assert_eq!(mock.seen().len(), 2);
}

/// The provider delivers the same event twice: hookd answers the second as a duplicate and
/// the service is called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_webhook_is_forwarded_once() {
    let mock = Mock::start(|_, _| Reply::new(StatusCode::NO_CONTENT, "")).await;
    let host = forwarding_host(&mock, "", "").await;
    let body = br#"{"n":3}"#;
    assert_eq!(post(&host, "evt-3", body).await["duplicate"], false);
    host.wait_state("p", "evt-3", "forward", "done", WAIT).await;
    assert_eq!(post(&host, "evt-3", body).await["duplicate"], true);
    // Give a wrongly scheduled second delivery time to reach the service.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(mock.seen().len(), 1);
}

/// The README's set-up: an internal service by name over `https`, trusted through `ca_file`,
/// its token in `[plugins.forward.credentials]` from the host's environment; the service sees
/// the token although no config value or plugin holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_the_service_gets_the_host_injected_token() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let dir = tempfile::tempdir().unwrap();
    support::install_plugins(dir.path(), &[("forward", plugins::FORWARD)]);
    std::fs::write(dir.path().join("ca.pem"), pki.ca_pem()).unwrap();
    let plugin = format!(
        r#"
        [plugins.forward]
        ca_file = "ca.pem"
        {allow}
        config = {{ url = "https://localhost:{port}/webhooks" }}
        [plugins.forward.credentials]
        "localhost:{port}" = {{ header = "Authorization", env = "SERVICE_TOKEN", prefix = "Bearer " }}
        "#,
        allow = allow_localhost(port),
    );
    let env = |name: &str| (name == "SERVICE_TOKEN").then(|| "tok-123".to_owned());
    let host = TestHost::start_in_env(dir, &sw_source("p", &["forward"], &plugin), &env).await;
    post(&host, "evt-4", br#"{"n":4}"#).await;

    host.wait_state("p", "evt-4", "forward", "done", WAIT).await;
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].headers["authorization"], "Bearer tok-123");
}
