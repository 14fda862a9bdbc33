//! Leases: claim what is due, record how an attempt ended, take back what a vanished worker held.
//!
//! Invariants:
//! - Per `(source, ordering_key, handler)` only the earliest open delivery (by sequence, then
//!   arrival) may be leased, and only while none of its key runs: a key runs one at a time, in
//!   order. A candidate older than a delivery already done for its key becomes `stale`.
//! - The attempt is counted when it is leased; the lease token is the delivery's `attempts`, so
//!   a result whose lease was taken back is discarded (with its state writes).
//! - An attempt and its delivery's next state are one store transition.
//! - Every lease is taken back at start-up only from a store no other process uses
//!   ([`Capabilities::single_node`](super::store::Capabilities)).

use std::collections::HashMap;

use bytes::Bytes;

use super::{Inbox, InboxError, store::Reclaimed};
use crate::{
    dispatch::fair::Fairness,
    ids::{EventId, PluginName, SourceName},
    model::{AttemptOutcome, Disposition, Header, StateChanges},
};

/// A delivery leased to a worker, with everything the handler needs.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery_id: i64,
    /// This attempt's number, counting every attempt of the delivery (the lease token too).
    pub attempt: u32,
    /// Attempts used since the last replay, this one included.
    pub budget_used: u32,
    pub leased_at_ms: i64,
    pub source: SourceName,
    pub handler: PluginName,
    pub event_id: EventId,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<u64>,
    pub received_at_ms: i64,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

/// What the dispatcher asks for in one claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub now_ms: i64,
    /// Free workers: at most this many deliveries are leased.
    pub limit: usize,
    /// Handler → how many more attempts of it may run now; only handlers listed are claimed.
    pub capacity: HashMap<String, usize>,
    /// Handler → lease length; handlers absent get [`DEFAULT_LEASE_MS`].
    pub lease_ms: HashMap<String, i64>,
    /// How the free workers are shared among the handlers ([`allot`](crate::dispatch::fair::allot)); the default (no
    /// standing, no headroom) takes the handlers round-robin, oldest first.
    pub fairness: Fairness,
}

/// How long a lease lasts when the claim names no length for its handler.
pub const DEFAULT_LEASE_MS: i64 = 60_000;

/// One finished attempt, to be recorded with its delivery's next state in one transaction.
#[derive(Debug, Clone)]
pub struct Finish {
    pub delivery_id: i64,
    pub attempt: u32,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub outcome: AttemptOutcome,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    pub plugin_sha256: Option<String>,
    pub disposition: Disposition,
    /// Namespace of the state writes: the plugin instance.
    pub plugin: PluginName,
    pub state: StateChanges,
}

/// How recording a finished attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The attempt is recorded, its state writes applied and its delivery moved on.
    Recorded,
    /// State read by the attempt changed meanwhile: nothing applied, the delivery is due again.
    Conflict,
    /// The lease was taken away (expired and reclaimed): the result is discarded.
    LeaseLost,
    /// Committing the state writes would take the plugin over its total (`limits.max_keys` /
    /// `max_bytes`): nothing was applied or recorded, the lease is still held; the message names
    /// the limit. The caller records the attempt as failed.
    OverQuota(String),
}

impl Inbox {
    /// Leases due deliveries. Per `(source, ordering_key, handler)` only the earliest open
    /// delivery (by sequence, then arrival) is eligible, so a key runs one at a time, in order.
    /// A candidate older than a delivery already done for its key is marked `stale` instead.
    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Claimed>, InboxError> {
        let claim = self.store().claim(request).await?;
        self.add_backlog(-(claim.stale as i64));
        Ok(claim.leased)
    }

    /// Records a finished attempt and moves its delivery on, applying the attempt's state
    /// writes only if nothing it read changed since (else: `Conflict`, and it is due again).
    pub async fn finish(&self, finish: Finish) -> Result<Finished, InboxError> {
        let closes = !matches!(finish.disposition, Disposition::RetryAt { .. });
        let result = self.store().finish(finish).await?;
        match result {
            Finished::Recorded if closes => self.add_backlog(-1),
            Finished::Recorded | Finished::Conflict => self.wake_workers(),
            Finished::LeaseLost | Finished::OverQuota(_) => {}
        }
        Ok(result)
    }

    /// Takes back every lease: at start-up, when no other process can hold one (the store is
    /// this process's alone: [`InboxError::NotSingleNode`] otherwise). Abandoned at the inbox
    /// clock's now; see [`Inbox::reclaim_expired`].
    pub async fn reclaim_all_at_startup(
        &self,
        decide: impl Fn(&str, u32) -> Disposition + Send + 'static,
    ) -> Result<usize, InboxError> {
        if !self.store().capabilities().single_node {
            return Err(InboxError::NotSingleNode);
        }
        let reclaimed = self
            .store()
            .reclaim_all(self.now_ms(), Box::new(decide))
            .await?;
        Ok(self.reclaimed(reclaimed))
    }

    /// Takes back the leases that expired before `now_ms`. `decide(handler, budget_used)` says
    /// where each delivery goes; the abandoned attempt is recorded as `abandoned`, ending at
    /// `now_ms`.
    pub async fn reclaim_expired(
        &self,
        now_ms: i64,
        decide: impl Fn(&str, u32) -> Disposition + Send + 'static,
    ) -> Result<usize, InboxError> {
        let reclaimed = self
            .store()
            .reclaim_expired(now_ms, Box::new(decide))
            .await?;
        Ok(self.reclaimed(reclaimed))
    }

    /// Keeps the backlog and the wake-up after a reclaim; returns the leases taken back.
    fn reclaimed(&self, reclaimed: Reclaimed) -> usize {
        self.add_backlog(-(reclaimed.closed as i64));
        if reclaimed.taken_back > 0 {
            self.wake_workers();
        }
        reclaimed.taken_back
    }

    /// The earliest time after `after_ms` at which a pending or retrying delivery falls due.
    /// (Deliveries already due but not claimed are waiting on something else — their key's
    /// head, or their plugin — and are woken by that, not by the clock.)
    pub async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError> {
        self.store().next_due_after(after_ms).await
    }
}
