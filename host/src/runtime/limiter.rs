//! What one call may hold: linear memory, table elements, instances, tables and memories, and
//! the handles it may keep in the host's and the component model's tables.
//!
//! Invariants: growing memory or a table past the call's budget traps at once with a typed
//! [`LimitExceeded`] (so the attempt's error says which limit, never a vague `unreachable`);
//! nothing a guest can create without host code in the loop is unbounded.

use wasmtime::ResourceLimiter;

/// Table elements per call (function references; 8 bytes of host memory each).
pub const TABLE_ELEMENTS: usize = 200_000;
/// Core instances per call (a component made by `cargo` has a handful).
pub const INSTANCES: usize = 64;
/// Tables per call.
pub const TABLES: usize = 64;
/// Linear memories per call.
pub const MEMORIES: usize = 16;
/// Live resource handles per call, in the host's WASI table and in the component model's
/// handle tables: each costs host memory the linear-memory limit does not see.
pub const RESOURCE_HANDLES: usize = 10_000;

/// Which budget a call exceeded. Downcast from a trap's error to report it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error(
        "memory limit exceeded: the plugin asked for {desired} bytes of linear memory, over \
         its limit of {limit} bytes (memory_mib)"
    )]
    Memory { desired: usize, limit: usize },
    #[error(
        "table limit exceeded: the plugin asked for {desired} table elements, over the limit \
         of {limit}"
    )]
    Table { desired: usize, limit: usize },
}

/// The [`ResourceLimiter`] of one call's store.
#[derive(Debug, Clone)]
pub struct Limiter {
    memory_bytes: usize,
}

impl Limiter {
    pub fn new(memory_bytes: u64) -> Self {
        Self {
            memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            return Err(LimitExceeded::Memory {
                desired,
                limit: self.memory_bytes,
            }
            .into());
        }
        // Past the memory's own declared maximum: plain wasm semantics (`memory.grow` = -1).
        Ok(maximum.is_none_or(|max| desired <= max))
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing linear memory failed"))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > TABLE_ELEMENTS {
            return Err(LimitExceeded::Table {
                desired,
                limit: TABLE_ELEMENTS,
            }
            .into());
        }
        Ok(maximum.is_none_or(|max| desired <= max))
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
                desired: 65 << 20,
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
}
