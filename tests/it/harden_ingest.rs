//! The ingest edge against anonymous clients, over real TCP on loopback: bodies buffered before
//! any signature is checked, slow bodies, one address taking every slot, oversized parser
//! messages, out-of-range sequences and large genuine events; and the admin listener's bodies,
//! read under the same rules.
//!
//! Invariants checked: body bytes in memory are bounded by `max_inflight_body_bytes` (extra
//! requests get 503 + Retry-After, the process does not grow with the attack); a source's
//! `max_body_bytes` is its own; a body slower than `min_body_bytes_per_sec` or idle longer than
//! `body_idle_timeout_ms` gives its slot back within seconds; one client address holds at most
//! `max_connections_per_ip` slots; a 400 detail is capped; a sequence hookd cannot store is
//! refused; a 24 MiB GitHub event goes through the `github` Wasm parser. Client sockets bind
//! other loopback addresses (127.0.0.2, 127.0.1.x, …) to be other clients.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
};

use crate::support::{self, AdminApi, ProcessHost, TestHost, plugins};

const GH_SECRET: &str = "gh-secret";

/// A `github` source without a parser (the delivery header is the event id): nothing but the
/// HTTP edge and the signature check between a client and the inbox.
fn github_source(name: &str, extra: &str) -> String {
    format!("[sources.{name}]\nscheme = \"github\"\nsecrets = [\"{GH_SECRET}\"]\n{extra}\n")
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// A request head for `/hooks/{source}` (the connection closes after the answer).
fn head(source: &str, headers: &[(HeaderName, HeaderValue)], content_length: u64) -> Vec<u8> {
    let mut head = format!(
        "POST /hooks/{source} HTTP/1.1\r\nHost: hookd\r\nContent-Length: {content_length}\r\n\
         Connection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap()));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// A parsed HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Lower-cased head.
    head: String,
    body: Value,
}

impl Answer {
    fn retry_after(&self) -> Option<u64> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix("retry-after: "))
            .and_then(|v| v.trim().parse().ok())
    }

    fn is_overloaded(&self) -> bool {
        self.status == 503
            && self.body == json!({"error": "overloaded"})
            && self.retry_after().is_some_and(|s| s >= 1)
    }
}

/// Reads until the server closes the connection or `bound` passes; the answer, if one came.
async fn read_answer(stream: &mut TcpStream, bound: Duration) -> Option<Answer> {
    let mut received = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(bound, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&received);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        head: head.to_ascii_lowercase(),
        body: support::json_or_text(body.as_bytes()),
    })
}

/// Signs a GitHub `issues` event `delivery` and POSTs it from `from`; the answer and how long
/// it took.
async fn post_github_from(
    from: Ipv4Addr,
    to: SocketAddr,
    source: &str,
    delivery: &str,
    bound: Duration,
) -> (Option<Answer>, Duration) {
    let body = support::github_issue(1, "real", "a real webhook");
    let headers = support::github_headers(GH_SECRET, delivery, "issues", &body);
    let started = Instant::now();
    let mut request = head(source, &headers, body.len() as u64);
    request.extend_from_slice(&body);
    let mut stream = connect_from(from, to).await.unwrap();
    stream.write_all(&request).await.unwrap();
    let answer = read_answer(&mut stream, bound).await;
    (answer, started.elapsed())
}

/// 60 connections each declare a 25 MiB body (the default cap) and send half of it, then stall.
/// The default budget (128 MiB) holds what fewer than ten of them send; the others get 503 +
/// Retry-After (from their head, or once their bytes no longer fit), and the process grows by
/// at most the budget plus a margin (it grew by ~750 MiB when every half body was buffered).
/// The stalled ones get 408 once idle for `body_idle_timeout_ms`, and a real event is accepted
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_large_bodies_stay_within_the_body_budget_and_extras_get_503() {
    const SOCKETS: usize = 60;
    const DECLARED: u64 = 26_214_400;
    const BUDGET: u64 = 128 << 20;
    const GROWTH_CEILING: u64 = BUDGET + (96 << 20);
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(
        dir.path(),
        &format!("[server]\n{}", github_source("gh", "")),
    )
    .await;
    let rss_before = support::status_kib(host.pid(), "VmRSS") * 1024;

    let half = Arc::new(vec![b'x'; (DECLARED / 2) as usize]);
    let attack_head = head("gh", &[], DECLARED);
    let mut sockets = Vec::new();
    for _ in 0..SOCKETS {
        let (half, attack_head, to) = (half.clone(), attack_head.clone(), host.ingest);
        sockets.push(tokio::spawn(async move {
            let mut stream = connect_from(Ipv4Addr::LOCALHOST, to).await.unwrap();
            stream.write_all(&attack_head).await.unwrap();
            // Refused from the head alone, or admitted and reading.
            if let Some(answer) = read_answer(&mut stream, Duration::from_secs(2)).await {
                return (false, Some(answer), Duration::ZERO);
            }
            let sent = stream.write_all(&half).await.is_ok();
            // Stalled: the server must cut it off after its idle bound (5 s by default).
            let waiting = Instant::now();
            let answer = read_answer(&mut stream, Duration::from_secs(30)).await;
            (sent, answer, waiting.elapsed())
        }));
    }
    // Sample while the attack is on: admitted sockets hold their half bodies for ~5 s.
    let mut peak_rss = 0;
    let sampling_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < sampling_until {
        peak_rss = peak_rss.max(support::status_kib(host.pid(), "VmRSS") * 1024);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut refused = 0;
    let mut admitted = 0;
    for socket in sockets {
        match socket.await.unwrap() {
            (_, Some(answer), _) if answer.is_overloaded() => refused += 1,
            // Refused once its bytes no longer fit: closed with its body unread, the connection
            // may be reset before its 503 is read, but not left hanging.
            (_, None, waited) if waited < Duration::from_secs(20) => refused += 1,
            (true, Some(answer), _) => {
                assert_eq!(
                    (answer.status, &answer.body),
                    (408, &json!({"error": "body_timeout"})),
                    "a stalled body: {answer:?}"
                );
                admitted += 1;
            }
            other => panic!("neither refused nor cut off: {other:?}"),
        }
    }
    let peak = support::status_kib(host.pid(), "VmHWM") * 1024;
    let growth = peak.max(peak_rss).saturating_sub(rss_before);
    eprintln!(
        "RSS before {} MiB, peak {} MiB (growth {} MiB); {admitted} admitted, {refused} refused",
        rss_before >> 20,
        peak >> 20,
        growth >> 20
    );
    assert!(
        admitted <= (BUDGET / (DECLARED / 2)) as usize,
        "{admitted} admitted"
    );
    assert_eq!(admitted + refused, SOCKETS);
    assert!(
        growth <= GROWTH_CEILING,
        "hookd grew by {} MiB under the attack (ceiling {} MiB)",
        growth >> 20,
        GROWTH_CEILING >> 20
    );

    // The budget is whole again: a real event goes through.
    let (answer, _) = post_github_from(
        Ipv4Addr::new(127, 0, 0, 2),
        host.ingest,
        "gh",
        "after-attack",
        Duration::from_secs(30),
    )
    .await;
    let answer = answer.expect("an answer");
    assert_eq!(answer.status, 202, "{answer:?}");
}

/// A source's own `max_body_bytes` (1 KiB) answers 413 — declared, undeclared (chunked) or
/// only announced — while a source on the server's default takes the same body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sources_max_body_bytes_answers_413_below_the_servers_cap() {
    let config = format!(
        "{}{}",
        github_source("small", "max_body_bytes = 1024"),
        github_source("large", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let body = support::github_issue(1, "t", &"x".repeat(2048));
    let post = |source: &'static str, delivery: &'static str, body: Vec<u8>| {
        let host = &host;
        async move {
            let headers = support::github_headers(GH_SECRET, delivery, "issues", &body);
            host.post(source, &headers, &body).await
        }
    };
    let too_large = (
        StatusCode::PAYLOAD_TOO_LARGE,
        json!({"error": "payload_too_large", "detail": "the body is over this endpoint's cap of 1024 bytes"}),
    );
    assert_eq!(post("small", "s-big", body.clone()).await, too_large);
    let (status, reply) = post("large", "l-big", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let small = support::github_issue(2, "t", "short");
    let (status, reply) = post("small", "s-small", small).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");

    // Announced only: answered from the head, no body ever sent.
    let mut stream = TcpStream::connect(host.ingest).await.unwrap();
    stream.write_all(&head("small", &[], 4096)).await.unwrap();
    let answer = read_answer(&mut stream, Duration::from_secs(10))
        .await
        .expect("an answer from the head alone");
    assert_eq!((answer.status, answer.body), (413, too_large.1.clone()));

    // Chunked (no length): 4 KiB in 512-byte chunks.
    let mut request =
        b"POST /hooks/small HTTP/1.1\r\nHost: hookd\r\nTransfer-Encoding: chunked\r\n\
                        Connection: close\r\n\r\n"
            .to_vec();
    for _ in 0..8 {
        request.extend_from_slice(b"200\r\n");
        request.extend_from_slice(&[b'x'; 512]);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let mut stream = TcpStream::connect(host.ingest).await.unwrap();
    let _ = stream.write_all(&request).await;
    let answer = read_answer(&mut stream, Duration::from_secs(10))
        .await
        .expect("an answer");
    assert_eq!((answer.status, answer.body), (413, too_large.1));
    assert!(host.event("small", "s-big").await.is_none());
    assert!(host.event("large", "l-big").await.is_some());
}

/// Holds `count` connections from `from(i)`, each trickling one body byte every `every` and
/// reconnecting as soon as it is cut off, until `stop`. Returns how many were cut off; `holding`
/// counts the connections that have trickled for at least one `every` without being cut off.
fn trickle(
    to: SocketAddr,
    count: usize,
    from: impl Fn(usize) -> Ipv4Addr,
    every: Duration,
    stop: Arc<AtomicBool>,
    holding: Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..count)
        .map(|i| {
            let (local, stop, holding) = (from(i), stop.clone(), holding.clone());
            tokio::spawn(async move {
                let mut cut = 0;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = connect_from(local, to).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    if stream.write_all(&head("gh", &[], 1000)).await.is_err() {
                        continue;
                    }
                    let mut held = false;
                    while !stop.load(Ordering::Relaxed) && stream.write_all(b"x").await.is_ok() {
                        let mut byte = [0u8; 1];
                        // A read that ends (answer or close) means the server cut it off.
                        let read = tokio::time::timeout(every, stream.read(&mut byte)).await;
                        if read.is_ok() {
                            cut += 1;
                            break;
                        }
                        if !held {
                            held = true;
                            holding.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if held {
                        holding.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                cut
            })
        })
        .collect()
}

/// 32 clients, each from its own address, hold every ingest slot (`max_connections = 32`) by
/// trickling a byte every 250 ms (never idle for long) and reconnect when cut off. A signed
/// webhook from another address is accepted within a ceiling, because a body slower than
/// `min_body_bytes_per_sec` (16 KiB/s by default, after the 5 s allowance) is cut off; before,
/// it waited for the 30 s body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_bodies_cannot_hold_the_slots_against_a_real_webhook() {
    const CEILING: Duration = Duration::from_secs(15);
    let config = format!(
        "[server]\nmax_connections = 32\n{}",
        github_source("gh", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let holding = Arc::new(AtomicUsize::new(0));
    let attackers = trickle(
        host.ingest,
        32,
        |i| Ipv4Addr::new(127, 0, 1, 1 + i as u8),
        Duration::from_millis(250),
        stop.clone(),
        holding.clone(),
    );
    // Until they hold the slots.
    let deadline = Instant::now() + Duration::from_secs(30);
    while holding.load(Ordering::Relaxed) < 32 {
        assert!(
            Instant::now() < deadline,
            "only {} trickling connections held a slot",
            holding.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (answer, took) = post_github_from(
        Ipv4Addr::new(127, 0, 0, 2),
        host.ingest,
        "gh",
        "through-the-trickle",
        Duration::from_secs(40),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut cut = 0;
    for attacker in attackers {
        cut += attacker.await.unwrap();
    }
    eprintln!("the real webhook took {took:?}; attackers were cut off {cut} times");
    let answer = answer.expect("an answer");
    assert_eq!(answer.status, 202, "{answer:?}");
    assert!(took <= CEILING, "the real webhook waited {took:?}");
    assert!(
        cut >= 16,
        "the trickling connections were cut off {cut} times"
    );
}

/// Six clients, each from its own address, declare bodies that add up to the whole default
/// budget (five of 25 MiB, one of the 3 MiB left): three send 64 KiB/s (above
/// `min_body_bytes_per_sec`, far below the pace that would finish 25 MiB), three send their
/// head only and connect again as soon as they are cut off. A declared length is reserved as
/// its bytes arrive, so together they hold what they sent, and every real webhook sent
/// meanwhile is accepted. Before, each head reserved its whole declared length: the six held
/// the budget for free, and every webhook got 503 for as long as they went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_large_bodies_without_sending_them_holds_no_budget() {
    let host = TestHost::start(&format!("[server]\n{}", github_source("gh", "")), &[]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut attackers = Vec::new();
    for i in 0..6u8 {
        let (to, stop) = (host.ingest, stop.clone());
        let declared = if i < 5 {
            26_214_400
        } else {
            (128 << 20) - 5 * 26_214_400
        };
        attackers.push(tokio::spawn(async move {
            let from = Ipv4Addr::new(127, 0, 2, 1 + i);
            let chunk = vec![b'x'; 16 * 1024];
            let mut heads = 0;
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut stream) = connect_from(from, to).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                heads += 1;
                if stream.write_all(&head("gh", &[], declared)).await.is_err() {
                    continue;
                }
                if i % 2 == 0 {
                    // Head only: wait to be cut off (408), then go again.
                    let _ = read_answer(&mut stream, Duration::from_secs(30)).await;
                    continue;
                }
                while !stop.load(Ordering::Relaxed) {
                    if stream.write_all(&chunk).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            heads
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut answers = Vec::new();
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(12) {
        let (answer, _) = post_github_from(
            Ipv4Addr::new(127, 0, 0, 2),
            host.ingest,
            "gh",
            &format!("past-the-hoarders-{n}"),
            Duration::from_secs(10),
        )
        .await;
        answers.push(answer.map(|a| a.status));
        n += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut heads = 0;
    for attacker in attackers {
        heads += attacker.await.unwrap();
    }
    eprintln!(
        "{} real webhooks during {heads} attacking heads",
        answers.len()
    );
    assert!(
        heads > 6,
        "the head-only attackers never came back: {heads}"
    );
    assert!(
        answers.iter().all(|a| *a == Some(202)),
        "real webhooks not accepted during the attack: {answers:?}"
    );
}

/// Two clients take both connection slots (`max_connections = 2`) and pipeline requests whose
/// answers they never read. Once a connection's answers have backed up and made no progress for
/// `header_timeout_ms`, it is closed, and a real webhook waiting in the kernel's backlog gets a
/// slot. Before, the head and body timeouts covered only reading, and both connections stayed
/// open for as long as the clients wished: the webhook was never answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_their_answers_give_their_slots_back() {
    let config = format!(
        "[server]\nmax_connections = 2\nheader_timeout_ms = 2000\n{}",
        github_source("gh", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let request = format!(
        "GET /hooks/{} HTTP/1.1\r\nHost: hookd\r\n\r\n",
        "x".repeat(8000)
    );
    let mut clients = Vec::new();
    for i in 0..2u8 {
        let (to, request) = (host.ingest, request.clone());
        clients.push(tokio::spawn(async move {
            let mut stream = connect_from(Ipv4Addr::new(127, 0, 3, 1 + i), to)
                .await
                .unwrap();
            // Until hookd stops reading (its answers backed up) and then closes the connection.
            let mut sent = 0;
            while stream.write_all(request.as_bytes()).await.is_ok() {
                sent += 1;
            }
            sent
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (answer, took) = post_github_from(
        Ipv4Addr::new(127, 0, 0, 2),
        host.ingest,
        "gh",
        "past-the-non-readers",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(answer.map(|a| a.status), Some(202), "after {took:?}");
    for client in clients {
        let sent = tokio::time::timeout(Duration::from_secs(30), client)
            .await
            .expect("a client that never reads was never cut off")
            .unwrap();
        eprintln!("a client that never read sent {sent} requests before it was cut off");
    }
}

/// One address opens 24 connections that stall in their body; with `max_connections = 16`
/// and no rate or short idle bound to save the day, only `max_connections_per_ip = 4` of them
/// are served and 4 more wait for one of those slots: the other 16 get 503 + Retry-After at
/// once, and a client at another address is accepted at once (before, it waited behind 16
/// stalled bodies for `body_idle_timeout_ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_slot() {
    let config = format!(
        "[server]\nmax_connections = 16\nmax_connections_per_ip = 4\nbody_idle_timeout_ms = 30000\n\
         min_body_bytes_per_sec = 0\n{}",
        github_source("gh", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..24 {
        let mut stream = connect_from(Ipv4Addr::LOCALHOST, host.ingest)
            .await
            .unwrap();
        // One write, so the byte after the head is read with it (nothing left unread).
        let mut request = head("gh", &[], 1000);
        request.push(b'{');
        stream.write_all(&request).await.unwrap();
        match read_answer(&mut stream, Duration::from_millis(500)).await {
            Some(answer) => {
                assert!(answer.is_overloaded(), "{answer:?}");
                refused += 1;
            }
            None => held.push(stream),
        }
    }
    assert_eq!(
        (held.len(), refused),
        (8, 16),
        "4 served, 4 waiting, 16 refused"
    );
    let (answer, took) = post_github_from(
        Ipv4Addr::new(127, 0, 0, 2),
        host.ingest,
        "gh",
        "another-address",
        Duration::from_secs(40),
    )
    .await;
    let answer = answer.expect("an answer");
    assert_eq!(answer.status, 202, "{answer:?}");
    assert!(took <= Duration::from_secs(5), "took {took:?}");
    // Held connections going away free their address's slots (the waiting ones leave the
    // queue; the served ones give their slot back).
    held.clear();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (answer, _) = post_github_from(
            Ipv4Addr::LOCALHOST,
            host.ingest,
            "gh",
            "same-address",
            Duration::from_secs(10),
        )
        .await;
        let answer = answer.expect("an answer");
        if answer.status == 202 {
            break;
        }
        assert!(answer.is_overloaded(), "{answer:?}");
        assert!(Instant::now() < deadline, "the freed slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Idle keep-alive connections from a few addresses, together holding every slot, do not keep
/// another client waiting: one of them is closed for it (before, it waited in the kernel's
/// queue until their head timeout closed them, and a client asking again every few seconds kept
/// them forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_holding_every_slot_make_room_for_a_new_client() {
    let config = format!(
        "[server]\nmax_connections = 8\nmax_connections_per_ip = 4\nheader_timeout_ms = 30000\n{}",
        github_source("gh", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let mut held = Vec::new();
    for from in [Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)] {
        for _ in 0..4 {
            let mut stream = connect_from(from, host.ingest).await.unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: hookd\r\n\r\n")
                .await
                .unwrap();
            let answer = read_answer(&mut stream, Duration::from_millis(300)).await;
            assert!(answer.is_some(), "kept alive after an answer");
            held.push(stream);
        }
    }
    let (answer, took) = post_github_from(
        Ipv4Addr::LOCALHOST,
        host.ingest,
        "gh",
        "a-new-client",
        Duration::from_secs(40),
    )
    .await;
    let answer = answer.expect("an answer");
    assert_eq!(answer.status, 202, "{answer:?}");
    assert!(took <= Duration::from_secs(5), "took {took:?}");
    // One held connection was closed for it; the others are still open.
    let mut closed = 0;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(100), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "one connection closed for the new client");
}

/// A parser's 1 MiB `invalid` message (with newlines and terminal escapes) reaches the client
/// as a detail of at most 4 KiB plus a marker naming the full length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parsers_enormous_invalid_message_is_capped_in_the_400() {
    let config = "[sources.r]\nscheme = \"none\"\nparser = \"rambler\"\n";
    let host = TestHost::start(config, &[("rambler", plugins::RAMBLER)]).await;
    let (status, reply) = host.post("r", &[], b"{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert_eq!(reply["error"], "unparsable");
    let detail = reply["detail"].as_str().unwrap();
    assert!(detail.starts_with("not an event\n"), "{detail:.80}");
    assert!(
        detail.len() <= host::error::MAX_DETAIL_BYTES + 64,
        "a detail of {} bytes",
        detail.len()
    );
    assert!(
        detail.ends_with(&format!(
            "[truncated: {} of {} bytes dropped]",
            (1 << 20) - host::error::MAX_DETAIL_BYTES,
            1 << 20
        )),
        "{:?}",
        &detail[detail.len().saturating_sub(80)..]
    );
}

/// A sequence of 2^63 or more (the WIT's u64) cannot be stored as SQLite's signed integer:
/// it is refused with a 400 naming it, instead of wrapping negative and making every older
/// event of its key look newer. 2^63 - 1 is stored as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_of_2_pow_63_or_more_is_refused_not_wrapped() {
    let config = r#"
        [sources.seq]
        scheme = "none"
        parser = "by_seq"

        [plugins.by_seq]
        wasm = "generic"
        config = { id_pointer = "/id", key_pointer = "/key", sequence_pointer = "/seq" }
    "#;
    let host = TestHost::start(config, &[("generic", plugins::GENERIC)]).await;
    for (id, seq) in [
        ("over", json!(9_223_372_036_854_775_808_u64)),
        ("max", json!(u64::MAX.to_string())),
    ] {
        let body = json!({"id": id, "key": "k", "seq": seq}).to_string();
        let (status, reply) = host.post("seq", &[], body.as_bytes()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{id}: {reply}");
        assert_eq!(reply["error"], "unparsable", "{reply}");
        let detail = reply["detail"].as_str().unwrap();
        let seq = seq
            .as_u64()
            .map_or_else(|| seq.as_str().unwrap().to_owned(), |s| s.to_string());
        assert!(
            detail.contains(&seq) && detail.contains("9223372036854775807"),
            "{detail}"
        );
        assert!(host.event("seq", id).await.is_none());
    }
    let body = json!({"id": "top", "key": "k", "seq": i64::MAX}).to_string();
    let (status, reply) = host.post("seq", &[], body.as_bytes()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let event = host.event("seq", "top").await.unwrap();
    assert_eq!(event["sequence"], json!(i64::MAX), "{event}");
}

/// A GitHub `push` of 24 MiB (within the default 25 MiB cap): many commits, as GitHub sends
/// them.
fn huge_push(bytes: usize) -> Vec<u8> {
    let mut body = String::with_capacity(bytes + 4096);
    body.push_str(
        r#"{"ref":"refs/heads/main","repository":{"full_name":"acme/widgets"},"commits":["#,
    );
    let mut i = 0u64;
    while body.len() < bytes - 1024 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"id":"{i:040x}","message":"Commit {i}: fix the widget frobnicator","timestamp":"2026-01-01T00:00:00Z","author":{{"name":"A. Developer","email":"dev@example.com","username":"dev"}},"added":["src/a{i}.rs"],"removed":[],"modified":["src/lib.rs","README.md"],"distinct":true}}"#
        ));
        i += 1;
    }
    body.push_str("]}");
    body.into_bytes()
}

/// The body copy alone (24 MiB) is over the parser's 16 MiB default: the event used to be
/// quarantined. The parser budget now grows with the body, so it is parsed and accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_genuine_github_event_is_accepted_not_quarantined() {
    let config = format!("{}parser = \"github\"\n", github_source("gh", ""));
    let host = TestHost::start(&config, &[("github", plugins::GITHUB)]).await;
    let body = huge_push(24 << 20);
    let headers = support::github_headers(GH_SECRET, "big-push", "push", &body);
    let (status, reply) = host.post("gh", &headers, &body).await;
    assert_eq!(
        (status, &reply),
        (
            StatusCode::ACCEPTED,
            &json!({"accepted": true, "duplicate": false, "event_id": "big-push"})
        )
    );
    let event = host.event("gh", "big-push").await.unwrap();
    assert_eq!(event["event_type"], "push", "{:.300}", event.to_string());
    assert_eq!(event["ordering_key"], "acme/widgets");
}

/// An event id is whatever the parser found in the body, newlines and terminal escapes
/// included: stored exactly, but escaped in the log, where it could otherwise forge a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_with_control_characters_cannot_forge_log_lines() {
    let dir = tempfile::tempdir().unwrap();
    support::install_plugins(
        dir.path(),
        &[("generic", plugins::GENERIC), ("flaky", plugins::FLAKY)],
    );
    let config = r#"
        [server]

        [sources.open]
        scheme = "none"
        parser = "by_id"
        handlers = ["flaky"]

        [plugins.by_id]
        wasm = "generic"
        config = { id_pointer = "/id" }
    "#;
    let host = ProcessHost::start(dir.path(), config).await;
    let id = "evt-1\nERROR hookd::forged: all is lost\u{1b}[2J";
    let body = json!({"id": id, "permanent": true}).to_string();
    let (status, reply) = host.post("open", &[], body.as_bytes()).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(reply["event_id"], id, "stored exactly");
    // The permanent failure is logged as a warning naming the event.
    let log = host.wait_log("evt-1", Duration::from_secs(30)).await;
    assert!(
        !log.lines()
            .any(|line| line.starts_with("ERROR hookd::forged")),
        "a forged line:\n{log}"
    );
    assert!(log.contains(r"evt-1\nERROR hookd::forged"), "{log}");
    assert!(
        !log.contains("\u{1b}[2J"),
        "a raw escape sequence in the log:\n{log}"
    );
}

/// The admin listener reads bodies under the ingest's rules. A token holder's request that
/// stalls its body is cut off with 408 once idle for `body_idle_timeout_ms` (it held the
/// connection for as long as the client kept it open), and one declaring a body over the
/// listener's cap is refused with 413 from its head alone (it was read until past the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bodies_that_stall_or_declare_too_much_are_refused_without_holding_the_connection() {
    let host = TestHost::start(&github_source("gh", ""), &[]).await;
    let admin_head = |length: u64| {
        format!(
            "POST /admin/replay HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\n\
             Connection: close\r\n\r\n",
            host.admin,
            support::ADMIN_TOKEN
        )
    };
    let cases = [
        // A body of 100 bytes declared, one sent, then nothing.
        (format!("{}{{", admin_head(100)), 408, "body_timeout"),
        // A body over the cap declared, none sent.
        (admin_head(64 * 1024 * 1024), 413, "payload_too_large"),
    ];
    for (request, status, error) in cases {
        let mut stream = connect_from(Ipv4Addr::LOCALHOST, host.admin).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_answer(&mut stream, Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("no answer before the bound ({error} expected)"));
        assert_eq!(
            (answer.status, &answer.body["error"]),
            (status, &json!(error))
        );
    }
}

/// One address sending large bodies on many connections at the pace the rules ask holds at
/// most its share of the body budget (a quarter of it by default): its further bodies get 503,
/// and a real webhook from another address is accepted meanwhile. Before, nine such bodies
/// held the whole budget, and every webhook was answered 503 for as long as they went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_share_of_the_body_budget() {
    let config = format!(
        "[server]\nmax_inflight_body_bytes = 8388608\nmax_body_bytes = 1048576\n{}",
        github_source("gh", "")
    );
    let host = TestHost::start(&config, &[]).await;
    let from = Ipv4Addr::new(127, 0, 3, 1);
    let mut hoarders = Vec::new();
    for _ in 0..9 {
        let mut stream = connect_from(from, host.ingest).await.unwrap();
        stream.write_all(&head("gh", &[], 1 << 20)).await.unwrap();
        // 600 KB at once: the pace of a 1 MiB body for the next several seconds.
        let _ = stream.write_all(&vec![b'x'; 600_000]).await;
        hoarders.push(stream);
    }
    // The bodies are read (and counted) as they arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (answer, _) = post_github_from(
        Ipv4Addr::new(127, 0, 0, 2),
        host.ingest,
        "gh",
        "past-the-hoarder",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(answer.map(|a| a.status), Some(202), "a real webhook");
    let mut refused = 0;
    for stream in &mut hoarders {
        if let Some(answer) = read_answer(stream, Duration::from_millis(200)).await {
            assert_eq!(answer.status, 503, "{answer:?}");
            refused += 1;
        }
    }
    // A quarter of 8 MiB holds two of the 1 MiB bodies (and a third's first steps).
    assert!(refused >= 6, "{refused} of 9 bodies refused");
}
