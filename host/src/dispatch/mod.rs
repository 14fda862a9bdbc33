//! Dispatch: leases due deliveries, runs each attempt in a fresh handler instance, and records
//! the outcome with the delivery's next state in one transaction. `producer` runs the loop that
//! leases within the workers' capacity; `attempt` runs one attempt into the record the inbox
//! finishes; [`policy`] classifies its result and decides the retry; [`fair`] shares workers;
//! `hot` makes the attempts of a plugin that conflicts on a hot state key take turns.
//!
//! Invariants:
//! - The attempt is counted when it is leased (in `inbox::claim`), so a plugin that takes the
//!   process down still reaches its dead letter.
//! - A delivery is never running twice: the lease is the delivery's `attempts` value, and a
//!   result whose lease was taken back is discarded (with its state writes).
//! - A handler whose plugin is not loaded is not claimed: its deliveries wait.
//! - Per-plugin and total concurrency are bounded here; wasm runs on the dedicated pool given
//!   to [`Dispatcher::run`], never on the HTTP edge's threads.
//! - Workers are shared fairly among handler plugins ([`fair`]): one plugin's backlog never
//!   takes the workers another plugin's due delivery needs for longer than one attempt.
//! - Every time dispatch stamps or compares comes from its [`Clock`], never from the system
//!   directly, so tests drive leases and backoffs with tokio's paused clock.

mod attempt;
pub mod fair;
mod hot;
pub mod policy;
mod producer;
#[cfg(test)]
mod tests;

use std::{collections::HashSet, sync::Arc, time::Duration};

use self::{
    hot::Hot,
    policy::{Attempted, RetryPolicy},
    producer::InFlight,
};
use crate::{
    clock::Clock,
    config::{Config, PluginConfig},
    ids::PluginName,
    inbox::Inbox,
    model::{Disposition, StateLimits, StateUsage},
    registry::Registry,
    runtime::{Runtime, StateStore},
    telemetry::Telemetry,
};

/// Extra lease time beyond a plugin's timeout, so a slow-but-alive attempt is not reclaimed.
const LEASE_MARGIN: Duration = Duration::from_secs(10);

/// The inbox as one plugin instance's state store, held to that instance's configured limits.
struct PluginState {
    inbox: Inbox,
    limits: StateLimits,
}

impl StateStore for PluginState {
    fn get(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)> {
        self.inbox.get(plugin, key)
    }

    fn stat(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<u64>, i64)> {
        self.inbox.stat(plugin, key)
    }

    fn usage(&self, plugin: &str) -> anyhow::Result<StateUsage> {
        self.inbox.usage(plugin)
    }

    fn limits(&self) -> StateLimits {
        self.limits
    }
}

/// The worker pool.
pub struct Dispatcher {
    config: Arc<Config>,
    inbox: Inbox,
    registry: Arc<Registry>,
    runtime: Arc<Runtime>,
    clock: Clock,
    in_flight: InFlight,
    /// The plugins some source names as a handler (parsers and retired handlers are not).
    handlers: HashSet<String>,
    /// Where attempts, retries, dead letters and outbound requests are counted.
    telemetry: Arc<Telemetry>,
    /// The turns of plugins whose attempts conflicted recently.
    hot: Hot,
}

impl Dispatcher {
    pub fn new(
        config: Arc<Config>,
        inbox: Inbox,
        registry: Arc<Registry>,
        runtime: Arc<Runtime>,
        clock: Clock,
        telemetry: Arc<Telemetry>,
    ) -> Arc<Self> {
        let handlers = config
            .sources
            .values()
            .flat_map(|source| &source.handlers)
            .map(|handler| handler.to_string())
            .collect();
        Arc::new(Self {
            hot: Hot::new(inbox.reads_queued_state()),
            config,
            inbox,
            registry,
            runtime,
            clock,
            in_flight: InFlight::default(),
            handlers,
            telemetry,
        })
    }

    /// Where an attempt that ended as `attempted` sends its delivery (`budget_used` counts it).
    fn dispose(
        &self,
        plugin: &PluginConfig,
        attempted: Attempted,
        budget_used: u32,
        now_ms: i64,
    ) -> Disposition {
        policy::decide(
            &RetryPolicy::from(plugin),
            attempted,
            budget_used,
            now_ms,
            rand::random(),
        )
    }

    /// Where a delivery whose worker vanished goes: as any attempt that ended without the
    /// handler's verdict (so never run again under at-most-once), except for a handler the
    /// configuration no longer declares. How that one was declared when its attempt started is
    /// not known; dead is the outcome safe under either delivery mode (an at-most-once handler
    /// is never run twice), and a replay, once the handler is declared again, runs it if it
    /// should.
    fn abandoned_disposition(&self, handler: &str, budget_used: u32, now_ms: i64) -> Disposition {
        let Some(plugin) = self.config.plugins.get(&PluginName::from(handler)) else {
            return Disposition::Dead;
        };
        self.dispose(plugin, Attempted::Failed, budget_used, now_ms)
    }

    /// Takes back every lease a previous process left (at start-up, before any worker runs).
    /// On a database other nodes share, their leases are live: only the expired ones are taken
    /// back (as the reclaim pass does every second).
    pub async fn reclaim_all_at_startup(self: &Arc<Self>) -> anyhow::Result<usize> {
        self.reclaim(self.inbox.single_node()).await
    }

    /// Attempts running in this process now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.total()
    }

    /// Takes back the leases that expired by now.
    pub async fn reclaim_expired(self: &Arc<Self>) -> anyhow::Result<usize> {
        self.reclaim(false).await
    }

    async fn reclaim(self: &Arc<Self>, all: bool) -> anyhow::Result<usize> {
        let now = self.clock.now_ms();
        let this = self.clone();
        let decide = move |handler: &str, used| this.abandoned_disposition(handler, used, now);
        // The inbox logs what it took back, per handler.
        Ok(if all {
            self.inbox.reclaim_all_at_startup(decide).await?
        } else {
            self.inbox.reclaim_expired(now, decide).await?
        })
    }
}
