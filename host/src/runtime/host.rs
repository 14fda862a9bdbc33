//! What a plugin may import: `log`, `config`, `state`, a WASI context that grants nothing, and
//! `wasi:http` gated by the call's grant (see [`super::outbound_hooks`]).
//!
//! Invariants: each import is implemented once, for the latest WIT version (older versions
//! delegate to it, see [`super::bindings`]); log bytes per call are capped (then one truncation marker) and control
//! characters are escaped before a line reaches the host log; state writes are buffered here,
//! once each, and leave the call only as [`StateChanges`], for the inbox to commit with the
//! delivery's success — a failed call's writes are simply dropped. A write over the attempt's
//! caps or the plugin's total is refused with a [`StateRefused`] trap naming the limit, before
//! it is buffered; deletes and shrinking writes are never refused by the total.

use std::{collections::BTreeMap, sync::Arc};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::WasiHttpCtx;

// The latest version's imports; older versions' impls delegate here (`super::bindings`).
use super::bindings::latest::{config, log, network, state, types};
use super::outbound_hooks::OutboundHooks;
use crate::{
    ids::PluginName,
    model::{
        MAX_STATE_KEY_BYTES as MAX_KEY_BYTES, MAX_STATE_VALUE_BYTES as MAX_VALUE_BYTES,
        StateChanges, StateLimits, StateUsage,
    },
};

/// Committed plugin state, as the runtime sees it (implemented by the inbox).
pub trait StateStore: Send + Sync {
    /// Value (None = absent) and version (0 = never written) of `key` in `plugin`'s namespace.
    fn get(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)>;
    /// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
    fn stat(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<u64>, i64)>;
    /// What `plugin` holds in committed state.
    fn usage(&self, plugin: &str) -> anyhow::Result<StateUsage>;
    /// The limits this plugin's writes are held to.
    fn limits(&self) -> StateLimits {
        StateLimits::DEFAULT
    }
}

/// Which limit refused a state write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateLimit {
    /// The attempt's own caps (`attempt_state_keys`, `attempt_state_kib`): the same event
    /// would hit them again on every attempt.
    Attempt,
    /// The plugin's total (`state_max_keys`, `state_max_mib`): may clear once keys are deleted.
    Total,
}

/// A host refusal of a state write: the trap that ends the call, and the attempt's error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StateRefused {
    pub limit: StateLimit,
    pub message: String,
}

/// Committed facts about a key, recorded at the attempt's first touch of it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    version: i64,
    /// Key + value bytes it held (None = absent).
    size: Option<u64>,
}

/// How many distinct keys an attempt may read for each it may write (`attempt_state_keys`).
pub const READS_PER_WRITTEN_KEY: usize = 4;

/// One call's view of plugin state: committed values plus its own buffered writes.
///
/// Committed values are not cached (a read goes to the store each time; a key that changed
/// between two reads fails the commit's version check, so the attempt is re-run): host memory
/// per call is the buffered writes and the versions of the keys read, which the attempt caps
/// bound (reads: [`READS_PER_WRITTEN_KEY`] × `attempt_state_keys` distinct keys).
pub struct StateTxn {
    store: Arc<dyn StateStore>,
    plugin: PluginName,
    limits: StateLimits,
    seen: BTreeMap<String, Seen>,
    /// Key → new value (`None` = delete): the only copy of each written value.
    writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Key + value bytes of `writes`.
    written_bytes: u64,
    /// Committed usage, loaded at the first write.
    usage: Option<StateUsage>,
    /// How this attempt's writes change the plugin's keys and bytes, if committed.
    delta_keys: i64,
    delta_bytes: i64,
}

fn unavailable(e: anyhow::Error) -> wasmtime::Error {
    wasmtime::Error::msg(format!("state unavailable: {e:#}"))
}

impl StateTxn {
    pub fn new(store: Arc<dyn StateStore>, plugin: PluginName) -> Self {
        Self {
            limits: store.limits(),
            store,
            plugin,
            seen: BTreeMap::new(),
            writes: BTreeMap::new(),
            written_bytes: 0,
            usage: None,
            delta_keys: 0,
            delta_bytes: 0,
        }
    }

    /// The buffered writes, the versions to check at commit, and the limits they were made under.
    pub fn into_changes(self) -> StateChanges {
        StateChanges {
            versions: self
                .seen
                .into_iter()
                .map(|(key, seen)| (key, seen.version))
                .collect(),
            writes: self.writes,
            limits: self.limits,
        }
    }

    fn get(&mut self, key: &str) -> wasmtime::Result<Option<Vec<u8>>> {
        if let Some(value) = self.writes.get(key) {
            return Ok(value.clone());
        }
        // Every distinct key read is kept (its version is checked at commit, one look-up each
        // on the writer): bounded, as the writes are.
        let most = READS_PER_WRITTEN_KEY * self.limits.attempt_keys;
        if self.seen.len() >= most && !self.seen.contains_key(key) {
            let name = &self.plugin;
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state read of key {key:?} refused: the attempt would read more than {most} \
                     distinct keys ({READS_PER_WRITTEN_KEY} × plugins.{name}.attempt_state_keys)"
                ),
            ));
        }
        let (value, version) = self.store.get(&self.plugin, key).map_err(unavailable)?;
        self.seen.entry(key.to_owned()).or_insert(Seen {
            version,
            size: value.as_ref().map(|v| (key.len() + v.len()) as u64),
        });
        Ok(value)
    }

    /// Buffers `value` (None = delete) under `key`, or refuses it with the limit it would break.
    fn write(&mut self, key: String, value: Option<Vec<u8>>) -> wasmtime::Result<()> {
        let new_size = value.as_ref().map(|v| (key.len() + v.len()) as u64);
        let buffered = self.writes.get(&key).map(|v| v.as_ref().map(Vec::len));
        // Per attempt: distinct keys written and the bytes buffered for them.
        let keys = self.writes.len() + usize::from(buffered.is_none());
        let buffered_bytes = buffered.map_or(0, |len| (key.len() + len.unwrap_or(0)) as u64);
        let bytes = self.written_bytes - buffered_bytes
            + key.len() as u64
            + value.as_ref().map_or(0, |v| v.len() as u64);
        let name = self.plugin.clone();
        if keys > self.limits.attempt_keys {
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state write of key {key:?} refused: the attempt would write {keys} keys, over \
                     plugins.{name}.attempt_state_keys = {}",
                    self.limits.attempt_keys
                ),
            ));
        }
        if bytes > self.limits.attempt_bytes {
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state write of key {key:?} refused: the attempt would write {bytes} bytes, \
                     over plugins.{name}.attempt_state_kib = {} ({} bytes)",
                    self.limits.attempt_bytes / 1024,
                    self.limits.attempt_bytes
                ),
            ));
        }
        // The plugin's total, as it would be if this attempt committed.
        let before = match buffered {
            Some(len) => len.map(|len| (key.len() + len) as u64),
            None => self.committed_size(&key)?,
        };
        let delta_keys =
            self.delta_keys + i64::from(new_size.is_some()) - i64::from(before.is_some());
        let delta_bytes =
            self.delta_bytes + new_size.unwrap_or(0) as i64 - before.unwrap_or(0) as i64;
        let usage = match self.usage {
            Some(usage) => usage,
            None => {
                let usage = self.store.usage(&self.plugin).map_err(unavailable)?;
                *self.usage.insert(usage)
            }
        };
        let grows_keys = new_size.is_some() && before.is_none();
        let grows_bytes = new_size.unwrap_or(0) > before.unwrap_or(0);
        let total_keys = usage.keys as i64 + delta_keys;
        let total_bytes = usage.bytes as i64 + delta_bytes;
        if grows_keys && total_keys > self.limits.max_keys as i64 {
            return Err(refusal(
                StateLimit::Total,
                format!(
                    "state write of key {key:?} refused: plugin {name} would hold {total_keys} \
                     keys, over plugins.{name}.state_max_keys = {}; delete keys or raise the limit",
                    self.limits.max_keys
                ),
            ));
        }
        if grows_bytes && total_bytes > self.limits.max_bytes as i64 {
            return Err(refusal(
                StateLimit::Total,
                format!(
                    "state write of key {key:?} refused: plugin {name} would hold {total_bytes} \
                     bytes, over plugins.{name}.state_max_mib = {} ({} bytes); delete keys or \
                     raise the limit",
                    self.limits.max_bytes / (1024 * 1024),
                    self.limits.max_bytes
                ),
            ));
        }
        self.delta_keys = delta_keys;
        self.delta_bytes = delta_bytes;
        self.written_bytes = bytes;
        self.writes.insert(key, value);
        Ok(())
    }

    /// The committed size of `key`, recording its version on first touch.
    fn committed_size(&mut self, key: &str) -> wasmtime::Result<Option<u64>> {
        if let Some(seen) = self.seen.get(key) {
            return Ok(seen.size);
        }
        let (size, version) = self.store.stat(&self.plugin, key).map_err(unavailable)?;
        self.seen.insert(key.to_owned(), Seen { version, size });
        Ok(size)
    }
}

/// The data of every `Store`: one per call.
pub struct HostState {
    pub wasi: WasiCtx,
    /// The call's stderr, shared with `wasi` (see `super::stderr`).
    pub stderr: super::stderr::GuestStderr,
    pub table: ResourceTable,
    pub limits: super::limiter::Limiter,
    pub config: Arc<BTreeMap<String, String>>,
    pub log_budget: usize,
    /// What each log line costs the budget beyond its message (see [`LOG_LINE_BYTES`]).
    pub log_line_bytes: usize,
    pub log_truncated: bool,
    pub state: Option<StateTxn>,
    /// `wasi:http` state; requests go through [`OutboundHooks`], which refuses all without a grant.
    pub http: WasiHttpCtx,
    pub outbound: OutboundHooks,
    /// Host bytes held for this call's `wasi:http` resources (see `super::budget`).
    pub budget: super::budget::HostBudget,
    /// Keeps the epoch advancing while this store lives (see `super::engine`).
    pub(super) _live: super::engine::LiveStore,
    /// The instance is made and its export about to be called. (Making it may already run a
    /// component's start functions: what a call did to the world is what `outbound` let out.)
    pub started: bool,
}

impl HostState {
    pub fn take_state_changes(&mut self) -> StateChanges {
        self.state
            .take()
            .map(StateTxn::into_changes)
            .unwrap_or_default()
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for HostState {}

/// What a guest's log line costs its call's log budget beyond its message: about what the host
/// writes around it (time, level, the call's spans and their fields), to which the event id's
/// length is added per call, since a sender chooses it and every line repeats it.
pub const LOG_LINE_BYTES: usize = 128;

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        if self.log_truncated {
            return Ok(());
        }
        // The budget counts the escaped bytes and each line's own cost: what the host log
        // really receives, so a million empty lines cannot write more than a few long ones.
        let room = self.log_budget.checked_sub(self.log_line_bytes);
        let (mut message, whole) = crate::text::escape_within(&message, room.unwrap_or(0));
        let whole = whole && room.is_some();
        self.log_budget = room.unwrap_or(0) - message.len();
        if !whole {
            self.log_truncated = true;
            message.push_str("… [log output truncated: per-call log cap reached]");
        }
        // The plugin and the event are fields of the spans this call runs in.
        match level {
            log::Level::Debug => tracing::debug!(target: "plugin", "{message}"),
            log::Level::Info => tracing::info!(target: "plugin", "{message}"),
            log::Level::Warn => tracing::warn!(target: "plugin", "{message}"),
            log::Level::Error => tracing::error!(target: "plugin", "{message}"),
        }
        Ok(())
    }
}

impl config::Host for HostState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.config.get(&key).cloned())
    }
}

impl network::Host for HostState {
    fn last_refusal(&mut self) -> wasmtime::Result<Option<String>> {
        Ok(self.outbound.last_refusal())
    }
}

/// A refused state call, which ends the attempt (the dispatcher logs it with the attempt's
/// error). A key or value no attempt may use is refused as [`StateLimit::Attempt`]: `permanent`,
/// `error_kind: state_limit`, whatever it retries.
fn refusal(limit: StateLimit, message: String) -> wasmtime::Error {
    wasmtime::Error::new(StateRefused { limit, message })
}

/// The start of `key`, escaped, for a message about it.
fn key_for_message(key: &str) -> String {
    let (head, whole) = crate::text::escape_within(key, 64);
    if whole { head } else { head + "…" }
}

impl HostState {
    fn txn(&mut self, key: &str) -> wasmtime::Result<&mut StateTxn> {
        if crate::text::has_nul(key) {
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state key \"{}\" holds a NUL character (U+0000), which hookd's databases do \
                 not store",
                    key_for_message(key)
                ),
            ));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state key \"{}\" of {} bytes exceeds the {MAX_KEY_BYTES}-byte cap on a key",
                    key_for_message(key),
                    key.len()
                ),
            ));
        }
        self.state
            .as_mut()
            .ok_or_else(|| wasmtime::Error::msg("state is only available to handlers"))
    }
}

impl state::Host for HostState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        self.txn(&key)?.get(&key)
    }

    fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<()> {
        if key.is_empty() {
            // Read and deleted as any absent key; never written, so every key stored can be
            // named in the admin API's and the dashboard's paths.
            return Err(refusal(
                StateLimit::Attempt,
                "state key \"\" is empty: a key an operator could not name in the admin API \
                 (GET /admin/plugins/{name}/state/{key}), so hookd does not store one"
                    .into(),
            ));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(refusal(
                StateLimit::Attempt,
                format!(
                    "state value of {} bytes for key \"{}\" exceeds the {MAX_VALUE_BYTES}-byte cap \
                 on a value",
                    value.len(),
                    key_for_message(&key)
                ),
            ));
        }
        self.txn(&key)?.write(key, Some(value))
    }

    fn delete(&mut self, key: String) -> wasmtime::Result<()> {
        self.txn(&key)?.write(key, None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Committed state in memory: key → (value, version), plus the limits to apply.
    struct Memory {
        keys: Mutex<BTreeMap<String, (Vec<u8>, i64)>>,
        limits: StateLimits,
    }

    impl StateStore for Memory {
        fn get(&self, _: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)> {
            Ok(self
                .keys
                .lock()
                .unwrap()
                .get(key)
                .map_or((None, 0), |(v, n)| (Some(v.clone()), *n)))
        }

        fn stat(&self, _: &str, key: &str) -> anyhow::Result<(Option<u64>, i64)> {
            Ok(self
                .keys
                .lock()
                .unwrap()
                .get(key)
                .map_or((None, 0), |(v, n)| (Some((key.len() + v.len()) as u64), *n)))
        }

        fn usage(&self, _: &str) -> anyhow::Result<StateUsage> {
            let keys = self.keys.lock().unwrap();
            Ok(StateUsage {
                keys: keys.len() as u64,
                bytes: keys
                    .iter()
                    .map(|(k, (v, _))| (k.len() + v.len()) as u64)
                    .sum(),
            })
        }

        fn limits(&self) -> StateLimits {
            self.limits
        }
    }

    fn txn(committed: &[(&str, usize)], limits: StateLimits) -> StateTxn {
        let keys = committed
            .iter()
            .map(|(k, len)| (k.to_string(), (vec![1; *len], 7)))
            .collect();
        let store = Memory {
            keys: Mutex::new(keys),
            limits,
        };
        StateTxn::new(Arc::new(store), PluginName::from("p"))
    }

    fn refusal(result: wasmtime::Result<()>) -> StateRefused {
        result
            .unwrap_err()
            .downcast_ref::<StateRefused>()
            .expect("a typed refusal")
            .clone()
    }

    const ROOMY: StateLimits = StateLimits {
        attempt_keys: 1000,
        attempt_bytes: 1 << 30,
        max_keys: 1 << 30,
        max_bytes: 1 << 40,
    };

    #[test]
    fn the_attempt_key_cap_counts_distinct_keys_and_names_its_setting() {
        let mut t = txn(
            &[],
            StateLimits {
                attempt_keys: 3,
                ..ROOMY
            },
        );
        for key in ["a", "b", "c", "a", "b"] {
            t.write(key.into(), Some(vec![0; 10])).unwrap();
        }
        t.write("c".into(), None).unwrap(); // rewriting a buffered key is no new key
        let refused = refusal(t.write("d".into(), None));
        assert_eq!(refused.limit, StateLimit::Attempt);
        assert!(
            refused.message.contains("4 keys")
                && refused.message.contains("plugins.p.attempt_state_keys = 3"),
            "{}",
            refused.message
        );
        let changes = t.into_changes();
        assert_eq!(
            changes.writes.len(),
            3,
            "the refused write was not buffered"
        );
        assert!(!changes.writes.contains_key("d"));
    }

    #[test]
    fn the_attempt_byte_cap_counts_what_is_buffered_now() {
        let mut t = txn(
            &[],
            StateLimits {
                attempt_bytes: 100,
                ..ROOMY
            },
        );
        t.write("k".into(), Some(vec![0; 90])).unwrap();
        // Replacing k's 90 bytes with 99: 1 + 99 = 100 bytes buffered, just within the cap.
        t.write("k".into(), Some(vec![0; 99])).unwrap();
        let refused = refusal(t.write("j".into(), Some(vec![])));
        assert_eq!(refused.limit, StateLimit::Attempt);
        assert!(
            refused.message.contains("101 bytes")
                && refused
                    .message
                    .contains("plugins.p.attempt_state_kib = 0 (100 bytes)"),
            "{}",
            refused.message
        );
        // Shrinking k makes room again.
        t.write("k".into(), Some(vec![0; 10])).unwrap();
        t.write("j".into(), Some(vec![0; 50])).unwrap();
    }

    #[test]
    fn the_plugin_total_refuses_growth_but_never_deletes_or_shrinking_writes() {
        // Committed: two keys of 1 + 50 bytes = 102 bytes; the total allows 2 keys, 110 bytes.
        let limits = StateLimits {
            max_keys: 2,
            max_bytes: 110,
            ..ROOMY
        };
        let mut t = txn(&[("a", 50), ("b", 50)], limits);
        let refused = refusal(t.write("c".into(), Some(vec![])));
        assert_eq!(refused.limit, StateLimit::Total);
        assert!(
            refused.message.contains("would hold 3 keys")
                && refused.message.contains("plugins.p.state_max_keys = 2"),
            "{}",
            refused.message
        );
        let refused = refusal(t.write("a".into(), Some(vec![0; 60])));
        assert_eq!(refused.limit, StateLimit::Total);
        assert!(
            refused.message.contains("plugins.p.state_max_mib"),
            "{}",
            refused.message
        );
        // Growing a by 8 bytes fits (110); deleting b frees a key for c.
        t.write("a".into(), Some(vec![0; 58])).unwrap();
        t.write("b".into(), None).unwrap();
        t.write("c".into(), Some(vec![0; 40])).unwrap();

        // Over the total already (a lowered limit): deletes and shrinking writes still work.
        let limits = StateLimits {
            max_keys: 1,
            max_bytes: 10,
            ..ROOMY
        };
        let mut t = txn(&[("a", 50), ("b", 50)], limits);
        t.write("a".into(), Some(vec![0; 20])).unwrap();
        t.write("b".into(), None).unwrap();
        t.write("zz".into(), None).unwrap(); // deleting an absent key is harmless too
        assert_eq!(
            refusal(t.write("a".into(), Some(vec![0; 21]))).limit,
            StateLimit::Total
        );
    }

    #[test]
    fn reads_see_own_writes_and_every_touched_key_is_version_checked() {
        let mut t = txn(&[("a", 3)], ROOMY);
        assert_eq!(t.get("a").unwrap(), Some(vec![1; 3]));
        t.write("a".into(), Some(b"new".to_vec())).unwrap();
        assert_eq!(t.get("a").unwrap(), Some(b"new".to_vec()));
        t.write("b".into(), None).unwrap();
        assert_eq!(t.get("b").unwrap(), None);
        assert_eq!(t.get("c").unwrap(), None);
        let changes = t.into_changes();
        assert_eq!(
            changes.versions,
            BTreeMap::from([("a".into(), 7), ("b".into(), 0), ("c".into(), 0)])
        );
        assert_eq!(changes.writes["a"], Some(b"new".to_vec()));
        assert_eq!(changes.writes["b"], None);
        assert_eq!(changes.limits, ROOMY);
    }
}
