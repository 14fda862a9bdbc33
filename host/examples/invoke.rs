//! Benchmark: the cost of one plugin invocation (fresh store + instantiate + call), as the
//! dispatcher pays it, with a real `counter` component and a real inbox as its state store.
//!
//! ```sh
//! cargo build --release -p tests   # builds the wasm plugins into target/wasm-plugins
//! cargo run --release -p host --example invoke -- \
//!     target/wasm-plugins/wasm32-wasip2/release/counter.wasm [CALLS] [PARSER_WASM]
//! ```
//!
//! Prints the median, p90, p99 and max of `Runtime::handle` over CALLS sequential calls (after a
//! warm-up), then calls/s with 64 calls in flight on two threads (the size of hookd's wasm pool).
//! With PARSER_WASM (e.g. `github.wasm`), also times `Runtime::parse` on a ~1.5 KB GitHub body:
//! the Wasm part of every ingest request. The state reads hit SQLite; the writes are returned,
//! not committed (committing is the dispatcher's transaction, measured end to end by bench/).
//!
//! `invoke --languages NAME=WASM... [--calls N]` compares handlers written in different
//! languages doing the same work (the `scenario` test plugin and its JavaScript and Python twins,
//! asked `{"do":"stale"}`: parse the body, answer a small JSON): for each, the time to compile
//! the component (what a cold start pays; the artifact cache saves it on a warm one) and the
//! instantiate + call latency.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use host::{
    config::Durability,
    ids::{EventId, PluginName},
    inbox::Inbox,
    outbound::{AllowList, Outbound},
    runtime::{
        CallContext, EventInput, HandleVerdict, Limits, ParseRequest, ParseVerdict, Plugin,
        Runtime, StateStore,
    },
};

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--languages") {
        return languages(std::env::args().skip(2).collect());
    }
    let mut args = std::env::args().skip(1);
    let handler_wasm = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: invoke HANDLER_WASM [CALLS] [PARSER_WASM]"))?;
    let calls: usize = args.next().map_or(Ok(20_000), |n| n.parse())?;
    let parser_wasm = args.next();

    let dir = tempfile::tempdir()?;
    let inbox = Inbox::open(&dir.path().join("bench.db"), Durability::Full)?;
    let runtime = Runtime::new()?;
    println!("pooling allocator: {}", runtime.pooling());
    let handler = Arc::new(load(&runtime, &handler_wasm)?);

    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    single
        .block_on(async { anyhow::Ok(runtime.typecheck(&handler, &Default::default()).await?) })?;

    // Sequential: the latency of one invocation.
    let state: Arc<dyn StateStore> = Arc::new(inbox.clone());
    let mut samples = Vec::with_capacity(calls);
    single.block_on(async {
        for i in 0..calls + calls / 10 {
            let started = Instant::now();
            call_handler(&runtime, &handler, state.clone(), i, COUNTER_BODY).await?;
            if i >= calls / 10 {
                samples.push(started.elapsed());
            }
        }
        anyhow::Ok(())
    })?;
    report(
        &format!("handler {handler_wasm} instantiate+call"),
        &mut samples,
    );

    // Concurrent: calls/s on a pool of one thread per core (hookd's default `wasm_threads`)
    // with 64 calls in flight.
    let pool = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(host::config::cores())
        .enable_all()
        .build()?;
    let per_task = calls.div_ceil(64);
    let started = Instant::now();
    pool.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let (runtime, handler, state) = (runtime.clone(), handler.clone(), state.clone());
                tokio::spawn(async move {
                    for i in 0..per_task {
                        let i = t * per_task + i;
                        call_handler(&runtime, &handler, state.clone(), i, COUNTER_BODY).await?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })?;
    let elapsed = started.elapsed();
    println!(
        "handler calls/s with 64 in flight on 2 threads: {:.0} ({} calls in {:.2} s)",
        (per_task * 64) as f64 / elapsed.as_secs_f64(),
        per_task * 64,
        elapsed.as_secs_f64()
    );

    if let Some(parser_wasm) = parser_wasm {
        let parser = load(&runtime, &parser_wasm)?;
        single.block_on(async {
            anyhow::Ok(runtime.typecheck(&parser, &Default::default()).await?)
        })?;
        let body = github_body();
        let mut samples = Vec::with_capacity(calls);
        single.block_on(async {
            for i in 0..calls + calls / 10 {
                let started = Instant::now();
                call_parser(&runtime, &parser, &body, i).await?;
                if i >= calls / 10 {
                    samples.push(started.elapsed());
                }
            }
            anyhow::Ok(())
        })?;
        report(
            &format!(
                "parser {parser_wasm} instantiate+call ({} B body)",
                body.len()
            ),
            &mut samples,
        );
    }
    inbox.close();
    Ok(())
}

/// What the counter is asked (anything: it counts).
const COUNTER_BODY: &[u8] = br#"{"action":"created"}"#;

/// `--languages NAME=WASM... [--calls N]`: compile, load and call each handler.
fn languages(args: Vec<String>) -> anyhow::Result<()> {
    let mut calls = 2_000;
    let mut handlers = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--calls" {
            calls = args.next().unwrap_or_default().parse()?;
        } else {
            let (name, wasm) = arg
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("expected NAME=WASM, got {arg:?}"))?;
            handlers.push((name.to_owned(), wasm.to_owned()));
        }
    }
    let dir = tempfile::tempdir()?;
    let inbox = Inbox::open(&dir.path().join("bench.db"), Durability::Full)?;
    let state: Arc<dyn StateStore> = Arc::new(inbox.clone());
    let runtime = Runtime::new()?;
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for (name, wasm) in handlers {
        let bytes = std::fs::read(&wasm).map_err(|e| anyhow::anyhow!("reading {wasm}: {e}"))?;
        let started = Instant::now();
        let plugin = load(&runtime, &wasm)?;
        let compiled = started.elapsed();
        single.block_on(async {
            anyhow::Ok(runtime.typecheck(&plugin, &Default::default()).await?)
        })?;
        let mut samples = Vec::with_capacity(calls);
        single.block_on(async {
            for i in 0..calls + calls / 10 {
                let started = Instant::now();
                call_handler(&runtime, &plugin, state.clone(), i, br#"{"do":"stale"}"#).await?;
                if i >= calls / 10 {
                    samples.push(started.elapsed());
                }
            }
            anyhow::Ok(())
        })?;
        println!(
            "{name}: {:.1} MB component, compiled in {:.2} s",
            bytes.len() as f64 / 1e6,
            compiled.as_secs_f64(),
        );
        report(&format!("{name} instantiate+call"), &mut samples);
    }
    inbox.close();
    Ok(())
}

fn load(runtime: &Runtime, path: &str) -> anyhow::Result<Plugin> {
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {path}: {e}"))?;
    runtime
        .compile(&bytes)
        .map_err(|e| anyhow::anyhow!("compiling {path}: {e}"))
}

fn limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(30),
        timeout_key: "timeout_ms",
        memory_bytes: 64 << 20,
        memory_key: "memory_mib",
        pool_share: host::runtime::PoolShare::Handlers,
        output_bytes: 64 * 1024,
        log_bytes: 64 * 1024,
    }
}

async fn call_handler(
    runtime: &Runtime,
    plugin: &Plugin,
    state: Arc<dyn StateStore>,
    i: usize,
    body: &[u8],
) -> anyhow::Result<()> {
    let ctx = CallContext {
        plugin: PluginName::from("counter"),
        config: Arc::default(),
        event: Some(EventId::new(format!("evt-{i}"))),
        limits: limits(),
    };
    let input = EventInput {
        source: "bench".into(),
        event_id: format!("evt-{i}"),
        event_type: "bench.created".into(),
        ordering_key: None,
        sequence: None,
        stale: false,
        attempt: 1,
        received_at_ms: 0,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_vec(),
    };
    let outbound = Outbound {
        allow: AllowList::default(),
        tls: host::outbound::tls::default_client(),
        credentials: Default::default(),
        idempotency_key: format!("bench:evt-{i}:counter"),
        meter: host::telemetry::OutboundMeter::detached(),
    };
    let (verdict, _changes) = runtime.handle(plugin, &ctx, state, input, outbound).await;
    match verdict {
        Ok(HandleVerdict::Ok(_)) => Ok(()),
        other => Err(anyhow::anyhow!("call {i}: unexpected verdict {other:?}")),
    }
}

async fn call_parser(
    runtime: &Runtime,
    plugin: &Plugin,
    body: &[u8],
    i: usize,
) -> anyhow::Result<()> {
    let ctx = CallContext {
        plugin: PluginName::from("github"),
        config: Arc::default(),
        event: None,
        limits: limits(),
    };
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("x-github-event".to_owned(), "issues".to_owned()),
        ("x-github-delivery".to_owned(), format!("bench-{i}")),
    ];
    match runtime
        .parse(
            plugin,
            &ctx,
            ParseRequest {
                source: "github",
                method: "POST",
                query: "",
                headers: &headers,
                body,
                received_at_ms: 0,
            },
        )
        .await
    {
        Ok(ParseVerdict::Envelope(_)) => Ok(()),
        other => Err(anyhow::anyhow!("parse {i}: unexpected verdict {other:?}")),
    }
}

/// A GitHub `issues.opened` body of about 1.5 KB, like bench/corpus.py writes.
fn github_body() -> Vec<u8> {
    let text = "the app crashes on start after upgrading to the new release ".repeat(18);
    serde_json::to_vec(&serde_json::json!({
        "action": "opened",
        "issue": {
            "url": "https://api.github.com/repos/acme/widgets/issues/1042",
            "id": 900000042, "number": 1042, "title": "App crashes on start",
            "user": {"login": "user1", "id": 1, "type": "User"}, "labels": [], "state": "open",
            "comments": 0, "created_at": "2026-05-01T12:00:00Z",
            "updated_at": "2026-05-01T12:00:00Z", "author_association": "NONE", "body": text,
        },
        "repository": {
            "id": 123456789, "name": "widgets", "full_name": "acme/widgets", "private": false,
            "owner": {"login": "acme", "id": 4242, "type": "Organization"},
            "html_url": "https://github.com/acme/widgets", "default_branch": "main",
        },
        "sender": {"login": "user1", "id": 1, "type": "User"},
    }))
    .expect("json")
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{what}: median {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us ({} calls)",
        us(at(0.5)),
        us(at(0.9)),
        us(at(0.99)),
        us(samples[samples.len() - 1]),
        samples.len()
    );
}
