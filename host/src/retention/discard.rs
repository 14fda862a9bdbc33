//! Discard as a service: close dead deliveries (`discarded`) and held quarantined requests
//! (resolved as discarded) for whichever front end asks (the admin API, and the dashboard's
//! discard buttons).
//!
//! Invariants:
//! - It takes replay's filter and refusals (an unknown source, a state other than `dead`), and
//!   one call touches at most `filter.limit` deliveries and quarantined requests together. A
//!   handler the configuration no longer declares, with deliveries stored, is no unknown name
//!   here: its waiting (`pending`, `retrying`) deliveries can be discarded, since nothing will
//!   run them. Nor is a source the configuration no longer declares, with events or held
//!   quarantined requests stored: its dead letters and held requests can be discarded by name.
//! - Held quarantined requests are discarded only when the filter names nothing they lack
//!   (handler, state, event ids), exactly as replay re-parses them.
//! - One held quarantined request can also be discarded by its id ([`run_held`]): resolved only
//!   while it is held, so a replay or discard racing it counts it once.
//! - Every discard that changed something is logged: what and how many, never a payload.

use crate::{
    Shared,
    inbox::{DISCARDED_RESOLUTION, ReplayFilter},
    ingest::replay::{ReplayError, known_names, orphaned_handler, removed_source},
};

/// What one discard did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiscardReport {
    /// Dead deliveries and held quarantined requests the filter selected.
    pub matched: usize,
    /// How many were closed (0 on a dry run).
    pub discarded: usize,
}

/// Discards what `filter` selects: its dead deliveries, then (when it filters by nothing a
/// quarantined request lacks) the held quarantined requests of its source and time range.
pub async fn run(shared: &Shared, mut filter: ReplayFilter) -> Result<DiscardReport, ReplayError> {
    filter.orphaned = orphaned_handler(shared, &filter).await?;
    let removed = removed_source(shared, &filter).await?;
    known_names(shared, &filter, removed)?;
    let (deliveries, closed) = shared.inbox.discard(filter.clone()).await?;
    let (mut held, mut resolved) = (0, 0);
    if filter.covers_quarantine() {
        let rest = ReplayFilter {
            limit: filter.limit - deliveries.min(filter.limit),
            ..filter.clone()
        };
        (held, resolved) = shared.inbox.discard_quarantine(rest).await?;
    }
    if closed + resolved > 0 {
        tracing::info!(
            source = filter.source.as_deref().unwrap_or("*"),
            handler = filter.handler.as_deref().unwrap_or("*"),
            deliveries = closed,
            quarantined = resolved,
            "discarded dead deliveries and held quarantined requests"
        );
    }
    Ok(DiscardReport {
        matched: deliveries + held,
        discarded: closed + resolved,
    })
}

/// Discards the held quarantined request `id` (the dashboard's discard of one request):
/// matched and discarded 1 if it was held and is now resolved as discarded, 0 if it was not
/// held (no such request, or replayed or discarded already).
pub async fn run_held(shared: &Shared, id: i64) -> Result<DiscardReport, ReplayError> {
    let resolved = shared
        .inbox
        .resolve_quarantine(id, DISCARDED_RESOLUTION.to_owned())
        .await?;
    if resolved {
        shared.inbox.recount_quarantine().await?;
        tracing::info!(
            quarantine_id = id,
            quarantined = 1,
            "discarded a held quarantined request"
        );
    }
    let n = usize::from(resolved);
    Ok(DiscardReport {
        matched: n,
        discarded: n,
    })
}
