//! Replay: finished deliveries (dead, stale or done) become due again with a fresh budget.
//!
//! Invariant: a replay never touches an open delivery (the store re-checks the state), and it
//! resets the attempt budget, not the attempt count: `attempts` keeps counting every attempt
//! (it is the lease token), `budget_base` moves up to it.

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

    /// The state whose deliveries it replays: `dead` unless given; an open state is refused
    /// (those deliveries are still being worked on), for every backend alike.
    pub(super) fn finished_state(&self) -> Result<DeliveryState, InboxError> {
        let state = self.state.unwrap_or(DeliveryState::Dead);
        if state.is_open() {
            return Err(InboxError::InvalidFilter(format!(
                "state {state} is still being worked on; replay takes dead, stale, done or discarded deliveries"
            )));
        }
        Ok(state)
    }
}

impl Inbox {
    /// Sets deliveries matched by `filter` due again with a fresh attempt budget.
    /// Returns `(matched, replayed)`; a dry run replays nothing.
    pub async fn replay(&self, filter: ReplayFilter) -> Result<(usize, usize), InboxError> {
        filter.finished_state()?;
        let Some(filter) = filter.storable() else {
            return Ok((0, 0));
        };
        let now = self.now_ms();
        let (matched, replayed) = self.store().replay(filter, now).await?;
        if replayed > 0 {
            self.add_backlog(replayed as i64);
            self.wake_workers();
        }
        Ok((matched, replayed))
    }
}
