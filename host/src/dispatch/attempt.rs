//! One attempt: calls the handler on a leased delivery and records the [`Finish`] the inbox
//! commits with the delivery's next state.
//!
//! Invariants:
//! - An attempt is recorded exactly once while its lease is held: a commit refused as over the
//!   plugin's total is recorded again as a failure, without its state writes.
//! - Every log line inside runs in the attempt's span (handler, source, event id, attempt), so
//!   none repeats those fields.
//! - An attempt of a hot plugin (`hot`) holds the plugin's turn from before its call until its
//!   record is queued for commit, and no longer.
//! - A record the database could not take (its server away, a full disk, a lock) is sent again
//!   while the lease may still hold, so an attempt whose outcome is known is recorded as what
//!   it was, not left to expire into `abandoned` and run once more. Sending it again is safe:
//!   the lease check comes first, so a record that did commit is answered `LeaseLost`.

use std::{
    pin::pin,
    sync::Arc,
    task::Poll,
    time::{Duration, Instant},
};

use super::{
    Dispatcher, LEASE_MARGIN, PluginState,
    hot::Hot,
    policy::{Attempted, Classified},
};
use crate::{
    config::PluginConfig,
    inbox::{Claimed, Finish, Finished, InboxError},
    model::{AttemptOutcome, Disposition},
    outbound::{Outbound, idempotency_key},
    runtime::{CallContext, EventInput, StateLimit, StateRefused, StateStore},
    telemetry::AttemptNext,
    text,
};

/// When a delivery whose plugin was unloaded between its claim and its call is due again.
const UNAVAILABLE_RETRY_MS: i64 = 1000;

/// The first pause before a record the database could not take is sent again; it doubles up
/// to [`RECORD_RETRY_MAX`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(100);
const RECORD_RETRY_MAX: Duration = Duration::from_secs(2);

impl Dispatcher {
    /// Runs one attempt and records it.
    #[tracing::instrument(name = "attempt", level = "error", skip_all, fields(
        handler = %claim.handler, source = %claim.source, event = claim.event_id.as_str(),
        attempt = claim.attempt,
    ))]
    pub(super) async fn run_attempt(&self, mut claim: Claimed) -> Result<(), InboxError> {
        let started = Instant::now();
        let plugin = self.config.plugin(&claim.handler);
        // The lease runs from the claim, before this: past this bound it is surely gone.
        let lease_bound = tokio::time::Instant::now() + plugin.timeout + LEASE_MARGIN;
        // The attempt starts now, which may be well after the claim's `now` (the claim waited
        // for the database): recorded so, its start is after whatever had to finish before it
        // was leased (its key's previous delivery, an attempt taken back), also when another
        // node finished that.
        claim.leased_at_ms = claim.leased_at_ms.max(self.clock.now_ms());
        let Some(loaded) = self.registry.get(&plugin.wasm) else {
            // Unloaded between claim and call: give the attempt back, untouched by the handler.
            let finish = Finish {
                uncounted: true,
                outcome: AttemptOutcome::Abandoned,
                error_kind: Some("plugin_unavailable".into()),
                error: Some(format!("plugin file {}.wasm is not loaded", plugin.wasm)),
                disposition: Disposition::RetryAt {
                    at_ms: self.clock.now_ms() + UNAVAILABLE_RETRY_MS,
                },
                ..self.finish_record(&claim, &plugin, None)
            };
            let counted = (finish.outcome, finish.disposition.clone());
            let (result, _) = self.record_until(finish, None, lease_bound).await?;
            self.count(&claim, counted, &result, started);
            return Ok(());
        };
        let sha256 = Some(loaded.plugin.sha256());
        let ctx = CallContext {
            plugin: claim.handler.clone(),
            config: Arc::new(plugin.config.clone()),
            event: Some(claim.event_id.clone()),
            limits: plugin.handler_limits(),
        };
        let input = EventInput {
            source: claim.source.to_string(),
            event_id: claim.event_id.to_string(),
            event_type: claim.event_type.clone(),
            ordering_key: claim.ordering_key.clone(),
            sequence: claim.sequence,
            stale: claim.stale,
            attempt: claim.attempt,
            received_at_ms: claim.received_at_ms,
            headers: claim.headers.clone(),
            body: claim.body.to_vec(),
        };
        // The same key on every attempt of this delivery, so downstream can dedupe our retries.
        let outbound = Outbound {
            allow: plugin.allow_hosts.clone(),
            tls: plugin.tls.clone(),
            credentials: plugin.credentials.clone(),
            idempotency_key: idempotency_key(
                claim.source.as_str(),
                claim.event_id.as_str(),
                claim.handler.as_str(),
            ),
            meter: self.telemetry.outbound_meter(claim.handler.as_str()),
        };
        let state: Arc<dyn StateStore> = Arc::new(PluginState {
            inbox: self.inbox.clone(),
            limits: plugin.state_limits,
        });
        let turn = self
            .hot
            .turn(&claim.handler, Hot::wait_for(plugin.timeout))
            .await;
        let (result, changes) = self
            .runtime
            .handle(&loaded.plugin, &ctx, state, input, outbound)
            .await;
        let now = self.clock.now_ms();
        let classified = Classified::from_call(result);
        if let Some(error) = &classified.error {
            tracing::warn!(
                outcome = classified.outcome.as_str(),
                "{}",
                text::escape(&error.message)
            );
        }
        let finish = Finish {
            state: changes,
            ..self.record(&claim, &plugin, sha256, classified, now)
        };
        let mut counted = (finish.outcome, finish.disposition.clone());
        let again = finish.clone();
        let mut finishing = pin!(self.inbox.finish(finish));
        // Its first poll queues the record (and makes its state writes visible to reads): the
        // turn goes on from there, not from the commit.
        let queued = std::future::poll_fn(|cx| Poll::Ready(finishing.as_mut().poll(cx))).await;
        drop(turn);
        let first = match queued {
            Poll::Ready(result) => result,
            Poll::Pending => finishing.await,
        };
        let (mut result, mut sent) = self.record_until(again, Some(first), lease_bound).await?;
        if let Finished::OverQuota(message) = result {
            // Concurrent attempts each fit the plugin's total but together do not: this one
            // did not commit; record it as failed, without its writes (the lease is still ours).
            tracing::warn!("{message}");
            let refused = Classified::state_refused(StateRefused {
                limit: StateLimit::Total,
                message,
            });
            let finish = self.record(&claim, &plugin, sha256, refused, now);
            counted = (finish.outcome, finish.disposition.clone());
            (result, sent) = self.record_until(finish, None, lease_bound).await?;
        }
        let dead = matches!(counted.1, Disposition::Dead);
        let last_outcome = counted.0;
        self.count(&claim, counted, &result, started);
        if dead && matches!(result, Finished::Recorded | Finished::OverQuota(_)) {
            tracing::warn!(
                outcome = last_outcome.as_str(),
                "delivery dead-lettered (a permanent error, its last attempt under \
                 max_attempts, or an at-most-once handler's attempt that ended without its \
                 verdict): `hookd replay` runs it again once the cause is fixed"
            );
        }
        match result {
            Finished::Recorded | Finished::OverQuota(_) => {}
            Finished::Conflict => {
                self.hot.conflicted(&claim.handler);
                tracing::debug!("state conflict; re-running");
            }
            // Sent again, `record_until` said what that most likely means.
            Finished::LeaseLost if sent > 1 => {}
            Finished::LeaseLost => {
                tracing::warn!("attempt finished after its lease was taken back; result discarded")
            }
        }
        Ok(())
    }

    /// Records `finish` (whose first try, if made already, answered `first`), sending it again
    /// while the database cannot take it and `lease_bound` is not reached; then the last answer,
    /// and how many times it was sent.
    async fn record_until(
        &self,
        finish: Finish,
        first: Option<Result<Finished, InboxError>>,
        lease_bound: tokio::time::Instant,
    ) -> Result<(Finished, u32), InboxError> {
        let mut result = match first {
            Some(result) => result,
            None => self.inbox.finish(finish.clone()).await,
        };
        let mut pause = RECORD_RETRY_FIRST;
        let mut tries = 1;
        loop {
            match result {
                Err(e @ (InboxError::Unavailable(_) | InboxError::Busy(_)))
                    if tokio::time::Instant::now() + pause < lease_bound =>
                {
                    if tries == 1 {
                        tracing::warn!(error = %e, "recording the attempt failed; sending it again while its lease holds");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RECORD_RETRY_MAX);
                    tries += 1;
                    result = self.inbox.finish(finish.clone()).await;
                }
                Ok(Finished::LeaseLost) if tries > 1 => {
                    // Most likely the first record did commit, its answer lost with the
                    // connection; or the lease was taken back meanwhile. Either way this one
                    // is not recorded again.
                    tracing::info!(
                        tries,
                        "sending the attempt's record again found its lease gone: an earlier \
                         send committed before the database went away, or the lease was taken \
                         back"
                    );
                    return Ok((Finished::LeaseLost, tries));
                }
                Ok(recorded) => {
                    if tries > 1 {
                        tracing::info!(tries, "the attempt was recorded once the database took it");
                    }
                    return Ok((recorded, tries));
                }
                Err(e) => {
                    // Said here, in the attempt's span, with what the handler's attempt came to:
                    // the record is lost, and the lease's expiry decides what happens next.
                    tracing::error!(
                        error = %e,
                        tries,
                        outcome = finish.outcome.as_str(),
                        "the attempt's record could not be written: its lease expires and the \
                         delivery is taken back (run again, or dead-lettered under \
                         at-most-once, whatever the attempt came to)"
                    );
                    return Err(e);
                }
            }
        }
    }

    /// Counts an attempt the inbox recorded as `(outcome, disposition)` unless `result` says
    /// otherwise: a conflict is recorded as one (and is due again), a result whose lease was
    /// lost is discarded and not counted.
    fn count(
        &self,
        claim: &Claimed,
        (outcome, disposition): (AttemptOutcome, Disposition),
        result: &Finished,
        started: Instant,
    ) {
        let (outcome, next) = match (result, disposition) {
            (Finished::LeaseLost, _) => return,
            (Finished::Conflict, _) => (AttemptOutcome::Conflict, AttemptNext::Other),
            (_, Disposition::RetryAt { .. }) => (outcome, AttemptNext::Retry),
            (_, Disposition::Dead) => (outcome, AttemptNext::Dead),
            (_, Disposition::Done { .. }) => (outcome, AttemptNext::Other),
        };
        self.telemetry
            .attempt_recorded(claim.handler.as_str(), outcome, next, started.elapsed());
    }

    /// The record of an attempt classified as `classified`, without state writes.
    fn record(
        &self,
        claim: &Claimed,
        plugin: &PluginConfig,
        sha256: Option<&str>,
        classified: Classified,
        now_ms: i64,
    ) -> Finish {
        // An attempt the host could not start did nothing: its budget is given back, and its
        // retries slow down with the delivery's attempts.
        let (attempted, uncounted) = match classified.attempted {
            Attempted::NotStarted { .. } => (
                Attempted::NotStarted {
                    tries: claim.attempt,
                },
                true,
            ),
            attempted => (attempted, false),
        };
        let disposition = self.dispose(plugin, attempted, claim.budget_used, now_ms);
        let (error_kind, error) = classified
            .error
            .map(|error| (error.kind.to_owned(), error.message))
            .unzip();
        Finish {
            outcome: classified.outcome,
            error_kind,
            error,
            uncounted,
            disposition,
            ..self.finish_record(claim, plugin, sha256)
        }
    }

    /// The parts of an attempt's record every outcome shares (finished now).
    fn finish_record(
        &self,
        claim: &Claimed,
        plugin: &PluginConfig,
        sha256: Option<&str>,
    ) -> Finish {
        Finish {
            delivery_id: claim.delivery_id,
            attempt: claim.attempt,
            started_at_ms: claim.leased_at_ms,
            finished_at_ms: self.clock.now_ms(),
            outcome: AttemptOutcome::Ok,
            error_kind: None,
            error: None,
            plugin_sha256: sha256.map(str::to_owned),
            disposition: Disposition::Dead,
            plugin: plugin.name.clone(),
            state: Default::default(),
            uncounted: false,
        }
    }
}
