//! The store's write transactions as figures: how many committed, and (once the host observes
//! them) each one's size and duration, for `/metrics`.
//!
//! Invariant: a commit is counted only after it returned, and counting never blocks or fails
//! the commit (the observer is a plain function called after the fact).

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

/// Told of every commit: how many operations it held, and how long it took from the start of
/// its transaction to the commit's return.
pub type CommitObserver = Box<dyn Fn(usize, Duration) + Send + Sync>;

/// The commits of one store.
#[derive(Default)]
pub struct Commits {
    count: AtomicI64,
    observer: OnceLock<CommitObserver>,
}

impl Commits {
    /// Counts a commit of `operations` operations whose transaction began at `started`.
    pub(crate) fn committed(&self, operations: usize, started: Instant) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(observe) = self.observer.get() {
            observe(operations, started.elapsed());
        }
    }

    /// Write transactions committed so far (`hookd_inbox_commits_total`).
    pub fn count(&self) -> i64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Reports every later commit to `observer`; a store has one observer, the first set.
    pub(crate) fn observe(&self, observer: CommitObserver) {
        let _ = self.observer.set(observer);
    }
}
