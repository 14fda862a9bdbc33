//! The database's files and connections: the names of the files beside it, the owner-only
//! files, the one-process lock, the pragmas every connection gets, and the pool of read
//! connections.
//!
//! Invariants:
//! - The database and its companion files are owner-only (0600) and its new directories 0700:
//!   they hold every body and header.
//! - One hookd per database: the lock is held from open to close.
//! - Reads never go through the writer: they run on pooled connections (WAL lets them see the
//!   last commit while the writer works).

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
};

use std::os::unix::fs::OpenOptionsExt as _;

use rusqlite::{Connection, OpenFlags, config::DbConfig};

use super::SqliteStore;
use crate::{config::Durability, inbox::InboxError};

/// Read connections kept for reuse; more concurrent reads open (and then drop) their own.
const MAX_POOLED_READERS: usize = 16;

/// What every SQLite database file begins with.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// The tables a hookd database has from its first schema version on.
pub(super) const HOOKD_TABLES: [&str; 5] = [
    "events",
    "deliveries",
    "attempts",
    "quarantine",
    "plugin_state",
];

/// Refuses a `path` that exists and is not a hookd database, before anything is created,
/// locked or tightened beside it: a mistyped `server.database` naming some other file, another
/// program's SQLite database among them, must not have its mode or journal changed, hookd's
/// tables made in it, nor a lock file made beside it. A missing or empty file, or an SQLite
/// database with no tables at all, is a new database.
pub(super) fn check_existing(path: &Path) -> Result<(), InboxError> {
    use std::io::Read as _;
    let not_a_database = |why| InboxError::NotADatabase {
        path: path.to_owned(),
        why,
    };
    let Ok(meta) = std::fs::metadata(path) else {
        // A new database, unless the files beside it say one was there (even an empty log:
        // the file of an idle hookd moved away leaves one, and a start must not begin anew).
        let wal = beside(&target_file(path), WAL);
        if wal.exists() {
            return Err(InboxError::OrphanedWal {
                path: path.to_owned(),
                wal,
            });
        }
        if let Some(partial) = super::backup::unfinished_copy(&target_file(path)) {
            return Err(InboxError::UnfinishedCopy {
                path: path.to_owned(),
                partial,
            });
        }
        return Ok(());
    };
    if !meta.is_file() {
        return Err(not_a_database("it is not a regular file"));
    }
    if meta.len() == 0 {
        return Ok(());
    }
    let mut header = [0u8; 16];
    let read = std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .map_err(|source| InboxError::Io {
            action: "reading",
            path: path.to_owned(),
            source,
        });
    match read {
        Ok(()) if &header == SQLITE_HEADER => check_tables(path),
        Ok(()) => Err(not_a_database("it does not begin with SQLite's header")),
        Err(InboxError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Err(not_a_database("it is shorter than SQLite's header"))
        }
        Err(e) => Err(e),
    }
}

/// The file `path` leads to, or would be created as: `path` itself unless it is a symbolic
/// link, else the link followed (a link to a file not there yet too), its directory resolved.
/// SQLite keeps the `-wal` and `-shm` beside it, and hookd its `.lock`, so that a database named
/// through a link and through its target has one lock, and the files beside it are the ones
/// tightened. (A symbolic link among the directories needs nothing: the files beside the name
/// are the files beside the target.)
pub(super) fn target_file(path: &Path) -> PathBuf {
    if !std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_symlink()) {
        return path.to_owned();
    }
    let mut target = path.to_owned();
    // As many links as the kernel follows before it gives up.
    for _ in 0..40 {
        let Ok(next) = std::fs::read_link(&target) else {
            break;
        };
        target = match target.parent() {
            Some(dir) => dir.join(next),
            None => next,
        };
    }
    match (target.parent(), target.file_name()) {
        (Some(dir), Some(name)) => {
            std::fs::canonicalize(dir).map_or(target.clone(), |dir| dir.join(name))
        }
        _ => target,
    }
}

/// Refuses an SQLite database at `path` that holds tables but not hookd's, or a schema version
/// hookd never wrote. Read through a read-only connection, which changes nothing in the file;
/// and, unless its `-wal` and `-shm` are both there already, as an immutable file: a read-only
/// connection to a database in WAL mode creates the two (and, unable to checkpoint, leaves
/// them), which beside another program's database, owned by another user, would stop that
/// program writing to it. The file alone is then read: what a `-wal` may hold beyond it is
/// newer writes to tables the file already has, or the first tables of a new database, which
/// a file with no tables counts as.
fn check_tables(path: &Path) -> Result<(), InboxError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    // The file a symbolic link leads to, whose directory holds the `-wal` and `-shm`; and an
    // absolute path, which a `file://` URI wants (`//srv/h.db` would name a host).
    let real = std::fs::canonicalize(path).map_err(|source| InboxError::Io {
        action: "resolving",
        path: path.to_owned(),
        source,
    })?;
    let companions_there = beside(&real, WAL).exists() && beside(&real, SHM).exists();
    let conn = match real.to_str() {
        Some(name) if !companions_there => {
            // `?`, `#` and `%` end or escape a URI's path; the rest is taken as written.
            const URI_PATH: &percent_encoding::AsciiSet =
                &percent_encoding::CONTROLS.add(b'?').add(b'#').add(b'%');
            let uri = format!(
                "file://{}?immutable=1",
                percent_encoding::utf8_percent_encode(name, URI_PATH)
            );
            Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)?
        }
        _ => Connection::open_with_flags(&real, flags)?,
    };
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let mut names = conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table'")?;
    let tables = names
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    if tables.is_empty() && version == 0 {
        return Ok(());
    }
    let foreign = |why: String| {
        Err(InboxError::ForeignDatabase {
            path: path.to_owned(),
            why,
        })
    };
    let missing: Vec<&str> = HOOKD_TABLES
        .into_iter()
        .filter(|table| !tables.iter().any(|t| t == table))
        .collect();
    if !missing.is_empty() {
        return foreign(format!("it has no table {}", missing.join(", ")));
    }
    if version < 1 {
        return foreign("its schema version is 0".to_owned());
    }
    Ok(())
}

/// Creates the database's directory (0700) if it is missing.
pub(super) fn create_parent(path: &Path) -> Result<(), InboxError> {
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    if dir.as_os_str().is_empty() || dir.exists() {
        return Ok(());
    }
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| InboxError::Io {
            action: "creating database directory",
            path: dir.to_owned(),
            source,
        })
}

/// What keeps a database to one hookd process: exclusive advisory locks (released by the
/// kernel if the process dies), held while this is.
pub(super) struct DatabaseLock {
    /// `<database>.lock`, locked while held (`None` where the file system takes no
    /// locks); only its drop is needed.
    _lock_file: Option<std::fs::File>,
    /// The database file itself, locked once it exists.
    database: Option<std::fs::File>,
}

/// Takes an exclusive advisory lock on `<database>.lock` and on the database file itself, so two
/// hookd processes never share one database: the second would reclaim the first's live leases
/// at start-up and run deliveries twice, and two writers each with a `-wal` of its own corrupt
/// the file. The `.lock` is beside the file `path` leads to ([`target_file`]), whichever
/// symbolic link names it; the database's own lock holds under every name of the file (a hard
/// link leads to another `.lock`) and when its `.lock` was removed by hand. (A database not
/// created yet has its `.lock` alone.)
pub(super) fn lock_database(path: &Path) -> Result<DatabaseLock, InboxError> {
    let lock_path = beside(&target_file(path), LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| InboxError::Io {
            action: "opening",
            path: lock_path.clone(),
            source,
        })?;
    let mut lock = DatabaseLock {
        _lock_file: hold(file, path, &lock_path)?,
        database: None,
    };
    lock.hold_database(path)?;
    Ok(lock)
}

impl DatabaseLock {
    /// Locks the database file at `path` too, if it exists and is not locked yet (a database
    /// created after its `.lock` was taken).
    pub(super) fn hold_database(&mut self, path: &Path) -> Result<(), InboxError> {
        if self.database.is_some() {
            return Ok(());
        }
        self.database = match std::fs::File::open(path) {
            Ok(file) => hold(file, path, path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(InboxError::Io {
                    action: "opening",
                    path: path.to_owned(),
                    source,
                });
            }
        };
        Ok(())
    }
}

/// Locks `file` (`locked`, the lock of `database`) exclusively, waiting up to [`LOCK_GRACE`]:
/// the file, still locked, or `None` where the file system takes no locks (warned).
fn hold(
    file: std::fs::File,
    database: &Path,
    locked: &Path,
) -> Result<Option<std::fs::File>, InboxError> {
    let deadline = std::time::Instant::now() + LOCK_GRACE;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(LOCK_RETRY);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(InboxError::InUse {
                    database: database.to_owned(),
                    lock: locked.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(lock = %locked.display(), error = %e, "cannot lock the database; continuing unlocked");
                return Ok(None);
            }
        }
    }
}

/// How long a held lock is waited for before the database counts as in use. A lock outlives
/// its holder's close for a moment whenever a process is being started: the child holds a
/// copy of every descriptor from its fork until its exec closes them, and the lock goes with
/// that copy. A previous hookd still exiting holds it a moment longer too. A second hookd
/// really running keeps it past this and is refused.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// How often a held lock is tried again within [`LOCK_GRACE`].
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// SQLite's write-ahead log beside a database (`<database>-wal`).
pub(super) const WAL: &str = "-wal";
/// SQLite's WAL index beside a database (`<database>-shm`).
pub(super) const SHM: &str = "-shm";
/// SQLite's rollback journal beside a database (`<database>-journal`; hookd's databases are in
/// WAL mode, but a copy is written in rollback mode before it is switched).
pub(super) const JOURNAL: &str = "-journal";
/// hookd's one-process lock beside a database (`<database>.lock`).
pub(super) const LOCK: &str = ".lock";

/// The database's companion files, as the suffix added to its path and what each is: the one
/// list of the files the SQLite room keeps beside a database.
pub(super) const COMPANIONS: [(&str, &str); 4] = [
    (WAL, "the write-ahead log"),
    (SHM, "the WAL index"),
    (JOURNAL, "the rollback journal"),
    (LOCK, "the lock file"),
];

/// The database file at `path` and each of its [`COMPANIONS`].
pub fn database_files(path: &Path) -> Vec<PathBuf> {
    std::iter::once(path.to_owned())
        .chain(COMPANIONS.iter().map(|(suffix, _)| beside(path, suffix)))
        .collect()
}

/// `path` with `suffix` appended to its file name (how each of [`COMPANIONS`] is named).
pub(super) fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The database's companion files.
fn companions(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    COMPANIONS
        .iter()
        .map(move |(suffix, _)| beside(path, suffix))
}

/// Creates the database file owner-only (0600) before SQLite opens it: SQLite creates the
/// `-wal` and `-shm` files with the database file's mode, so they are owner-only too. Existing
/// files readable by others (the database and the files beside the one `path` leads to) are
/// tightened to 0600.
pub(super) fn create_private(path: &Path) -> Result<(), InboxError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| InboxError::Io {
            action: "creating",
            path: path.to_owned(),
            source,
        })?;
    let target = target_file(path);
    for file in std::iter::once(path.to_owned()).chain(companions(&target)) {
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

/// A connection with the pragmas every connection needs (WAL, the durability's `synchronous`,
/// a busy timeout, foreign keys, temporary storage in memory), plans that never depend on
/// bound values, and a statement cache.
///
/// `temp_store = MEMORY`: a savepoint (a writer job's, when its batch is redone after a
/// failure) keeps the original of each page it changes in a sub-journal, by default a
/// temporary file; in memory it costs no `pwrite` per page. It is bounded by what one job
/// changes, and holds nothing a crash needs: the WAL does.
pub(super) fn open_connection(
    path: &Path,
    durability: Durability,
) -> Result<Connection, InboxError> {
    // Never `CREATE`: the file is made by `create_private` before the first connection, and
    // a reader opened after it was deleted must fail, not start an empty database at its path
    // (which the next start would take for a new one, beside the WAL holding the last writes).
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let synchronous = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = {synchronous};
         PRAGMA busy_timeout = 10000;
         PRAGMA foreign_keys = ON;
         PRAGMA temp_store = MEMORY;"
    ))?;
    stable_plans(&conn)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Plans never depend on bound values (SQLite's query planner stability guarantee). Without
/// it, a statement whose plan SQLite made with a parameter's value (`LIMIT ?` does) is compiled
/// again whenever that value changes, which on the writer cost each claim as much again as the
/// claim itself; and the plans the tests hold are the plans that run.
fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map(drop)
}

/// A migrated in-memory database planning as the room's connections do, for the room's
/// tests of SQL and plans.
#[cfg(test)]
pub(super) fn in_memory() -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch("PRAGMA foreign_keys = ON").unwrap();
    stable_plans(&conn).unwrap();
    super::schema::migrate(&conn).unwrap();
    super::walks::install(&conn).unwrap();
    conn
}

impl SqliteStore {
    /// Runs a read on a pooled connection, on the blocking pool.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError> + Send + 'static,
    ) -> Result<T, InboxError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.read_blocking(f)).await?
    }

    /// Runs a read on a pooled connection on the current thread (for short point reads).
    pub(super) fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, InboxError>,
    ) -> Result<T, InboxError> {
        // A pooled connection still reads a deleted file: what it says is not the database's.
        self.inner.health.still_there()?;
        let mut reading = self.inner.readers.take()?;
        let conn = match reading.conn.take() {
            Some(conn) => conn,
            None => open_connection(&self.inner.path, Durability::Normal)?,
        };
        let result = f(&conn);
        reading.conn = Some(conn);
        result
    }
}

/// The read connections of one database: the idle ones, pooled (at most
/// [`MAX_POOLED_READERS`]), and a count of those in use, which [`Readers::close`] waits for.
#[derive(Default)]
pub(super) struct Readers {
    state: Mutex<ReadersState>,
    /// Signalled when a connection in use comes back.
    returned: std::sync::Condvar,
}

#[derive(Default)]
struct ReadersState {
    idle: Vec<Connection>,
    in_use: usize,
    closed: bool,
}

/// How long [`Readers::close`] waits for reads still running (then it goes on, and warns).
const READS_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

impl Readers {
    /// A read's turn, with a pooled connection if one is idle (else the caller opens one and
    /// puts it in [`Reading::conn`]); refused once closed.
    fn take(&self) -> Result<Reading<'_>, InboxError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return Err(InboxError::WriterGone);
        }
        state.in_use += 1;
        let conn = state.idle.pop();
        Ok(Reading {
            readers: self,
            conn,
        })
    }

    /// Closes every idle connection and waits (up to [`READS_DRAIN`]) for those in use, which
    /// are closed as they come back; no read starts after this.
    pub(super) fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        state.idle.clear();
        let (state, waited) = self
            .returned
            .wait_timeout_while(state, READS_DRAIN, |state| state.in_use > 0)
            .unwrap_or_else(PoisonError::into_inner);
        if waited.timed_out() {
            tracing::warn!(
                reads = state.in_use,
                "closing the database with reads still running after {} s",
                READS_DRAIN.as_secs()
            );
        }
    }
}

/// One read's connection, given back to [`Readers`] when dropped (a panicking read too).
struct Reading<'a> {
    readers: &'a Readers,
    conn: Option<Connection>,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut state = self
            .readers
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.in_use -= 1;
        if let Some(conn) = self.conn.take()
            && !state.closed
            && state.idle.len() < MAX_POOLED_READERS
        {
            state.idle.push(conn);
        }
        // A connection not pooled is closed here, before `close` is told it came back.
        drop(state);
        self.readers.returned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::Inbox;

    /// A close waits for the reads still running before it lets the database go (their
    /// connections would go on without the SQLite locks the lock's release takes from the
    /// process), and no read starts after it.
    #[test]
    fn a_close_lets_the_database_go_only_after_the_reads_running() {
        use crate::inbox::store::Store as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let options = super::super::WriterOptions::new(Durability::Normal);
        let store = SqliteStore::open(&path, options).unwrap();
        let (inside, entered) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn({
            let store = store.clone();
            move || {
                store.read_blocking(|conn| {
                    inside.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?)
                })
            }
        });
        entered.recv().unwrap();
        let closing = std::thread::spawn({
            let store = store.clone();
            move || store.close()
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!closing.is_finished(), "closed with a read running");
        assert!(
            matches!(lock_database(&path), Err(InboxError::InUse { .. })),
            "the database was let go with a read running"
        );
        release.send(()).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 1);
        closing.join().unwrap();
        assert!(matches!(
            store.read_blocking(|_| Ok(())),
            Err(InboxError::WriterGone)
        ));
        lock_database(&path).expect("let go once the read ended");
    }

    #[test]
    fn one_hookd_per_database_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let first = Inbox::open(&path, Durability::Full).unwrap();
        let Err(e) = Inbox::open(&path, Durability::Full) else {
            panic!("a second open of the same database must be refused");
        };
        assert!(e.to_string().contains("in use by another hookd"), "{e}");
        first.close();
        Inbox::open(&path, Durability::Full).unwrap().close();
    }

    /// The database file itself is locked too: a hard link to it (another name, beside which
    /// lies another `.lock`) and its `.lock` removed by hand each let a second hookd run on it,
    /// the two corrupting the file (each with a `-wal` of its own) and taking back each other's
    /// live leases.
    #[test]
    fn a_second_hookd_is_refused_through_a_hard_link_or_with_the_lock_file_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("other")).unwrap();
        let path = dir.path().join("hookd.db");
        let linked = dir.path().join("other/hookd.db");
        let first = Inbox::open(&path, Durability::Full).unwrap();
        std::fs::hard_link(&path, &linked).unwrap();
        let Err(e) = Inbox::open(&linked, Durability::Full) else {
            panic!("a hard link to a database in use must be refused");
        };
        assert!(e.to_string().contains("in use by another hookd"), "{e}");
        std::fs::remove_file(beside(&path, LOCK)).unwrap();
        let Err(e) = Inbox::open(&path, Durability::Full) else {
            panic!("a database in use must be refused with its lock file removed");
        };
        assert!(e.to_string().contains("in use by another hookd"), "{e}");
        first.close();
        drop(first);
        Inbox::open(&linked, Durability::Full).unwrap().close();
    }

    /// A database named through a symbolic link and through the file it leads to is one
    /// database: one lock, beside the file (where SQLite keeps its `-wal`), whichever name
    /// opened it first. (The lock went beside the name given, so a hookd configured with the
    /// link and another with the target both ran on it, each taking the other's leases back.)
    #[test]
    fn a_database_named_through_a_link_has_the_lock_of_the_file_it_leads_to() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let real = dir.path().join("data/hookd.db");
        let link = dir.path().join("hookd.db");
        // Relative, to a file not there yet: the first open creates it through the link.
        std::os::unix::fs::symlink("data/hookd.db", &link).unwrap();
        for (first, second) in [(&link, &real), (&real, &link)] {
            let held = Inbox::open(first, Durability::Full).unwrap();
            let Err(e) = Inbox::open(second, Durability::Full) else {
                panic!(
                    "{} opened while {} is open",
                    second.display(),
                    first.display()
                );
            };
            assert!(e.to_string().contains("in use by another hookd"), "{e}");
            held.close();
        }
        assert!(beside(&real, LOCK).exists() && !beside(&link, LOCK).exists());
        // The files beside the target are the ones tightened (the lock outlives a close).
        let lock = beside(&real, LOCK);
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
        Inbox::open(&link, Durability::Full).unwrap().close();
        let mode = std::fs::metadata(&lock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    /// The lock a closing holder's fork-to-exec child still holds for a moment is waited for,
    /// not mistaken for a second hookd. Here a copy of the holder's descriptor (what a child
    /// between its fork and exec has) keeps the lock 300 ms past the holder's own close.
    #[test]
    fn a_lock_released_within_the_grace_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        // A database not created yet: its `.lock` alone is held.
        let holder = lock_database(&path).unwrap();
        let child_copy = holder._lock_file.as_ref().unwrap().try_clone().unwrap();
        drop(holder);
        let exec = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(child_copy);
        });
        let started = std::time::Instant::now();
        Inbox::open(&path, Durability::Normal).unwrap().close();
        assert!(started.elapsed() < LOCK_GRACE);
        exec.join().unwrap();
    }

    #[test]
    fn database_files_are_owner_only_and_wider_ones_are_tightened() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dir/hookd.db");
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        // Every file this open left (a database in WAL mode has no `-journal`).
        for file in std::iter::once(path.clone()).chain([WAL, SHM, LOCK].map(|s| beside(&path, s)))
        {
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

    #[test]
    fn a_file_that_is_not_a_database_is_refused_and_left_as_it_is() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let notes = dir.path().join("notes.txt");
        std::fs::write(&notes, "shopping list: eggs, milk\n").unwrap();
        std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o644)).unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "SQLite").unwrap();
        for (path, why) in [
            (&notes, "it does not begin with SQLite's header"),
            (&short, "it is shorter than SQLite's header"),
            (&dir.path().to_owned(), "it is not a regular file"),
        ] {
            let Err(e) = Inbox::open(path, Durability::Full) else {
                panic!("{} opened", path.display());
            };
            assert!(
                matches!(e, InboxError::NotADatabase { .. }) && e.to_string().contains(why),
                "{e}"
            );
            assert!(
                !beside(path, LOCK).exists(),
                "no lock beside {}",
                path.display()
            );
        }
        let meta = std::fs::metadata(&notes).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644, "its mode is left");
        assert_eq!(
            std::fs::read(&notes).unwrap(),
            b"shopping list: eggs, milk\n"
        );
        // An empty file is a new database.
        let empty = dir.path().join("empty.db");
        std::fs::write(&empty, "").unwrap();
        Inbox::open(&empty, Durability::Full).unwrap().close();
    }

    /// A database file deleted while open takes SQLite's writes on where no later start finds
    /// them: from then on nothing is answered as stored, and the next start does not begin a
    /// new database over the WAL left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_file_deleted_while_open_stores_nothing_more() {
        use crate::{
            ids::{PluginName, SourceName},
            inbox::contract::fixtures::{self, accept, event},
        };
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("data.db");
        let path = dir.path().join("hookd.db");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        accept(&inbox, event("kept")).await;
        std::fs::remove_file(&target).unwrap();
        // A new connection (a reader's) fails rather than make an empty database there.
        assert!(open_connection(&path, Durability::Normal).is_err());
        assert!(!target.exists(), "a reader made a new database file");
        // Neither a resend of the stored event (in the file still open it is a duplicate, and
        // its batch changes nothing) nor a new one, nor any read, says anything of it now.
        for id in ["kept", "after"] {
            let refused = inbox
                .accept(
                    SourceName::new(fixtures::SOURCE),
                    event(id),
                    fixtures::request(),
                    vec![PluginName::new(fixtures::HANDLER)],
                    None,
                )
                .await;
            assert!(
                matches!(&refused, Err(InboxError::Unavailable(e)) if e.to_string().contains("deleted, moved or replaced")),
                "{id}: {refused:?}"
            );
        }
        let read = inbox
            .contains_event(fixtures::SOURCE.into(), "kept".into())
            .await;
        assert!(matches!(read, Err(InboxError::Unavailable(_))), "{read:?}");
        // Unready, without calling a file on this machine unreachable.
        let unready = inbox.ready(std::time::Duration::from_secs(2)).await;
        assert_eq!(
            unready,
            Err("the database is unavailable (the log says why)".to_owned())
        );
        inbox.close();
        // The next start, through the link or not, does not start a new one over the WAL.
        for opened in [&path, &target] {
            let Err(e) = Inbox::open(opened, Durability::Full) else {
                panic!("a new database was started over the WAL");
            };
            assert!(matches!(e, InboxError::OrphanedWal { .. }), "{e}");
        }
        assert!(!target.exists(), "no new database file");
    }

    /// A write-ahead log deleted while open takes every commit since the last checkpoint
    /// with it (SQLite appends to the open file, which no start finds): from then on nothing is
    /// answered as stored, and what was committed is copied into the database file from the
    /// log still open, so the next start has every event answered as stored. Before, commits
    /// went on being answered as stored, and a kill lost those the checkpoints had not copied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_deleted_while_open_stores_nothing_more_and_loses_nothing_answered() {
        use crate::{
            ids::{PluginName, SourceName},
            inbox::contract::fixtures::{self, accept, event},
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        accept(&inbox, event("first")).await;
        // A reader on the snapshot before the events below: no checkpoint can copy them into
        // the database file while it reads, so they are in the log alone.
        let reader = open_connection(&path, Durability::Normal).unwrap();
        reader
            .execute_batch("BEGIN; SELECT COUNT(*) FROM events;")
            .unwrap();
        let kept: Vec<String> = (0..20).map(|i| format!("kept-{i}")).collect();
        for id in &kept {
            accept(&inbox, event(id)).await;
        }
        // Time for the background checkpoint the last commit asked for to run (20 ms after it):
        // it copies up to the reader's snapshot, not past it, and nothing wakes it again once
        // the log is gone (no commit follows). Were it slower than this, this test would pass
        // without the copy it checks; never the other way round.
        std::thread::sleep(std::time::Duration::from_millis(500));
        std::fs::remove_file(beside(&path, WAL)).unwrap();
        let send = |id: &'static str| {
            inbox.accept(
                SourceName::new(fixtures::SOURCE),
                event(id),
                fixtures::request(),
                vec![PluginName::new(fixtures::HANDLER)],
                None,
            )
        };
        let refused = send("after").await;
        assert!(
            matches!(&refused, Err(InboxError::Unavailable(e)) if e.to_string().contains("write-ahead log")),
            "{refused:?}"
        );
        let unready = inbox.ready(std::time::Duration::from_secs(2)).await;
        assert!(unready.is_err(), "{unready:?}");
        // The reader is done: the next look copies the rest of the open log.
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        assert!(send("again").await.is_err());
        // The database file alone (no log beside it) holds every event answered as stored.
        let copy = dir.path().join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        let stored: Vec<String> = rusqlite::Connection::open(&copy)
            .unwrap()
            .prepare("SELECT event_id FROM events")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for id in &kept {
            assert!(
                stored.contains(id),
                "{id} was answered as stored, and is gone"
            );
        }
        inbox.close();
    }

    /// A file moved away and back while open: the batches in between were refused before
    /// they ran (a 503 is never a write that happened), and once it is back it is stored to
    /// again, without a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_file_moved_away_and_back_keeps_what_was_answered() {
        use crate::inbox::contract::fixtures::{accept, detail, event};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let aside = dir.path().join("aside.db");
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        accept(&inbox, event("kept")).await;
        std::fs::rename(&path, &aside).unwrap();
        let refused = inbox
            .accept(
                crate::ids::SourceName::new(crate::inbox::contract::fixtures::SOURCE),
                event("refused"),
                crate::inbox::contract::fixtures::request(),
                Vec::new(),
                None,
            )
            .await;
        assert!(
            matches!(refused, Err(InboxError::Unavailable(_))),
            "{refused:?}"
        );
        std::fs::rename(&aside, &path).unwrap();
        accept(&inbox, event("back")).await;
        inbox.close();
        let inbox = Inbox::open(&path, Durability::Full).unwrap();
        detail(&inbox, "kept").await;
        detail(&inbox, "back").await;
        let refused = inbox
            .contains_event(
                crate::inbox::contract::fixtures::SOURCE.into(),
                "refused".into(),
            )
            .await;
        assert!(
            matches!(refused, Ok(false)),
            "a refused accept was stored: {refused:?}"
        );
        inbox.close();
    }

    #[test]
    fn another_programs_sqlite_database_is_refused_and_left_as_it_is() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let made = |name: &str, sql: &str| {
            let path = dir.path().join(name);
            Connection::open(&path).unwrap().execute_batch(sql).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            (path.clone(), std::fs::read(&path).unwrap())
        };
        let cases = [
            made("app.db", "CREATE TABLE users (name TEXT)"),
            made(
                "versioned.db",
                "CREATE TABLE users (name TEXT); PRAGMA user_version = 42",
            ),
            made(
                "lookalike.db",
                "CREATE TABLE events (id INTEGER); PRAGMA user_version = 3",
            ),
            made(
                "wal?#%.db",
                "PRAGMA journal_mode = WAL; CREATE TABLE users (name TEXT)",
            ),
        ];
        for (path, bytes) in &cases {
            let Err(e) = Inbox::open(path, Durability::Full) else {
                panic!("{} opened", path.display());
            };
            assert!(
                matches!(e, InboxError::ForeignDatabase { .. })
                    && e.to_string().contains("not hookd's")
                    && e.to_string().contains("server.database"),
                "{e}"
            );
            for companion in [LOCK, WAL, SHM] {
                let file = beside(path, companion);
                assert!(!file.exists(), "{} made", file.display());
            }
            let meta = std::fs::metadata(path).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o644, "its mode is left");
            assert_eq!(
                &std::fs::read(path).unwrap(),
                bytes,
                "{} changed",
                path.display()
            );
        }
        // An SQLite file with no tables yet is a new database; hookd's own opens again.
        let (fresh, _) = made("fresh.db", "CREATE TABLE t (x); DROP TABLE t");
        Inbox::open(&fresh, Durability::Full).unwrap().close();
        Inbox::open(&fresh, Durability::Full).unwrap().close();
    }
}
