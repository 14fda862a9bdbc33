//! Storage-level properties of the inbox, checked on a real database file through its public
//! operations: ordering heads, staleness, state conflicts, attempt budgets, reclaim, dedupe and
//! quarantine bookkeeping. One property per test.

use super::{
    Accepted, Finished, InboxError, ReplayFilter,
    fixtures::{
        self, HANDLER, LEASED_MS, SOURCE, accept, claim, detail, done, event, finished, keyed,
        lease, state_of,
    },
};
use crate::{
    clock::Clock,
    ids::{PluginName, SourceName},
    model::{DeliveryState, Disposition, StateChanges},
};

/// What a claim leased, by event id.
fn ids(claimed: &[super::Claimed]) -> Vec<String> {
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
async fn older_after_newer_done(inbox: &super::Inbox) {
    accept(inbox, keyed("newer", "k", 5)).await;
    let newer = claim(inbox, LEASED_MS).await.remove(0);
    let record = finished(&newer, Disposition::Done { output: None });
    inbox.finish(record).await.unwrap();
    accept(inbox, keyed("older", "k", 4)).await;
}

/// Accepts event `id` and leases it once: its first attempt fails for good.
async fn dead_letter(inbox: &super::Inbox, id: &str) {
    let claimed = lease(inbox, id).await;
    inbox
        .finish(finished(&claimed, Disposition::Dead))
        .await
        .unwrap();
}

/// Leases `a` and `b`, which both read state key `k` while absent; `a` commits a write to it
/// first. Returns `b`'s lease.
async fn both_read_then_a_writes(inbox: &super::Inbox) -> super::Claimed {
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

#[tokio::test]
async fn a_later_sequence_waits_for_its_head() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, keyed("second", "k", 2)).await;
    accept(&inbox, keyed("first", "k", 1)).await;
    assert_eq!(ids(&claim(&inbox, LEASED_MS).await), ["first"]);
}

#[tokio::test]
async fn a_running_head_blocks_its_key() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, keyed("first", "k", 1)).await;
    claim(&inbox, LEASED_MS).await;
    accept(&inbox, keyed("second", "k", 2)).await;
    assert!(claim(&inbox, LEASED_MS).await.is_empty());
}

#[tokio::test]
async fn a_head_waiting_for_its_retry_blocks_its_key() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, keyed("first", "k", 1)).await;
    let head = claim(&inbox, LEASED_MS).await.remove(0);
    let later = Disposition::RetryAt { at_ms: 1_000_000 };
    inbox.finish(finished(&head, later)).await.unwrap();
    accept(&inbox, keyed("second", "k", 2)).await;
    assert!(claim(&inbox, LEASED_MS + 5).await.is_empty());
}

#[tokio::test]
async fn another_key_is_not_blocked_by_a_running_head() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, keyed("k1", "k", 1)).await;
    claim(&inbox, LEASED_MS).await;
    accept(&inbox, keyed("j1", "j", 1)).await;
    assert_eq!(ids(&claim(&inbox, LEASED_MS).await), ["j1"]);
}

#[tokio::test]
async fn an_older_sequence_than_one_done_is_never_claimed() {
    let (_dir, inbox) = fixtures::open();
    older_after_newer_done(&inbox).await;
    assert!(claim(&inbox, LEASED_MS + 5).await.is_empty());
}

#[tokio::test]
async fn an_older_sequence_than_one_done_becomes_stale() {
    let (_dir, inbox) = fixtures::open();
    older_after_newer_done(&inbox).await;
    claim(&inbox, LEASED_MS + 5).await;
    assert_eq!(state_of(&inbox, "older").await, "stale");
}

#[tokio::test]
async fn a_stale_delivery_leaves_the_backlog() {
    let (_dir, inbox) = fixtures::open();
    older_after_newer_done(&inbox).await;
    claim(&inbox, LEASED_MS + 5).await;
    assert_eq!(inbox.backlog(), 0);
}

#[tokio::test]
async fn the_second_of_two_attempts_writing_one_key_conflicts() {
    let (_dir, inbox) = fixtures::open();
    let b = both_read_then_a_writes(&inbox).await;
    let second = inbox.finish(done(&b, write_after_reading("k", 0))).await;
    assert_eq!(second.unwrap(), Finished::Conflict);
}

#[tokio::test]
async fn a_conflicted_attempt_runs_again_without_using_its_budget() {
    let (_dir, inbox) = fixtures::open();
    let b = both_read_then_a_writes(&inbox).await;
    inbox
        .finish(done(&b, write_after_reading("k", 0)))
        .await
        .unwrap();
    let again = claim(&inbox, LEASED_MS + 5).await.remove(0);
    assert_eq!(
        (again.event_id.as_str(), again.attempt, again.budget_used),
        ("b", 1, 1)
    );
}

#[tokio::test]
async fn a_conflicted_attempt_applies_none_of_its_writes() {
    let (_dir, inbox) = fixtures::open();
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

#[tokio::test]
async fn a_replay_gives_a_fresh_attempt_budget() {
    let (_dir, inbox) = fixtures::open();
    dead_letter(&inbox, "a").await;
    inbox.replay(dead()).await.unwrap();
    let again = claim(&inbox, Clock::system().now_ms()).await.remove(0);
    assert_eq!((again.attempt, again.budget_used), (2, 1));
}

#[tokio::test]
async fn a_replay_touches_at_most_its_limit() {
    let (_dir, inbox) = fixtures::open();
    for id in ["a", "b", "c"] {
        dead_letter(&inbox, id).await;
    }
    let two = ReplayFilter { limit: 2, ..dead() };
    assert_eq!(inbox.replay(two).await.unwrap(), (2, 2));
}

#[tokio::test]
async fn a_dry_run_replays_nothing() {
    let (_dir, inbox) = fixtures::open();
    dead_letter(&inbox, "a").await;
    let dry = ReplayFilter {
        dry_run: true,
        ..dead()
    };
    inbox.replay(dry).await.unwrap();
    assert_eq!(state_of(&inbox, "a").await, "dead");
}

#[tokio::test]
async fn replaying_an_open_state_is_an_invalid_filter() {
    let (_dir, inbox) = fixtures::open();
    for state in DeliveryState::OPEN {
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

#[tokio::test(start_paused = true)]
async fn a_replayed_delivery_is_due_at_the_inbox_clocks_now() {
    let clock = Clock::tokio();
    let (_dir, inbox) = fixtures::open_on(clock.clone());
    dead_letter(&inbox, "a").await;
    tokio::time::advance(std::time::Duration::from_secs(3600)).await;
    inbox.replay(dead()).await.unwrap();
    let due = detail(&inbox, "a").await.deliveries[0].next_attempt_at;
    assert_eq!(due, Some(clock.now_ms()));
}

#[tokio::test]
async fn an_expired_lease_returns_to_due() {
    let (_dir, inbox) = fixtures::open();
    let claimed = lease(&inbox, "a").await;
    let expired = claimed.leased_at_ms + super::DEFAULT_LEASE_MS + 1;
    let retry = move |_: &str, _: u32| Disposition::RetryAt { at_ms: expired };
    inbox.reclaim_expired(expired, retry).await.unwrap();
    let again = claim(&inbox, expired).await;
    assert_eq!((ids(&again), again[0].attempt), (vec!["a".to_owned()], 2));
}

#[tokio::test]
async fn a_live_lease_is_not_reclaimed() {
    let (_dir, inbox) = fixtures::open();
    let claimed = lease(&inbox, "a").await;
    let still_live = claimed.leased_at_ms + super::DEFAULT_LEASE_MS - 1;
    assert_eq!(inbox.reclaim_expired(still_live, give_up).await.unwrap(), 0);
}

#[tokio::test]
async fn startup_reclaim_takes_every_lease() {
    let (_dir, inbox) = fixtures::open();
    lease(&inbox, "a").await;
    lease(&inbox, "b").await;
    assert_eq!(inbox.reclaim_all_at_startup(give_up).await.unwrap(), 2);
}

#[tokio::test]
async fn a_reclaimed_attempt_is_recorded_as_abandoned() {
    let (_dir, inbox) = fixtures::open();
    lease(&inbox, "a").await;
    inbox.reclaim_all_at_startup(give_up).await.unwrap();
    let history = &detail(&inbox, "a").await.deliveries[0].history;
    let outcomes: Vec<&str> = history.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["abandoned"]);
}

#[tokio::test]
async fn a_result_after_its_lease_was_reclaimed_is_discarded() {
    let (_dir, inbox) = fixtures::open();
    let claimed = lease(&inbox, "a").await;
    inbox.reclaim_all_at_startup(give_up).await.unwrap();
    let late = finished(&claimed, Disposition::Done { output: None });
    assert_eq!(inbox.finish(late).await.unwrap(), Finished::LeaseLost);
}

#[tokio::test]
async fn a_second_accept_of_one_event_is_a_duplicate() {
    let (_dir, inbox) = fixtures::open();
    let first = accept(&inbox, event("a")).await;
    let second = accept(&inbox, event("a")).await;
    assert_eq!((first, second), (Accepted::New, Accepted::Duplicate));
}

#[tokio::test]
async fn a_duplicate_adds_no_delivery() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, event("a")).await;
    accept(&inbox, event("a")).await;
    assert_eq!(
        (inbox.backlog(), detail(&inbox, "a").await.deliveries.len()),
        (1, 1)
    );
}

/// Quarantines one request from [`SOURCE`] (at most `max_held` held).
async fn quarantine(inbox: &super::Inbox, max_held: u64) -> Option<i64> {
    inbox
        .quarantine(
            SourceName::new(SOURCE),
            fixtures::request(),
            "parser trapped".into(),
            max_held,
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn quarantine_is_bounded_by_max_held() {
    let (_dir, inbox) = fixtures::open();
    let first = quarantine(&inbox, 1).await;
    let second = quarantine(&inbox, 1).await;
    assert_eq!((first.is_some(), second), (true, None));
}

#[tokio::test]
async fn accepting_from_quarantine_resolves_the_request() {
    let (_dir, inbox) = fixtures::open();
    let id = quarantine(&inbox, 10).await.unwrap();
    let handlers = vec![PluginName::new(HANDLER)];
    inbox
        .accept(
            SourceName::new(SOURCE),
            event("a"),
            fixtures::request(),
            handlers,
            Some(id),
        )
        .await
        .unwrap();
    assert!(inbox.held_quarantined(id).await.unwrap().is_none());
}

#[tokio::test]
async fn a_duplicate_from_quarantine_still_resolves_the_request() {
    let (_dir, inbox) = fixtures::open();
    accept(&inbox, event("a")).await;
    let id = quarantine(&inbox, 10).await.unwrap();
    let handlers = vec![PluginName::new(HANDLER)];
    let accepted = inbox
        .accept(
            SourceName::new(SOURCE),
            event("a"),
            fixtures::request(),
            handlers,
            Some(id),
        )
        .await
        .unwrap();
    let held = inbox.held_quarantined(id).await.unwrap();
    assert_eq!((accepted, held.is_none()), (Accepted::Duplicate, true));
}

#[tokio::test]
async fn a_recount_after_resolving_frees_the_quarantine_slot() {
    let (_dir, inbox) = fixtures::open();
    let id = quarantine(&inbox, 1).await.unwrap();
    inbox
        .resolve_quarantine(id, "parser now says: ignore".into())
        .await
        .unwrap();
    inbox.recount_quarantine().await.unwrap();
    assert!(quarantine(&inbox, 1).await.is_some());
}

#[tokio::test]
async fn a_resolved_request_is_no_longer_held() {
    let (_dir, inbox) = fixtures::open();
    let id = quarantine(&inbox, 10).await.unwrap();
    inbox
        .resolve_quarantine(id, "parser now says: ignore".into())
        .await
        .unwrap();
    let held = inbox.held_quarantine_ids(dead()).await.unwrap();
    assert!(held.is_empty(), "{held:?}");
}

#[tokio::test]
async fn list_events_shows_every_handlers_state() {
    let (_dir, inbox) = fixtures::open();
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
        .list_events(super::EventFilter {
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

#[tokio::test]
async fn list_events_is_newest_first_and_limited() {
    let (_dir, inbox) = fixtures::open();
    for id in ["a", "b", "c"] {
        accept(&inbox, event(id)).await;
    }
    let listed = inbox
        .list_events(super::EventFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = listed.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["c", "b"]);
}

#[tokio::test]
async fn the_backlog_is_recounted_from_the_database_at_open() {
    let (dir, inbox) = fixtures::open();
    let done_one = lease(&inbox, "a").await;
    let record = finished(&done_one, Disposition::Done { output: None });
    inbox.finish(record).await.unwrap();
    accept(&inbox, event("b")).await;
    inbox.close();
    let path = dir.path().join("hookd.db");
    let reopened = super::Inbox::open(&path, crate::config::Durability::Normal).unwrap();
    assert_eq!(reopened.backlog(), 1);
}

#[tokio::test]
async fn held_quarantine_is_recounted_from_the_database_at_open() {
    let (dir, inbox) = fixtures::open();
    quarantine(&inbox, 10).await.unwrap();
    inbox.close();
    let path = dir.path().join("hookd.db");
    let reopened = super::Inbox::open(&path, crate::config::Durability::Normal).unwrap();
    assert_eq!(reopened.quarantine_held(), 1);
}

#[tokio::test]
async fn the_next_due_time_is_the_earliest_retry_after_now() {
    let (_dir, inbox) = fixtures::open();
    for (id, at_ms) in [("a", 5_000), ("b", 3_000)] {
        let claimed = lease(&inbox, id).await;
        let retry = Disposition::RetryAt { at_ms };
        inbox.finish(finished(&claimed, retry)).await.unwrap();
    }
    assert_eq!(inbox.next_due_after(LEASED_MS).await.unwrap(), Some(3_000));
}
