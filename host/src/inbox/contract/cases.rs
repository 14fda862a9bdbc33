//! The contract's cases: properties of the inbox checked through its public operations on a
//! fresh database of the backend under test: ordering heads, staleness, state conflicts,
//! attempt budgets, reclaim, dedupe, replay, quarantine bookkeeping and the admin reads. One
//! property per case; `contract::suite!` makes each a test per backend.

use super::{
    Database,
    fixtures::{
        self, HANDLER, LEASED_MS, SOURCE, accept, accept_from, claim, dead_letter, detail, done,
        event, finished, keyed, lease, quarantine, state_of,
    },
};
pub(super) use super::{retention::*, state::*, upgrade::*};
use crate::{
    clock::Clock,
    ids::{PluginName, SourceName},
    inbox::{
        Accepted, ClaimRequest, Claimed, EventFilter, Finish, Finished, Inbox, InboxError,
        ReplayFilter, StateKeyFilter,
    },
    model::{AttemptOutcome, DeliveryState, Disposition, StateChanges, StateLimits, StateUsage},
};

/// What a claim leased, by event id.
fn ids(claimed: &[Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.event_id.to_string()).collect()
}

/// State traffic that read `key` at `version` and writes one byte to it.
fn write_after_reading(key: &str, version: i64) -> StateChanges {
    StateChanges {
        versions: [(key.to_owned(), version)].into(),
        writes: [(key.to_owned(), Some(vec![1]))].into(),
        ..Default::default()
    }
}

/// Dead deliveries (up to 100): what a replay takes by default.
fn dead() -> ReplayFilter {
    ReplayFilter {
        limit: 100,
        ..Default::default()
    }
}

/// Accepts `newer` (key `k`, sequence 5) and runs it to done, then accepts `older` (sequence 4).
async fn older_after_newer_done(inbox: &Inbox) {
    accept(inbox, keyed("newer", "k", 5)).await;
    let newer = claim(inbox, LEASED_MS).await.remove(0);
    let record = finished(&newer, Disposition::Done { output: None });
    inbox.finish(record).await.unwrap();
    accept(inbox, keyed("older", "k", 4)).await;
}

/// Leases `a` and `b`, which both read state key `k` while absent; `a` commits a write to it
/// first. Returns `b`'s lease.
async fn both_read_then_a_writes(inbox: &Inbox) -> Claimed {
    let a = lease(inbox, "a").await;
    let b = lease(inbox, "b").await;
    let a_writes = done(&a, write_after_reading("k", 0));
    assert_eq!(inbox.finish(a_writes).await.unwrap(), Finished::Recorded);
    b
}

/// Never retries, whoever asks.
fn give_up(_: &str, _: u32) -> Disposition {
    Disposition::Dead
}

pub(super) async fn a_later_sequence_waits_for_its_head(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("second", "k", 2)).await;
    accept(&inbox, keyed("first", "k", 1)).await;
    assert_eq!(ids(&claim(&inbox, LEASED_MS).await), ["first"]);
}

pub(super) async fn a_running_head_blocks_its_key(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("first", "k", 1)).await;
    claim(&inbox, LEASED_MS).await;
    accept(&inbox, keyed("second", "k", 2)).await;
    assert!(claim(&inbox, LEASED_MS).await.is_empty());
}

pub(super) async fn a_head_waiting_for_its_retry_blocks_its_key(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("first", "k", 1)).await;
    let head = claim(&inbox, LEASED_MS).await.remove(0);
    let later = Disposition::RetryAt { at_ms: 1_000_000 };
    inbox.finish(finished(&head, later)).await.unwrap();
    accept(&inbox, keyed("second", "k", 2)).await;
    assert!(claim(&inbox, LEASED_MS + 5).await.is_empty());
}

pub(super) async fn another_key_is_not_blocked_by_a_running_head(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("k1", "k", 1)).await;
    claim(&inbox, LEASED_MS).await;
    accept(&inbox, keyed("j1", "j", 1)).await;
    assert_eq!(ids(&claim(&inbox, LEASED_MS).await), ["j1"]);
}

pub(super) async fn what_waits_behind_a_long_backlog_of_a_running_key_is_claimed(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    // More due deliveries of the busy key than any claim looks at before walking the keys.
    for n in 0..200 {
        accept(&inbox, keyed(&format!("k{n}"), "k", n)).await;
    }
    accept(&inbox, keyed("j0", "j", 0)).await;
    accept(&inbox, event("u0")).await;
    let first = inbox
        .claim(fixtures::claim_request(LEASED_MS, 1, &[(HANDLER, 1)]))
        .await
        .unwrap();
    assert_eq!(ids(&first), ["k0"]);
    assert_eq!(ids(&claim(&inbox, LEASED_MS).await), ["j0", "u0"]);
}

pub(super) async fn an_older_sequence_than_one_done_is_never_claimed(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    assert!(claim(&inbox, LEASED_MS + 5).await.is_empty());
}

pub(super) async fn an_older_sequence_than_one_done_becomes_stale(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    claim(&inbox, LEASED_MS + 5).await;
    assert_eq!(state_of(&inbox, "older").await, "stale");
}

pub(super) async fn a_handler_delivering_stale_events_is_given_the_older_one_marked(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    let request = ClaimRequest {
        caps: Default::default(),
        deliver_stale: [HANDLER.to_owned()].into(),
        ..fixtures::claim_request(LEASED_MS + 5, 8, &[(HANDLER, 8)])
    };
    let claimed = inbox.claim(request).await.unwrap();
    assert_eq!(ids(&claimed), ["older"]);
    assert!(claimed[0].stale);
    assert_eq!(state_of(&inbox, "older").await, "running");
}

pub(super) async fn a_fresh_delivery_is_not_marked_stale(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("first", "k", 5)).await;
    let claimed = claim(&inbox, LEASED_MS).await;
    assert_eq!(ids(&claimed), ["first"]);
    assert!(!claimed[0].stale);
}

pub(super) async fn a_forced_replay_delivers_a_stale_delivery_and_a_plain_one_does_not(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    claim(&inbox, LEASED_MS + 5).await;
    let stale = |force| ReplayFilter {
        state: Some(DeliveryState::Stale),
        force,
        ..dead()
    };
    assert_eq!(inbox.replay(stale(false)).await.unwrap(), (1, 1));
    assert!(claim(&inbox, Clock::system().now_ms()).await.is_empty());
    assert_eq!(state_of(&inbox, "older").await, "stale");

    assert_eq!(inbox.replay(stale(true)).await.unwrap(), (1, 1));
    let claimed = claim(&inbox, Clock::system().now_ms()).await;
    assert_eq!(ids(&claimed), ["older"]);
    assert!(claimed[0].stale);
}

/// A done delivery replayed (by an operator) is not `done` until its replay is: it was handled
/// all the same, so an older event of its key arriving while the replay waits, retries or has
/// gone dead is stale. Before, only deliveries `done` now counted, and the older snapshot won.
pub(super) async fn a_done_delivery_replayed_into_a_dead_end_still_makes_older_ones_stale(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, keyed("newer", "k", 5)).await;
    let newer = claim(&inbox, LEASED_MS).await.remove(0);
    inbox
        .finish(finished(&newer, Disposition::Done { output: None }))
        .await
        .unwrap();
    let done = ReplayFilter {
        state: Some(DeliveryState::Done),
        ..dead()
    };
    assert_eq!(inbox.replay(done).await.unwrap(), (1, 1));
    let replayed = claim(&inbox, Clock::system().now_ms()).await.remove(0);
    inbox
        .finish(finished(&replayed, Disposition::Dead))
        .await
        .unwrap();
    assert_eq!(state_of(&inbox, "newer").await, "dead");
    accept(&inbox, keyed("older", "k", 4)).await;
    assert!(claim(&inbox, Clock::system().now_ms()).await.is_empty());
    assert_eq!(state_of(&inbox, "older").await, "stale");
}

/// A claim marks a bounded number of stale heads (each hands its key on to the next
/// delivery); one that marked any wakes this node's dispatcher to claim again at once, so an
/// event behind many superseded ones of its key does not wait for the next idle poll each time.
pub(super) async fn a_claim_that_marked_a_head_stale_wakes_the_dispatcher(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    let wait = std::time::Duration::from_secs(1);
    // The wake-ups the accepts and the finish left.
    while tokio::time::timeout(wait, inbox.work_arrived())
        .await
        .is_ok()
    {}
    assert!(claim(&inbox, LEASED_MS + 5).await.is_empty());
    assert_eq!(state_of(&inbox, "older").await, "stale");
    assert!(
        tokio::time::timeout(wait, inbox.work_arrived())
            .await
            .is_ok(),
        "the dispatcher was left asleep"
    );
}

pub(super) async fn a_stale_delivery_leaves_the_backlog(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    older_after_newer_done(&inbox).await;
    claim(&inbox, LEASED_MS + 5).await;
    fixtures::assert_backlog(&inbox, 0).await;
}

pub(super) async fn the_second_of_two_attempts_writing_one_key_conflicts(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let b = both_read_then_a_writes(&inbox).await;
    let second = inbox.finish(done(&b, write_after_reading("k", 0))).await;
    assert_eq!(second.unwrap(), Finished::Conflict);
}

pub(super) async fn a_conflicted_attempt_runs_again_without_using_its_budget(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let b = both_read_then_a_writes(&inbox).await;
    inbox
        .finish(done(&b, write_after_reading("k", 0)))
        .await
        .unwrap();
    let again = claim(&inbox, LEASED_MS + 5).await.remove(0);
    assert_eq!(
        (again.event_id.as_str(), again.attempt, again.budget_used),
        ("b", 2, 1)
    );
}

/// An attempt the host gave back before its handler ran (its plugin unloaded between the claim
/// and the call) is recorded, and due again with its budget as it was.
pub(super) async fn an_attempt_given_back_runs_again_without_using_its_budget(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    let given_back = Finish {
        outcome: AttemptOutcome::Abandoned,
        uncounted: true,
        ..finished(
            &claimed,
            Disposition::RetryAt {
                at_ms: LEASED_MS + 2,
            },
        )
    };
    assert_eq!(inbox.finish(given_back).await.unwrap(), Finished::Recorded);
    let again = claim(&inbox, LEASED_MS + 5).await.remove(0);
    assert_eq!((again.attempt, again.budget_used), (2, 1));
    let delivery = detail(&inbox, "a").await.deliveries[0].clone();
    assert_eq!(delivery.history[0].outcome, "abandoned");
}

pub(super) async fn a_conflicted_attempt_applies_none_of_its_writes(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let b = both_read_then_a_writes(&inbox).await;
    let (_, version) = inbox.state_stat_blocking(HANDLER, "k").unwrap();
    let b_writes = StateChanges {
        writes: [("other".to_owned(), Some(vec![1]))].into(),
        ..write_after_reading("k", 0)
    };
    inbox.finish(done(&b, b_writes)).await.unwrap();
    assert_eq!(
        (
            inbox.state_stat_blocking(HANDLER, "other").unwrap(),
            inbox.state_stat_blocking(HANDLER, "k").unwrap().1
        ),
        ((None, 0), version)
    );
}

pub(super) async fn a_replay_gives_a_fresh_attempt_budget(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_letter(&inbox, "a").await;
    inbox.replay(dead()).await.unwrap();
    let again = claim(&inbox, Clock::system().now_ms()).await.remove(0);
    assert_eq!((again.attempt, again.budget_used), (2, 1));
}

/// A retrying delivery replayed runs now instead of after its backoff, with the attempt budget
/// it has (only a finished delivery gets a fresh one), and stays counted in the backlog once; a
/// second replay finds it due already and replays nothing.
pub(super) async fn a_retrying_delivery_replayed_is_due_now_with_its_budget(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    let in_an_hour = Clock::system().now_ms() + 3_600_000;
    let retry = Disposition::RetryAt { at_ms: in_an_hour };
    inbox.finish(finished(&claimed, retry)).await.unwrap();
    assert!(claim(&inbox, Clock::system().now_ms()).await.is_empty());
    let backlog = inbox.backlog();
    let retrying = ReplayFilter {
        state: Some(DeliveryState::Retrying),
        ..dead()
    };
    let dry = ReplayFilter {
        dry_run: true,
        ..retrying.clone()
    };
    assert_eq!(inbox.replay(dry).await.unwrap(), (1, 0));
    let before = Clock::system().now_ms();
    assert_eq!(inbox.replay(retrying.clone()).await.unwrap(), (1, 1));
    let after = Clock::system().now_ms();
    let due = detail(&inbox, "a").await.deliveries[0].next_attempt_at;
    assert!(
        due.is_some_and(|due| (before..=after).contains(&due)),
        "{due:?} not in {before}..={after}"
    );
    assert_eq!(
        inbox.backlog(),
        backlog,
        "a retrying delivery is in the backlog already"
    );
    // Due already: matched, not replayed again (replays racing for it count it once); unless
    // forced, which a replay of a delivery due already still sets, once.
    assert_eq!(inbox.replay(retrying.clone()).await.unwrap(), (1, 0));
    let forced = ReplayFilter {
        force: true,
        ..retrying.clone()
    };
    assert_eq!(inbox.replay(forced.clone()).await.unwrap(), (1, 1));
    assert_eq!(inbox.replay(forced).await.unwrap(), (1, 0));
    let again = claim(&inbox, Clock::system().now_ms()).await.remove(0);
    assert_eq!((again.attempt, again.budget_used), (2, 2));
    // Running now, it is no longer retrying: a second replay matches nothing.
    assert_eq!(inbox.replay(retrying).await.unwrap(), (0, 0));
}

pub(super) async fn a_replay_touches_at_most_its_limit(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for id in ["a", "b", "c"] {
        dead_letter(&inbox, id).await;
    }
    let two = ReplayFilter { limit: 2, ..dead() };
    assert_eq!(inbox.replay(two).await.unwrap(), (2, 2));
}

pub(super) async fn a_replay_takes_only_the_handlers_it_is_limited_to(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_letter(&inbox, "a").await;
    let elsewhere = ReplayFilter {
        declared_handlers: Some(vec!["another".into()]),
        ..dead()
    };
    assert_eq!(inbox.replay(elsewhere).await.unwrap(), (0, 0));
    assert_eq!(state_of(&inbox, "a").await, "dead");
    let among = ReplayFilter {
        declared_handlers: Some(vec!["another".into(), HANDLER.into()]),
        ..dead()
    };
    assert_eq!(inbox.replay(among).await.unwrap(), (1, 1));
    assert_eq!(state_of(&inbox, "a").await, "pending");
}

pub(super) async fn a_dry_run_replays_nothing(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_letter(&inbox, "a").await;
    let dry = ReplayFilter {
        dry_run: true,
        ..dead()
    };
    inbox.replay(dry).await.unwrap();
    assert_eq!(state_of(&inbox, "a").await, "dead");
}

pub(super) async fn replaying_a_pending_or_running_state_is_an_invalid_filter(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for state in [DeliveryState::Pending, DeliveryState::Running] {
        let filter = ReplayFilter {
            state: Some(state),
            ..dead()
        };
        let refused = inbox.replay(filter).await;
        assert!(
            matches!(refused, Err(InboxError::InvalidFilter(_))),
            "{state}: {refused:?}"
        );
    }
}

pub(super) async fn a_replayed_delivery_is_due_at_the_inbox_clocks_now(db: &dyn Database) {
    tokio::time::pause();
    let clock = Clock::tokio();
    let inbox = db.open(clock.clone()).await;
    dead_letter(&inbox, "a").await;
    tokio::time::advance(std::time::Duration::from_secs(3600)).await;
    // The paused clock may move on by itself while the store waits on I/O (a shared store's
    // inbox keeps timers): the replay is stamped between these two readings of it.
    let before = clock.now_ms();
    inbox.replay(dead()).await.unwrap();
    let after = clock.now_ms();
    let due = detail(&inbox, "a").await.deliveries[0].next_attempt_at;
    assert!(
        due.is_some_and(|due| (before..=after).contains(&due)),
        "{due:?} not in {before}..={after}"
    );
}

pub(super) async fn an_expired_lease_returns_to_due(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    let expired = claimed.leased_at_ms + crate::inbox::DEFAULT_LEASE_MS + 1;
    let retry = move |_: &str, _: u32| Disposition::RetryAt { at_ms: expired };
    inbox.reclaim_expired(expired, retry).await.unwrap();
    let again = claim(&inbox, expired).await;
    assert_eq!((ids(&again), again[0].attempt), (vec!["a".to_owned()], 2));
}

pub(super) async fn a_live_lease_is_not_reclaimed(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    let still_live = claimed.leased_at_ms + crate::inbox::DEFAULT_LEASE_MS - 1;
    assert_eq!(inbox.reclaim_expired(still_live, give_up).await.unwrap(), 0);
}

pub(super) async fn startup_reclaim_takes_every_lease(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    lease(&inbox, "a").await;
    lease(&inbox, "b").await;
    assert_eq!(inbox.reclaim_all_at_startup(give_up).await.unwrap(), 2);
}

/// Takes back `claimed`'s lease once it has expired; the delivery is given up.
async fn reclaim_after_expiry(inbox: &Inbox, claimed: &Claimed) {
    let expired = claimed.leased_at_ms + crate::inbox::DEFAULT_LEASE_MS + 1;
    assert_eq!(inbox.reclaim_expired(expired, give_up).await.unwrap(), 1);
}

/// A running delivery whose lease's start is missing (a hand repair, an older tool) is taken
/// back like any other, not a failure of the whole reclaim (which on the embedded store also
/// stops a start).
pub(super) async fn a_lease_without_its_start_is_taken_back(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    db.repair("UPDATE deliveries SET leased_at = NULL").await;
    reclaim_after_expiry(&inbox, &claimed).await;
    let history = &detail(&inbox, "a").await.deliveries[0].history;
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["abandoned"]);
}

pub(super) async fn a_reclaimed_attempt_is_recorded_as_abandoned(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    reclaim_after_expiry(&inbox, &claimed).await;
    let history = &detail(&inbox, "a").await.deliveries[0].history;
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["abandoned"]);
}

pub(super) async fn a_result_after_its_lease_was_reclaimed_is_discarded(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    reclaim_after_expiry(&inbox, &claimed).await;
    let late = finished(&claimed, Disposition::Done { output: None });
    assert_eq!(inbox.finish(late).await.unwrap(), Finished::LeaseLost);
}

/// A late result of an earlier lease may share a commit with the running lease's result for
/// the same delivery: only the running lease's is recorded (one attempt row), the other is told
/// its lease was lost.
pub(super) async fn a_late_result_beside_the_running_leases_result_is_not_recorded(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    let claimed = fixtures::lease_many(&inbox, 20).await;
    let finishes: Vec<_> = claimed
        .iter()
        .flat_map(|claim| {
            let current = finished(claim, Disposition::Done { output: None });
            let mut late = current.clone();
            late.attempt -= 1; // the token of the lease before this one
            [(true, current), (false, late)]
        })
        .map(|(current, record)| {
            let inbox = inbox.clone();
            tokio::spawn(async move { (current, inbox.finish(record).await.unwrap()) })
        })
        .collect();
    for finish in finishes {
        let (current, finished) = finish.await.unwrap();
        let expected = if current {
            Finished::Recorded
        } else {
            Finished::LeaseLost
        };
        assert_eq!(finished, expected);
    }
    for claim in &claimed {
        let detail = detail(&inbox, claim.event_id.as_str()).await;
        let delivery = &detail.deliveries[0];
        assert_eq!(
            (delivery.state.as_str(), delivery.history.len()),
            ("done", 1)
        );
    }
}

pub(super) async fn a_second_accept_of_one_event_is_a_duplicate(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let first = accept(&inbox, event("a")).await;
    let second = accept(&inbox, event("a")).await;
    assert_eq!((first, second), (Accepted::New, Accepted::Duplicate));
}

/// A source that dedupes by body: a body stored under one id makes another id with it a
/// duplicate, with no delivery; another body, or the same body from a source that does not
/// dedupe by body (whose events store no digest), is new.
pub(super) async fn a_body_stored_under_another_id_is_a_duplicate_where_the_source_says(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    let accepted = [
        fixtures::accept_body(&inbox, true, event("a"), b"{\"n\":1}").await,
        fixtures::accept_body(&inbox, true, event("b"), b"{\"n\":1}").await,
        fixtures::accept_body(&inbox, true, event("c"), b"{\"n\":2}").await,
        fixtures::accept_body(&inbox, false, event("d"), b"{\"n\":1}").await,
        fixtures::accept_body(&inbox, false, event("e"), b"{\"n\":1}").await,
        fixtures::accept_body(&inbox, true, event("a"), b"{\"n\":3}").await,
    ];
    use Accepted::{Duplicate, New};
    assert_eq!(accepted, [New, Duplicate, New, New, New, Duplicate]);
    fixtures::assert_backlog(&inbox, 4).await;
    let listed = inbox
        .list_events(EventFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let stored: std::collections::BTreeSet<String> =
        listed.iter().map(|e| e.event_id.to_string()).collect();
    assert_eq!(stored, ["a", "c", "d", "e"].map(String::from).into());
}

/// Concurrent accepts of one body under many ids (one batch, or several) store one event.
pub(super) async fn of_concurrent_accepts_of_one_body_under_many_ids_one_is_new(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let accepts = (0..40).map(|i| {
        let inbox = inbox.clone();
        tokio::spawn(async move {
            let envelope = event(&format!("id-{i}"));
            fixtures::accept_body(&inbox, true, envelope, b"{\"same\":true}").await
        })
    });
    let mut new = 0;
    for accept in accepts.collect::<Vec<_>>() {
        new += usize::from(accept.await.unwrap() == Accepted::New);
    }
    assert_eq!(new, 1);
    fixtures::assert_backlog(&inbox, 1).await;
}

pub(super) async fn a_duplicate_adds_no_delivery(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, event("a")).await;
    accept(&inbox, event("a")).await;
    assert_eq!(
        (inbox.backlog(), detail(&inbox, "a").await.deliveries.len()),
        (1, 1)
    );
}

pub(super) async fn quarantine_is_bounded_by_max_held(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let first = quarantine(&inbox, 1).await;
    let second = quarantine(&inbox, 1).await;
    assert_eq!((first.is_some(), second), (true, None));
}

pub(super) async fn accepting_from_quarantine_resolves_the_request(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let id = quarantine(&inbox, 10).await.unwrap();
    accept_from(&inbox, event("a"), Some(id)).await;
    assert!(inbox.held_quarantined(id).await.unwrap().is_none());
}

pub(super) async fn a_duplicate_from_quarantine_still_resolves_the_request(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept(&inbox, event("a")).await;
    let id = quarantine(&inbox, 10).await.unwrap();
    let accepted = accept_from(&inbox, event("a"), Some(id)).await;
    let held = inbox.held_quarantined(id).await.unwrap();
    assert_eq!((accepted, held.is_none()), (Accepted::Duplicate, true));
}

/// A quarantined request parsed into a body stored under another id (its source dedupes by
/// body) leaves quarantine as a duplicate, and stores nothing under its own id.
pub(super) async fn a_body_duplicate_from_quarantine_resolves_the_request_and_stores_nothing(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    fixtures::accept_body(&inbox, true, event("a"), b"{\"n\":1}").await;
    let id = quarantine(&inbox, 10).await.unwrap();
    let accepted =
        fixtures::accept_body_from(&inbox, true, event("b"), b"{\"n\":1}", Some(id)).await;
    let held = inbox.held_quarantined(id).await.unwrap();
    assert_eq!((accepted, held.is_none()), (Accepted::Duplicate, true));
    let stored = inbox
        .contains_event(SOURCE.into(), "b".into())
        .await
        .unwrap();
    assert!(!stored);
}

/// Two replays, or a replay and a discard, racing for one quarantined request: only the first
/// resolves it, and an accept that comes second writes nothing (a discarded request never
/// becomes an event, and each resolution is counted once).
pub(super) async fn a_quarantined_request_leaves_quarantine_once(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let from = |id| {
        inbox.accept(
            SourceName::new(SOURCE),
            event("late"),
            fixtures::request(),
            vec![PluginName::new(HANDLER)],
            Some(id),
        )
    };
    // Resolved first (a discard, or a parser that now refuses it), then accepted.
    let discarded = quarantine(&inbox, 10).await.unwrap();
    let first = inbox
        .resolve_quarantine(discarded, "discarded".into())
        .await;
    let again = inbox
        .resolve_quarantine(discarded, "discarded".into())
        .await;
    assert_eq!((first.unwrap(), again.unwrap()), (true, false));
    assert_eq!(from(discarded).await.unwrap(), Accepted::AlreadyResolved);
    let stored = inbox.contains_event(SOURCE.into(), "late".into()).await;
    assert!(!stored.unwrap(), "a discarded request became an event");
    fixtures::assert_backlog(&inbox, 0).await;
    // Accepted first, then resolved or accepted again.
    let replayed = quarantine(&inbox, 10).await.unwrap();
    assert_eq!(from(replayed).await.unwrap(), Accepted::New);
    let late = inbox.resolve_quarantine(replayed, "discarded".into()).await;
    assert!(!late.unwrap(), "an accepted request was resolved again");
    assert_eq!(from(replayed).await.unwrap(), Accepted::AlreadyResolved);
    fixtures::assert_backlog(&inbox, 1).await;
}

pub(super) async fn a_recount_after_resolving_frees_the_quarantine_slot(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let id = quarantine(&inbox, 1).await.unwrap();
    inbox
        .resolve_quarantine(id, "parser now says: ignore".into())
        .await
        .unwrap();
    inbox.recount_quarantine().await.unwrap();
    assert!(quarantine(&inbox, 1).await.is_some());
}

pub(super) async fn a_resolved_request_is_no_longer_held(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let id = quarantine(&inbox, 10).await.unwrap();
    inbox
        .resolve_quarantine(id, "parser now says: ignore".into())
        .await
        .unwrap();
    let held = inbox.held_quarantine_ids(dead()).await.unwrap();
    assert!(held.is_empty(), "{held:?}");
}

pub(super) async fn list_events_shows_every_handlers_state(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
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
    inbox
        .claim(fixtures::claim_request(LEASED_MS, 1, &[("x", 1)]))
        .await
        .unwrap();
    let listed = inbox
        .list_events(EventFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let states: Vec<(&str, &str)> = listed[0]
        .states
        .iter()
        .map(|(h, s)| (h.as_str(), s.as_str()))
        .collect();
    assert_eq!(states, [("x", "running"), ("y", "pending")]);
}

pub(super) async fn list_events_is_newest_first_and_limited(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for id in ["a", "b", "c"] {
        accept(&inbox, event(id)).await;
    }
    let listed = inbox
        .list_events(EventFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = listed.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["c", "b"]);
}

pub(super) async fn the_backlog_is_recounted_from_the_database_at_open(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let done_one = lease(&inbox, "a").await;
    let record = finished(&done_one, Disposition::Done { output: None });
    inbox.finish(record).await.unwrap();
    accept(&inbox, event("b")).await;
    inbox.close();
    let reopened = fixtures::open(db).await;
    fixtures::assert_backlog(&reopened, 1).await;
}

pub(super) async fn held_quarantine_is_recounted_from_the_database_at_open(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    quarantine(&inbox, 10).await.unwrap();
    inbox.close();
    let reopened = fixtures::open(db).await;
    assert_eq!(reopened.quarantine_held(), 1);
}

pub(super) async fn the_next_due_time_is_the_earliest_retry_after_now(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for (id, at_ms) in [("a", 5_000), ("b", 3_000)] {
        let claimed = lease(&inbox, id).await;
        let retry = Disposition::RetryAt { at_ms };
        inbox.finish(finished(&claimed, retry)).await.unwrap();
    }
    assert_eq!(inbox.next_due_after(LEASED_MS).await.unwrap(), Some(3_000));
}

pub(super) async fn the_oldest_due_is_the_longest_waiting_due_delivery(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    assert_eq!(inbox.oldest_due().await.unwrap(), None, "nothing stored");
    // Running, and retrying in the future, are not due.
    let claimed = lease(&inbox, "a").await;
    assert_eq!(inbox.oldest_due().await.unwrap(), None, "a is running");
    let later = Disposition::RetryAt {
        at_ms: i64::MAX / 2,
    };
    inbox.finish(finished(&claimed, later)).await.unwrap();
    assert_eq!(
        inbox.oldest_due().await.unwrap(),
        None,
        "a waits for its retry"
    );
    // A retry whose time has come is due since that time.
    let claimed = lease(&inbox, "b").await;
    let past = Disposition::RetryAt { at_ms: 1_000 };
    inbox.finish(finished(&claimed, past)).await.unwrap();
    assert_eq!(inbox.oldest_due().await.unwrap(), Some(1_000));
    // A new event is due since it was received, earlier still.
    accept(&inbox, event("c")).await;
    let due = detail(&inbox, "c").await.deliveries[0].next_attempt_at;
    assert!(due.is_some_and(|due| due < 1_000), "{due:?}");
    assert_eq!(inbox.oldest_due().await.unwrap(), due);
}

pub(super) async fn the_commit_refuses_writes_that_take_the_plugin_over_its_total(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    let limits = StateLimits {
        max_keys: 2,
        max_bytes: 1000,
        ..StateLimits::DEFAULT
    };
    // Two attempts that each fit, checked against the same committed usage (as concurrent
    // attempts are): the first commits, the second would make three keys.
    let a = lease(&inbox, "a").await;
    let b = lease(&inbox, "b").await;
    let first = fixtures::state_writes(&inbox, &[("a1", Some(1)), ("a2", Some(1))], limits);
    let second = fixtures::state_writes(&inbox, &[("b1", Some(1))], limits);
    assert_eq!(
        inbox.finish(done(&a, first)).await.unwrap(),
        Finished::Recorded
    );
    let Finished::OverQuota(message) = inbox.finish(done(&b, second)).await.unwrap() else {
        panic!("the second commit must be refused");
    };
    assert!(
        message.contains("would hold 3 keys") && message.contains("plugins.p.state_max_keys = 2"),
        "{message}"
    );
    // Nothing of it applied, and the lease is still held: the caller records the failure.
    assert_eq!(
        (
            inbox.state_usage_blocking(HANDLER).unwrap().keys,
            inbox.state_stat_blocking(HANDLER, "b1").unwrap()
        ),
        (2, (None, 0))
    );
    let failed = Finish {
        outcome: AttemptOutcome::Retry,
        error_kind: Some("state_quota".into()),
        error: Some(message),
        disposition: Disposition::RetryAt { at_ms: 1000 },
        ..done(&b, StateChanges::default())
    };
    assert_eq!(inbox.finish(failed).await.unwrap(), Finished::Recorded);

    // Over the bytes, too; while a delete with a bigger write that nets fewer bytes passes.
    let c = lease(&inbox, "c").await;
    let grow = fixtures::state_writes(&inbox, &[("a1", Some(999))], limits);
    assert!(matches!(
        inbox.finish(done(&c, grow)).await.unwrap(),
        Finished::OverQuota(m) if m.contains("state_max_mib")
    ));
    let failed = Finish {
        disposition: Disposition::Dead,
        ..done(&c, StateChanges::default())
    };
    inbox.finish(failed).await.unwrap();
    let d = lease(&inbox, "d").await;
    let swap = fixtures::state_writes(
        &inbox,
        &[("a1", None), ("a2", None), ("b1", Some(900))],
        limits,
    );
    assert_eq!(
        inbox.finish(done(&d, swap)).await.unwrap(),
        Finished::Recorded
    );
    assert_eq!(
        inbox.state_usage_blocking(HANDLER).unwrap(),
        StateUsage {
            keys: 1,
            bytes: 902
        }
    );
    inbox.close();
}

pub(super) async fn a_notice_of_work_wakes_whoever_waits_for_work(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    // Waiting first (polled by `join!` before the notice is sent), beside any other waiter the
    // inbox itself keeps: every waiter is woken, not just one.
    let waiting = inbox.store().work_notified();
    let notice = async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        inbox.store().notify_work().await.unwrap();
    };
    let woken = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(waiting, notice)
    })
    .await;
    assert!(woken.is_ok(), "the notice reached the waiter");
}

// The dashboard's reads: event filters and cursor, dead-letter groups, held requests.

/// Accepts event `id` of type `event_type` from `source`, received at `received_ms`, with one
/// header and a body, for [`HANDLER`].
async fn accept_typed(inbox: &Inbox, source: &str, id: &str, event_type: &str, received_ms: i64) {
    let envelope = crate::model::Envelope {
        event_type: event_type.into(),
        ..event(id)
    };
    let request = crate::inbox::RawRequest {
        headers: vec![("x-kind".into(), event_type.into())],
        body: bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}")),
        received_at_ms: received_ms,
    };
    inbox
        .accept(
            SourceName::new(source),
            envelope,
            request,
            vec![PluginName::new(HANDLER)],
            None,
        )
        .await
        .unwrap();
}

/// The event ids `filter` lists, in order.
async fn listed(inbox: &Inbox, filter: EventFilter) -> Vec<String> {
    inbox
        .list_events(filter)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_id)
        .collect()
}

/// Leases the one due delivery of [`HANDLER`] (event `id`) and finishes it dead with an
/// attempt failed as `error_kind`.
async fn dead_with_kind(inbox: &Inbox, id: &str, error_kind: &str) {
    let claimed = lease(inbox, id).await;
    let record = Finish {
        error_kind: Some(error_kind.into()),
        error: Some(format!("{id} failed: {error_kind}")),
        ..finished(&claimed, Disposition::Dead)
    };
    inbox.finish(record).await.unwrap();
}

pub(super) async fn list_events_filters_by_type_id_source_and_time(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept_typed(&inbox, "s", "a", "push", 1_000).await;
    accept_typed(&inbox, "s", "b", "issue", 2_000).await;
    accept_typed(&inbox, "other", "c", "push", 3_000).await;
    accept_typed(&inbox, "s", "d", "push", 4_000).await;
    let all = || EventFilter {
        limit: 10,
        ..Default::default()
    };
    let by_type = EventFilter {
        event_type: Some("push".into()),
        ..all()
    };
    assert_eq!(listed(&inbox, by_type.clone()).await, ["d", "c", "a"]);
    let by_type_and_source = EventFilter {
        source: Some("s".into()),
        ..by_type
    };
    assert_eq!(listed(&inbox, by_type_and_source).await, ["d", "a"]);
    let by_id = EventFilter {
        event_id: Some("c".into()),
        ..all()
    };
    assert_eq!(listed(&inbox, by_id.clone()).await, ["c"]);
    let by_id_and_state = EventFilter {
        state: Some(DeliveryState::Pending),
        ..by_id.clone()
    };
    assert_eq!(listed(&inbox, by_id_and_state).await, ["c"]);
    let by_id_and_other_state = EventFilter {
        state: Some(DeliveryState::Dead),
        ..by_id
    };
    assert!(listed(&inbox, by_id_and_other_state).await.is_empty());
    let in_range = EventFilter {
        since_ms: Some(2_000),
        until_ms: Some(3_000),
        ..all()
    };
    assert_eq!(listed(&inbox, in_range).await, ["c", "b"]);
    let nothing = EventFilter {
        event_id: Some("c".into()),
        source: Some("s".into()),
        ..all()
    };
    assert!(listed(&inbox, nothing).await.is_empty());
}

pub(super) async fn list_events_pages_by_cursor_without_gaps_or_repeats(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for id in ["a", "b", "c", "d", "e"] {
        accept(&inbox, event(id)).await;
    }
    let mut pages = Vec::new();
    let mut before = None;
    // Bounded: a cursor that did not move on would list the first page forever.
    for _ in 0..5 {
        let page = inbox
            .list_events(EventFilter {
                limit: 2,
                before,
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        before = page.last().map(|e| e.cursor);
        pages.push(page.into_iter().map(|e| e.event_id).collect::<Vec<_>>());
    }
    assert_eq!(pages, [vec!["e", "d"], vec!["c", "b"], vec!["a"]]);
}

pub(super) async fn list_events_by_state_finds_a_rare_state_newest_first(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_with_kind(&inbox, "a", "permanent").await;
    accept(&inbox, event("b")).await;
    accept(&inbox, event("c")).await;
    let (d, e) = ("d", "e");
    accept(&inbox, event(d)).await;
    let dead_filter = EventFilter {
        state: Some(DeliveryState::Dead),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(listed(&inbox, dead_filter.clone()).await, ["a"]);
    accept(&inbox, event(e)).await;
    let pending = EventFilter {
        state: Some(DeliveryState::Pending),
        handler: Some(HANDLER.into()),
        limit: 2,
        ..Default::default()
    };
    let first = inbox.list_events(pending.clone()).await.unwrap();
    let ids: Vec<&str> = first.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["e", "d"]);
    let second = EventFilter {
        before: first.last().map(|e| e.cursor),
        ..pending
    };
    assert_eq!(listed(&inbox, second).await, ["c", "b"]);
    let other_handler = EventFilter {
        handler: Some("nobody".into()),
        ..dead_filter
    };
    assert!(listed(&inbox, other_handler).await.is_empty());
}

pub(super) async fn an_event_detail_carries_its_headers_and_body(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    accept_typed(&inbox, SOURCE, "a", "push", 5).await;
    let event = detail(&inbox, "a").await;
    assert_eq!(event.headers, [("x-kind".to_owned(), "push".to_owned())]);
    assert_eq!(&event.body[..], br#"{"id":"a"}"#);
}

pub(super) async fn dead_letters_are_grouped_by_handler_and_error_kind(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_with_kind(&inbox, "a", "trap").await;
    dead_with_kind(&inbox, "b", "permanent").await;
    dead_with_kind(&inbox, "c", "trap").await;
    accept(&inbox, event("open")).await;
    let groups = inbox.dead_letter_groups().await.unwrap();
    let seen: Vec<(&str, Option<&str>, i64)> = groups
        .iter()
        .map(|g| (g.handler.as_str(), g.error_kind.as_deref(), g.count))
        .collect();
    assert_eq!(
        seen,
        [(HANDLER, Some("trap"), 2), (HANDLER, Some("permanent"), 1)]
    );
    assert!(groups[0].first_ms <= groups[0].last_ms);
    assert!(
        groups[0]
            .example_error
            .as_deref()
            .is_some_and(|e| e.ends_with("failed: trap")),
        "{groups:?}"
    );
}

pub(super) async fn a_replay_by_error_kind_takes_only_that_group(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    dead_with_kind(&inbox, "a", "trap").await;
    dead_with_kind(&inbox, "b", "permanent").await;
    let traps = ReplayFilter {
        error_kind: Some("trap".into()),
        handler: Some(HANDLER.into()),
        ..dead()
    };
    let dry = ReplayFilter {
        dry_run: true,
        ..traps.clone()
    };
    assert_eq!(inbox.replay(dry).await.unwrap(), (1, 0));
    assert_eq!(inbox.replay(traps).await.unwrap(), (1, 1));
    assert_eq!(state_of(&inbox, "a").await, "pending");
    assert_eq!(state_of(&inbox, "b").await, "dead");
}

pub(super) async fn held_requests_are_listed_newest_first_with_their_reason(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let first = quarantine(&inbox, 10).await.unwrap();
    let second = quarantine(&inbox, 10).await.unwrap();
    let resolved = quarantine(&inbox, 10).await.unwrap();
    inbox
        .resolve_quarantine(resolved, "parser now says: ignore".into())
        .await
        .unwrap();
    let held = inbox.held_requests(10, None).await.unwrap();
    let ids: Vec<i64> = held.iter().map(|h| h.id).collect();
    assert_eq!(ids, [second, first]);
    assert_eq!(
        (held[0].source.as_str(), held[0].reason.as_str()),
        (SOURCE, "parser trapped")
    );
    let after = inbox.held_requests(10, Some(second)).await.unwrap();
    assert_eq!(after.iter().map(|h| h.id).collect::<Vec<_>>(), [first]);
}

/// PostgreSQL's `text` holds no NUL (U+0000), so no backend stores one: what a handler or a
/// parser says with one (an error, an output, a quarantine reason) is kept with it shown as
/// `\u{0}`, and a filter naming one matches nothing (nothing stored holds one), on every
/// backend alike instead of failing on one.
pub(super) async fn text_with_a_nul_is_kept_escaped_and_a_name_with_one_matches_nothing(
    db: &dyn Database,
) {
    let inbox = fixtures::open(db).await;
    let claimed = lease(&inbox, "a").await;
    let record = Finish {
        error_kind: Some("permanent".into()),
        error: Some("unknown op a\0b".into()),
        ..finished(&claimed, Disposition::Dead)
    };
    assert_eq!(inbox.finish(record).await.unwrap(), Finished::Recorded);
    let claimed = lease(&inbox, "b").await;
    let record = finished(
        &claimed,
        Disposition::Done {
            output: Some("out\0put".into()),
        },
    );
    assert_eq!(inbox.finish(record).await.unwrap(), Finished::Recorded);
    let failed = &detail(&inbox, "a").await.deliveries[0];
    assert_eq!(
        failed.last_error.as_deref(),
        Some("permanent: unknown op a\\u{0}b")
    );
    let succeeded = &detail(&inbox, "b").await.deliveries[0];
    assert_eq!(succeeded.output.as_deref(), Some("out\\u{0}put"));
    inbox
        .quarantine(
            SourceName::new(SOURCE),
            fixtures::request(),
            "parser said \0".into(),
            10,
        )
        .await
        .unwrap()
        .unwrap();
    let held = inbox.held_requests(10, None).await.unwrap();
    assert_eq!(held[0].reason, "parser said \\u{0}");

    let nul = Some("a\0".to_owned());
    for filter in [
        EventFilter {
            event_id: nul.clone(),
            ..EventFilter::default()
        },
        EventFilter {
            source: nul.clone(),
            ..EventFilter::default()
        },
        EventFilter {
            event_type: nul.clone(),
            ..EventFilter::default()
        },
        EventFilter {
            handler: nul.clone(),
            ..EventFilter::default()
        },
    ] {
        let filter = EventFilter {
            limit: 10,
            ..filter
        };
        let listed = inbox.list_events(filter.clone()).await.unwrap();
        assert!(listed.is_empty(), "{filter:?}");
    }
    let found = inbox.event_detail(SOURCE.into(), "a\0".into()).await;
    assert!(found.unwrap().is_none());
    for filter in [
        ReplayFilter {
            event_ids: Some(vec!["a\0".into()]),
            ..dead()
        },
        ReplayFilter {
            error_kind: Some("permanent\0".into()),
            ..dead()
        },
        ReplayFilter {
            source: nul.clone(),
            ..dead()
        },
    ] {
        assert_eq!(
            inbox.replay(filter.clone()).await.unwrap(),
            (0, 0),
            "{filter:?}"
        );
        assert_eq!(
            inbox.discard(filter.clone()).await.unwrap(),
            (0, 0),
            "{filter:?}"
        );
        assert_eq!(
            inbox.held_quarantine_count(filter.clone()).await.unwrap(),
            0
        );
        assert_eq!(inbox.discard_quarantine(filter).await.unwrap(), (0, 0));
    }
    // An id with a NUL among others is left out, the others still match.
    let some = ReplayFilter {
        event_ids: Some(vec!["a\0".into(), "a".into()]),
        dry_run: true,
        ..dead()
    };
    assert_eq!(inbox.replay(some).await.unwrap(), (1, 0));
    let keys = StateKeyFilter {
        prefix: "k\0".into(),
        after: None,
        limit: 10,
    };
    assert_eq!(inbox.state_keys(HANDLER, keys).await.unwrap(), []);
    assert_eq!(inbox.state_value(HANDLER, "k\0").await.unwrap(), None);
}

/// An open database answers the readiness probe's read.
pub(super) async fn an_open_database_is_ready(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    assert_eq!(inbox.ready(std::time::Duration::from_secs(5)).await, Ok(()));
}

/// A conflict gives back the budget, never the attempt number, which is the lease token: the
/// conflicted record sent again (as after a commit whose answer was lost) finds the next lease
/// another's, and nothing else leases the delivery while that one runs. When the number was
/// given back, the resend passed the lease check against the new lease, conflicted again and
/// put the running delivery back to `pending`, so a third claim ran it alongside.
pub(super) async fn a_resent_conflict_never_meets_the_next_lease(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let b = both_read_then_a_writes(&inbox).await;
    let record = done(&b, write_after_reading("k", 0));
    assert_eq!(
        inbox.finish(record.clone()).await.unwrap(),
        Finished::Conflict
    );
    let c = claim(&inbox, LEASED_MS + 5).await.remove(0);
    assert_eq!(c.delivery_id, b.delivery_id);
    assert_ne!(c.attempt, b.attempt, "a lease token issued twice");
    assert_eq!(inbox.finish(record).await.unwrap(), Finished::LeaseLost);
    assert!(claim(&inbox, LEASED_MS + 6).await.is_empty());
    let c_done = inbox
        .finish(finished(&c, Disposition::Done { output: None }))
        .await;
    assert_eq!(c_done.unwrap(), Finished::Recorded);
}
