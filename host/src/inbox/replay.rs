//! Replay: finished deliveries (dead, stale, done or discarded) become due again with a fresh
//! budget; retrying ones, waiting out a backoff, become due now with the budget they have.
//!
//! Invariants:
//! - A replay never touches a pending or running delivery, nor one that left the state it
//!   selected (the store re-checks the state in its update).
//! - It resets the attempt budget of a finished delivery, not the attempt count: `attempts`
//!   keeps counting every attempt (it is the lease token), `budget_base` moves up to it. A
//!   retrying delivery keeps both: running it sooner is not a fresh start.

use super::{Inbox, InboxError};
use crate::{model::DeliveryState, text};

/// Filters for `POST /admin/replay`.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    pub source: Option<String>,
    pub handler: Option<String>,
    /// Which deliveries to replay; `dead` when not given.
    pub state: Option<DeliveryState>,
    pub event_ids: Option<Vec<String>>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Only deliveries whose last attempt failed with this `error_kind` (a dead-letter group).
    pub error_kind: Option<String>,
    pub limit: usize,
    pub dry_run: bool,
    /// Deliver the replayed deliveries even if a newer sequence of their key is done by then
    /// (the handler gets them with `stale` set) instead of marking them `stale` again.
    pub force: bool,
    /// `handler` names one the configuration no longer declares, whose waiting (`pending`,
    /// `retrying`) deliveries nothing will ever run: a discard may close those too. Set by the
    /// service that checked the name, never by a client.
    pub orphaned: bool,
    /// When set, only the deliveries of these handlers. The replay service sets it to the
    /// handlers the configuration declares when `handler` names none, so a replay of every
    /// handler's dead letters leaves a removed instance's as they are (queued again, nothing
    /// would ever run them). Never set by a client.
    pub declared_handlers: Option<Vec<String>>,
}

impl ReplayFilter {
    /// Whether the filter also selects held quarantined requests: they have no event id,
    /// handler or delivery state yet, so only a filter by source and time range covers them.
    pub fn covers_quarantine(&self) -> bool {
        self.handler.is_none()
            && self.event_ids.is_none()
            && self.state.is_none()
            && self.error_kind.is_none()
    }

    /// The filter as every backend can run it: `None` when it can match nothing stored (a
    /// name holding a NUL: none is stored, and PostgreSQL cannot even compare one), else
    /// without the event ids that hold one.
    pub(super) fn storable(mut self) -> Option<Self> {
        let names = [&self.source, &self.handler, &self.error_kind];
        if names
            .iter()
            .any(|name| name.as_deref().is_some_and(text::has_nul))
        {
            return None;
        }
        if let Some(ids) = &mut self.event_ids
            && ids.iter().any(|id| text::has_nul(id))
        {
            ids.retain(|id| !text::has_nul(id));
            if ids.is_empty() {
                return None;
            }
        }
        Some(self)
    }

    /// The state whose deliveries it replays: `dead` unless given; `pending` (already due) and
    /// `running` are refused, for every backend alike.
    pub(super) fn replayed_state(&self) -> Result<DeliveryState, InboxError> {
        let state = self.state.unwrap_or(DeliveryState::Dead);
        let why = match state {
            DeliveryState::Pending => "is already due",
            DeliveryState::Running => "is being worked on",
            _ => return Ok(state),
        };
        Err(InboxError::InvalidFilter(format!(
            "state {state} {why}; replay takes dead, stale, done or discarded deliveries, and \
             retrying ones (run now)"
        )))
    }
}

impl Inbox {
    /// Sets deliveries matched by `filter` due again: finished ones with a fresh attempt
    /// budget, retrying ones now. Returns `(matched, replayed)`; a dry run replays nothing.
    pub async fn replay(&self, filter: ReplayFilter) -> Result<(usize, usize), InboxError> {
        let state = filter.replayed_state()?;
        let Some(filter) = filter.storable() else {
            return Ok((0, 0));
        };
        let now = self.now_ms();
        let (matched, replayed) = self.store().replay(filter, now).await?;
        if replayed > 0 {
            // A retrying delivery is in the backlog already: it never left it.
            if !state.is_open() {
                self.add_backlog(replayed as i64);
            }
            self.wake_workers();
        }
        Ok((matched, replayed))
    }
}
