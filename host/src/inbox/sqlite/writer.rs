//! The single writer: every write is a job queued to one thread, which runs whatever is queued
//! in one transaction (group commit) and answers each job after the commit.
//!
//! Invariants:
//! - A caller's future resolves only after the `COMMIT` that holds its change returned, so a 202
//!   is never sent for an event that is not on disk.
//! - One failing job never undoes another. A batch first runs its jobs one after another in
//!   its transaction; if one fails, the transaction is rolled back whole and every job runs
//!   again, each in a savepoint of its own, so only the failing one's writes are undone. (A
//!   savepoint copies each page a job first touches into a sub-journal: a quarter of the
//!   writer's time under ingest, spent for the rare batch with a failure.) So a job is `Fn`:
//!   it may run twice, and only the run that commits counts. Unless the failure took the
//!   transaction with it (SQLite rolls the whole transaction back on a full disk or an I/O
//!   error): then the whole batch fails, each job answered with an error, none redone.
//! - Every answer says what was committed: `Ok` only for a write its batch's `COMMIT` holds,
//!   in the file the database's path leads to. A database file deleted, moved or replaced
//!   while open would take SQLite's writes on, where no later start finds them: each batch
//!   looks at the path before it runs and after its `COMMIT`, and while the path does not
//!   lead to the file every batch and read fails (503); a deleted file never comes back. So
//!   for its `-wal`, where commits wait for the next checkpoint: once found deleted or replaced,
//!   what was committed is copied from the log still open into the database file, and nothing
//!   more is stored until a restart.
//! - One batch carries at most [`MAX_BATCH`] jobs and, past its first, [`MAX_BATCH_WEIGHT`] bulk
//!   bytes, so a commit's latency stays bounded. A job that would pass it is deferred to the
//!   next batch, and so is every weighted job queued after it: weighted jobs (every plugin
//!   state commit is one, and every finish that read state) never overtake each other, so
//!   state commits run in the order they were stamped, and a commit's version is the one its
//!   queued writes were read at (a reordered commit took a later version, which the queue
//!   then handed out again: a read of a write that never committed passed its version check).
//! - A batch that changed no row (an idle dispatcher's claim that found nothing, a reclaim pass
//!   with no expired lease) writes nothing: SQLite's `COMMIT` of a transaction without a dirty
//!   page neither appends to the WAL nor syncs, and it is not counted as a commit. An idle host
//!   makes no commits.

use std::sync::LazyLock;

use std::sync::{Arc, mpsc};
use tracing::Level;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::{SqliteStore, checkpoint::Checkpointer, connection::WAL, error::from_shared};
use crate::{
    config::{Durability, ServerConfig},
    inbox::{Commits, InboxError},
    telemetry::Repeated,
};

/// How the writer turns queued writes into transactions (`[server]` `durability` and
/// `group_commit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// How hard each commit is pushed to disk before callers are answered.
    pub durability: Durability,
    /// Batch whatever is queued into one transaction (one fsync shared by every caller in it).
    /// `false` commits each write in its own transaction: only for measuring what batching buys.
    pub group_commit: bool,
}

impl WriterOptions {
    /// Group commit at the given durability (the production setting).
    pub fn new(durability: Durability) -> Self {
        Self {
            durability,
            group_commit: true,
        }
    }
}

impl From<&ServerConfig> for WriterOptions {
    fn from(server: &ServerConfig) -> Self {
        Self {
            durability: server.durability,
            group_commit: server.group_commit,
        }
    }
}

/// One queued write: run inside the batch's transaction, answered after the batch's commit.
/// One allocation per write (plus the reply channel); the batch vector is reused.
pub(super) trait Job: Send {
    /// Runs the write inside the open transaction, in a savepoint of its own if `isolated`;
    /// whether it succeeded. A run replaces the result of any run before it.
    fn run(&mut self, conn: &Connection, isolated: bool) -> bool;
    /// Answers the caller with the write's result, or why the batch did not commit.
    fn answer(self: Box<Self>, commit: Result<(), Failed>);
    /// Bulk bytes it writes (plugin state), bounded per batch by [`MAX_BATCH_WEIGHT`]. At least
    /// 1 for a job that must keep its place among the weighted ones (a state commit).
    fn weight(&self) -> usize;
}

struct Write<T, F> {
    weight: usize,
    work: F,
    result: Option<Result<T, InboxError>>,
    reply: oneshot::Sender<Result<T, InboxError>>,
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: Fn(&Connection) -> Result<T, InboxError> + Send,
{
    fn run(&mut self, conn: &Connection, isolated: bool) -> bool {
        let result = if isolated {
            in_savepoint(conn, &self.work)
        } else {
            (self.work)(conn)
        };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, commit: Result<(), Failed>) {
        let answer = match (commit, self.result) {
            (Ok(()), Some(result)) => result,
            // Not reachable: a batch is committed only after every job in it ran.
            (Ok(()), None) => Err(InboxError::WriterGone),
            (Err(Failed::Sqlite(e)), _) => Err(from_shared(e)),
            (Err(moved @ (Failed::Moved(_) | Failed::LogMoved(_))), _) => {
                Err(unavailable(moved.to_string()))
            }
            // The write whose failure took the transaction with it says why.
            (Err(Failed::RolledBack), Some(Err(e))) => Err(e),
            (Err(Failed::RolledBack), _) => {
                Err(InboxError::Unavailable(Arc::new(std::io::Error::other(
                    "SQLite rolled back the transaction of this write's batch when another \
                     write in it failed (a full disk, an I/O error); nothing of it was stored",
                ))))
            }
        };
        let _ = self.reply.send(answer);
    }

    fn weight(&self) -> usize {
        self.weight
    }
}

/// Why a batch did not commit.
#[derive(Debug, Clone)]
pub(super) enum Failed {
    /// A statement of the writer's own (`BEGIN`, `COMMIT`) failed.
    Sqlite(Arc<rusqlite::Error>),
    /// SQLite rolled the whole transaction back when a write in it failed (a full disk, an I/O
    /// error; it may do so for those): nothing of the batch is stored, and nothing can be
    /// redone in that transaction.
    RolledBack,
    /// The database file was deleted or replaced while hookd had it open: SQLite goes on
    /// writing to the open file, which no later start will find, so nothing is answered as
    /// stored.
    Moved(Arc<std::path::PathBuf>),
    /// Its write-ahead log was (the path given).
    LogMoved(Arc<std::path::PathBuf>),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(e) => e.fmt(f),
            Self::RolledBack => f.write_str(
                "SQLite rolled the transaction back when a write in it failed (see its error)",
            ),
            Self::LogMoved(path) => write!(
                f,
                "the database's write-ahead log {} was deleted, moved or replaced while hookd \
                 had it open; what was committed was copied into the database file when this \
                 was found, and nothing more is stored: restart hookd",
                path.display()
            ),
            Self::Moved(path) => write!(
                f,
                "the database file {} was deleted, moved or replaced while hookd had it open; \
                 nothing is stored until it is back (a deleted one cannot come back: stop hookd, \
                 restore the file, or move its -wal and -shm aside to start a new database)",
                path.display()
            ),
        }
    }
}

/// What the writer's batches say of the storage under the database, for readiness
/// (`GET /readyz`): a node whose disk stopped or keeps failing writes is taken out of rotation,
/// though its reads still work.
#[derive(Default)]
pub(super) struct Health {
    /// When the batch under way started; `None` between batches.
    busy_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// The last batch that failed, and why; cleared by the next one that wrote.
    failed: std::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Set while the database's path does not lead to the file the writer opened (deleted,
    /// moved away, another file there): nothing read or written through the files still open
    /// is true of the database then. Cleared if the file comes back (a deleted one cannot:
    /// held open, its inode is not reused).
    moved: std::sync::atomic::AtomicBool,
    /// Why, as last found (the path is in it).
    moved_why: std::sync::Mutex<String>,
    /// While moved: whether everything in the log still open has been copied into the
    /// database file (tried again at every look until it has).
    log_copied: std::sync::atomic::AtomicBool,
    /// Since when the checkpoints have failed, each one since, and why the last did; cleared
    /// by one that worked. Writes go on meanwhile, but the log is not copied into the database
    /// file and grows until the disk is full (a database file made read-only or immutable).
    checkpoints_failing: std::sync::Mutex<Option<(std::time::Instant, String)>>,
}

/// The storage under the database cannot serve now, for `why`.
fn unavailable(why: String) -> InboxError {
    InboxError::Unavailable(Arc::new(std::io::Error::other(why)))
}

/// A batch under way this long is a stalled disk (a commit takes milliseconds).
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_secs(2);
/// A failed batch this recent makes the database unready. Not for longer: a node out of
/// rotation gets no writes that could show its disk is back.
const FAILED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Copies what was committed and not yet checkpointed, which is in the log the writer still
/// has open, into the database file, so that it is not lost with that log (deleted, or moved
/// away with the database): whether all of it is copied. `PASSIVE`, so it never waits: a
/// reader still on an older snapshot leaves the rest to the next try.
fn copy_open_log(conn: &Connection) -> bool {
    let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
    });
    match copied {
        Ok((log, copied)) if log == copied => {
            tracing::warn!(
                frames = copied,
                "what was committed is copied from the open log into the database file"
            );
            true
        }
        Ok((log, copied)) => {
            tracing::debug!(
                log,
                copied,
                "the open log is copied into the database file in part; the rest at the next try"
            );
            false
        }
        Err(e) => {
            static FAILED: LazyLock<Repeated> = LazyLock::new(|| {
                Repeated::new(
                    Level::ERROR,
                    "the open log could not be copied into the database file",
                )
            });
            if let Some(left_out) = FAILED.write() {
                tracing::error!(error = %e, left_out, "the open log could not be copied into the database file; tried again at the next batch");
            }
            false
        }
    }
}

/// Checkpoints failing this long make the database unready: not one passing failure, but a
/// log that has stopped being copied into the database file.
const CHECKPOINTS_FAILING_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Health {
    /// Why the database cannot take writes now, if the writer says so (the path's absence is
    /// checked by every read, [`Health::still_there`]), or cannot for long (its checkpoints
    /// keep failing).
    pub(super) fn check(&self) -> Result<(), InboxError> {
        self.writes().map_err(unavailable)
    }

    /// How a checkpoint went (`Err`: why it failed).
    pub(super) fn checkpointed(&self, result: Result<(), String>) {
        self.checkpointed_at(result, std::time::Instant::now());
    }

    fn checkpointed_at(&self, result: Result<(), String>, at: std::time::Instant) {
        let mut failing = self.checkpoints_failing.lock().expect("poisoned");
        match result {
            Ok(()) => *failing = None,
            Err(why) => {
                let since = failing.as_ref().map_or(at, |f| f.0);
                *failing = Some((since, why));
            }
        }
    }

    fn writes(&self) -> Result<(), String> {
        if let Some((since, why)) = &*self.checkpoints_failing.lock().expect("poisoned")
            && since.elapsed() >= CHECKPOINTS_FAILING_FOR
        {
            return Err(format!(
                "the database's checkpoints have failed for {} s ({why}): its log is not \
                 copied into the database file and grows (a database file made read-only or \
                 immutable?)",
                since.elapsed().as_secs()
            ));
        }
        if let Some(since) = *self.busy_since.lock().expect("poisoned")
            && since.elapsed() >= STALLED_AFTER
        {
            return Err(format!(
                "the database's writer has been inside one commit for {} ms (a stalled disk?)",
                since.elapsed().as_millis()
            ));
        }
        match &*self.failed.lock().expect("poisoned") {
            Some((at, why)) if at.elapsed() < FAILED_WITHIN => Err(format!(
                "the database's last write failed {} ms ago: {why}",
                at.elapsed().as_millis()
            )),
            _ => Ok(()),
        }
    }

    /// Refuses every read and write while the database's path does not lead to its file.
    pub(super) fn still_there(&self) -> Result<(), InboxError> {
        if self.moved.load(std::sync::atomic::Ordering::Acquire) {
            return Err(unavailable(
                self.moved_why.lock().expect("poisoned").clone(),
            ));
        }
        Ok(())
    }

    /// Records whether `file`'s path still leads to it; logs the changes (not every batch
    /// that fails meanwhile).
    fn look(&self, file: &DatabaseFile, conn: &Connection) -> Option<Failed> {
        use std::sync::atomic::Ordering;
        let moved = file.moved();
        let was = self.moved.swap(moved.is_some(), Ordering::AcqRel);
        if let Some(failed) = moved.as_ref().filter(|_| !was) {
            let why = failed.to_string();
            tracing::error!("{why}");
            *self.moved_why.lock().expect("poisoned") = why;
            self.log_copied.store(false, Ordering::Release);
        } else if was && moved.is_none() {
            tracing::warn!(path = %file.path.display(), "the database's files are back: storing again");
        }
        if moved.is_some() && !self.log_copied.load(Ordering::Acquire) {
            self.log_copied
                .store(copy_open_log(conn), Ordering::Release);
        }
        moved
    }

    fn started(&self) {
        *self.busy_since.lock().expect("poisoned") = Some(std::time::Instant::now());
    }

    fn ended(&self, commit: &Result<(), Failed>, wrote: bool) {
        *self.busy_since.lock().expect("poisoned") = None;
        let mut failed = self.failed.lock().expect("poisoned");
        match commit {
            Err(e) => *failed = Some((std::time::Instant::now(), e.to_string())),
            Ok(()) if wrote => *failed = None,
            Ok(()) => {}
        }
    }
}

/// Upper bound of jobs in one group commit; keeps a single transaction's latency bounded.
const MAX_BATCH: usize = 2048;
/// Upper bound of bulk bytes (plugin state writes) in one group commit, beyond a batch's first
/// job: heavier jobs wait for a later batch while light ones (accepts, claims) go ahead, so an
/// ingest commit never queues behind more than about this much state.
const MAX_BATCH_WEIGHT: usize = 8 * 1024 * 1024;

impl SqliteStore {
    /// Runs `f` in the next group commit and returns its result once that commit is durable.
    pub(super) async fn write<T: Send + 'static>(
        &self,
        f: impl Fn(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        self.enqueue(0, f)?
            .await
            .map_err(|_| InboxError::WriterGone)?
    }

    /// An operator's bulk action in two steps: `select` finds the ids on the read pool (so a
    /// large selection holds up no accept), then, unless this is a dry run or it found none,
    /// `apply` changes them on the writer, re-checking each (it may have changed in between).
    /// Answers how many were found and how many were changed.
    pub(super) async fn select_then_write(
        &self,
        dry_run: bool,
        select: impl FnOnce(&Connection) -> Result<Vec<i64>, InboxError> + Send + 'static,
        apply: impl Fn(&Connection, &[i64]) -> Result<usize, InboxError> + Send + 'static,
    ) -> Result<(usize, usize), InboxError> {
        let ids = self.read(select).await?;
        let matched = ids.len();
        if dry_run || ids.is_empty() {
            return Ok((matched, 0));
        }
        let applied = self.write(move |conn| apply(conn, &ids)).await?;
        Ok((matched, applied))
    }

    /// [`SqliteStore::write`] for a job that writes `weight` bulk bytes (see [`MAX_BATCH_WEIGHT`]).
    pub(super) async fn write_weighted<T: Send + 'static>(
        &self,
        weight: usize,
        f: impl Fn(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        self.enqueue(weight, f)?
            .await
            .map_err(|_| InboxError::WriterGone)?
    }

    /// Queues `f` for the writer now (not on first poll); the receiver resolves after the commit.
    pub(super) fn enqueue<T: Send + 'static>(
        &self,
        weight: usize,
        f: impl Fn(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T, InboxError>>, InboxError> {
        let (tx, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Write {
            weight,
            work: f,
            result: None,
            reply: tx,
        });
        let writer = self.inner.writer.lock().expect("poisoned");
        writer
            .as_ref()
            .ok_or(InboxError::WriterGone)?
            .send(job)
            .map_err(|_| InboxError::WriterGone)?;
        Ok(rx)
    }
}

/// Runs one statement through the connection's statement cache (no re-parse per call).
pub(super) fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn in_savepoint<T>(
    conn: &Connection,
    f: impl Fn(&Connection) -> Result<T, InboxError>,
) -> Result<T, InboxError> {
    exec_cached(conn, "SAVEPOINT job")?;
    match f(conn) {
        Ok(value) => {
            exec_cached(conn, "RELEASE job")?;
            Ok(value)
        }
        // SQLite rolled back the whole transaction, savepoint and all: the write's own error
        // says why, and the batch is failed (`run_batch`).
        Err(e) if conn.is_autocommit() => Err(e),
        Err(e) => {
            exec_cached(conn, "ROLLBACK TO job")?;
            exec_cached(conn, "RELEASE job")?;
            Err(e)
        }
    }
}

/// Opens the batch's transaction and runs its jobs in it, straight through; if one fails,
/// rolls back and runs them all again, each in its own savepoint. Whether a row changed. A
/// failure that took the transaction with it (SQLite rolls back the whole transaction on a
/// full disk or an I/O error) fails the whole batch: no job is redone outside a transaction,
/// where each would commit alone while the batch is answered as failed.
fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<bool, Failed> {
    let begin = |conn: &Connection| {
        exec_cached(conn, "BEGIN IMMEDIATE").map_err(|e| Failed::Sqlite(Arc::new(e)))
    };
    begin(conn)?;
    let changes = conn.total_changes();
    if batch.iter_mut().all(|job| job.run(conn, false)) {
        return Ok(conn.total_changes() != changes);
    }
    if conn.is_autocommit() {
        return Err(Failed::RolledBack);
    }
    // The failed job may have written part of what it meant to: undo the batch, then redo it
    // with each job's writes undone alone if it fails.
    let _ = conn.execute_batch("ROLLBACK");
    begin(conn)?;
    let changes = conn.total_changes();
    for job in batch.iter_mut() {
        if !job.run(conn, true) && conn.is_autocommit() {
            return Err(Failed::RolledBack);
        }
    }
    Ok(conn.total_changes() != changes)
}

/// The single writer: takes whatever is queued (up to `max_batch` jobs and, past the first,
/// [`MAX_BATCH_WEIGHT`] bulk bytes; heavier jobs, and the weighted ones behind them, are
/// deferred, oldest first, to the next batches), runs it in one transaction, commits (the one fsync the whole batch shares), then
/// answers every job.
/// The writer's queue: what [`SqliteStore::enqueue`] sends jobs to.
pub(super) type Queue = mpsc::Sender<Box<dyn Job>>;

/// Starts the writer thread on `conn`, taking jobs from `jobs` until every [`Queue`] is dropped.
/// Its checkpoints run on a thread of their own ([`Checkpointer`]), which the writer stops and
/// joins when it ends.
pub(super) fn spawn(
    conn: Connection,
    jobs: mpsc::Receiver<Box<dyn Job>>,
    commits: Arc<Commits>,
    options: WriterOptions,
    checkpointer: Checkpointer,
    health: Arc<Health>,
    file: DatabaseFile,
) -> Result<std::thread::JoinHandle<()>, InboxError> {
    let max_batch = if options.group_commit { MAX_BATCH } else { 1 };
    std::thread::Builder::new()
        .name("inbox-writer".into())
        .spawn(move || {
            let around = Around {
                commits: &commits,
                checkpointer: &checkpointer,
                file: &file,
                health: &health,
            };
            writer_loop(conn, jobs, max_batch, &around);
            checkpointer.stop();
        })
        .map_err(InboxError::WriterSpawn)
}

/// The database file the writer opened, as the file system names it (device and inode), so a
/// batch can tell that the configured path still leads to the file it writes; and so for its
/// write-ahead log, where every commit is first written (a log deleted while open takes the
/// commits since the last checkpoint with it: SQLite goes on appending to the open file, which
/// no later start finds).
pub(super) struct DatabaseFile {
    path: Arc<std::path::PathBuf>,
    identity: (u64, u64),
    wal: Arc<std::path::PathBuf>,
    /// The log's, from the first time it is seen (SQLite creates it with its first write).
    wal_identity: std::sync::OnceLock<(u64, u64)>,
}

impl DatabaseFile {
    /// The file `path` leads to now (taken when the writer's connection has just opened it).
    pub(super) fn of(path: &std::path::Path) -> Result<Self, InboxError> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).map_err(|source| InboxError::Io {
            action: "reading",
            path: path.to_owned(),
            source,
        })?;
        let wal = super::connection::beside(&super::connection::target_file(path), WAL);
        let file = Self {
            path: Arc::new(path.to_owned()),
            identity: (meta.dev(), meta.ino()),
            wal: Arc::new(wal),
            wal_identity: std::sync::OnceLock::new(),
        };
        file.wal_moved();
        Ok(file)
    }

    /// Which path no longer leads to the file opened (the database's, else its log's): gone,
    /// or another file there. A `stat` that fails otherwise (a passing I/O error) says nothing
    /// either way.
    fn moved(&self) -> Option<Failed> {
        use std::os::unix::fs::MetadataExt as _;
        let database_moved = match std::fs::metadata(&*self.path) {
            Ok(meta) => (meta.dev(), meta.ino()) != self.identity,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if database_moved {
            Some(Failed::Moved(Arc::clone(&self.path)))
        } else if self.wal_moved() {
            Some(Failed::LogMoved(Arc::clone(&self.wal)))
        } else {
            None
        }
    }

    fn wal_moved(&self) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match std::fs::metadata(&*self.wal) {
            Ok(meta) => {
                let now = (meta.dev(), meta.ino());
                *self.wal_identity.get_or_init(|| now) != now
            }
            Err(e) => e.kind() == std::io::ErrorKind::NotFound && self.wal_identity.get().is_some(),
        }
    }
}

/// What the writer reports its batches to, and checks them against.
struct Around<'a> {
    commits: &'a Commits,
    checkpointer: &'a Checkpointer,
    file: &'a DatabaseFile,
    health: &'a Health,
}

fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Box<dyn Job>>,
    max_batch: usize,
    around: &Around<'_>,
) {
    let Around {
        commits,
        checkpointer,
        file,
        health,
    } = around;
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(max_batch.min(256));
    let mut deferred: std::collections::VecDeque<Box<dyn Job>> = Default::default();
    loop {
        let mut weight = 0;
        while batch.len() < max_batch
            && let Some(job) = deferred.front()
            && (batch.is_empty() || weight + job.weight() <= MAX_BATCH_WEIGHT)
        {
            weight += job.weight();
            batch.extend(deferred.pop_front());
        }
        if batch.is_empty() {
            match jobs.recv() {
                Ok(job) => {
                    weight += job.weight();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(job)
                    if job.weight() > 0
                        && (!deferred.is_empty() || weight + job.weight() > MAX_BATCH_WEIGHT) =>
                {
                    deferred.push_back(job);
                }
                Ok(job) => {
                    weight += job.weight();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        health.started();
        let mut wrote = false;
        // The path is looked at before every batch (a duplicate's changes nothing, but its
        // answer says the event is stored) and after every commit (it may go during one): a
        // batch is answered as stored only if the path led to the file before and after it.
        let commit = match health.look(file, &conn) {
            Some(moved) => Err(moved),
            None => match run_batch(&conn, &mut batch) {
                Ok(changed) => {
                    wrote = changed;
                    let commit =
                        exec_cached(&conn, "COMMIT").map_err(|e| Failed::Sqlite(Arc::new(e)));
                    if commit.is_err() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    match commit {
                        // Committed to a file the path may no longer lead to: a 503, the
                        // provider's retry finds it if it comes back (a duplicate).
                        Ok(()) => health.look(file, &conn).map_or(Ok(()), Err),
                        commit => commit,
                    }
                }
                Err(failed) => {
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    Err(failed)
                }
            },
        };
        health.ended(&commit, wrote);
        if let Err(Failed::Moved(_) | Failed::LogMoved(_)) = &commit {
            // Logged once, when found (`Health::look`).
        } else if let Err(e) = &commit {
            static FAILED: LazyLock<Repeated> =
                LazyLock::new(|| Repeated::new(Level::ERROR, "inbox: group commit failed"));
            if let Some(left_out) = FAILED.write() {
                tracing::error!(error = %e, jobs = batch.len(), left_out, "inbox: group commit failed");
            }
        } else if wrote {
            commits.committed(batch.len(), started);
            checkpointer.committed();
        }
        for job in batch.drain(..) {
            job.answer(commit.clone());
        }
    }
}

/// Helpers for tests of the SQLite room that need the writer held.
#[cfg(test)]
pub(super) mod testing {
    use rusqlite::Connection;
    use tokio::sync::oneshot;

    use super::SqliteStore;
    use crate::inbox::InboxError;

    /// A held writer ([`hold`]): sending to the first lets it go, the second answers then.
    pub(in crate::inbox::sqlite) type Hold = (
        std::sync::mpsc::Sender<()>,
        oneshot::Receiver<Result<(), InboxError>>,
    );

    /// Queues a write that blocks the writer, inside its transaction, until released; returns
    /// once the writer is inside it, so whatever is queued next waits for the next batch.
    pub(in crate::inbox::sqlite) fn hold(inbox: &SqliteStore) -> Hold {
        let (entered, inside) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let answer = inbox
            .enqueue(0, move |conn| {
                mark(conn)?;
                // A job may run twice (a failure in its batch); only the first run holds.
                if entered.send(()).is_ok() {
                    let _ = released.recv();
                }
                Ok(())
            })
            .unwrap();
        inside.recv().unwrap();
        (release, answer)
    }

    /// Writes a quarantine row (reason `~mark`, which the writer tests leave out), so the job's
    /// batch is a commit.
    pub(in crate::inbox::sqlite) fn mark(conn: &Connection) -> Result<(), InboxError> {
        conn.execute(
            "INSERT INTO quarantine (source, received_at, headers, body, reason)
             VALUES ('s', 0, '[]', x'', '~mark')",
            [],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as sync_mpsc;

    use rusqlite::params;

    use super::{testing::*, *};
    use crate::inbox::store::Store as _;

    type Answer<T> = oneshot::Receiver<Result<T, InboxError>>;

    /// Checkpoints that keep failing (a database file made read-only or immutable: writes go
    /// on into a log that is never copied back, and grows) make the database unready, once
    /// they have failed for a while; one that works again clears it. A single failure does not.
    #[test]
    fn checkpoints_failing_for_long_make_the_database_unready() {
        let health = Health::default();
        health.checkpointed(Err("disk I/O error".into()));
        assert!(health.check().is_ok(), "one failure is not a trend");
        let long_ago = std::time::Instant::now() - CHECKPOINTS_FAILING_FOR;
        let health = Health::default();
        health.checkpointed_at(Err("disk I/O error".into()), long_ago);
        health.checkpointed(Err("disk I/O error".into()));
        let unready = health.check().unwrap_err().to_string();
        assert!(
            unready.contains("checkpoints have failed for") && unready.contains("disk I/O error"),
            "{unready}"
        );
        health.checkpointed(Ok(()));
        assert!(health.check().is_ok());
    }

    fn open(dir: &tempfile::TempDir, group_commit: bool) -> SqliteStore {
        let options = WriterOptions {
            durability: Durability::Full,
            group_commit,
        };
        SqliteStore::open(&dir.path().join("hookd.db"), options).unwrap()
    }

    /// A writer inside one batch for longer than a commit takes makes the database unready
    /// (a stalled disk), though reads still work; it is ready again once the batch ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_stuck_in_a_batch_makes_the_database_unready() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        inbox.ping().await.unwrap();
        let (release, held) = hold(&inbox);
        tokio::time::sleep(STALLED_AFTER + std::time::Duration::from_millis(100)).await;
        let unready = inbox.ping().await.unwrap_err();
        assert!(unready.to_string().contains("stalled disk"), "{unready}");
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        inbox.ping().await.unwrap();
    }

    /// A replay's or a discard's select runs beside the writer, not on it: over a large inbox it
    /// can take a second, and every `202` waits for the writer. With the writer held, dry runs
    /// (the select alone) still answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_selects_of_replays_and_discards_do_not_wait_for_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let dry = crate::inbox::ReplayFilter {
            limit: 100,
            dry_run: true,
            ..Default::default()
        };
        let within = std::time::Duration::from_secs(10);
        let answered = |what: &str, result: Result<Result<(usize, usize), InboxError>, _>| {
            let counts = result
                .unwrap_or_else(|_| panic!("a dry {what} waited for the held writer"))
                .unwrap();
            assert_eq!(counts, (0, 0), "{what}");
        };
        answered(
            "replay",
            tokio::time::timeout(within, inbox.replay(dry.clone(), 0)).await,
        );
        answered(
            "discard",
            tokio::time::timeout(within, inbox.discard(dry.clone(), 0)).await,
        );
        answered(
            "quarantine discard",
            tokio::time::timeout(within, inbox.discard_quarantine(dry, 0)).await,
        );
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
    }

    /// Queues a write that stores a quarantine row with `reason`, failing afterwards if `fail`.
    fn insert(inbox: &SqliteStore, reason: &str, fail: bool) -> Answer<()> {
        let reason = reason.to_owned();
        inbox
            .enqueue(0, move |conn| {
                conn.execute(
                    "INSERT INTO quarantine (source, received_at, headers, body, reason)
                     VALUES ('s', 0, '[]', x'', ?1)",
                    params![reason],
                )?;
                if fail {
                    return Err(InboxError::InvalidFilter(format!("{reason} fails")));
                }
                Ok(())
            })
            .unwrap()
    }

    /// Reasons stored, as a separate connection sees them (only committed rows).
    fn committed(dir: &tempfile::TempDir) -> Vec<String> {
        let conn = Connection::open(dir.path().join("hookd.db")).unwrap();
        let mut stmt = conn
            .prepare("SELECT reason FROM quarantine WHERE reason != '~mark' ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[tokio::test]
    async fn writes_queued_together_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let answers: Vec<_> = (0..100)
            .map(|i| insert(&inbox, &format!("w{i}"), false))
            .collect();
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(
            inbox.commits().count(),
            2,
            "the held batch, then all 100 queued writes at once"
        );
        assert_eq!(committed(&dir).len(), 100);
    }

    #[tokio::test]
    async fn a_batch_that_changes_nothing_writes_nothing_and_is_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let wal = dir.path().join("hookd.db-wal");
        let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        insert(&inbox, "first", false).await.unwrap().unwrap();
        let (count, len) = (inbox.commits().count(), wal_len());
        // What an idle dispatcher's claim and reclaim pass do: look, and update no row.
        for _ in 0..10 {
            inbox
                .write(|conn| {
                    conn.execute("UPDATE quarantine SET reason = 'x' WHERE id < 0", [])?;
                    Ok(())
                })
                .await
                .unwrap();
        }
        assert_eq!(inbox.commits().count(), count, "no row changed: no commit");
        assert_eq!(wal_len(), len, "nothing was appended to the WAL");
        insert(&inbox, "second", false).await.unwrap().unwrap();
        assert_eq!(inbox.commits().count(), count + 1);
        assert!(wal_len() > len);
        assert_eq!(committed(&dir), ["first", "second"]);
    }

    #[tokio::test]
    async fn heavy_writes_are_spread_over_batches_and_light_ones_go_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let commits_seen = |inbox: &SqliteStore| {
            let inbox = inbox.clone();
            move |conn: &Connection| {
                mark(conn)?;
                Ok(inbox.commits().count())
            }
        };
        // Three jobs of 5 MiB each: no two fit in one batch's 8 MiB.
        let heavy: Vec<_> = (0..3)
            .map(|_| inbox.enqueue(5 << 20, commits_seen(&inbox)).unwrap())
            .collect();
        let light = inbox.enqueue(0, commits_seen(&inbox)).unwrap();
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        let mut ran_after = Vec::new();
        for answer in heavy {
            ran_after.push(answer.await.unwrap().unwrap());
        }
        // Each heavy job ran in its own batch (after 1, 2, 3 earlier commits); the light one,
        // queued last, went ahead of the deferred two, in the first heavy job's batch.
        assert_eq!(ran_after, [1, 2, 3]);
        assert_eq!(light.await.unwrap().unwrap(), 1);
        assert_eq!(inbox.commits().count(), 4);
    }

    #[tokio::test]
    async fn without_group_commit_every_write_is_its_own_commit() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, false);
        let (release, held) = hold(&inbox);
        let answers: Vec<_> = (0..20)
            .map(|i| insert(&inbox, &format!("w{i}"), false))
            .collect();
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(inbox.commits().count(), 21);
        assert_eq!(committed(&dir).len(), 20);
    }

    #[tokio::test]
    async fn a_failing_write_is_undone_alone() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let a = insert(&inbox, "a", false);
        let b = insert(&inbox, "b", true);
        let c = insert(&inbox, "c", false);
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        a.await.unwrap().unwrap();
        let err = b.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("b fails"), "{err}");
        c.await.unwrap().unwrap();
        assert_eq!(inbox.commits().count(), 2, "a, b and c were one batch");
        assert_eq!(committed(&dir), ["a", "c"]);
    }

    #[tokio::test]
    async fn a_write_is_answered_only_after_its_batch_committed() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release_first, first) = hold(&inbox);
        let mut a = insert(&inbox, "a", false);
        let (entered, inside) = sync_mpsc::channel();
        let (release_second, released) = sync_mpsc::channel::<()>();
        let second = inbox
            .enqueue(0, move |_| {
                entered.send(()).unwrap();
                released.recv().unwrap();
                Ok(())
            })
            .unwrap();
        release_first.send(()).unwrap();
        first.await.unwrap().unwrap();
        // `a` ran (its batch is now held by the second write) but is not committed yet.
        inside.recv().unwrap();
        assert!(matches!(
            a.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        assert!(committed(&dir).is_empty());
        release_second.send(()).unwrap();
        second.await.unwrap().unwrap();
        a.await.unwrap().unwrap();
        assert_eq!(committed(&dir), ["a"]);
    }

    #[tokio::test]
    async fn close_commits_what_is_queued_then_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let answers: Vec<_> = (0..10)
            .map(|i| insert(&inbox, &format!("w{i}"), false))
            .collect();
        release.send(()).unwrap();
        inbox.close();
        held.await.unwrap().unwrap();
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(committed(&dir).len(), 10);
        assert!(matches!(
            inbox.write(|_| Ok(())).await,
            Err(InboxError::WriterGone)
        ));
    }

    /// A write that fills the disk (here: the database's `max_page_count`) is answered as the
    /// database being unavailable, and every answer of its batch says what was committed: a
    /// write answered `Ok` is stored, one answered with an error is not. Before, SQLite's
    /// rollback of the whole transaction turned the batch's redo into "no transaction is
    /// active" errors for writes that may have been committed one by one.
    #[tokio::test]
    async fn a_write_that_fills_the_disk_fails_its_batch_consistently() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let before = insert(&inbox, "before", false);
        let filling = inbox
            .enqueue(0, |conn| {
                let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                conn.query_row(
                    &format!("PRAGMA max_page_count = {}", pages + 2),
                    [],
                    |_| Ok(()),
                )?;
                conn.execute(
                    "INSERT INTO quarantine (source, received_at, headers, body, reason)
                     VALUES ('s', 0, '[]', zeroblob(1048576), 'big')",
                    [],
                )?;
                Ok(())
            })
            .unwrap();
        let after = insert(&inbox, "after", false);
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        let filled = filling.await.unwrap();
        assert!(
            matches!(filled, Err(InboxError::Unavailable(_))),
            "{filled:?}"
        );
        let answers = [
            ("before", before.await.unwrap()),
            ("after", after.await.unwrap()),
        ];
        let stored = committed(&dir);
        for (reason, answer) in answers {
            assert_eq!(
                answer.is_ok(),
                stored.contains(&reason.to_owned()),
                "{reason}: {answer:?}, stored {stored:?}"
            );
            if let Err(e) = answer {
                assert!(matches!(e, InboxError::Unavailable(_)), "{reason}: {e:?}");
            }
        }
        assert!(!stored.contains(&"big".to_owned()));
    }
}
