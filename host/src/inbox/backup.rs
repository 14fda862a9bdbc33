//! Backups of an SQLite inbox: a consistent copy of a database a running hookd keeps writing
//! ([`backup`]), and a database started again from such a copy ([`restore`]). The SQL and the
//! file steps are the SQLite room's (`sqlite/backup.rs`); this file holds their types.
//!
//! Invariants:
//! - A copy is one point in time (one read snapshot of the source), passed
//!   `PRAGMA integrity_check` and holds a schema this hookd knows, before it gets its final
//!   name; a file at that name is replaced only when the caller says so, and never when it is
//!   the database or a file kept beside it (its `-wal`, `-shm`, `-journal`, `.lock`, the admin
//!   token file), however the path reaches it.
//! - A backup never takes the database's lock nor writes to the database: the running hookd
//!   keeps answering meanwhile.
//! - A restore holds the database's lock throughout (so it refuses while a hookd serves it),
//!   checks the copy before it touches anything, and keeps the database it replaces aside.
//!
//! A PostgreSQL inbox has none of this: its backups are the database server's (`pg_dump`,
//! replicas).

use std::path::{Path, PathBuf};

use super::{InboxError, sqlite};

/// What a copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The copy's schema version (the source's: a copy is never migrated).
    pub schema_version: i64,
    /// Events stored in it.
    pub events: i64,
    /// Its size in bytes.
    pub bytes: u64,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// What the restored database holds.
    pub copied: Copied,
    /// Where the database it replaced was moved (`None`: there was none).
    pub replaced: Option<PathBuf>,
}

/// Why a backup or a restore refused or failed; each names the file concerned.
///
/// Each message carries the text of its cause, and no variant is another error's `source()`:
/// the CLI prints an error with its chain (`{:#}`), which would print that cause again.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("no database at {}", .0.display())]
    Missing(PathBuf),
    /// The copy a restore was asked to start from is not a file.
    #[error("no backup at {} (the copy to restore from)", .0.display())]
    NoCopy(PathBuf),
    #[error("{} already exists; refusing to overwrite it", .0.display())]
    Exists(PathBuf),
    /// A log SQLite would replay into a copy written at `out` is beside it (a database that
    /// was there, or a session that crashed).
    #[error(
        "{} ({what}) is beside {}: SQLite would replay it into the copy on its first open; move \
         it away (it may hold the last writes of a database that was there)",
        path.display(),
        out.display()
    )]
    LogBeside {
        path: PathBuf,
        what: &'static str,
        out: PathBuf,
    },
    /// A copy never takes the place of a database a hookd serves or served (a `.lock` beside
    /// the path), with `--force` or without: `--force` replaces an earlier copy only.
    #[error(
        "{} is the path of a database a hookd serves or has served ({} is beside it); a backup \
         never takes its place: to start that database from a copy, stop its hookd and use \
         `hookd restore`, or choose another path",
        path.display(),
        lock.display()
    )]
    Served { path: PathBuf, lock: PathBuf },
    #[error("{} is the database itself", .0.display())]
    SameFile(PathBuf),
    /// The copy would be written over a file the database's process keeps beside it.
    #[error(
        "{} is {what} of the database {}; a copy never replaces it: choose another path",
        path.display(),
        database.display()
    )]
    Companion {
        path: PathBuf,
        what: &'static str,
        database: PathBuf,
    },
    /// `--force` replaces an earlier copy only: a regular file.
    #[error(
        "{} is not a regular file (a directory, pipe, device or link); a backup replaces only an \
         earlier copy: choose another path",
        .0.display()
    )]
    NotAFile(PathBuf),
    /// The database is gone but a log of it is still beside it: a restore would replay it
    /// into the copy.
    #[error(
        "{} is {what} of a database {} that is no longer there; restored beside it, the copy \
         would take it for its own and be corrupt: move it away first (it holds that \
         database's last writes) and restore again",
        path.display(),
        database.display()
    )]
    Orphan {
        path: PathBuf,
        what: &'static str,
        database: PathBuf,
    },
    /// A backup with a `-wal` beside it could not be read: SQLite reads the log only with its
    /// index (`-shm`) beside it, which it makes there if it can.
    #[error(
        "{error}; {} is beside the backup, and SQLite reads such a log only with its index \
         (`-shm`) beside it, which it could not make there (read-only storage?): copy the backup \
         and its -wal to a writable directory and restore from there",
        wal.display()
    )]
    LogWithoutIndex {
        wal: PathBuf,
        error: Box<BackupError>,
    },
    /// A restore failed after it moved the database aside; what became of it is said.
    #[error(
        "{error}; nothing was restored: {}",
        match put_back {
            Ok(()) => format!("the database is back at {}", database.display()),
            Err(again) => format!(
                "moving the database back from {} failed too ({again}): rename it (and its \
                 -wal, if it had one, beside it; the database first) to {} before starting \
                 hookd",
                aside.display(),
                database.display()
            ),
        }
    )]
    NotReplaced {
        error: Box<BackupError>,
        database: PathBuf,
        aside: PathBuf,
        put_back: Result<(), Box<BackupError>>,
    },
    #[error("no directory {} to write the copy in; create it first", .0.display())]
    NoDirectory(PathBuf),
    /// A temporary copy's name is taken (it is unique to a process: one that stopped left it).
    #[error(
        "{} already exists (left by a backup or restore that stopped?); remove it and run again",
        .0.display()
    )]
    Leftover(PathBuf),
    #[error("{} is not a hookd database (no hookd schema in it)", .0.display())]
    NotHookd(PathBuf),
    #[error(
        "{} is at schema version {found}, newer than this hookd knows ({known}); upgrade hookd",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("{} fails PRAGMA integrity_check: {report}", path.display())]
    Corrupt { path: PathBuf, report: String },
    /// A file-system step failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// The database engine failed on `path`, or the database is in use (restore).
    #[error("{action} {}: {error}", path.display())]
    Inbox {
        action: &'static str,
        path: PathBuf,
        error: InboxError,
    },
}

/// Copies the SQLite database at `database` (which a hookd may be serving) to `out`, through a
/// temporary file beside `out` renamed into place once complete and checked. `replace`: an
/// existing `out` is replaced instead of refused. `kept`: further files hookd keeps beside the
/// database (the admin token file), each with what it is; `out` is never one of them, nor the
/// database or a file SQLite or the lock keep beside it.
pub fn backup(
    database: &Path,
    out: &Path,
    replace: bool,
    kept: &[(&Path, &'static str)],
) -> Result<Copied, BackupError> {
    sqlite::backup::backup(database, out, replace, kept)
}

/// Makes the SQLite database at `database` a copy of `copy` (a backup), once `copy` is checked;
/// the database it replaces, if any, is kept aside. Refused while a hookd holds `database`.
pub fn restore(database: &Path, copy: &Path) -> Result<Restored, BackupError> {
    sqlite::backup::restore(database, copy)
}
