//! Fixtures for the contract suite (and the backends' own tests): an inbox on a fresh database,
//! and events accepted, leased and finished through the inbox's own operations.
//!
//! Invariant: every fixture goes through the façade's public operations (no SQL, nothing of a
//! backend), so a test built on them exercises exactly what dispatch and ingest call, on any
//! backend.

use bytes::Bytes;

use super::Database;
use crate::{
    clock::Clock,
    ids::{EventId, PluginName, SourceName},
    inbox::{Accepted, ClaimRequest, Claimed, EventDetail, Finish, Inbox, RawRequest},
    model::{AttemptOutcome, Disposition, Envelope, StateChanges, StateLimits},
};

/// The one source the fixtures use.
pub(in crate::inbox) const SOURCE: &str = "s";
/// The handler the fixtures deliver to unless told otherwise.
pub(in crate::inbox) const HANDLER: &str = "p";
/// When the fixtures' events are received.
pub(in crate::inbox) const RECEIVED_MS: i64 = 1;
/// When [`lease`] leases.
pub(in crate::inbox) const LEASED_MS: i64 = 10;

/// The inbox on `db`, on the system clock (keep `db` alive as long as the inbox).
pub(in crate::inbox) async fn open(db: &dyn Database) -> Inbox {
    db.open(Clock::system()).await
}

/// An envelope without ordering key.
pub(in crate::inbox) fn event(id: &str) -> Envelope {
    Envelope {
        event_id: EventId::new(id),
        event_type: "t".into(),
        ordering_key: None,
        sequence: None,
    }
}

/// An envelope ordered under `key` at `sequence`.
pub(in crate::inbox) fn keyed(id: &str, key: &str, sequence: u64) -> Envelope {
    Envelope {
        ordering_key: Some(key.into()),
        sequence: Some(sequence),
        ..event(id)
    }
}

/// A stored request with no headers and an empty JSON body.
pub(in crate::inbox) fn request() -> RawRequest {
    RawRequest {
        headers: Vec::new(),
        body: Bytes::from_static(b"{}"),
        received_at_ms: RECEIVED_MS,
    }
}

/// Accepts `envelope` from [`SOURCE`] for [`HANDLER`].
pub(in crate::inbox) async fn accept(inbox: &Inbox, envelope: Envelope) -> Accepted {
    accept_from(inbox, envelope, None).await
}

/// Accepts `envelope` as [`accept`] does, parsed from quarantined request `from` if given.
pub(in crate::inbox) async fn accept_from(
    inbox: &Inbox,
    envelope: Envelope,
    from: Option<i64>,
) -> Accepted {
    let handlers = vec![PluginName::new(HANDLER)];
    inbox
        .accept(SourceName::new(SOURCE), envelope, request(), handlers, from)
        .await
        .unwrap()
}

/// [`SOURCE`] as configured with `dedupe_body` (`dedupes`) or not, delivering to [`HANDLER`].
pub(in crate::inbox) fn source(dedupes: bool) -> std::sync::Arc<crate::config::SourceConfig> {
    let text = format!(
        "[sources.{SOURCE}]\nscheme = \"none\"\nhandlers = [\"{HANDLER}\"]\n\
         dedupe_body = {dedupes}\n"
    );
    let config = crate::config::Config::parse(&text, std::path::Path::new("/"), &|_| None)
        .expect("the fixtures' source");
    std::sync::Arc::clone(&config.sources[&SourceName::new(SOURCE)])
}

/// Accepts `envelope` with `body` from [`source`]`(dedupes)`, as ingest does.
pub(in crate::inbox) async fn accept_body(
    inbox: &Inbox,
    dedupes: bool,
    envelope: Envelope,
    body: &'static [u8],
) -> Accepted {
    accept_body_from(inbox, dedupes, envelope, body, None).await
}

/// [`accept_body`], parsed from quarantined request `from` if given.
pub(in crate::inbox) async fn accept_body_from(
    inbox: &Inbox,
    dedupes: bool,
    envelope: Envelope,
    body: &'static [u8],
    from: Option<i64>,
) -> Accepted {
    let request = RawRequest {
        body: Bytes::from_static(body),
        ..request()
    };
    inbox
        .accept_from(&source(dedupes), envelope, request, from)
        .await
        .unwrap()
}

/// Asserts that `inbox`'s backlog is `expected`. A store several nodes share is asserted by
/// its database's own count: the façade's follows it only give or take a resample (one can
/// land between an operation's commit and the façade's count of it, and with paused time
/// resamples fire at every database wait), which is what the backlog bound needs and all
/// a shared façade promises.
pub(in crate::inbox) async fn assert_backlog(inbox: &Inbox, expected: i64) {
    if inbox.inner.shared.is_some() {
        let counts = inbox.store().counts().await.unwrap();
        assert_eq!(counts.backlog, expected, "the database's count");
    } else {
        assert_eq!(inbox.backlog(), expected);
    }
}

/// Quarantines a request from [`SOURCE`] (its parser trapped) while fewer than `max_held` are
/// held; its id, or `None` when the quarantine is full.
pub(in crate::inbox) async fn quarantine(inbox: &Inbox, max_held: u64) -> Option<i64> {
    inbox
        .quarantine(
            SourceName::new(SOURCE),
            request(),
            "parser trapped".into(),
            max_held,
        )
        .await
        .unwrap()
}

/// A claim at `now_ms` of up to `limit` deliveries, of the handlers in `capacity` (each with
/// its room), with default leases and fairness.
pub(in crate::inbox) fn claim_request(
    now_ms: i64,
    limit: usize,
    capacity: &[(&str, usize)],
) -> ClaimRequest {
    ClaimRequest {
        caps: Default::default(),
        now_ms,
        limit,
        capacity: capacity
            .iter()
            .map(|(handler, room)| (handler.to_string(), *room))
            .collect(),
        lease_ms: Default::default(),
        fairness: Default::default(),
        deliver_stale: Default::default(),
    }
}

/// Leases what of [`HANDLER`] is due at `now_ms` (up to 8).
pub(in crate::inbox) async fn claim(inbox: &Inbox, now_ms: i64) -> Vec<Claimed> {
    inbox
        .claim(claim_request(now_ms, 8, &[(HANDLER, 8)]))
        .await
        .unwrap()
}

/// Accepts event `id` for [`HANDLER`] and leases its delivery at [`LEASED_MS`] (nothing else of
/// [`HANDLER`] may be due then).
pub(in crate::inbox) async fn lease(inbox: &Inbox, id: &str) -> Claimed {
    accept(inbox, event(id)).await;
    let mut claimed = inbox
        .claim(claim_request(LEASED_MS, 1, &[(HANDLER, 1)]))
        .await
        .unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(ids, [id], "{id} leased, and nothing else");
    claimed.remove(0)
}

/// Accepts `n` events (`e0`, `e1`, …) for [`HANDLER`] and leases them all in one claim at
/// [`LEASED_MS`].
pub(in crate::inbox) async fn lease_many(inbox: &Inbox, n: usize) -> Vec<Claimed> {
    for i in 0..n {
        accept(inbox, event(&format!("e{i}"))).await;
    }
    let claimed = inbox
        .claim(claim_request(LEASED_MS, n, &[(HANDLER, n)]))
        .await
        .unwrap();
    assert_eq!(claimed.len(), n);
    claimed
}

/// The record of attempt `attempt` of delivery `delivery_id`, run by `handler` and finished at
/// `at_ms` with `disposition` (its outcome follows: ok, retry or permanent), no state writes.
pub(in crate::inbox) fn record(
    delivery_id: i64,
    attempt: u32,
    handler: &str,
    disposition: Disposition,
    at_ms: i64,
) -> Finish {
    let outcome = match disposition {
        Disposition::Done { .. } => AttemptOutcome::Ok,
        Disposition::RetryAt { .. } => AttemptOutcome::Retry,
        Disposition::Dead => AttemptOutcome::Permanent,
    };
    Finish {
        delivery_id,
        attempt,
        started_at_ms: at_ms,
        finished_at_ms: at_ms,
        outcome,
        error_kind: None,
        error: None,
        plugin_sha256: None,
        disposition,
        plugin: PluginName::new(handler),
        state: StateChanges::default(),
        uncounted: false,
    }
}

/// Accepts event `id` and leases it once: its first attempt fails for good.
pub(in crate::inbox) async fn dead_letter(inbox: &Inbox, id: &str) {
    let claimed = lease(inbox, id).await;
    inbox
        .finish(finished(&claimed, Disposition::Dead))
        .await
        .unwrap();
}

/// `claim` finished with `disposition` just after it was leased.
pub(in crate::inbox) fn finished(claim: &Claimed, disposition: Disposition) -> Finish {
    record(
        claim.delivery_id,
        claim.attempt,
        claim.handler.as_str(),
        disposition,
        claim.leased_at_ms + 1,
    )
}

/// `claim` done, with `state` as its state traffic.
pub(in crate::inbox) fn done(claim: &Claimed, state: StateChanges) -> Finish {
    Finish {
        state,
        ..finished(claim, Disposition::Done { output: None })
    }
}

/// Event `id` from [`SOURCE`] as the admin API shows it.
pub(in crate::inbox) async fn detail(inbox: &Inbox, id: &str) -> EventDetail {
    inbox
        .event_detail(SOURCE.into(), id.into())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("event {id} is stored"))
}

/// The state of event `id`'s one delivery.
pub(in crate::inbox) async fn state_of(inbox: &Inbox, id: &str) -> String {
    detail(inbox, id).await.deliveries[0].state.clone()
}

/// State traffic for [`HANDLER`] that read each key of `writes` at its committed version and
/// writes it (`Some(len)`: `len` bytes) or deletes it (`None`), held to `limits`.
pub(in crate::inbox) fn state_writes(
    inbox: &Inbox,
    writes: &[(&str, Option<usize>)],
    limits: StateLimits,
) -> StateChanges {
    let mut changes = StateChanges {
        limits,
        ..Default::default()
    };
    for (key, len) in writes {
        let (_, version) = inbox.state_stat_blocking(HANDLER, key).unwrap();
        changes.versions.insert(key.to_string(), version);
        changes
            .writes
            .insert(key.to_string(), len.map(|len| vec![7; len]));
    }
    changes
}
