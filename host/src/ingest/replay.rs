//! Replay as a service: run matching deliveries again and parse held quarantined requests
//! again, for whichever front end asks (the admin API today).
//!
//! Invariants:
//! - One call touches at most `filter.limit` deliveries and quarantined requests together.
//! - A replay naming no handler takes only deliveries of handlers the configuration declares: a
//!   removed instance's are never queued again with nothing to run them.
//! - At most one quarantined body is in memory at a time; a dry run reads none (it counts).
//! - A re-parsed request is accepted (deduped like any other) or, if its parser now refuses or
//!   ignores it, resolved with the parser's reason; one that still cannot be parsed stays held.
//! - A quarantined request leaves quarantine once, whoever races for it (two replays, a replay
//!   and a discard, on one node or several): the store resolves it only while it is held, and
//!   only the call that resolved it counts it.

use crate::{
    Shared,
    ids::SourceName,
    inbox::{Accepted, InboxError, ReplayFilter},
    ingest::{EnvelopeOutcome, envelope},
    text,
};

/// What one replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Deliveries and quarantined requests the filter selected.
    pub matched: usize,
    /// How many were queued again or left quarantine (0 on a dry run).
    pub replayed: usize,
}

/// Why a replay did not run (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The filter names a source that is not configured.
    #[error("unknown source {0:?}")]
    UnknownSource(String),
    /// The filter names a handler no source feeds and no `[plugins]` table declares.
    #[error(
        "unknown handler {0:?}: no source lists it and no [plugins] table declares it (the \
         deliveries of a handler removed from the configuration wait for it: declare it again to \
         run them, or discard them, with state pending or retrying)"
    )]
    UnknownHandler(String),
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

/// Replays what `filter` selects: its deliveries (with no handler named, those of the handlers
/// the configuration declares), then (when it filters by nothing a quarantined request lacks)
/// the held quarantined requests of its source and time range.
pub async fn run(shared: &Shared, mut filter: ReplayFilter) -> Result<ReplayReport, ReplayError> {
    known_names(shared, &filter, false)?;
    if filter.handler.is_none() {
        // Not a removed instance's: nothing would run them (naming one is refused, with advice).
        let declared = shared.config.plugins.keys().map(|name| name.to_string());
        filter.declared_handlers = Some(declared.collect());
    }
    let (mut matched, mut replayed) = shared.inbox.replay(filter.clone()).await?;
    if replayed > 0 {
        tracing::info!(
            source = filter.source.as_deref().unwrap_or("*"),
            handler = filter.handler.as_deref().unwrap_or("*"),
            state = filter
                .state
                .unwrap_or(crate::model::DeliveryState::Dead)
                .as_str(),
            deliveries = replayed,
            "replayed deliveries"
        );
    }

    if filter.covers_quarantine() {
        let dry_run = filter.dry_run;
        let filter = ReplayFilter {
            limit: filter.limit - matched.min(filter.limit),
            ..filter
        };
        if dry_run {
            // Counted in SQL: a dry run reads no body.
            matched += shared.inbox.held_quarantine_count(filter).await?;
        } else {
            let ids = shared.inbox.held_quarantine_ids(filter).await?;
            matched += ids.len();
            let result = reparse(shared, &ids).await;
            // Accepts resolve quarantined rows too: recount once, whatever happened.
            shared.inbox.recount_quarantine().await?;
            replayed += result?.iter().filter(|r| r.left_quarantine()).count();
        }
    }
    Ok(ReplayReport { matched, replayed })
}

/// Refuses a filter naming a source or a handler that is not configured (replay's and
/// discard's check): a typo would otherwise match nothing and look like an empty result. An
/// [orphaned](ReplayFilter::orphaned) handler is known: it has stored deliveries; so is a
/// `removed_source` (see [`removed_source`]).
pub fn known_names(
    shared: &Shared,
    filter: &ReplayFilter,
    removed_source: bool,
) -> Result<(), ReplayError> {
    let config = &shared.config;
    match (&filter.source, &filter.handler) {
        (Some(source), _) if !removed_source && !config.sources.contains_key(source.as_str()) => {
            Err(ReplayError::UnknownSource(source.clone()))
        }
        (_, Some(handler))
            if !filter.orphaned && !config.plugins.contains_key(handler.as_str()) =>
        {
            Err(ReplayError::UnknownHandler(handler.clone()))
        }
        _ => Ok(()),
    }
}

/// Whether `filter` names a handler the configuration no longer declares but deliveries are
/// stored for (a removed or renamed instance): nothing will ever run them, so a discard may
/// close them. A name neither declared nor stored is [`ReplayError::UnknownHandler`], like any
/// typo.
pub async fn orphaned_handler(shared: &Shared, filter: &ReplayFilter) -> Result<bool, ReplayError> {
    let Some(handler) = &filter.handler else {
        return Ok(false);
    };
    if shared.config.plugins.contains_key(handler.as_str()) {
        return Ok(false);
    }
    let stored = crate::inbox::EventFilter {
        handler: Some(handler.clone()),
        ..Default::default()
    };
    if !any_event(shared, stored).await? {
        return Err(ReplayError::UnknownHandler(handler.clone()));
    }
    Ok(true)
}

/// Whether any stored event matches `filter`.
async fn any_event(
    shared: &Shared,
    filter: crate::inbox::EventFilter,
) -> Result<bool, ReplayError> {
    let limit = 1;
    Ok(!shared
        .inbox
        .list_events(crate::inbox::EventFilter { limit, ..filter })
        .await?
        .is_empty())
}

/// Whether `filter` names a source the configuration no longer declares but events or held
/// quarantined requests are stored for (a removed or renamed source): its dead letters and
/// held requests may still be discarded by its name. A name neither declared nor stored is
/// [`ReplayError::UnknownSource`], like any typo.
pub async fn removed_source(shared: &Shared, filter: &ReplayFilter) -> Result<bool, ReplayError> {
    let Some(source) = &filter.source else {
        return Ok(false);
    };
    if shared.config.sources.contains_key(source.as_str()) {
        return Ok(false);
    }
    let events = crate::inbox::EventFilter {
        source: Some(source.clone()),
        ..Default::default()
    };
    let held = ReplayFilter {
        source: Some(source.clone()),
        limit: 1,
        ..Default::default()
    };
    if !any_event(shared, events).await? && shared.inbox.held_quarantine_count(held).await? == 0 {
        return Err(ReplayError::UnknownSource(source.clone()));
    }
    Ok(true)
}

/// What parsing one held quarantined request again came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reparsed {
    /// It became an event: stored now, or a duplicate of a stored one.
    Accepted {
        source: SourceName,
        event_id: String,
        duplicate: bool,
    },
    /// Its parser refuses, ignores or answers it now: resolved without an event, for this
    /// reason.
    Resolved(String),
    /// It still cannot be parsed, for this reason: held as it was.
    Kept(String),
    /// Not held any more (resolved or discarded meanwhile).
    Gone,
}

impl Reparsed {
    /// Whether this call took it out of quarantine.
    pub fn left_quarantine(&self) -> bool {
        matches!(self, Reparsed::Accepted { .. } | Reparsed::Resolved(_))
    }
}

/// Parses the held quarantined request `id` again (the dashboard's replay of one request):
/// matched 1 if it is still held, replayed 1 if it left quarantine; and what became of it.
pub async fn run_held(shared: &Shared, id: i64) -> Result<(ReplayReport, Reparsed), ReplayError> {
    let held = shared.inbox.held_quarantined(id).await?.is_some();
    let result = reparse(shared, &[id]).await;
    shared.inbox.recount_quarantine().await?;
    let outcome = result?.pop().unwrap_or(Reparsed::Gone);
    let report = ReplayReport {
        matched: usize::from(held),
        replayed: usize::from(outcome.left_quarantine()),
    };
    Ok((report, outcome))
}

/// Parses the quarantined requests `ids` again, one at a time (one body in memory at once), and
/// accepts or resolves each; what became of each, in order.
async fn reparse(shared: &Shared, ids: &[i64]) -> Result<Vec<Reparsed>, InboxError> {
    let mut outcomes = Vec::with_capacity(ids.len());
    for &id in ids {
        outcomes.push(reparse_one(shared, id).await?);
    }
    Ok(outcomes)
}

async fn reparse_one(shared: &Shared, id: i64) -> Result<Reparsed, InboxError> {
    // Resolved meanwhile (a concurrent replay) or gone: nothing to do.
    let Some(item) = shared.inbox.held_quarantined(id).await? else {
        return Ok(Reparsed::Gone);
    };
    let Some(source) = shared.config.sources.get(item.source.as_str()) else {
        return Ok(Reparsed::Kept(format!(
            "its source {:?} is not in the configuration",
            item.source.as_str()
        )));
    };
    match envelope(shared, source, &item.request).await {
        EnvelopeOutcome::Envelope(envelope) => {
            let event_id = envelope.event_id.to_string();
            let accepted = shared
                .inbox
                .accept_from(source, envelope, item.request, Some(item.id))
                .await?;
            if accepted == Accepted::AlreadyResolved {
                tracing::debug!(quarantine_id = item.id, "resolved meanwhile; left as it is");
                return Ok(Reparsed::Gone);
            }
            let duplicate = accepted == Accepted::Duplicate;
            tracing::info!(
                source = %source.name, quarantine_id = item.id, event = event_id.as_str(),
                duplicate, "quarantined request replayed"
            );
            // A duplicate of another event's body (its source dedupes by body) stored nothing
            // under this id: nothing to show by it (the held request's resolution names the
            // event it repeats).
            if duplicate
                && source.dedupe_body
                && !shared
                    .inbox
                    .contains_event(source.name.to_string(), event_id.clone())
                    .await?
            {
                return Ok(Reparsed::Resolved(format!(
                    "parsed as {event_id}, a duplicate of the body of a stored event (its source \
                     dedupes by body)"
                )));
            }
            Ok(Reparsed::Accepted {
                source: source.name.clone(),
                event_id,
                duplicate,
            })
        }
        EnvelopeOutcome::Invalid(reason) | EnvelopeOutcome::Ignore(reason) => {
            let reason = text::cap(format!("parser now says: {reason}"), text::MAX_REASON_BYTES);
            resolved(shared, &source.name, item.id, reason).await
        }
        EnvelopeOutcome::Respond(answer) => {
            let reason = format!("parser now answers {} (not an event)", answer.status);
            resolved(shared, &source.name, item.id, reason).await
        }
        EnvelopeOutcome::Quarantine(reason) | EnvelopeOutcome::Overloaded(reason) => {
            tracing::warn!(quarantine_id = item.id, reason, "still cannot parse; kept");
            Ok(Reparsed::Kept(reason))
        }
    }
}

/// Resolves quarantined request `id` without an event if it is still held, and says so in the
/// log: the request was acknowledged once, so leaving quarantine without becoming an event is
/// worth a line. [`Reparsed::Gone`] if another call resolved it first.
async fn resolved(
    shared: &Shared,
    source: &SourceName,
    id: i64,
    reason: String,
) -> Result<Reparsed, InboxError> {
    let escaped = text::escape(&reason).into_owned();
    if !shared.inbox.resolve_quarantine(id, reason.clone()).await? {
        return Ok(Reparsed::Gone);
    }
    tracing::warn!(
        source = %source, quarantine_id = id, reason = %escaped,
        "quarantined request resolved without an event: its parser refuses it now"
    );
    Ok(Reparsed::Resolved(reason))
}
