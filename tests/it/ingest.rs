//! The ingest edge against a running host: every signature scheme accepts what its provider
//! signs and refuses everything else, duplicates are decided once, a 202 survives SIGKILL,
//! hostile clients (oversize, chunked oversize, slow-loris) are cut off, a trapping parser
//! quarantines and replay recovers, the backlog bound answers 503, and requests signed by the
//! official `standardwebhooks` and `stripe` libraries are accepted.
//!
//! Invariant: every check goes through a running host (HTTP, or raw TCP where a well-behaved
//! client cannot misbehave enough); no test sleeps a fixed time and hopes: each waits on an
//! observable condition with a generous bound, and no bound is a speed claim.

use std::{
    collections::HashSet,
    net::SocketAddr,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use host::verify::{Encoding, HmacScheme};
use http::{HeaderName, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::support::{
    self, AdminApi, ProcessHost, SW_SECRET, Scheme, TestHost, plugins, replace_atomically, sha,
    sw_source,
};

/// A second standard-webhooks secret, for rotation.
const SW_SECRET_NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A generous bound for "the server closes / answers": a correctness bound, not a speed claim.
const CLOSE_BOUND: Duration = Duration::from_secs(10);

/// Handlers and replays finish within this (debug build, two cores, tests in parallel).
const WAIT: Duration = Duration::from_secs(60);

type Headers = Vec<(HeaderName, HeaderValue)>;

fn h(name: &str, value: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_bytes(name.as_bytes()).unwrap(),
        HeaderValue::from_str(value).unwrap(),
    )
}

/// Waits until the `name` metric reads `want` in `/metrics` (the figures only the database knows
/// are sampled after commits, so they follow within about a second).
pub(crate) async fn metric_reads(host: &TestHost, name: &str, want: i64) {
    let line = format!("{name} {want}");
    support::metrics_with(async |path: &str| host.admin_get(path).await, &[&line]).await;
}

// ---------------------------------------------------------------------------------------------
// 1. Signatures, every scheme.

/// One signed source of the signature table.
struct SignedSource {
    name: &'static str,
    scheme: Scheme,
    /// Both are configured: `[0]` is the old secret, `[1]` the rotated-in one.
    secrets: [&'static str; 2],
    /// Well-formed for the scheme, but not configured.
    wrong_secret: &'static str,
    signature_header: &'static str,
    /// Whether the scheme signs a timestamp (and so has a tolerance).
    timestamped: bool,
}

fn signed_sources() -> Vec<SignedSource> {
    let generic = |encoding, prefix: &str| {
        Scheme::HmacSha256(HmacScheme {
            header: HeaderName::from_static("x-acme-signature"),
            prefix: prefix.into(),
            encoding,
        })
    };
    vec![
        SignedSource {
            name: "sw",
            scheme: Scheme::StandardWebhooks,
            secrets: [SW_SECRET, SW_SECRET_NEW],
            wrong_secret: "whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldCBhdCBhbGw=",
            signature_header: "webhook-signature",
            timestamped: true,
        },
        SignedSource {
            name: "stripe",
            scheme: Scheme::Stripe,
            secrets: ["whsec_stripe_old_7f3a", "whsec_stripe_new_91bc"],
            wrong_secret: "whsec_stripe_wrong_0000",
            signature_header: "stripe-signature",
            timestamped: true,
        },
        SignedSource {
            name: "github",
            scheme: Scheme::Github,
            secrets: ["gh-old-secret-1", "gh-new-secret-2"],
            wrong_secret: "gh-wrong-secret",
            signature_header: "x-hub-signature-256",
            timestamped: false,
        },
        SignedSource {
            name: "shopify",
            scheme: Scheme::Shopify,
            secrets: ["shpss_old_secret", "shpss_new_secret"],
            wrong_secret: "shpss_wrong_secret",
            signature_header: "x-shopify-hmac-sha256",
            timestamped: false,
        },
        SignedSource {
            name: "slack",
            scheme: Scheme::Slack,
            secrets: ["slack-old-signing-secret", "slack-new-signing-secret"],
            wrong_secret: "slack-wrong-signing-secret",
            signature_header: "x-slack-signature",
            timestamped: true,
        },
        SignedSource {
            name: "hmac_hex",
            scheme: generic(Encoding::Hex, "sha256="),
            secrets: ["acme-hex-old", "acme-hex-new"],
            wrong_secret: "acme-hex-wrong",
            signature_header: "x-acme-signature",
            timestamped: false,
        },
        SignedSource {
            name: "hmac_b64",
            scheme: generic(Encoding::Base64, ""),
            secrets: ["acme-b64-old", "acme-b64-new"],
            wrong_secret: "acme-b64-wrong",
            signature_header: "x-acme-signature",
            timestamped: false,
        },
    ]
}

/// The config for every source of the table, plus `open` (scheme `none`). Sources whose scheme
/// has no id header (stripe, slack, the generic HMAC, none) get a parser reading the body.
fn signature_config(sources: &[SignedSource]) -> String {
    let mut config = String::from(
        r#"
        [plugins.by_id]
        wasm = "generic"
        config = { id_pointer = "/id", type_pointer = "/type" }

        [sources.open]
        scheme = "none"
        parser = "by_id"
        "#,
    );
    for s in sources {
        config.push_str(&format!(
            "\n[sources.{}]\nscheme = \"{}\"\nsecrets = [\"{}\", \"{}\"]\n",
            s.name,
            s.scheme.name(),
            s.secrets[0],
            s.secrets[1]
        ));
        if let Scheme::HmacSha256(generic) = &s.scheme {
            config.push_str(&format!(
                "signature_header = \"{}\"\nsignature_prefix = \"{}\"\nsignature_encoding = \"{}\"\n",
                generic.header,
                generic.prefix,
                match generic.encoding {
                    Encoding::Hex => "hex",
                    Encoding::Base64 => "base64",
                }
            ));
        }
        match s.scheme {
            Scheme::Stripe => config.push_str("parser = \"stripe\"\n"),
            Scheme::Slack | Scheme::HmacSha256(_) => config.push_str("parser = \"by_id\"\n"),
            _ => {}
        }
    }
    config
}

/// How a request of the signature table is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Signed now with the first secret.
    Valid,
    /// Signed with the second configured secret.
    Rotated,
    /// Signed 200 s ago: inside the default 300 s tolerance.
    RecentPast,
    /// One byte of the body changed after signing.
    Tampered,
    /// The same JSON, re-serialized (other key order and whitespace) after signing.
    Reserialized,
    WrongSecret,
    /// The signature header's value replaced by garbage.
    Garbage,
    /// No signature header at all.
    Missing,
    /// Signed 400 s ago.
    TooOld,
    /// Signed 400 s in the future.
    TooNew,
}

const CASES: [Case; 10] = [
    Case::Valid,
    Case::Rotated,
    Case::RecentPast,
    Case::Tampered,
    Case::Reserialized,
    Case::WrongSecret,
    Case::Garbage,
    Case::Missing,
    Case::TooOld,
    Case::TooNew,
];

impl Case {
    fn applies_to(self, source: &SignedSource) -> bool {
        source.timestamped || !matches!(self, Case::RecentPast | Case::TooOld | Case::TooNew)
    }

    fn accepted(self) -> bool {
        matches!(self, Case::Valid | Case::Rotated | Case::RecentPast)
    }

    /// What the 401's detail must say, where the reason is specific.
    fn detail(self, source: &SignedSource) -> Option<String> {
        match self {
            Case::TooOld => Some("old".into()),
            Case::TooNew => Some("future".into()),
            Case::Missing => Some(format!("missing header {}", source.signature_header)),
            Case::Tampered | Case::Reserialized | Case::WrongSecret => {
                Some("no signature matches".into())
            }
            _ => None,
        }
    }
}

/// The body a provider would send for event `id`: compact JSON in the provider's key order.
fn event_body(id: &str) -> String {
    format!(
        r#"{{"type":"test.event","id":"{id}","created":1700000000,"data":{{"object":{{"currency":"eur","amount":1200}}}}}}"#
    )
}

/// Builds the request for `case`, posts it, and checks the answer and what was stored.
async fn check(host: &TestHost, source: &SignedSource, case: Case, all_secrets: &[&str]) {
    let id = format!("{}-{case:?}", source.name);
    let body = event_body(&id);
    let now = SystemTime::now();
    let (secret, signed_at) = match case {
        Case::Rotated => (source.secrets[1], now),
        Case::WrongSecret => (source.wrong_secret, now),
        Case::RecentPast => (source.secrets[0], now - Duration::from_secs(200)),
        Case::TooOld => (source.secrets[0], now - Duration::from_secs(400)),
        Case::TooNew => (source.secrets[0], now + Duration::from_secs(400)),
        _ => (source.secrets[0], now),
    };
    let mut headers = support::sign(&source.scheme, secret, &id, body.as_bytes(), signed_at);
    let signature = HeaderName::from_static(source.signature_header);
    assert!(
        headers.iter().any(|(n, _)| *n == signature),
        "{}: signing produced no {signature} header",
        source.name
    );
    let sent = match case {
        Case::Tampered => body.replace("1200", "1201"),
        Case::Reserialized => {
            let value: Value = serde_json::from_str(&body).unwrap();
            let again = serde_json::to_string_pretty(&value).unwrap();
            assert_ne!(again, body, "re-serializing must change the bytes");
            assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), value);
            again
        }
        _ => body.clone(),
    };
    match case {
        Case::Garbage => {
            for (name, value) in &mut headers {
                if *name == signature {
                    *value = HeaderValue::from_static("garbage-signature==");
                }
            }
        }
        Case::Missing => headers.retain(|(name, _)| *name != signature),
        _ => {}
    }

    let (status, reply) = host.post(source.name, &headers, sent.as_bytes()).await;
    let what = format!("{} {case:?}", source.name);
    if case.accepted() {
        assert_eq!(status, StatusCode::ACCEPTED, "{what}: {reply}");
        assert_eq!(
            reply,
            json!({"accepted": true, "duplicate": false, "event_id": id}),
            "{what}"
        );
        let event = host
            .event(source.name, &id)
            .await
            .unwrap_or_else(|| panic!("{what}: accepted but not stored"));
        assert_eq!(event["event_type"], "test.event", "{what}: {event:#}");
        return;
    }
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {reply}");
    assert_eq!(reply["error"], "invalid_signature", "{what}: {reply}");
    let detail = reply["detail"].as_str().unwrap_or_default();
    assert!(!detail.is_empty(), "{what}: no detail in {reply}");
    if let Some(expected) = case.detail(source) {
        assert!(
            detail.contains(&expected),
            "{what}: {detail:?} lacks {expected:?}"
        );
    }
    let text = reply.to_string();
    for secret in all_secrets {
        let key = secret.strip_prefix("whsec_").unwrap_or(secret);
        assert!(
            !text.contains(key),
            "{what}: the reply leaks a secret: {text}"
        );
    }
    assert!(
        host.event(source.name, &id).await.is_none(),
        "{what}: a refused request was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_accepts_its_providers_signature_and_refuses_everything_else() {
    let sources = signed_sources();
    let host = TestHost::start(
        &signature_config(&sources),
        &[("generic", plugins::GENERIC), ("stripe", plugins::STRIPE)],
    )
    .await;
    let all_secrets: Vec<&str> = sources
        .iter()
        .flat_map(|s| [s.secrets[0], s.secrets[1], s.wrong_secret])
        .collect();
    let mut checked = 0;
    for source in &sources {
        for case in CASES.into_iter().filter(|c| c.applies_to(source)) {
            check(&host, source, case, &all_secrets).await;
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * 10 + 4 * 7, "every case of every scheme ran");

    // `none` verifies nothing: an unsigned request is accepted.
    let (status, reply) = host
        .post("open", &[], event_body("open-unsigned").as_bytes())
        .await;
    assert_eq!(
        (status, reply),
        (
            StatusCode::ACCEPTED,
            json!({"accepted": true, "duplicate": false, "event_id": "open-unsigned"})
        )
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Duplicates.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_event_is_a_duplicate_and_of_50_concurrent_copies_exactly_one_is_new() {
    // One attempt at a time: the two events' attempts both write `counter`'s one key, and on a
    // slow machine they overlapped, so one conflicted and ran again (two attempts, one of them
    // handled): not what this test asks about.
    let config = sw_source(
        "s",
        &["counter"],
        "\n[plugins.counter]\nmax_concurrency = 1",
    );
    let host = Arc::new(TestHost::start(&config, &[("counter", plugins::COUNTER)]).await);
    let post = |host: Arc<TestHost>, id: &'static str| async move {
        let body = event_body(id);
        host.post_signed(
            "s",
            &Scheme::StandardWebhooks,
            SW_SECRET,
            id,
            body.as_bytes(),
        )
        .await
    };

    let (status, first) = post(host.clone(), "msg_resent").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["duplicate"], false, "{first}");
    let (status, again) = post(host.clone(), "msg_resent").await;
    assert_eq!(
        (status, again),
        (
            StatusCode::ACCEPTED,
            json!({"accepted": true, "duplicate": true, "event_id": "msg_resent"})
        )
    );

    let copies: Vec<_> = (0..50)
        .map(|_| tokio::spawn(post(host.clone(), "msg_race")))
        .collect();
    let mut new = 0;
    for copy in copies {
        let (status, reply) = copy.await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        assert_eq!(reply["event_id"], "msg_race", "{reply}");
        if reply["duplicate"] == false {
            new += 1;
        }
    }
    assert_eq!(new, 1, "exactly one of 50 concurrent copies is new");

    // One event, one delivery, handled once.
    for id in ["msg_resent", "msg_race"] {
        let delivery = host.wait_state("s", id, "counter", "done", WAIT).await;
        assert_eq!(delivery["attempts"], 1, "{delivery:#}");
        let event = host.event("s", id).await.unwrap();
        assert_eq!(
            event["deliveries"].as_array().unwrap().len(),
            1,
            "{event:#}"
        );
    }
}

/// GitHub signs only the body: a captured delivery sent again under a new `X-GitHub-Delivery`
/// (and another `X-GitHub-Event`) is a new event, unless its source dedupes by body, where it is
/// a duplicate (202, not stored, not delivered); another body is new there as anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_body_sent_again_under_a_new_id_is_a_duplicate_where_the_source_dedupes_by_body() {
    let source = |name: &str, dedupes: bool| {
        format!(
            "[sources.{name}]\nscheme = \"github\"\nsecrets = [\"gh-secret\"]\n\
             parser = \"github\"\nhandlers = [\"classifier\"]\ndedupe_body = {dedupes}\n"
        )
    };
    let config = format!("{}\n{}", source("strict", true), source("plain", false));
    let host = TestHost::start(
        &config,
        &[
            ("github", plugins::GITHUB),
            ("classifier", plugins::CLASSIFIER),
        ],
    )
    .await;
    let body = support::github_issue(7, "crash on start", "it crashes");
    let send = async |source: &str, delivery: &str, event: &'static str, body: &[u8]| {
        let headers = support::github_headers("gh-secret", delivery, event, body);
        let (status, reply) = host.post(source, &headers, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{source} {delivery}: {reply}");
        reply["duplicate"].as_bool().unwrap()
    };
    assert!(!send("strict", "d-1", "issues", &body).await);
    assert!(
        send("strict", "d-2", "issues", &body).await,
        "new id, same body"
    );
    assert!(send("strict", "d-3", "push", &body).await, "new type too");
    assert!(send("strict", "d-1", "issues", &body).await, "the same id");
    let other = support::github_issue(8, "crash on exit", "it crashes");
    assert!(!send("strict", "d-4", "issues", &other).await);
    assert!(!send("plain", "d-1", "issues", &body).await);
    assert!(
        !send("plain", "d-2", "issues", &body).await,
        "not deduped by body"
    );
    for (source, delivery, stored) in [
        ("strict", "d-1", true),
        ("strict", "d-2", false),
        ("strict", "d-3", false),
        ("strict", "d-4", true),
        ("plain", "d-1", true),
        ("plain", "d-2", true),
    ] {
        assert_eq!(
            host.event(source, delivery).await.is_some(),
            stored,
            "{source} {delivery}"
        );
    }
    host.wait_state("strict", "d-1", "classifier", "done", WAIT)
        .await;
}

// ---------------------------------------------------------------------------------------------
// 3. Durability across SIGKILL.

/// A burst at concurrency 32 against the real `hookd serve` process; it is SIGKILLed the moment
/// three quarters of the burst has been acknowledged, with the rest still in flight. After a
/// restart on the same directory every acknowledged event is in the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_acknowledged_before_sigkill_is_there_after_restart() {
    const BURST: usize = 300;
    const KILL_AFTER: usize = BURST * 3 / 4;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\ndurability = \"full\"\n{}",
        sw_source("s", &[], "")
    );
    let host = ProcessHost::start(dir.path(), &config).await;
    let ingest = host.ingest;

    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let (results, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..BURST {
        let (gate, results) = (gate.clone(), results.clone());
        tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let id = format!("msg_burst_{i}");
            let body = event_body(&id);
            let answer = support::send_sw(ingest, "s", &id, body.as_bytes()).await;
            let _ = results.send((id, answer));
        });
    }
    drop(results);

    let mut host = Some(host);
    let mut acked = Vec::new();
    while let Some((id, answer)) = answers.recv().await {
        if let Ok((status, _, body)) = answer
            && status == StatusCode::ACCEPTED
        {
            let reply = support::json_or_text(&body);
            assert_eq!(reply["duplicate"], false, "{id}: {reply}");
            acked.push(id);
            if acked.len() == KILL_AFTER {
                host.take().unwrap().kill();
            }
        }
    }
    assert!(
        host.is_none(),
        "only {} of {BURST} acknowledged",
        acked.len()
    );

    let host = ProcessHost::start(dir.path(), &config).await;
    let (status, list) = host.admin_get("/admin/events?source=s&limit=10000").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let stored: HashSet<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    let lost: Vec<&String> = acked
        .iter()
        .filter(|id| !stored.contains(id.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged events are gone after SIGKILL: {lost:?}",
        lost.len(),
        acked.len()
    );
    assert!(stored.len() <= BURST);
}

// ---------------------------------------------------------------------------------------------
// 4 and 5. Hostile clients: oversize bodies and slow-loris connections, over raw TCP.

/// A `none` source `open` whose parser reads the event id from the body.
const OPEN_SOURCE: &str = r#"
[sources.open]
scheme = "none"
parser = "by_id"

[plugins.by_id]
wasm = "generic"
config = { id_pointer = "/id" }
"#;

/// Reads until the server closes the connection (EOF or reset), bounded by [`CLOSE_BOUND`];
/// returns what arrived, or None if the connection was still open at the bound.
async fn read_until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(CLOSE_BOUND, read_all).await.ok()?;
    Some(received)
}

/// Writes `request` (head and body, by hand) on a fresh connection and returns the status and
/// JSON body of the answer. The server may answer before reading everything, so a failed
/// write is not an error.
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    let response = read_until_closed(&mut stream)
        .await
        .unwrap_or_else(|| panic!("no answer within {CLOSE_BOUND:?}"));
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, support::json_or_text(body.as_bytes()))
}

/// A chunked request of `chunks` to the `open` source (no Content-Length).
fn chunked_request(chunks: &[&[u8]]) -> Vec<u8> {
    let mut request =
        b"POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for chunk in chunks {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    request
}

/// A client that shuts its sending side once its request is out (`nc -N`, some proxies) still
/// gets its answer: before, the connection was closed unanswered, though the event was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_its_answer() {
    let host = TestHost::start(OPEN_SOURCE, &[("generic", plugins::GENERIC)]).await;
    for i in 0..5 {
        let body = format!(r#"{{"id":"half-{i}"}}"#);
        let request = format!(
            "POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = TcpStream::connect(host.ingest).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        stream.shutdown().await.unwrap();
        let response = read_until_closed(&mut stream)
            .await
            .unwrap_or_else(|| panic!("no answer within {CLOSE_BOUND:?}"));
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 202"), "{i}: {text:?}");
        assert!(host.event("open", &format!("half-{i}")).await.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_cap_get_413_whether_declared_or_chunked() {
    let config = format!("[server]\nmax_body_bytes = 1024\n{OPEN_SOURCE}");
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;
    let too_large = json!({"error": "payload_too_large", "detail": "the body is over this endpoint's cap of 1024 bytes"});

    // Content-Length over the cap, body sent.
    let big = format!(r#"{{"id":"big","pad":"{}"}}"#, "x".repeat(2048));
    let (status, reply) = host.post("open", &[], big.as_bytes()).await;
    assert_eq!(
        (status, reply),
        (StatusCode::PAYLOAD_TOO_LARGE, too_large.clone())
    );

    // Content-Length of 50 MB and no body at all: answered from the head alone, without
    // waiting for a body that never comes (body_timeout is the default 30 s).
    let head = b"POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Length: 50000000\r\n\
                 Connection: close\r\n\r\n";
    assert_eq!(
        raw_exchange(host.ingest, head).await,
        (413, too_large.clone())
    );

    // Chunked, no Content-Length: 4 KiB in 512-byte chunks.
    let chunk = [b'x'; 512];
    let request = chunked_request(&[&chunk[..]; 8]);
    assert_eq!(raw_exchange(host.ingest, &request).await, (413, too_large));

    // The same framing under the cap is read and accepted: the 413 above is about the size.
    let request = chunked_request(&[br#"{"id":"#, br#""chunked-"#, br#"small"}"#]);
    let (status, reply) = raw_exchange(host.ingest, &request).await;
    assert_eq!(
        (status, reply),
        (
            202,
            json!({"accepted": true, "duplicate": false, "event_id": "chunked-small"})
        )
    );
    assert!(host.event("open", "big").await.is_none());
    assert!(host.event("open", "chunked-small").await.is_some());
}

/// Connections that never finish their request head (or go idle after one) are closed after
/// `header_timeout_ms`, a body that stops short gets 408 after `body_timeout_ms` (both bounded
/// generously here), and other clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_loris_connection_is_closed_while_others_are_served() {
    let config = format!("[server]\nheader_timeout_ms = 300\nbody_timeout_ms = 300\n{OPEN_SOURCE}");
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;

    // Half a request head, then silence.
    let mut partial = TcpStream::connect(host.ingest).await.unwrap();
    partial
        .write_all(b"POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Type: appl")
        .await
        .unwrap();
    // Not a byte at all.
    let mut silent = TcpStream::connect(host.ingest).await.unwrap();

    // One complete request on a kept-alive connection, then silence.
    let mut idle = TcpStream::connect(host.ingest).await.unwrap();
    let body = br#"{"id":"kept-alive"}"#;
    idle.write_all(
        format!(
            "POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    idle.write_all(body).await.unwrap();

    let (status, reply) = host.post("open", &[], br#"{"id":"meanwhile"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");

    // The kept-alive connection got its answer, then was closed once idle too long.
    let received = read_until_closed(&mut idle)
        .await
        .expect("an idle kept-alive connection is closed");
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.starts_with("HTTP/1.1 202") && text.ends_with(r#""event_id":"kept-alive"}"#),
        "kept-alive: {text:?}"
    );
    for (what, stream) in [("partial head", &mut partial), ("silent", &mut silent)] {
        let received = read_until_closed(stream).await.unwrap_or_else(|| {
            panic!("{what} connection still open {CLOSE_BOUND:?} after connecting")
        });
        // hyper may say 408 before closing; it must not have served a request.
        let text = String::from_utf8_lossy(&received);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{what}: {text:?}"
        );
    }

    // A complete head promising 100 bytes, 6 of them sent, then silence.
    let slow_body =
        b"POST /hooks/open HTTP/1.1\r\nHost: hookd\r\nContent-Length: 100\r\n\r\n{\"id\":";
    assert_eq!(
        raw_exchange(host.ingest, slow_body).await,
        (408, json!({"error": "body_timeout"}))
    );
    assert_eq!(
        host.event("open", "meanwhile").await.unwrap()["event_id"],
        "meanwhile"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Parser verdicts: quarantine and replay, invalid, ignore, no id.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_parser_quarantines_and_replay_recovers_after_the_fix() {
    let config = sw_source(
        "q",
        &["counter"],
        r#"parser = "flip"

        [plugins.flip]
        config = { id_pointer = "/id", type_pointer = "/type" }"#,
    );
    let host = TestHost::start(
        &config,
        &[("flip", plugins::TRAPPER), ("counter", plugins::COUNTER)],
    )
    .await;
    let ids = ["q-1", "q-2"];
    for id in ids {
        let body = event_body(id);
        let (status, reply) = host
            .post_signed(
                "q",
                &Scheme::StandardWebhooks,
                SW_SECRET,
                id,
                body.as_bytes(),
            )
            .await;
        assert_eq!(
            (status, reply),
            (
                StatusCode::ACCEPTED,
                json!({"accepted": true, "quarantined": true})
            ),
            "{id}"
        );
    }
    metric_reads(&host, "hookd_quarantined", 2).await;
    assert!(host.event("q", "q-1").await.is_none());

    // Replaying while the parser still traps keeps both requests.
    let (status, reply) = host
        .admin_post("/admin/replay", json!({"source": "q"}))
        .await;
    assert_eq!(
        (status, &reply["replayed"]),
        (StatusCode::OK, &json!(0)),
        "{reply}"
    );
    metric_reads(&host, "hookd_quarantined", 2).await;

    // Fix the parser: a working one replaces the file (written aside, then renamed in).
    let trapper_sha = sha(&host.plugin("flip").await).expect("the trapper loaded");
    replace_atomically(
        &host.path().join("plugins/flip.wasm"),
        &std::fs::read(plugins::GENERIC).unwrap(),
    );
    let fixed = host
        .wait_plugin("flip", "loading the new parser", WAIT, |p| {
            sha(p).is_some_and(|s| s != trapper_sha)
        })
        .await;
    assert_eq!(fixed["previous"], json!([trapper_sha]), "{fixed:#}");

    let (status, reply) = host
        .admin_post("/admin/replay", json!({"source": "q"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply, json!({"matched": 2, "replayed": 2}));
    metric_reads(&host, "hookd_quarantined", 0).await;
    for id in ids {
        let event = host.event("q", id).await.unwrap();
        assert_eq!(event["event_type"], "test.event", "{event:#}");
        host.wait_state("q", id, "counter", "done", WAIT).await;
    }
    // Nothing is left to replay, and the provider's retry is now a plain duplicate.
    let (_, reply) = host
        .admin_post("/admin/replay", json!({"source": "q"}))
        .await;
    assert_eq!(reply, json!({"matched": 0, "replayed": 0}));
    let body = event_body("q-1");
    let (status, reply) = host
        .post_signed(
            "q",
            &Scheme::StandardWebhooks,
            SW_SECRET,
            "q-1",
            body.as_bytes(),
        )
        .await;
    assert_eq!(
        (status, reply),
        (
            StatusCode::ACCEPTED,
            json!({"accepted": true, "duplicate": true, "event_id": "q-1"})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parser_verdicts_and_missing_ids_get_the_contract_answers() {
    let config = format!(
        r#"
        [sources.gh]
        scheme = "github"
        secrets = ["gh-secret"]
        parser = "github"

        [sources.gh_bare]
        scheme = "github"
        secrets = ["gh-secret"]

        [sources.bare]
        scheme = "none"

        {OPEN_SOURCE}
        "#
    );
    let host = TestHost::start(
        &config,
        &[("github", plugins::GITHUB), ("generic", plugins::GENERIC)],
    )
    .await;
    let github = |delivery: &str, event: Option<&str>| {
        let body = support::github_issue(1, "t", "b");
        let mut headers = support::sign(
            &Scheme::Github,
            "gh-secret",
            delivery,
            &body,
            SystemTime::now(),
        );
        if let Some(event) = event {
            headers.push(h("x-github-event", event));
        }
        (headers, body)
    };

    // `ignore`: 200, nothing stored.
    let (headers, body) = github("gh-ping", Some("ping"));
    let (status, reply) = host.post("gh", &headers, &body).await;
    assert_eq!(
        (status, reply),
        (StatusCode::OK, json!({"accepted": false, "ignored": true}))
    );
    assert!(host.event("gh", "gh-ping").await.is_none());

    // `invalid`: 400 with the parser's message.
    let cases: [(&str, Headers, Vec<u8>, &str); 6] = [
        {
            let (headers, body) = github("gh-no-event", None);
            ("gh", headers, body, "missing header X-GitHub-Event")
        },
        (
            "open",
            vec![],
            br#"{"name":"no id"}"#.to_vec(),
            "missing `/id` in the body",
        ),
        // No parser and no id header: 400 naming what is missing.
        {
            let (mut headers, body) = github("gh-bare", Some("issues"));
            headers.retain(|(name, _)| *name != "x-github-delivery");
            ("gh_bare", headers, body, "x-github-delivery")
        },
        (
            "bare",
            vec![],
            br#"{"id":"x"}"#.to_vec(),
            "configure `parser`",
        ),
        // Signed, but with an unusable delivery id: a bad request, not a bad signature.
        {
            let (mut headers, body) = github("gh-twice", Some("issues"));
            headers.push(h("x-github-delivery", "gh-twice-b"));
            (
                "gh_bare",
                headers,
                body,
                "event id header x-github-delivery: header appears more than once",
            )
        },
        {
            let (mut headers, body) = github("gh-empty", Some("issues"));
            headers.retain(|(name, _)| *name != "x-github-delivery");
            headers.push(h("x-github-delivery", ""));
            ("gh", headers, body, "event id header x-github-delivery")
        },
    ];
    // The signature first: a forged request with a repeated id is still a 401.
    let (mut forged, body) = github("gh-forged", Some("issues"));
    forged.retain(|(name, _)| *name != "x-hub-signature-256");
    forged.push(h(
        "x-hub-signature-256",
        &format!("sha256={}", "0".repeat(64)),
    ));
    forged.push(h("x-github-delivery", "gh-forged-b"));
    let (status, reply) = host.post("gh_bare", &forged, &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{reply}");
    for (source, headers, body, detail) in cases {
        let (status, reply) = host.post(source, &headers, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{source}: {reply}");
        assert_eq!(reply["error"], "unparsable", "{source}: {reply}");
        let got = reply["detail"].as_str().unwrap_or_default();
        assert!(got.contains(detail), "{source}: {got:?} lacks {detail:?}");
    }
    let (status, list) = host.admin_get("/admin/events").await;
    assert_eq!(
        (status, list),
        (StatusCode::OK, json!([])),
        "nothing was stored"
    );
}

// ---------------------------------------------------------------------------------------------
// 7. The backlog bound.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_events_beyond_the_backlog_bound_get_503_with_retry_after() {
    // `absent` is not installed: its deliveries wait, so the backlog only grows.
    let config = format!(
        "[server]\nmax_backlog = 2\n{}",
        sw_source("s", &["absent"], "")
    );
    let host = TestHost::start(&config, &[]).await;
    let ingest = host.ingest;
    let post = |id: &'static str| async move {
        let body = event_body(id);
        support::send_sw(ingest, "s", id, body.as_bytes()).await
    };
    for id in ["b-1", "b-2"] {
        let (status, _, body) = post(id).await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{id}: {body:?}");
    }
    let (status, headers, body) = post("b-3").await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
    assert_eq!(support::json_or_text(&body), json!({"error": "overloaded"}));
    let retry_after = headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no numeric Retry-After in {headers:?}"));
    assert!(retry_after >= 1);
    assert!(host.event("s", "b-3").await.is_none());
    let delivery = host.event("s", "b-1").await.unwrap()["deliveries"][0].clone();
    assert_eq!(delivery["state"], "pending", "{delivery:#}");
    let (_, health) = host.admin_get("/healthz").await;
    assert_eq!(health["backlog"], 2, "{health}");
    // The provider's retry of a stored event is still answered as a duplicate, not 503.
    let (status, _, body) = post("b-1").await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");
    assert_eq!(support::json_or_text(&body)["duplicate"], true);
}

/// The bound holds for concurrent senders too: 64 new events sent at once to a backlog bound
/// of 5 store at most 5. Before, each request compared the backlog as it was before any of them
/// had committed, so every request waiting for the same commit passed (an outside run stored
/// 135 of 200 against a bound of 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_new_events_do_not_overshoot_the_backlog_bound() {
    let config = format!(
        "[server]\nmax_backlog = 5\n{}",
        sw_source("s", &["absent"], "")
    );
    let host = TestHost::start(&config, &[]).await;
    let ingest = host.ingest;
    let sends: Vec<_> = (0..64)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("c-{i}");
                let body = event_body(&id);
                support::send_sw(ingest, "s", &id, body.as_bytes())
                    .await
                    .unwrap()
                    .0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for send in sends {
        statuses.push(send.await.unwrap());
    }
    let accepted = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(accepted + refused, 64, "{statuses:?}");
    assert!(
        (1..=5).contains(&accepted),
        "{accepted} stored past a bound of 5"
    );
    let (_, health) = host.admin_get("/healthz").await;
    assert_eq!(health["backlog"], accepted, "{health}");
}

/// A parser that takes the event id from a header whose value is not UTF-8 sees that value
/// read as ISO-8859-1, so two ids that differ in those bytes stay two events. Before, each such
/// byte reached it as U+FFFD: `lossy-\xff` and `lossy-\xfe` were one event, the second
/// acknowledged as a duplicate and never delivered. A valid UTF-8 id is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_from_a_header_that_is_not_utf8_stay_distinct() {
    let config = sw_source(
        "s",
        &[],
        "parser = \"generic\"\n\n[plugins.generic]\nconfig = { id_header = \"x-id\" }",
    );
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;
    let cases: [(&[u8], &str); 3] = [
        (b"lossy-\xff", "lossy-\u{ff}"),
        (b"lossy-\xfe", "lossy-\u{fe}"),
        ("plain-é".as_bytes(), "plain-é"),
    ];
    for (n, (id, read)) in cases.into_iter().enumerate() {
        let body = b"{}";
        let mut headers = support::sign(
            &Scheme::StandardWebhooks,
            SW_SECRET,
            &format!("msg-{n}"),
            body,
            SystemTime::now(),
        );
        headers.push((
            HeaderName::from_static("x-id"),
            HeaderValue::from_bytes(id).unwrap(),
        ));
        let (status, reply) = support::post_hook(host.ingest, "s", &headers, body)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        assert_eq!(
            (&reply["event_id"], &reply["duplicate"]),
            (&json!(read), &json!(false)),
            "{reply}"
        );
    }
}

/// A bound of 2^63 or more (meant as "no bound") bounds nothing: it used to wrap to -1 when
/// compared with the backlog, and every new event got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_bound_past_i64_bounds_nothing() {
    let config = format!(
        "[server]\nmax_backlog = {}\n{}",
        u64::MAX,
        sw_source("s", &["absent"], "")
    );
    let host = TestHost::start(&config, &[]).await;
    let body = event_body("huge-bound");
    let (status, _, body) = support::send_sw(host.ingest, "s", "huge-bound", body.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");
}

// ---------------------------------------------------------------------------------------------
// 8. The official client libraries.

/// Installs the pinned official libraries once into `target/compat-python` (PyPI), so the plain
/// `cargo test --workspace` needs nothing installed by hand; returns that directory.
async fn compat_python_path(root: &Path) -> std::path::PathBuf {
    static INSTALLED: tokio::sync::OnceCell<std::path::PathBuf> =
        tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let dir = root.join("target/compat-python");
            let requirements = root.join("tests/compat/requirements.txt");
            let marker = dir.join(".installed");
            let wanted = std::fs::read_to_string(&requirements).unwrap();
            if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
                let output = tokio::process::Command::new("python3")
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--upgrade",
                        "--target",
                    ])
                    .arg(&dir)
                    .arg("-r")
                    .arg(&requirements)
                    .output()
                    .await
                    .unwrap_or_else(|e| {
                        panic!("cannot run python3 -m pip ({e}): install Python 3 with pip")
                    });
                assert!(
                    output.status.success(),
                    "pip install -r tests/compat/requirements.txt failed:\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                std::fs::write(&marker, wanted).unwrap();
            }
            dir
        })
        .await
        .clone()
}

/// Headers for `body` as signed by the official library of `scheme`, via `tests/compat/sign.py`.
async fn official_signature(
    scheme: &str,
    secret: &str,
    id: &str,
    body: &[u8],
    dir: &Path,
) -> Headers {
    let root = Path::new(plugins::WORKSPACE_ROOT);
    let body_file = dir.join(format!("{id}.body"));
    std::fs::write(&body_file, body).unwrap();
    let python_path = compat_python_path(root).await;
    let output = tokio::process::Command::new("python3")
        .env("PYTHONPATH", python_path)
        .arg(root.join("tests/compat/sign.py"))
        .args(["--scheme", scheme, "--secret", secret, "--id", id])
        .arg(&body_file)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot run python3 ({e}): install Python 3, then \
                 pip install -r tests/compat/requirements.txt"
            )
        });
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "tests/compat/sign.py --scheme {scheme} failed ({}); the official libraries are \
         needed: pip install -r tests/compat/requirements.txt\n{stderr}",
        output.status
    );
    let headers: serde_json::Map<String, Value> = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("sign.py printed no JSON object ({e}): {stderr}"));
    let mut headers: Vec<_> = headers
        .iter()
        .map(|(name, value)| h(name, value.as_str().unwrap()))
        .collect();
    headers.push(h("content-type", "application/json"));
    headers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_signed_by_the_official_libraries_are_accepted() {
    const STRIPE_SECRET: &str = "whsec_compat_stripe_4eC39HqLyjWDarjtT1zdp7dc";
    let config = sw_source("sw", &[], "")
        + &format!(
            r#"
        [sources.stripe]
        scheme = "stripe"
        secrets = ["{STRIPE_SECRET}"]
        parser = "stripe"
        "#
        );
    let host = TestHost::start(&config, &[("stripe", plugins::STRIPE)]).await;
    // Non-ASCII text: both libraries sign a str, so this checks the UTF-8 bytes agree.
    let cases = [
        (
            "sw",
            "standard-webhooks",
            SW_SECRET,
            "msg_compat_1",
            r#"{"type":"user.created","data":{"name":"Zoë","note":"naïve ☕"}}"#.to_string(),
        ),
        (
            "stripe",
            "stripe",
            STRIPE_SECRET,
            "evt_compat_1",
            r#"{"id":"evt_compat_1","object":"event","type":"invoice.paid","created":1700000000,
"data":{"object":{"id":"in_1","object":"invoice","description":"Zoë's naïve ☕"}}}"#
                .to_string(),
        ),
    ];
    for (source, scheme, secret, id, body) in cases {
        let headers = official_signature(scheme, secret, id, body.as_bytes(), &host.path()).await;
        let (status, reply) = host.post(source, &headers, body.as_bytes()).await;
        assert_eq!(
            status,
            StatusCode::ACCEPTED,
            "{source}: {reply} ({headers:?})"
        );
        assert_eq!(
            reply,
            json!({"accepted": true, "duplicate": false, "event_id": id}),
            "{source}"
        );
        // The same library signature over other bytes is refused: the check is real.
        let tampered = body.replace("naïve", "naive");
        let (status, reply) = host.post(source, &headers, tampered.as_bytes()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{source}: {reply}");
    }
}

/// A path no route serves, or a served path asked with a method it does not take, is answered
/// in the contract's JSON on both listeners (the bodies were empty): a provider configured with
/// `/hooks/sw/` is told which route there is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_and_methods_no_route_serves_get_the_contracts_json_on_both_listeners() {
    let host = TestHost::start(&sw_source("sw", &[], ""), &[]).await;
    let token = Some(support::ADMIN_TOKEN);
    let cases = [
        (host.ingest, http::Method::POST, "/hooks/sw/", None, 404),
        (host.ingest, http::Method::POST, "/hooks", None, 404),
        (host.ingest, http::Method::PUT, "/hooks/sw", None, 405),
        (host.admin, http::Method::GET, "/admin/nope", token, 404),
        (
            host.admin,
            http::Method::DELETE,
            "/admin/events",
            token,
            405,
        ),
    ];
    for (listener, method, path, token, status) in cases {
        let (got, headers, body) =
            support::admin_call_with(listener, method.clone(), path, token, &[], None)
                .await
                .unwrap();
        let (error, detail) = if status == 404 {
            ("not_found", format!("no route for {method} {path}"))
        } else {
            (
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
            )
        };
        assert_eq!(
            (got.as_u16(), body),
            (status, json!({"error": error, "detail": detail})),
            "{method} {path}"
        );
        if status == 405 {
            assert!(
                headers.contains_key(header::ALLOW),
                "{method} {path}: {headers:?}"
            );
        }
    }
}

/// An event id, event type or ordering key over 1 KiB, or holding a NUL, is a 400 naming the
/// field, its size or the NUL, and whether a parser or the request gave it, and nothing is
/// stored; 1 KiB exactly is accepted. (A 100 KB `type` was stored, and came back in every row
/// of the event list; a NUL was a 500 on PostgreSQL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelope_fields_over_a_kib_are_refused_naming_the_field() {
    let config = format!(
        "{}\n[sources.keyed]\nscheme = \"none\"\nparser = \"keyed\"\n\n[plugins.keyed]\n\
         wasm = \"generic\"\nconfig = {{ id_pointer = \"/id\", key_pointer = \"/k\" }}\n",
        sw_source("sw", &[], "")
    );
    let host = TestHost::start(&config, &[("generic", plugins::GENERIC)]).await;
    let refused = |detail: &str| json!({"error": "unparsable", "detail": detail});

    let long_key = json!({"id": "long-key", "k": "k".repeat(1025)}).to_string();
    assert_eq!(
        host.post("keyed", &[], long_key.as_bytes()).await,
        (
            StatusCode::BAD_REQUEST,
            refused(
                "parser plugin keyed gave an ordering key of 1025 bytes, over the 1024 hookd stores"
            )
        )
    );
    let kib_key = json!({"id": "kib-key", "k": "k".repeat(1024)}).to_string();
    let (status, _) = host.post("keyed", &[], kib_key.as_bytes()).await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let long_type = json!({"type": "t".repeat(1025)}).to_string();
    let (status, reply) = support::post_sw(host.ingest, "sw", "long-type", long_type.as_bytes())
        .await
        .unwrap();
    assert_eq!(
        (status, reply),
        (
            StatusCode::BAD_REQUEST,
            refused("the request gave an event type of 1025 bytes, over the 1024 hookd stores")
        )
    );
    assert!(host.event("keyed", "long-key").await.is_none());
    assert!(host.event("keyed", "kib-key").await.is_some());
    assert!(host.event("sw", "long-type").await.is_none());

    // A NUL (U+0000) in a name: PostgreSQL cannot store one, so neither backend does.
    let nul_id = json!({"id": "nul\u{0}id"}).to_string();
    assert_eq!(
        host.post("keyed", &[], nul_id.as_bytes()).await,
        (
            StatusCode::BAD_REQUEST,
            refused(
                "parser plugin keyed gave an event id holding a NUL character (U+0000), which \
                 hookd does not store"
            )
        )
    );
    let nul_type = json!({"type": "a\u{0}b"}).to_string();
    let (status, reply) = support::post_sw(host.ingest, "sw", "nul-type", nul_type.as_bytes())
        .await
        .unwrap();
    assert_eq!(
        (status, reply),
        (
            StatusCode::BAD_REQUEST,
            refused(
                "the request gave an event type holding a NUL character (U+0000), which hookd \
                 does not store"
            )
        )
    );
    assert!(host.event("sw", "nul-type").await.is_none());
}

/// Svix (and Resend, which sends through it) puts the Standard Webhooks headers under its own
/// names unless an account is white-labelled: `svix-id`, `svix-timestamp`, `svix-signature`. A
/// `standard-webhooks` source takes them, with `svix-id` as the event id and dedupe key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_take_svix_header_names() {
    let host = TestHost::start(&sw_source("sw", &[], ""), &[]).await;
    let body = br#"{"type":"email.sent","data":{}}"#;
    let svix: Vec<(HeaderName, HeaderValue)> = support::sign(
        &Scheme::StandardWebhooks,
        SW_SECRET,
        "msg_svix_1",
        body,
        SystemTime::now(),
    )
    .into_iter()
    .map(
        |(name, value)| match name.as_str().strip_prefix("webhook-") {
            Some(rest) => (
                HeaderName::from_bytes(format!("svix-{rest}").as_bytes()).unwrap(),
                value,
            ),
            None => (name, value),
        },
    )
    .collect();
    assert!(svix.iter().any(|(n, _)| n == "svix-signature"), "{svix:?}");
    for duplicate in [false, true] {
        let (status, reply) = host.post("sw", &svix, body).await;
        assert_eq!(
            (status, reply),
            (
                StatusCode::ACCEPTED,
                json!({"accepted": true, "duplicate": duplicate, "event_id": "msg_svix_1"})
            )
        );
    }
    let event = host.event("sw", "msg_svix_1").await.unwrap();
    assert_eq!(event["event_type"], "email.sent", "{event:#}");
}
