//! Copies of the database file: SQLite's online backup API under one read snapshot, the checks
//! a copy passes before it gets its name, and the file moves of a restore.
//!
//! Invariants:
//! - The source is opened read-only and never locked: a backup takes no `<database>.lock` and
//!   writes nothing to it. One read transaction spans the whole copy, so every page comes from
//!   one snapshot (WAL lets the serving hookd commit meanwhile, and the copy never restarts).
//! - A backup never writes over the database or a file kept beside it (`connection::COMPANIONS`
//!   and the caller's `kept`), compared by resolved path, whether as its destination, the
//!   temporary file or a file SQLite keeps beside either.
//! - A copy is written to a temporary file beside its destination, created by this process (a
//!   file already there is refused, never reused) and removed with what SQLite left beside it
//!   unless it got its name; it gets its name only after it holds a schema this hookd knows and
//!   passed `PRAGMA integrity_check`; it is left in WAL mode with no `-wal` of its own, as
//!   `hookd serve` opens it.
//! - A restore moves the replaced database (and its `-wal`) aside, never deletes it.

use std::{
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use rusqlite::{
    Connection, OpenFlags,
    backup::{Backup, StepResult},
};

use super::{
    connection::{self, COMPANIONS, HOOKD_TABLES, JOURNAL, LOCK, SHM, WAL, beside},
    schema,
};
use crate::inbox::{
    InboxError,
    backup::{BackupError, Copied, Restored},
};

/// Pages copied per step of the backup API (4 MiB at hookd's page size).
const PAGES_PER_STEP: i32 = 1024;

/// The files SQLite keeps beside a database file it opens (a stale one would be replayed into
/// the file, or left beside it).
const SQLITE_FILES: [&str; 3] = [WAL, SHM, JOURNAL];

pub(in crate::inbox) fn backup(
    database: &Path,
    out: &Path,
    replace: bool,
    kept: &[(&Path, &'static str)],
) -> Result<Copied, BackupError> {
    if !database.is_file() {
        return Err(BackupError::Missing(database.to_owned()));
    }
    let temp = temporary_beside(out);
    refuse_live_files(database, kept, &[out, &temp])?;
    if !replace {
        if out.exists() {
            return Err(BackupError::Exists(out.to_owned()));
        }
        if let Some((path, what)) = logs_beside(out).find(|(path, _)| path.exists()) {
            return Err(BackupError::LogBeside {
                path,
                what,
                out: out.to_owned(),
            });
        }
    }
    // An earlier copy never has a lock beside it: a database with one is (or was) served, its
    // `-wal` holding acknowledged events a replacement would delete (the database file itself
    // gone too: its `-wal` is then all that is left of its last writes).
    let lock = beside(&connection::target_file(out), LOCK);
    if lock.exists() {
        return Err(BackupError::Served {
            path: out.to_owned(),
            lock,
        });
    }
    // What `--force` replaces is an earlier copy: never a directory, a pipe, a device (run as
    // root, `/dev/null` would become a file) or a link.
    if let Ok(meta) = std::fs::symlink_metadata(out)
        && !meta.is_file()
    {
        return Err(BackupError::NotAFile(out.to_owned()));
    }
    let partial = Partial::create(temp)?;
    let copied = copy(database, &partial.0, Source::Live)?;
    if replace {
        // A stale `-wal` or `-journal` beside `out` would be replayed into the copy on its
        // first open.
        for suffix in SQLITE_FILES {
            remove_if_present(&beside(out, suffix))?;
        }
        rename(&partial.0, out)?;
    } else {
        name_without_replacing(&partial.0, out, |from, to| std::fs::hard_link(from, to))?;
    }
    sync_parent(out)?;
    Ok(copied)
}

pub(in crate::inbox) fn restore(
    database: &Path,
    copy_path: &Path,
) -> Result<Restored, BackupError> {
    // The file a symbolic link in the path leads to is the one replaced (its `-wal` and the
    // lock are beside it): renaming the link aside left that file, and its log, in place.
    let database = &connection::target_file(database);
    if !copy_path.is_file() {
        return Err(BackupError::NoCopy(copy_path.to_owned()));
    }
    if same_file(database, copy_path) {
        return Err(BackupError::SameFile(copy_path.to_owned()));
    }
    connection::create_parent(database).map_err(inbox("creating the directory of", database))?;
    // Held until the restored database is in place: no hookd starts on a half-restored one.
    let _lock = connection::lock_database(database).map_err(inbox("locking", database))?;
    if !database.exists() {
        // A log left by a database that is gone would be replayed into the copy on its first
        // open, as if it were the copy's own: a corrupt database, served.
        for (left, what) in logs_beside(database) {
            // An empty one holds no writes (a read-only open of a stopped database, a backup's
            // say, leaves an empty `-wal` beside it): it goes.
            if std::fs::metadata(&left).is_ok_and(|meta| meta.len() == 0) {
                remove_if_present(&left)?;
            } else if left.exists() {
                return Err(BackupError::Orphan {
                    path: left,
                    what,
                    database: database.to_owned(),
                });
            }
        }
    }
    let partial = Partial::create(temporary_beside(database))?;
    let (wal, shm) = (beside(copy_path, WAL), beside(copy_path, SHM));
    let index_missing = wal.exists() && !shm.exists();
    let copied = copy(copy_path, &partial.0, Source::Backup).map_err(|error| {
        if index_missing && !shm.exists() {
            BackupError::LogWithoutIndex {
                wal,
                error: Box::new(error),
            }
        } else {
            error
        }
    })?;
    let replaced = if database.exists() {
        let aside = aside_name(database);
        rename(database, &aside)?;
        let moved = (|| {
            // The replaced database's last commits may still be in its `-wal`: it goes with it.
            let wal = beside(database, WAL);
            if wal.exists() {
                rename(&wal, &beside(&aside, WAL))?;
            }
            remove_if_present(&beside(database, SHM))?;
            // On disk before the copy takes the name: a file system that kept the last rename
            // and lost these would leave the old `-wal` beside the copy, replayed into it at
            // its open.
            sync_parent(database)?;
            rename(&partial.0, database)
        })();
        // Failed with the database aside: it goes back, or the error says where it is (the
        // copy's temporary file goes with `partial`, so nothing would have refused a start on
        // a new, empty database).
        moved.map_err(|error| BackupError::NotReplaced {
            error: Box::new(error),
            database: database.to_owned(),
            put_back: put_back(database, &aside).map_err(Box::new),
            aside: aside.clone(),
        })?;
        Some(aside)
    } else {
        rename(&partial.0, database)?;
        None
    };
    sync_parent(database)?;
    Ok(Restored { copied, replaced })
}

/// Moves a database set aside at `aside` (with its `-wal`) back to `database`, where a restore
/// that failed had taken it from.
fn put_back(database: &Path, aside: &Path) -> Result<(), BackupError> {
    // The database first: a `-wal` put back without it would be replayed into whatever
    // database a start then makes there.
    rename(aside, database)?;
    let wal = beside(aside, WAL);
    if wal.exists() {
        rename(&wal, &beside(database, WAL))?;
    }
    // Both back; a failed sync is said, not taken for a failed move.
    if let Err(e) = sync_parent(database) {
        tracing::warn!(database = %database.display(), "{e}");
    }
    Ok(())
}

/// The logs SQLite would replay into a database at `path` on its first open (its `-wal` and
/// `-journal`), with what each is, whether or not they exist.
fn logs_beside(path: &Path) -> impl Iterator<Item = (PathBuf, &'static str)> + '_ {
    COMPANIONS
        .iter()
        .filter(|(suffix, _)| [WAL, JOURNAL].contains(suffix))
        .map(move |(suffix, what)| (beside(path, suffix), *what))
}

/// Refuses to write any of `writes` (with the files SQLite keeps beside each) where it would
/// replace the database, a file kept beside it ([`COMPANIONS`]), or one of `kept`. Paths are
/// compared resolved: relative to the working directory, their directory's symlinks, `.` and
/// `..` resolved, and a file that is a symlink also as the file it leads to.
fn refuse_live_files(
    database: &Path,
    kept: &[(&Path, &'static str)],
    writes: &[&Path],
) -> Result<(), BackupError> {
    // Each live file resolved, with what it is (`None`: the database itself).
    let mut live = Vec::new();
    for resolved in resolutions(database)? {
        for (suffix, what) in COMPANIONS {
            live.push((beside(&resolved, suffix), Some(what)));
        }
        live.push((resolved, None));
    }
    for (file, what) in kept {
        live.extend(resolutions(file)?.into_iter().map(|f| (f, Some(*what))));
    }
    for written in writes {
        let files = std::iter::once(written.to_path_buf())
            .chain(SQLITE_FILES.map(|suffix| beside(written, suffix)));
        for file in files {
            for resolved in resolutions(&file)? {
                match live.iter().find(|(live, _)| *live == resolved) {
                    None => {}
                    Some((_, None)) => return Err(BackupError::SameFile(file)),
                    Some((_, Some(what))) => {
                        return Err(BackupError::Companion {
                            path: file,
                            what,
                            database: database.to_owned(),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// The files `path` names once resolved: its directory resolved, with its file name; and, if
/// it exists and leads elsewhere (a symlink), where it leads. A missing directory is refused.
fn resolutions(path: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let Some(name) = path.file_name() else {
        // `/` or `..`: a directory, never a file to write over.
        return Ok(std::fs::canonicalize(path).into_iter().collect());
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(dir).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
            BackupError::NoDirectory(dir.to_owned())
        }
        _ => io("resolving", dir)(error),
    })?;
    let mut found = vec![dir.join(name)];
    if let Ok(target) = std::fs::canonicalize(path)
        && target != found[0]
    {
        found.push(target);
    }
    Ok(found)
}

/// What a copy is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A database a hookd may be writing (a backup's source).
    Live,
    /// A backup (a restore's source): nothing writes it.
    Backup,
}

/// Copies the database at `from` into `to`, a new empty file (one snapshot), then checks the
/// copy.
fn copy(from: &Path, to: &Path, source: Source) -> Result<Copied, BackupError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    // A backup without a `-wal` beside it is read as immutable: SQLite then makes no `-shm`
    // (nor `-wal`) beside it, so a backup on read-only storage restores, and nothing is left
    // beside one in a writable directory. With a `-wal` (files copied by hand), the log is read
    // as usual.
    // The URI names the file by its canonical path after an empty authority (`file:///…`), so
    // a path given as `//srv/b.db` is not read as a host.
    let canonical = (source == Source::Backup && !beside(from, WAL).exists())
        .then(|| std::fs::canonicalize(from).ok())
        .flatten();
    let immutable = canonical.as_deref().and_then(Path::to_str).map(|path| {
        const IN_URI: &percent_encoding::AsciiSet =
            &percent_encoding::CONTROLS.add(b'%').add(b'?').add(b'#');
        let path = percent_encoding::utf8_percent_encode(path, IN_URI);
        format!("file://{path}?immutable=1")
    });
    let source = match immutable {
        Some(uri) => Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI),
        None => Connection::open_with_flags(from, flags),
    }
    .map_err(sql("opening", from))?;
    source
        .busy_timeout(Duration::from_secs(10))
        .map_err(sql("opening", from))?;
    // The snapshot: a read transaction started by the first read, held to the last page.
    source
        .execute_batch("BEGIN DEFERRED")
        .map_err(sql("reading", from))?;
    let schema_version = hookd_schema(&source, from)?;
    let events: i64 = source
        .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
        .map_err(sql("reading", from))?;

    let mut target = Connection::open(to).map_err(sql("opening", to))?;
    {
        let backup = Backup::new(&source, &mut target).map_err(sql("copying into", to))?;
        loop {
            match backup
                .step(PAGES_PER_STEP)
                .map_err(sql("copying from", from))?
            {
                StepResult::Done => break,
                // Busy or locked (the enum is non-exhaustive): wait a little and step again.
                StepResult::More => {}
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
    source
        .execute_batch("COMMIT")
        .map_err(sql("reading", from))?;
    drop(source);

    let mode: String = target
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(sql("setting WAL mode on", to))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let refused = std::io::Error::other(format!("journal_mode stayed {mode}"));
        return Err(io("setting WAL mode on", to)(refused));
    }
    // Named by what was copied: its pages are what the check found wrong.
    integrity_check(&target, from)?;
    // Closing the last connection checkpoints the copy's `-wal` into it and deletes it.
    target.close().map_err(|(_, e)| sql("closing", to)(e))?;
    let file = std::fs::File::open(to).map_err(io("opening", to))?;
    file.sync_all().map_err(io("syncing", to))?;
    let bytes = file.metadata().map_err(io("reading", to))?.len();
    Ok(Copied {
        schema_version,
        events,
        bytes,
    })
}

/// The schema version of the hookd database `conn` has open at `path`; refuses anything else.
fn hookd_schema(conn: &Connection, path: &Path) -> Result<i64, BackupError> {
    let read = |error| sql("reading", path)(error);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(read)?;
    let known = schema::MIGRATIONS.len() as i64;
    if version > known {
        return Err(BackupError::TooNew {
            path: path.to_owned(),
            found: version,
            known,
        });
    }
    let mut tables = conn
        .prepare("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1")
        .map_err(read)?;
    for table in HOOKD_TABLES {
        let found: i64 = tables.query_row([table], |row| row.get(0)).map_err(read)?;
        if version < 1 || found != 1 {
            return Err(BackupError::NotHookd(path.to_owned()));
        }
    }
    Ok(version)
}

/// `PRAGMA integrity_check` of `conn` (open at `path`): `ok`, or the problems it lists.
fn integrity_check(conn: &Connection, path: &Path) -> Result<(), BackupError> {
    let read = |error| sql("checking", path)(error);
    let mut check = conn.prepare("PRAGMA integrity_check").map_err(read)?;
    let lines = check
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if lines != ["ok"] {
        return Err(BackupError::Corrupt {
            path: path.to_owned(),
            report: crate::text::cap(lines.join("; "), 1024),
        });
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A temporary name in `path`'s directory, unique to this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

/// A copy being written to `path`'s name ([`temporary_beside`], by any process) that was left
/// behind, if there is one: the mark of a restore cut short between moving the database aside
/// and putting the copy in its place.
pub(super) fn unfinished_copy(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let prefix = format!(".{name}.");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let file = entry.file_name();
        let pid = file
            .to_str()?
            .strip_prefix(&prefix)?
            .strip_suffix(".partial")?;
        (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then(|| entry.path())
    })
}

/// Where a restore moves the database it replaces: `<database>.replaced-<unix ms>`.
fn aside_name(database: &Path) -> PathBuf {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    beside(database, &format!(".replaced-{ms}"))
}

/// A copy being written under its temporary name: a file this process created (never one that
/// was there), removed on drop with whatever SQLite left beside it, unless it got its final name
/// meanwhile.
struct Partial(PathBuf);

impl Partial {
    /// Creates `path`, owner-only (SQLite gives the files beside it the same mode).
    fn create(path: PathBuf) -> Result<Self, BackupError> {
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match created {
            Ok(_) => Ok(Self(path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(BackupError::Leftover(path))
            }
            Err(e) => Err(io("creating", &path)(e)),
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        // Best effort: gone already once it got its name (or the copy failed anyway).
        let beside_it = SQLITE_FILES.map(|suffix| beside(&self.0, suffix));
        for file in std::iter::once(self.0.clone()).chain(beside_it) {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Gives the finished copy at `partial` the name `out`, failing if `out` exists (appeared
/// meanwhile: nothing is ever overwritten unasked): by a hard `link`, or where the filesystem
/// has none (vfat and exFAT refuse one with `EPERM`) by a rename that refuses to replace
/// (`RENAME_NOREPLACE`, which they have). Either way `out` only ever names the finished copy.
fn name_without_replacing(
    partial: &Path,
    out: &Path,
    link: impl FnOnce(&Path, &Path) -> std::io::Result<()>,
) -> Result<(), BackupError> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use std::io::ErrorKind::{AlreadyExists, PermissionDenied, Unsupported};
    let named = match link(partial, out) {
        Err(error) if matches!(error.kind(), PermissionDenied | Unsupported) => {
            renameat_with(CWD, partial, CWD, out, RenameFlags::NOREPLACE).map_err(Into::into)
        }
        linked => linked,
    };
    named.map_err(|error: std::io::Error| match error.kind() {
        AlreadyExists => BackupError::Exists(out.to_owned()),
        _ => io("naming the copy", out)(error),
    })
}

fn remove_if_present(path: &Path) -> Result<(), BackupError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", path)(e)),
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), BackupError> {
    std::fs::rename(from, to).map_err(|error| BackupError::Io {
        action: "renaming",
        path: format!("{} to {}", from.display(), to.display()).into(),
        error,
    })
}

/// Syncs `path`'s directory, so the rename that named `path` survives a crash.
fn sync_parent(path: &Path) -> Result<(), BackupError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io("syncing", dir))
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupError {
    let path = path.to_owned();
    move |error| BackupError::Io {
        action,
        path,
        error,
    }
}

/// The engine's error met doing `action` on `path`.
fn sql(action: &'static str, path: &Path) -> impl FnOnce(rusqlite::Error) -> BackupError + use<> {
    let inbox = inbox(action, path);
    move |error| inbox(error.into())
}

/// An inbox error met doing `action` on `path`; a file-system step's names its own action and
/// file already, and keeps them (instead of naming the file twice).
fn inbox(action: &'static str, path: &Path) -> impl FnOnce(InboxError) -> BackupError + use<> {
    let path = path.to_owned();
    move |error| match error {
        InboxError::Io {
            action,
            path,
            source,
        } => BackupError::Io {
            action,
            path,
            error: source,
        },
        error => BackupError::Inbox {
            action,
            path,
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::Durability,
        inbox::{
            Inbox, InboxError,
            contract::fixtures::{self, SOURCE},
        },
    };

    /// An inbox at `path` holding events `ids`.
    async fn inbox_with(path: &Path, ids: &[&str]) -> Inbox {
        let inbox = Inbox::open(path, Durability::Normal).unwrap();
        for id in ids {
            fixtures::accept(&inbox, fixtures::event(id)).await;
        }
        inbox
    }

    /// Whether the database at `path` holds `id` (opened as `hookd serve` opens it).
    async fn holds(path: &Path, ids: &[&str]) -> Vec<bool> {
        let inbox = Inbox::open(path, Durability::Normal).unwrap();
        let mut found = Vec::new();
        for id in ids {
            let stored = inbox
                .contains_event(SOURCE.into(), (*id).into())
                .await
                .unwrap();
            found.push(stored);
        }
        inbox.close();
        found
    }

    fn journal_mode(path: &Path) -> String {
        let conn = Connection::open(path).unwrap();
        conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap()
    }

    /// On a filesystem without hard links (vfat, exFAT: `EPERM`) the copy is named by a rename
    /// that still never replaces a file there.
    #[test]
    fn a_copy_is_named_without_a_hard_link_where_the_filesystem_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let (partial, out) = (dir.path().join("partial"), dir.path().join("copy.db"));
        std::fs::write(&partial, b"the copy's bytes").unwrap();
        let refused = |_: &Path, _: &Path| Err(std::io::Error::from_raw_os_error(1)); // EPERM
        name_without_replacing(&partial, &out, refused).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"the copy's bytes");
        assert!(!partial.exists(), "renamed, not copied");
        // One there already is left alone, and named in the error.
        std::fs::write(&partial, b"a newer copy").unwrap();
        let Err(BackupError::Exists(named)) = name_without_replacing(&partial, &out, refused)
        else {
            panic!("an existing file was not refused");
        };
        assert_eq!(named, out);
        assert_eq!(std::fs::read(&out).unwrap(), b"the copy's bytes");
        // Any other failure of the link is an error of its own.
        let full = |_: &Path, _: &Path| Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        let other = dir.path().join("other.db");
        let Err(BackupError::Io { action, .. }) = name_without_replacing(&partial, &other, full)
        else {
            panic!("a full disk was not an error");
        };
        assert_eq!(action, "naming the copy");
        assert!(!other.exists());
    }

    #[tokio::test]
    async fn a_served_database_is_copied_without_its_lock_and_the_copy_serves() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        let served = inbox_with(&db, &["a", "b", "c"]).await;

        let copied = backup(&db, &out, false, &[]).unwrap();
        assert_eq!(copied.events, 3);
        assert_eq!(copied.schema_version, schema::MIGRATIONS.len() as i64);
        // The server kept its lock and still commits.
        fixtures::accept(&served, fixtures::event("d")).await;
        assert!(!beside(&out, WAL).exists(), "a copy has no -wal of its own");
        assert!(!temporary_beside(&out).exists());
        assert_eq!(journal_mode(&out), "wal");
        assert_eq!(
            holds(&out, &["a", "b", "c", "d"]).await,
            [true, true, true, false]
        );
        served.close();
    }

    #[tokio::test]
    async fn a_closed_database_is_copied_too() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        backup(&db, &out, false, &[]).unwrap();
        assert_eq!(holds(&out, &["a"]).await, [true]);
    }

    #[tokio::test]
    async fn an_existing_destination_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        std::fs::write(&out, b"precious").unwrap();
        let Err(BackupError::Exists(named)) = backup(&db, &out, false, &[]) else {
            panic!("an existing destination must be refused");
        };
        assert_eq!(named, out);
        assert_eq!(std::fs::read(&out).unwrap(), b"precious");
        let Err(BackupError::SameFile(_)) = backup(&db, &db, true, &[]) else {
            panic!("the database is never its own backup");
        };

        backup(&db, &out, true, &[]).unwrap();
        assert_eq!(holds(&out, &["a"]).await, [true]);
    }

    /// The inode at `path`.
    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).unwrap().ino()
    }

    #[tokio::test]
    async fn a_backup_never_replaces_the_database_or_a_file_kept_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        let served = inbox_with(&db, &["a"]).await;
        let token = dir.path().join("hookd.db.admin-token");
        let kept = [(token.as_path(), "the admin token file")];
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        let (wal, lock) = (beside(&db, WAL), beside(&db, LOCK));
        let before = (inode(&wal), inode(&lock));

        let companions = [
            ("hookd.db-wal", "the write-ahead log"),
            ("hookd.db-shm", "the WAL index"),
            ("hookd.db-journal", "the rollback journal"),
            ("hookd.db.lock", "the lock file"),
            ("link/hookd.db.lock", "the lock file"),
            ("sub/../hookd.db-wal", "the write-ahead log"),
            ("link/sub/../hookd.db.admin-token", "the admin token file"),
        ];
        for (name, what) in companions {
            let out = dir.path().join(name);
            let e = backup(&db, &out, true, &kept).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "{} is {what} of the database {}; a copy never replaces it: choose another \
                     path",
                    out.display(),
                    db.display()
                )
            );
        }
        for itself in ["link/hookd.db", "sub/../hookd.db"] {
            let out = dir.path().join(itself);
            let Err(BackupError::SameFile(named)) = backup(&db, &out, true, &kept) else {
                panic!("{itself} is the database itself");
            };
            assert_eq!(named, out);
        }
        // A link leading to the lock is refused too.
        std::os::unix::fs::symlink(&lock, dir.path().join("to-lock")).unwrap();
        let e = backup(&db, &dir.path().join("to-lock"), true, &kept).unwrap_err();
        assert!(matches!(e, BackupError::Companion { .. }), "{e}");

        assert_eq!(
            (inode(&wal), inode(&lock)),
            before,
            "a live file was replaced"
        );
        assert!(!token.exists());
        let Err(InboxError::InUse { .. }) = Inbox::open(&db, Durability::Normal) else {
            panic!("the lock must still keep a second hookd off the database");
        };
        fixtures::accept(&served, fixtures::event("b")).await;
        served.close();
    }

    /// A restore cut short after it moved the database aside and before the copy took its
    /// place leaves no database, and its copy's temporary file: a start then refuses, naming
    /// that file, instead of serving a new, empty database (every event id a provider resends
    /// then new again, every plugin's state gone). The restore run again mends it.
    #[tokio::test]
    async fn a_restore_cut_short_is_not_served_as_a_new_database() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        backup(&db, &copy, false, &[]).unwrap();
        // Where a restore's process was killed between its two renames.
        let partial = dir.path().join(".hookd.db.4242.partial");
        std::fs::copy(&copy, &partial).unwrap();
        let aside = aside_name(&db);
        std::fs::rename(&db, &aside).unwrap();
        std::fs::rename(beside(&db, WAL), beside(&aside, WAL)).unwrap();
        remove_if_present(&beside(&db, SHM)).unwrap();
        let Err(e) = Inbox::open(&db, Durability::Normal) else {
            panic!("a database missing mid-restore was started anew");
        };
        assert!(matches!(e, InboxError::UnfinishedCopy { .. }), "{e}");
        assert!(e.to_string().contains(".hookd.db.4242.partial"), "{e}");
        assert!(!db.exists(), "nothing was created");
        restore(&db, &copy).unwrap();
        assert_eq!(holds(&db, &["a"]).await, [true]);
    }

    /// A restore that fails after it moved the database aside puts it back (before, its copy's
    /// temporary file was removed and nothing was left where the database had been, so the next
    /// start served a new, empty database, refused by nothing).
    #[tokio::test]
    async fn a_restore_failing_after_it_moved_the_database_aside_puts_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        backup(&db, &copy, false, &[]).unwrap();
        inbox_with(&db, &["b"]).await.close();
        // Its index cannot be removed: a directory in its place, not empty.
        let shm = beside(&db, SHM);
        let _ = std::fs::remove_file(&shm);
        std::fs::create_dir(&shm).unwrap();
        std::fs::write(shm.join("x"), b"").unwrap();
        let Err(e) = restore(&db, &copy) else {
            panic!("the index could not be removed");
        };
        let text = printed(e);
        assert!(
            text.contains("nothing was restored: the database is back at"),
            "{text}"
        );
        assert!(db.exists(), "{text}");
        std::fs::remove_dir_all(&shm).unwrap();
        assert_eq!(holds(&db, &["a", "b"]).await, [true, true]);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.contains("replaced") || name.contains("partial"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn a_temporary_name_already_taken_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        let temp = temporary_beside(&out);
        std::fs::write(&temp, b"someone's").unwrap();
        let Err(BackupError::Leftover(named)) = backup(&db, &out, false, &[]) else {
            panic!("an existing temporary file must be refused");
        };
        assert_eq!(named, temp);
        assert_eq!(std::fs::read(&temp).unwrap(), b"someone's");
        assert!(!out.exists());
    }

    /// `e` as the CLI prints it (`{:#}`, with its chain).
    fn printed(e: BackupError) -> String {
        format!("{:#}", anyhow::Error::from(e))
    }

    #[tokio::test]
    async fn each_cause_is_printed_once() {
        let dir = tempfile::tempdir().unwrap();
        let (db, junk) = (dir.path().join("hookd.db"), dir.path().join("junk.db"));
        let served = inbox_with(&db, &["a"]).await;

        let nodir = dir.path().join("nodir/x.db");
        assert_eq!(
            printed(backup(&db, &nodir, false, &[]).unwrap_err()),
            format!(
                "no directory {} to write the copy in; create it first",
                dir.path().join("nodir").display()
            )
        );
        let none = db.with_file_name("none.db");
        assert_eq!(
            printed(restore(&db, &none).unwrap_err()),
            format!("no backup at {} (the copy to restore from)", none.display())
        );
        backup(&db, &junk, false, &[]).unwrap();
        let in_use = printed(restore(&db, &junk).unwrap_err());
        assert_eq!(
            in_use,
            format!(
                "locking {db}: the database {db} is in use by another hookd process (lock {}); \
                 one hookd per database",
                beside(&db, LOCK).display(),
                db = db.display()
            )
        );
        served.close();

        std::fs::write(&junk, vec![7u8; 8192]).unwrap();
        assert_eq!(
            printed(restore(&db, &junk).unwrap_err()),
            format!(
                "reading {}: storage error: file is not a database",
                junk.display()
            )
        );
    }

    #[tokio::test]
    async fn a_restore_is_refused_while_a_hookd_holds_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        let served = inbox_with(&db, &["a"]).await;
        backup(&db, &copy, false, &[]).unwrap();
        let Err(BackupError::Inbox {
            error: InboxError::InUse { .. },
            ..
        }) = restore(&db, &copy)
        else {
            panic!("a restore must be refused while the database is served");
        };
        served.close();
    }

    /// A database removed after a crash leaves its `-wal` (its last commits) behind; restoring
    /// beside it would replay that log into the copy and serve a corrupt database. Refused,
    /// naming the file, and nothing is touched.
    #[tokio::test]
    async fn a_restore_beside_the_log_of_a_database_that_is_gone_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        backup(&db, &copy, false, &[]).unwrap();
        std::fs::remove_file(&db).unwrap();
        let wal = beside(&db, WAL);
        std::fs::write(&wal, b"the last commits of a crashed hookd").unwrap();

        let Err(e @ BackupError::Orphan { .. }) = restore(&db, &copy) else {
            panic!("a restore beside a gone database's log must be refused");
        };
        assert!(
            e.to_string().contains(&wal.display().to_string())
                && e.to_string().contains("move it away first"),
            "{e}"
        );
        assert!(!db.exists());
        assert_eq!(
            std::fs::read(&wal).unwrap(),
            b"the last commits of a crashed hookd"
        );

        // An empty log holds nothing (a backup of the stopped database left it): it goes.
        std::fs::write(&wal, b"").unwrap();
        restore(&db, &copy).unwrap();
        assert_eq!(holds(&db, &["a"]).await, [true]);
    }

    /// `--force` replaces an earlier copy, never a directory or a link (nor, the same check,
    /// a pipe or a device).
    #[tokio::test]
    async fn a_forced_backup_replaces_only_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        inbox_with(&db, &["a"]).await.close();
        let directory = dir.path().join("copies");
        std::fs::create_dir(&directory).unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"kept").unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for out in [&directory, &link] {
            let Err(BackupError::NotAFile(named)) = backup(&db, out, true, &[]) else {
                panic!("{} must be refused", out.display());
            };
            assert_eq!(&named, out);
        }
        assert!(directory.is_dir());
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
    }

    /// `--force` replaces an earlier copy, never another hookd's database, served now or
    /// before (its `-wal` holds what it acknowledged; before, it was deleted and the file
    /// replaced from under that hookd).
    #[tokio::test]
    async fn a_forced_backup_never_replaces_another_hookds_database() {
        let dir = tempfile::tempdir().unwrap();
        let (db, other) = (dir.path().join("hookd.db"), dir.path().join("other.db"));
        inbox_with(&db, &["a"]).await.close();
        let refused = |when: &str| {
            let Err(BackupError::Served { path, lock }) = backup(&db, &other, true, &[]) else {
                panic!("another hookd's database must be refused ({when})");
            };
            assert_eq!((path, lock), (other.clone(), beside(&other, LOCK)));
        };
        let served = inbox_with(&other, &["mine"]).await;
        let wal = std::fs::read(beside(&other, WAL)).unwrap();
        refused("served");
        assert_eq!(std::fs::read(beside(&other, WAL)).unwrap(), wal);
        served.close();
        drop(served);
        refused("stopped");
        // Its file gone, the log of its last writes left beside where it was.
        let away = dir.path().join("away.db");
        std::fs::rename(&other, &away).unwrap();
        std::fs::write(beside(&other, WAL), b"the last writes").unwrap();
        refused("its file gone");
        assert_eq!(
            std::fs::read(beside(&other, WAL)).unwrap(),
            b"the last writes"
        );
        std::fs::remove_file(beside(&other, WAL)).unwrap();
        // Without --force too: a copy named there would be what that hookd serves next.
        let Err(BackupError::Served { .. }) = backup(&db, &other, false, &[]) else {
            panic!("a copy must not take a served database's place");
        };
        assert!(!other.exists());
        std::fs::rename(&away, &other).unwrap();
        assert_eq!(holds(&other, &["mine", "a"]).await, [true, false]);
    }

    /// Without `--force` a log beside `OUT` is refused and named, not replayed into the copy
    /// (a `-journal` was not looked for: the copy's first open rolled it in, corrupt).
    #[tokio::test]
    async fn a_log_beside_the_destination_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        for suffix in [JOURNAL, WAL] {
            let log = beside(&out, suffix);
            std::fs::write(&log, b"a log of some other database").unwrap();
            let Err(e @ BackupError::LogBeside { .. }) = backup(&db, &out, false, &[]) else {
                panic!("{suffix} beside the destination must be refused");
            };
            assert!(
                e.to_string().starts_with(&format!("{} (", log.display())),
                "{e}"
            );
            assert!(!out.exists());
            std::fs::remove_file(&log).unwrap();
        }
        backup(&db, &out, false, &[]).unwrap();
        assert_eq!(holds(&out, &["a"]).await, [true]);
    }

    #[tokio::test]
    async fn a_restore_keeps_the_replaced_database_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["old"]).await.close();
        backup(&db, &copy, false, &[]).unwrap();
        let newer = inbox_with(&db, &["new"]).await;
        newer.close();

        let restored = restore(&db, &copy).unwrap();
        assert_eq!(restored.copied.events, 1);
        assert_eq!(holds(&db, &["old", "new"]).await, [true, false]);
        let aside = restored.replaced.expect("the replaced database is kept");
        assert_eq!(holds(&aside, &["old", "new"]).await, [true, true]);
    }

    /// A database named through a symbolic link is restored in the file the link leads to, the
    /// link left as it is (it was renamed aside, and the file it led to kept its old events
    /// and its log where a hookd given that file's own path served them on).
    #[tokio::test]
    async fn a_restore_through_a_link_replaces_the_file_it_leads_to() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let (real, link) = (
            dir.path().join("data/hookd.db"),
            dir.path().join("hookd.db"),
        );
        std::os::unix::fs::symlink("data/hookd.db", &link).unwrap();
        let copy = dir.path().join("copy.db");
        inbox_with(&link, &["old"]).await.close();
        backup(&link, &copy, false, &[]).unwrap();
        inbox_with(&link, &["new"]).await.close();

        let restored = restore(&link, &copy).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(holds(&real, &["old", "new"]).await, [true, false]);
        let aside = restored.replaced.expect("the replaced database is kept");
        assert_eq!(aside.parent(), real.canonicalize().unwrap().parent());
        assert_eq!(holds(&aside, &["old", "new"]).await, [true, true]);
    }

    /// A restore reads the backup without writing beside it (no `-shm`, no `-wal`), so a backup
    /// on read-only storage restores and a backup directory is left as it was; a path with
    /// characters a URI gives meaning to is read as named. Before, the read-only open of a WAL
    /// database made both files beside the backup, and failed where it could not.
    #[tokio::test]
    async fn a_restore_leaves_nothing_beside_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("backups ?#%41");
        std::fs::create_dir(&store).unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), store.join("copy?x=1#%41.db"));
        inbox_with(&db, &["old"]).await.close();
        backup(&db, &copy, false, &[]).unwrap();
        let listing = || {
            let mut names: Vec<_> = std::fs::read_dir(&store)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        let before = listing();
        restore(&db, &copy).unwrap();
        assert_eq!(holds(&db, &["old"]).await, [true]);
        assert_eq!(listing(), before);
        // A path that starts with `//` names the same file (not a URI's host).
        let doubled = PathBuf::from(format!("/{}", copy.display()));
        restore(&db, &doubled).unwrap();
        assert_eq!(holds(&db, &["old"]).await, [true]);
    }

    #[tokio::test]
    async fn a_restore_checks_the_copy_before_touching_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        let before = std::fs::read(&db).unwrap();

        // Not SQLite at all.
        std::fs::write(&copy, vec![7u8; 8192]).unwrap();
        let e = restore(&db, &copy).unwrap_err();
        assert!(e.to_string().contains("copy.db"), "{e}");

        // SQLite, but not hookd's.
        std::fs::remove_file(&copy).unwrap();
        Connection::open(&copy)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert!(matches!(restore(&db, &copy), Err(BackupError::NotHookd(_))));

        // hookd's, from a newer hookd.
        std::fs::remove_file(&copy).unwrap();
        backup(&db, &copy, false, &[]).unwrap();
        Connection::open(&copy)
            .unwrap()
            .execute_batch("PRAGMA user_version = 999")
            .unwrap();
        assert!(matches!(
            restore(&db, &copy),
            Err(BackupError::TooNew { found: 999, .. })
        ));

        // hookd's, with a damaged page: the index no longer matches its table.
        std::fs::remove_file(&copy).unwrap();
        let damaged = dir.path().join("damaged.db");
        {
            let inbox = inbox_with(&damaged, &[]).await;
            let ids: Vec<String> = (0..300).map(|i| format!("e{i}")).collect();
            for id in &ids {
                fixtures::accept(&inbox, fixtures::event(id)).await;
            }
            inbox.close();
        }
        Connection::open(&damaged)
            .unwrap()
            .execute_batch(
                "PRAGMA writable_schema = ON;
                 UPDATE sqlite_schema SET sql = replace(sql, 'received_at', 'event_type')
                     WHERE name = 'events_received';",
            )
            .unwrap();
        let Err(BackupError::Corrupt { path, .. }) = restore(&db, &damaged) else {
            panic!("a copy failing integrity_check must be refused");
        };
        assert_eq!(
            path, damaged,
            "named by the file given, not its temporary copy"
        );

        assert_eq!(
            std::fs::read(&db).unwrap(),
            before,
            "the database was touched"
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().all(|f| !f
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("replaced")),
            "nothing was moved aside"
        );
    }
}
