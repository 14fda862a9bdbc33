//! The host-wide budget of outbound sockets, shared by every plugin call: what keeps a plugin
//! that holds many connections open (each call may have [`REQUESTS_PER_CALL`] in flight, and
//! the dispatcher may run `server.workers` calls of it) from using up the process's file
//! descriptors, which the listeners, the database and plugin loads need too.
//!
//! Invariants:
//! - A slot is taken before the connect and held as long as the connection lives (the guard
//!   rides with the connection's driver), so the sockets open at once never exceed the cap.
//! - At start-up the soft open-files limit is raised to the hard one ([`raise_open_files`]),
//!   and the cap leaves room for what the listeners may hold at their own caps
//!   ([`socket_budget`]); a limit too low for both is a warning naming the keys, never a
//!   silent fallback.
//!
//! [`REQUESTS_PER_CALL`]: super::policy::REQUESTS_PER_CALL

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

/// File descriptors kept for everything but the listeners' connections and outbound sockets:
/// the database's files and connections, plugin files, compile children's pipes, the watcher,
/// the runtime's own.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Outbound sockets open at once, all plugin calls together, against a cap.
#[derive(Debug)]
pub struct SocketPool {
    open: AtomicUsize,
    cap: AtomicUsize,
}

impl Default for SocketPool {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            cap: AtomicUsize::new(usize::MAX),
        }
    }
}

impl SocketPool {
    /// Sets the cap; sockets already open stay, new ones wait for the count to fall below it.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// The cap in force.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Takes one slot if fewer than the cap are open; the slot is given back when dropped.
    pub fn take(self: &Arc<Self>) -> Option<SocketSlot> {
        let cap = self.cap();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < cap).then_some(open + 1)
            })
            .ok()?;
        Some(SocketSlot(Arc::clone(self)))
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One outbound socket's place in the [`SocketPool`], for as long as the socket lives.
#[derive(Debug)]
pub struct SocketSlot(Arc<SocketPool>);

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Raises the process's soft open-files limit to its hard limit, as far as the kernel lets;
/// returns the soft limit in force afterwards (`None`: unlimited).
pub fn raise_open_files() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(error = %e, "could not raise the open-files limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// How many outbound sockets a process whose open-files limit is `open_files` may hold while
/// both listeners hold `max_connections` connections each (and `refusing` more being refused),
/// with [`RESERVED_DESCRIPTORS`] to spare. When that leaves handlers less than a quarter of the
/// limit, `Err` with a quarter: the listeners' caps do not fit the limit, which the caller says.
pub fn socket_budget(open_files: u64, max_connections: u64, refusing: u64) -> Result<u64, u64> {
    let listeners = 2 * (max_connections.saturating_add(refusing));
    let quarter = open_files / 4;
    match open_files.checked_sub(listeners.saturating_add(RESERVED_DESCRIPTORS)) {
        Some(left) if left >= quarter => Ok(left),
        _ => Err(quarter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stop_at_the_cap_and_come_back_when_dropped() {
        let pool = Arc::new(SocketPool::default());
        pool.set_cap(2);
        let first = pool.take().unwrap();
        let second = pool.take().unwrap();
        assert!(pool.take().is_none());
        assert_eq!(pool.open(), 2);
        drop(first);
        let third = pool.take().expect("a dropped slot is free again");
        drop((second, third));
        assert_eq!(pool.open(), 0);
    }

    #[test]
    fn the_budget_leaves_the_listeners_room_or_falls_back_to_a_quarter() {
        // 20 000 descriptors, 4 096 connections per listener, 256 being refused each.
        assert_eq!(socket_budget(20_000, 4_096, 256), Ok(20_000 - 8_704 - 256));
        // Room for the listeners, but less than a quarter left: a quarter, and a warning.
        assert_eq!(socket_budget(10_000, 4_096, 256), Err(2_500));
        // systemd's default soft limit with the default caps: the listeners alone do not fit.
        assert_eq!(socket_budget(1_024, 4_096, 256), Err(256));
    }
}
