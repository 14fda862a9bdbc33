//! What a plugin may import: `log`, `config`, `state`, a WASI context that grants nothing, and
//! `wasi:http` gated by the call's grant (see [`super::http`]).
//!
//! Invariants: log bytes per call are capped (then one truncation marker); state writes are
//! buffered here and leave the call only as [`StateChanges`], for the inbox to commit with the
//! delivery's success — a failed call's writes are simply dropped.

use std::{collections::BTreeMap, sync::Arc};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::WasiHttpCtx;

use super::bindings::{
    handler_world::hookd::plugin::state,
    parser_world::hookd::plugin::{config, log, types},
};
use super::http::OutboundHooks;
use crate::{
    ids::{EventId, PluginName},
    model::StateChanges,
};

/// Committed plugin state, as the runtime sees it (implemented by the inbox).
pub trait StateStore: Send + Sync {
    /// Value (None = absent) and version (0 = never written) of `key` in `plugin`'s namespace.
    fn get(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)>;
}

/// One call's view of plugin state: committed values plus its own buffered writes.
pub struct StateTxn {
    store: Arc<dyn StateStore>,
    plugin: PluginName,
    changes: StateChanges,
    /// Values as this call sees them (committed at first touch, then its own writes).
    values: BTreeMap<String, Option<Vec<u8>>>,
}

impl StateTxn {
    pub fn new(store: Arc<dyn StateStore>, plugin: PluginName) -> Self {
        Self {
            store,
            plugin,
            changes: StateChanges::default(),
            values: BTreeMap::new(),
        }
    }

    /// Loads `key` on first touch, recording the version the commit will check.
    fn touch(&mut self, key: &str) -> wasmtime::Result<&mut Option<Vec<u8>>> {
        if !self.values.contains_key(key) {
            let (value, version) = self
                .store
                .get(&self.plugin, key)
                .map_err(|e| wasmtime::Error::msg(format!("state unavailable: {e:#}")))?;
            self.changes.versions.insert(key.to_owned(), version);
            self.values.insert(key.to_owned(), value);
        }
        Ok(self.values.get_mut(key).expect("just inserted"))
    }
}

/// The data of every `Store`: one per call.
pub struct HostState {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limits: super::limiter::Limiter,
    pub plugin: PluginName,
    pub event: Option<EventId>,
    pub config: Arc<BTreeMap<String, String>>,
    pub log_budget: usize,
    pub log_truncated: bool,
    pub state: Option<StateTxn>,
    /// `wasi:http` state; requests go through [`OutboundHooks`], which refuses all without a grant.
    pub http: WasiHttpCtx,
    pub outbound: OutboundHooks,
    /// Host bytes held for this call's `wasi:http` resources (see `super::budget`).
    pub budget: super::budget::HostBudget,
}

impl HostState {
    pub fn take_state_changes(&mut self) -> StateChanges {
        self.state.take().map(|txn| txn.changes).unwrap_or_default()
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

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        if self.log_truncated {
            return Ok(());
        }
        let message = if message.len() > self.log_budget {
            self.log_truncated = true;
            let mut cut = self.log_budget;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            format!(
                "{}… [log output truncated: per-call log cap reached]",
                &message[..cut]
            )
        } else {
            self.log_budget -= message.len();
            message
        };
        let plugin = self.plugin.as_str();
        let event = self.event.as_ref().map(|e| e.as_str()).unwrap_or("");
        match level {
            log::Level::Debug => tracing::debug!(target: "plugin", plugin, event, "{message}"),
            log::Level::Info => tracing::info!(target: "plugin", plugin, event, "{message}"),
            log::Level::Warn => tracing::warn!(target: "plugin", plugin, event, "{message}"),
            log::Level::Error => tracing::error!(target: "plugin", plugin, event, "{message}"),
        }
        Ok(())
    }
}

impl config::Host for HostState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.config.get(&key).cloned())
    }
}

/// Keys and values are bounded so a plugin cannot bloat the database through one call.
const MAX_KEY_BYTES: usize = 1024;
const MAX_VALUE_BYTES: usize = 1024 * 1024;

impl HostState {
    fn txn(&mut self, key: &str) -> wasmtime::Result<&mut StateTxn> {
        if key.len() > MAX_KEY_BYTES {
            return Err(wasmtime::Error::msg(format!(
                "state key of {} bytes exceeds the {MAX_KEY_BYTES}-byte cap",
                key.len()
            )));
        }
        self.state
            .as_mut()
            .ok_or_else(|| wasmtime::Error::msg("state is only available to handlers"))
    }
}

impl state::Host for HostState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.txn(&key)?.touch(&key)?.clone())
    }

    fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<()> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(wasmtime::Error::msg(format!(
                "state value of {} bytes exceeds the {MAX_VALUE_BYTES}-byte cap",
                value.len()
            )));
        }
        let txn = self.txn(&key)?;
        *txn.touch(&key)? = Some(value.clone());
        txn.changes.writes.insert(key, Some(value));
        Ok(())
    }

    fn delete(&mut self, key: String) -> wasmtime::Result<()> {
        let txn = self.txn(&key)?;
        *txn.touch(&key)? = None;
        txn.changes.writes.insert(key, None);
        Ok(())
    }
}
