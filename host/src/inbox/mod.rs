//! The durable inbox: events, deliveries, attempts, quarantine and plugin state in one SQLite file.
//!
//! One file per role: `request` (what is stored), `accept` and `quarantine` (a request comes
//! in), `lease` (claim, finish, reclaim), `replay`, `state` (plugin state) and `views` (read
//! models). The SQLite mechanics are in `connection` (files, lock, pragmas, read pool),
//! `writer` (group commit), `schema` (migrations) and `sql` (state sets as SQL, stored
//! headers). This file is the [`Inbox`] handle: open and close, and the in-process counters
//! and wake-up the operations keep.
//!
//! In each role file the `Inbox` method keeps the in-process bookkeeping (backlog, quarantine
//! count, wake-up) and hands the transition to a function of one `&Connection`
//! (`store_event`, `claim_due`, `finish_attempt`, `take_back`, `replay_matching`, ...): those
//! functions are what another storage backend would implement again; the parameter and result
//! types around them carry no SQLite type.
//!
//! Invariants:
//! - This is the only module that speaks SQL: rusqlite stays in this room, and no rusqlite
//!   type appears in the types it exports.
//! - Every write goes through the one writer (`writer.rs`), so a caller is answered only after
//!   the commit that holds its change.
//! - `(source, event_id)` is unique (a table constraint, not a check-then-insert).
//! - Every state transition of a delivery happens in one statement or one savepoint, so a crash
//!   between two steps of one transition is impossible.
//! - The times the inbox stamps itself come from the [`Clock`] it was opened with.

mod accept;
mod connection;
mod error;
#[cfg(test)]
mod fixtures;
mod lease;
#[cfg(test)]
mod ordering_props;
mod quarantine;
mod replay;
mod request;
mod schema;
mod sql;
mod state;
#[cfg(test)]
mod tests;
mod views;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
        mpsc,
    },
    thread,
};

use rusqlite::Connection;
use tokio::sync::Notify;

pub use self::{
    accept::Accepted,
    error::{InboxError, StorageError},
    lease::{ClaimRequest, Claimed, DEFAULT_LEASE_MS, Finish, Finished},
    quarantine::Quarantined,
    replay::ReplayFilter,
    request::RawRequest,
    views::{AttemptRecord, DeliveryDetail, EventDetail, EventFilter, EventSummary},
    writer::WriterOptions,
};
use crate::{
    clock::Clock,
    config::{Durability, ServerConfig},
};

/// How to open the inbox: the writer's settings and where "now" comes from.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub writer: WriterOptions,
    /// The clock for the times the inbox stamps itself (a replay's due time, a resolution's).
    pub clock: Clock,
}

impl OpenOptions {
    /// The server's writer settings, with `clock`.
    pub fn new(server: &ServerConfig, clock: Clock) -> Self {
        Self {
            writer: server.into(),
            clock,
        }
    }
}

impl From<WriterOptions> for OpenOptions {
    /// `writer`, on the system clock.
    fn from(writer: WriterOptions) -> Self {
        Self {
            writer,
            clock: Clock::system(),
        }
    }
}

/// Handle to the inbox; cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database file (read connections are opened on it as needed).
    path: PathBuf,
    /// The writer's queue; `None` once closed.
    writer: Mutex<Option<writer::Queue>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    /// Idle read connections.
    readers: Mutex<Vec<Connection>>,
    /// Deliveries in an open state (`DeliveryState::OPEN`): the backlog bound's measure.
    backlog: AtomicI64,
    /// Quarantined requests not yet resolved (plus writes in flight): the quarantine bound's
    /// measure. Recounted from the table after every replay.
    quarantined: AtomicI64,
    /// Wakes the dispatcher when new work becomes due.
    work: Notify,
    /// Commits done by the writer; lets tests and benchmarks see group commit at work.
    commits: AtomicI64,
    /// Held while open: one hookd per database, because start-up takes back every lease.
    lock: Mutex<Option<std::fs::File>>,
    /// Where the times the inbox stamps itself come from.
    clock: Clock,
}

impl Inbox {
    /// Opens (creating and migrating if needed) the database at `path`, with group commit, on
    /// the system clock.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, InboxError> {
        Self::open_with(path, WriterOptions::new(durability))
    }

    /// Opens (creating and migrating if needed) the database at `path`.
    pub fn open_with(path: &Path, options: impl Into<OpenOptions>) -> Result<Self, InboxError> {
        let OpenOptions { writer, clock } = options.into();
        connection::create_parent(path)?;
        let lock = connection::lock_database(path)?;
        connection::create_private(path)?;
        let conn = connection::open_connection(path, writer.durability)?;
        // The writer checkpoints inline, after a commit, so a checkpoint stalls the batches
        // queued behind it: 500 pages (~2 MiB) instead of SQLite's 1000 halves that stall.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 500")?;
        schema::migrate(&conn)?;
        let backlog = lease::count_open(&conn)?;
        let quarantined = quarantine::count_held(&conn)?;
        let (tx, rx) = mpsc::channel();
        let inner = Arc::new(Inner {
            path: path.to_owned(),
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            backlog: AtomicI64::new(backlog),
            quarantined: AtomicI64::new(quarantined),
            work: Notify::new(),
            commits: AtomicI64::new(0),
            lock: Mutex::new(lock),
            clock,
        });
        let handle = writer::spawn(conn, rx, Arc::downgrade(&inner), writer)?;
        *inner.writer_thread.lock().expect("poisoned") = Some(handle);
        Ok(Self { inner })
    }

    /// Stops the writer after the queued jobs are committed.
    pub fn close(&self) {
        self.inner.writer.lock().expect("poisoned").take();
        if let Some(handle) = self.inner.writer_thread.lock().expect("poisoned").take() {
            let _ = handle.join();
        }
        // Releasing the lock lets another process (or a restart) open the database.
        self.inner.lock.lock().expect("poisoned").take();
    }

    /// Now, by the inbox's clock.
    fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Deliveries not yet finished.
    pub fn backlog(&self) -> i64 {
        self.inner.backlog.load(Ordering::Relaxed)
    }

    fn add_backlog(&self, delta: i64) {
        if delta != 0 {
            self.inner.backlog.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Quarantined requests not yet resolved (as of the last recount, plus those since).
    pub fn quarantine_held(&self) -> i64 {
        self.inner.quarantined.load(Ordering::Relaxed)
    }

    /// Takes one quarantine slot if fewer than `max` are held.
    fn reserve_quarantine(&self, max: i64) -> bool {
        self.inner
            .quarantined
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < max).then_some(held + 1)
            })
            .is_ok()
    }

    fn release_quarantine(&self) {
        self.inner.quarantined.fetch_sub(1, Ordering::Relaxed);
    }

    fn set_quarantine_held(&self, held: i64) {
        self.inner.quarantined.store(held, Ordering::Relaxed);
    }

    /// Commits performed so far.
    pub fn commits(&self) -> i64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// Resolves when new work may be due (after an accept, a replay, a retry or a conflict).
    pub async fn work_arrived(&self) {
        self.inner.work.notified().await
    }

    fn wake_workers(&self) {
        self.inner.work.notify_waiters();
        self.inner.work.notify_one();
    }
}
