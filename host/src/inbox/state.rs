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
use crate::{
    model::{StateLimits, StateUsage},
    runtime::StateStore,
};

/// A state key an attempt read that another commit changed since.
pub(super) struct Changed {
    pub key: String,
    /// The version the attempt saw.
    pub seen: i64,
    /// The committed version now.
    pub now: i64,
}

/// How one write changes its plugin's usage, as `(keys, bytes)`: `before` is the length of the
/// value it replaces (`None`: the key is absent), `after` the value it writes (`None`: a delete).
pub(super) fn write_delta(key: &str, before: Option<usize>, after: Option<&[u8]>) -> (i64, i64) {
    let size = |len: usize| (len + key.len()) as i64;
    let (before, after) = (before.map(size), after.map(|v| size(v.len())));
    (
        i64::from(after.is_some()) - i64::from(before.is_some()),
        after.unwrap_or(0) - before.unwrap_or(0),
    )
}

/// The plugin's `(keys, bytes)` after writes changing `usage` by `delta`, if that keeps it
/// within the totals of `limits` (a change that shrinks a measure always passes); else the
/// message naming the total it would pass and the setting that sets it.
pub(super) fn usage_after(
    plugin: &str,
    usage: StateUsage,
    (delta_keys, delta_bytes): (i64, i64),
    limits: &StateLimits,
) -> Result<(i64, i64), String> {
    let keys = usage.keys as i64 + delta_keys;
    let bytes = usage.bytes as i64 + delta_bytes;
    if delta_keys > 0 && keys > limits.max_keys as i64 {
        return Err(format!(
            "state writes refused at commit: plugin {plugin} would hold {keys} keys, over \
             plugins.{plugin}.state_max_keys = {}; delete keys or raise the limit",
            limits.max_keys
        ));
    }
    if delta_bytes > 0 && bytes > limits.max_bytes as i64 {
        return Err(format!(
            "state writes refused at commit: plugin {plugin} would hold {bytes} bytes, over \
             plugins.{plugin}.state_max_mib = {} ({} bytes); delete keys or raise the limit",
            limits.max_bytes / (1024 * 1024),
            limits.max_bytes
        ));
    }
    Ok((keys.max(0), bytes.max(0)))
}

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
