//! The host-wide bound on DNS lookups in flight, all plugins together and per plugin. A lookup
//! is the system resolver (`getaddrinfo`) on a blocking thread, with a socket of its own, and
//! it cannot be called off: a request that stops waiting for it (its connect deadline passed)
//! leaves it running until the resolver gives up, tens of seconds for a name whose servers do
//! not answer. Unbounded, a plugin listing such a name could fill the blocking pool, which
//! every other plugin's lookups and the host's own blocking work queue behind.
//!
//! Invariants:
//! - A lookup holds a [`LookupSlot`] from before it starts until the resolver returns (the slot
//!   moves into the blocking task), not until its request stops waiting.
//! - At most [`LOOKUPS`] slots are held at once, and at most [`LOOKUPS_PER_PLUGIN`] by one
//!   plugin, so a plugin whose names never answer keeps the others' lookups going. A lookup
//!   that finds none free waits for one, within its request's connect deadline.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::ids::PluginName;

/// DNS lookups in flight at once, all plugins together: well under tokio's 512 blocking threads.
pub const LOOKUPS: usize = 64;

/// DNS lookups in flight at once for one plugin.
pub const LOOKUPS_PER_PLUGIN: usize = 8;

/// The slots of lookups in flight, host-wide and per plugin.
#[derive(Debug)]
pub struct Lookups {
    all: Arc<Semaphore>,
    per_plugin: Mutex<HashMap<PluginName, Arc<Semaphore>>>,
}

impl Default for Lookups {
    fn default() -> Self {
        Self {
            all: Arc::new(Semaphore::new(LOOKUPS)),
            per_plugin: Mutex::default(),
        }
    }
}

impl Lookups {
    /// A slot for one lookup of `plugin`'s, once its share and the host's have one free.
    pub async fn take(&self, plugin: &PluginName) -> LookupSlot {
        let mine = {
            let mut per_plugin = self
                .per_plugin
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            per_plugin
                .entry(plugin.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(LOOKUPS_PER_PLUGIN)))
                .clone()
        };
        // Its own share first: a plugin waiting on itself holds nothing of the host's.
        let mine = mine.acquire_owned().await.expect("never closed");
        let all = self
            .all
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        LookupSlot {
            _mine: mine,
            _all: all,
        }
    }

    /// Slots free host-wide.
    pub fn free(&self) -> usize {
        self.all.available_permits()
    }
}

/// One lookup's place in [`Lookups`], until it is dropped (when the resolver has returned).
#[derive(Debug)]
pub struct LookupSlot {
    _mine: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A plugin holding its share waits for its own slots; another plugin's lookups go on, and
    /// a dropped slot lets the waiting one through.
    #[tokio::test]
    async fn one_plugin_holds_at_most_its_share() {
        let lookups = Arc::new(Lookups::default());
        let slow = PluginName::from("slow");
        let mut held = Vec::new();
        for _ in 0..LOOKUPS_PER_PLUGIN {
            held.push(lookups.take(&slow).await);
        }
        let next = tokio::spawn({
            let (lookups, slow) = (lookups.clone(), slow.clone());
            async move { lookups.take(&slow).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!next.is_finished(), "a plugin took more than its share");
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            lookups.take(&PluginName::from("other")),
        )
        .await
        .expect("another plugin waited on the slow one's lookups");
        assert_eq!(lookups.free(), LOOKUPS - LOOKUPS_PER_PLUGIN - 1);
        drop(held.pop());
        let _next = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("a freed slot went to the waiting lookup")
            .unwrap();
        drop((held, other));
        assert_eq!(lookups.free(), LOOKUPS - 1);
    }

    /// The host-wide bound holds over many plugins.
    #[tokio::test]
    async fn all_plugins_together_hold_at_most_the_host_wide_bound() {
        let lookups = Arc::new(Lookups::default());
        let mut held = Vec::new();
        for n in 0..LOOKUPS {
            let plugin = PluginName::from(format!("p{}", n / LOOKUPS_PER_PLUGIN).as_str());
            held.push(lookups.take(&plugin).await);
        }
        assert_eq!(lookups.free(), 0);
        let fresh = PluginName::from("fresh");
        let waited = tokio::time::timeout(Duration::from_millis(100), lookups.take(&fresh)).await;
        assert!(waited.is_err(), "a lookup went past the host-wide bound");
        held.pop();
        tokio::time::timeout(Duration::from_secs(5), lookups.take(&fresh))
            .await
            .expect("a freed slot went to the next lookup");
    }
}
