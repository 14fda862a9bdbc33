//! Several `hookd serve` nodes on one PostgreSQL database, as real processes: what one node
//! acknowledges no node loses, the nodes never run one delivery (or one ordering key) twice at
//! once, and the database going away is a 503 and a reconnect, not a loss.
//!
//! The stored rows are read with `psql`, as an operator would: the attempt history is where
//! "never on two nodes at once" can be seen.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use http::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::Semaphore;

use crate::{
    outbound::{Mock, Reply},
    postgres::{PrivatePostgres, TestDatabase, pgbouncer_url, psql, server_ca},
    support::{
        self, AdminApi, KEYED_BY_BODY, ProcessHost, Scheme, install_plugins, plugins, sw_source,
    },
};

/// Ordering keys the events are spread over.
const KEYS: usize = 50;

/// A node of the cluster: `workers` workers on `database`, source `s` (keyed by body) feeding
/// `counter`, which counts per ordering key.
fn node_config(database: &str, workers: usize) -> String {
    node_config_with(database, workers, "")
}

/// [`node_config`], with more `[server]` settings.
fn node_config_with(database: &str, workers: usize, server: &str) -> String {
    // `KEYED_BY_BODY` raises the parser's time from its 50 ms default: three debug-built nodes
    // and the database share two cores here, and a parse that runs out of time is quarantined.
    let extra = format!(
        "{KEYED_BY_BODY}\n\n[plugins.counter]\ntimeout_ms = 10000\nconfig = {{ per_key = \"true\" }}\n"
    );
    format!(
        "[server]\nworkers = {workers}\ndatabase = \"{database}\"\n{server}{}",
        sw_source("s", &["counter"], &extra)
    )
}

/// One node's directory (its own `plugins_dir`: the nodes share only the database).
fn node_dir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(
        dir.path(),
        &[("counter", plugins::COUNTER), ("generic", plugins::GENERIC)],
    );
    dir
}

/// The ingest addresses of the live nodes, as a load balancer would know them.
type Nodes = Arc<RwLock<Vec<SocketAddr>>>;

fn event_body(i: usize) -> Value {
    json!({"id": format!("evt_{i}"), "key": format!("k{}", i % KEYS), "seq": i / KEYS})
}

/// What a provider does: sends the event to node `first` and, until one answers 202, again to
/// the next node (a killed node's connection errors, a 503). Returns the 202's body.
async fn deliver(nodes: Nodes, first: usize, i: usize) -> Value {
    let body = event_body(i).to_string();
    let id = format!("evt_{i}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut node = first;
    loop {
        let ingest = {
            let nodes = nodes.read().unwrap();
            nodes[node % nodes.len()]
        };
        match support::post_sw(ingest, "s", &id, body.as_bytes()).await {
            Ok((StatusCode::ACCEPTED, reply)) => return reply,
            Ok((status, reply)) => assert!(
                status == StatusCode::SERVICE_UNAVAILABLE,
                "{id}: {status} {reply}"
            ),
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "{id} was never accepted");
        node += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One number from `psql`.
fn count(url: &str, sql: &str) -> i64 {
    psql(url, sql).trim().parse().unwrap()
}

/// Waits until no delivery is open.
async fn wait_settled(url: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let open = count(
            url,
            "SELECT count(*) FROM deliveries WHERE state IN ('pending', 'running', 'retrying')",
        );
        if open == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} deliveries still open after {timeout:?}: {}",
            psql(url, "SELECT state, count(*) FROM deliveries GROUP BY state")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Re-parses every request of source `s` held in quarantine (through `node`): on a starved
/// machine a request whose parser ran out of time is held there, and acknowledged all the
/// same; re-parsing stores its event (deduped).
async fn replay_quarantine(node: &ProcessHost) {
    let (status, reply) = node
        .admin(
            http::Method::POST,
            "/admin/replay",
            Some(support::ADMIN_TOKEN),
            Some(json!({"source": "s"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

/// Per ordering key, `counter`'s outputs of the done deliveries in sequence order are exactly
/// `1..N` (an update lost, applied twice or out of order breaks that), and every key was handled.
fn assert_counted_in_order(url: &str) {
    let mut counts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for line in psql(
        url,
        "SELECT ordering_key, output FROM deliveries WHERE state = 'done'
         ORDER BY ordering_key, sequence, id",
    )
    .lines()
    {
        let (key, output) = line.split_once('|').unwrap();
        let output: Value = serde_json::from_str(output).unwrap();
        assert_eq!(output["key"], key, "{line}");
        counts
            .entry(key.to_owned())
            .or_default()
            .push(output["count"].as_i64().unwrap());
    }
    for (key, counts) in &counts {
        let expected: Vec<i64> = (1..=counts.len() as i64).collect();
        assert_eq!(counts, &expected, "key {key}: counts in sequence order");
    }
    assert_eq!(counts.len(), KEYS, "every key handled");
}

/// Signed events over 50 ordering keys, spread over three nodes, one of which is SIGKILLed and
/// restarted twice under the load: 18 000 distinct events plus 2 000 duplicates (half sent to
/// two nodes at the same moment, half resent later), 20 000 requests in all
/// (`HOOKD_TEST_CLUSTER_EVENTS=N` sends N distinct events instead, for a quicker run). Every event
/// is stored once; per key, `counter`'s outputs in sequence order are exactly `1..N` over the
/// deliveries done (an update lost, applied twice or out of order would break the run); no
/// delivery's attempts overlap in time, and per ordering key the handled events ran one after
/// the other in sequence order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_lose_nothing_and_never_overlap_while_one_is_killed_twice() {
    let Some(db) = TestDatabase::create(
        "three_nodes_lose_nothing_and_never_overlap_while_one_is_killed_twice",
    ) else {
        return;
    };
    let distinct: usize = std::env::var("HOOKD_TEST_CLUSTER_EVENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(18_000);
    let config = node_config(&db.url, 4);
    let dirs: Vec<TempDir> = (0..3).map(|_| node_dir()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        hosts.push(ProcessHost::start(dir.path(), &config).await);
    }
    let nodes: Nodes = Arc::new(RwLock::new(hosts.iter().map(|h| h.ingest).collect()));

    let acked = Arc::new(AtomicUsize::new(0));
    let limit = Arc::new(Semaphore::new(32));
    let mut sends = Vec::new();
    let mut send = |i: usize, first: usize| {
        let (nodes, acked, limit) = (nodes.clone(), acked.clone(), limit.clone());
        sends.push(tokio::spawn(async move {
            let _slot = limit.acquire().await.unwrap();
            let reply = deliver(nodes, first, i).await;
            acked.fetch_add(1, Ordering::Relaxed);
            (i, reply)
        }));
    };
    for i in 0..distinct {
        send(i, i);
        if i % 18 == 0 {
            // A concurrent duplicate, to another node at the same moment.
            send(i, i + 1);
        }
    }

    // SIGKILL node 1 twice under the load, restarting it on the same directory.
    for threshold in [distinct / 3, 2 * distinct / 3] {
        let deadline = Instant::now() + Duration::from_secs(300);
        while acked.load(Ordering::Relaxed) < threshold {
            assert!(
                Instant::now() < deadline,
                "the load stalled before {threshold}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let killed = hosts.remove(1);
        killed.kill();
        let restarted = ProcessHost::start(dirs[1].path(), &config).await;
        nodes.write().unwrap()[1] = restarted.ingest;
        hosts.insert(1, restarted);
    }
    let mut replies: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for send in sends {
        let (i, reply) = send.await.unwrap();
        replies.entry(i).or_default().push(reply);
    }
    // A request whose parser could not run in time (a starved machine) is kept in quarantine
    // and acknowledged all the same: re-parsing the quarantine stores those events (deduped).
    let quarantined: BTreeSet<usize> = replies
        .iter()
        .filter(|(_, replies)| replies.iter().any(|r| r["quarantined"] == true))
        .map(|(i, _)| *i)
        .collect();
    if !quarantined.is_empty() {
        replay_quarantine(&hosts[0]).await;
    }
    // The late duplicates, after everything was sent once.
    for i in (9..distinct).step_by(18) {
        let reply = deliver(nodes.clone(), i, i).await;
        assert_eq!(reply["duplicate"], true, "evt_{i}: {reply}");
    }
    for (i, replies) in &replies {
        let firsts = replies.iter().filter(|r| r["duplicate"] == false).count();
        assert!(firsts <= 1, "evt_{i} was new {firsts} times: {replies:?}");
    }

    let url = &db.url;
    assert_eq!(
        count(
            url,
            "SELECT count(*) FROM quarantine WHERE resolved_at IS NULL"
        ),
        0,
        "every quarantined request was replayed"
    );
    assert_eq!(
        count(url, "SELECT count(*) FROM events WHERE source = 's'"),
        distinct as i64,
        "every acknowledged event stored exactly once"
    );
    wait_settled(url, Duration::from_secs(600)).await;
    let states = psql(url, "SELECT state, count(*) FROM deliveries GROUP BY state");
    let done = count(url, "SELECT count(*) FROM deliveries WHERE state = 'done'");
    let stale = count(url, "SELECT count(*) FROM deliveries WHERE state = 'stale'");
    assert_eq!(done + stale, distinct as i64, "{states}");
    assert_counted_in_order(url);
    assert_eq!(
        count(
            url,
            "SELECT count(*) FROM attempts a JOIN attempts b
               ON a.delivery = b.delivery AND a.attempt < b.attempt
              AND b.started_at < a.finished_at"
        ),
        0,
        "two attempts of one delivery overlapped"
    );
    assert_eq!(
        count(
            url,
            "WITH ran AS (
                SELECT d.ordering_key AS k, d.sequence AS s, a.started_at AS st,
                       a.finished_at AS fin
                FROM deliveries d JOIN attempts a ON a.delivery = d.id
                WHERE d.state = 'done' AND a.outcome = 'ok')
             SELECT count(*) FROM ran x JOIN ran y
               ON x.k = y.k AND x.s < y.s AND y.st < x.fin"
        ),
        0,
        "two events of one ordering key ran out of order or at once"
    );
    let abandoned = count(
        url,
        "SELECT count(*) FROM attempts WHERE outcome = 'abandoned'",
    );
    eprintln!(
        "cluster run: {states:?}, {abandoned} attempts abandoned by the kills, {} requests \
         quarantined and replayed",
        quarantined.len()
    );
}

/// An attempt that ends while PostgreSQL is away is recorded once the server is back, as what
/// it was: not left for its lease to expire into `abandoned` and run the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_ends_while_the_database_is_away_is_recorded_once_it_is_back() {
    let Some(server) = PrivatePostgres::start(
        "an_attempt_that_ends_while_the_database_is_away_is_recorded_once_it_is_back",
    ) else {
        return;
    };
    let db = TestDatabase::create_on(&server.url);
    let config = format!(
        "[server]\ndatabase = \"{}\"\n{}",
        db.url,
        sw_source("s", &["flaky"], "\n[plugins.flaky]\ntimeout_ms = 5000\n")
    );
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("flaky", plugins::FLAKY)]);
    let host = ProcessHost::start(dir.path(), &config).await;
    let body = json!({"sleep_ms": 2000});
    let (status, reply) = support::post_sw(host.ingest, "s", "slow", body.to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let state = |url: &str| psql(url, "SELECT state FROM deliveries").trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&db.url) != "running" {
        assert!(Instant::now() < deadline, "the delivery never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Away from before the handler answers until well after: its first record fails.
    server.down();
    tokio::time::sleep(Duration::from_secs(4)).await;
    server.up();
    // Its lease (5 s + 10 s) has not expired yet: the record lands without a second attempt.
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&db.url) != "done" {
        assert!(Instant::now() < deadline, "the delivery was never done");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let history = psql(
        &db.url,
        "SELECT attempt || ' ' || outcome FROM attempts ORDER BY attempt",
    );
    assert_eq!(history.trim(), "1 ok", "{history}");
}

/// PostgreSQL stopped for 5 s under load and started again: the nodes answer 503 (never a 202
/// without a commit, never a 500) while it is away, and so does `/readyz`; they reconnect by
/// themselves, and every event they acknowledged is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_503s_then_a_reconnect_with_nothing_acknowledged_lost() {
    let Some(server) = PrivatePostgres::start(
        "a_database_outage_is_503s_then_a_reconnect_with_nothing_acknowledged_lost",
    ) else {
        return;
    };
    let db = TestDatabase::create_on(&server.url);
    let config = node_config(&db.url, 2);
    let dirs: Vec<TempDir> = (0..2).map(|_| node_dir()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        hosts.push(ProcessHost::start(dir.path(), &config).await);
    }

    // Each node gets events one after another, recording what it answered.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loads = Vec::new();
    for (n, host) in hosts.iter().enumerate() {
        let (ingest, stop) = (host.ingest, stop.clone());
        loads.push(tokio::spawn(async move {
            let mut answers: Vec<(usize, Result<StatusCode, String>)> = Vec::new();
            let mut i = n * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let body = event_body(i).to_string();
                let answer = support::post_sw(ingest, "s", &format!("evt_{i}"), body.as_bytes())
                    .await
                    .map(|(status, _)| status)
                    .map_err(|e| e.to_string());
                answers.push((i, answer));
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, ready) = hosts[0].admin_get("/readyz").await;
    assert_eq!(
        (status, &ready["status"]),
        (StatusCode::OK, &json!("ready"))
    );
    server.down();
    let down_at = Instant::now();
    // A load balancer's readiness probe sees the outage, and no address or user in the reason
    // (the probe is unauthenticated).
    let (status, unready) = hosts[1].admin_get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{unready}");
    assert_eq!(unready["status"], "unready", "{unready}");
    let reason = unready["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the database ") && !reason.contains("127.0.0.1"),
        "{reason}"
    );
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(down_at.elapsed())).await;
    server.up();
    // Running again: new events are accepted by every node, without a restart.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (n, host) in hosts.iter().enumerate() {
        let id = format!("after_{n}");
        loop {
            let body = json!({"id": id, "key": "after", "seq": n}).to_string();
            let answer = support::post_sw(host.ingest, "s", &id, body.as_bytes()).await;
            if matches!(answer, Ok((StatusCode::ACCEPTED, _))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {n} never recovered: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for host in &hosts {
        let (status, ready) = host.admin_get("/readyz").await;
        assert_eq!(
            (status, &ready["status"]),
            (StatusCode::OK, &json!("ready"))
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    let mut unavailable = 0;
    for load in loads {
        for (i, answer) in load.await.unwrap() {
            match answer {
                Ok(StatusCode::ACCEPTED) => acknowledged.push(i),
                Ok(StatusCode::SERVICE_UNAVAILABLE) => unavailable += 1,
                Ok(status) => panic!("evt_{i}: {status} during the outage"),
                // A connection cut mid-request is not an acknowledgement: the provider retries.
                Err(_) => {}
            }
        }
    }
    assert!(
        unavailable > 0,
        "no 503 while the database was down for 5 s"
    );
    assert!(down_at.elapsed() >= Duration::from_secs(5));
    let stored: BTreeSet<usize> = psql(
        &db.url,
        "SELECT event_id FROM events WHERE event_id LIKE 'evt_%'",
    )
    .lines()
    .map(|id| id.trim_start_matches("evt_").parse().unwrap())
    .collect();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|i| !stored.contains(i))
        .collect();
    assert!(lost.is_empty(), "acknowledged but not stored: {lost:?}");
    // Each refused request does not write a line of its own: a 5 s outage is a line or two
    // per node (at most one per 10 s), however many requests it refused.
    let lines: usize = hosts
        .iter()
        .map(|h| {
            h.log()
                .matches("database unavailable; asking the client to retry")
                .count()
        })
        .sum();
    eprintln!(
        "outage run: {} acknowledged, {unavailable} answered 503, {lines} lines saying so",
        acknowledged.len()
    );
    assert!(
        lines <= 2 * hosts.len() && (lines < unavailable || unavailable <= 2),
        "{lines} lines for {unavailable} refusals"
    );
}

/// A TCP relay to `upstream` that can be frozen: while frozen it keeps every connection open
/// but passes no byte either way, as a server behind a dark address or a frozen network does
/// (no error, no close, just silence).
async fn freezable_relay(upstream: SocketAddr) -> (SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pass = |mut from: tokio::net::tcp::OwnedReadHalf,
                mut to: tokio::net::tcp::OwnedWriteHalf,
                frozen: Arc<std::sync::atomic::AtomicBool>| async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(n) = from.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            while frozen.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let gate = frozen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pass(client_read, server_write, gate.clone()));
            tokio::spawn(pass(server_read, client_write, gate.clone()));
        }
    });
    (addr, frozen)
}

/// A database that stops answering without closing anything (a failover whose old address went
/// dark): an accept is answered 503 + `Retry-After` within the answer timeout (10 s) instead of
/// hanging, and once the database answers again the node accepts without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_silent_is_503s_within_the_answer_timeout() {
    let Some(db) =
        TestDatabase::create("a_database_that_goes_silent_is_503s_within_the_answer_timeout")
    else {
        return;
    };
    // postgres://user:password@host:port/name, with the relay in place of host:port.
    let (head, rest) = db.url.split_once('@').unwrap();
    let (server, path) = rest.split_once('/').unwrap();
    let (relay, frozen) = freezable_relay(server.parse().unwrap()).await;
    let through = format!("{head}@{relay}/{path}");
    let dir = node_dir();
    let host = ProcessHost::start(dir.path(), &node_config(&through, 2)).await;
    let post = |id: &'static str| {
        let body = json!({"id": id, "key": id, "seq": 1}).to_string();
        async move { support::send_sw(host.ingest, "s", id, body.as_bytes()).await }
    };
    let (status, _, body) = post("before").await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");

    frozen.store(true, Ordering::Relaxed);
    let asked = Instant::now();
    // An admin read waits no longer than an accept (before, it waited for as long as the
    // client did: over 100 s).
    let read = async {
        let answer = host.admin_get("/admin/events").await;
        (answer, asked.elapsed())
    };
    let (posted, read) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(40), post("silent")),
        tokio::time::timeout(Duration::from_secs(40), read)
    );
    let (status, headers, body) = posted
        .expect("no answer within 40 s while the database was silent")
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(took < Duration::from_secs(30), "answered after {took:?}");
    let ((status, body), took) = read.expect("no admin answer within 40 s");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        took < Duration::from_secs(30),
        "admin answered after {took:?}"
    );

    frozen.store(false, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = post("after").await.unwrap();
        if status == StatusCode::ACCEPTED {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never accepted again: {status} {body:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Over the backlog bound a new event is refused, but a provider's resend of a stored one is
/// looked up (and answered `duplicate`): that look-up, too, is answered 503 within the answer
/// timeout when the database goes silent (before, it waited for as long as the connection did,
/// holding the request's body budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_over_the_backlog_bound_is_503_within_the_answer_timeout_too() {
    let Some(db) = TestDatabase::create("a_resend_over_the_backlog_bound_is_503_within") else {
        return;
    };
    let (head, rest) = db.url.split_once('@').unwrap();
    let (server, path) = rest.split_once('/').unwrap();
    let (relay, frozen) = freezable_relay(server.parse().unwrap()).await;
    let through = format!("{head}@{relay}/{path}");
    // The handler's file is absent: the first event's delivery waits, and the backlog is full.
    let config = format!(
        "[server]\ndatabase = \"{through}\"\nmax_backlog = 1\n{}",
        sw_source("s", &["absent"], "")
    );
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(dir.path(), &config).await;
    let post = |id: &'static str| async move {
        support::send_sw(host.ingest, "s", id, b"{}").await.unwrap()
    };
    let (status, _, body) = post("first").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body:?}");
    let (status, _, body) = post("first").await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a resend over the bound: {body:?}"
    );

    frozen.store(true, Ordering::Relaxed);
    let asked = Instant::now();
    let (status, headers, body) = tokio::time::timeout(Duration::from_secs(40), post("first"))
        .await
        .expect("no answer within 40 s while the database was silent");
    let took = asked.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(took < Duration::from_secs(30), "answered after {took:?}");
    frozen.store(false, Ordering::Relaxed);
}

/// `POST /admin/plugins/counter/rollback` on `node`.
async fn rollback(node: &ProcessHost) -> (StatusCode, Value) {
    node.admin(
        http::Method::POST,
        "/admin/plugins/counter/rollback",
        Some(support::ADMIN_TOKEN),
        Some(json!({})),
    )
    .await
}

/// Plugin `counter` as node `asked`'s `/admin/plugins` shows it.
async fn counter_on(asked: &ProcessHost) -> Value {
    plugin_on(asked, "counter").await
}

/// Plugin `name` as node `asked`'s `/admin/plugins` shows it.
async fn plugin_on(asked: &ProcessHost, name: &str) -> Value {
    let (status, list) = asked.admin_get("/admin/plugins").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone()
}

/// Every node's live sha256 of `counter`, as node `asked` reports them.
async fn live_everywhere(asked: &ProcessHost) -> BTreeMap<String, Value> {
    serde_json::from_value(counter_on(asked).await["nodes"].clone()).unwrap()
}

/// Waits until each of `hosts` runs version `sha` of `counter`, as every one of them reports it.
async fn wait_everywhere(hosts: &[ProcessHost], sha: &str, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let mut all = true;
        for host in hosts {
            let live = live_everywhere(host).await;
            all &= live.len() == hosts.len() && live.values().all(|v| v == sha);
        }
        if all {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: not every node runs {sha}: {:?}",
            live_everywhere(&hosts[0]).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes `bytes` as `dir/plugins/counter.wasm` in one rename, as a deploy would.
fn drop_file(dir: &std::path::Path, bytes: &[u8]) {
    let plugins = dir.join("plugins");
    std::fs::write(plugins.join(".counter.wasm.part"), bytes).unwrap();
    std::fs::rename(
        plugins.join(".counter.wasm.part"),
        plugins.join("counter.wasm"),
    )
    .unwrap();
}

/// `count` nodes on `config`, each with a directory of its own, once every one runs the first
/// version of `counter` (returned with them).
async fn start_nodes(config: &str, count: usize) -> (Vec<TempDir>, Vec<ProcessHost>, String) {
    let dirs: Vec<TempDir> = (0..count).map(|_| node_dir()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        hosts.push(ProcessHost::start(dir.path(), config).await);
    }
    let first = host::runtime::file_sha256(&std::fs::read(plugins::COUNTER).unwrap());
    wait_everywhere(&hosts, &first, "at start").await;
    (dirs, hosts, first)
}

/// Drops a new version of `counter` (any valid handler) on node `on`; returns its sha256 once
/// every node runs it, and how long that took.
async fn drop_new_version(
    dirs: &[TempDir],
    hosts: &[ProcessHost],
    on: usize,
) -> (String, Duration) {
    let new = std::fs::read(plugins::FLAKY).unwrap();
    let sha = host::runtime::file_sha256(&new);
    drop_file(dirs[on].path(), &new);
    let took = wait_everywhere(hosts, &sha, &format!("after the drop on node {on}")).await;
    (sha, took)
}

/// A plugin file dropped on one node goes live on all three; a corrupt file dropped on another
/// changes nothing anywhere; a rollback on the third is cluster-wide (and repairs the node
/// whose file was corrupt). `/admin/plugins` on every node shows every node's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_dropped_on_one_node_runs_on_all_and_a_corrupt_one_nowhere() {
    let Some(db) =
        TestDatabase::create("a_plugin_dropped_on_one_node_runs_on_all_and_a_corrupt_one_nowhere")
    else {
        return;
    };
    let (dirs, hosts, first) = start_nodes(&node_config(&db.url, 1), 3).await;
    let (second, took) = drop_new_version(&dirs, &hosts, 0).await;
    eprintln!("a dropped plugin was live on all three nodes after {took:?}");

    // A corrupt file on node 1: refused there, never published.
    drop_file(dirs[1].path(), b"\0asm\x01\0\0\0 not a component");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counter = counter_on(&hosts[1]).await;
        if counter["error"].is_string() {
            assert_eq!(counter["sha256"], second.as_str(), "{counter:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the corrupt file was not refused: {counter:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several sync rounds later, every node still runs the second version.
    tokio::time::sleep(Duration::from_secs(3)).await;
    wait_everywhere(&hosts, &second, "after the corrupt file on node 1").await;
    assert_eq!(
        psql(
            &db.url,
            "SELECT sha256 FROM plugin_releases WHERE stem = 'counter'"
        )
        .trim(),
        second
    );

    // A rollback to a version the cluster has no bytes of (one that ran only on the node
    // asked) is refused: the other nodes could not follow, so nothing changes anywhere.
    let stored_as = |from: &str, to: &str| {
        psql(
            &db.url,
            &format!("UPDATE plugin_files SET sha256 = '{to}' WHERE sha256 = '{from}'"),
        )
    };
    let hidden = format!("hidden-{first}");
    stored_as(&first, &hidden);
    let (status, reply) = rollback(&hosts[2]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    let detail = reply["detail"].as_str().unwrap();
    assert!(
        detail.contains(&first) && detail.contains("never published"),
        "{reply}"
    );
    assert_eq!(counter_on(&hosts[2]).await["previous"], json!([first]));
    stored_as(&hidden, &first);
    wait_everywhere(&hosts, &second, "after the refused rollback").await;

    // A rollback on node 2 takes every node back, node 1 included.
    let (status, reply) = rollback(&hosts[2]).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    wait_everywhere(&hosts, &first, "after the rollback on node 2").await;
    // Every node took it as a step back: the version left is no rollback target anywhere, so a
    // second rollback, on another node, has nowhere to go (it does not bring `second` back).
    for (n, host) in hosts.iter().enumerate() {
        let counter = counter_on(host).await;
        assert_eq!(counter["previous"], json!([]), "node {n}: {counter:#}");
    }
    let (status, reply) = rollback(&hosts[0]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reply}");
    let (_, nodes) = hosts[0].admin_get("/admin/nodes").await;
    assert_eq!(nodes.as_array().unwrap().len(), 3, "{nodes:#}");
    assert!(
        nodes.as_array().unwrap().iter().all(|n| n["alive"] == true),
        "{nodes:#}"
    );
}

/// A rollback is the cluster's, whichever node gets it: a node that was down through a rollback
/// comes back with the rolled-back-from version on disk, loads it, then catches up; its own
/// memory then says that version is the previous one, but the cluster's history does not, and a
/// rollback there has nowhere to go, as anywhere else. Before, it answered 200 and took the
/// whole cluster back to the version just rolled back from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_follows_the_clusters_history_on_every_node() {
    let Some(db) = TestDatabase::create("a_rollback_follows_the_clusters_history_on_every_node")
    else {
        return;
    };
    let config = node_config(&db.url, 1);
    let (dirs, mut hosts, first) = start_nodes(&config, 2).await;
    drop_new_version(&dirs, &hosts, 0).await;

    // Node 1 is down through a rollback on node 0.
    hosts.pop().unwrap().kill();
    let (status, reply) = rollback(&hosts[0]).await;
    assert_eq!(
        (status, &reply["sha256"]),
        (StatusCode::OK, &json!(first)),
        "{reply}"
    );
    // The node asked holds the version in its file too, as the nodes that adopt it do. Before,
    // its file kept the version rolled back from, and a later touch of it (a chmod -R) had that
    // version reloaded as new and published back to every node.
    let file = dirs[0].path().join("plugins/counter.wasm");
    let held = host::runtime::file_sha256(&std::fs::read(&file).unwrap());
    assert_eq!(held, first, "{} holds another version", file.display());
    hosts.push(ProcessHost::start(dirs[1].path(), &config).await);
    // From its first answer on, not a tick later: it never serves the version rolled back from,
    // which its file still held (before, it did until its first sync, and claimed meanwhile).
    let restarted = counter_on(&hosts[1]).await;
    assert_eq!(restarted["sha256"], json!(first), "{restarted:#}");
    wait_everywhere(&hosts, &first, "after node 1 came back").await;

    for (n, host) in hosts.iter().enumerate() {
        let counter = counter_on(host).await;
        assert_eq!(counter["previous"], json!([]), "node {n}: {counter:#}");
        let (status, reply) = rollback(host).await;
        assert_eq!(status, StatusCode::CONFLICT, "node {n}: {reply}");
    }
    wait_everywhere(&hosts, &first, "after the refused rollbacks").await;
}

/// A release of a file a node's configuration does not use is written into that node's
/// directory (there if its configuration comes to use it) but never loaded: the node neither
/// runs it nor reports it live. (Before, a node starting after the release compiled and loaded
/// it, and reported that version live ever after, whatever newer one came.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_loads_only_the_plugin_files_its_configuration_uses() {
    let Some(db) =
        TestDatabase::create("a_node_loads_only_the_plugin_files_its_configuration_uses")
    else {
        return;
    };
    let config = node_config(&db.url, 1);
    let dirs = [node_dir(), node_dir()];
    install_plugins(dirs[0].path(), &[("flaky", plugins::FLAKY)]);
    let mut hosts =
        vec![ProcessHost::start(dirs[0].path(), &format!("{config}\n[plugins.flaky]\n")).await];
    hosts.push(ProcessHost::start(dirs[1].path(), &config).await);
    let first = host::runtime::file_sha256(&std::fs::read(plugins::COUNTER).unwrap());
    wait_everywhere(&hosts, &first, "both nodes up").await;
    assert!(
        dirs[1].path().join("plugins/flaky.wasm").exists(),
        "the release was not written"
    );
    let flaky = plugin_on(&hosts[0], "flaky").await;
    // Every node is listed; one that does not run the file, with `null`.
    let running = flaky["nodes"]
        .as_object()
        .unwrap()
        .values()
        .filter(|sha| !sha.is_null())
        .count();
    assert_eq!(running, 1, "{flaky:#}");
}

/// A version the cluster publishes that one node cannot run (here: a parser-only file, where
/// that node's configuration feeds `counter` events as a handler, while the publishing node only
/// declares it) is refused there, and that node's file is given back the version it runs: a
/// restart serves it again. Before, the refused file stayed on disk, and after a restart the
/// node had no `counter` at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_version_one_node_refuses_never_replaces_its_working_file() {
    let Some(db) = TestDatabase::create(
        "a_published_version_one_node_refuses_never_replaces_its_working_file",
    ) else {
        return;
    };
    let publisher_config = format!(
        "[server]\nworkers = 1\ndatabase = \"{}\"\n{}\n[plugins.counter]\n",
        db.url,
        sw_source("s", &[], "")
    );
    let dirs: Vec<TempDir> = (0..2).map(|_| node_dir()).collect();
    let publisher = ProcessHost::start(dirs[0].path(), &publisher_config).await;
    let runner_config = node_config(&db.url, 1);
    let runner = ProcessHost::start(dirs[1].path(), &runner_config).await;
    let first = host::runtime::file_sha256(&std::fs::read(plugins::COUNTER).unwrap());
    let hosts = [publisher, runner];
    wait_everywhere(&hosts, &first, "at start").await;

    let parser = std::fs::read(plugins::GENERIC).unwrap();
    let parser_sha = host::runtime::file_sha256(&parser);
    drop_file(dirs[0].path(), &parser);
    let log = hosts[1]
        .wait_log(
            "its file holds the live version again",
            Duration::from_secs(60),
        )
        .await;
    assert!(
        log.contains("does not export the handler role"),
        "not refused for its role:\n{log}"
    );
    let on_disk = std::fs::read(dirs[1].path().join("plugins/counter.wasm")).unwrap();
    assert_eq!(host::runtime::file_sha256(&on_disk), first);
    let counter = counter_on(&hosts[1]).await;
    assert_eq!(counter["sha256"], first.as_str(), "{counter:#}");
    assert_eq!(
        psql(
            &db.url,
            "SELECT sha256 FROM plugin_releases WHERE stem = 'counter'"
        )
        .trim(),
        parser_sha
    );
    // A restart finds its working file, and keeps it after refusing the release again.
    let [publisher, runner] = hosts;
    runner.kill();
    let runner = ProcessHost::start(dirs[1].path(), &runner_config).await;
    let restored = "its file holds the live version again";
    let deadline = Instant::now() + Duration::from_secs(60);
    while runner.log().matches(restored).count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the restarted node did not refuse the release again:\n{}",
            runner.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counter = counter_on(&runner).await;
    assert_eq!(counter["sha256"], first.as_str(), "{counter:#}");
    drop(publisher);
}

/// A corrupt file written right after a good one went live (a deploy script's next step, or a
/// second drop within the sync's second): the good version is published with the bytes it
/// loaded from, though its file already holds the next one. Before, its publish found no bytes
/// and failed, and the next round took the node back to the cluster's older release, writing
/// that over the file: the working version evicted by a broken file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_whose_file_changed_before_its_publish_is_still_published() {
    let Some(db) =
        TestDatabase::create("a_version_whose_file_changed_before_its_publish_is_still_published")
    else {
        return;
    };
    let (dirs, hosts, _first) = start_nodes(&node_config(&db.url, 1), 1).await;
    let good = std::fs::read(plugins::FLAKY).unwrap();
    let good_sha = host::runtime::file_sha256(&good);
    drop_file(dirs[0].path(), &good);
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter_on(&hosts[0]).await["sha256"] != good_sha.as_str() {
        assert!(
            Instant::now() < deadline,
            "the good version never went live"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop_file(dirs[0].path(), b"\0asm\x01\0\0\0 not a component");
    // Several sync rounds: the good version is the cluster's release, and stays live.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let counter = counter_on(&hosts[0]).await;
    assert_eq!(counter["sha256"], good_sha.as_str(), "{counter:#}");
    assert!(counter["error"].is_string(), "{counter:#}");
    assert_eq!(
        psql(
            &db.url,
            "SELECT sha256 FROM plugin_releases WHERE stem = 'counter'"
        )
        .trim(),
        good_sha
    );
    let on_disk = std::fs::read(dirs[0].path().join("plugins/counter.wasm")).unwrap();
    assert!(
        on_disk.ends_with(b"not a component"),
        "the file was overwritten"
    );
}

/// Two nodes behind PgBouncer in transaction mode (`database_pooler = "transaction"`), sharing
/// its four server connections among their 32 pooled ones, so consecutive transactions of one
/// connection run on different server connections: every event is stored once and handled
/// once, in order per key, though no notice passes between the nodes (they find each other's
/// work by polling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_behind_pgbouncer_in_transaction_mode_handle_every_event_once() {
    let test = "two_nodes_behind_pgbouncer_in_transaction_mode_handle_every_event_once";
    let Some(db) = TestDatabase::create(test) else {
        return;
    };
    let Some(pooler) = pgbouncer_url(test) else {
        return;
    };
    let config = node_config_with(
        &db.through(&pooler),
        2,
        "database_pooler = \"transaction\"\n",
    );
    let dirs: Vec<TempDir> = (0..2).map(|_| node_dir()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        hosts.push(ProcessHost::start(dir.path(), &config).await);
    }
    let nodes: Nodes = Arc::new(RwLock::new(hosts.iter().map(|h| h.ingest).collect()));
    let distinct = 1_000;
    let limit = Arc::new(Semaphore::new(16));
    let mut sends = Vec::new();
    for i in 0..distinct {
        // Every 10th event also goes to the other node at the same moment.
        let firsts: &[usize] = if i % 10 == 0 { &[0, 1] } else { &[0] };
        for first in firsts {
            let (nodes, limit) = (nodes.clone(), limit.clone());
            sends.push(tokio::spawn(async move {
                let _slot = limit.acquire().await.unwrap();
                (i, deliver(nodes, i + first, i).await)
            }));
        }
    }
    let mut new: BTreeMap<usize, usize> = BTreeMap::new();
    let mut quarantined = false;
    for send in sends {
        let (i, reply) = send.await.unwrap();
        *new.entry(i).or_default() += usize::from(reply["duplicate"] == false);
        quarantined |= reply["quarantined"] == true;
    }
    assert!(new.values().all(|n| *n <= 1), "an event new more than once");
    if quarantined {
        replay_quarantine(&hosts[0]).await;
    }
    let url = &db.url;
    assert_eq!(
        count(url, "SELECT count(*) FROM events WHERE source = 's'"),
        distinct as i64
    );
    wait_settled(url, Duration::from_secs(300)).await;
    // Per key, an event overtaken by a later one of its key (16 requests run at once) is stale.
    assert_eq!(
        count(
            url,
            "SELECT count(*) FROM deliveries WHERE state IN ('done', 'stale')"
        ),
        distinct as i64,
        "{}",
        psql(url, "SELECT state, count(*) FROM deliveries GROUP BY state")
    );
    assert_counted_in_order(url);
}

/// A node reaches its database over TLS with the server checked (`sslmode=verify-full`, the
/// CA in `sslrootcert`): it accepts events, and the server sees every one of its sessions
/// encrypted. Asked to check a name the server's certificate does not hold, it does not start,
/// and says why without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_its_database_over_verified_tls_or_not_at_all() {
    let test = "a_node_reaches_its_database_over_verified_tls_or_not_at_all";
    let Some(db) = TestDatabase::create(test) else {
        return;
    };
    let Some(ca) = server_ca(test) else {
        return;
    };
    // The server's certificate names `localhost`, not the address the tests use.
    let by_name = db.url.replacen("@127.0.0.1:", "@localhost:", 1);
    assert_ne!(by_name, db.url, "the test server is at 127.0.0.1");
    let tls = format!("sslmode=verify-full&sslrootcert={ca}&application_name=hookd_tls_node");
    let dir = node_dir();
    let node = ProcessHost::start(dir.path(), &node_config(&format!("{by_name}?{tls}"), 2)).await;
    let (status, reply) = support::post_sw(
        node.ingest,
        "s",
        "evt_tls",
        event_body(0).to_string().as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(
        count(
            &db.url,
            "SELECT count(*) FROM events WHERE event_id = 'evt_0'"
        ),
        1
    );
    let sessions = psql(
        &db.url,
        "SELECT count(*) FILTER (WHERE s.ssl) || ' ' || count(*) FILTER (WHERE NOT s.ssl)
         FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid
         WHERE a.application_name = 'hookd_tls_node'",
    );
    let (encrypted, plain) = sessions.trim().split_once(' ').unwrap();
    assert!(
        encrypted.parse::<u32>().unwrap() >= 2 && plain == "0",
        "the node's sessions, TLS and plain: {sessions}"
    );
    drop(node);

    let refused = node_dir();
    let [listen, admin_listen] = support::free_ports();
    std::fs::write(
        refused.path().join("hookd.toml"),
        support::config_text(&node_config(&format!("{}?{tls}", db.url), 2)).replacen(
            "[server]",
            &format!("[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin_listen}\""),
            1,
        ),
    )
    .unwrap();
    let out = support::hookd_cli(refused.path(), &["serve"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("not valid for name") && stderr.contains("hookd@127.0.0.1:"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("hookd:hookd@"),
        "the password is never shown: {stderr}"
    );
}

/// libfaketime's preload library (Debian's `libfaketime`), which runs a process on a shifted
/// clock; `None` after saying why the test is skipped, and a failure where the PostgreSQL
/// tests are required (CI installs it).
fn libfaketime(test: &str) -> Option<PathBuf> {
    let found = std::fs::read_dir("/usr/lib").ok().and_then(|dirs| {
        dirs.flatten()
            .map(|dir| dir.path().join("faketime/libfaketime.so.1"))
            .find(|library| library.exists())
    });
    if found.is_none() {
        assert!(
            std::env::var("HOOKD_TEST_POSTGRES_REQUIRED").as_deref() != Ok("1"),
            "{test}: no /usr/lib/*/faketime/libfaketime.so.1 (apt-get install libfaketime)"
        );
        eprintln!("{test}: skipped: libfaketime is not installed");
    }
    found
}

/// A node whose own clock runs ten minutes ahead (libfaketime) takes back no lease another node
/// still holds: every node stamps and compares leases on the database server's clock. Node 1
/// runs an attempt whose outbound call is never answered while the test runs (a lease of its
/// 5-minute timeout plus the margin); node 2 starts meanwhile on the skewed clock, and after
/// its start-up reclaim and a few of its periodic ones the attempt is still node 1's first,
/// never abandoned, and the call was made once (on its own clock node 2 saw that lease expired
/// at once). An event node 2 accepts (signed by its own clock, which the signature check
/// reads) is handled at once, and its `/metrics` show the offset it follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_runs_ahead_takes_back_no_lease_still_held() {
    const TEST: &str = "a_node_whose_clock_runs_ahead_takes_back_no_lease_still_held";
    const AHEAD: Duration = Duration::from_secs(600);
    let Some(db) = TestDatabase::create(TEST) else {
        return;
    };
    let Some(faketime) = libfaketime(TEST) else {
        return;
    };
    let mock =
        Mock::start(|_, _| Reply::new(StatusCode::OK, "ok").after(Duration::from_secs(3600))).await;
    let extra = format!(
        "[plugins.h]\ntimeout_ms = 300000\nallow_hosts = [\"127.0.0.1:{}\"]\n",
        mock.port()
    );
    let config = format!(
        "[server]\ndatabase = \"{}\"\n{}",
        db.url,
        sw_source("s", &["h"], &extra)
    );
    let dirs: Vec<TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for dir in &dirs {
        install_plugins(dir.path(), &[("h", plugins::SCENARIO)]);
    }
    let one = ProcessHost::start(dirs[0].path(), &config).await;
    let url = format!("http://127.0.0.1:{}/slow", mock.port());
    let body = json!({"do": "fetch", "url": url}).to_string();
    let (status, reply) = support::post_sw(one.ingest, "s", "evt_1", body.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while mock.seen().is_empty() {
        assert!(Instant::now() < deadline, "node 1 never made the call");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let offset = format!("+{}", AHEAD.as_secs());
    let ahead = [
        ("LD_PRELOAD", faketime.to_str().unwrap()),
        ("FAKETIME", offset.as_str()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let two = ProcessHost::start_with_env(dirs[1].path(), &config, &ahead).await;
    two.wait_log("ms ahead of the database server's", Duration::from_secs(10))
        .await;
    // The start-up reclaim has run; so do three periodic ones (one a second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, event) = two.admin_get("/admin/events/s/evt_1").await;
    assert_eq!(status, StatusCode::OK, "{event}");
    let delivery = support::delivery_of(&event, "h").unwrap();
    assert_eq!(delivery["state"], "running", "{delivery:#}");
    assert_eq!(delivery["attempts"], 1, "{delivery:#}");
    assert!(
        support::outcomes(&delivery).is_empty(),
        "an attempt was ended under node 1: {delivery:#}"
    );
    assert_eq!(mock.seen().len(), 1, "the call was made again");

    // What node 2 accepts is due at once on every node: its receipt time is the database's
    // clock (on its own clock the delivery would wait ten minutes).
    let body = json!({"do": "count", "key": "k"}).to_string();
    let headers = support::sign(
        &Scheme::StandardWebhooks,
        support::SW_SECRET,
        "evt_2",
        body.as_bytes(),
        SystemTime::now() + AHEAD,
    );
    let (status, reply) = two.post("s", &headers, body.as_bytes()).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    two.wait_state("s", "evt_2", "h", "done", Duration::from_secs(30))
        .await;
    // And its metrics say how far out its clock is.
    let (_, metrics) = two.admin_get("/metrics").await;
    let offset: f64 = metrics
        .as_str()
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("hookd_clock_offset_seconds "))
        .expect("the clock offset series")
        .trim()
        .parse()
        .unwrap();
    assert!((-605.0..-595.0).contains(&offset), "offset {offset} s");
}

/// What a node reads from the database is written into its `plugins_dir` only as a release a
/// node could have published: a release whose name is a path (`../escaped`) is ignored, and
/// stored bytes that do not hash to their release's sha256 are not written. Before, anyone able
/// to write the database could write a file anywhere hookd's user may, on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_naming_a_path_or_with_bytes_of_another_hash_are_never_written() {
    let Some(db) = TestDatabase::create("releases_naming_a_path_or_with_bytes_of_another_hash")
    else {
        return;
    };
    let dir = node_dir();
    let node = ProcessHost::start(dir.path(), &node_config(&db.url, 1)).await;
    let counter = host::runtime::file_sha256(&std::fs::read(plugins::COUNTER).unwrap());
    wait_everywhere(std::slice::from_ref(&node), &counter, "at start").await;
    let forged = "f".repeat(64);
    psql(
        &db.url,
        &format!(
            "INSERT INTO plugin_releases (stem, sha256, version, node) \
             VALUES ('../escaped', '{counter}', nextval('plugin_release_versions'), 'intruder');
             INSERT INTO plugin_files (sha256, bytes) \
             SELECT '{forged}', bytes FROM plugin_files WHERE sha256 = '{counter}';
             INSERT INTO plugin_releases (stem, sha256, version, node) \
             VALUES ('tampered', '{forged}', nextval('plugin_release_versions'), 'intruder');"
        ),
    );
    node.wait_log(
        "a cluster release names no plugin file",
        Duration::from_secs(30),
    )
    .await;
    let log = node
        .wait_log(
            &format!("plugin tampered version {forged} hash to {counter}"),
            Duration::from_secs(30),
        )
        .await;
    assert!(!dir.path().join("escaped.wasm").exists(), "{log}");
    assert!(!dir.path().join("plugins/tampered.wasm").exists(), "{log}");
}

/// A node stopped gracefully leaves the node list at once; one killed stays listed, not alive,
/// until forgotten. Before, every graceful restart (a new id each start) left a row listed for
/// a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_gracefully_leaves_the_node_list() {
    let Some(db) = TestDatabase::create("a_node_stopped_gracefully_leaves_the_node_list") else {
        return;
    };
    let (_dirs, mut hosts, _) = start_nodes(&node_config(&db.url, 1), 3).await;
    let ids = |nodes: &Value| -> usize { nodes.as_array().unwrap().len() };
    let (_, nodes) = hosts[0].admin_get("/admin/nodes").await;
    assert_eq!(ids(&nodes), 3, "{nodes:#}");
    let stopping = hosts.pop().unwrap();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &stopping.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    hosts.pop().unwrap().kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, nodes) = hosts[0].admin_get("/admin/nodes").await;
        if ids(&nodes) == 2 {
            let alive: Vec<&Value> = nodes
                .as_array()
                .unwrap()
                .iter()
                .map(|n| &n["alive"])
                .collect();
            assert!(alive.contains(&&json!(true)), "{nodes:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stopped node is still listed: {nodes:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(stopping);
}

/// A plugin's `max_concurrency` holds across the nodes: with a cap of 1, no two attempts of it
/// overlap in time, whichever nodes run them. Before, each node counted only its own attempts,
/// and two nodes ran two at once (a cap set for a rate-limited API, doubled by a second node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_holds_across_the_nodes() {
    let Some(db) = TestDatabase::create("max_concurrency_holds_across_the_nodes") else {
        return;
    };
    let config = format!(
        "[server]\nworkers = 4\ndatabase = \"{}\"\n{}\n[plugins.slow]\nwasm = \"flaky\"\n\
         max_concurrency = 1\n",
        db.url,
        sw_source("q", &["slow"], "")
    );
    let dirs: Vec<TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        install_plugins(dir.path(), &[("flaky", plugins::FLAKY)]);
        hosts.push(ProcessHost::start(dir.path(), &config).await);
    }
    const EVENTS: usize = 8;
    for i in 0..EVENTS {
        let body = json!({"sleep_ms": 1000}).to_string();
        let (status, reply) =
            support::post_sw(hosts[i % 2].ingest, "q", &format!("e{i}"), body.as_bytes())
                .await
                .unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    }
    for i in 0..EVENTS {
        hosts[0]
            .wait_state(
                "q",
                &format!("e{i}"),
                "slow",
                "done",
                Duration::from_secs(60),
            )
            .await;
    }
    let ran = psql(
        &db.url,
        "SELECT a.started_at || ' ' || a.finished_at FROM attempts a
           JOIN deliveries d ON d.id = a.delivery WHERE d.handler = 'slow'
          ORDER BY a.started_at",
    );
    let spans: Vec<(i64, i64)> = ran
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect();
    assert_eq!(spans.len(), EVENTS, "{ran}");
    // The next lease follows the last finish's commit, but is stamped with the time its claim
    // was asked for, which may be before that commit: well under the attempts' second apart
    // (two nodes running at once overlap by most of it).
    for pair in spans.windows(2) {
        assert!(
            pair[1].0 + 300 >= pair[0].1,
            "two attempts overlapped: {ran}"
        );
    }
}

/// A rollback the cluster took is answered as done even when this node cannot write the
/// version into its own file (here a directory in the way of its temporary file): the error is
/// logged. Before, a 500 after the rollback had committed, and a retry took the cluster back
/// one more version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_taken_is_answered_as_done_when_this_nodes_file_cannot_be_written() {
    let Some(db) = TestDatabase::create("a_rollback_taken_is_answered_as_done_when_file_fails")
    else {
        return;
    };
    let (dirs, hosts, first) = start_nodes(&node_config(&db.url, 1), 2).await;
    drop_new_version(&dirs, &hosts, 0).await;
    let in_the_way = dirs[0].path().join("plugins/.counter.wasm.tmp");
    std::fs::create_dir(&in_the_way).unwrap();
    std::fs::write(in_the_way.join("x"), b"").unwrap();
    let (status, reply) = rollback(&hosts[0]).await;
    assert_eq!(
        (status, &reply["sha256"]),
        (StatusCode::OK, &json!(first)),
        "{reply}"
    );
    hosts[0]
        .wait_log(
            "this node's file still holds the version rolled back from",
            Duration::from_secs(30),
        )
        .await;
    wait_everywhere(&hosts, &first, "after the rollback").await;
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// Waits up to `timeout` for `sql` (one number) to read `want` on `url`.
async fn wait_count(url: &str, sql: &str, want: i64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let now = count(url, sql);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{sql}: {now}, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node frozen with its connection up (SIGSTOP: a paused VM or container) reads none of its
/// notices, which PostgreSQL keeps for it in a queue that, once full, refuses every node's
/// accepts. Another node ends that listening session once it has been blocked for 30 s; the
/// frozen node, once it runs again, listens anew and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_nodes_listener_is_ended_by_another_and_it_listens_again_once_resumed() {
    let Some(db) = TestDatabase::create(
        "a_frozen_nodes_listener_is_ended_by_another_and_it_listens_again_once_resumed",
    ) else {
        return;
    };
    let (_dirs, hosts, _) = start_nodes(&node_config(&db.url, 1), 2).await;
    let listeners = "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND query = 'LISTEN hookd_work'";
    let blocked = format!("{listeners} AND wait_event = 'ClientWrite'");
    wait_count(&db.url, listeners, 2, Duration::from_secs(10)).await;
    signal(hosts[1].pid(), "STOP");
    // Notices enough to fill the frozen node's socket (3 000 of ~8 kB, distinct).
    psql(
        &db.url,
        "SELECT count(pg_notify('hookd_work', i::text || repeat('x', 7900)))
         FROM generate_series(1, 3000) i",
    );
    wait_count(&db.url, &blocked, 1, Duration::from_secs(10)).await;
    let started = Instant::now();
    hosts[0]
        .wait_log("ended a node's listening session", Duration::from_secs(60))
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(25),
        "ended after {:?}, before it was seen blocked for 30 s",
        started.elapsed()
    );
    wait_count(&db.url, listeners, 1, Duration::from_secs(10)).await;
    signal(hosts[1].pid(), "CONT");
    hosts[1]
        .wait_log(
            "lost the connection that hears other nodes' work",
            Duration::from_secs(10),
        )
        .await;
    wait_count(&db.url, listeners, 2, Duration::from_secs(20)).await;
    let (status, reply) = support::post_sw(
        hosts[1].ingest,
        "s",
        "evt_resumed",
        event_body(1).to_string().as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    wait_settled(&db.url, Duration::from_secs(30)).await;
    assert!(
        !hosts[1].log().contains("ended a node's listening session"),
        "the resumed node ended no session"
    );
}
