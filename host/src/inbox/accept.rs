//! A verified request becomes an event: one per `(source, event_id)`, one pending delivery per
//! handler.
//!
//! Invariant: the event, its deliveries and (when it comes from quarantine) the quarantined
//! request's resolution are one store transition; a duplicate `(source, event_id)` (or, for a
//! source that dedupes by body, a duplicate `(source, SHA-256 of the body)`) writes nothing but
//! that resolution, and adds nothing to the backlog; a quarantined request that is no longer
//! held (two replays, or a replay and a discard, racing) writes nothing at all.

use sha2::{Digest, Sha256};

use super::{Inbox, InboxError, RawRequest, store::NewEvent};
use crate::{
    config::SourceConfig,
    ids::{PluginName, SourceName},
    model::Envelope,
};

/// An accept's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Stored now, with its deliveries.
    New,
    /// `(source, event_id)` was already stored (or, for a source that dedupes by body, an
    /// event with the same body): nothing new was written.
    Duplicate,
    /// The quarantined request it came from was resolved meanwhile (by a concurrent replay or
    /// a discard): nothing was written, so a discarded request never becomes an event.
    AlreadyResolved,
}

impl Inbox {
    /// Stores a new event and one pending delivery per handler, or reports a duplicate of its
    /// `(source, event_id)`. `from_quarantine` marks that quarantined request resolved in the
    /// same transaction, and only if it still is held ([`Accepted::AlreadyResolved`]
    /// otherwise).
    pub async fn accept(
        &self,
        source: SourceName,
        envelope: Envelope,
        request: RawRequest,
        handlers: Vec<PluginName>,
        from_quarantine: Option<i64>,
    ) -> Result<Accepted, InboxError> {
        let event = NewEvent {
            source,
            envelope,
            request,
            handlers,
            body_sha256: None,
            from_quarantine,
            now_ms: self.now_ms(),
        };
        self.store_new(event).await
    }

    /// [`Inbox::accept`] for a request of `source`, as its configuration says: one delivery per
    /// handler of it, and with `dedupe_body`, a duplicate also when an event with the same body
    /// is stored for it.
    pub async fn accept_from(
        &self,
        source: &SourceConfig,
        envelope: Envelope,
        request: RawRequest,
        from_quarantine: Option<i64>,
    ) -> Result<Accepted, InboxError> {
        let body_sha256 = source
            .dedupe_body
            .then(|| Sha256::digest(&request.body[..]).into());
        let event = NewEvent {
            source: source.name.clone(),
            envelope,
            request,
            handlers: source.handlers.clone(),
            body_sha256,
            from_quarantine,
            now_ms: self.now_ms(),
        };
        self.store_new(event).await
    }

    async fn store_new(&self, event: NewEvent) -> Result<Accepted, InboxError> {
        let handler_count = event.handlers.len() as i64;
        let accepted = self.store().accept(event).await?;
        if accepted == Accepted::New && handler_count > 0 {
            self.add_backlog(handler_count);
            self.wake_here();
        }
        Ok(accepted)
    }

    /// Whether `(source, event_id)` is stored (lets an overloaded host still answer a
    /// provider's retry of a stored event with `duplicate`, not 503).
    pub async fn contains_event(
        &self,
        source: String,
        event_id: String,
    ) -> Result<bool, InboxError> {
        self.store().contains_event(source, event_id).await
    }

    /// Whether the database answers a trivial read within `within` (`GET /readyz`); else why
    /// not, in words that name no address, user or file (the probe is unauthenticated): the
    /// whole error goes to the log.
    pub async fn ready(&self, within: std::time::Duration) -> Result<(), String> {
        match tokio::time::timeout(within, self.store().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: the database is not ready");
                Err(match e {
                    // The embedded database (one node's file) is not reached over a network: it
                    // is unavailable when its writes fail (a full, failing or stalled disk),
                    // its path leads elsewhere, or a read fails.
                    InboxError::Unavailable(_) if self.store().capabilities().single_node => {
                        "the database is unavailable (the log says why)"
                    }
                    InboxError::Unreachable { .. } | InboxError::Unavailable(_) => {
                        "the database cannot be reached (the log says why)"
                    }
                    InboxError::AuthFailed { .. } => {
                        "the database refused hookd's login (the log says why)"
                    }
                    _ => "the database failed a trivial read (the log says why)",
                }
                .to_owned())
            }
            Err(_) => Err(format!(
                "the database did not answer within {} ms",
                within.as_millis()
            )),
        }
    }
}
