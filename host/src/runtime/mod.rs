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
//!   type-check instantiation at load runs under the same limiter and budget. A guest yields
//!   to the executor every tick, so a CPU-bound guest cannot hold a thread.
//! - Compiled native code is loaded only from the host-private artifact cache (`cache`),
//!   never from `plugins_dir`. Plugin files are compiled in a bounded, killable child process
//!   (`compiler`); the host only deserializes what it produced.
//! - The WASI context grants nothing: no files, no environment, no sockets, no stdio but a
//!   bounded in-memory stderr, read only to explain a trap (`stderr`).
//!   Outbound HTTP (`wasi:http`) is linked but refused unless the call was given an
//!   [`Outbound`] grant, which only handler calls can be (see `outbound_hooks`, which applies
//!   [`crate::outbound`]'s policy).
//!
//! Layout: `engine` (engine, pooling, epoch ticker), `plugin` (load and check a file), `call`
//! (one sandboxed call per role), `host` (the imports), `outbound_hooks` (`wasi:http`),
//! `stderr` (a call's stderr, for panics), `budget` and `limiter` (resource caps), `cache` and `compiler` (native code).

mod bindings;
mod budget;
mod cache;
mod call;
mod compiler;
mod engine;
mod host;
mod limiter;
mod outbound_hooks;
mod plugin;
mod stderr;

use wasmtime::{Engine, component::Linker};

pub use self::bindings::WitVersion;
pub use self::cache::{ArtifactCache, CacheError, Origin};
pub use self::call::{
    CallContext, CallError, EventInput, HandleVerdict, Limits, MAX_RESPOND_HEADERS, ParseRequest,
    ParseVerdict, ParserResponse,
};
pub use self::compiler::{
    CompileError, Compiler, CompilerSettings, SUBCOMMAND as COMPILE_SUBCOMMAND,
    child_main as compile_child_main,
};
pub use self::engine::{StartError, WASM_STACK_BYTES};
use self::host::HostState;
pub use self::host::{StateLimit, StateRefused, StateStore};
pub use self::limiter::{LimitExceeded, PoolShare, handlers_share};
pub use self::plugin::{Built, LoadError, Plugin, Roles, StartLimits, file_sha256};
use crate::outbound::transport::Connector;
/// The request headers `wasi:http` refuses from a plugin (its framing and connection, which
/// the host's HTTP client writes): what each SDK refuses before sending, with `content-length`,
/// which the SDKs set from the body.
pub use wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS as PLUGIN_FORBIDDEN_HEADERS;

/// The engine and the linker every plugin is instantiated against.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    pooling: bool,
    /// How handler requests reach the network (built once, shared by every call).
    connector: Connector,
    /// Outbound sockets of every call in flight, against the host-wide cap.
    sockets: std::sync::Arc<crate::outbound::sockets::SocketPool>,
    /// DNS lookups of every call in flight, against the host-wide and per-plugin bounds.
    lookups: std::sync::Arc<crate::outbound::lookups::Lookups>,
    /// The epoch ticker's state: it advances the epoch only while a store is alive.
    ticker: std::sync::Arc<engine::Ticker>,
    /// Linear memory of every call in flight, against `server.plugin_memory_mib`.
    memory: std::sync::Arc<limiter::MemoryPool>,
}
