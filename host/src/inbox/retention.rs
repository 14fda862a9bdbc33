//! Retention and discard: finished events lose their payload, then (optionally) their id;
//! dead deliveries and held quarantined requests are closed by an operator.
//!
//! What a pruned event keeps: its `events` row without headers and body (`pruned_at` set), so
//! `(source, event_id)` still dedupes, and its delivery rows without output and error, so the
//! newest `done` sequence of an ordering key (what staleness is decided against) is still
//! known. Its attempt rows go. After `dedupe_for` the event's rows go too, and its id is
//! forgotten.
//!
//! Invariants:
//! - Only events whose every delivery is finished (`DeliveryState::FINISHED`) since before the
//!   cut-off are pruned: a `dead` delivery, an open one, or a held quarantined request is never
//!   pruned; a resolved quarantined request is deleted once resolved for `done_after`.
//! - A pruned event's deliveries are never replayed (there is no body to run them on): replay
//!   passes them over, and a prune and a replay of one event are serialised by the store.
//! - One call is one short transaction, touching at most `batch_size` rows of each kind; on a
//!   single-writer store it also stops once it has held the writer for [`BATCH_BUDGET`].
//! - Times come from the façade's clock.

use std::time::Duration;

use super::{Inbox, InboxError, ReplayFilter};
use crate::{config::Retention, model::DeliveryState};

/// Where a pruning round stands: the last `(received_at, id)` its walk over the events not yet
/// pruned has passed (`None`: from the start).
pub type PruneCursor = Option<(i64, i64)>;

/// How long one batch may hold a single-writer store. Ingest's commits wait behind it, so it
/// bounds what pruning adds to an acknowledgement's latency; the pruner pauses at least as long
/// between batches (`retention::run`, at least 10 ms), so pruning takes at most about half the
/// writer's time. Pruning an event touches no index of `events`, so 1 ms still prunes faster
/// than a busy host accepts (measured: `bench/run.sh retention`).
pub(crate) const BATCH_BUDGET: Duration = Duration::from_millis(1);

/// One batch of pruning, as the store runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PruneBatch {
    /// When the batch runs (the stamp of `pruned_at`).
    pub now_ms: i64,
    /// Events whose deliveries all finished before this (and resolved quarantined requests
    /// resolved before this) are pruned.
    pub finished_before: i64,
    /// Pruned events pruned before this are forgotten (`None`: never).
    pub forget_before: Option<i64>,
    /// Rows of each kind at most.
    pub limit: usize,
    /// How long the batch may hold the store's writer: a store with one writer (SQLite, where
    /// ingest's commits queue behind the batch) stops early once it has used this, and says
    /// where it stopped; a store whose transactions do not queue behind each other may ignore it.
    pub budget: Duration,
    /// Where the walk over the events not yet pruned resumes.
    pub after: PruneCursor,
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Events whose payload and attempts went.
    pub events: usize,
    /// Pruned events whose id was forgotten.
    pub forgotten: usize,
    /// Resolved quarantined requests deleted.
    pub quarantine: usize,
    /// Where the next batch resumes its walk; `None` once the walk reached the cut-off (the
    /// next round starts again from the beginning).
    pub next: PruneCursor,
    /// The batch used up its time budget before it was through with the forgetting: more
    /// may be due at once.
    pub cut_short: bool,
    /// Another node was pruning (a store several nodes share): this batch did nothing.
    pub busy: bool,
}

impl Pruned {
    /// Whether a batch touched as many rows of some kind as it may, stopped early, or its walk
    /// did not reach the cut-off: there is more to do at once.
    pub fn more(&self, limit: usize) -> bool {
        self.next.is_some() || self.cut_short || self.forgotten >= limit || self.quarantine >= limit
    }
}

impl ReplayFilter {
    /// The state whose deliveries a discard closes: only `dead` (the work that needs a human);
    /// anything else, or `force`, is [`InboxError::InvalidFilter`].
    pub(super) fn discardable_state(&self) -> Result<DeliveryState, InboxError> {
        if self.force {
            return Err(InboxError::InvalidFilter(
                "force applies to replay; a discard delivers nothing".into(),
            ));
        }
        match self.state.unwrap_or(DeliveryState::Dead) {
            DeliveryState::Dead => Ok(DeliveryState::Dead),
            state @ (DeliveryState::Pending | DeliveryState::Retrying) if self.orphaned => {
                Ok(state)
            }
            state => Err(InboxError::InvalidFilter(format!(
                "state {state} cannot be discarded; discard takes dead deliveries, and the \
                 pending or retrying ones of a handler the configuration no longer declares"
            ))),
        }
    }
}

/// How a quarantined request closed by an operator is resolved.
pub(crate) const DISCARDED_RESOLUTION: &str = "discarded by an operator";

impl Inbox {
    /// Runs one batch of `rules` at the inbox clock's now, resuming the walk at `after`.
    /// Nothing is pruned while `rules.done_after` is forever.
    pub async fn prune(&self, rules: &Retention, after: PruneCursor) -> Result<Pruned, InboxError> {
        let Some(done_after) = rules.done_after else {
            return Ok(Pruned::default());
        };
        let now_ms = self.now_ms();
        let ago = |d: Duration| now_ms.saturating_sub(ms(d));
        let batch = PruneBatch {
            now_ms,
            finished_before: ago(done_after),
            forget_before: rules.dedupe_for.map(ago),
            limit: rules.batch_size,
            budget: BATCH_BUDGET,
            after,
        };
        self.store().prune(batch).await
    }

    /// Closes the dead deliveries `filter` matches as `discarded` (none on a dry run); returns
    /// `(matched, discarded)`. A state other than `dead` is [`InboxError::InvalidFilter`], but
    /// for the waiting deliveries of an [orphaned](ReplayFilter::orphaned) handler.
    pub async fn discard(&self, filter: ReplayFilter) -> Result<(usize, usize), InboxError> {
        let state = filter.discardable_state()?;
        let Some(filter) = filter.storable() else {
            return Ok((0, 0));
        };
        let (matched, discarded) = self.store().discard(filter, self.now_ms()).await?;
        if state.is_open() {
            self.add_backlog(-(discarded as i64));
        }
        Ok((matched, discarded))
    }

    /// Resolves the held quarantined requests matching `filter`'s source and time range as
    /// discarded (none on a dry run); returns `(matched, discarded)`, and recounts the held ones.
    pub async fn discard_quarantine(
        &self,
        filter: ReplayFilter,
    ) -> Result<(usize, usize), InboxError> {
        let Some(filter) = filter.storable() else {
            return Ok((0, 0));
        };
        let done = self
            .store()
            .discard_quarantine(filter, self.now_ms())
            .await?;
        if done.1 > 0 {
            self.recount_quarantine().await?;
        }
        Ok(done)
    }
}

/// `d` in milliseconds, saturating.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
