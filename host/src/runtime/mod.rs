//! The Wasm runtime: compiles plugin components, type-checks them against the WIT, and runs one
//! call per fresh, sandboxed instance.
//!
//! Invariants:
//! - This is the only module that imports wasmtime.
//! - One [`Engine`] per process. A component is compiled once per file version and its
//!   `InstancePre` cached; every call gets a fresh `Store` and instance, so no state survives a
//!   call except through the `state` import.
//! - A call is bounded: wall-clock deadline (epoch interruption, checked every tick), memory
//!   and tables summed over all of them, instances (`limiter`), live resource handles, host
//!   memory held for `wasi:http` resources (`budget`), wasm stack, output and log bytes. The
//!   type-check instantiation at load runs under the same limiter and budget. A guest yields to the executor every tick, so a CPU-bound guest cannot hold a
//!   thread.
//! - Compiled native code is loaded only from the host-private artifact cache (`cache`),
//!   never from `plugins_dir`. Plugin files are compiled in a bounded, killable child process
//!   (`compiler`); the host only deserializes what it produced.
//! - The WASI context grants nothing: no files, no environment, no sockets, no stdio.
//!   Outbound HTTP (`wasi:http`) is linked but refused unless the call was given an
//!   [`Outbound`] grant, which only handler calls can be (see `http`).

mod bindings;
mod budget;
mod cache;
mod compiler;
mod host;
mod limiter;
mod outbound_hooks;

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap,
    UpdateDeadline,
    component::{Component, Linker, ResourceTable},
};
use wasmtime_wasi::WasiCtxBuilder;

pub use self::cache::{ArtifactCache, CacheError, Origin};
pub use self::compiler::{
    CompileError, Compiler, CompilerSettings, SUBCOMMAND as COMPILE_SUBCOMMAND,
    child_main as compile_child_main,
};
pub use self::host::{StateLimit, StateRefused, StateStore};
pub use self::limiter::LimitExceeded;
use self::{
    bindings::{handler_world, parser_world, types},
    host::HostState,
};
pub use crate::outbound::{AllowList, HostPort, Outbound, idempotency_key};
use crate::{
    ids::{EventId, PluginName},
    model::{Envelope, Header, StateChanges},
    outbound::transport::Connector,
};

/// How often the epoch advances: the granularity of deadlines and of cooperative yielding.
const TICK: Duration = Duration::from_millis(2);
/// Wasm stack per call: deep enough for real parsers, small enough that 1 000 calls fit.
pub const WASM_STACK_BYTES: usize = 512 * 1024;
/// Component instances the pooling allocator keeps slots for (in-flight calls at once).
const POOL_SLOTS: u32 = 1100;
/// Largest memory any plugin may be configured with under the pooling allocator.
const POOL_MAX_MEMORY: usize = 1 << 30;
/// Largest `wasi:random` request one import call may make (the guest's hash-map seeds need
/// 16 bytes).
const MAX_RANDOM_BYTES: u64 = 64 * 1024;

/// Per-call budget.
#[derive(Debug, Clone)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: u64,
    pub output_bytes: usize,
    pub log_bytes: usize,
}

/// Which roles a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub parser: bool,
    pub handler: bool,
}

impl Roles {
    pub fn names(self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.parser {
            names.push("parser");
        }
        if self.handler {
            names.push("handler");
        }
        names
    }
}

/// A compiled, type-checked plugin file. Cheap to share; calls instantiate it afresh.
pub struct Plugin {
    sha256: String,
    roles: Roles,
    origin: Origin,
    parser: Option<parser_world::ParserPluginPre<HostState>>,
    handler: Option<handler_world::HandlerPluginPre<HostState>>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("sha256", &self.sha256)
            .field("roles", &self.roles)
            .field("origin", &self.origin)
            .finish()
    }
}

impl Plugin {
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn roles(&self) -> Roles {
        self.roles
    }

    /// Whether its native code came from the artifact cache or was compiled now.
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

/// Why a plugin file was refused. Messages name the mismatch; the caller adds the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
    #[error("exports neither hookd:plugin/parser nor hookd:plugin/handler (it exports: {0})")]
    NoRole(String),
    #[error("{0}")]
    Mismatch(String),
    /// The compile did not finish: stopped at its deadline, or its process failed.
    #[error("{0}")]
    Compile(String),
}

/// A plugin built for the registry, with the artifact to cache once it passed every check.
pub struct Built {
    pub plugin: Plugin,
    /// The precompiled code, when it was compiled now (not loaded from the cache).
    pub artifact: Option<Vec<u8>>,
}

/// Why a call did not return a value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The deadline passed (epoch interruption or wall clock).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The guest trapped: panic, out of memory, stack overflow, or a host-side refusal.
    #[error("{0}")]
    Trap(String),
    /// The output exceeded its cap; it is an error, never silently truncated.
    #[error("output of {size} bytes exceeds the {limit}-byte cap")]
    OutputTooLarge { size: usize, limit: usize },
    /// The component lacks the role asked for.
    #[error("the plugin does not export the {0} role")]
    MissingRole(&'static str),
    /// The host refused a state write (the call was stopped there); the message names the limit.
    #[error("{}", .0.message)]
    StateRefused(StateRefused),
}

impl CallError {
    /// The `error_kind` stored on an attempt.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Trap(_) => "trap",
            Self::OutputTooLarge { .. } => "output_too_large",
            Self::MissingRole(_) => "missing_role",
            Self::StateRefused(refused) => match refused.limit {
                StateLimit::Attempt => "state_limit",
                StateLimit::Total => "state_quota",
            },
        }
    }
}

/// Who is calling, for the plugin's imports and log attribution.
#[derive(Clone)]
pub struct CallContext {
    pub plugin: PluginName,
    pub config: Arc<BTreeMap<String, String>>,
    pub event: Option<EventId>,
    pub limits: Limits,
}

/// A parser's verdict on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseVerdict {
    Envelope(Envelope),
    Invalid(String),
    Ignore(String),
}

/// What a handler is given.
#[derive(Debug, Clone)]
pub struct EventInput {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<u64>,
    pub attempt: u32,
    pub received_at_ms: i64,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
}

/// A handler's verdict on an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleVerdict {
    Ok(Option<String>),
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    Permanent(String),
}

/// The engine and the linker every plugin is instantiated against.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    pooling: bool,
}

impl Runtime {
    /// Builds the engine (pooling allocator if the machine allows it) and starts the epoch ticker.
    pub fn new() -> anyhow::Result<Arc<Self>> {
        let (engine, pooling) = match Engine::new(&engine_config(true)) {
            Ok(engine) => (engine, true),
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; using on-demand allocation");
                (
                    Engine::new(&engine_config(false)).map_err(anyhow_err)?,
                    false,
                )
            }
        };
        let mut linker = Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow_err)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(anyhow_err)?;
        budget::add_to_linker(&mut linker).map_err(anyhow_err)?;
        handler_world::HandlerPlugin::add_to_linker::<_, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(anyhow_err)?;
        let runtime = Arc::new(Self {
            engine,
            linker,
            pooling,
        });
        spawn_ticker(Arc::downgrade(&runtime));
        Ok(runtime)
    }

    /// Whether the pooling allocator is in use (reported by `/healthz`).
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    /// Opens (creating, owner-only) the compiled-artifact cache in `dir`, for this engine,
    /// holding at most `max_bytes`; refuses a directory others could write.
    pub fn artifact_cache(
        &self,
        dir: &std::path::Path,
        max_bytes: u64,
    ) -> Result<ArtifactCache, CacheError> {
        ArtifactCache::open(&self.engine, dir, max_bytes)
    }

    /// Compiles a component in this process (no cache, no deadline) and checks its imports:
    /// for tools. CPU-heavy: call it off the async executor, then [`Runtime::typecheck`] it.
    pub fn compile(&self, bytes: &[u8]) -> Result<Plugin, LoadError> {
        let sha256 = hex::encode(Sha256::digest(bytes));
        let component = Component::from_binary(&self.engine, bytes)
            .map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
        self.plugin_from(component, sha256, Origin::Compiled)
    }

    /// The plugin for the file `wasm` (whose sha256 is `sha256`): its native code from `cache`
    /// when a valid entry exists, else compiled by `compiler` (queued for its byte budget, in a
    /// bounded child process), then its imports checked. [`Runtime::typecheck`] it next, and
    /// only then store [`Built::artifact`] in the cache.
    pub async fn build(
        self: &Arc<Self>,
        wasm: Arc<Vec<u8>>,
        sha256: String,
        cache: Option<ArtifactCache>,
        compiler: &Compiler,
    ) -> Result<Built, LoadError> {
        if let Some(cache) = cache {
            let (runtime, sha) = (self.clone(), sha256.clone());
            let cached = tokio::task::spawn_blocking(move || {
                cache
                    .load(&runtime.engine, &sha)
                    .map(|component| runtime.plugin_from(component, sha, Origin::Cache))
            })
            .await
            .map_err(|e| LoadError::Compile(format!("loading the cached artifact failed: {e}")))?;
            if let Some(plugin) = cached {
                return plugin.map(|plugin| Built {
                    plugin,
                    artifact: None,
                });
            }
        }
        // Held until the artifact is deserialized: that copy is part of the compile's memory.
        let _permit = compiler.reserve(wasm.len()).await;
        let artifact = compiler.compile(wasm).await.map_err(|e| match e {
            CompileError::Invalid(m) => LoadError::Invalid(m),
            CompileError::Process(m) => LoadError::Compile(m),
        })?;
        let runtime = self.clone();
        tokio::task::spawn_blocking(move || {
            // SAFETY: the artifact was just produced by our own compiler process (the hookd
            // binary, `compiler::child_main`) from this file, for an engine configured like
            // this one; wasmtime checks its header and compatibility before using it.
            let component =
                unsafe { Component::deserialize(&runtime.engine, &artifact) }.map_err(|e| {
                    LoadError::Compile(format!(
                        "the compiler process's artifact does not load in this engine (is \
                         server.compiler the same hookd build?): {e:#}"
                    ))
                })?;
            let plugin = runtime.plugin_from(component, sha256, Origin::Compiled)?;
            Ok(Built {
                plugin,
                artifact: Some(artifact),
            })
        })
        .await
        .map_err(|e| LoadError::Compile(format!("loading the compiled artifact failed: {e}")))?
    }

    /// Checks a compiled component's exports and imports: the [`Plugin`] if hookd can run it.
    fn plugin_from(
        &self,
        component: Component,
        sha256: String,
        origin: Origin,
    ) -> Result<Plugin, LoadError> {
        let ty = component.component_type();
        let exports: Vec<String> = ty
            .exports(&self.engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let roles = Roles {
            parser: exports
                .iter()
                .any(|e| e.starts_with("hookd:plugin/parser@")),
            handler: exports
                .iter()
                .any(|e| e.starts_with("hookd:plugin/handler@")),
        };
        if !roles.parser && !roles.handler {
            return Err(LoadError::NoRole(if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
            }));
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            LoadError::Mismatch(format!("imports something hookd does not provide: {e:#}"))
        })?;
        let parser = roles
            .parser
            .then(|| parser_world::ParserPluginPre::new(pre.clone()))
            .transpose()
            .map_err(|e| {
                LoadError::Mismatch(format!(
                    "its hookd:plugin/parser export does not match the WIT: {e:#}"
                ))
            })?;
        let handler = roles
            .handler
            .then(|| handler_world::HandlerPluginPre::new(pre))
            .transpose()
            .map_err(|e| {
                LoadError::Mismatch(format!(
                    "its hookd:plugin/handler export does not match the WIT: {e:#}"
                ))
            })?;
        Ok(Plugin {
            sha256,
            roles,
            origin,
            parser,
            handler,
        })
    }

    /// Checks every exported role against the WIT by instantiating the component once in a
    /// throwaway, tightly bounded store (export types are only checked on instantiation).
    pub async fn typecheck(&self, plugin: &Plugin) -> Result<(), LoadError> {
        let ctx = CallContext {
            plugin: PluginName::from("typecheck"),
            config: Arc::default(),
            event: None,
            limits: Limits {
                timeout: Duration::from_secs(5),
                memory_bytes: 256 * 1024 * 1024,
                output_bytes: 0,
                log_bytes: 0,
            },
        };
        let limit = ctx.limits.timeout;
        if let Some(pre) = &plugin.parser {
            let mut store = self.store(&ctx, None);
            let instance = bounded(limit, pre.instance_pre().instantiate_async(&mut store))
                .await
                .map_err(|e| LoadError::Invalid(format!("instantiating it failed: {e}")))?;
            parser_world::ParserPlugin::new(&mut store, &instance).map_err(|e| {
                LoadError::Mismatch(format!(
                    "its hookd:plugin/parser export does not match the WIT: {e:#}"
                ))
            })?;
        }
        if let Some(pre) = &plugin.handler {
            let mut store = self.store(&ctx, None);
            let instance = bounded(limit, pre.instance_pre().instantiate_async(&mut store))
                .await
                .map_err(|e| LoadError::Invalid(format!("instantiating it failed: {e}")))?;
            handler_world::HandlerPlugin::new(&mut store, &instance).map_err(|e| {
                LoadError::Mismatch(format!(
                    "its hookd:plugin/handler export does not match the WIT: {e:#}"
                ))
            })?;
        }
        Ok(())
    }

    fn store(&self, ctx: &CallContext, state: Option<Arc<dyn StateStore>>) -> Store<HostState> {
        let limits = limiter::Limiter::new(ctx.limits.memory_bytes);
        let mut table = ResourceTable::new();
        table.set_max_capacity(limiter::HOST_HANDLES);
        let deadline = Instant::now() + ctx.limits.timeout;
        let host = HostState {
            // Nothing granted; random bytes per call are capped far below the default 64 MiB
            // so one import call cannot make the host allocate that much.
            wasi: WasiCtxBuilder::new()
                .max_random_size(MAX_RANDOM_BYTES)
                .build(),
            table,
            limits,
            plugin: ctx.plugin.clone(),
            event: ctx.event.clone(),
            config: ctx.config.clone(),
            log_budget: ctx.limits.log_bytes,
            log_truncated: false,
            state: state.map(|store| host::StateTxn::new(store, ctx.plugin.clone())),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            budget: budget::HostBudget::new(budget::HOST_BYTES),
            outbound: outbound_hooks::OutboundHooks::new(
                ctx.plugin.clone(),
                ctx.event.clone(),
                deadline,
                Connector::Plain,
            ),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|s| &mut s.limits);
        store.set_max_component_handles(limiter::RESOURCE_HANDLES);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// Runs a parser on a verified request.
    pub async fn parse(
        &self,
        plugin: &Plugin,
        ctx: &CallContext,
        source: &str,
        headers: &[Header],
        body: &[u8],
        received_at_ms: i64,
    ) -> Result<ParseVerdict, CallError> {
        let pre = plugin
            .parser
            .as_ref()
            .ok_or(CallError::MissingRole("parser"))?;
        let mut store = self.store(ctx, None);
        let request = types::Request {
            source: source.to_owned(),
            headers: wit_headers(headers),
            body: body.to_vec(),
            received_at_ms: received_at_ms.max(0) as u64,
        };
        let limit = ctx.limits.timeout;
        let result = bounded(limit, async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance
                .hookd_plugin_parser()
                .call_parse(&mut store, &request)
                .await
        })
        .await?;
        Ok(match result {
            Ok(env) => {
                let size = env.event_id.len()
                    + env.event_type.len()
                    + env.ordering_key.as_ref().map_or(0, String::len);
                if size > ctx.limits.output_bytes {
                    return Err(CallError::OutputTooLarge {
                        size,
                        limit: ctx.limits.output_bytes,
                    });
                }
                if env.event_id.is_empty() {
                    ParseVerdict::Invalid("the parser returned an empty event id".into())
                } else {
                    ParseVerdict::Envelope(Envelope {
                        event_id: EventId::new(env.event_id),
                        event_type: env.event_type,
                        ordering_key: env.ordering_key,
                        sequence: env.sequence,
                    })
                }
            }
            Err(types::ParseError::Invalid(message)) => ParseVerdict::Invalid(message),
            Err(types::ParseError::Ignore(message)) => ParseVerdict::Ignore(message),
        })
    }

    /// Runs a handler on one event. Returns the verdict and the attempt's buffered state changes
    /// (to be committed only if the verdict is `Ok`). `outbound` is the attempt's network grant:
    /// the plugin's `allow_hosts` and the `Idempotency-Key` its requests carry.
    pub async fn handle(
        &self,
        plugin: &Plugin,
        ctx: &CallContext,
        state: Arc<dyn StateStore>,
        event: EventInput,
        outbound: Outbound,
    ) -> (Result<HandleVerdict, CallError>, StateChanges) {
        let Some(pre) = plugin.handler.as_ref() else {
            return (
                Err(CallError::MissingRole("handler")),
                StateChanges::default(),
            );
        };
        let mut store = self.store(ctx, Some(state));
        store.data_mut().outbound.grant(outbound);
        let input = types::Event {
            source: event.source,
            event_id: event.event_id,
            event_type: event.event_type,
            ordering_key: event.ordering_key,
            sequence: event.sequence,
            attempt: event.attempt,
            received_at_ms: event.received_at_ms.max(0) as u64,
            headers: wit_headers(&event.headers),
            body: event.body,
        };
        let limit = ctx.limits.timeout;
        let result = bounded(limit, async {
            let instance = pre.instantiate_async(&mut store).await?;
            instance
                .hookd_plugin_handler()
                .call_handle(&mut store, &input)
                .await
        })
        .await;
        let changes = store.data_mut().take_state_changes();
        let verdict = result.and_then(|r| match r {
            Ok(output) => {
                let size = output.as_ref().map_or(0, String::len);
                if size > ctx.limits.output_bytes {
                    Err(CallError::OutputTooLarge {
                        size,
                        limit: ctx.limits.output_bytes,
                    })
                } else {
                    Ok(HandleVerdict::Ok(output))
                }
            }
            Err(types::HandleError::Retry(retry)) => Ok(HandleVerdict::Retry {
                reason: retry.reason,
                after: retry.after_ms.map(Duration::from_millis),
            }),
            Err(types::HandleError::Permanent(reason)) => Ok(HandleVerdict::Permanent(reason)),
        });
        (verdict, changes)
    }
}

/// Runs a guest call with a wall-clock bound on top of the epoch deadline (which cannot fire
/// while the guest is blocked in a host call), mapping traps to [`CallError`].
async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = wasmtime::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit + TICK * 5, call).await {
        Err(_) => Err(CallError::Timeout(limit)),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
                Err(CallError::Timeout(limit))
            } else if let Some(exceeded) = e.downcast_ref::<LimitExceeded>() {
                Err(CallError::Trap(exceeded.to_string()))
            } else if let Some(refused) = e.downcast_ref::<StateRefused>() {
                Err(CallError::StateRefused(refused.clone()))
            } else {
                Err(CallError::Trap(trap_message(&e)))
            }
        }
    }
}

/// The first line of a trap plus its cause, without the long backtrace.
fn trap_message(e: &wasmtime::Error) -> String {
    let full = format!("{e:#}");
    let mut message: String = full.lines().take(3).collect::<Vec<_>>().join(" | ");
    if let Some(trap) = e.downcast_ref::<Trap>() {
        let kind = match trap {
            Trap::StackOverflow => "stack overflow",
            Trap::UnreachableCodeReached => "unreachable (the guest panicked or aborted)",
            Trap::MemoryOutOfBounds => "memory out of bounds",
            _ => "",
        };
        if !kind.is_empty() && !message.contains(kind) {
            message = format!("{kind}: {message}");
        }
    }
    message.truncate(2048);
    message
}

fn wit_headers(headers: &[Header]) -> Vec<types::Header> {
    headers
        .iter()
        .map(|(name, value)| types::Header {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

fn engine_config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.max_wasm_stack(WASM_STACK_BYTES);
    config.async_stack_size(WASM_STACK_BYTES + 1024 * 1024);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOL_SLOTS)
            .total_core_instances(POOL_SLOTS * 8)
            .total_memories(POOL_SLOTS * 2)
            .total_tables(POOL_SLOTS * 4)
            .total_stacks(POOL_SLOTS)
            .max_memory_size(POOL_MAX_MEMORY)
            // The limiter's counts, per component, so a component over them fails to load.
            .max_memories_per_component(limiter::MEMORIES as u32)
            .max_tables_per_component(limiter::TABLES as u32)
            .max_core_instances_per_component(limiter::INSTANCES as u32)
            // Recycling a slot without returning its first pages to the kernel avoids the
            // madvise + page-fault + TLB-shootdown cost per call that dominated ingest
            // (bench/README: ~7.5k → 15-19k accepts/s); pagemap_scan resets only dirty pages.
            .linear_memory_keep_resident(2 * 1024 * 1024)
            .table_keep_resident(64 * 1024)
            .pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// Advances the engine's epoch every [`TICK`] until the runtime is dropped.
fn spawn_ticker(runtime: Weak<Runtime>) {
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            while let Some(runtime) = runtime.upgrade() {
                runtime.engine.increment_epoch();
                drop(runtime);
                std::thread::sleep(TICK);
            }
        })
        .expect("spawning the epoch ticker");
}

fn anyhow_err(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:#}")
}
