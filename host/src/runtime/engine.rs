//! The process's one wasmtime engine: its configuration (pooling allocator when the machine
//! allows it), the linker every plugin is instantiated against, and the epoch ticker.
//!
//! Invariants:
//! - One configuration, [`engine_config`], serves both the host and the compiler process
//!   (which differs only in not pooling), so an artifact compiled there loads here.
//! - The epoch advances every [`TICK`] for as long as the [`Runtime`] lives: it is the
//!   granularity of call deadlines and of cooperative yielding, and the ticker thread ends when
//!   the runtime is dropped.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::{ArtifactCache, CacheError, Runtime, bindings, budget, host::HostState, limiter};
use crate::outbound::transport::Connector;

/// How often the epoch advances: the granularity of deadlines and of cooperative yielding.
pub(super) const TICK: Duration = Duration::from_millis(2);
/// Wasm stack per call: deep enough for real parsers, small enough that 1 000 calls fit.
pub const WASM_STACK_BYTES: usize = 512 * 1024;
/// Component instances the pooling allocator keeps slots for (in-flight calls at once).
const POOL_SLOTS: u32 = 1100;
/// Largest memory any plugin may be configured with under the pooling allocator.
const POOL_MAX_MEMORY: usize = 1 << 30;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No engine could be built, with or without the pooling allocator.
    #[error("{0}")]
    Engine(String),
    /// A host import could not be added to the linker.
    #[error("{0}")]
    Link(String),
}

impl Runtime {
    /// Builds the engine (pooling allocator if the machine allows it) and starts the epoch ticker.
    pub fn new() -> Result<Arc<Self>, StartError> {
        let (engine, pooling) = match Engine::new(&engine_config(true)) {
            Ok(engine) => (engine, true),
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; using on-demand allocation");
                (
                    Engine::new(&engine_config(false))
                        .map_err(|e| StartError::Engine(format!("{e:#}")))?,
                    false,
                )
            }
        };
        let link = |e: wasmtime::Error| StartError::Link(format!("{e:#}"));
        let mut linker = wasmtime::component::Linker::<HostState>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(link)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(link)?;
        budget::add_to_linker(&mut linker).map_err(link)?;
        bindings::add_to_linker(&mut linker).map_err(link)?;
        let runtime = Arc::new(Self {
            engine,
            linker,
            pooling,
            connector: Connector::Plain,
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
}

/// The engine configuration; `pooling` only in the host (the compiler process's address-space
/// limit leaves no room for the pool's reservations).
pub(super) fn engine_config(pooling: bool) -> Config {
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
            // Recycling a slot without returning its first pages to the kernel avoids a
            // madvise, page faults and a TLB shootdown on every call, which dominated ingest;
            // pagemap_scan resets only the dirty pages.
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
