//! Plugin state: committed key/value pairs per plugin instance, their versions and usage, as
//! the runtime's `state` host calls read them, and as an operator lists, reads and edits them
//! (the admin API and the dashboard).
//!
//! Invariants:
//! - Versions come from the plugin's clock, which only grows, so a key re-created after a
//!   delete never repeats a version a reader saw.
//! - An operator's edit is a state commit like an attempt's: it takes a new version from the
//!   same clock, so an attempt that read the key before the edit fails its commit's version
//!   check and runs again ([`Finished::Conflict`](super::Finished::Conflict)), exactly as when
//!   another delivery changed the key; and it commits only if the key is still at the version
//!   the operator saw (0 = absent).
//! - A plugin's usage (keys, key + value bytes) is kept in the transition that applies the
//!   writes (`Inbox::finish`); the commit refuses writes that take the plugin over its total.
//! - These reads block the calling thread: the runtime's host calls are synchronous.

use std::collections::BTreeMap;

use super::{Inbox, InboxError};
use crate::{
    ids::PluginName,
    model::{StateChanges, StateLimits, StateUsage},
    runtime::StateStore,
    text,
};

/// Which of a plugin's state keys to list: those starting with `prefix`, after `after` (the
/// last key of the previous page), at most `limit`, in byte order of the keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateKeyFilter {
    pub prefix: String,
    pub after: Option<String>,
    pub limit: usize,
}

impl StateKeyFilter {
    /// Where the page starts: `(key, inclusive)`, the later of the prefix and the cursor.
    pub(super) fn start(&self) -> (&str, bool) {
        match &self.after {
            Some(after) if after.as_str() >= self.prefix.as_str() => (after, false),
            _ => (&self.prefix, true),
        }
    }

    /// The first key past every key starting with the prefix (`None`: no key is), so the page is
    /// one range of the `(plugin, key)` index: the prefix with its last character that has a
    /// successor replaced by that successor (keys compare as bytes, which for UTF-8 is the
    /// order of the characters).
    pub(super) fn end(&self) -> Option<String> {
        let mut chars: Vec<char> = self.prefix.chars().collect();
        while let Some(last) = chars.pop() {
            let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
            if let Some(next) = next {
                chars.push(next);
                return Some(chars.into_iter().collect());
            }
        }
        None
    }
}

/// One state key as listed: its value's size, its version, and when it was last written (not
/// known for keys last written before hookd recorded it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub key: String,
    /// Bytes of the value.
    pub size: u64,
    pub version: i64,
    pub updated_at_ms: Option<i64>,
}

/// One state key's committed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateValue {
    pub value: Vec<u8>,
    pub version: i64,
    pub updated_at_ms: Option<i64>,
}

/// An operator's edit of one state key: set `value` (`None`: delete the key) if the key is
/// still at version `expected` (0: absent, so a create), held to the plugin's totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEdit {
    pub plugin: PluginName,
    pub key: String,
    pub expected: i64,
    pub value: Option<Vec<u8>>,
    pub limits: StateLimits,
}

impl StateEdit {
    /// The edit as a state commit: it "read" the key at `expected` and writes it.
    pub(super) fn changes(&self) -> StateChanges {
        StateChanges {
            versions: BTreeMap::from([(self.key.clone(), self.expected)]),
            writes: BTreeMap::from([(self.key.clone(), self.value.clone())]),
            limits: self.limits,
        }
    }
}

/// What became of a [`StateEdit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edited {
    /// Committed: the key's version now (0: deleted).
    Written { version: i64 },
    /// Nothing written: the key is no longer at the version expected; `now` is its version
    /// (0: absent).
    Changed { now: i64 },
    /// Nothing written: the write would take the plugin over a total (the message names it).
    OverQuota(String),
}

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

impl Inbox {
    /// A page of `plugin`'s state keys (see [`StateKeyFilter`]).
    pub async fn state_keys(
        &self,
        plugin: &str,
        filter: StateKeyFilter,
    ) -> Result<Vec<StateEntry>, InboxError> {
        // No stored key holds a NUL (and PostgreSQL cannot compare one).
        if text::has_nul(&filter.prefix) {
            return Ok(Vec::new());
        }
        if filter.after.as_deref().is_some_and(text::has_nul) {
            return Err(InboxError::InvalidFilter(
                "`after` holds a NUL character (U+0000); no state key does".into(),
            ));
        }
        self.store().state_keys(plugin.to_owned(), filter).await
    }

    /// `plugin`'s committed value of `key`, if it has one.
    pub async fn state_value(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<Option<StateValue>, InboxError> {
        if text::has_nul(key) {
            return Ok(None);
        }
        self.store()
            .state_value(plugin.to_owned(), key.to_owned())
            .await
    }

    /// Applies an operator's edit (see [`StateEdit`]), stamped now by the inbox's clock.
    pub async fn edit_state(&self, edit: StateEdit) -> Result<Edited, InboxError> {
        self.store().edit_state(edit, self.now_ms()).await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(prefix: &str, after: Option<&str>) -> StateKeyFilter {
        StateKeyFilter {
            prefix: prefix.to_owned(),
            after: after.map(str::to_owned),
            limit: 10,
        }
    }

    #[test]
    fn a_prefix_ends_before_the_first_key_not_starting_with_it() {
        assert_eq!(filter("", None).end(), None);
        assert_eq!(filter("count/", None).end().as_deref(), Some("count0"));
        assert_eq!(filter("a\u{10FFFF}", None).end().as_deref(), Some("b"));
        assert_eq!(filter("\u{10FFFF}", None).end(), None);
        // The successor of the last code point before the surrogates skips them.
        assert_eq!(filter("\u{D7FF}", None).end().as_deref(), Some("\u{E000}"));
        for key in ["count/", "count/a", "count/\u{10FFFF}\u{10FFFF}"] {
            assert!(key < "count0", "{key:?}");
        }
    }

    #[test]
    fn a_page_starts_at_the_later_of_prefix_and_cursor() {
        assert_eq!(filter("b", None).start(), ("b", true));
        assert_eq!(filter("b", Some("a")).start(), ("b", true));
        assert_eq!(filter("b", Some("bc")).start(), ("bc", false));
    }
}
