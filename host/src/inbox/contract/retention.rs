//! The contract's retention and discard cases: what pruning takes and keeps (the compact row
//! still dedupes, staleness is still decided), what it never touches (dead deliveries, held
//! quarantine, unfinished events), forgetting after `dedupe_for`, discard. Time is moved with
//! tokio's paused clock, which the inbox reads through [`Clock::tokio`].

use std::time::Duration;

use super::{
    Database,
    fixtures::{self, HANDLER, LEASED_MS, SOURCE, accept, claim, detail, event, keyed, state_of},
};
use crate::{
    clock::Clock,
    config::Retention,
    ids::{PluginName, SourceName},
    inbox::{Accepted, Claimed, Inbox, InboxError, Pruned, ReplayFilter},
    model::{DeliveryState, Disposition},
};

const HOUR: Duration = Duration::from_secs(3600);

/// Payloads kept an hour after the work finished, ids forever, batches of 100.
fn an_hour() -> Retention {
    Retention {
        done_after: Some(HOUR),
        dedupe_for: None,
        interval: Duration::from_secs(1),
        batch_size: 100,
    }
}

/// An inbox on `db` whose clock is tokio's, paused: only `advance` moves it (and, on a store
/// that waits on I/O, whatever timers fire meanwhile: seconds, never hours).
async fn paused(db: &dyn Database) -> (Inbox, Clock) {
    tokio::time::pause();
    let clock = Clock::tokio();
    (db.open(clock.clone()).await, clock)
}

/// Leases `claimed`'s delivery ended `disposition` now, by `clock`.
async fn finish_now(inbox: &Inbox, clock: &Clock, claimed: &Claimed, disposition: Disposition) {
    let record = fixtures::record(
        claimed.delivery_id,
        claimed.attempt,
        claimed.handler.as_str(),
        disposition,
        clock.now_ms(),
    );
    inbox.finish(record).await.unwrap();
}

/// Accepts `envelope` and runs it to `disposition` now, by `clock`.
async fn run_to(
    inbox: &Inbox,
    clock: &Clock,
    envelope: crate::model::Envelope,
    disposition: Disposition,
) {
    let id = envelope.event_id.to_string();
    accept(inbox, envelope).await;
    let claimed = claim(inbox, LEASED_MS).await;
    let leased: Vec<&str> = claimed.iter().map(|c| c.event_id.as_str()).collect();
    assert_eq!(leased, [id.as_str()]);
    finish_now(inbox, clock, &claimed[0], disposition).await;
}

fn done() -> Disposition {
    Disposition::Done {
        output: Some("{\"ok\":true}".into()),
    }
}

/// Prunes with `rules` until a round is over (one batch, or more for a walk that was cut).
async fn prune_all(inbox: &Inbox, rules: &Retention) -> Pruned {
    let mut total = Pruned::default();
    let mut after = None;
    loop {
        let batch = inbox.prune(rules, after).await.unwrap();
        total.events += batch.events;
        total.forgotten += batch.forgotten;
        total.quarantine += batch.quarantine;
        if !batch.more(rules.batch_size) {
            return total;
        }
        after = batch.next;
    }
}

/// Dead deliveries (up to 100).
fn dead() -> ReplayFilter {
    ReplayFilter {
        limit: 100,
        ..Default::default()
    }
}

pub(super) async fn a_finished_event_keeps_its_payload_until_done_after(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), done()).await;
    tokio::time::advance(HOUR / 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 0);
    let kept = detail(&inbox, "a").await;
    assert_eq!(kept.pruned_at, None);
    assert_eq!(kept.deliveries[0].history.len(), 1);
    assert!(kept.deliveries[0].output.is_some());
}

pub(super) async fn a_pruned_event_keeps_its_id_and_states_but_not_its_payload(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), done()).await;
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 1);
    let pruned = detail(&inbox, "a").await;
    assert!(pruned.pruned_at.is_some(), "{pruned:?}");
    let delivery = &pruned.deliveries[0];
    assert_eq!(
        (
            delivery.state.as_str(),
            delivery.attempts,
            delivery.output.as_deref()
        ),
        ("done", 1, None)
    );
    assert!(delivery.history.is_empty(), "{:?}", delivery.history);
}

pub(super) async fn a_pruned_event_still_dedupes(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), done()).await;
    tokio::time::advance(HOUR * 2).await;
    prune_all(&inbox, &an_hour()).await;
    assert_eq!(accept(&inbox, event("a")).await, Accepted::Duplicate);
    fixtures::assert_backlog(&inbox, 0).await;
}

pub(super) async fn an_older_sequence_is_still_stale_after_the_newer_one_was_pruned(
    db: &dyn Database,
) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, keyed("newer", "k", 5), done()).await;
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 1);
    accept(&inbox, keyed("older", "k", 4)).await;
    assert!(claim(&inbox, clock.now_ms()).await.is_empty());
    assert_eq!(state_of(&inbox, "older").await, "stale");
}

pub(super) async fn a_pruned_id_is_forgotten_after_dedupe_for(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    let rules = Retention {
        dedupe_for: Some(HOUR),
        ..an_hour()
    };
    run_to(&inbox, &clock, event("a"), done()).await;
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &rules).await.events, 1);
    tokio::time::advance(HOUR / 2).await;
    assert_eq!(prune_all(&inbox, &rules).await.forgotten, 0);
    assert_eq!(accept(&inbox, event("a")).await, Accepted::Duplicate);
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &rules).await.forgotten, 1);
    let gone = inbox.event_detail(SOURCE.into(), "a".into()).await.unwrap();
    assert!(gone.is_none(), "{gone:?}");
    assert_eq!(accept(&inbox, event("a")).await, Accepted::New);
}

pub(super) async fn dead_deliveries_and_held_quarantine_are_never_pruned(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), Disposition::Dead).await;
    inbox
        .quarantine(
            SourceName::new(SOURCE),
            fixtures::request(),
            "parser trapped".into(),
            10,
        )
        .await
        .unwrap()
        .unwrap();
    tokio::time::advance(HOUR * 24 * 365).await;
    let rules = Retention {
        dedupe_for: Some(Duration::ZERO),
        ..an_hour()
    };
    let pruned = prune_all(&inbox, &rules).await;
    assert_eq!(
        (pruned.events, pruned.forgotten, pruned.quarantine),
        (0, 0, 0)
    );
    let kept = detail(&inbox, "a").await;
    assert_eq!(
        (kept.pruned_at, kept.deliveries[0].history.len()),
        (None, 1)
    );
    assert_eq!(inbox.quarantine_held_count().await.unwrap(), 1);
}

pub(super) async fn an_event_is_pruned_only_once_every_delivery_is_finished(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    let handlers = vec![PluginName::new("x"), PluginName::new("y")];
    inbox
        .accept(
            SourceName::new(SOURCE),
            event("a"),
            fixtures::request(),
            handlers,
            None,
        )
        .await
        .unwrap();
    let x = inbox
        .claim(fixtures::claim_request(LEASED_MS, 1, &[("x", 1)]))
        .await
        .unwrap();
    finish_now(&inbox, &clock, &x[0], done()).await;
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 0);
    let y = inbox
        .claim(fixtures::claim_request(LEASED_MS, 1, &[("y", 1)]))
        .await
        .unwrap();
    finish_now(&inbox, &clock, &y[0], done()).await;
    tokio::time::advance(HOUR / 2).await;
    // x finished long ago, y only half an hour ago: the event is kept for y's sake.
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 0);
    tokio::time::advance(HOUR).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 1);
}

pub(super) async fn a_pruned_event_is_not_replayed(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), done()).await;
    tokio::time::advance(HOUR * 2).await;
    prune_all(&inbox, &an_hour()).await;
    let done_ones = ReplayFilter {
        state: Some(DeliveryState::Done),
        ..dead()
    };
    assert_eq!(inbox.replay(done_ones).await.unwrap(), (0, 0));
    assert_eq!(state_of(&inbox, "a").await, "done");
}

pub(super) async fn pruning_walks_in_batches_of_batch_size(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    for id in ["a", "b", "c"] {
        run_to(&inbox, &clock, event(id), done()).await;
    }
    tokio::time::advance(HOUR * 2).await;
    let rules = Retention {
        batch_size: 2,
        ..an_hour()
    };
    // A batch stops at `batch_size` events, or sooner at its time budget (real time, 1 ms on
    // a single-writer store, which a loaded machine can use up on one event).
    let first = inbox.prune(&rules, None).await.unwrap();
    assert!(first.events <= 2, "{first:?}");
    assert!(first.more(2) && first.next.is_some(), "{first:?}");
    let (mut pruned, mut next) = (first.events, first.next);
    while next.is_some() {
        let batch = inbox.prune(&rules, next).await.unwrap();
        assert!(batch.events <= 2, "{batch:?}");
        (pruned, next) = (pruned + batch.events, batch.next);
    }
    assert_eq!(pruned, 3);
}

pub(super) async fn a_discarded_delivery_is_pruned_like_finished_work(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), Disposition::Dead).await;
    assert_eq!(inbox.discard(dead()).await.unwrap(), (1, 1));
    assert_eq!(state_of(&inbox, "a").await, "discarded");
    fixtures::assert_backlog(&inbox, 0).await;
    tokio::time::advance(HOUR / 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 0);
    tokio::time::advance(HOUR).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 1);
}

pub(super) async fn discard_takes_only_dead_deliveries(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    run_to(&inbox, &clock, event("a"), done()).await;
    for state in [
        DeliveryState::Done,
        DeliveryState::Stale,
        DeliveryState::Pending,
    ] {
        let filter = ReplayFilter {
            state: Some(state),
            ..dead()
        };
        let refused = inbox.discard(filter).await;
        assert!(
            matches!(refused, Err(InboxError::InvalidFilter(_))),
            "{state}: {refused:?}"
        );
    }
    run_to(&inbox, &clock, event("b"), Disposition::Dead).await;
    let dry = ReplayFilter {
        dry_run: true,
        ..dead()
    };
    assert_eq!(inbox.discard(dry).await.unwrap(), (1, 0));
    assert_eq!(
        (state_of(&inbox, "a").await, state_of(&inbox, "b").await),
        ("done".to_owned(), "dead".to_owned())
    );
}

/// A handler the configuration no longer declares leaves deliveries nothing will run: for
/// such an orphaned handler (the service decides), a discard closes the waiting ones, and the
/// backlog they held is freed; for any other, it still refuses them.
pub(super) async fn the_waiting_deliveries_of_an_orphaned_handler_can_be_discarded(
    db: &dyn Database,
) {
    let (inbox, _clock) = paused(db).await;
    accept(&inbox, event("a")).await;
    accept(&inbox, event("b")).await;
    fixtures::assert_backlog(&inbox, 2).await;
    let waiting = |orphaned| ReplayFilter {
        handler: Some(HANDLER.into()),
        state: Some(DeliveryState::Pending),
        orphaned,
        ..dead()
    };
    let refused = inbox.discard(waiting(false)).await;
    assert!(
        matches!(refused, Err(InboxError::InvalidFilter(_))),
        "{refused:?}"
    );
    let dry = ReplayFilter {
        dry_run: true,
        ..waiting(true)
    };
    assert_eq!(inbox.discard(dry).await.unwrap(), (2, 0));
    assert_eq!(inbox.discard(waiting(true)).await.unwrap(), (2, 2));
    assert_eq!(state_of(&inbox, "a").await, "discarded");
    fixtures::assert_backlog(&inbox, 0).await;
    let running = ReplayFilter {
        state: Some(DeliveryState::Running),
        ..waiting(true)
    };
    let refused = inbox.discard(running).await;
    assert!(
        matches!(refused, Err(InboxError::InvalidFilter(_))),
        "{refused:?}"
    );
}

pub(super) async fn a_discarded_quarantined_request_is_resolved_then_deleted(db: &dyn Database) {
    let (inbox, _clock) = paused(db).await;
    let id = fixtures::quarantine(&inbox, 10).await.unwrap();
    let dry = ReplayFilter {
        dry_run: true,
        ..dead()
    };
    assert_eq!(inbox.discard_quarantine(dry).await.unwrap(), (1, 0));
    assert_eq!(inbox.discard_quarantine(dead()).await.unwrap(), (1, 1));
    assert!(inbox.held_quarantined(id).await.unwrap().is_none());
    assert_eq!(inbox.quarantine_held(), 0);
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.quarantine, 1);
}

/// A quarantined request accepted long after it was received is resolved now, so retention
/// keeps it for `done_after` from its resolution. Resolved at its receive time, it was
/// deleted by the next prune.
pub(super) async fn a_request_accepted_from_quarantine_is_kept_from_its_resolution(
    db: &dyn Database,
) {
    let (inbox, _clock) = paused(db).await;
    let id = fixtures::quarantine(&inbox, 10).await.unwrap();
    tokio::time::advance(HOUR * 2).await;
    let accepted = fixtures::accept_from(&inbox, event("late"), Some(id)).await;
    assert_eq!(accepted, Accepted::New);
    assert_eq!(prune_all(&inbox, &an_hour()).await.quarantine, 0);
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.quarantine, 1);
}

/// An event handled once, replayed, dead and discarded still makes an older event of its key
/// stale after its prune: the prune keeps the `ok` attempt that says it was handled. When it
/// dropped every attempt, the older event was leased.
pub(super) async fn once_done_then_discarded_and_pruned_still_makes_older_stale(db: &dyn Database) {
    let (inbox, clock) = paused(db).await;
    once_done_then_discarded(&inbox, &clock).await;
    tokio::time::advance(HOUR * 2).await;
    assert_eq!(prune_all(&inbox, &an_hour()).await.events, 1);
    accept(&inbox, keyed("older", "k", 4)).await;
    let claimed = claim(&inbox, clock.now_ms()).await;
    assert!(
        claimed.is_empty(),
        "older (4) was leased after newer (5, handled) was pruned"
    );
    assert_eq!(state_of(&inbox, "older").await, "stale");
    // The attempt the prune kept does not stop the id from being forgotten after
    // `dedupe_for` (it references its delivery, which goes with it).
    let rules = Retention {
        dedupe_for: Some(HOUR),
        ..an_hour()
    };
    tokio::time::advance(HOUR * 2).await;
    let pruned = prune_all(&inbox, &rules).await;
    assert_eq!(pruned.forgotten, 1, "{pruned:?}");
    let gone = inbox.event_detail(SOURCE.into(), "newer".into()).await;
    assert!(gone.unwrap().is_none());
}

async fn once_done_then_discarded(inbox: &Inbox, clock: &Clock) {
    run_to(inbox, clock, keyed("newer", "k", 5), done()).await;
    let replay = ReplayFilter {
        state: Some(DeliveryState::Done),
        ..dead()
    };
    assert_eq!(inbox.replay(replay).await.unwrap(), (1, 1));
    let again = claim(inbox, clock.now_ms()).await;
    assert_eq!(again.len(), 1);
    finish_now(inbox, clock, &again[0], Disposition::Dead).await;
    assert_eq!(inbox.discard(dead()).await.unwrap(), (1, 1));
    assert_eq!(state_of(inbox, "newer").await, "discarded");
}
