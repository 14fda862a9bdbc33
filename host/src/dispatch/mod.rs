//! Dispatch: leases due deliveries, runs each attempt in a fresh handler instance, and records
//! the outcome with the delivery's next state in one transaction.
//!
//! Invariants:
//! - The attempt is counted when it is leased (in `inbox::claim`), so a plugin that takes the
//!   process down still reaches its dead letter.
//! - A delivery is never running twice: the lease is the delivery's `attempts` value, and a
//!   result whose lease was taken back is discarded (with its state writes).
//! - A handler whose plugin is not loaded is not claimed: its deliveries wait.
//! - Per-plugin and total concurrency are bounded here; wasm runs on the dedicated pool given
//!   to [`Dispatcher::run`], never on the HTTP edge's threads.

pub mod policy;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tokio::{runtime::Handle, sync::Notify};

use self::policy::{RetryPolicy, Verdict};
use crate::{
    config::{Config, DeliveryMode, PluginConfig},
    ids::PluginName,
    inbox::{ClaimRequest, Claimed, Finish, Finished, Inbox},
    model::{AttemptOutcome, Disposition, unix_ms},
    registry::Registry,
    runtime::{
        CallContext, CallError, EventInput, HandleVerdict, Limits, Outbound, Runtime, StateStore,
        idempotency_key,
    },
};

/// Extra lease time beyond a plugin's timeout, so a slow-but-alive attempt is not reclaimed.
const LEASE_MARGIN: Duration = Duration::from_secs(10);
/// How often expired leases are looked for.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);
/// Longest idle wait; new work normally wakes the loop at once.
const IDLE_POLL: Duration = Duration::from_millis(500);

impl StateStore for Inbox {
    fn get(&self, plugin: &str, key: &str) -> anyhow::Result<(Option<Vec<u8>>, i64)> {
        Ok(self.state_get_blocking(plugin, key)?)
    }
}

/// The worker pool.
pub struct Dispatcher {
    config: Arc<Config>,
    inbox: Inbox,
    registry: Arc<Registry>,
    runtime: Arc<Runtime>,
    in_flight: Mutex<HashMap<PluginName, usize>>,
    finished: Notify,
}

impl Dispatcher {
    pub fn new(
        config: Arc<Config>,
        inbox: Inbox,
        registry: Arc<Registry>,
        runtime: Arc<Runtime>,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            inbox,
            registry,
            runtime,
            in_flight: Mutex::new(HashMap::new()),
            finished: Notify::new(),
        })
    }

    fn plugin_config(&self, name: &PluginName) -> Arc<PluginConfig> {
        self.config
            .plugins
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::new(PluginConfig::with_defaults(name.clone())))
    }

    /// Where a delivery whose worker vanished goes: at-most-once plugins never re-run it.
    fn abandoned_disposition(&self, handler: &str, budget_used: u32, now_ms: i64) -> Disposition {
        let plugin = self.plugin_config(&PluginName::from(handler));
        if plugin.delivery == DeliveryMode::AtMostOnce {
            return Disposition::Dead;
        }
        policy::decide(
            &retry_policy(&plugin),
            Verdict::Failed,
            budget_used,
            now_ms,
            rand::random(),
        )
    }

    /// Takes back leases that expired (`all`: every lease, at start-up).
    pub async fn reclaim(self: &Arc<Self>, all: bool) -> anyhow::Result<usize> {
        let now = unix_ms(SystemTime::now());
        let this = self.clone();
        let before = if all { i64::MAX } else { now };
        let count = self
            .inbox
            .reclaim(now, before, move |handler, used| {
                this.abandoned_disposition(handler, used, now)
            })
            .await?;
        if count > 0 {
            tracing::warn!(
                count,
                "reclaimed deliveries whose worker stopped mid-attempt"
            );
        }
        Ok(count)
    }

    /// Runs until `shutdown` resolves; then waits for in-flight attempts (bounded by their
    /// timeouts). Attempts run on `pool`.
    pub async fn run(self: Arc<Self>, pool: Handle, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut last_reclaim = tokio::time::Instant::now();
        loop {
            if last_reclaim.elapsed() >= RECLAIM_EVERY {
                last_reclaim = tokio::time::Instant::now();
                if let Err(e) = self.reclaim(false).await {
                    tracing::error!(error = %e, "reclaiming expired leases failed");
                }
            }
            let claimed = match self.claim().await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::error!(error = %e, "claiming deliveries failed");
                    Vec::new()
                }
            };
            let idle = claimed.is_empty();
            for claim in claimed {
                let this = self.clone();
                pool.spawn(async move { this.attempt(claim).await });
            }
            if !idle {
                continue;
            }
            // Nothing claimable now: sleep until the next retry falls due (or IDLE_POLL, which
            // also bounds how late a newly loaded plugin's waiting deliveries are noticed);
            // a new event, a finished attempt or a replay wakes the loop at once. Deliveries
            // due but blocked (their key's head retries, their plugin is missing) must not make
            // this a busy loop.
            let now = unix_ms(SystemTime::now());
            let wait = match self.inbox.next_due_after(now).await {
                Ok(Some(due)) => {
                    Duration::from_millis((due - now).clamp(1, IDLE_POLL.as_millis() as i64) as u64)
                }
                _ => IDLE_POLL,
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.inbox.work_arrived() => {}
                _ = self.finished.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        // Let running attempts finish (each is bounded by its own timeout).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self
            .in_flight
            .lock()
            .expect("poisoned")
            .values()
            .sum::<usize>()
            > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn claim(&self) -> anyhow::Result<Vec<Claimed>> {
        let (capacity, free) = {
            let in_flight = self.in_flight.lock().expect("poisoned");
            let total: usize = in_flight.values().sum();
            let free = self.config.server.workers.saturating_sub(total);
            let mut capacity = HashMap::new();
            for (name, plugin) in &self.config.plugins {
                if self.registry.get(&plugin.wasm).is_none() {
                    continue; // not loaded: its deliveries wait
                }
                let busy = in_flight.get(name).copied().unwrap_or(0);
                let left = plugin.max_concurrency.saturating_sub(busy).min(free);
                if left > 0 {
                    capacity.insert(name.to_string(), left);
                }
            }
            (capacity, free)
        };
        if free == 0 || capacity.is_empty() {
            return Ok(Vec::new());
        }
        let lease_ms = self
            .config
            .plugins
            .iter()
            .map(|(name, p)| {
                (
                    name.to_string(),
                    (p.timeout + LEASE_MARGIN).as_millis() as i64,
                )
            })
            .collect();
        let claimed = self
            .inbox
            .claim(ClaimRequest {
                now_ms: unix_ms(SystemTime::now()),
                limit: free,
                capacity,
                lease_ms,
            })
            .await?;
        let mut in_flight = self.in_flight.lock().expect("poisoned");
        for claim in &claimed {
            *in_flight.entry(claim.handler.clone()).or_default() += 1;
        }
        Ok(claimed)
    }

    async fn attempt(self: Arc<Self>, claim: Claimed) {
        let handler = claim.handler.clone();
        let delivery = claim.delivery_id;
        if let Err(e) = self.run_attempt(claim).await {
            // The lease stays; it expires and the delivery is reclaimed. Nothing is lost.
            tracing::error!(delivery, handler = %handler, error = %e, "recording an attempt failed");
        }
        if let Some(n) = self.in_flight.lock().expect("poisoned").get_mut(&handler) {
            *n = n.saturating_sub(1);
        }
        self.finished.notify_one();
    }

    async fn run_attempt(&self, claim: Claimed) -> anyhow::Result<()> {
        let plugin_config = self.plugin_config(&claim.handler);
        let started_at_ms = claim.leased_at_ms;
        let Some(loaded) = self.registry.get(&plugin_config.wasm) else {
            // Unloaded between claim and call: give the attempt back, untouched by the handler.
            let finish = self.finish_record(&claim, &plugin_config, started_at_ms, None);
            let finish = Finish {
                outcome: AttemptOutcome::Abandoned,
                error_kind: Some("plugin_unavailable".into()),
                error: Some(format!(
                    "plugin file {}.wasm is not loaded",
                    plugin_config.wasm
                )),
                disposition: Disposition::RetryAt {
                    at_ms: unix_ms(SystemTime::now()) + 1000,
                },
                ..finish
            };
            self.inbox.finish(finish).await?;
            return Ok(());
        };
        let ctx = CallContext {
            plugin: claim.handler.clone(),
            config: Arc::new(plugin_config.config.clone()),
            event: Some(claim.event_id.clone()),
            limits: Limits {
                timeout: plugin_config.timeout,
                memory_bytes: plugin_config.memory_bytes,
                output_bytes: plugin_config.output_bytes,
                log_bytes: plugin_config.log_bytes,
            },
        };
        let input = EventInput {
            source: claim.source.to_string(),
            event_id: claim.event_id.to_string(),
            event_type: claim.event_type.clone(),
            ordering_key: claim.ordering_key.clone(),
            sequence: claim.sequence,
            attempt: claim.attempt,
            received_at_ms: claim.received_at_ms,
            headers: claim.headers.clone(),
            body: claim.body.to_vec(),
        };
        // The same key on every attempt of this delivery, so downstream can dedupe our retries.
        let outbound = Outbound {
            allow: plugin_config.allow_hosts.clone(),
            idempotency_key: idempotency_key(
                claim.source.as_str(),
                claim.event_id.as_str(),
                claim.handler.as_str(),
            ),
        };
        let state: Arc<dyn StateStore> = Arc::new(self.inbox.clone());
        let (result, changes) = self
            .runtime
            .handle(&loaded.plugin, &ctx, state, input, outbound)
            .await;
        let now = unix_ms(SystemTime::now());
        let (outcome, verdict, error_kind, error) = match result {
            Ok(HandleVerdict::Ok(output)) => (AttemptOutcome::Ok, Verdict::Ok(output), None, None),
            Ok(HandleVerdict::Retry { reason, after }) => (
                AttemptOutcome::Retry,
                Verdict::Retry { after },
                Some("retry".into()),
                Some(reason),
            ),
            Ok(HandleVerdict::Permanent(reason)) => (
                AttemptOutcome::Permanent,
                Verdict::Permanent,
                Some("permanent".into()),
                Some(reason),
            ),
            Err(e @ CallError::Timeout(_)) => (
                AttemptOutcome::Timeout,
                Verdict::Failed,
                Some(e.kind().into()),
                Some(e.to_string()),
            ),
            Err(e @ CallError::MissingRole(_)) => (
                AttemptOutcome::Permanent,
                Verdict::Permanent,
                Some(e.kind().into()),
                Some(e.to_string()),
            ),
            Err(e) => (
                AttemptOutcome::Trap,
                Verdict::Failed,
                Some(e.kind().into()),
                Some(e.to_string()),
            ),
        };
        if let Some(error) = &error {
            tracing::warn!(
                handler = %claim.handler, source = %claim.source, event = %crate::model::escape_control(claim.event_id.as_str()),
                attempt = claim.attempt, outcome = outcome.as_str(), "{error}"
            );
        }
        let disposition = policy::decide(
            &retry_policy(&plugin_config),
            verdict,
            claim.budget_used,
            now,
            rand::random(),
        );
        let finish = Finish {
            outcome,
            error_kind,
            error,
            disposition,
            state: changes,
            ..self.finish_record(
                &claim,
                &plugin_config,
                started_at_ms,
                Some(loaded.plugin.sha256()),
            )
        };
        match self.inbox.finish(finish).await? {
            Finished::Recorded => {}
            Finished::Conflict => {
                tracing::debug!(handler = %claim.handler, event = %crate::model::escape_control(claim.event_id.as_str()), "state conflict; re-running");
            }
            Finished::LeaseLost => tracing::warn!(
                handler = %claim.handler, event = %crate::model::escape_control(claim.event_id.as_str()),
                "attempt finished after its lease was taken back; result discarded"
            ),
        }
        Ok(())
    }

    fn finish_record(
        &self,
        claim: &Claimed,
        plugin: &PluginConfig,
        started_at_ms: i64,
        sha256: Option<&str>,
    ) -> Finish {
        Finish {
            delivery_id: claim.delivery_id,
            attempt: claim.attempt,
            started_at_ms,
            finished_at_ms: unix_ms(SystemTime::now()),
            outcome: AttemptOutcome::Ok,
            error_kind: None,
            error: None,
            plugin_sha256: sha256.map(str::to_owned),
            disposition: Disposition::Dead,
            plugin: plugin.name.clone(),
            state: Default::default(),
        }
    }
}

fn retry_policy(plugin: &PluginConfig) -> RetryPolicy {
    RetryPolicy {
        max_attempts: plugin.max_attempts,
        backoff_base: plugin.backoff_base,
        backoff_max: plugin.backoff_max,
    }
}
