//! The durable inbox: events, deliveries, attempts, quarantine and plugin state, behind one
//! storage contract.
//!
//! Layout: this file is the [`Inbox`] façade (open and close, and the in-process counters and
//! wake-up the operations keep); `store` is the contract every backend implements (the
//! [`Store`](store::Store) trait and its backend-neutral types); `sqlite/` is the SQLite
//! backend (the default) and `postgres/` the PostgreSQL one, the two rooms that speak SQL. One file per role holds that role's types and its
//! façade methods: `request` (what is stored), `accept` and `quarantine` (a request comes in),
//! `lease` (claim, finish, reclaim), `replay`, `retention` (pruning finished work, discard),
//! `state` (plugin state, the runtime's
//! `StateStore`) and `views` (read models); `error` is what they fail with. `contract/` is the
//! test suite every backend passes.
//!
//! What stays in the façade, not the backend: the backlog and held-quarantine counters (read on
//! every request by ingest's bounds, so kept in memory, recounted from the store at open), the
//! dispatcher's wake-up (`Notify`), and the clock. With SQLite they are exact, because one
//! process has the database (the store's lock). A store several nodes share (PostgreSQL) has the
//! counters read again from the database every second, and carries wake-ups between the nodes
//! (`Store::notify_work` / `work_notified`, a hint: the dispatcher polls too); its
//! [`cluster::ClusterStore`] is what the nodes coordinate through (heartbeats, plugin releases).
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
pub mod backup;
pub mod cluster;
mod commits;
#[cfg(test)]
mod contract;
mod error;
#[cfg(test)]
mod frozen;
mod lease;
mod postgres;
mod quarantine;
mod replay;
mod request;
mod retention;
mod sqlite;
mod state;
mod store;
mod views;

use std::{
    path::Path,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, task::JoinHandle};

pub(crate) use self::retention::DISCARDED_RESOLUTION;
pub use self::{
    accept::Accepted,
    commits::{CommitObserver, Commits},
    error::{InboxError, StorageError},
    lease::{ClaimRequest, Claimed, DEFAULT_LEASE_MS, Finish, Finished},
    quarantine::Quarantined,
    replay::ReplayFilter,
    request::RawRequest,
    retention::{PruneCursor, Pruned},
    sqlite::{WriterOptions, database_files as sqlite_files},
    state::{Edited, StateEdit, StateEntry, StateKeyFilter, StateValue},
    views::{
        AttemptRecord, DeadLetterGroup, DeliveryDetail, EventDetail, EventFilter, EventSummary,
        HeldRequest,
    },
};
use self::{
    cluster::ClusterStore,
    postgres::PostgresStore,
    sqlite::SqliteStore,
    store::{Counts, Store},
};
use crate::{
    clock::Clock,
    config::{Durability, Pooler, ServerConfig},
};

/// How to open the inbox: the writer's settings and where "now" comes from.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub writer: WriterOptions,
    /// The clock for the times the inbox stamps itself (a replay's due time, a resolution's).
    pub clock: Clock,
    /// What stands between hookd and a PostgreSQL database (not used with SQLite).
    pub pooler: Pooler,
}

impl OpenOptions {
    /// The server's writer settings, with `clock`.
    pub fn new(server: &ServerConfig, clock: Clock) -> Self {
        Self {
            writer: server.into(),
            clock,
            pooler: server.database_pooler,
        }
    }
}

impl From<WriterOptions> for OpenOptions {
    /// `writer`, on the system clock.
    fn from(writer: WriterOptions) -> Self {
        Self {
            writer,
            clock: Clock::system(),
            pooler: Pooler::None,
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
    /// Deliveries of accepts admitted under the backlog bound and not yet committed
    /// ([`Admission`]): counted against the bound with [`Inner::backlog`], so accepts waiting
    /// for one commit cannot all pass it.
    admitting: AtomicI64,
    /// Quarantined requests not yet resolved: the quarantine bound's measure, with
    /// [`Inner::quarantining`]. Recounted from the store after every replay.
    quarantined: AtomicI64,
    /// Quarantine writes admitted under the bound and not yet committed ([`Admission`]): kept
    /// apart from [`Inner::quarantined`], so a recount of what is stored does not forget them.
    quarantining: AtomicI64,
    /// Wakes the dispatcher when new work becomes due.
    work: Notify,
    /// Where the times the inbox stamps itself come from.
    clock: Clock,
    /// A store other nodes share, and what keeps this node in step with them: the counters
    /// resampled from the database, wake-ups sent to and heard from the other nodes.
    shared: Option<SharedStore>,
}

/// The façade's side of a store several nodes share.
struct SharedStore {
    cluster: Arc<dyn ClusterStore>,
    /// Set by a replay's or a reclaim's wake-up; a task turns it into one notification for the
    /// other nodes (accepts and finishes notify in their own transactions).
    outgoing: Arc<Notify>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// How often a shared store's counters are read again from the database (the other nodes'
/// accepts and finishes change them too).
const RESAMPLE_EVERY: Duration = Duration::from_secs(1);

impl Inbox {
    /// Opens (creating and migrating if needed) the SQLite database at `path`, with group
    /// commit, on the system clock.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, InboxError> {
        Self::open_with(path, WriterOptions::new(durability))
    }

    /// Opens (creating and migrating if needed) the SQLite database at `path`.
    pub fn open_with(path: &Path, options: impl Into<OpenOptions>) -> Result<Self, InboxError> {
        let OpenOptions { writer, clock, .. } = options.into();
        let store = SqliteStore::open(path, writer)?;
        let counts = store.counts_blocking();
        Self::on_store(Arc::new(store), counts, clock, None)
    }

    /// Connects to the PostgreSQL database at `url` (migrating it if needed), which other
    /// nodes may share. `options.clock` stamps the inbox's times; the writer settings are
    /// SQLite's and not used.
    pub async fn open_postgres(url: &str, options: OpenOptions) -> Result<Self, InboxError> {
        let store = Arc::new(
            PostgresStore::connect(url, postgres::DEFAULT_POOL_SIZE, options.pooler).await?,
        );
        let counts = store.counts().await;
        let shared = SharedStore {
            cluster: store.clone(),
            outgoing: Arc::new(Notify::new()),
            tasks: Mutex::new(Vec::new()),
        };
        let inbox = Self::on_store(store, counts, options.clock, Some(shared))?;
        inbox.start_shared_tasks();
        Ok(inbox)
    }

    /// For a shared store: resample the counters, and carry wake-ups between the nodes (a
    /// notification is a hint; the dispatcher also polls).
    fn start_shared_tasks(&self) {
        let Some(shared) = &self.inner.shared else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let resample = tokio::spawn(resample(weak.clone()));
        let store = self.inner.store.clone();
        let outgoing = shared.outgoing.clone();
        let send = tokio::spawn(async move {
            loop {
                outgoing.notified().await;
                if let Err(e) = store.notify_work().await {
                    tracing::debug!(error = %e, "could not tell the other nodes about new work");
                }
            }
        });
        let store = self.inner.store.clone();
        let hear = tokio::spawn(async move {
            loop {
                store.work_notified().await;
                let Some(inner) = weak.upgrade() else { return };
                inner.work.notify_waiters();
                inner.work.notify_one();
            }
        });
        shared
            .tasks
            .lock()
            .expect("poisoned")
            .extend([resample, send, hear]);
    }

    /// Whether this process is the only one on the database (SQLite): then every lease in it is
    /// this process's or a dead one's.
    pub fn single_node(&self) -> bool {
        self.store().capabilities().single_node
    }

    /// Whether state reads see writes whose commit is queued (SQLite's single writer): then
    /// attempts on a hot key may run one after another without waiting for each commit.
    pub fn reads_queued_state(&self) -> bool {
        self.store().capabilities().reads_queued_state
    }

    /// The coordination store of a database several nodes share (`None` for SQLite).
    pub fn cluster(&self) -> Option<Arc<dyn ClusterStore>> {
        self.inner.shared.as_ref().map(|s| s.cluster.clone())
    }

    /// The façade over `store`, its counters taken from `counts` (what is stored; the store is
    /// closed again if they could not be read).
    fn on_store(
        store: Arc<dyn Store>,
        counts: Result<Counts, InboxError>,
        clock: Clock,
        shared: Option<SharedStore>,
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
                admitting: AtomicI64::new(0),
                quarantined: AtomicI64::new(counts.quarantined),
                quarantining: AtomicI64::new(0),
                work: Notify::new(),
                clock,
                shared,
            }),
        })
    }

    /// The storage backend.
    fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// Stops the writes after the queued ones are committed, and releases the database.
    pub fn close(&self) {
        if let Some(shared) = &self.inner.shared {
            for task in shared.tasks.lock().expect("poisoned").drain(..) {
                task.abort();
            }
        }
        self.store().close();
    }

    /// Now, by the inbox's clock.
    fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The clock the inbox stamps and compares with: on a shared database it follows the
    /// database server's, so what else stamps rows or reads their times (ingest's receipt
    /// time, the nodes' liveness) uses it too.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Deliveries not yet finished. Never below 0: on a shared database a recount can land
    /// between a finish's commit and its own decrement, which then takes one too many.
    pub fn backlog(&self) -> i64 {
        self.inner.backlog.load(Ordering::Relaxed).max(0)
    }

    /// Admits an event with `handlers` deliveries under the backlog bound `max`: `None` when
    /// the backlog and the accepts already admitted reach it. The [`Admission`] is held until
    /// the accept has returned (and counted what it committed in the backlog); a race between
    /// two admissions refuses rather than overshoots.
    pub fn admit(&self, max: u64, handlers: usize) -> Option<Admission> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        Admission::under(
            &self.inner,
            |inner| &inner.admitting,
            || self.backlog(),
            max,
            handlers as i64,
        )
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

    /// Admits one quarantine write if the requests held and the writes in flight are fewer
    /// than `max`; the [`Admission`] is held until the write has returned.
    fn admit_quarantine(&self, max: i64) -> Option<Admission> {
        Admission::under(
            &self.inner,
            |inner| &inner.quarantining,
            || self.quarantine_held(),
            max,
            1,
        )
    }

    /// Counts one more quarantined request held (its write committed).
    fn quarantine_stored(&self) {
        self.inner.quarantined.fetch_add(1, Ordering::Relaxed);
    }

    fn set_quarantine_held(&self, held: i64) {
        self.inner.quarantined.store(held, Ordering::Relaxed);
    }

    /// Commits performed so far.
    pub fn commits(&self) -> i64 {
        self.store().commits().count()
    }

    /// Reports every later commit's size and duration to `observer` (the metrics); the first
    /// observer set is the one kept.
    pub fn observe_commits(&self, observer: CommitObserver) {
        self.store().commits().observe(observer);
    }

    /// Resolves when new work may be due (after an accept, a replay, a retry, a conflict, or a
    /// claim that marked a stale head: its key's next delivery may run now).
    pub async fn work_arrived(&self) {
        self.inner.work.notified().await
    }

    /// Wakes this node's dispatcher. Enough after an accept or a finish: a store other nodes
    /// share tells them itself, in the transaction that made the work ([`Store::accept`],
    /// [`Store::finish`]).
    fn wake_here(&self) {
        self.inner.work.notify_waiters();
        self.inner.work.notify_one();
    }

    /// Wakes this node's dispatcher and tells the other nodes (after a replay or a reclaim).
    fn wake_workers(&self) {
        self.wake_here();
        if let Some(shared) = &self.inner.shared {
            shared.outgoing.notify_one();
        }
    }
}

/// A write's place under a bound (an event's under the backlog bound, [`Inbox::admit`]; a
/// quarantined request's under the quarantine bound), given back when dropped.
pub struct Admission {
    inner: Arc<Inner>,
    weight: i64,
    /// The counter of admissions in flight it is counted in.
    pending: fn(&Inner) -> &AtomicI64,
}

impl Admission {
    /// Counts `weight` in `pending` first, then admits it if what is `held` (read after) and
    /// what was pending before stay under `max`: a race between two admissions refuses rather
    /// than overshoots. The write that commits counts itself in `held` before its admission is
    /// dropped, so it is never out of both.
    fn under(
        inner: &Arc<Inner>,
        pending: fn(&Inner) -> &AtomicI64,
        held: impl FnOnce() -> i64,
        max: i64,
        weight: i64,
    ) -> Option<Self> {
        let before = pending(inner).fetch_add(weight, Ordering::Relaxed);
        let admission = Admission {
            inner: inner.clone(),
            weight,
            pending,
        };
        (max > held().saturating_add(before)).then_some(admission)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        (self.pending)(&self.inner).fetch_sub(self.weight, Ordering::Relaxed);
    }
}

/// Reads a shared store's counters again every [`RESAMPLE_EVERY`] until the inbox is gone: the
/// backlog and quarantine bounds then count every node's work, give or take a second.
async fn resample(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(RESAMPLE_EVERY).await;
        let Some(inner) = inner.upgrade() else { return };
        match inner.store.counts().await {
            Ok(counts) => {
                inner.backlog.store(counts.backlog, Ordering::Relaxed);
                inner
                    .quarantined
                    .store(counts.quarantined, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, "could not recount the backlog"),
        }
    }
}
