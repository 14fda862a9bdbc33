//! The durable inbox: events, deliveries, attempts, quarantine and plugin state, behind one
//! storage contract.
//!
//! Layout: this file is the [`Inbox`] façade (open and close, and the in-process counters and
//! wake-up the operations keep); `store` is the contract every backend implements (the
//! [`Store`](store::Store) trait and its backend-neutral types); `sqlite/` is the SQLite
//! backend (the default) and `postgres/` the PostgreSQL one, the two rooms that speak SQL. One file per role holds that role's types and its
//! façade methods: `request` (what is stored), `accept` and `quarantine` (a request comes in),
//! `lease` (claim, finish, reclaim), `replay`, `state` (plugin state, the runtime's
//! `StateStore`) and `views` (read models); `error` is what they fail with. `contract/` is the
//! test suite every backend passes.
//!
//! What stays in the façade, not the backend: the backlog and held-quarantine counters (read on
//! every request by ingest's bounds, so kept in memory, recounted from the store at open), the
//! dispatcher's wake-up (`Notify`), and the clock. They are exact because one process has the
//! database (the SQLite store's lock); a store shared by several nodes would have to sample the
//! counters and wake through the database, behind the trait.
//!
//! Invariants:
//! - Only `sqlite/` and `postgres/` speak SQL, and each alone names its engine's crates; no
//!   storage-engine type appears in what the inbox exports.
//! - A caller is answered only after the commit that holds its change.
//! - `(source, event_id)` is unique (decided by the database, not a check-then-insert).
//! - Every state transition of a delivery is one store operation, so a crash between two steps
//!   of one transition is impossible.
//! - The times the inbox stamps itself come from the [`Clock`] it was opened with; the store
//!   is given every time, never reads one.

mod accept;
#[cfg(test)]
mod contract;
mod error;
mod lease;
mod postgres;
mod quarantine;
mod replay;
mod request;
mod sqlite;
mod state;
mod store;
mod views;

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
};

use tokio::sync::Notify;

pub use self::{
    accept::Accepted,
    error::{InboxError, StorageError},
    lease::{ClaimRequest, Claimed, DEFAULT_LEASE_MS, Finish, Finished},
    quarantine::Quarantined,
    replay::ReplayFilter,
    request::RawRequest,
    sqlite::WriterOptions,
    views::{AttemptRecord, DeliveryDetail, EventDetail, EventFilter, EventSummary},
};
use self::{
    postgres::PostgresStore,
    sqlite::SqliteStore,
    store::{Counts, Store},
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
    /// The storage backend.
    store: Arc<dyn Store>,
    /// Deliveries in an open state (`DeliveryState::OPEN`): the backlog bound's measure.
    backlog: AtomicI64,
    /// Quarantined requests not yet resolved (plus writes in flight): the quarantine bound's
    /// measure. Recounted from the store after every replay.
    quarantined: AtomicI64,
    /// Wakes the dispatcher when new work becomes due.
    work: Notify,
    /// Where the times the inbox stamps itself come from.
    clock: Clock,
}

impl Inbox {
    /// Opens (creating and migrating if needed) the SQLite database at `path`, with group
    /// commit, on the system clock.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, InboxError> {
        Self::open_with(path, WriterOptions::new(durability))
    }

    /// Opens (creating and migrating if needed) the SQLite database at `path`.
    pub fn open_with(path: &Path, options: impl Into<OpenOptions>) -> Result<Self, InboxError> {
        let OpenOptions { writer, clock } = options.into();
        let store = SqliteStore::open(path, writer)?;
        let counts = store.counts_blocking();
        Self::on_store(Arc::new(store), counts, clock)
    }

    /// Connects to the PostgreSQL database at `url` (migrating it if needed), which other
    /// nodes may share. `options.clock` stamps the inbox's times; the writer settings are
    /// SQLite's and not used.
    pub async fn open_postgres(url: &str, options: OpenOptions) -> Result<Self, InboxError> {
        let store = PostgresStore::connect(url, postgres::DEFAULT_POOL_SIZE).await?;
        let counts = store.counts().await;
        Self::on_store(Arc::new(store), counts, options.clock)
    }

    /// The façade over `store`, its counters taken from `counts` (what is stored; the store is
    /// closed again if they could not be read).
    fn on_store(
        store: Arc<dyn Store>,
        counts: Result<Counts, InboxError>,
        clock: Clock,
    ) -> Result<Self, InboxError> {
        let counts = match counts {
            Ok(counts) => counts,
            Err(e) => {
                store.close();
                return Err(e);
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                backlog: AtomicI64::new(counts.backlog),
                quarantined: AtomicI64::new(counts.quarantined),
                work: Notify::new(),
                clock,
            }),
        })
    }

    /// The storage backend.
    fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// Stops the writes after the queued ones are committed, and releases the database.
    pub fn close(&self) {
        self.store().close();
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
        self.store().commits()
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
