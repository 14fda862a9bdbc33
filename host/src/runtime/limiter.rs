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
         memories and tables together), over its limit of {limit} bytes (memory_mib)"
    )]
    Memory { desired: usize, limit: usize },
    #[error(
        "table limit exceeded: the plugin asked for {desired} table elements (all its tables \
         together), over the limit of {limit}"
    )]
    Table { desired: usize, limit: usize },
    #[error(
        "host memory limit exceeded: the plugin's wasi:http resources (header fields, request \
         parts, body buffers) would hold {desired} bytes of host memory in this call, over the \
         per-call limit of {limit} bytes"
    )]
    HostMemory { desired: usize, limit: usize },
}

/// The [`ResourceLimiter`] of one call's store: one budget for all its memories and tables.
#[derive(Debug, Clone)]
pub struct Limiter {
    memory_bytes: usize,
    /// Bytes of linear memory granted so far, over every memory of the store. Memories never
    /// shrink and the store lives for one call, so this only grows. A growth that the limiter
    /// allowed but the allocator then failed stays counted (an overestimate, never an under).
    memories_used: usize,
    /// Table elements granted so far, over every table of the store.
    table_elements_used: usize,
}

impl Limiter {
    pub fn new(memory_bytes: u64) -> Self {
        Self {
            memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
            memories_used: 0,
            table_elements_used: 0,
        }
    }

    fn total_bytes(&self, memories: usize, table_elements: usize) -> usize {
        memories.saturating_add(table_elements.saturating_mul(TABLE_ELEMENT_BYTES))
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
        let total = self.total_bytes(memories, self.table_elements_used);
        if total > self.memory_bytes {
            return Err(LimitExceeded::Memory {
                desired: total,
                limit: self.memory_bytes,
            }
            .into());
        }
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
        let total = self.total_bytes(self.memories_used, elements);
        if total > self.memory_bytes {
            return Err(LimitExceeded::Memory {
                desired: total,
                limit: self.memory_bytes,
            }
            .into());
        }
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
        let mut limiter = Limiter::new(64 * 1024 * 1024);
        assert!(limiter.memory_growing(0, 1 << 20, None).unwrap());
        assert!(!limiter.memory_growing(0, 2 << 20, Some(1 << 20)).unwrap());
        let err = limiter.memory_growing(0, 65 << 20, None).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Memory {
                desired: 66 << 20,
                limit: 64 << 20
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
        let mut limiter = Limiter::new(64 << 20);
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
                limit: 64 << 20
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
}
