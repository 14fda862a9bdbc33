//! Plugin state: committed key/value pairs per plugin instance, their versions and usage, as
//! the runtime's `state` host calls read them.
//!
//! Invariants:
//! - Versions come from the plugin's clock, which only grows, so a key re-created after a
//!   delete never repeats a version a reader saw.
//! - A plugin's usage (keys, key + value bytes) is kept in the transition that applies the
//!   writes (`Inbox::finish`); the commit refuses writes that take the plugin over its total.
//! - These reads block the calling thread: the runtime's host calls are synchronous.

use super::{Inbox, InboxError};
use crate::{model::StateUsage, runtime::StateStore};

impl Inbox {
    /// Committed value and version of a state key (version 0 = never written). Blocking: for
    /// the runtime's synchronous `state.get` host call.
    pub fn state_get_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), InboxError> {
        self.store().state_get_blocking(plugin, key)
    }

    /// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
    pub fn state_stat_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<u64>, i64), InboxError> {
        self.store().state_stat_blocking(plugin, key)
    }

    /// What `plugin` holds in committed state (live keys, key + value bytes).
    pub fn state_usage_blocking(&self, plugin: &str) -> Result<StateUsage, InboxError> {
        self.store().state_usage_blocking(plugin)
    }
}

/// The runtime's `state` host calls read committed state straight from the inbox.
impl StateStore for Inbox {
    fn get(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)> {
        Ok(self.state_get_blocking(plugin, key)?)
    }

    fn stat(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<u64>, i64)> {
        Ok(self.state_stat_blocking(plugin, key)?)
    }

    fn usage(&self, plugin: &str) -> anyhow::Result<StateUsage> {
        Ok(self.state_usage_blocking(plugin)?)
    }
}
