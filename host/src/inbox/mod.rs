//! The durable inbox: events, deliveries, attempts, quarantine and plugin state in one SQLite file.
//!
//! Invariants:
//! - This is the only module that speaks SQL (rusqlite stays in this room).
//! - Every write goes through one writer thread that batches whatever is queued into one
//!   transaction (group commit). A caller's future resolves only after the `COMMIT` that holds
//!   its change returned, so a 202 is never sent for an event that is not on disk.
//! - Each queued job runs inside its own savepoint: one failing job never undoes another.
//! - `(source, event_id)` is unique (a table constraint, not a check-then-insert).

#[cfg(test)]
mod ordering_props;
mod schema;
mod store;

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
        mpsc,
    },
    thread,
};

use std::os::unix::fs::OpenOptionsExt as _;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Notify, oneshot};

pub use store::*;

use crate::config::{Durability, ServerConfig};

/// Why an inbox call failed. Internal detail: callers log it and answer 500/503.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("commit failed: {0}")]
    Commit(Arc<rusqlite::Error>),
    #[error("the inbox writer has stopped")]
    WriterGone,
    #[error("{0}")]
    Invalid(String),
}

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
trait Job: Send {
    /// Runs the write in its own savepoint inside the open transaction.
    fn run(&mut self, conn: &Connection);
    /// Answers the caller with the write's result, or the commit's error if the commit failed.
    fn answer(self: Box<Self>, commit: Result<(), Arc<rusqlite::Error>>);
    /// Bulk bytes it writes (plugin state), bounded per batch by [`MAX_BATCH_WEIGHT`].
    fn weight(&self) -> usize;
}

struct Write<T, F> {
    weight: usize,
    work: Option<F>,
    result: Option<Result<T, InboxError>>,
    reply: oneshot::Sender<Result<T, InboxError>>,
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, InboxError> + Send,
{
    fn run(&mut self, conn: &Connection) {
        if let Some(work) = self.work.take() {
            self.result = Some(in_savepoint(conn, work));
        }
    }

    fn answer(self: Box<Self>, commit: Result<(), Arc<rusqlite::Error>>) {
        let answer = match (commit, self.result) {
            (Ok(()), Some(result)) => result,
            // Not reachable: a batch is committed only after every job in it ran.
            (Ok(()), None) => Err(InboxError::WriterGone),
            (Err(e), _) => Err(InboxError::Commit(e)),
        };
        let _ = self.reply.send(answer);
    }

    fn weight(&self) -> usize {
        self.weight
    }
}

/// Handle to the inbox; cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    /// Deliveries in an open state (pending, running, retrying): the backlog bound's measure.
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
}

/// Upper bound of jobs in one group commit; keeps a single transaction's latency bounded.
const MAX_BATCH: usize = 2048;
/// Upper bound of bulk bytes (plugin state writes) in one group commit, beyond a batch's first
/// job: heavier jobs wait for a later batch while light ones (accepts, claims) go ahead, so an
/// ingest commit never queues behind more than about this much state.
const MAX_BATCH_WEIGHT: usize = 8 * 1024 * 1024;

impl Inbox {
    /// Opens (creating and migrating if needed) the database at `path`, with group commit.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, InboxError> {
        Self::open_with(path, WriterOptions::new(durability))
    }

    /// Opens (creating and migrating if needed) the database at `path`.
    pub fn open_with(path: &Path, options: WriterOptions) -> Result<Self, InboxError> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    InboxError::Invalid(format!(
                        "creating database directory {}: {e}",
                        dir.display()
                    ))
                })?;
        }
        let lock = lock_database(path)?;
        create_private(path)?;
        let conn = open_connection(path, options.durability)?;
        // The writer checkpoints inline, after a commit, so a checkpoint stalls the batches
        // queued behind it: 500 pages (~2 MiB) instead of SQLite's 1000 halves the stall and
        // took the ingest benchmark's p99 from ~9.5 ms to ~8 ms (README, "Benchmarks").
        conn.execute_batch("PRAGMA wal_autocheckpoint = 500")?;
        schema::migrate(&conn)?;
        let backlog = store::count_open(&conn)?;
        let quarantined = store::count_quarantined(&conn)?;
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
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
        });
        let weak = Arc::downgrade(&inner);
        let max_batch = if options.group_commit { MAX_BATCH } else { 1 };
        let handle = thread::Builder::new()
            .name("inbox-writer".into())
            .spawn(move || writer_loop(conn, rx, weak, max_batch))
            .map_err(|e| InboxError::Invalid(format!("spawning the inbox writer: {e}")))?;
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

    /// Runs `f` in the next group commit and returns its result once that commit is durable.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        self.enqueue(0, f)?
            .await
            .map_err(|_| InboxError::WriterGone)?
    }

    /// [`Inbox::write`] for a job that writes `weight` bulk bytes (see [`MAX_BATCH_WEIGHT`]).
    async fn write_weighted<T: Send + 'static>(
        &self,
        weight: usize,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        self.enqueue(weight, f)?
            .await
            .map_err(|_| InboxError::WriterGone)?
    }

    /// Queues `f` for the writer now (not on first poll); the receiver resolves after the commit.
    fn enqueue<T: Send + 'static>(
        &self,
        weight: usize,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<oneshot::Receiver<Result<T, InboxError>>, InboxError> {
        let (tx, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Write {
            weight,
            work: Some(f),
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

    /// Runs a read on a pooled connection, on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.read_blocking(f))
            .await
            .map_err(|e| InboxError::Invalid(format!("read task failed: {e}")))?
    }

    /// Runs a read on a pooled connection on the current thread (for short point reads).
    pub(crate) fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError>,
    ) -> Result<T, InboxError> {
        let pooled = self.inner.readers.lock().expect("poisoned").pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.inner.path, Durability::Normal)?,
        };
        let result = f(&conn);
        let mut readers = self.inner.readers.lock().expect("poisoned");
        if readers.len() < 16 {
            readers.push(conn);
        }
        result
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

/// Takes an exclusive advisory lock on `<database>.lock` (released by the kernel if the process
/// dies), so two hookd processes never share one database: the second would reclaim the first's
/// live leases at start-up and run deliveries twice.
fn lock_database(path: &Path) -> Result<Option<std::fs::File>, InboxError> {
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| InboxError::Invalid(format!("opening {}: {e}", lock_path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(InboxError::Invalid(format!(
            "the database {} is in use by another hookd process (lock {}); one hookd per database",
            path.display(),
            lock_path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(lock = %lock_path.display(), error = %e, "cannot lock the database; continuing unlocked");
            Ok(None)
        }
    }
}

/// The database's companion files: SQLite's WAL and shared-memory index, and hookd's lock.
fn companions(path: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", ".lock"].map(|suffix| PathBuf::from(format!("{}{suffix}", path.display())))
}

/// Creates the database file owner-only (0600) before SQLite opens it: SQLite creates the
/// `-wal` and `-shm` files with the database file's mode, so they are owner-only too (they
/// hold every body and header). Existing files readable by others are tightened to 0600.
fn create_private(path: &Path) -> Result<(), InboxError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| InboxError::Invalid(format!("creating {}: {e}", path.display())))?;
    for file in std::iter::once(path.to_owned()).chain(companions(path)) {
        let Ok(meta) = std::fs::metadata(&file) else {
            continue;
        };
        if meta.permissions().mode() & 0o077 != 0 {
            match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
                Ok(()) => tracing::warn!(
                    file = %file.display(),
                    "database file was readable by others; its mode is now 0600"
                ),
                Err(e) => tracing::warn!(
                    file = %file.display(), error = %e,
                    "database file is readable by others and its mode cannot be changed"
                ),
            }
        }
    }
    Ok(())
}

fn open_connection(path: &Path, durability: Durability) -> Result<Connection, InboxError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let synchronous = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = {synchronous};
         PRAGMA busy_timeout = 10000;
         PRAGMA foreign_keys = ON;"
    ))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Runs one statement through the connection's statement cache (no re-parse per call).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, InboxError>,
) -> Result<T, InboxError> {
    exec_cached(conn, "SAVEPOINT job")?;
    match f(conn) {
        Ok(value) => {
            exec_cached(conn, "RELEASE job")?;
            Ok(value)
        }
        Err(e) => {
            exec_cached(conn, "ROLLBACK TO job")?;
            exec_cached(conn, "RELEASE job")?;
            Err(e)
        }
    }
}

/// The single writer: takes whatever is queued (up to `max_batch` jobs and, past the first,
/// [`MAX_BATCH_WEIGHT`] bulk bytes; heavier jobs are deferred, oldest first, to the next
/// batches), runs it in one transaction, commits (the one fsync the whole batch shares), then
/// answers every job.
fn writer_loop(
    conn: Connection,
    jobs: mpsc::Receiver<Box<dyn Job>>,
    inner: std::sync::Weak<Inner>,
    max_batch: usize,
) {
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
                Ok(job) if job.weight() > 0 && weight + job.weight() > MAX_BATCH_WEIGHT => {
                    deferred.push_back(job);
                }
                Ok(job) => {
                    weight += job.weight();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        let commit = match exec_cached(&conn, "BEGIN IMMEDIATE") {
            Ok(()) => {
                for job in &mut batch {
                    job.run(&conn);
                }
                let commit = exec_cached(&conn, "COMMIT").map_err(Arc::new);
                if commit.is_err() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                commit
            }
            Err(e) => {
                tracing::error!(error = %e, "inbox: cannot begin a transaction");
                Err(Arc::new(e))
            }
        };
        if let Err(e) = &commit {
            tracing::error!(error = %e, jobs = batch.len(), "inbox: group commit failed");
        } else if let Some(inner) = inner.upgrade() {
            inner.commits.fetch_add(1, Ordering::Relaxed);
        }
        for job in batch.drain(..) {
            job.answer(commit.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as sync_mpsc;

    use rusqlite::params;

    use super::*;

    type Answer<T> = oneshot::Receiver<Result<T, InboxError>>;

    fn open(dir: &tempfile::TempDir, group_commit: bool) -> Inbox {
        let options = WriterOptions {
            durability: Durability::Full,
            group_commit,
        };
        Inbox::open_with(&dir.path().join("hookd.db"), options).unwrap()
    }

    #[test]
    fn one_hookd_per_database_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let first = open(&dir, true);
        let Err(e) = Inbox::open(&dir.path().join("hookd.db"), Durability::Full) else {
            panic!("a second open of the same database must be refused");
        };
        assert!(e.to_string().contains("in use by another hookd"), "{e}");
        first.close();
        open(&dir, true).close();
    }

    #[test]
    fn database_files_are_owner_only_and_wider_ones_are_tightened() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dir/hookd.db");
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        for file in std::iter::once(path.clone()).chain(companions(&path)) {
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
        assert_eq!(mode(&dir.path().join("new")), 0o700);
        assert_eq!(mode(&dir.path().join("new/dir")), 0o700);
        inbox.close();

        // Left world-readable by an older hookd: tightened on the next open.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Inbox::open(&path, Durability::Full).unwrap().close();
        assert_eq!(mode(&path), 0o600);
    }

    /// Queues a write that stores a quarantine row with `reason`, failing afterwards if `fail`.
    fn insert(inbox: &Inbox, reason: &str, fail: bool) -> Answer<()> {
        let reason = reason.to_owned();
        inbox
            .enqueue(0, move |conn| {
                conn.execute(
                    "INSERT INTO quarantine (source, received_at, headers, body, reason)
                     VALUES ('s', 0, '[]', x'', ?1)",
                    params![reason],
                )?;
                if fail {
                    return Err(InboxError::Invalid(format!("{reason} fails")));
                }
                Ok(())
            })
            .unwrap()
    }

    /// Queues a write that blocks the writer, inside its transaction, until released; returns
    /// once the writer is inside it, so whatever is queued next waits for the next batch.
    fn hold(inbox: &Inbox) -> (sync_mpsc::Sender<()>, Answer<()>) {
        let (entered, inside) = sync_mpsc::channel();
        let (release, released) = sync_mpsc::channel::<()>();
        let answer = inbox
            .enqueue(0, move |_| {
                entered.send(()).unwrap();
                released.recv().unwrap();
                Ok(())
            })
            .unwrap();
        inside.recv().unwrap();
        (release, answer)
    }

    /// Reasons stored, as a separate connection sees them (only committed rows).
    fn committed(dir: &tempfile::TempDir) -> Vec<String> {
        let conn = Connection::open(dir.path().join("hookd.db")).unwrap();
        let mut stmt = conn
            .prepare("SELECT reason FROM quarantine ORDER BY id")
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
            inbox.commits(),
            2,
            "the held batch, then all 100 queued writes at once"
        );
        assert_eq!(committed(&dir).len(), 100);
    }

    #[tokio::test]
    async fn heavy_writes_are_spread_over_batches_and_light_ones_go_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir, true);
        let (release, held) = hold(&inbox);
        let commits_seen = |inbox: &Inbox| {
            let inbox = inbox.clone();
            move |_: &Connection| Ok(inbox.commits())
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
        assert_eq!(inbox.commits(), 4);
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
        assert_eq!(inbox.commits(), 21);
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
        assert_eq!(inbox.commits(), 2, "a, b and c were one batch");
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
}
