//! Outbound HTTPS from handlers, black-box: a local rustls server with certificates made here
//! (a private CA, a certificate for another name, an expired one), reached by `netprobe` and
//! the classifier through a real host; and credentials the host injects, which the server sees
//! and the plugin never does.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};

use crate::support::{self, AdminApi, Scheme, TestHost, plugins};

const WAIT: Duration = Duration::from_secs(60);
/// The API key the host injects; it must reach the TLS server and nothing else.
const API_KEY: &str = "sk-live-7f3a9c1e";

/// A private CA and the certificates it (or nobody) signs.
pub(crate) struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate and its key.
pub(crate) struct Leaf {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "hookd test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { ca }
    }

    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses), valid now unless `expired`.
    pub(crate) fn leaf(&self, names: &[&str], expired: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Leaf {
            cert: cert.der().clone(),
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}

/// One request the TLS server received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    path: String,
    pub(crate) headers: HeaderMap,
}

/// An HTTPS/1.1 server on 127.0.0.1:0 presenting `leaf`; counts TCP connections (so a test
/// can tell that nothing reached it) and records every request; answers `answer(path)`.
pub(crate) struct TlsServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    pub(crate) async fn start(leaf: Leaf, answer: fn(&str) -> String) -> Self {
        Self::start_with(leaf, answer, None).await
    }

    /// [`TlsServer::start`], demanding a client certificate `clients` issued: over TLS 1.3 a
    /// client without one learns it only after its side of the handshake, from the server's
    /// `certificate_required` alert.
    async fn start_with(leaf: Leaf, answer: fn(&str) -> String, clients: Option<&Pki>) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            None => builder.with_no_client_auth(),
            Some(pki) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(pki.ca.der().clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(vec![leaf.cert], leaf.key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let accept = tokio::spawn({
            let (connections, seen) = (connections.clone(), seen.clone());
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (acceptor, seen) = (acceptor.clone(), seen.clone());
                    tokio::spawn(async move {
                        // A client that refuses the certificate ends the handshake here.
                        let Ok(stream) = acceptor.accept(stream).await else {
                            return;
                        };
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let seen = seen.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let _ = body.collect().await;
                                seen.lock().unwrap().push(Seen {
                                    path: parts.uri.path().to_owned(),
                                    headers: parts.headers,
                                });
                                let mut response =
                                    Response::new(Full::new(Bytes::from(answer(parts.uri.path()))));
                                response.headers_mut().insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/json"),
                                );
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
        Self {
            addr,
            connections,
            seen,
            accept,
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

pub(crate) fn hello(_: &str) -> String {
    "\"hello\"".to_owned()
}

/// A host running `netprobe` with `plugin` settings (allow_hosts, ca_file, ...), `ca` written
/// to `ca.pem` beside its config, and `env` as its environment.
async fn probe_host(plugin: &str, ca: Option<&Pki>, env: &[(&str, &str)]) -> TestHost {
    let dir = tempfile::tempdir().unwrap();
    support::install_plugins(dir.path(), &[("netprobe", plugins::NETPROBE)]);
    if let Some(pki) = ca {
        std::fs::write(dir.path().join("ca.pem"), pki.ca_pem()).unwrap();
    }
    let config = support::sw_source(
        "p",
        &["netprobe"],
        &format!("[plugins.netprobe]\n{plugin}\n"),
    );
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    TestHost::start_in_env(dir, &config, &lookup).await
}

/// Sends `probe` to netprobe and returns the finished delivery.
async fn run_probe(host: &TestHost, id: &str, probe: Value, state: &str) -> Value {
    let (status, reply) = host
        .post_signed(
            "p",
            &Scheme::StandardWebhooks,
            support::SW_SECRET,
            id,
            probe.to_string().as_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    host.wait_state("p", id, "netprobe", state, WAIT).await
}

fn output(delivery: &Value) -> Value {
    serde_json::from_str(delivery["output"].as_str().expect("an output")).unwrap()
}

/// What netprobe got for `url`.
async fn probe_one(host: &TestHost, url: &str) -> String {
    let delivery = run_probe(host, "probe-1", json!({ "urls": [url] }), "done").await;
    output(&delivery)["urls"][url]
        .as_str()
        .unwrap_or("(missing)")
        .to_owned()
}

/// The SDK's `HttpError::Tls` for `TLS-certificate-error`, as netprobe
/// reports it.
fn assert_certificate_error(verdict: &str) {
    assert!(
        verdict.starts_with("tls: ") && verdict.contains("TLS-certificate-error"),
        "{verdict}"
    );
}

/// `localhost:{port}` for the request's name, and `127.0.0.1:{port}`, the loopback address it
/// resolves to, which a listed name alone may not reach.
pub(crate) fn allow_localhost(port: u16) -> String {
    format!(r#"allow_hosts = ["localhost:{port}", "127.0.0.1:{port}"]"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_name_is_reached_over_tls_with_a_private_ca() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let plugin = format!(
        "max_attempts = 1\nca_file = \"ca.pem\"\n{}",
        allow_localhost(port)
    );
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let url = format!("https://localhost:{port}/ok");
    assert_eq!(probe_one(&host, &url).await, "ok");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].headers["idempotency-key"], "p:probe-1:netprobe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_ca_file_the_private_certificate_is_refused() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let host = probe_host(
        &format!("max_attempts = 1\n{}", allow_localhost(port)),
        None,
        &[],
    )
    .await;
    let url = format!("https://localhost:{port}/ok");
    assert_certificate_error(&probe_one(&host, &url).await);
    assert!(server.seen().is_empty());
}

/// A TLS 1.3 server that wants a client certificate refuses the client after the handshake,
/// with an alert: the guest gets it as `TLS-alert-received` naming it, as an alert during the
/// handshake is, not as an HTTP protocol error (before, retried to dead as one), and the
/// request never reached the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_after_the_handshake_is_a_tls_alert() {
    let pki = Pki::new();
    let server = TlsServer::start_with(pki.leaf(&["localhost"], false), hello, Some(&pki)).await;
    let port = server.port();
    let plugin = format!(
        "max_attempts = 1\nca_file = \"ca.pem\"\n{}",
        allow_localhost(port)
    );
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let verdict = probe_one(&host, &format!("https://localhost:{port}/ok")).await;
    assert!(
        verdict.starts_with("tls: ") && verdict.contains("TLS alert 116 (CertificateRequired)"),
        "{verdict}"
    );
    assert!(server.seen().is_empty());
}

/// Retrying cannot make an untrusted certificate trusted: with `?`, one attempt, dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_error_is_permanent() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let plugin = format!(
        "max_attempts = 5\nbackoff_base_ms = 10\n{}",
        allow_localhost(port)
    );
    let host = probe_host(&plugin, None, &[]).await;
    let url = format!("https://localhost:{port}/ok");
    let delivery = run_probe(
        &host,
        "probe-1",
        json!({ "urls": [url], "fail": true }),
        "dead",
    )
    .await;
    assert_eq!(support::outcomes(&delivery), ["permanent"], "{delivery:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_refused() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["other.example.com"], false), hello).await;
    let port = server.port();
    let plugin = format!(
        "max_attempts = 1\nca_file = \"ca.pem\"\n{}",
        allow_localhost(port)
    );
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let url = format!("https://localhost:{port}/ok");
    assert_certificate_error(&probe_one(&host, &url).await);
    assert!(server.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], true), hello).await;
    let port = server.port();
    let plugin = format!(
        "max_attempts = 1\nca_file = \"ca.pem\"\n{}",
        allow_localhost(port)
    );
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let url = format!("https://localhost:{port}/ok");
    assert_certificate_error(&probe_one(&host, &url).await);
    assert!(server.seen().is_empty());
}

/// An IP-literal URL is checked against the certificate's IP addresses, not its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_literal_url_needs_the_address_in_the_certificate() {
    let pki = Pki::new();
    let by_name = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let by_ip = TlsServer::start(pki.leaf(&["127.0.0.1"], false), hello).await;
    let (n, i) = (by_name.port(), by_ip.port());
    let plugin = format!(
        "max_attempts = 1\nca_file = \"ca.pem\"\nallow_hosts = [\"127.0.0.1:{n}\", \"127.0.0.1:{i}\"]"
    );
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let (name_only, with_ip) = (
        format!("https://127.0.0.1:{n}/ok"),
        format!("https://127.0.0.1:{i}/ok"),
    );
    let delivery = run_probe(
        &host,
        "probe-1",
        json!({ "urls": [&name_only, &with_ip] }),
        "done",
    )
    .await;
    let urls = &output(&delivery)["urls"];
    assert_eq!(urls[&with_ip], "ok");
    assert_certificate_error(urls[&name_only].as_str().unwrap_or("(missing)"));
}

/// `localhost` is listed but its loopback address is not: refused before a TCP connection,
/// so no TLS byte is ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_a_refused_address_is_denied_before_connecting() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let plugin =
        format!("max_attempts = 1\nca_file = \"ca.pem\"\nallow_hosts = [\"localhost:{port}\"]");
    let host = probe_host(&plugin, Some(&pki), &[]).await;
    let url = format!("https://localhost:{port}/ok");
    assert_eq!(
        probe_one(&host, &url).await,
        format!(
            "denied: hookd refused the request to localhost:{port}: localhost:{port} resolves \
             to 127.0.0.1:{port}, which is loopback (127.0.0.0/8); list 127.0.0.1:{port} itself \
             in allow_hosts to reach it"
        )
    );
    assert_eq!(server.connections.load(Ordering::SeqCst), 0);
}

/// A plugin that sets its own `Authorization`, then forwards all it learned to another
/// listed host: the credentialed server sees only the host's value, the other host and the
/// plugin's output never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_credential_reaches_its_host_and_never_the_plugin() {
    let pki = Pki::new();
    let api = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let other = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let (a, o) = (api.port(), other.port());
    let plugin = format!(
        r#"
        max_attempts = 1
        ca_file = "ca.pem"
        allow_hosts = ["localhost:{a}", "127.0.0.1:{a}", "localhost:{o}", "127.0.0.1:{o}"]
        [plugins.netprobe.credentials]
        "localhost:{a}" = {{ header = "Authorization", env = "TEST_API_KEY", prefix = "Bearer " }}
        "#
    );
    let host = probe_host(&plugin, Some(&pki), &[("TEST_API_KEY", API_KEY)]).await;
    let probe = json!({
        "urls": [format!("https://localhost:{a}/v1")],
        "headers": {"authorization": "plugin-chosen"},
        "post_to": [format!("https://localhost:{a}/exfil"), format!("https://localhost:{o}/exfil")],
    });
    let delivery = run_probe(&host, "probe-1", probe, "done").await;

    let want = format!("Bearer {API_KEY}");
    let api_seen = api.seen();
    assert_eq!(api_seen.len(), 2, "{api_seen:?}");
    for seen in &api_seen {
        let values: Vec<_> = seen.headers.get_all("authorization").iter().collect();
        assert_eq!(values, [want.as_str()], "{}", seen.path);
    }
    let other_seen = other.seen();
    assert_eq!(other_seen.len(), 1);
    assert!(other_seen[0].headers.get("authorization").is_none());
    assert!(!delivery.to_string().contains(API_KEY), "{delivery:#}");
    let (_, plugins_view) = host.admin_get("/admin/plugins").await;
    assert!(
        !plugins_view.to_string().contains(API_KEY),
        "{plugins_view:#}"
    );
}

/// A hosted OpenAI-compatible model over https, its key injected by the host: the classifier's
/// config holds only the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classifier_labels_with_an_https_model() {
    fn chat(_: &str) -> String {
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "bug"},
                         "finish_reason": "stop"}],
        })
        .to_string()
    }
    let pki = Pki::new();
    let model = TlsServer::start(pki.leaf(&["localhost"], false), chat).await;
    let port = model.port();
    let dir = tempfile::tempdir().unwrap();
    support::install_plugins(
        dir.path(),
        &[
            ("github", plugins::GITHUB),
            ("classifier", plugins::CLASSIFIER),
        ],
    );
    std::fs::write(dir.path().join("ca.pem"), pki.ca_pem()).unwrap();
    let config = format!(
        r#"
        [sources.github]
        scheme = "github"
        secrets = ["gh-secret"]
        parser = "github"
        handlers = ["classifier"]
        [plugins.classifier]
        ca_file = "ca.pem"
        {allow}
        config = {{ labels = "bug,feature,other", model = "m", model_url = "https://localhost:{port}/v1/chat/completions" }}
        [plugins.classifier.credentials]
        "localhost:{port}" = {{ header = "Authorization", env = "MODEL_KEY", prefix = "Bearer " }}
        "#,
        allow = allow_localhost(port),
    );
    let env = |name: &str| (name == "MODEL_KEY").then(|| API_KEY.to_owned());
    let host = TestHost::start_in_env(dir, &config, &env).await;
    let body = support::github_issue(7, "Please add a dark mode", "It would be nice");
    let mut headers = support::sign(
        &Scheme::Github,
        "gh-secret",
        "delivery-7",
        &body,
        std::time::SystemTime::now(),
    );
    headers.push((
        http::HeaderName::from_static("x-github-event"),
        http::HeaderValue::from_static("issues"),
    ));
    let (status, reply) = host.post("github", &headers, &body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let delivery = host
        .wait_state("github", "delivery-7", "classifier", "done", WAIT)
        .await;
    assert_eq!(output(&delivery), json!({"label": "bug", "via": "model"}));
    let seen = model.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Bearer {API_KEY}").as_str()
    );
}

/// A credentialed target asked for over plain `http` by name is refused before connecting:
/// the credential would cross the network unencrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_is_never_sent_over_plain_http() {
    let pki = Pki::new();
    let server = TlsServer::start(pki.leaf(&["localhost"], false), hello).await;
    let port = server.port();
    let plugin = format!(
        r#"
        max_attempts = 1
        {allow}
        [plugins.netprobe.credentials]
        "localhost:{port}" = {{ header = "Authorization", env = "TEST_API_KEY" }}
        "#,
        allow = allow_localhost(port),
    );
    let host = probe_host(&plugin, None, &[("TEST_API_KEY", API_KEY)]).await;
    let url = format!("http://localhost:{port}/v1");
    assert_eq!(
        probe_one(&host, &url).await,
        format!(
            "denied: hookd refused the request to localhost:{port}: localhost:{port} has a \
             host-injected credential, which is sent only over https"
        )
    );
    assert_eq!(server.connections.load(Ordering::SeqCst), 0);
}
