//! The host-wide budget of outbound sockets, shared by every plugin call: what keeps a plugin
//! that holds many connections open (each call may have [`REQUESTS_PER_CALL`] in flight, and
//! the dispatcher may run `server.workers` calls of it) from using up the process's file
//! descriptors, which the listeners, the database and plugin loads need too.
//!
//! Invariants:
//! - A slot is taken before the connect and held as long as the connection lives (the guard
//!   rides with the connection's driver), so the sockets open at once never exceed the cap.
//! - No plugin holds more than its share of the cap ([`SocketPool::share`]: the cap over the
//!   plugins that may send requests), so one holding its connections open cannot leave
//!   another's requests without a socket.
//! - At start-up the soft open-files limit is raised to the hard one ([`raise_open_files`]),
//!   and the cap leaves room for what the listeners may hold at their own caps
//!   ([`socket_budget`]); a limit too low for both is a warning naming the keys, never a
//!   silent fallback.
//!
//! [`REQUESTS_PER_CALL`]: super::policy::REQUESTS_PER_CALL

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::policy::{Denied, REQUESTS_PER_CALL};
use crate::ids::PluginName;

/// File descriptors kept for everything but the listeners' connections and outbound sockets:
/// the database's files and connections, plugin files, compile children's pipes, the watcher,
/// the runtime's own.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Outbound sockets open at once, all plugin calls together, against a cap, and each plugin's
/// against its share of it.
#[derive(Debug)]
pub struct SocketPool {
    open: AtomicUsize,
    cap: AtomicUsize,
    /// The plugins that may send requests (those with an allow-list), among which the cap is
    /// shared.
    sharers: AtomicUsize,
    /// Sockets open now, by plugin (only plugins with one open).
    per_plugin: Mutex<HashMap<PluginName, usize>>,
}

impl Default for SocketPool {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            cap: AtomicUsize::new(usize::MAX),
            sharers: AtomicUsize::new(1),
            per_plugin: Mutex::default(),
        }
    }
}

impl SocketPool {
    /// Sets the cap and how many plugins share it; sockets already open stay, new ones wait
    /// for the counts to fall below them.
    pub fn set_cap(&self, cap: usize, sharers: usize) {
        self.cap.store(cap, Ordering::Relaxed);
        self.sharers.store(sharers.max(1), Ordering::Relaxed);
    }

    /// The cap in force.
    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// The most one plugin may hold: the cap over the plugins sharing it, but at least one
    /// call's requests ([`REQUESTS_PER_CALL`]) where the cap has that many.
    pub fn share(&self) -> usize {
        let cap = self.cap();
        (cap / self.sharers.load(Ordering::Relaxed))
            .max(REQUESTS_PER_CALL as usize)
            .min(cap)
    }

    /// Takes one slot for `plugin` if it holds fewer than its share and fewer than the cap are
    /// open; the slot is given back when dropped.
    pub fn take(self: &Arc<Self>, plugin: &PluginName) -> Result<SocketSlot, Denied> {
        let (cap, share) = (self.cap(), self.share());
        let mut per_plugin = self
            .per_plugin
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < cap).then_some(open + 1)
            })
            .map_err(|_| Denied::HostSockets(cap))?;
        let mine = per_plugin.get(plugin).copied().unwrap_or(0);
        if mine >= share {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Denied::PluginSockets(share));
        }
        per_plugin.insert(plugin.clone(), mine + 1);
        Ok(SocketSlot {
            pool: Arc::clone(self),
            plugin: plugin.clone(),
        })
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One outbound socket's place in the [`SocketPool`], for as long as the socket lives.
#[derive(Debug)]
pub struct SocketSlot {
    pool: Arc<SocketPool>,
    plugin: PluginName,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut per_plugin = self
            .pool
            .per_plugin
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(mine) = per_plugin.get_mut(&self.plugin) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                per_plugin.remove(&self.plugin);
            }
        }
        self.pool.open.fetch_sub(1, Ordering::AcqRel);
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
        let p = PluginName::new("p");
        pool.set_cap(2, 1);
        let first = pool.take(&p).unwrap();
        let second = pool.take(&p).unwrap();
        assert!(matches!(pool.take(&p), Err(Denied::HostSockets(2))));
        assert_eq!(pool.open(), 2);
        drop(first);
        let third = pool.take(&p).expect("a dropped slot is free again");
        drop((second, third));
        assert_eq!(pool.open(), 0);
        assert!(pool.per_plugin.lock().unwrap().is_empty());
    }

    /// A plugin holding its share leaves the rest to the others: the cap over the plugins that
    /// may send requests, at least one call's requests. Before, one pool for all: a plugin
    /// holding connections open refused every other plugin's requests.
    #[test]
    fn one_plugin_holds_at_most_its_share_of_the_cap() {
        let pool = Arc::new(SocketPool::default());
        let (hog, other) = (PluginName::new("hog"), PluginName::new("other"));
        pool.set_cap(301, 2);
        assert_eq!(pool.share(), 150);
        let held: Vec<SocketSlot> = (0..150).map(|_| pool.take(&hog).unwrap()).collect();
        assert!(matches!(pool.take(&hog), Err(Denied::PluginSockets(150))));
        let theirs: Vec<SocketSlot> = (0..150).map(|_| pool.take(&other).unwrap()).collect();
        assert!(matches!(pool.take(&other), Err(Denied::PluginSockets(150))));
        drop((held, theirs));
        pool.set_cap(100, 4);
        assert_eq!(
            pool.share(),
            REQUESTS_PER_CALL as usize,
            "at least one call's"
        );
        pool.set_cap(10, 4);
        assert_eq!(pool.share(), 10, "never over the cap");
        let held: Vec<SocketSlot> = (0..10).map(|_| pool.take(&hog).unwrap()).collect();
        assert!(matches!(pool.take(&other), Err(Denied::HostSockets(10))));
        drop(held);
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
