//! Plugin state writes queued for the writer but not committed yet, as reads see them: the
//! next attempt on a hot key runs as soon as the previous one has finished executing, instead
//! of after its commit's fsync.
//!
//! How it stays correct:
//! - Every state commit of this database (an attempt's, an operator's edit) takes its version
//!   here, in the order its job enters the writer's queue (one lock covers both), so the
//!   version a queued write will be stamped with is known before it commits. The clocks start
//!   from the database's at open; only this process writes it (the lock file).
//! - A read of a key with a queued write sees that write and its version (a queued delete:
//!   absent, version 0). The attempt's commit then checks that version like any other: the
//!   writer runs jobs in queue order, so the write it read is applied first; if that write is
//!   not applied after all (its own check failed, its lease was lost, it went over quota, the
//!   batch's commit failed), the key is not at that version, and the reader conflicts and runs
//!   again. Nothing read from a write that did not commit is ever committed.
//! - A queued write leaves this view once its commit is answered (committed or not): the
//!   database has it then, or it never will.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use rusqlite::Connection;

use super::InboxError;
use crate::model::StateChanges;

/// The queued writes and version clocks of one database.
#[derive(Default)]
pub(super) struct QueuedState {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Plugin → the last version handed out.
    clocks: HashMap<String, i64>,
    /// (plugin, key) → the newest queued write of the key.
    writes: HashMap<(String, String), Queued>,
}

/// A queued write: its value (`None`: a delete) and the version it will be stamped with.
#[derive(Clone)]
struct Queued {
    value: Option<Arc<Vec<u8>>>,
    version: i64,
}

/// The lock under which a state commit takes its version and is queued: held until its job is
/// in the writer's queue, so versions enter the queue in order.
pub(super) struct Stamping<'a>(MutexGuard<'a, Inner>);

impl QueuedState {
    /// Starts the clocks at the database's (`plugin_state_usage.clock`).
    pub(super) fn load(conn: &Connection) -> Result<Self, InboxError> {
        let mut statement = conn.prepare("SELECT plugin, clock FROM plugin_state_usage")?;
        let clocks = statement
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                clocks,
                writes: HashMap::new(),
            }),
        })
    }

    /// The queued write of `key`, if any: `(value, version)` as a read reports it (a delete is
    /// absent at version 0).
    pub(super) fn get(&self, plugin: &str, key: &str) -> Option<(Option<Vec<u8>>, i64)> {
        let inner = self.lock();
        let queued = inner.writes.get(&(plugin.to_owned(), key.to_owned()))?;
        Some(match &queued.value {
            Some(value) => (Some(value.to_vec()), queued.version),
            None => (None, 0),
        })
    }

    /// The size (key + value bytes; None = absent) and version of `key`'s queued write, if any.
    pub(super) fn stat(&self, plugin: &str, key: &str) -> Option<(Option<u64>, i64)> {
        let inner = self.lock();
        let queued = inner.writes.get(&(plugin.to_owned(), key.to_owned()))?;
        Some(match &queued.value {
            Some(value) => (Some((key.len() + value.len()) as u64), queued.version),
            None => (None, 0),
        })
    }

    /// Takes the lock under which a state commit is stamped and queued.
    pub(super) fn stamping(&self) -> Stamping<'_> {
        Stamping(self.lock())
    }

    /// Drops `plugin`'s queued writes stamped `version` (its commit was answered), unless a
    /// later write of the same key replaced them.
    pub(super) fn answered(&self, plugin: &str, keys: &[String], version: i64) {
        let mut inner = self.lock();
        for key in keys {
            let at = (plugin.to_owned(), key.clone());
            if inner.writes.get(&at).is_some_and(|q| q.version == version) {
                inner.writes.remove(&at);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("poisoned")
    }
}

/// A finish's queued writes, forgotten ([`QueuedState::answered`]) when this is dropped: once its
/// commit is answered, and also if the finish itself is dropped before (its caller cancelled),
/// so no write stays visible for ever (every reader of its keys would then conflict, re-run,
/// and conflict again). Forgotten early, reads see the committed value, and conflict if the
/// write then commits.
pub(super) struct Answered<'a> {
    pub(super) queued: &'a QueuedState,
    pub(super) plugin: String,
    pub(super) keys: Vec<String>,
    pub(super) version: i64,
}

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        self.queued.answered(&self.plugin, &self.keys, self.version);
    }
}

impl Stamping<'_> {
    /// The version `plugin`'s next state commit is stamped with.
    pub(super) fn next_version(&mut self, plugin: &str) -> i64 {
        let clock = self.0.clocks.entry(plugin.to_owned()).or_default();
        *clock += 1;
        *clock
    }

    /// Makes `changes`' writes, stamped `version`, visible to reads until
    /// [`QueuedState::answered`].
    pub(super) fn queued(&mut self, plugin: &str, changes: &StateChanges, version: i64) {
        for (key, value) in &changes.writes {
            let queued = Queued {
                value: value.clone().map(Arc::new),
                version,
            };
            self.0
                .writes
                .insert((plugin.to_owned(), key.clone()), queued);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{pin::pin, sync::Arc, task::Poll};

    use super::super::{
        SqliteStore, TempDatabase, WriterOptions,
        writer::testing::{Hold, hold},
    };
    use crate::{
        clock::Clock,
        config::Durability,
        inbox::{
            Claimed, Finished, Inbox, InboxError,
            contract::fixtures::{HANDLER, done, lease, state_writes},
        },
        model::{StateChanges, StateLimits},
    };

    /// An inbox on a fresh database, and its store (to hold the writer).
    fn open(db: &TempDatabase) -> (Inbox, SqliteStore) {
        let store = SqliteStore::open(&db.path(), WriterOptions::new(Durability::Normal)).unwrap();
        let counts = store.counts_blocking();
        let inbox = Inbox::on_store(Arc::new(store.clone()), counts, Clock::system(), None);
        (inbox.unwrap(), store)
    }

    /// Where the tests of reads and commits racing a held writer start: an inbox on a fresh
    /// database (and its store) with deliveries `a` and `b` leased, and its writer held until
    /// the first of the pair is sent to (the second answers once it let go).
    async fn leased_and_held() -> (TempDatabase, Inbox, SqliteStore, [Claimed; 2], Hold) {
        let db = TempDatabase::new();
        let (inbox, store) = open(&db);
        let leased = [lease(&inbox, "a").await, lease(&inbox, "b").await];
        let held = hold(&store);
        (db, inbox, store, leased, held)
    }

    /// Two state commits that together weigh more than a batch may carry (five 1-MiB values
    /// each), the second (`a`'s) also writing key `k`: queued one after the other, the second
    /// is deferred to the next batch.
    fn heavy_pair(inbox: &Inbox, limits: StateLimits) -> (StateChanges, StateChanges) {
        let heavy = |prefix: &str| -> Vec<(String, Option<usize>)> {
            (1..=5)
                .map(|i| (format!("{prefix}{i}"), Some(1 << 20)))
                .collect()
        };
        let (x_keys, mut a_keys) = (heavy("x"), heavy("a"));
        a_keys.push(("k".into(), Some(3)));
        let writes = |keys: &[(String, Option<usize>)]| {
            state_writes(
                inbox,
                &keys
                    .iter()
                    .map(|(k, n)| (k.as_str(), *n))
                    .collect::<Vec<_>>(),
                limits,
            )
        };
        (writes(&x_keys), writes(&a_keys))
    }

    /// Polls `future` once: a finish is queued by then.
    async fn queue<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        let mut future = future;
        std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
    }

    #[tokio::test]
    async fn a_read_sees_a_queued_write_and_a_commit_that_read_it_follows_it() {
        let (_db, inbox, store, [a, b], (release, held)) = leased_and_held().await;
        let limits = StateLimits::DEFAULT;
        let first = done(&a, state_writes(&inbox, &[("k", Some(3))], limits));
        let mut first = pin!(inbox.finish(first));
        assert!(
            queue(first.as_mut()).await.is_pending(),
            "the writer is held"
        );
        // Not committed, and yet what the next attempt reads: the queued write and the version
        // it is stamped with.
        assert_eq!(
            inbox.state_get_blocking(HANDLER, "k").unwrap(),
            (Some(vec![7; 3]), 1)
        );
        assert_eq!(
            inbox.state_stat_blocking(HANDLER, "k").unwrap(),
            (Some(4), 1)
        );
        let second = done(&b, state_writes(&inbox, &[("k", Some(5))], limits));
        assert_eq!(second.state.versions["k"], 1);
        let mut second = pin!(inbox.finish(second));
        assert!(queue(second.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert_eq!(first.await.unwrap(), Finished::Recorded);
        assert_eq!(second.await.unwrap(), Finished::Recorded);
        assert_eq!(
            inbox.state_get_blocking(HANDLER, "k").unwrap(),
            (Some(vec![7; 5]), 2)
        );
        assert!(
            store.inner.queued.lock().writes.is_empty(),
            "answered: gone"
        );
    }

    #[tokio::test]
    async fn a_commit_that_read_a_write_which_did_not_commit_conflicts() {
        let (_db, inbox, _store, [a, b], (release, held)) = leased_and_held().await;
        let limits = StateLimits::DEFAULT;
        // The first attempt read `x` at a version it no longer has: its commit will fail.
        let mut writes = state_writes(&inbox, &[("k", Some(3))], limits);
        writes.versions.insert("x".into(), 99);
        let mut first = pin!(inbox.finish(done(&a, writes)));
        assert!(queue(first.as_mut()).await.is_pending());
        let second = done(&b, state_writes(&inbox, &[("k", Some(5))], limits));
        assert_eq!(second.state.versions["k"], 1, "read the queued write");
        let mut second = pin!(inbox.finish(second));
        assert!(queue(second.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert_eq!(first.await.unwrap(), Finished::Conflict);
        assert_eq!(
            second.await.unwrap(),
            Finished::Conflict,
            "what it read never committed"
        );
        assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap(), (None, 0));
    }

    /// A state commit whose writer went away is answered so, and its queued writes go with it:
    /// one left queued would be what every later read of its keys sees, and conflicts on, for
    /// good. Both ways it can go: the writer dies with the commit queued (a panic in an
    /// earlier job of its batch), or is gone before it is queued (the store closed).
    #[tokio::test]
    async fn a_state_commit_whose_writer_is_gone_leaves_no_queued_write() {
        let (_db, inbox, store, [a, b], (release, held)) = leased_and_held().await;
        let limits = StateLimits::DEFAULT;
        let dies = store.enqueue(0, |_| -> Result<(), _> { panic!("the writer dies here") });
        let first = done(&a, state_writes(&inbox, &[("k", Some(3))], limits));
        let mut first = pin!(inbox.finish(first));
        assert!(queue(first.as_mut()).await.is_pending());
        assert_eq!(
            inbox.state_get_blocking(HANDLER, "k").unwrap().1,
            1,
            "queued"
        );
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert!(dies.unwrap().await.is_err(), "the writer died");
        assert!(matches!(first.await, Err(InboxError::WriterGone)));
        assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap(), (None, 0));
        let second = done(&b, state_writes(&inbox, &[("k", Some(5))], limits));
        assert!(matches!(
            inbox.finish(second).await,
            Err(InboxError::WriterGone)
        ));
        assert!(store.inner.queued.lock().writes.is_empty());
        assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap(), (None, 0));
    }

    /// A state commit whose caller stops waiting (its future dropped: a task aborted) leaves
    /// no queued write behind: reads see the committed value, and one that read it conflicts
    /// if the write commits after all. Before, the write stayed visible for good and every
    /// reader of its key conflicted.
    #[tokio::test]
    async fn a_state_commit_dropped_while_queued_leaves_no_queued_write() {
        let (_db, inbox, store, [a, b], (release, held)) = leased_and_held().await;
        let limits = StateLimits::DEFAULT;
        let first = done(&a, state_writes(&inbox, &[("k", Some(3))], limits));
        {
            let mut first = pin!(inbox.finish(first));
            assert!(queue(first.as_mut()).await.is_pending());
            assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap().1, 1);
        }
        assert!(store.inner.queued.lock().writes.is_empty(), "forgotten");
        assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap(), (None, 0));
        let second = done(&b, state_writes(&inbox, &[("k", Some(5))], limits));
        let mut second = pin!(inbox.finish(second));
        assert!(queue(second.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert_eq!(
            second.await.unwrap(),
            Finished::Conflict,
            "the dropped commit went ahead, after what the second read"
        );
        assert_eq!(
            inbox.state_get_blocking(HANDLER, "k").unwrap(),
            (Some(vec![7; 3]), 1)
        );
    }

    #[tokio::test]
    async fn versions_go_on_from_the_database_after_a_reopen() {
        let db = TempDatabase::new();
        {
            let (inbox, _store) = open(&db);
            let a = lease(&inbox, "a").await;
            let writes = state_writes(&inbox, &[("k", Some(1))], StateLimits::DEFAULT);
            assert_eq!(
                inbox.finish(done(&a, writes)).await.unwrap(),
                Finished::Recorded
            );
            inbox.close();
        }
        let (inbox, _store) = open(&db);
        let b = lease(&inbox, "b").await;
        let writes = state_writes(&inbox, &[("k", Some(2))], StateLimits::DEFAULT);
        assert_eq!(writes.versions["k"], 1);
        assert_eq!(
            inbox.finish(done(&b, writes)).await.unwrap(),
            Finished::Recorded
        );
        assert_eq!(inbox.state_get_blocking(HANDLER, "k").unwrap().1, 2);
    }

    /// A heavy state commit the writer defers keeps its place before the lighter one queued
    /// after it, so it commits at the version it was stamped. When the lighter one overtook
    /// it, the heavy one took a later version, the very one the queue handed to the next
    /// commit (`D`): a read (`R`) of D's queued write then passed its version check after D
    /// failed, committing what it computed from a write that never committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deferred_commit_keeps_its_place_and_its_version() {
        let db = TempDatabase::new();
        let (inbox, store) = open(&db);
        let limits = StateLimits::DEFAULT;
        let [x, a, c, d, r] = [
            lease(&inbox, "x").await,
            lease(&inbox, "a").await,
            lease(&inbox, "c").await,
            lease(&inbox, "d").await,
            lease(&inbox, "r").await,
        ];
        let (release, held) = hold(&store);
        let (xw, aw) = heavy_pair(&inbox, limits);
        let cw = state_writes(&inbox, &[("c", Some(1))], limits);
        let mut fx = pin!(inbox.finish(done(&x, xw)));
        assert!(queue(fx.as_mut()).await.is_pending());
        let mut fa = pin!(inbox.finish(done(&a, aw)));
        assert!(queue(fa.as_mut()).await.is_pending());
        let mut fc = pin!(inbox.finish(done(&c, cw)));
        assert!(queue(fc.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for finished in [fx.await, fa.await, fc.await] {
            assert_eq!(finished.unwrap(), Finished::Recorded);
        }
        // A was stamped 2 and C 3: each committed at its own version.
        assert_eq!(inbox.state_stat_blocking(HANDLER, "k").unwrap().1, 2);
        assert_eq!(inbox.state_stat_blocking(HANDLER, "c").unwrap().1, 3);

        // D writes k, but its own commit fails (it read `z` at a version `z` never had).
        let (release, held) = hold(&store);
        let mut dw = state_writes(&inbox, &[("k", Some(9))], limits);
        dw.versions.insert("z".into(), 99);
        let mut fd = pin!(inbox.finish(done(&d, dw)));
        assert!(queue(fd.as_mut()).await.is_pending());
        // R reads k: D's queued write, at the version D was stamped with.
        let seen = inbox.state_stat_blocking(HANDLER, "k").unwrap();
        let rw = StateChanges {
            versions: [("k".to_owned(), seen.1)].into(),
            writes: [("r".to_owned(), Some(vec![1]))].into(),
            limits,
        };
        let mut fr = pin!(inbox.finish(done(&r, rw)));
        assert!(queue(fr.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert_eq!(fd.await.unwrap(), Finished::Conflict);
        assert_eq!(
            fr.await.unwrap(),
            Finished::Conflict,
            "R read a write that never committed"
        );
    }

    /// A finish that only read (no writes, so it carries no state bytes) keeps its place behind
    /// a deferred state commit whose queued write it read, so its check meets that write
    /// committed. Weighing nothing, it went into the batch before the deferred one's and was
    /// checked against the version before it: a conflict, and its handler run again, for
    /// nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_finish_keeps_its_place_behind_the_deferred_write_it_read() {
        let db = TempDatabase::new();
        let (inbox, store) = open(&db);
        let limits = StateLimits::DEFAULT;
        let [x, a, b] = [
            lease(&inbox, "x").await,
            lease(&inbox, "a").await,
            lease(&inbox, "b").await,
        ];
        let (release, held) = hold(&store);
        let (xw, aw) = heavy_pair(&inbox, limits);
        let mut fx = pin!(inbox.finish(done(&x, xw)));
        assert!(queue(fx.as_mut()).await.is_pending());
        let mut fa = pin!(inbox.finish(done(&a, aw)));
        assert!(queue(fa.as_mut()).await.is_pending());
        // B reads k (A's queued write) and writes nothing.
        let seen = inbox.state_stat_blocking(HANDLER, "k").unwrap();
        assert_eq!(seen.1, 2, "A's queued write");
        let bw = StateChanges {
            versions: [("k".to_owned(), seen.1)].into(),
            writes: Default::default(),
            limits,
        };
        let mut fb = pin!(inbox.finish(done(&b, bw)));
        assert!(queue(fb.as_mut()).await.is_pending());
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for finished in [fx.await, fa.await] {
            assert_eq!(finished.unwrap(), Finished::Recorded);
        }
        assert_eq!(
            fb.await.unwrap(),
            Finished::Recorded,
            "B read what A committed"
        );
    }
}
