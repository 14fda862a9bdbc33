//! Leases: claim what is due, record how an attempt ended, take back what a vanished worker held.
//!
//! Invariants:
//! - Per `(source, ordering_key, handler)` only the earliest open delivery (by sequence, then
//!   arrival) may be leased, and only while none of its key runs: a key runs one at a time, in
//!   order. A candidate older than a delivery already done for its key becomes `stale`, unless
//!   its handler delivers stale events (`on_stale = "deliver"`) or a forced replay asked for
//!   it: then it is leased with [`Claimed::stale`] set.
//! - The attempt is counted when it is leased; the lease token is the delivery's `attempts`, so
//!   a result whose lease was taken back is discarded (with its state writes).
//! - An attempt and its delivery's next state are one store transition.
//! - A lease runs from when the store grants it: a claim that waited over [`LATE_CLAIM`] before
//!   it ran (in SQLite's writer queue behind a stalled disk, for a PostgreSQL connection) is
//!   moved on by its wait ([`ClaimRequest::ran_after`]), so a lease is never granted short or
//!   already over, to be taken back while its handler runs.
//! - Every lease is taken back at start-up only from a store no other process uses
//!   ([`Capabilities::single_node`](super::store::Capabilities)).

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    time::Duration,
};

use bytes::Bytes;

use super::{Inbox, InboxError, store::Reclaimed};
use crate::{
    dispatch::fair::{self, Fairness},
    ids::{EventId, PluginName, SourceName},
    model::{AttemptOutcome, DeliveryState, Disposition, Header, StateChanges},
    text,
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
    /// A newer sequence of its key was already done when it was leased (it is delivered only
    /// to a handler with `on_stale = "deliver"`, or after a forced replay).
    pub stale: bool,
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
    /// Handler → its `max_concurrency`, where it has one: attempts of it at once across every
    /// node sharing the database (a backend several nodes share leases no more than this less
    /// those running anywhere; one process's `capacity` already says it all).
    pub caps: HashMap<String, usize>,
    /// Handler → lease length; handlers absent get [`DEFAULT_LEASE_MS`].
    pub lease_ms: HashMap<String, i64>,
    /// How the free workers are shared among the handlers ([`allot`](crate::dispatch::fair::allot)); the default (no
    /// standing, no headroom) takes the handlers round-robin, oldest first.
    pub fairness: Fairness,
    /// Handlers given stale deliveries (`on_stale = "deliver"`) instead of having them marked
    /// `stale`.
    pub deliver_stale: HashSet<String>,
}

/// How long a lease lasts when the claim names no length for its handler.
pub const DEFAULT_LEASE_MS: i64 = 60_000;

/// A claim that waited longer than this before it ran has its time moved on by the wait (a
/// shorter wait is within a lease's margin, and left alone).
pub const LATE_CLAIM: Duration = Duration::from_secs(1);

/// The claim's steps every backend shares: which handlers it looks at, how its free workers
/// are shared among their due deliveries, how long a lease lasts.
impl ClaimRequest {
    /// The handlers with room, in name order, each with how many deliveries it could be given
    /// (its room, at most the claim's limit; 0 = none to look up).
    pub(super) fn wants(&self) -> Vec<(&str, usize, usize)> {
        let mut handlers: Vec<(&str, usize, usize)> = self
            .capacity
            .iter()
            .map(|(handler, room)| (handler.as_str(), *room, (*room).min(self.limit)))
            .collect();
        handlers.sort();
        handlers
    }

    /// Shares the free workers out fairly ([`fair::allot`]) among `handlers` (as
    /// [`ClaimRequest::wants`] lists them), given each one's due candidates, oldest first, by
    /// due time: which candidate of which handler to lease, in lease order, as `(handler index,
    /// candidate index)`. So no handler's backlog, however old, hides another's due delivery.
    pub(super) fn share_out(
        &self,
        handlers: &[(&str, usize, usize)],
        due: &[Vec<i64>],
    ) -> Vec<(usize, usize)> {
        let lanes: Vec<fair::Lane> = handlers
            .iter()
            .zip(due)
            .map(|((handler, room, _), due)| self.fairness.lane(handler, *room, due))
            .collect();
        let mut taken = vec![0usize; handlers.len()];
        fair::allot(self.limit, &self.fairness, &lanes)
            .into_iter()
            .map(|lane| {
                taken[lane] += 1;
                (lane, taken[lane] - 1)
            })
            .collect()
    }

    /// This claim as it runs after waiting `waited` since it was asked for: its `now` moved on
    /// by the wait if that was over [`LATE_CLAIM`], so what it leases is leased from when it
    /// ran (the lease's length, and `leased_at`, from then).
    pub(super) fn ran_after(&self, waited: Duration) -> Cow<'_, ClaimRequest> {
        if waited <= LATE_CLAIM {
            return Cow::Borrowed(self);
        }
        let waited_ms = i64::try_from(waited.as_millis()).unwrap_or(i64::MAX);
        Cow::Owned(ClaimRequest {
            now_ms: self.now_ms.saturating_add(waited_ms),
            ..self.clone()
        })
    }

    /// When a lease of `handler` taken now ends.
    pub(super) fn lease_until(&self, handler: &str) -> i64 {
        let lease = self
            .lease_ms
            .get(handler)
            .copied()
            .unwrap_or(DEFAULT_LEASE_MS);
        self.now_ms + lease
    }
}

/// Due deliveries a claim's window looks at for each one it wants (plus a few), earliest
/// first: a window full of deliveries waiting behind their keys' heads sends the claim to the
/// walk over the keys (a few seeks per key with open deliveries, never one per delivery
/// waiting).
/// Both backends' claims look this far.
pub(super) const WINDOW_PER_WANTED: usize = 4;

/// Passes over the due deliveries one claim makes at most: a pass that marked a head stale is
/// followed by another (the key's next delivery may be its head now).
pub(super) const PASSES: usize = 4;

/// The window a pass looks at to find `need` deliveries that may run.
pub(super) fn window_size(need: usize) -> usize {
    need * WINDOW_PER_WANTED + 16
}

/// Why a candidate older than a delivery done for its key is marked `stale`.
pub(super) fn stale_reason(sequence: i64, done: i64, key: &str) -> String {
    format!("stale: sequence {sequence} is older than {done}, already done for key {key:?}")
}

/// What a claim does with a head of its key, by the ordering rule
/// ([`superseded_by`](crate::dispatch::policy::superseded_by)) and the handler's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Staleness {
    /// No newer sequence of its key is done: leased as usual.
    Fresh,
    /// Superseded, and its handler skips stale events: marked `stale`, never run.
    Skipped,
    /// Superseded, and delivered all the same ([`Claimed::stale`]).
    Deliver,
}

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
    /// The host gave the attempt back before the handler could act (its plugin was unloaded
    /// between the claim and the call, or the host's plugin memory could not start it):
    /// recorded, but not counted against `max_attempts`. Its attempt number stays used, as a
    /// conflict's does: it is the lease token.
    pub uncounted: bool,
}

/// What every backend records of an attempt, beside its row.
impl Finish {
    /// The attempt of delivery `delivery_id` (by `handler`, leased at `leased_at_ms`) whose
    /// lease was taken back at `now_ms`, going where `disposition` says. A running row without
    /// its lease's start (a hand repair, say) is taken back all the same, as started `now_ms`.
    pub(super) fn abandoned(
        delivery_id: i64,
        handler: &str,
        attempt: u32,
        leased_at_ms: Option<i64>,
        now_ms: i64,
        disposition: Disposition,
    ) -> Self {
        Self {
            delivery_id,
            attempt,
            started_at_ms: leased_at_ms.unwrap_or(now_ms),
            finished_at_ms: now_ms,
            outcome: AttemptOutcome::Abandoned,
            error_kind: Some("lease_expired".into()),
            error: Some(
                "the attempt's worker stopped before it finished (crash, kill or restart); \
                 whether the handler acted is unknown"
                    .into(),
            ),
            plugin_sha256: None,
            disposition,
            plugin: PluginName::new(handler),
            state: StateChanges::default(),
            uncounted: false,
        }
    }

    /// This attempt as recorded when state key `key` it read changed meanwhile (version `seen`
    /// → `now`): a conflict, without its writes (no copy of its values).
    pub(super) fn conflicted(&self, key: &str, seen: i64, now: i64) -> Self {
        Self {
            delivery_id: self.delivery_id,
            attempt: self.attempt,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            outcome: AttemptOutcome::Conflict,
            error_kind: Some("state_conflict".into()),
            error: Some(format!(
                "state key {key:?} changed during the attempt (version {seen} → {now}); re-running"
            )),
            plugin_sha256: self.plugin_sha256.clone(),
            disposition: self.disposition.clone(),
            plugin: self.plugin.clone(),
            state: StateChanges::default(),
            uncounted: false,
        }
    }

    /// Where the delivery goes: its next state, the output to keep (`None` keeps the stored
    /// one) and when it is next due.
    pub(super) fn next_state(&self) -> (DeliveryState, Option<String>, i64) {
        match &self.disposition {
            Disposition::Done { output } => {
                (DeliveryState::Done, output.clone(), self.finished_at_ms)
            }
            Disposition::RetryAt { at_ms } => (DeliveryState::Retrying, None, *at_ms),
            Disposition::Dead => (DeliveryState::Dead, None, self.finished_at_ms),
        }
    }

    /// The delivery's `last_error` after this attempt: `kind: error`, either alone, or none.
    pub(super) fn last_error(&self) -> Option<String> {
        match (&self.error_kind, &self.error) {
            (Some(kind), Some(error)) => Some(format!("{kind}: {error}")),
            (Some(kind), None) => Some(kind.clone()),
            (None, error) => error.clone(),
        }
    }

    /// Whether this attempt commits state writes (it succeeded and wrote some).
    pub(super) fn writes_state(&self) -> bool {
        matches!(self.disposition, Disposition::Done { .. }) && !self.state.writes.is_empty()
    }

    /// Whether its commit checks state versions (a `done` that read or wrote state): such a
    /// commit keeps its place among the state commits queued before it, whose writes it may
    /// have read.
    pub(super) fn checks_state(&self) -> bool {
        matches!(self.disposition, Disposition::Done { .. }) && !self.state.versions.is_empty()
    }

    /// Whether the delivery leaves the open states (done or dead, not retried).
    pub(super) fn closes(&self) -> bool {
        !matches!(self.disposition, Disposition::RetryAt { .. })
    }
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
        if claim.stale > 0 {
            // A claim marks a bounded number of stale heads (`PASSES`), each handing its key on
            // to the next delivery: claim again at once rather than when something next falls
            // due (a fresh event behind a thousand superseded ones waited ~2 min of idle polls).
            self.wake_here();
        }
        Ok(claim.leased)
    }

    /// Records a finished attempt and moves its delivery on, applying the attempt's state
    /// writes only if nothing it read changed since (else: `Conflict`, and it is due again).
    pub async fn finish(&self, mut finish: Finish) -> Result<Finished, InboxError> {
        // A handler's words, as every backend can store them.
        finish.error = finish.error.map(text::storable);
        finish.error_kind = finish.error_kind.map(text::storable);
        if let Disposition::Done { output } = &mut finish.disposition {
            *output = output.take().map(text::storable);
        }
        let closes = finish.closes();
        let result = self.store().finish(finish).await?;
        match result {
            Finished::Recorded if closes => self.add_backlog(-1),
            Finished::Recorded | Finished::Conflict => self.wake_here(),
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

    /// Keeps the backlog and the wake-up after a reclaim, and says per handler what it took
    /// back; returns the leases taken back.
    fn reclaimed(&self, reclaimed: Reclaimed) -> usize {
        self.add_backlog(-(reclaimed.closed as i64));
        if reclaimed.taken_back > 0 {
            self.wake_workers();
        }
        for (handler, (taken_back, dead)) in &reclaimed.by_handler {
            tracing::warn!(
                handler = handler.as_str(),
                taken_back,
                dead,
                "took back the leases of deliveries whose worker stopped mid-attempt (each \
                 attempt recorded `abandoned`, the rest due again: `hookd events --handler` \
                 lists them)"
            );
        }
        reclaimed.taken_back
    }

    /// The earliest time after `after_ms` at which a pending or retrying delivery falls due.
    /// (Deliveries already due but not claimed are waiting on something else — their key's
    /// head, or their plugin — and are woken by that, not by the clock.)
    pub async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError> {
        self.store().next_due_after(after_ms).await
    }

    /// When the waiting delivery due longest ago became due, if one is due now.
    pub async fn oldest_due(&self) -> Result<Option<i64>, InboxError> {
        self.store().oldest_due(self.now_ms()).await
    }
}
