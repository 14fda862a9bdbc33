//! Hot keys: a handler plugin whose attempts conflicted recently runs them one at a time.
//!
//! Optimistic state lets attempts run side by side and re-runs the loser of a conflict. When
//! many attempts write one key (a global counter, one big customer, a rate-limit bucket) nearly
//! every attempt loses, and the re-runs drown the work. So a conflict makes its plugin *hot*
//! for [`HOT_FOR`]: each of its attempts then takes the plugin's turn before it runs and hands
//! it on as soon as its result is queued for commit — not after the commit, since the next
//! attempt's reads see the queued writes (`Capabilities::reads_queued_state`). Attempts on one
//! key then follow each other at the speed they execute, sharing group commits, and conflict
//! no more.
//!
//! Invariants:
//! - Turns only order attempts; correctness stays with the commit's version check, so an
//!   attempt that runs without the turn (the plugin was cold when it started, or it waited
//!   longer than [`Hot::wait_for`] allows) is still checked, and re-run if it lost.
//! - Only on a store that reads queued state: elsewhere a turn would last a whole commit.
//! - A turn is held by the attempt's task and dropped however it ends.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    sync::{Mutex as TurnLock, OwnedMutexGuard},
    time::Instant,
};

use super::LEASE_MARGIN;
use crate::ids::PluginName;

/// How long a plugin stays hot after its last conflict.
pub(super) const HOT_FOR: Duration = Duration::from_secs(2);

/// The hot plugins and their turns.
pub(super) struct Hot {
    enabled: bool,
    plugins: Mutex<HashMap<PluginName, Arc<Plugin>>>,
}

#[derive(Default)]
struct Plugin {
    /// Hot until then (`None`: never conflicted).
    until: Mutex<Option<Instant>>,
    turn: Arc<TurnLock<()>>,
}

/// A plugin's turn, held while one attempt runs.
pub(super) struct Turn {
    _held: OwnedMutexGuard<()>,
}

impl Hot {
    /// Turns are taken only when `enabled` (the store reads queued state).
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            plugins: Mutex::default(),
        }
    }

    /// An attempt of `plugin` conflicted: the plugin is hot for [`HOT_FOR`] from now.
    pub(super) fn conflicted(&self, plugin: &PluginName) {
        if self.enabled {
            *self.plugin(plugin).until.lock().expect("poisoned") = Some(Instant::now() + HOT_FOR);
        }
    }

    /// Whether `plugin` is hot now.
    pub(super) fn is_hot(&self, plugin: &PluginName) -> bool {
        self.enabled
            && self
                .plugins
                .lock()
                .expect("poisoned")
                .get(plugin)
                .and_then(|p| *p.until.lock().expect("poisoned"))
                .is_some_and(|until| Instant::now() < until)
    }

    /// Waits for `plugin`'s turn if it is hot, at most `wait_for` (beyond that the attempt runs
    /// without it, so a long queue cannot outlast the attempts' leases); `None`: not hot, or
    /// waited out.
    pub(super) async fn turn(&self, plugin: &PluginName, wait_for: Duration) -> Option<Turn> {
        if !self.is_hot(plugin) {
            return None;
        }
        let turn = self.plugin(plugin).turn.clone();
        tokio::time::timeout(wait_for, turn.lock_owned())
            .await
            .ok()
            .map(|held| Turn { _held: held })
    }

    /// The longest an attempt waits for its turn: half its time limit, and at most half the
    /// lease's margin beyond that limit, so the wait and the attempt together stay within the
    /// lease (`timeout + LEASE_MARGIN`).
    pub(super) fn wait_for(timeout: Duration) -> Duration {
        (timeout / 2).min(LEASE_MARGIN / 2)
    }

    fn plugin(&self, plugin: &PluginName) -> Arc<Plugin> {
        self.plugins
            .lock()
            .expect("poisoned")
            .entry(plugin.clone())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_conflict_makes_a_plugin_take_turns_for_a_while() {
        let hot = Hot::new(true);
        let p = PluginName::new("counter");
        let wait = Duration::from_secs(1);
        assert!(hot.turn(&p, wait).await.is_none(), "cold: no turn");
        hot.conflicted(&p);
        let first = hot.turn(&p, wait).await.expect("hot: a turn");
        // The next attempt waits for the first to hand its turn on, at most `wait`.
        let started = Instant::now();
        assert!(hot.turn(&p, wait).await.is_none());
        assert_eq!(started.elapsed(), wait);
        drop(first);
        assert!(hot.turn(&p, wait).await.is_some());
        assert!(!hot.is_hot(&PluginName::new("other")));
        tokio::time::advance(HOT_FOR).await;
        assert!(hot.turn(&p, wait).await.is_none(), "cooled down");
    }

    #[test]
    fn the_wait_for_a_turn_and_the_attempt_fit_in_the_lease() {
        for timeout in [1, 50, 1_000, 30_000, 600_000].map(Duration::from_millis) {
            let wait = Hot::wait_for(timeout);
            assert!(
                wait + timeout < timeout + LEASE_MARGIN,
                "{timeout:?}: {wait:?}"
            );
            assert!(wait <= timeout / 2);
        }
    }

    #[tokio::test]
    async fn a_store_that_cannot_read_queued_state_never_takes_turns() {
        let hot = Hot::new(false);
        let p = PluginName::new("counter");
        hot.conflicted(&p);
        assert!(!hot.is_hot(&p));
        assert!(hot.turn(&p, Duration::from_secs(1)).await.is_none());
    }
}
