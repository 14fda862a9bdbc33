//! What one call may hold: linear memory, table elements, instances, tables and memories, and
//! the handles it may keep in the host's and the component model's tables.
//!
//! Invariants: the memory budget (`memory_mib`) covers the sum of every linear memory and
//! table of the call's store, however many memories or core instances the component has (a
//! component with 4 memories gets one budget, not four); growing memory or a table past the
//! budget traps at once with a typed [`LimitExceeded`] (so the attempt's error says which
//! limit, never a vague `unreachable`); nothing a guest can create without host code in the
//! loop is unbounded. Host memory the guest makes the host allocate through imports is
//! bounded separately (see `budget`).
//! - Every call also draws its linear memory and tables from one [`MemoryPool`] for the whole
//!   host (`server.plugin_memory_mib`), returned when its store drops: however many calls are in
//!   flight, and whatever their own limits, together they cannot take the host's memory; handler
//!   attempts together hold at most [`HANDLERS_SHARE`] of it, the rest kept for parsers (and
//!   loads), so no handler can make every source with a parser refuse its requests.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use wasmtime::ResourceLimiter;

/// Table elements per call, summed over all its tables (function references).
pub const TABLE_ELEMENTS: usize = 200_000;
/// What one table element costs against the memory budget (a pointer).
pub const TABLE_ELEMENT_BYTES: usize = 8;
/// Core instances per call (a component made by `cargo` has a handful).
pub const INSTANCES: usize = 64;
/// Tables per call.
pub const TABLES: usize = 64;
/// Linear memories per call (a `cargo`-built component has one). The pooling allocator is
/// configured with the same number per component, so more is refused when the plugin loads.
pub const MEMORIES: usize = 4;
/// Live resource handles per call in the component model's handle tables.
pub const RESOURCE_HANDLES: usize = 10_000;
/// Live entries per call in the host's WASI table (streams, pollables, `wasi:http` fields,
/// requests, bodies, futures). A handler's 64 requests need a few hundred at most; what the
/// entries hold is bounded by the host budget (`budget::HOST_BYTES`).
pub const HOST_HANDLES: usize = 1_000;

/// Which budget a call exceeded. Downcast from a trap's error to report it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error(
        "memory limit exceeded: the plugin asked for {desired} bytes of linear memory (all its \
         memories and tables together), over its limit of {limit} bytes ({key})"
    )]
    Memory {
        desired: usize,
        limit: usize,
        /// The setting of the limit.
        key: &'static str,
    },
    #[error(
        "table limit exceeded: the plugin asked for {desired} table elements (all its tables \
         together), over the limit of {limit}"
    )]
    Table { desired: usize, limit: usize },
    #[error(
        "the host's plugin memory is exhausted: the {} in flight hold {in_use} bytes of linear \
         memory and this one asked for {asked} more, over {} ({limit} bytes); it may succeed \
         once they finish",
        if *handlers { "handler attempts" } else { "calls" },
        if *handlers {
            "the three quarters of server.plugin_memory_mib handlers may hold together"
        } else {
            "server.plugin_memory_mib"
        }
    )]
    HostWide {
        asked: usize,
        in_use: usize,
        limit: usize,
        /// Over the handlers' share ([`HANDLERS_SHARE`]) rather than the whole pool.
        handlers: bool,
    },
    #[error(
        "host memory limit exceeded: the plugin's wasi:http resources (header fields, request \
         parts, body buffers) would hold {desired} bytes of host memory in this call, over the \
         per-call limit of {limit} bytes"
    )]
    HostMemory { desired: usize, limit: usize },
}

/// What of the [`MemoryPool`] a call may draw on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolShare {
    /// A handler attempt: handler attempts together hold at most [`HANDLERS_SHARE`] of the
    /// pool, so handlers holding memory (a hostile one, on every worker it gets) never leave
    /// parsers without any, which would refuse every source with a parser.
    Handlers,
    /// A parser call or a load's start: the whole pool.
    All,
}

/// The part of the pool handler attempts may hold together: three quarters.
pub const HANDLERS_SHARE: (usize, usize) = (3, 4);

/// What handler attempts may hold together of a pool of `limit` bytes ([`HANDLERS_SHARE`]).
pub fn handlers_share(limit: usize) -> usize {
    let (part, whole) = HANDLERS_SHARE;
    limit / whole * part
}

/// Linear memory and tables of every call in flight together, against one host-wide limit.
#[derive(Debug)]
pub struct MemoryPool {
    limit: AtomicUsize,
    used: AtomicUsize,
    /// What handler attempts hold of `used`.
    handlers_used: AtomicUsize,
}

impl MemoryPool {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            handlers_used: AtomicUsize::new(0),
        })
    }

    /// Sets the limit (`server.plugin_memory_mib`, applied once the configuration is read).
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes held by the calls in flight.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` from the pool for a call of `share`, or says why not.
    fn take(&self, bytes: usize, share: PoolShare) -> Result<(), LimitExceeded> {
        let limit = self.limit.load(Ordering::Relaxed);
        let within = |counter: &AtomicUsize, cap: usize| {
            counter
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(bytes).filter(|&total| total <= cap)
                })
                .map(drop)
        };
        if share == PoolShare::Handlers {
            let cap = handlers_share(limit);
            within(&self.handlers_used, cap).map_err(|in_use| LimitExceeded::HostWide {
                asked: bytes,
                in_use,
                limit: cap,
                handlers: true,
            })?;
        }
        within(&self.used, limit).map_err(|in_use| {
            if share == PoolShare::Handlers {
                self.handlers_used.fetch_sub(bytes, Ordering::AcqRel);
            }
            LimitExceeded::HostWide {
                asked: bytes,
                in_use,
                limit,
                handlers: false,
            }
        })
    }

    fn give_back(&self, bytes: usize, share: PoolShare) {
        if share == PoolShare::Handlers {
            self.handlers_used.fetch_sub(bytes, Ordering::AcqRel);
        }
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// The [`ResourceLimiter`] of one call's store: one budget for all its memories and tables,
/// drawn from the host's [`MemoryPool`] as it grows and given back when the store drops.
#[derive(Debug)]
pub struct Limiter {
    pool: Arc<MemoryPool>,
    share: PoolShare,
    /// Bytes taken from the pool so far (memories and tables, as [`Self::total_bytes`] counts).
    taken: usize,
    memory_bytes: usize,
    memory_key: &'static str,
    /// Bytes of linear memory granted so far, over every memory of the store. Memories never
    /// shrink and the store lives for one call, so this only grows. A growth that the limiter
    /// allowed but the allocator then failed stays counted (an overestimate, never an under).
    memories_used: usize,
    /// Table elements granted so far, over every table of the store.
    table_elements_used: usize,
}

impl Limiter {
    pub fn new(
        memory_bytes: u64,
        memory_key: &'static str,
        pool: Arc<MemoryPool>,
        share: PoolShare,
    ) -> Self {
        Self {
            pool,
            share,
            taken: 0,
            memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
            memory_key,
            memories_used: 0,
            table_elements_used: 0,
        }
    }

    fn total_bytes(&self, memories: usize, table_elements: usize) -> usize {
        memories.saturating_add(table_elements.saturating_mul(TABLE_ELEMENT_BYTES))
    }

    /// Checks a growth to `total` bytes against the call's budget, then takes what it adds
    /// from the host's pool.
    fn grow_to(&mut self, total: usize) -> wasmtime::Result<()> {
        if total > self.memory_bytes {
            return Err(LimitExceeded::Memory {
                desired: total,
                limit: self.memory_bytes,
                key: self.memory_key,
            }
            .into());
        }
        let more = total.saturating_sub(self.taken);
        self.pool.take(more, self.share)?;
        self.taken += more;
        Ok(())
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.pool.give_back(self.taken, self.share);
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past the memory's own declared maximum: plain wasm semantics (`memory.grow` = -1),
        // nothing granted.
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let memories = self
            .memories_used
            .saturating_add(desired.saturating_sub(current));
        self.grow_to(self.total_bytes(memories, self.table_elements_used))?;
        self.memories_used = memories;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing linear memory failed"))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        let elements = self
            .table_elements_used
            .saturating_add(desired.saturating_sub(current));
        if elements > TABLE_ELEMENTS {
            return Err(LimitExceeded::Table {
                desired: elements,
                limit: TABLE_ELEMENTS,
            }
            .into());
        }
        self.grow_to(self.total_bytes(self.memories_used, elements))?;
        self.table_elements_used = elements;
        Ok(true)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing a table failed"))
    }

    fn instances(&self) -> usize {
        INSTANCES
    }

    fn tables(&self) -> usize {
        TABLES
    }

    fn memories(&self) -> usize {
        MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_past_the_budget_is_a_typed_error_and_the_guests_own_maximum_is_plain_wasm() {
        let mut limiter = Limiter::new(
            64 * 1024 * 1024,
            "memory_mib",
            MemoryPool::new(usize::MAX),
            PoolShare::All,
        );
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        assert!(!limiter.memory_growing(0, 2 << 20, Some(1 << 20)).unwrap());
        let err = limiter.memory_growing(0, 65 << 20, None).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Memory {
                desired: 66 << 20,
                limit: 64 << 20,
                key: "memory_mib"
            })
        );
        assert!(err.to_string().contains("memory limit exceeded"));
        assert!(limiter.table_growing(0, 10, None).unwrap());
        let err = limiter
            .table_growing(0, TABLE_ELEMENTS + 1, None)
            .unwrap_err();
        assert!(err.downcast_ref::<LimitExceeded>().is_some());
    }

    #[test]
    fn the_budget_is_the_sum_of_every_memory_and_table() {
        let mut limiter = Limiter::new(
            64 << 20,
            "memory_mib",
            MemoryPool::new(usize::MAX),
            PoolShare::All,
        );
        // Four memories of 15 MiB each fit (60 MiB)...
        for _ in 0..4 {
            assert!(limiter.memory_growing(0, 64 << 10, None).unwrap());
        }
        for _ in 0..4 {
            assert!(limiter.memory_growing(64 << 10, 15 << 20, None).unwrap());
        }
        // ...a fifth memory's 5 MiB does not, although it alone is far below the limit.
        let err = limiter.memory_growing(0, 5 << 20, None).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Memory {
                desired: (60 << 20) + (5 << 20),
                limit: 64 << 20,
                key: "memory_mib"
            })
        );
        // Tables count against the same budget (and their element count is summed).
        assert!(limiter.memory_growing(0, 3 << 20, None).unwrap());
        assert!(limiter.table_growing(0, 1000, None).unwrap());
        assert!(limiter.table_growing(0, 1000, None).unwrap());
        let err = limiter.table_growing(0, 150_000, None).unwrap_err();
        assert!(matches!(
            err.downcast_ref::<LimitExceeded>(),
            Some(LimitExceeded::Memory { .. })
        ));
        let err = limiter
            .table_growing(0, TABLE_ELEMENTS - 1000, None)
            .unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Table {
                desired: TABLE_ELEMENTS + 1000,
                limit: TABLE_ELEMENTS
            })
        );
    }

    /// The calls in flight share one pool: a growth that fits its own budget but not the pool
    /// is refused with the host-wide error, and what a store took comes back when it drops.
    #[test]
    fn every_call_draws_from_one_host_wide_pool_and_gives_back_on_drop() {
        let pool = MemoryPool::new(10 << 20);
        let mut first = Limiter::new(64 << 20, "memory_mib", pool.clone(), PoolShare::All);
        let mut second = Limiter::new(64 << 20, "memory_mib", pool.clone(), PoolShare::All);
        assert!(first.memory_growing(0, 6 << 20, None).unwrap());
        assert!(second.memory_growing(0, 3 << 20, None).unwrap());
        assert!(second.table_growing(0, 1000, None).unwrap());
        let err = second.memory_growing(3 << 20, 5 << 20, None).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::HostWide {
                asked: 2 << 20,
                in_use: (9 << 20) + 8000,
                limit: 10 << 20,
                handlers: false,
            })
        );
        assert!(
            err.to_string().contains("server.plugin_memory_mib"),
            "{err}"
        );
        drop(first);
        assert_eq!(pool.in_use(), (3 << 20) + 8000);
        assert!(second.memory_growing(3 << 20, 5 << 20, None).unwrap());
        drop(second);
        assert_eq!(pool.in_use(), 0);
    }

    /// Handler attempts together hold at most three quarters of the pool; the rest stays for
    /// parsers (before, handlers holding the pool made every parse a 503: every source with a
    /// parser refused its requests for as long as they held it).
    #[test]
    fn handlers_together_leave_a_quarter_of_the_pool_to_parsers() {
        let pool = MemoryPool::new(16 << 20);
        let handler = || Limiter::new(64 << 20, "memory_mib", pool.clone(), PoolShare::Handlers);
        let (mut first, mut second) = (handler(), handler());
        assert!(first.memory_growing(0, 8 << 20, None).unwrap());
        assert!(second.memory_growing(0, 4 << 20, None).unwrap());
        let err = second.memory_growing(4 << 20, 5 << 20, None).unwrap_err();
        let exceeded = err.downcast_ref::<LimitExceeded>().unwrap();
        assert_eq!(
            exceeded,
            &LimitExceeded::HostWide {
                asked: 1 << 20,
                in_use: 12 << 20,
                limit: 12 << 20,
                handlers: true,
            }
        );
        assert!(
            err.to_string().contains("handlers may hold together"),
            "{err}"
        );
        let mut parser = Limiter::new(64 << 20, "parser_memory_mib", pool.clone(), PoolShare::All);
        assert!(
            parser.memory_growing(0, 4 << 20, None).unwrap(),
            "the parsers' quarter"
        );
        assert!(
            parser.memory_growing(4 << 20, 5 << 20, None).is_err(),
            "the pool is full"
        );
        drop((first, second, parser));
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.handlers_used.load(Ordering::Relaxed), 0);
    }
}
