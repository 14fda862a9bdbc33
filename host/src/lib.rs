//! hookd receives webhooks, verifies them over the raw bytes, stores them durably and deduped,
//! and runs the code that reacts to them as sandboxed WebAssembly components.
//!
//! # Layout
//!
//! A request flows top to bottom; each module is a room with one job:
//!
//! - [`config`]: `hookd.toml` → a validated [`config::Config`] (the file format is a contract).
//! - [`verify`]: signature schemes, a crate of its own (`host/verify`) so that "pure: no I/O,
//!   clock injected" is checked by its dependencies; the only code that knows a signature format
//!   or a scheme name, and the only way to make a [`verify::Verified`] request.
//! - [`ingest`]: the HTTP edge, `POST /hooks/{source}`: body caps and timeouts, verify, envelope
//!   (parser plugin), durable accept, the contract's status codes.
//! - [`inbox`]: the durable store, one storage contract with two backends behind it, the only
//!   code that speaks SQL: SQLite (`inbox/sqlite/`, one writer thread, group commit) and
//!   PostgreSQL (`inbox/postgres/`, for nodes sharing one database).
//! - [`dispatch`]: workers that lease due deliveries (its producer loop), run each attempt and
//!   record its outcome; [`dispatch::policy`] classifies results and decides retries, purely.
//! - [`runtime`]: wasmtime. The only module that imports it: compile, type-check, sandbox, call.
//! - [`outbound`]: what a handler may reach over HTTP (the allow-list policy, pure) and the
//!   client that reaches it; the runtime's `wasi:http` hooks use both.
//! - [`registry`]: which version of each plugin file is live; build-then-swap, rollback.
//! - [`reload`]: watches `plugins_dir` and feeds changed files to the registry.
//! - [`retention`]: the background pruner of finished work, and discard (closing dead
//!   deliveries and held quarantine).
//! - [`admin`]: `/healthz`, `/metrics` and the token-protected `/admin/*` API (Host and Origin
//!   checked; the token configured or generated beside the database).
//! - [`telemetry`]: every metric's name and labels, the host's own Prometheus recorder, the
//!   sampled database figures, and the last hour in memory for the dashboard.
//! - [`server`]: the hardened accept loop both listeners use.
//! - [`cli`]: the `hookd` commands (listed in its own docs).
//! - [`clock`]: where "now" comes from (the system, or tokio's clock in tests).
//! - [`model`], [`ids`], [`error`]: shared vocabulary, newtypes, and the one HTTP error type.
//! - [`text`]: untrusted text capped and escaped before it is stored or logged.
//! - [`tls`]: what every TLS client of hookd trusts (plugins' requests, PostgreSQL).
//!
//! [`run`] wires them together; `main.rs` only parses arguments.
//!
//! `docs/architecture.md` has the entry points, the invariants, a glossary of the outcome enums
//! (who makes each, who reads it) and the contracts that may not change casually.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod ids;
pub mod inbox;
pub mod ingest;
pub mod model;
pub mod outbound;
pub mod registry;
pub mod reload;
pub mod retention;
pub mod runtime;
pub mod server;
pub mod telemetry;
pub mod text;
pub mod tls;

/// Signature schemes: the `hookd-verify` crate, at its old path.
pub use verify;

use std::sync::Arc;

use anyhow::Context;
use tokio::{net::TcpListener, sync::watch};

use crate::{
    clock::Clock,
    config::{Config, Database},
    dispatch::Dispatcher,
    inbox::{Inbox, OpenOptions},
    registry::Registry,
    runtime::Runtime,
    telemetry::Telemetry,
};

/// What the HTTP handlers share.
pub struct Shared {
    pub config: Arc<Config>,
    pub inbox: Inbox,
    pub registry: Arc<Registry>,
    pub runtime: Arc<Runtime>,
    /// This process as a node of its cluster (of one, on SQLite).
    pub node: Arc<cluster::Node>,
    /// This host's metrics (`/metrics`) and the last hour of them (the dashboard).
    pub telemetry: Arc<Telemetry>,
}

/// The already-bound listeners `run` serves (tests bind port 0).
pub struct Listeners {
    pub ingest: TcpListener,
    pub admin: TcpListener,
}

/// How long an address still in use is retried at start-up: a previous process that was just
/// killed holds its listening socket for a few milliseconds more (as long as the database's
/// lock is waited for).
const BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Listeners {
    /// Binds the configured addresses, waiting up to [`BIND_WAIT`] for one still in use.
    pub async fn bind(config: &Config) -> anyhow::Result<Self> {
        let ingest = bind_waiting(config.server.listen, "server.listen").await?;
        let admin = bind_waiting(config.server.admin_listen, "server.admin_listen").await?;
        Ok(Self { ingest, admin })
    }
}

/// Binds `addr` (the value of config key `key`), retrying while it is in use for up to
/// [`BIND_WAIT`].
async fn bind_waiting(addr: std::net::SocketAddr, key: &str) -> anyhow::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + BIND_WAIT;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(e).with_context(|| {
                    format!(
                        "binding {key} {addr}: still in use after {} s (another hookd, or \
                         another program, listens there)",
                        BIND_WAIT.as_secs()
                    )
                });
            }
            Err(e) => return Err(e).with_context(|| format!("binding {key} {addr}")),
        }
    }
}

/// How [`run_with`] runs hookd beyond its configuration; [`run`] takes the defaults.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Where dispatch takes "now" from: the system clock, or tokio's (`Clock::tokio`) in tests
    /// that drive leases and backoffs with a paused clock.
    pub clock: Clock,
}

/// Raises the open-files limit as far as it goes and caps handlers' outbound sockets so the
/// listeners, at their `server.max_connections`, still have room, each plugin that may send
/// requests to its share (see `outbound::sockets`).
fn limit_outbound_sockets(runtime: &Runtime, config: &config::Config) {
    use outbound::sockets::{raise_open_files, socket_budget};
    let server = &config.server;
    let sharers = config
        .plugins
        .values()
        .filter(|plugin| !plugin.allow_hosts.is_empty())
        .count();
    let Some(open_files) = raise_open_files() else {
        return; // Unlimited: each call's own cap is the only one.
    };
    let refusing = server::MAX_REFUSING as u64;
    let cap = match socket_budget(open_files, server.max_connections as u64, refusing) {
        Ok(cap) => cap,
        Err(cap) => {
            tracing::warn!(
                open_files,
                max_connections = server.max_connections,
                outbound_sockets = cap,
                "the open-files limit ({open_files}) leaves handlers' outbound connections little \
                 room beside two listeners at server.max_connections ({}): raise the limit \
                 (ulimit -n, systemd's LimitNOFILE) or lower server.max_connections; outbound \
                 sockets are capped at {cap}",
                server.max_connections
            );
            cap
        }
    };
    tracing::debug!(open_files, outbound_sockets = cap, "descriptor budget");
    runtime.limit_outbound_sockets(cap, sharers);
}

/// Runs hookd until `shutdown` resolves: opens the inbox, loads the plugins, reclaims leases a
/// previous process left, then serves ingest and admin and runs the workers.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with(config, listeners, RunOptions::default(), shutdown).await
}

/// [`run`], with `options`.
pub async fn run_with(
    config: Config,
    listeners: Listeners,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut config = config;
    let open = OpenOptions::new(&config.server, options.clock.clone());
    let inbox = match &config.server.database {
        Database::Sqlite(file) => Inbox::open_with(file, open),
        Database::Postgres(url) => Inbox::open_postgres(url.expose(), open).await,
    }
    .with_context(|| format!("opening the database {}", config.server.database))?;
    // On a shared database, the database server's clock before anything is stamped or claimed.
    if let Some(store) = inbox.cluster() {
        cluster::follow_database_clock_at_start(&*store, &options.clock).await?;
    }
    let telemetry = Telemetry::new(options.clock.clone());
    telemetry.observe(&inbox);
    telemetry.expect(
        config.sources.keys().map(|s| s.as_str()),
        config
            .sources
            .values()
            .flat_map(|s| s.handlers.iter().map(|h| h.as_str())),
    );
    // The admin API always requires a token: without a configured one (which PostgreSQL
    // requires), the token file beside the SQLite database (generated at the first start; the
    // admin commands read it too).
    if let (None, Some(file)) = (
        &config.server.admin_token,
        config.server.database.sqlite_path(),
    ) {
        let (token, path, origin) = admin::token::load_or_create(file)?;
        let how = match origin {
            admin::token::Found::Generated => "generated a new admin token",
            admin::token::Found::Existing => "using the admin token",
        };
        tracing::info!(
            token_file = %path.display(),
            "no server.admin_token configured: {how} in {} (`hookd events|replay|plugins --config` \
             read it; or pass it with --token / HOOKD_ADMIN_TOKEN)",
            path.display()
        );
        config.server.admin_token = Some(token);
    }
    let config = Arc::new(config);
    let server = &config.server;
    let runtime = Runtime::new().context("starting the wasm runtime")?;
    runtime.limit_plugin_memory(server.plugin_memory_bytes);
    limit_outbound_sockets(&runtime, &config);
    std::fs::create_dir_all(&server.plugins_dir)
        .with_context(|| format!("creating plugins_dir {}", server.plugins_dir.display()))?;
    let cache = match runtime.artifact_cache(&server.cache_dir, server.cache_max_bytes) {
        Ok(cache) => Some(cache),
        // A cache others could write is a way to run native code in hookd: refuse to start.
        Err(e @ runtime::CacheError::Unsafe(_)) => return Err(e.into()),
        Err(e) => {
            tracing::warn!(
                cache_dir = %server.cache_dir.display(), error = %e,
                "compiled-artifact cache unavailable; every start compiles every plugin"
            );
            None
        }
    };
    let compiler = runtime::Compiler::new(runtime::CompilerSettings {
        program: match &server.compiler {
            Some(program) => program.clone(),
            None => std::env::current_exe()
                .context("resolving the running executable (set server.compiler)")?,
        },
        timeout: server.compile_timeout,
        memory_bytes: server.compile_memory_bytes,
        queue_bytes: server.compile_queue_bytes,
    });
    let registry = Arc::new(Registry::new(
        runtime.clone(),
        server.plugins_dir.clone(),
        config.file_needs(),
        cache,
        compiler,
        telemetry.clone(),
    ));
    // Watching starts before the first load, so a change made meanwhile is not missed. A
    // missing or broken file is reported and its deliveries wait; the host still starts.
    let mut reloader = reload::Reloader::new(registry.clone(), config.wasm_stems());
    reloader.load_all().await;
    let node = Arc::new(cluster::Node::new(
        listeners.ingest.local_addr()?,
        listeners.admin.local_addr()?,
        &options.clock,
    ));
    // On a shared database, the cluster's versions before any request or claim.
    let memory = match inbox.cluster() {
        Some(store) => Some(cluster::catch_up(&node, &*store, &registry, &options.clock).await),
        None => None,
    };
    let shared = Arc::new(Shared {
        config: config.clone(),
        inbox: inbox.clone(),
        registry,
        runtime,
        node: node.clone(),
        telemetry: telemetry.clone(),
    });
    let dispatcher = Dispatcher::new(
        config.clone(),
        inbox.clone(),
        shared.registry.clone(),
        shared.runtime.clone(),
        options.clock.clone(),
        telemetry.clone(),
    );
    dispatcher
        .reclaim_all_at_startup()
        .await
        .context("reclaiming leases of the previous run")?;
    // The first scrape already has the database's figures.
    telemetry
        .sample(&inbox, true)
        .await
        .context("reading the inbox's counts")?;

    // Wasm runs on its own threads so a CPU-bound guest cannot starve the HTTP edge.
    let pool = WasmPool(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.server.wasm_threads)
            .thread_name("wasm")
            .enable_all()
            .build()
            .context("starting the wasm worker pool")?,
    ));

    let ingest_addr = listeners.ingest.local_addr()?;
    let admin_addr = listeners.admin.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let ingest = tokio::spawn(server::serve(
        listeners.ingest,
        ingest::router(shared.clone()),
        server.into(),
        stopped(stop_rx.clone()),
    ));
    let admin = tokio::spawn(server::serve(
        listeners.admin,
        admin::router(shared.clone(), admin_addr),
        server.into(),
        stopped(stop_rx.clone()),
    ));
    let watcher = tokio::spawn(reloader.run(stopped(stop_rx.clone())));
    let sampler = tokio::spawn(
        telemetry
            .clone()
            .sample_loop(inbox.clone(), stopped(stop_rx.clone())),
    );
    // On a shared database: the heartbeat, and this node's plugin files kept the cluster's.
    let sync = inbox.cluster().zip(memory).map(|(store, memory)| {
        let in_flight = {
            let dispatcher = dispatcher.clone();
            move || dispatcher.in_flight() as u64
        };
        tokio::spawn(cluster::run(
            node.clone(),
            store,
            shared.registry.clone(),
            in_flight,
            options.clock.clone(),
            memory,
            stopped(stop_rx.clone()),
        ))
    });
    let workers = tokio::spawn(dispatcher.run(pool.handle(), stopped(stop_rx.clone())));
    let pruner = tokio::spawn(retention::run(
        inbox.clone(),
        config.retention.clone(),
        stopped(stop_rx.clone()),
    ));
    tracing::info!(
        listen = %ingest_addr, admin = %admin_addr,
        database = %server.database, node = %node.id, workers = server.workers,
        wasm_threads = server.wasm_threads, "hookd is running"
    );
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = ingest.await;
    let _ = admin.await;
    let _ = watcher.await;
    let _ = sampler.await;
    let _ = workers.await;
    let _ = pruner.await;
    if let Some(sync) = sync {
        let _ = sync.await;
    }
    inbox.close();
    drop(pool);
    Ok(())
}

/// The wasm threads; shut down without blocking, even when `run` is dropped mid-flight.
struct WasmPool(Option<tokio::runtime::Runtime>);

impl WasmPool {
    fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("present until drop")
            .handle()
            .clone()
    }
}

impl Drop for WasmPool {
    fn drop(&mut self) {
        if let Some(pool) = self.0.take() {
            pool.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process restarted right after a SIGKILL finds its port still held for a moment by the
    /// dying one: the bind waits for it (before, every other such restart failed at once).
    #[tokio::test]
    async fn a_bind_waits_for_an_address_released_soon_and_names_the_key_otherwise() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(held);
        });
        bind_waiting(addr, "server.listen").await.unwrap();
        release.join().unwrap();

        let _held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = _held.local_addr().unwrap();
        let err = bind_waiting(addr, "server.admin_listen").await.unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("server.admin_listen") && message.contains("still in use"),
            "{message}"
        );
    }
}
