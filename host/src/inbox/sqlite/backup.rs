//! Copies of the database file: SQLite's online backup API under one read snapshot, the checks
//! a copy passes before it gets its name, and the file moves of a restore.
//!
//! Invariants:
//! - The source is opened read-only and never locked: a backup takes no `<database>.lock` and
//!   writes nothing to it. One read transaction spans the whole copy, so every page comes from
//!   one snapshot (WAL lets the serving hookd commit meanwhile, and the copy never restarts).
//! - A copy is written to a temporary file beside its destination and gets its name only after
//!   it holds a schema this hookd knows and passed `PRAGMA integrity_check`; it is left in WAL
//!   mode with no `-wal` of its own, as `hookd serve` opens it.
//! - A restore moves the replaced database (and its `-wal`) aside, never deletes it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use rusqlite::{
    Connection, OpenFlags,
    backup::{Backup, StepResult},
};

use super::{connection, schema};
use crate::inbox::backup::{BackupError, Copied, Restored};

/// Pages copied per step of the backup API (4 MiB at hookd's page size).
const PAGES_PER_STEP: i32 = 1024;

/// The tables a hookd database has from its first schema version on.
const HOOKD_TABLES: [&str; 5] = [
    "events",
    "deliveries",
    "attempts",
    "quarantine",
    "plugin_state",
];

pub(in crate::inbox) fn backup(
    database: &Path,
    out: &Path,
    replace: bool,
) -> Result<Copied, BackupError> {
    if !database.is_file() {
        return Err(BackupError::Missing(database.to_owned()));
    }
    if same_file(database, out) {
        return Err(BackupError::SameFile(out.to_owned()));
    }
    if !replace && (out.exists() || suffixed(out, "-wal").exists()) {
        return Err(BackupError::Exists(out.to_owned()));
    }
    let temp = temporary_beside(out);
    let placed = copy(database, &temp).and_then(|copied| {
        if replace {
            // A stale `-wal` beside `out` would be replayed into the copy on its first open.
            remove_if_present(&suffixed(out, "-wal"))?;
            remove_if_present(&suffixed(out, "-shm"))?;
            rename(&temp, out)?;
        } else {
            // A link fails if `out` appeared meanwhile: nothing is ever overwritten unasked.
            std::fs::hard_link(&temp, out).map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => BackupError::Exists(out.to_owned()),
                _ => io("naming the copy", out)(source),
            })?;
            remove_if_present(&temp)?;
        }
        sync_parent(out)?;
        Ok(copied)
    });
    if placed.is_err() {
        remove_temporary(&temp);
    }
    placed
}

pub(in crate::inbox) fn restore(
    database: &Path,
    copy_path: &Path,
) -> Result<Restored, BackupError> {
    if !copy_path.is_file() {
        return Err(BackupError::Missing(copy_path.to_owned()));
    }
    if same_file(database, copy_path) {
        return Err(BackupError::SameFile(copy_path.to_owned()));
    }
    let inbox = |action| {
        move |source| BackupError::Inbox {
            action,
            path: database.to_owned(),
            source,
        }
    };
    connection::create_parent(database).map_err(inbox("creating the directory of"))?;
    // Held until the restored database is in place: no hookd starts on a half-restored one.
    let _lock = connection::lock_database(database).map_err(inbox("locking"))?;
    let temp = temporary_beside(database);
    let copied = match copy(copy_path, &temp) {
        Ok(copied) => copied,
        Err(e) => {
            remove_temporary(&temp);
            return Err(e);
        }
    };
    let replaced = if database.exists() {
        let aside = aside_name(database);
        rename(database, &aside)?;
        // The replaced database's last commits may still be in its `-wal`: it goes with it.
        let wal = suffixed(database, "-wal");
        if wal.exists() {
            rename(&wal, &suffixed(&aside, "-wal"))?;
        }
        remove_if_present(&suffixed(database, "-shm"))?;
        Some(aside)
    } else {
        None
    };
    rename(&temp, database)?;
    sync_parent(database)?;
    Ok(Restored { copied, replaced })
}

/// Copies the database at `from` into a new file `to` (one snapshot), then checks the copy.
fn copy(from: &Path, to: &Path) -> Result<Copied, BackupError> {
    let at = |action, path: &Path| {
        let path = path.to_owned();
        move |source: rusqlite::Error| BackupError::Inbox {
            action,
            path,
            source: source.into(),
        }
    };
    let source = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(at("opening", from))?;
    source
        .busy_timeout(Duration::from_secs(10))
        .map_err(at("opening", from))?;
    // The snapshot: a read transaction started by the first read, held to the last page.
    source
        .execute_batch("BEGIN DEFERRED")
        .map_err(at("reading", from))?;
    let schema_version = hookd_schema(&source, from)?;
    let events: i64 = source
        .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
        .map_err(at("reading", from))?;

    connection::create_private(to).map_err(|source| BackupError::Inbox {
        action: "creating",
        path: to.to_owned(),
        source,
    })?;
    let mut target = Connection::open(to).map_err(at("opening", to))?;
    {
        let backup = Backup::new(&source, &mut target).map_err(at("copying into", to))?;
        loop {
            match backup
                .step(PAGES_PER_STEP)
                .map_err(at("copying from", from))?
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
        .map_err(at("reading", from))?;
    drop(source);

    let mode: String = target
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(at("setting WAL mode on", to))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let refused = std::io::Error::other(format!("journal_mode stayed {mode}"));
        return Err(io("setting WAL mode on", to)(refused));
    }
    integrity_check(&target, to)?;
    // Closing the last connection checkpoints the copy's `-wal` into it and deletes it.
    target.close().map_err(|(_, e)| at("closing", to)(e))?;
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
    let read = |source: rusqlite::Error| BackupError::Inbox {
        action: "reading",
        path: path.to_owned(),
        source: source.into(),
    };
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
    let read = |source: rusqlite::Error| BackupError::Inbox {
        action: "checking",
        path: path.to_owned(),
        source: source.into(),
    };
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

/// `path` with `suffix` appended to its file name (SQLite's `-wal`, `-shm`).
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A temporary name in `path`'s directory, unique to this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

/// Where a restore moves the database it replaces: `<database>.replaced-<unix ms>`.
fn aside_name(database: &Path) -> PathBuf {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    suffixed(database, &format!(".replaced-{ms}"))
}

/// Removes a temporary copy and whatever SQLite left beside it (best effort: it failed anyway).
fn remove_temporary(temp: &Path) {
    for file in [
        temp.to_owned(),
        suffixed(temp, "-wal"),
        suffixed(temp, "-shm"),
    ] {
        let _ = std::fs::remove_file(file);
    }
}

fn remove_if_present(path: &Path) -> Result<(), BackupError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", path)(e)),
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), BackupError> {
    std::fs::rename(from, to).map_err(|source| BackupError::Io {
        action: "renaming",
        path: format!("{} to {}", from.display(), to.display()).into(),
        source,
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
    move |source| BackupError::Io {
        action,
        path,
        source,
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

    #[tokio::test]
    async fn a_served_database_is_copied_without_its_lock_and_the_copy_serves() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        let served = inbox_with(&db, &["a", "b", "c"]).await;

        let copied = backup(&db, &out, false).unwrap();
        assert_eq!(copied.events, 3);
        assert_eq!(copied.schema_version, schema::MIGRATIONS.len() as i64);
        // The server kept its lock and still commits.
        fixtures::accept(&served, fixtures::event("d")).await;
        assert!(
            !suffixed(&out, "-wal").exists(),
            "a copy has no -wal of its own"
        );
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
        backup(&db, &out, false).unwrap();
        assert_eq!(holds(&out, &["a"]).await, [true]);
    }

    #[tokio::test]
    async fn an_existing_destination_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (db, out) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["a"]).await.close();
        std::fs::write(&out, b"precious").unwrap();
        let Err(BackupError::Exists(named)) = backup(&db, &out, false) else {
            panic!("an existing destination must be refused");
        };
        assert_eq!(named, out);
        assert_eq!(std::fs::read(&out).unwrap(), b"precious");
        let Err(BackupError::SameFile(_)) = backup(&db, &db, true) else {
            panic!("the database is never its own backup");
        };

        backup(&db, &out, true).unwrap();
        assert_eq!(holds(&out, &["a"]).await, [true]);
    }

    #[tokio::test]
    async fn a_restore_is_refused_while_a_hookd_holds_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        let served = inbox_with(&db, &["a"]).await;
        backup(&db, &copy, false).unwrap();
        let Err(BackupError::Inbox {
            source: InboxError::InUse { .. },
            ..
        }) = restore(&db, &copy)
        else {
            panic!("a restore must be refused while the database is served");
        };
        served.close();
    }

    #[tokio::test]
    async fn a_restore_keeps_the_replaced_database_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (db, copy) = (dir.path().join("hookd.db"), dir.path().join("copy.db"));
        inbox_with(&db, &["old"]).await.close();
        backup(&db, &copy, false).unwrap();
        let newer = inbox_with(&db, &["new"]).await;
        newer.close();

        let restored = restore(&db, &copy).unwrap();
        assert_eq!(restored.copied.events, 1);
        assert_eq!(holds(&db, &["old", "new"]).await, [true, false]);
        let aside = restored.replaced.expect("the replaced database is kept");
        assert_eq!(holds(&aside, &["old", "new"]).await, [true, true]);
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
        backup(&db, &copy, false).unwrap();
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
        assert!(
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .ends_with(".partial")
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
