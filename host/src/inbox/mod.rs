//! The durable inbox: events, deliveries, attempts, quarantine and plugin state in one SQLite file.
//!
//! Invariants:
//! - This is the only module that speaks SQL (rusqlite stays in this room).
//! - Every write goes through one writer thread that batches whatever is queued into one
//!   transaction (group commit). A caller's future resolves only after the `COMMIT` that holds
//!   its change returned, so a 202 is never sent for an event that is not on disk.
//! - Each queued job runs inside its own savepoint: one failing job never undoes another.
//! - `(source, event_id)` is unique (a table constraint, not a check-then-insert).

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

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Notify, oneshot};

pub use store::*;

use crate::config::Durability;

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

type Reply = Box<dyn FnOnce(Result<(), Arc<rusqlite::Error>>) + Send>;
type Job = Box<dyn FnOnce(&Connection) -> Reply + Send>;

/// Handle to the inbox; cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Job>>>,
    writer_thread: Mutex<Option<thread::JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    /// Deliveries in an open state (pending, running, retrying): the backlog bound's measure.
    backlog: AtomicI64,
    /// Wakes the dispatcher when new work becomes due.
    work: Notify,
    /// Commits done by the writer; lets tests and benchmarks see group commit at work.
    commits: AtomicI64,
}

/// Upper bound of jobs in one group commit; keeps a single transaction's latency bounded.
const MAX_BATCH: usize = 2048;

impl Inbox {
    /// Opens (creating and migrating if needed) the database at `path`.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, InboxError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                InboxError::Invalid(format!(
                    "creating database directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let conn = open_connection(path, durability)?;
        schema::migrate(&conn)?;
        let backlog = store::count_open(&conn)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let inner = Arc::new(Inner {
            path: path.to_owned(),
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            backlog: AtomicI64::new(backlog),
            work: Notify::new(),
            commits: AtomicI64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let handle = thread::Builder::new()
            .name("inbox-writer".into())
            .spawn(move || writer_loop(conn, rx, weak))
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
    }

    /// Runs `f` in the next group commit and returns its result once that commit is durable.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        let (tx, rx) = oneshot::channel::<Result<T, InboxError>>();
        let job: Job = Box::new(move |conn| {
            let result = in_savepoint(conn, f);
            Box::new(move |commit| {
                let _ = tx.send(match commit {
                    Ok(()) => result,
                    Err(e) => Err(InboxError::Commit(e)),
                });
            })
        });
        let sender = self.inner.writer.lock().expect("poisoned").clone();
        sender
            .ok_or(InboxError::WriterGone)?
            .send(job)
            .map_err(|_| InboxError::WriterGone)?;
        rx.await.map_err(|_| InboxError::WriterGone)?
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

fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, InboxError>,
) -> Result<T, InboxError> {
    conn.execute_batch("SAVEPOINT job")?;
    match f(conn) {
        Ok(value) => {
            conn.execute_batch("RELEASE job")?;
            Ok(value)
        }
        Err(e) => {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")?;
            Err(e)
        }
    }
}

/// The single writer: takes whatever is queued (up to [`MAX_BATCH`]), runs it in one
/// transaction, commits (the one fsync the whole batch shares), then answers every job.
fn writer_loop(conn: Connection, jobs: mpsc::Receiver<Job>, inner: std::sync::Weak<Inner>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let outcome = conn.execute_batch("BEGIN IMMEDIATE").map(|()| {
            let replies: Vec<Reply> = batch.drain(..).map(|job| job(&conn)).collect();
            replies
        });
        let (replies, commit) = match outcome {
            Ok(replies) => {
                let commit = conn.execute_batch("COMMIT").map_err(Arc::new);
                if commit.is_err() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                (replies, commit)
            }
            Err(e) => {
                tracing::error!(error = %e, "inbox: cannot begin a transaction");
                let e = Arc::new(e);
                let replies = batch
                    .drain(..)
                    .map(|_| -> Reply { Box::new(|_| ()) })
                    .collect::<Vec<_>>();
                // Jobs were never run: their senders drop and callers see `WriterGone`.
                (replies, Err(e))
            }
        };
        if let Err(e) = &commit {
            tracing::error!(error = %e, "inbox: group commit failed");
        }
        if let Some(inner) = inner.upgrade() {
            inner.commits.fetch_add(1, Ordering::Relaxed);
        }
        for reply in replies {
            reply(commit.clone());
        }
    }
}
