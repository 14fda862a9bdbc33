//! Checkpoints off the writer's path. A thread with a connection of its own copies the WAL
//! back into the database file shortly after commits, so the writer seldom has anything left
//! to copy and its batches do not wait behind the copy and the database file's fsync.
//!
//! Invariants:
//! - Only `PASSIVE` checkpoints: the thread never waits for, nor holds up, the writer or a
//!   reader; what it cannot copy yet it copies next time.
//! - The WAL stays bounded without it: the writer keeps SQLite's automatic checkpoint (see
//!   `SqliteStore::open`), which copies whatever is left once the WAL reaches its threshold
//!   and so lets the WAL start over. Under steady load the thread lags by the frames committed
//!   while it ran, and only that automatic checkpoint closes the gap.
//! - The thread ends once the writer is gone (its wake-up channel closes); the writer joins it.

use std::sync::LazyLock;

use std::{
    path::Path,
    sync::{
        Arc,
        mpsc::{self, Receiver, SyncSender, TryRecvError},
    },
    thread::JoinHandle,
    time::Duration,
};
use tracing::Level;

use rusqlite::Connection;

use super::{connection::open_connection, writer::Health};
use crate::{config::Durability, inbox::InboxError, telemetry::Repeated};

/// How long after a commit the thread waits, so one checkpoint covers the commits that follow
/// in a burst rather than one each (each checkpoint that copies anything syncs the file).
const GATHER: Duration = Duration::from_millis(20);

/// The writer's side: wakes the thread after a commit. Dropping it ends the thread.
pub(super) struct Checkpointer {
    wake: SyncSender<()>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread on its own connection to `path`; how each pass went is told to
    /// `health` (failing ones for long make the database unready).
    pub(super) fn spawn(
        path: &Path,
        durability: Durability,
        health: Arc<Health>,
    ) -> Result<Self, InboxError> {
        let conn = open_connection(path, durability)?;
        // Its own commits (none) never checkpoint; only its passes do.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
        let (wake, woken) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("inbox-checkpoint".into())
            .spawn(move || run(&conn, &woken, &health))
            .map_err(InboxError::WriterSpawn)?;
        Ok(Self { wake, thread })
    }

    /// Something was committed: a pass follows soon (a wake-up already pending covers it).
    pub(super) fn committed(&self) {
        let _ = self.wake.try_send(());
    }

    /// Ends the thread after its current pass.
    pub(super) fn stop(self) {
        drop(self.wake);
        let _ = self.thread.join();
    }
}

fn run(conn: &Connection, woken: &Receiver<()>, health: &Health) {
    while woken.recv().is_ok() {
        std::thread::sleep(GATHER);
        match woken.try_recv() {
            Ok(()) | Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => return,
        }
        let passed = pass(conn);
        if let Err(e) = &passed {
            // The writer's own automatic checkpoint bounds the WAL, unless it fails too.
            static FAILED: LazyLock<Repeated> =
                LazyLock::new(|| Repeated::new(Level::WARN, "inbox: background checkpoint failed"));
            if let Some(left_out) = FAILED.write() {
                tracing::warn!(error = %e, left_out, "inbox: background checkpoint failed");
            }
        }
        health.checkpointed(passed.map_err(|e| e.to_string()));
    }
}

/// One `PASSIVE` checkpoint: copies what no reader still needs, waiting for no one.
fn pass(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rusqlite::params;

    use super::super::{SqliteStore, WriterOptions};
    use crate::{config::Durability, inbox::store::Store as _};

    fn open(dir: &tempfile::TempDir) -> SqliteStore {
        let options = WriterOptions::new(Durability::Full);
        SqliteStore::open(&dir.path().join("hookd.db"), options).unwrap()
    }

    /// Commits `count` quarantine rows of `bytes` bytes each, one commit apiece.
    async fn commit_rows(inbox: &SqliteStore, count: usize, bytes: usize) {
        for _ in 0..count {
            let body = vec![7u8; bytes];
            inbox
                .write(move |conn| {
                    conn.execute(
                        "INSERT INTO quarantine (source, received_at, headers, body, reason)
                         VALUES ('s', 0, '[]', ?1, 'r')",
                        params![body],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
        }
    }

    fn size(path: std::path::PathBuf) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    /// About 3 MiB committed stays far below the writer's own checkpoint threshold (2 000
    /// pages, ~8 MiB), so only the background thread can have copied it into the database file.
    #[tokio::test]
    async fn commits_reach_the_database_file_without_the_writer_checkpointing() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir);
        let before = size(dir.path().join("hookd.db"));
        commit_rows(&inbox, 12, 256 * 1024).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while size(dir.path().join("hookd.db")) < before + 3_000_000 {
            assert!(
                Instant::now() < deadline,
                "the database file stayed at {} bytes",
                size(dir.path().join("hookd.db"))
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        inbox.close();
    }

    /// Steady commits, 24 MiB of them back to back: the WAL file never grows much past the
    /// writer's threshold, because the WAL starts over once it has been copied.
    #[tokio::test]
    async fn the_wal_stays_bounded_under_steady_commits() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = open(&dir);
        commit_rows(&inbox, 96, 256 * 1024).await;
        let wal = size(dir.path().join("hookd.db-wal"));
        assert!(wal < 14 << 20, "the WAL grew to {wal} bytes");
        inbox.close();
    }
}
