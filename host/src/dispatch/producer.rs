//! The producer: the loop that leases due deliveries within the workers' capacity and hands each
//! to a worker on the wasm pool.
//!
//! Invariants:
//! - A worker slot is taken in [`InFlight`] when its delivery is leased and given back when its
//!   attempt task ends, however it ends (a panic in host code included).
//! - An idle loop sleeps until the next retry falls due or new work arrives, bounded by
//!   [`IDLE_POLL`]: deliveries due but blocked never turn it into a busy loop.
//! - Once the stop is asked, no delivery is leased: each round looks at it before claiming.

use std::sync::LazyLock;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};
use tracing::Level;

use tokio::{runtime::Handle, sync::Notify};

use super::{Dispatcher, LEASE_MARGIN, fair::Fairness};
use crate::{
    config::OnStale,
    ids::PluginName,
    inbox::{ClaimRequest, Claimed, InboxError},
    telemetry::Repeated,
    text,
};

/// How often expired leases are looked for.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);
/// Longest idle wait; new work normally wakes the loop at once.
const IDLE_POLL: Duration = Duration::from_millis(500);
/// How long a stopping dispatcher waits for its running attempts.
const DRAIN_FOR: Duration = Duration::from_secs(30);

/// Attempts running now, per handler plugin; `finished` wakes the loop when one ends.
#[derive(Default)]
pub(super) struct InFlight {
    running: Mutex<HashMap<PluginName, usize>>,
    finished: Notify,
}

impl InFlight {
    fn snapshot(&self) -> HashMap<PluginName, usize> {
        self.running.lock().expect("poisoned").clone()
    }

    pub(super) fn total(&self) -> usize {
        self.running.lock().expect("poisoned").values().sum()
    }

    fn take(&self, claimed: &[Claimed]) {
        let mut running = self.running.lock().expect("poisoned");
        for claim in claimed {
            *running.entry(claim.handler.clone()).or_default() += 1;
        }
    }

    fn give_back(&self, handler: &PluginName) {
        if let Some(n) = self.running.lock().expect("poisoned").get_mut(handler) {
            *n = n.saturating_sub(1);
        }
        self.finished.notify_one();
    }
}

impl Dispatcher {
    /// Runs until `shutdown` resolves; then waits for in-flight attempts (bounded by their
    /// timeouts). Attempts run on `pool`.
    pub async fn run(self: Arc<Self>, pool: Handle, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last_reclaim = tokio::time::Instant::now();
        loop {
            // Every round looks at the stop first: under a backlog a claim finds work round
            // after round and never reaches the idle wait below, and attempts went on starting
            // after a graceful stop for as long as the backlog lasted.
            let stopped = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(shutdown.as_mut().poll(cx).is_ready())
            });
            if stopped.await {
                break;
            }
            self.telemetry.dispatch_round();
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                last_reclaim = tokio::time::Instant::now();
                if let Err(e) = self.reclaim_expired().await {
                    static FAILED: LazyLock<Repeated> = LazyLock::new(|| {
                        Repeated::new(Level::ERROR, "reclaiming expired leases failed")
                    });
                    if let Some(left_out) = FAILED.write() {
                        tracing::error!(error = %e, left_out, "reclaiming expired leases failed");
                    }
                }
            }
            let (claimed, all_busy) = match self.claim().await {
                Ok(Some(claimed)) => (claimed, false),
                Ok(None) => (Vec::new(), true),
                Err(e) => {
                    static FAILED: LazyLock<Repeated> =
                        LazyLock::new(|| Repeated::new(Level::ERROR, "claiming deliveries failed"));
                    if let Some(left_out) = FAILED.write() {
                        tracing::error!(error = %e, left_out, "claiming deliveries failed");
                    }
                    (Vec::new(), false)
                }
            };
            let idle = claimed.is_empty();
            for claim in claimed {
                let this = self.clone();
                pool.spawn(async move { this.work(claim).await });
            }
            if !idle {
                continue;
            }
            // Nothing claimable now: sleep until the next retry falls due (or IDLE_POLL, which
            // also bounds how late a newly loaded plugin's waiting deliveries are noticed);
            // a new event, a finished attempt, a replay or a claim that marked a stale head (its
            // key's next delivery may run now) wakes the loop at once. Deliveries
            // due but blocked (their key's head retries, their plugin is missing) must not make
            // this a busy loop. With every worker busy only a finished attempt frees one, so
            // when the next delivery falls due does not matter (and is not asked, under load).
            let now = self.clock.now_ms();
            let next_due = if all_busy {
                None
            } else {
                self.inbox.next_due_after(now).await.ok().flatten()
            };
            let wait = match next_due {
                Some(due) => {
                    Duration::from_millis((due - now).clamp(1, IDLE_POLL.as_millis() as i64) as u64)
                }
                None => IDLE_POLL,
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                _ = self.inbox.work_arrived() => {}
                _ = self.in_flight.finished.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        // Let running attempts finish (each is bounded by its own timeout).
        let deadline = tokio::time::Instant::now() + DRAIN_FOR;
        while self.in_flight.total() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.in_flight.total();
        if left > 0 {
            tracing::warn!(
                running = left,
                waited_secs = DRAIN_FOR.as_secs(),
                "stopping with attempts still running: their leases lapse and the next start \
                 takes them back (retried, or dead-lettered under at-most-once)"
            );
        }
    }

    /// Leases as many due deliveries as there are free workers, within each plugin's cap and
    /// fair share, and takes a worker slot for each; `None` when no worker is free for any
    /// loaded plugin (nothing was asked of the inbox).
    async fn claim(&self) -> Result<Option<Vec<Claimed>>, InboxError> {
        let workers = self.config.server.workers;
        let running = self.in_flight.snapshot();
        let free = workers.saturating_sub(running.values().sum());
        let mut fairness = Fairness::new(workers, self.handlers.len());
        let mut capacity = HashMap::new();
        let mut caps = HashMap::new();
        for (name, plugin) in &self.config.plugins {
            if self.registry.get(&plugin.wasm).is_none() {
                continue; // not loaded: its deliveries wait
            }
            let busy = running.get(name).copied().unwrap_or(0);
            // Without a cap of its own a plugin may use any worker fairness gives it.
            let cap = plugin.max_concurrency.unwrap_or(workers);
            if let Some(cap) = plugin.max_concurrency {
                caps.insert(name.to_string(), cap);
            }
            capacity.insert(name.to_string(), cap.saturating_sub(busy).min(free));
            fairness.running.insert(name.to_string(), busy);
            if self.handlers.contains(name.as_str()) {
                fairness.held_for.insert(name.to_string());
            }
        }
        if free == 0 || capacity.values().all(|left| *left == 0) {
            return Ok(None);
        }
        let claimed = self
            .inbox
            .claim(ClaimRequest {
                now_ms: self.clock.now_ms(),
                limit: free,
                capacity,
                caps,
                lease_ms: self.lease_ms(),
                fairness,
                deliver_stale: self.deliver_stale(),
            })
            .await?;
        self.in_flight.take(&claimed);
        Ok(Some(claimed))
    }

    /// Each plugin's lease: its timeout and [`LEASE_MARGIN`].
    pub(super) fn lease_ms(&self) -> HashMap<String, i64> {
        self.config
            .plugins
            .iter()
            .map(|(name, p)| {
                (
                    name.to_string(),
                    (p.timeout + LEASE_MARGIN).as_millis() as i64,
                )
            })
            .collect()
    }

    /// The handlers with `on_stale = "deliver"`.
    pub(super) fn deliver_stale(&self) -> HashSet<String> {
        self.config
            .plugins
            .iter()
            .filter(|(_, p)| p.on_stale == OnStale::Deliver)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// One worker: runs the attempt, then gives its slot back.
    async fn work(self: Arc<Self>, claim: Claimed) {
        let handler = claim.handler.clone();
        let delivery = claim.delivery_id;
        // Run in a task of its own, so a panic in host code (an import, wasmtime) is caught
        // here: the worker slot below is always given back and the failure is logged.
        let this = self.clone();
        match tokio::spawn(async move { this.run_attempt(claim).await }).await {
            Ok(Ok(())) => {}
            // The lease stays; it expires and the delivery is reclaimed. Nothing is lost. (Logged
            // where the record failed, with the attempt's outcome.)
            Ok(Err(_)) => {}
            Err(e) => tracing::error!(
                delivery, handler = %handler, error = %text::escape(&panic_message(e)),
                "an attempt panicked in the host; its lease will expire and the delivery is reclaimed"
            ),
        }
        self.in_flight.give_back(&handler);
    }
}

/// What a panicked (or cancelled) attempt task said.
fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return e.to_string();
    }
    let payload = e.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
