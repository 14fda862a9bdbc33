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
//! - Workers are shared fairly among handler plugins ([`fair`]): one plugin's backlog never
//!   takes the workers another plugin's due delivery needs for longer than one attempt.

pub mod fair;
pub mod policy;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tokio::{runtime::Handle, sync::Notify};

use self::{
    fair::Fairness,
    policy::{RetryPolicy, Verdict},
};
use crate::{
    config::{Config, DeliveryMode, PluginConfig},
    ids::PluginName,
    inbox::{ClaimRequest, Claimed, Finish, Finished, Inbox},
    model::{AttemptOutcome, Disposition, StateLimits, StateUsage, unix_ms},
    registry::Registry,
    runtime::{
        CallContext, CallError, EventInput, HandleVerdict, Limits, Outbound, Runtime, StateLimit,
        StateStore, idempotency_key,
    },
    text,
};

/// Extra lease time beyond a plugin's timeout, so a slow-but-alive attempt is not reclaimed.
const LEASE_MARGIN: Duration = Duration::from_secs(10);
/// How often expired leases are looked for.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);
/// Longest idle wait; new work normally wakes the loop at once.
const IDLE_POLL: Duration = Duration::from_millis(500);

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
    in_flight: Mutex<HashMap<PluginName, usize>>,
    finished: Notify,
    /// The plugins some source names as a handler (parsers and retired handlers are not).
    handlers: HashSet<String>,
}

impl Dispatcher {
    pub fn new(
        config: Arc<Config>,
        inbox: Inbox,
        registry: Arc<Registry>,
        runtime: Arc<Runtime>,
    ) -> Arc<Self> {
        let handlers = config
            .sources
            .values()
            .flat_map(|source| &source.handlers)
            .map(|handler| handler.to_string())
            .collect();
        Arc::new(Self {
            config,
            inbox,
            registry,
            runtime,
            in_flight: Mutex::new(HashMap::new()),
            finished: Notify::new(),
            handlers,
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
        let decide = move |handler: &str, used| this.abandoned_disposition(handler, used, now);
        let count = if all {
            self.inbox.reclaim_all_at_startup(decide).await?
        } else {
            self.inbox.reclaim_expired(now, decide).await?
        };
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
        let workers = self.config.server.workers;
        let (capacity, free, fairness) = {
            let in_flight = self.in_flight.lock().expect("poisoned");
            let total: usize = in_flight.values().sum();
            let free = workers.saturating_sub(total);
            let mut fairness = Fairness::new(workers, self.handlers.len());
            let mut capacity = HashMap::new();
            for (name, plugin) in &self.config.plugins {
                if self.registry.get(&plugin.wasm).is_none() {
                    continue; // not loaded: its deliveries wait
                }
                let busy = in_flight.get(name).copied().unwrap_or(0);
                // Without a cap of its own a plugin may use any worker fairness gives it.
                let cap = plugin.max_concurrency.unwrap_or(workers);
                capacity.insert(name.to_string(), cap.saturating_sub(busy).min(free));
                fairness.running.insert(name.to_string(), busy);
                if self.handlers.contains(name.as_str()) {
                    fairness.held_for.insert(name.to_string());
                }
            }
            (capacity, free, fairness)
        };
        if free == 0 || capacity.values().all(|left| *left == 0) {
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
                fairness,
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
        // Run in a task of its own, so a panic in host code (an import, wasmtime) is caught
        // here: the worker slot below is always given back and the failure is logged.
        let this = self.clone();
        match tokio::spawn(async move { this.run_attempt(claim).await }).await {
            Ok(Ok(())) => {}
            // The lease stays; it expires and the delivery is reclaimed. Nothing is lost.
            Ok(Err(e)) => {
                tracing::error!(delivery, handler = %handler, error = %e, "recording an attempt failed")
            }
            Err(e) => tracing::error!(
                delivery, handler = %handler, error = %text::escape(&panic_message(e)),
                "an attempt panicked in the host; its lease will expire and the delivery is reclaimed"
            ),
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
        let state: Arc<dyn StateStore> = Arc::new(PluginState {
            inbox: self.inbox.clone(),
            limits: plugin_config.state_limits,
        });
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
            // The same event writes the same again: over the attempt caps it is dead-lettered
            // at once (raise the cap, then replay). Over the plugin's total it is retried with
            // backoff: deletes by other deliveries, or a raised limit, may make room.
            Err(CallError::StateRefused(refused)) => {
                let kind = CallError::StateRefused(refused.clone()).kind();
                match refused.limit {
                    StateLimit::Attempt => (
                        AttemptOutcome::Permanent,
                        Verdict::Permanent,
                        Some(kind.into()),
                        Some(refused.message),
                    ),
                    StateLimit::Total => (
                        AttemptOutcome::Retry,
                        Verdict::Failed,
                        Some(kind.into()),
                        Some(refused.message),
                    ),
                }
            }
            Err(e) => (
                AttemptOutcome::Trap,
                Verdict::Failed,
                Some(e.kind().into()),
                Some(e.to_string()),
            ),
        };
        // A handler's reason is untrusted text of any size: kept capped, logged escaped.
        let error = error.map(|error| text::cap(error, text::MAX_REASON_BYTES));
        if let Some(error) = &error {
            tracing::warn!(
                handler = %claim.handler, source = %claim.source, event = claim.event_id.as_str(),
                attempt = claim.attempt, outcome = outcome.as_str(), "{}", text::escape(error)
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
        let retry = retry_policy(&plugin_config);
        let over_quota = |message: String| Finish {
            outcome: AttemptOutcome::Retry,
            error_kind: Some("state_quota".into()),
            error: Some(message),
            disposition: policy::decide(
                &retry,
                Verdict::Failed,
                claim.budget_used,
                now,
                rand::random(),
            ),
            ..self.finish_record(
                &claim,
                &plugin_config,
                started_at_ms,
                Some(loaded.plugin.sha256()),
            )
        };
        let mut result = self.inbox.finish(finish).await?;
        if let Finished::OverQuota(message) = result {
            // Concurrent attempts each fit the plugin's total but together do not: this one
            // did not commit; record it as failed, without its writes (the lease is still ours).
            tracing::warn!(
                handler = %claim.handler, event = claim.event_id.as_str(), attempt = claim.attempt,
                "{message}"
            );
            result = self.inbox.finish(over_quota(message)).await?;
        }
        match result {
            Finished::Recorded | Finished::OverQuota(_) => {}
            Finished::Conflict => {
                tracing::debug!(handler = %claim.handler, event = claim.event_id.as_str(), "state conflict; re-running");
            }
            Finished::LeaseLost => tracing::warn!(
                handler = %claim.handler, event = claim.event_id.as_str(),
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
