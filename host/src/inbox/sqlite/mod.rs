//! The SQLite backend of the inbox: one database file (WAL), one writer thread that commits in
//! groups, a pool of read connections.
//!
//! [`SqliteStore`] implements the storage contract ([`Store`]) by running each operation as a
//! function of one `&Connection`: writes as jobs of the writer (`writer.rs`), reads on a pooled
//! connection (`connection.rs`). The operations' SQL is one file per role (`accept`,
//! `quarantine`, `lease`, `replay`, `retention`, `state`, `views`), sharing `sql.rs` (state sets as SQL,
//! stored headers); `schema.rs` holds the migrations and `error.rs` sorts SQLite's errors into
//! the inbox's.
//!
//! Invariants:
//! - This room is the only code that names rusqlite, and with `inbox/postgres/` the only code
//!   that speaks SQL.
//! - Every write goes through the one writer, so a caller is answered only after the commit
//!   that holds its change, and the writer is the only connection that writes (which keeps the
//!   head-of-key check race-free).
//! - One process per database: the locks on `<database>.lock` and on the database file itself
//!   (the same under every name of it) are held from open to close, which is what makes this
//!   store [`Capabilities::single_node`].

mod accept;
pub(super) mod backup;
mod checkpoint;
mod connection;
mod error;
mod lease;
mod quarantine;
mod queued;
mod replay;
mod retention;
pub(in crate::inbox) mod schema;
mod sql;
mod state;
mod views;
mod walks;
mod writer;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread,
};

use rusqlite::Connection;

use self::sql::headers_json;
pub use self::{connection::database_files, writer::WriterOptions};
use super::{
    Accepted, ClaimRequest, Commits, DeadLetterGroup, Edited, EventDetail, EventFilter,
    EventSummary, Finish, Finished, HeldRequest, InboxError, Pruned, Quarantined, RawRequest,
    ReplayFilter, StateEdit, StateEntry, StateKeyFilter, StateValue,
    retention::PruneBatch,
    store::{Capabilities, ClaimOutcome, Counts, Decide, NewEvent, Reclaimed, Store},
};
use crate::{
    ids::SourceName,
    model::{DeliveryState, StateUsage},
};

/// The inbox's SQLite database; cheap to clone (reads run on the blocking pool with a clone).
#[derive(Clone)]
pub(super) struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database file (read connections are opened on it as needed).
    path: PathBuf,
    /// The writer's queue; `None` once closed.
    writer: Mutex<Option<writer::Queue>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    /// The read connections: idle ones, and how many are in use.
    readers: connection::Readers,
    /// Commits done by the writer; lets tests and benchmarks see group commit at work.
    commits: Arc<Commits>,
    /// Held while open: one hookd per database, because start-up takes back every lease.
    lock: Mutex<Option<connection::DatabaseLock>>,
    /// What the writer's batches say of the storage, for readiness.
    health: Arc<writer::Health>,
    /// Notices of work: in process, as no other process uses the database.
    work: tokio::sync::Notify,
    /// State writes queued but not committed yet, as reads see them, and the version clocks.
    queued: queued::QueuedState,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `path` and starts its writer.
    pub(super) fn open(path: &Path, options: WriterOptions) -> Result<Self, InboxError> {
        connection::check_existing(path)?;
        connection::create_parent(path)?;
        let mut lock = connection::lock_database(path)?;
        // A new database is created (empty) under its `.lock`, then locked itself too.
        connection::create_private(path)?;
        lock.hold_database(path)?;
        let conn = connection::open_connection(path, options.durability)?;
        let file = writer::DatabaseFile::of(path)?;
        // Checkpoints run on a thread of their own (`checkpoint.rs`), soon after commits. The
        // writer's automatic one, inline after a commit, is the bound on the WAL (~8 MiB): it
        // copies what that thread has not, when it lags under steady load.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 2000")?;
        schema::migrate(&conn)?;
        walks::install(&conn)?;
        let queued = queued::QueuedState::load(&conn)?;
        let (tx, rx) = mpsc::channel();
        let commits = Arc::new(Commits::default());
        let health = Arc::new(writer::Health::default());
        let checkpointer =
            checkpoint::Checkpointer::spawn(path, options.durability, Arc::clone(&health))?;
        let handle = writer::spawn(
            conn,
            rx,
            Arc::clone(&commits),
            options,
            checkpointer,
            Arc::clone(&health),
            file,
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                writer: Mutex::new(Some(tx)),
                writer_thread: Mutex::new(Some(handle)),
                readers: connection::Readers::default(),
                commits,
                lock: Mutex::new(Some(lock)),
                work: tokio::sync::Notify::new(),
                queued,
                health,
            }),
        })
    }
}

impl SqliteStore {
    /// [`Store::counts`] on the calling thread: the synchronous open reads them so.
    pub(super) fn counts_blocking(&self) -> Result<Counts, InboxError> {
        self.read_blocking(count)
    }
}

/// The counters as `conn` has them.
fn count(conn: &Connection) -> Result<Counts, InboxError> {
    Ok(Counts {
        backlog: lease::count_open(conn)?,
        quarantined: quarantine::count_held(conn)?,
    })
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            single_node: true,
            reads_queued_state: true,
        }
    }

    async fn counts(&self) -> Result<Counts, InboxError> {
        self.read(count).await
    }

    async fn accept(&self, event: NewEvent) -> Result<Accepted, InboxError> {
        // Serialised here, on the caller's task, not on the single writer's thread.
        let headers = headers_json(&event.request.headers);
        self.write(move |conn| accept::store_event(conn, &event, &headers))
            .await
    }

    async fn contains_event(&self, source: String, event_id: String) -> Result<bool, InboxError> {
        self.read(move |conn| accept::contains_event(conn, &source, &event_id))
            .await
    }

    async fn ping(&self) -> Result<(), InboxError> {
        // Reads may work while writes do not (a full, failing or stalled disk): the writer
        // says so.
        self.inner.health.check()?;
        self.read(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
    ) -> Result<i64, InboxError> {
        self.write(move |conn| quarantine::insert(conn, &source, &request, &reason))
            .await
    }

    async fn resolve_quarantine(
        &self,
        id: i64,
        at_ms: i64,
        resolution: String,
    ) -> Result<bool, InboxError> {
        self.write(move |conn| quarantine::resolve(conn, id, at_ms, &resolution))
            .await
    }

    async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError> {
        self.read(move |conn| quarantine::held_ids(conn, &filter))
            .await
    }

    async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError> {
        self.read(move |conn| quarantine::held(conn, id)).await
    }

    async fn quarantine_held_count(&self) -> Result<i64, InboxError> {
        self.read(quarantine::count_held).await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<ClaimOutcome, InboxError> {
        // The writer may run it long after this (queued behind a stalled disk): its leases run
        // from when it does.
        let asked = std::time::Instant::now();
        self.write(move |conn| lease::claim_due(conn, &request.ran_after(asked.elapsed())))
            .await
    }

    async fn finish(&self, finish: Finish) -> Result<Finished, InboxError> {
        // Weighted by its state bytes, so one group commit carries a bounded amount of them; a
        // state commit weighs at least 1, which keeps it in stamping order in the writer, and
        // so does one that only read (a queued write it read is then committed before it).
        let ordered = finish.writes_state() || finish.checks_state();
        let weight = state::state_bytes(&finish.state).max(usize::from(ordered));
        if !finish.writes_state() {
            return self
                .write_weighted(weight, move |conn| lease::finish_attempt(conn, &finish, 0))
                .await;
        }
        // Stamped and queued in one step, so versions enter the writer's queue in order; its
        // writes are visible to reads from now until the commit is answered (`queued.rs`).
        let plugin = finish.plugin.to_string();
        let keys: Vec<String> = finish.state.writes.keys().cloned().collect();
        let (answer, version) = {
            let mut stamping = self.inner.queued.stamping();
            let version = stamping.next_version(&plugin);
            stamping.queued(&plugin, &finish.state, version);
            let answer = self.enqueue(weight, move |conn| {
                lease::finish_attempt(conn, &finish, version)
            });
            (answer, version)
        };
        // Answered (the queued writes forgotten) whatever became of the job, a writer gone or
        // this future dropped included: a write left queued would make every later reader of
        // its keys conflict.
        let _answered = queued::Answered {
            queued: &self.inner.queued,
            plugin,
            keys,
            version,
        };
        match answer {
            Ok(answer) => answer.await.unwrap_or(Err(InboxError::WriterGone)),
            Err(e) => Err(e),
        }
    }

    async fn reclaim_expired(&self, now_ms: i64, decide: Decide) -> Result<Reclaimed, InboxError> {
        self.write(move |conn| lease::take_back(conn, now_ms, now_ms, &decide))
            .await
    }

    async fn reclaim_all(&self, now_ms: i64, decide: Decide) -> Result<Reclaimed, InboxError> {
        self.write(move |conn| lease::take_back(conn, now_ms, i64::MAX, &decide))
            .await
    }

    async fn replay(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        let state = filter.replayed_state()?;
        let selecting = filter.clone();
        self.select_then_write(
            filter.dry_run,
            move |conn| replay::matching_deliveries(conn, &selecting, state),
            move |conn, ids| replay::replay_ids(conn, ids, &filter, state, now_ms),
        )
        .await
    }

    async fn oldest_due(&self, now_ms: i64) -> Result<Option<i64>, InboxError> {
        self.read(move |conn| lease::oldest_due(conn, now_ms)).await
    }

    async fn prune(&self, batch: PruneBatch) -> Result<Pruned, InboxError> {
        self.write(move |conn| retention::prune(conn, &batch)).await
    }

    async fn discard(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        let state = filter.discardable_state()?;
        let dry_run = filter.dry_run;
        self.select_then_write(
            dry_run,
            move |conn| replay::matching_deliveries(conn, &filter, state),
            move |conn, ids| retention::discard_ids(conn, ids, state, now_ms),
        )
        .await
    }

    async fn discard_quarantine(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        let dry_run = filter.dry_run;
        self.select_then_write(
            dry_run,
            move |conn| quarantine::held_ids(conn, &filter),
            move |conn, ids| retention::discard_held(conn, ids, now_ms),
        )
        .await
    }

    async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError> {
        self.read(move |conn| lease::next_due_after(conn, after_ms))
            .await
    }

    fn state_get_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), InboxError> {
        match self.inner.queued.get(plugin, key) {
            Some(queued) => Ok(queued),
            None => self.read_blocking(|conn| state::get(conn, plugin, key)),
        }
    }

    fn state_stat_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<u64>, i64), InboxError> {
        match self.inner.queued.stat(plugin, key) {
            Some(queued) => Ok(queued),
            None => self.read_blocking(|conn| state::stat(conn, plugin, key)),
        }
    }

    fn state_usage_blocking(&self, plugin: &str) -> Result<StateUsage, InboxError> {
        self.read_blocking(|conn| state::usage(conn, plugin))
    }

    async fn state_keys(
        &self,
        plugin: String,
        filter: StateKeyFilter,
    ) -> Result<Vec<StateEntry>, InboxError> {
        self.read(move |conn| state::list(conn, &plugin, &filter))
            .await
    }

    async fn state_value(
        &self,
        plugin: String,
        key: String,
    ) -> Result<Option<StateValue>, InboxError> {
        self.read(move |conn| state::value(conn, &plugin, &key))
            .await
    }

    async fn edit_state(&self, edit: StateEdit, now_ms: i64) -> Result<Edited, InboxError> {
        let weight = (edit.key.len() + edit.value.as_ref().map_or(0, Vec::len)).max(1);
        let answer = {
            let mut stamping = self.inner.queued.stamping();
            let version = stamping.next_version(edit.plugin.as_str());
            self.enqueue(weight, move |conn| {
                state::edit(conn, &edit, now_ms, version)
            })?
        };
        answer.await.map_err(|_| InboxError::WriterGone)?
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError> {
        self.read(move |conn| views::list_events(conn, &filter))
            .await
    }

    async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError> {
        self.read(move |conn| views::event_detail(conn, &source, &event_id))
            .await
    }

    async fn state_counts(
        &self,
        states: Vec<DeliveryState>,
    ) -> Result<Vec<(String, i64)>, InboxError> {
        self.read(move |conn| views::state_counts(conn, &states))
            .await
    }

    async fn dead_letter_groups(&self) -> Result<Vec<DeadLetterGroup>, InboxError> {
        self.read(views::dead_letter_groups).await
    }

    async fn held_requests(
        &self,
        limit: usize,
        before_id: Option<i64>,
    ) -> Result<Vec<HeldRequest>, InboxError> {
        self.read(move |conn| views::held_requests(conn, limit, before_id))
            .await
    }

    async fn notify_work(&self) -> Result<(), InboxError> {
        self.inner.work.notify_waiters();
        self.inner.work.notify_one();
        Ok(())
    }

    async fn work_notified(&self) {
        self.inner.work.notified().await
    }

    fn commits(&self) -> &Commits {
        &self.inner.commits
    }

    fn close(&self) {
        self.inner.writer.lock().expect("poisoned").take();
        if let Some(handle) = self.inner.writer_thread.lock().expect("poisoned").take() {
            let _ = handle.join();
        }
        // The readers go first, the pooled ones and those still reading (waited for):
        // closing the lock's descriptor on the database file releases every SQLite lock this
        // process holds on it (POSIX locks are per process), which open connections would
        // otherwise go on without.
        self.inner.readers.close();
        // Releasing the lock lets another process (or a restart) open the database.
        self.inner.lock.lock().expect("poisoned").take();
    }
}

/// A database file in its own temporary directory, for one test: the contract suite's SQLite
/// backend, and what the room's own tests open.
#[cfg(test)]
pub(super) struct TempDatabase {
    dir: tempfile::TempDir,
}

#[cfg(test)]
impl TempDatabase {
    pub(super) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A fresh database for the contract suite (SQLite is always available).
    pub(super) async fn fresh() -> Option<Self> {
        Some(Self::new())
    }

    /// The database file.
    pub(super) fn path(&self) -> PathBuf {
        self.dir.path().join("hookd.db")
    }
}

#[cfg(test)]
#[async_trait::async_trait]
impl super::contract::Database for TempDatabase {
    async fn open(&self, clock: crate::clock::Clock) -> super::Inbox {
        let options = super::OpenOptions {
            writer: WriterOptions::new(crate::config::Durability::Normal),
            clock,
            pooler: crate::config::Pooler::None,
        };
        super::Inbox::open_with(&self.path(), options).unwrap()
    }

    async fn at_first_schema(&self, rows: &str) {
        // SQLite spells a blob from hex `unhex('<hex>')`.
        let rows = rows.replace("decode(", "unhex(").replace(", 'hex')", ")");
        let conn = rusqlite::Connection::open(self.path()).unwrap();
        conn.execute_batch(&format!(
            "BEGIN; {} {rows} PRAGMA user_version = 1; COMMIT;",
            schema::MIGRATIONS[0]
        ))
        .unwrap();
    }

    async fn repair(&self, sql: &str) {
        let conn = rusqlite::Connection::open(self.path()).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        conn.execute_batch(sql).unwrap();
    }
}
