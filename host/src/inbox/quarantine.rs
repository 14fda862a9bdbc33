//! Verified requests whose envelope could not be produced: kept, bounded, and replayable.
//!
//! Invariants:
//! - Quarantine is bounded like the backlog: a write is admitted (counted in flight, in the
//!   façade) before it starts, so concurrent requests cannot overshoot `max_held`; nor can a
//!   recount of what is stored (after a replay, or another node's) while writes are in flight.
//! - Reads of held requests by filter never read a body.

use super::{Inbox, InboxError, RawRequest, ReplayFilter};
use crate::{ids::SourceName, text};

/// A held request's resolution once parsed as event `event_id`: accepted as that event (new, or
/// a duplicate of its id), or, with `body_of`, a duplicate of the body of that other stored
/// event (its source dedupes by body), which is the one to look at.
pub(super) fn accepted_as(event_id: &str, body_of: Option<&str>) -> String {
    match body_of {
        Some(stored) => format!("a duplicate of the body of event {stored} (parsed as {event_id})"),
        None => format!("accepted as {event_id}"),
    }
}

/// A quarantined request waiting to be parsed again.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub id: i64,
    pub source: SourceName,
    pub request: RawRequest,
}

impl Inbox {
    /// Keeps a verified request whose envelope could not be produced; returns its id, or `None`
    /// (nothing written) when `max_held` requests are already held: quarantine is bounded like
    /// the backlog. The write is admitted before it starts, so concurrent requests cannot
    /// overshoot.
    pub async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
        max_held: u64,
    ) -> Result<Option<i64>, InboxError> {
        let max_held = i64::try_from(max_held).unwrap_or(i64::MAX);
        let Some(_admission) = self.admit_quarantine(max_held) else {
            return Ok(None);
        };
        let reason = text::storable(reason);
        let written = self.store().quarantine(source, request, reason).await;
        if written.is_ok() {
            self.quarantine_stored();
        }
        written.map(Some)
    }

    /// Sets the held-quarantine count (the bound's measure) from the store: after a replay,
    /// whose accepts resolve quarantined requests in their own transactions.
    pub async fn recount_quarantine(&self) -> Result<i64, InboxError> {
        let held = self.quarantine_held_count().await?;
        self.set_quarantine_held(held);
        Ok(held)
    }

    /// Ids of the quarantined requests not yet resolved that match the replay filter's source
    /// and time range (at most `filter.limit`, oldest first). Reads no body.
    pub async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError> {
        let Some(filter) = filter.storable() else {
            return Ok(Vec::new());
        };
        self.store().held_quarantine_ids(filter).await
    }

    /// How many quarantined requests [`Inbox::held_quarantine_ids`] would return. Reads no body.
    pub async fn held_quarantine_count(&self, filter: ReplayFilter) -> Result<usize, InboxError> {
        Ok(self.held_quarantine_ids(filter).await?.len())
    }

    /// One quarantined request with its body, if it is still unresolved.
    pub async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError> {
        self.store().held_quarantined(id).await
    }

    /// Marks a quarantined request resolved without an event (its parser now says invalid/ignore),
    /// if it is still held; returns whether it was (`false`: a concurrent replay or discard
    /// resolved it first, and this call changed nothing).
    pub async fn resolve_quarantine(
        &self,
        id: i64,
        resolution: String,
    ) -> Result<bool, InboxError> {
        self.store()
            .resolve_quarantine(id, self.now_ms(), text::storable(resolution))
            .await
    }

    /// Quarantined requests not yet resolved.
    pub async fn quarantine_held_count(&self) -> Result<i64, InboxError> {
        self.store().quarantine_held_count().await
    }
}
