//! The process's one wasmtime engine: its configuration (pooling allocator when the machine
//! allows it), the linker every plugin is instantiated against, and the epoch ticker.
//!
//! Invariants:
//! - One configuration, [`engine_config`], serves both the host and the compiler process
//!   (which differs only in not pooling), so an artifact compiled there loads here.
//! - The epoch advances every [`TICK`] while a store is alive (a call in flight, or a plugin's
//!   type-check): it is the granularity of call deadlines and of cooperative yielding. With no
//!   store alive the ticker thread sleeps until the next store is made, so an idle host does
//!   not wake 500 times a second. The thread ends when the runtime is dropped.

use std::{
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    thread::Thread,
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
/// Bytes of a pool memory slot kept resident (reset, not returned) after its call.
const MEMORY_KEEP_RESIDENT: usize = 256 * 1024;
/// Bytes of a pool table slot kept resident after its call (2 048 elements).
const TABLE_KEEP_RESIDENT: usize = 16 * 1024;

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
            sockets: Arc::default(),
            lookups: Arc::default(),
            ticker: Arc::new(Ticker::default()),
            memory: limiter::MemoryPool::new(usize::MAX),
        });
        spawn_ticker(&runtime);
        Ok(runtime)
    }

    /// Marks a store alive until the returned guard drops, waking the ticker if it slept.
    pub(super) fn live_store(&self) -> LiveStore {
        if self.ticker.live.fetch_add(1, Ordering::AcqRel) == 0 {
            self.ticker.wake();
        }
        LiveStore(Arc::clone(&self.ticker))
    }

    /// How many times the epoch has advanced.
    #[cfg(test)]
    pub(super) fn ticks(&self) -> u64 {
        self.ticker.ticks.load(Ordering::Acquire)
    }

    /// Caps the linear memory (and tables) of all calls in flight together at `bytes`
    /// (`server.plugin_memory_mib`); until set, only each call's own limit applies.
    pub fn limit_plugin_memory(&self, bytes: u64) {
        self.memory
            .set_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    }

    /// Caps the outbound sockets of all calls in flight together at `cap` (set at start-up
    /// from the open-files limit), each of the `sharers` plugins that may send requests to its
    /// share of it; until set, only each call's own cap applies.
    pub fn limit_outbound_sockets(&self, cap: u64, sharers: usize) {
        self.sockets
            .set_cap(usize::try_from(cap).unwrap_or(usize::MAX), sharers);
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
        // Every slot may hold a component at the per-component maxima, so no plugin's calls can
        // spend the tables, memories or core instances another plugin's call needs (a handler
        // of 64 empty tables, spinning in 64 calls at once, took all 4 400 tables there were,
        // and every other plugin's calls then failed to instantiate). Only the component slots
        // themselves run out, and only with more calls in flight than `workers` and parses.
        // (Tables are reserved address space, 160 KiB each; core instances only counted.)
        pool.total_component_instances(POOL_SLOTS)
            .total_core_instances(POOL_SLOTS * limiter::INSTANCES as u32)
            .total_memories(POOL_SLOTS * limiter::MEMORIES as u32)
            .total_tables(POOL_SLOTS * limiter::TABLES as u32)
            .total_stacks(POOL_SLOTS)
            .max_memory_size(POOL_MAX_MEMORY)
            // The limiter's counts, per component, so a component over them fails to load.
            .max_memories_per_component(limiter::MEMORIES as u32)
            .max_tables_per_component(limiter::TABLES as u32)
            .max_core_instances_per_component(limiter::INSTANCES as u32)
            // Recycling a slot without returning its first pages to the kernel avoids a
            // madvise, page faults and a TLB shootdown on every call, which dominated ingest;
            // pagemap_scan resets only the dirty pages. What stays resident is no call's and
            // counted nowhere: per slot a call used, at most these, so with 64 calls of 4
            // memories and 64 tables each about 130 MiB in all (with 2 MiB and 64 KiB, 770 MiB).
            .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT)
            .table_keep_resident(TABLE_KEEP_RESIDENT)
            .pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

/// What the epoch ticker thread and the stores share.
#[derive(Debug, Default)]
pub(super) struct Ticker {
    /// Stores alive: while there is one, the epoch advances.
    live: AtomicUsize,
    /// Times the epoch advanced (counted for the tests that hold the ticker to its word).
    #[cfg(test)]
    ticks: std::sync::atomic::AtomicU64,
    /// The ticker thread, to wake from its sleep.
    thread: OnceLock<Thread>,
}

impl Ticker {
    fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// A store's share in keeping the epoch advancing; held by the store's [`HostState`], so it
/// lasts exactly as long as the store.
#[derive(Debug)]
pub(super) struct LiveStore(Arc<Ticker>);

impl Drop for LiveStore {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Runtime {
    /// Wakes the ticker, so it sees the runtime gone and ends.
    fn drop(&mut self) {
        self.ticker.wake();
    }
}

/// Advances the engine's epoch every [`TICK`] while a store is alive, sleeps while none is,
/// and ends when the runtime is dropped.
///
/// A store made while the thread decides to sleep wakes it (`unpark` before `park` makes the
/// `park` return at once), so a live store never waits for a tick that is not coming; a guest
/// that runs then is interrupted on time as before.
fn spawn_ticker(owner: &Arc<Runtime>) {
    let runtime: Weak<Runtime> = Arc::downgrade(owner);
    let thread = std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            loop {
                let Some(rt) = runtime.upgrade() else { return };
                let idle = rt.ticker.live.load(Ordering::Acquire) == 0;
                drop(rt);
                if idle {
                    std::thread::park();
                    continue;
                }
                std::thread::sleep(TICK);
                let Some(rt) = runtime.upgrade() else { return };
                rt.engine.increment_epoch();
                #[cfg(test)]
                rt.ticker.ticks.fetch_add(1, Ordering::AcqRel);
            }
        })
        .expect("spawning the epoch ticker");
    // Set once, before any store exists: `new` has not returned the runtime yet.
    let _ = owner.ticker.thread.set(thread.thread().clone());
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        sync::Arc,
        time::{Duration, Instant},
    };

    use super::{Runtime, TICK};
    use crate::{
        ids::PluginName,
        runtime::{CallContext, Limits},
    };

    /// Waits until the epoch has stopped advancing (no tick for many ticks' time) and returns
    /// its count; a ticker that never stops fails the test.
    fn settled(runtime: &Runtime) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ticks = runtime.ticks();
            std::thread::sleep(TICK * 50);
            if runtime.ticks() == ticks {
                return ticks;
            }
            assert!(
                Instant::now() < deadline,
                "the epoch kept advancing with no store alive ({} ticks)",
                runtime.ticks()
            );
        }
    }

    /// An idle host does not wake every tick: the epoch advances while a store is alive (so a
    /// guest is interrupted on time; the spinner tests show it end to end) and not before the
    /// first one nor after the last one is dropped.
    #[test]
    fn the_epoch_advances_only_while_a_store_is_alive() {
        let runtime = Runtime::new().unwrap();
        std::thread::sleep(TICK * 50);
        assert_eq!(runtime.ticks(), 0, "the epoch advanced before any store");

        let ctx = CallContext {
            plugin: PluginName::new("ticks"),
            config: Arc::new(BTreeMap::new()),
            event: None,
            limits: Limits {
                timeout: Duration::from_secs(1),
                timeout_key: "timeout_ms",
                memory_bytes: 1 << 20,
                memory_key: "memory_mib",
                pool_share: super::limiter::PoolShare::All,
                output_bytes: 1024,
                log_bytes: 1024,
            },
        };
        let first = runtime.store(&ctx, None);
        let second = runtime.store(&ctx, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while runtime.ticks() < 3 {
            assert!(Instant::now() < deadline, "no tick while a store was alive");
            std::thread::sleep(TICK);
        }
        drop(first);
        let ticks = runtime.ticks();
        let deadline = Instant::now() + Duration::from_secs(10);
        while runtime.ticks() < ticks + 3 {
            assert!(
                Instant::now() < deadline,
                "the epoch stopped while a store was still alive"
            );
            std::thread::sleep(TICK);
        }
        drop(second);
        let stopped = settled(&runtime);
        std::thread::sleep(TICK * 50);
        assert_eq!(
            runtime.ticks(),
            stopped,
            "the epoch advanced after the last store"
        );

        // A store made after the ticker went to sleep wakes it.
        let again = runtime.store(&ctx, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while runtime.ticks() == stopped {
            assert!(
                Instant::now() < deadline,
                "a new store did not wake the ticker"
            );
            std::thread::sleep(TICK);
        }
        drop(again);
        settled(&runtime);
    }
}
