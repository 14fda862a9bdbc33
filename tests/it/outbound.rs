//! Outbound HTTP from handlers, black-box: the classifier asks a slow local model exactly once
//! behind a retry-happy provider, a hung model is a `timeout` then an `ok`, and `netprobe` finds
//! every forbidden destination (and the file system and environment) closed while its listed
//! host answers.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::support::{self, AdminApi, SW_SECRET, Scheme, TestHost, plugins, sw_source};

/// One request the mock received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// What the mock answers, after `delay`.
pub(crate) struct Reply {
    delay: Duration,
    status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    body: BoxBody<Bytes, Infallible>,
}

impl Reply {
    pub(crate) fn new(status: StatusCode, body: impl Into<Bytes>) -> Self {
        Self {
            delay: Duration::ZERO,
            status,
            headers: Vec::new(),
            body: Full::new(body.into()).boxed(),
        }
    }

    /// An OpenAI-style chat-completions reply whose assistant message is `content`.
    fn chat(content: &str) -> Self {
        let body = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
        });
        let mut reply = Self::new(StatusCode::OK, body.to_string());
        reply.headers.push((
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ));
        reply
    }

    pub(crate) fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Answer = dyn Fn(usize, &Seen) -> Reply + Send + Sync;

/// A tiny HTTP/1 server on 127.0.0.1:0 that records every request (counted when its head and
/// body arrive, before any delay) and answers as `answer(index, request)` says.
pub(crate) struct Mock {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Mock {
    pub(crate) async fn start(
        answer: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let answer: Arc<Answer> = Arc::new(answer);
        let accept = tokio::spawn({
            let seen = seen.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (seen, answer) = (seen.clone(), answer.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let (seen, answer) = (seen.clone(), answer.clone());
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await.map(|b| b.to_bytes());
                                let request = Seen {
                                    path: parts.uri.path().to_owned(),
                                    headers: parts.headers,
                                    body: body.unwrap_or_default(),
                                };
                                let index = {
                                    let mut seen = seen.lock().unwrap();
                                    seen.push(request.clone());
                                    seen.len() - 1
                                };
                                let reply = answer(index, &request);
                                tokio::time::sleep(reply.delay).await;
                                let mut response = Response::new(reply.body);
                                *response.status_mut() = reply.status;
                                response.headers_mut().extend(reply.headers);
                                Ok::<_, Infallible>(response)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Self { addr, seen, accept }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A body of `left` 1 MiB chunks with no length announced (sent chunked).
struct Chunks {
    left: usize,
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 1 << 20])))))
    }
}

pub(crate) fn header<'a>(seen: &'a Seen, name: &str) -> Vec<&'a str> {
    seen.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

pub(crate) fn output(delivery: &Value) -> Value {
    serde_json::from_str(delivery["output"].as_str().expect("an output")).unwrap()
}

const GITHUB_SECRET: &str = "gh-secret";

/// A GitHub source whose issues the classifier labels with the model at `mock`.
fn classifier_config(mock: &Mock, extra: &str) -> String {
    let port = mock.port();
    format!(
        r#"
        [sources.github]
        scheme = "github"
        secrets = ["{GITHUB_SECRET}"]
        parser = "github"
        handlers = ["classifier"]

        [plugins.classifier]
        allow_hosts = ["127.0.0.1:{port}"]
        {extra}
        config = {{ labels = "bug,feature,question,other", model = "test-model", model_url = "http://127.0.0.1:{port}/v1/chat/completions" }}
        "#
    )
}

async fn post_issue(host: &TestHost, delivery: &str, body: &[u8]) -> (StatusCode, Value) {
    let headers = support::github_headers(GITHUB_SECRET, delivery, "issues", body);
    host.post("github", &headers, body).await
}

const WAIT: Duration = Duration::from_secs(60);

/// The slow-model story: a model that takes seconds, a provider that delivers the same event
/// three times a second apart. Every delivery is acknowledged at once (the model is not on the
/// ingest path), the model is asked exactly once, with the idempotency key, and its label is
/// what is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_model_behind_a_retry_happy_provider_is_called_once() {
    let mock = Mock::start(|_, _| {
        Reply::chat("bug\nThe reporter describes a crash.").after(Duration::from_secs(5))
    })
    .await;
    let host = TestHost::start(
        &classifier_config(&mock, ""),
        &[
            ("github", plugins::GITHUB),
            ("classifier", plugins::CLASSIFIER),
        ],
    )
    .await;
    // Keywords alone would call this a feature request: only the model says "bug".
    let body = support::github_issue(
        41,
        "Please add a dark mode",
        "It would be nice to have the option",
    );

    let mut replies = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let sent = Instant::now();
        let (status, reply) = post_issue(&host, "delivery-41", &body).await;
        let took = sent.elapsed();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        // A correctness bound, not a speed claim: the 5 s model must not be on this path (a
        // loaded machine's fsync stalls have taken an acknowledgement past 1 s).
        assert!(took < Duration::from_secs(4), "delivery {i} took {took:?}");
        replies.push(reply["duplicate"].clone());
    }
    assert_eq!(replies, [json!(false), json!(true), json!(true)]);

    let delivery = host
        .wait_state("github", "delivery-41", "classifier", "done", WAIT)
        .await;
    assert_eq!(output(&delivery), json!({"label": "bug", "via": "model"}));
    assert_eq!(delivery["attempts"], 1, "{delivery:#}");
    assert_eq!(support::outcomes(&delivery), ["ok"]);

    let seen = mock.seen();
    assert_eq!(seen.len(), 1, "the model was called {} times", seen.len());
    let call = &seen[0];
    assert_eq!(call.path, "/v1/chat/completions");
    assert_eq!(
        header(call, "idempotency-key"),
        ["github:delivery-41:classifier"]
    );
    let request: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(request["model"], "test-model");
    let system = request["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("bug, feature, question, other"), "{system}");
    let user = request["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("Please add a dark mode"), "{user}");
}

/// A model that hangs past the plugin's `timeout_ms` once: that attempt is a `timeout` (the
/// host cut it off), the retry is an `ok`, and both calls carried the same idempotency key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_hangs_once_is_a_timeout_then_ok() {
    let mock = Mock::start(|index, _| {
        let reply = Reply::chat("Feature");
        if index == 0 {
            reply.after(Duration::from_secs(3600))
        } else {
            reply
        }
    })
    .await;
    let host = TestHost::start(
        &classifier_config(
            &mock,
            "timeout_ms = 2000\nbackoff_base_ms = 50\nbackoff_max_ms = 200",
        ),
        &[
            ("github", plugins::GITHUB),
            ("classifier", plugins::CLASSIFIER),
        ],
    )
    .await;
    let body = support::github_issue(42, "Crash on start", "segfault");
    let (status, reply) = post_issue(&host, "delivery-42", &body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");

    let delivery = host
        .wait_state("github", "delivery-42", "classifier", "done", WAIT)
        .await;
    assert_eq!(
        support::outcomes(&delivery),
        ["timeout", "ok"],
        "{delivery:#}"
    );
    assert_eq!(delivery["history"][0]["error_kind"], "timeout");
    assert_eq!(
        output(&delivery),
        json!({"label": "feature", "via": "model"})
    );
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    for call in &seen {
        assert_eq!(
            header(call, "idempotency-key"),
            ["github:delivery-42:classifier"]
        );
    }
}

/// `netprobe` with one listed mock host (and a second one listed only as `localhost:port`, to
/// show a listed name cannot reach loopback): everything but the listed host is refused, the
/// host's headers win, redirects are not followed, big bodies are cut off, and the plugin sees
/// no files and no environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netprobe_reaches_only_its_listed_host() {
    let mock = Mock::start(|_, seen| match seen.path.as_str() {
        "/redirect" => {
            let mut reply = Reply::new(StatusCode::FOUND, "");
            reply
                .headers
                .push((http::header::LOCATION, HeaderValue::from_static("/target")));
            reply
        }
        "/big" => Reply::new(StatusCode::OK, vec![b'x'; 9 << 20]),
        "/stream" => {
            let mut reply = Reply::new(StatusCode::OK, "");
            reply.body = Chunks { left: 9 }.boxed();
            reply
        }
        _ => Reply::new(StatusCode::OK, "hello"),
    })
    .await;
    // Listed only by name: `localhost` resolves to loopback, which needs its own entry.
    let by_name = Mock::start(|_, _| Reply::new(StatusCode::OK, "reached")).await;
    let host = TestHost::start(
        &sw_source(
            "p",
            &["netprobe"],
            &format!(
                r#"
            [plugins.netprobe]
            max_attempts = 1
            allow_hosts = ["127.0.0.1:{mock}", "localhost:{by_name}"]
            "#,
                mock = mock.port(),
                by_name = by_name.port(),
            ),
        ),
        &[("netprobe", plugins::NETPROBE)],
    )
    .await;
    let (admin, ingest, m, n) = (
        host.admin.port(),
        host.ingest.port(),
        mock.port(),
        by_name.port(),
    );

    let expected: BTreeMap<String, &str> = [
        (format!("http://127.0.0.1:{m}/ok"), "ok"),
        // The listed port, spelled otherwise: reached, and named as listed (below).
        (format!("http://127.0.0.1:0{m}/spelled"), "ok"),
        (format!("http://127.0.0.1:{m}/redirect"), "ok"),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "denied",
        ),
        (format!("http://127.0.0.1:{admin}/healthz"), "denied"),
        (format!("http://localhost:{n}/"), "denied"),
        (format!("http://localhost:{m}/ok"), "denied"),
        (format!("http://[::1]:{m}/ok"), "denied"),
        (format!("http://2130706433:{m}/ok"), "denied"),
        (format!("http://127.0.0.1:{ingest}/hooks/p"), "denied"),
        // A plain-http server behind an https URL: the handshake fails, nothing is sent.
        (format!("https://127.0.0.1:{m}/ok"), "tls"),
        (
            format!("http://127.0.0.1:{m}/big"),
            "error: response too large",
        ),
        (
            format!("http://127.0.0.1:{m}/stream"),
            "error: response too large",
        ),
    ]
    .into_iter()
    .collect();
    let urls: Vec<&String> = expected.keys().collect();
    let (status, reply) = host
        .post_signed(
            "p",
            &Scheme::StandardWebhooks,
            SW_SECRET,
            "probe-1",
            json!({ "urls": urls }).to_string().as_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let delivery = host
        .wait_state("p", "probe-1", "netprobe", "done", WAIT)
        .await;
    let report = output(&delivery);

    for (url, want) in &expected {
        let got = report["urls"][url].as_str().unwrap_or("(missing)");
        assert!(got.starts_with(want), "{url}: got {got:?}, want {want:?}");
    }
    // The plugin is told why, not just that, a request was refused.
    let why = |url: String| report["urls"][&url].as_str().unwrap_or("").to_owned();
    assert_eq!(
        why(format!("http://localhost:{m}/ok")),
        format!(
            "denied: hookd refused the request to localhost:{m}: localhost:{m} is not in \
             allow_hosts"
        )
    );
    assert_eq!(
        why(format!("http://localhost:{n}/")),
        format!(
            "denied: hookd refused the request to localhost:{n}: localhost:{n} resolves to \
             127.0.0.1:{n}, which is loopback (127.0.0.0/8); list 127.0.0.1:{n} itself in \
             allow_hosts to reach it"
        )
    );
    let files = &report["files"];
    for path in ["/etc/passwd", "."] {
        let got = files[path].as_str().unwrap();
        assert!(got.starts_with("error: "), "{path}: {got}");
    }
    assert_eq!(
        report["env"],
        json!({"vars": 0, "HOME": null, "PATH": null})
    );

    // Only the listed host was reached, each path once (the redirect was not followed), and
    // the host's idempotency key replaced the plugin's own.
    let seen = mock.seen();
    let mut paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["/big", "/ok", "/redirect", "/spelled", "/stream"]);
    assert!(by_name.seen().is_empty(), "{:?}", by_name.seen());
    for call in &seen {
        assert_eq!(
            header(call, "idempotency-key"),
            ["p:probe-1:netprobe"],
            "{}",
            call.path
        );
        assert_eq!(
            header(call, "host"),
            [format!("127.0.0.1:{m}")],
            "{}",
            call.path
        );
    }

    // A refusal the plugin fails on is explained in the attempt's stored error too.
    let body = json!({ "urls": [format!("http://localhost:{m}/ok")], "fail": true });
    let (status, reply) = host
        .post_signed(
            "p",
            &Scheme::StandardWebhooks,
            SW_SECRET,
            "probe-2",
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let dead = host
        .wait_state("p", "probe-2", "netprobe", "dead", WAIT)
        .await;
    let error = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("localhost:{m} is not in allow_hosts")),
        "{dead:#}"
    );
}

/// A plugin that opens as many connections as it can (60 at once per attempt, 10 attempts)
/// to a server that never answers does not use up hookd's file descriptors: with the
/// open-files limit at 512, outbound sockets stop at their host-wide cap (a quarter of the
/// limit here, since two listeners at `max_connections` would not fit beside more, which the
/// log says), the requests beyond it are refused as `connection-limit-reached`, and another
/// source's webhooks are still accepted meanwhile. Without the cap the 600 sockets ran hookd
/// out of descriptors, and its listeners could accept nothing until the attempts timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_holding_connections_cannot_use_up_the_hosts_descriptors() {
    const OPEN_FILES: u64 = 512;
    const CAP: usize = 128; // OPEN_FILES / 4
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held: Arc<Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
    let accept = tokio::spawn({
        let held = held.clone();
        async move {
            while let Ok((stream, _)) = silent.accept().await {
                held.lock().unwrap().push(stream);
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    support::install_plugins(dir.path(), &[("netprobe", plugins::NETPROBE)]);
    let config = format!(
        "[server]\nmax_connections = 16\nworkers = 16\n{}{}",
        sw_source(
            "p",
            &["netprobe"],
            &format!(
                "[plugins.netprobe]\nmax_attempts = 1\ntimeout_ms = 20000\n\
                 allow_hosts = [\"127.0.0.1:{port}\"]"
            ),
        ),
        sw_source("q", &[], ""),
    );
    let host = support::ProcessHost::start_with_open_files(dir.path(), &config, OPEN_FILES).await;
    let hold = json!({"hold": {"authority": format!("127.0.0.1:{port}"), "count": 60}});
    for i in 0..10 {
        let body = hold.to_string();
        let (status, reply) =
            support::post_sw(host.ingest, "p", &format!("hold-{i}"), body.as_bytes())
                .await
                .unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "hold-{i}: {reply}");
    }
    // The handlers hold what they can; wait until the cap is reached.
    let deadline = Instant::now() + WAIT;
    while held.lock().unwrap().len() < CAP {
        assert!(
            Instant::now() < deadline,
            "only {} connections held; log:\n{}",
            held.lock().unwrap().len(),
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another source is still served, each request on a connection of its own.
    for i in 0..40 {
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            support::post_sw(host.ingest, "q", &format!("q-{i}"), b"{}"),
        )
        .await;
        let (status, reply) = sent
            .unwrap_or_else(|_| panic!("q-{i} got no answer in 5 s; log:\n{}", host.log()))
            .unwrap_or_else(|e| panic!("q-{i}: {e}; log:\n{}", host.log()));
        assert_eq!(status, StatusCode::ACCEPTED, "q-{i}: {reply}");
    }
    let open = held.lock().unwrap().len();
    assert!(open <= CAP, "{open} sockets held, over the cap of {CAP}");
    let log = host.log();
    assert!(
        log.contains("lower server.max_connections") && log.contains("capped at 128"),
        "no warning about the open-files limit:\n{log}"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    // The requests beyond the cap were refused, with the reason (one log line per call).
    host.wait_log("at their cap (128", WAIT).await;
    accept.abort();
}

/// A request still waiting when its attempt's deadline ends the call is counted in
/// `hookd_outbound_requests_total` as a `timeout`: before, its future was dropped with the call
/// and counted nowhere, so the requests behind stalled attempts were invisible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_by_the_attempts_deadline_is_counted_as_a_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let config = sw_source(
        "p",
        &["netprobe"],
        &format!(
            "[plugins.netprobe]\nmax_attempts = 1\ntimeout_ms = 500\n\
             allow_hosts = [\"127.0.0.1:{port}\"]"
        ),
    );
    let host = TestHost::start(&config, &[("netprobe", plugins::NETPROBE)]).await;
    let url = format!("http://127.0.0.1:{port}/never");
    host.accept_event("p", "stalled", &json!({ "urls": [url] }))
        .await;
    host.wait_state("p", "stalled", "netprobe", "dead", WAIT)
        .await;
    support::metrics_with(
        async |path: &str| host.admin_get(path).await,
        &[r#"hookd_outbound_requests_total{plugin="netprobe",result="timeout"} 1"#],
    )
    .await;
    accept.abort();
}
