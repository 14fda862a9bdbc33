//! What an inbox call can fail with, sorted by who must act on it.
//!
//! Invariant: no storage-engine type appears in [`InboxError`]'s variants; a caller can tell
//! "the request was wrong" ([`InboxError::InvalidFilter`]), "try again shortly"
//! ([`InboxError::Busy`]) and "the host is broken" (everything else) without knowing which
//! storage engine the inbox runs on. Each backend sorts its engine's errors into these
//! (`sqlite/error.rs`, `postgres/error.rs`). A database server named by URL is named in these
//! without its credentials: no variant carries a password.

use std::{path::PathBuf, sync::Arc};

/// An opaque storage-engine failure (the engine's own error, kept for the log).
pub type StorageError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why an inbox call failed.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The caller's filter asks for something the inbox refuses (its message says what): the
    /// one case that is the client's fault.
    #[error("{0}")]
    InvalidFilter(String),
    /// The database stayed locked past the busy timeout: a transient overload.
    #[error("the database is busy: {0}")]
    Busy(#[source] StorageError),
    /// The database server cannot be reached now (restarting, failing over, the network), or
    /// the disk under SQLite's files is full: the operation may work once it is back (or space
    /// is freed); nothing of it was committed.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] StorageError),
    /// Another hookd process holds the database.
    #[error(
        "the database {} is in use by another hookd process (lock {}); one hookd per database",
        database.display(),
        lock.display()
    )]
    InUse { database: PathBuf, lock: PathBuf },
    /// The database path names a file that is not an SQLite database (nor empty): it is left
    /// as it is, no lock or mode change beside it.
    #[error(
        "{} is not an SQLite database ({why}); hookd leaves it as it is: check server.database",
        path.display()
    )]
    NotADatabase { path: PathBuf, why: &'static str },
    /// The database path names another program's SQLite database (it holds tables, but not
    /// hookd's): it is left as it is, no lock, mode, journal or table change in it or beside it.
    #[error(
        "{} is an SQLite database, but not hookd's ({why}); hookd leaves it as it is: check \
         server.database",
        path.display()
    )]
    ForeignDatabase { path: PathBuf, why: String },
    /// The database file is missing, but its WAL is there: the file was deleted or moved while
    /// a hookd had it open, and the WAL holds its last writes. A new database is not started
    /// over them.
    #[error(
        "{} does not exist, but {} does: the database file was deleted or moved while hookd had \
         it open, and that file holds its last writes; put the database file back, or move the \
         -wal and -shm files aside to start a new database",
        path.display(),
        wal.display()
    )]
    OrphanedWal { path: PathBuf, wal: PathBuf },
    /// The database file is missing, and a copy was being written to its name (`hookd restore`
    /// moves the database it replaces aside, then puts the copy in its place): a restore that
    /// did not finish. A new, empty database is not started in its place.
    #[error(
        "{} does not exist, but {} beside it is a copy being put in its place that did not \
         finish (an interrupted `hookd restore`): run the restore again (the database it was \
         replacing is kept beside it as {}.replaced-<time>), or remove that file to start a new \
         database",
        path.display(),
        partial.display(),
        path.file_name().unwrap_or_default().to_string_lossy()
    )]
    UnfinishedCopy { path: PathBuf, partial: PathBuf },
    /// A file-system step of opening the database failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database server cannot be reached, or has no such database. `database` is where
    /// hookd looked (`user@host:port/name`, never the password).
    #[error("cannot reach the database {database}: {reason}")]
    Unreachable { database: String, reason: String },
    /// The database server refused hookd's login: its credentials, or a `pg_hba.conf` rule
    /// (`database` as for [`InboxError::Unreachable`]).
    #[error("the database {database} refused hookd's login: {reason}")]
    AuthFailed { database: String, reason: String },
    /// The database URL cannot be parsed or used (the reason never quotes the URL).
    #[error("the database URL is invalid: {reason}")]
    InvalidUrl { reason: String },
    /// A file the database URL's TLS options name cannot be used (`sslrootcert`, `sslcert`,
    /// `sslkey`): the reason names the option and the file.
    #[error("the database URL's TLS files cannot be used: {reason}")]
    TlsFile { reason: String },
    /// Bringing the database to this hookd's schema failed (a missing privilege, most often).
    #[error("migrating the database {database} to schema version {target} failed: {reason}")]
    Migration {
        database: String,
        target: i64,
        reason: String,
    },
    /// The role hookd logs in as lacks privileges hookd needs on its tables and sequences:
    /// `missing` lists each as `table (PRIVILEGE)`.
    #[error(
        "the database {database} does not let hookd's role do all it needs: it lacks {missing} \
         (the README's Upgrading part lists the grants a node needs)"
    )]
    MissingPrivileges { database: String, missing: String },
    /// The database was written by a newer hookd.
    #[error(
        "the database is at schema version {found}, newer than this hookd knows ({known}); \
         upgrade hookd"
    )]
    SchemaTooNew { found: i64, known: i64 },
    /// The storage engine failed (a statement, or the commit of the batch holding the write).
    #[error("storage error: {0}")]
    Storage(#[source] StorageError),
    /// The writer thread could not be started.
    #[error("spawning the inbox writer: {0}")]
    WriterSpawn(#[source] std::io::Error),
    /// The writer has stopped (the inbox was closed).
    #[error("the inbox writer has stopped")]
    WriterGone,
    /// A plugin version was published without its bytes, and the database has none stored.
    #[error(
        "plugin {stem}: version {sha256} is not stored in the database, and no bytes came with it"
    )]
    UnknownPluginVersion { stem: String, sha256: String },
    /// Taking back every lease at start-up was asked of a database other processes may use.
    #[error(
        "taking back every lease at start-up needs a database only this process uses, \
         and this storage backend is shared"
    )]
    NotSingleNode,
    /// A read ran on the blocking pool and panicked or was cancelled.
    #[error("read task failed: {0}")]
    ReadTask(#[from] tokio::task::JoinError),
}
