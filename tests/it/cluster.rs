//! Several `hookd serve` nodes on one PostgreSQL database, as real processes: what one node
//! acknowledges no node loses, the nodes never run one delivery (or one ordering key) twice at
//! once, and the database going away is a 503 and a reconnect, not a loss.
//!
//! The stored rows are read with `psql`, as an operator would: the attempt history is where
//! "never on two nodes at once" can be seen.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::Semaphore;

use crate::{
    postgres::{PrivatePostgres, TestDatabase, psql},
    support::{self, KEYED_BY_BODY, ProcessHost, install_plugins, plugins, sw_source},
};

/// Ordering keys the events are spread over.
const KEYS: usize = 50;

/// A node of the cluster: `workers` workers on `database`, source `s` (keyed by body) feeding
/// `counter`, which counts per ordering key.
fn node_config(database: &str, workers: usize) -> String {
    let extra = format!(
        "{KEYED_BY_BODY}\n\n[plugins.counter]\ntimeout_ms = 10000\nconfig = {{ per_key = \"true\" }}\n"
    );
    format!(
        "[server]\nworkers = {workers}\ndatabase = \"{database}\"\n{}",
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

/// 20 000 signed events (18 000 distinct, 10% duplicates: half of those sent to two nodes at
/// the same moment, half resent later) spread over three nodes, one of which is SIGKILLed and
/// restarted twice under the load (50 ordering keys). Every event is stored once; per key,
/// `counter`'s outputs in sequence order are exactly `1..N` over the deliveries done (an update
/// lost, applied twice or out of order would break the run); no
/// delivery's attempts overlap in time, and per ordering key the handled events ran one after
/// the other in sequence order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_lose_nothing_and_never_overlap_while_one_is_killed_twice() {
    let Some(db) = TestDatabase::create(
        "three_nodes_lose_nothing_and_never_overlap_while_one_is_killed_twice",
    ) else {
        return;
    };
    const DISTINCT: usize = 18_000;
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
    for i in 0..DISTINCT {
        send(i, i);
        if i % 18 == 0 {
            // A concurrent duplicate, to another node at the same moment.
            send(i, i + 1);
        }
    }

    // SIGKILL node 1 twice under the load, restarting it on the same directory.
    for threshold in [DISTINCT / 3, 2 * DISTINCT / 3] {
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
    // The late duplicates, after everything was sent once.
    for i in (9..DISTINCT).step_by(18) {
        let reply = deliver(nodes.clone(), i, i).await;
        assert_eq!(reply["duplicate"], true, "evt_{i}: {reply}");
    }
    for (i, replies) in &replies {
        let firsts = replies.iter().filter(|r| r["duplicate"] == false).count();
        assert!(firsts <= 1, "evt_{i} was new {firsts} times: {replies:?}");
    }

    let url = &db.url;
    assert_eq!(
        count(url, "SELECT count(*) FROM events WHERE source = 's'"),
        DISTINCT as i64,
        "every acknowledged event stored exactly once"
    );
    wait_settled(url, Duration::from_secs(600)).await;
    let states = psql(url, "SELECT state, count(*) FROM deliveries GROUP BY state");
    let done = count(url, "SELECT count(*) FROM deliveries WHERE state = 'done'");
    let stale = count(url, "SELECT count(*) FROM deliveries WHERE state = 'stale'");
    assert_eq!(done + stale, DISTINCT as i64, "{states}");
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
    eprintln!("cluster run: {states:?}, {abandoned} attempts abandoned by the kills");
}

/// PostgreSQL stopped for 5 s under load and started again: the nodes answer 503 (never a 202
/// without a commit, never a 500) while it is away, reconnect by themselves, and every event
/// they acknowledged is there afterwards.
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
    server.down();
    let down_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
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
    eprintln!(
        "outage run: {} acknowledged, {unavailable} answered 503",
        acknowledged.len()
    );
}
