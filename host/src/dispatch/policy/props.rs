//! Property tests for the retry policy and the ordering rule: the bounds and monotonicity the
//! dispatcher relies on, over every policy the config accepts and every input a worker can pass.
//!
//! Invariant: the expected values are stated from the documented rules (caps, halves, counts),
//! never by calling the function under test a second way.

use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// Any policy `config.rs` accepts: `max_attempts` ≥ 1, any base and max in milliseconds (the
/// two are independent keys, so base > max is possible too), either delivery mode.
fn policies() -> impl Strategy<Value = RetryPolicy> {
    let ms = prop_oneof![
        4 => 0u64..10_000_000,
        1 => any::<u64>(),
    ];
    (1u32..=64, ms.clone(), ms, any::<bool>()).prop_map(
        |(max_attempts, base, max, at_most_once)| RetryPolicy {
            max_attempts,
            backoff_base: Duration::from_millis(base),
            backoff_max: Duration::from_millis(max),
            at_most_once,
        },
    )
}

/// Every f64 a caller could hand over, not only the `[0, 1)` that `rand::random` draws.
fn jitters() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.0..1.0f64,
        1 => any::<f64>(),
        1 => Just(f64::NAN),
        1 => Just(1.0),
    ]
}

fn endings() -> impl Strategy<Value = Attempted> {
    prop_oneof![
        Just(Attempted::Ok(None)),
        ".{0,8}".prop_map(|s| Attempted::Ok(Some(s))),
        Just(Attempted::Permanent),
        Just(Attempted::Failed),
        any::<u32>().prop_map(|tries| Attempted::NotStarted { tries }),
        Just(Attempted::Retry { after: None }),
        any::<u64>().prop_map(|ms| Attempted::Retry {
            after: Some(Duration::from_millis(ms)),
        }),
    ]
}

/// The cap of retry number `failures + 1`: base · 2^(failures − 1), at most `max`.
fn cap(policy: &RetryPolicy, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    policy
        .backoff_base
        .checked_mul(1 << doublings)
        .unwrap_or(Duration::MAX)
        .min(policy.backoff_max)
}

/// Any clock a worker can read: from 1970 to far beyond any real date.
fn nows() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 1_600_000_000_000i64..2_000_000_000_000,
        1 => 0..i64::MAX,
    ]
}

proptest! {
    #[test]
    fn backoff_is_between_half_the_cap_and_the_cap(
        policy in policies(), failures in any::<u32>(), jitter in jitters(),
    ) {
        let delay = backoff(&policy, failures, jitter);
        let cap = cap(&policy, failures);
        prop_assert!(delay <= cap, "{delay:?} > cap {cap:?}");
        prop_assert!(delay <= policy.backoff_max);
        prop_assert!(delay >= cap / 2, "{delay:?} < half of {cap:?}");
    }

    #[test]
    fn backoff_grows_with_failures_and_jitter(
        policy in policies(), failures in 0u32..80, jitter in 0.0..=1.0f64, more in 0.0..=1.0f64,
    ) {
        let (low, high) = if jitter <= more { (jitter, more) } else { (more, jitter) };
        prop_assert!(backoff(&policy, failures, low) <= backoff(&policy, failures, high));
        prop_assert!(backoff(&policy, failures, jitter) <= backoff(&policy, failures + 1, jitter));
        prop_assert!(cap(&policy, failures) <= cap(&policy, failures + 1));
    }

    #[test]
    fn jitter_spreads_at_most_half_the_cap(
        policy in policies(), failures in any::<u32>(), a in jitters(), b in jitters(),
    ) {
        let (x, y) = (backoff(&policy, failures, a), backoff(&policy, failures, b));
        let spread = x.abs_diff(y);
        // Both are in [cap - cap/2, cap]; the floor of the half can add one tick.
        prop_assert!(spread <= cap(&policy, failures) / 2 + Duration::from_nanos(1));
    }

    #[test]
    fn every_decision_is_one_of_the_documented_ones(
        policy in policies(), attempted in endings(), used in 0u32..100, now in nows(),
        jitter in jitters(),
    ) {
        let disposition = decide(&policy, attempted.clone(), used, now, jitter);
        match (&attempted, disposition) {
            (Attempted::Ok(output), Disposition::Done { output: got }) => {
                prop_assert_eq!(output, &got);
            }
            (Attempted::Permanent, Disposition::Dead) => {}
            (Attempted::Failed, Disposition::Dead) if policy.at_most_once => {}
            (Attempted::Retry { .. } | Attempted::Failed, Disposition::Dead) => {
                prop_assert!(used >= policy.max_attempts, "dead after {used} attempts");
            }
            (Attempted::Retry { after }, Disposition::RetryAt { at_ms }) => {
                prop_assert!(used < policy.max_attempts);
                prop_assert!(at_ms >= now, "a retry is never scheduled in the past");
                let wait = Duration::from_millis((at_ms - now) as u64);
                prop_assert!(wait <= policy.backoff_max, "wait {wait:?} over the max");
                if let Some(after) = after {
                    // The plugin's wish, no sooner than the floor, capped at the max (and at
                    // the end of time).
                    let want = (*after)
                        .max(policy.backoff_base.min(MIN_WISH))
                        .min(policy.backoff_max);
                    let room = Duration::from_millis((i64::MAX - now) as u64);
                    prop_assert_eq!(wait, Duration::from_millis(want.min(room).as_millis() as u64));
                } else {
                    prop_assert!(wait <= cap(&policy, used));
                }
            }
            (Attempted::NotStarted { tries }, Disposition::RetryAt { at_ms }) => {
                // Never dead, whatever the budget used and the delivery mode; within its tries'
                // cap, but never sooner than `MIN_WISH` (or the end of time).
                prop_assert!(at_ms >= now, "a retry is never scheduled in the past");
                let wait = Duration::from_millis((at_ms - now) as u64);
                let room = Duration::from_millis((i64::MAX - now) as u64);
                prop_assert!(wait >= MIN_WISH.min(room), "{wait:?}");
                prop_assert!(wait <= cap(&policy, *tries).max(MIN_WISH));
            }
            (Attempted::Failed, Disposition::RetryAt { at_ms }) => {
                prop_assert!(!policy.at_most_once, "at-most-once never runs a failed attempt again");
                prop_assert!(used < policy.max_attempts);
                prop_assert!(at_ms >= now, "a retry is never scheduled in the past");
                let wait = Duration::from_millis((at_ms - now) as u64);
                prop_assert!(wait <= cap(&policy, used));
            }
            (attempted, other) => prop_assert!(false, "{attempted:?} became {other:?}"),
        }
    }

    /// A delivery that keeps failing runs exactly `max_attempts` times (at-least-once), then is
    /// dead; a replay (which restarts `budget_used` at 0) buys exactly `max_attempts` more.
    #[test]
    fn failures_are_dead_exactly_at_max_attempts_and_replay_restarts_the_budget(
        policy in policies(),
        endings in proptest::collection::vec(
            prop_oneof![Just(Attempted::Failed), Just(Attempted::Retry { after: None }),
                        any::<u32>().prop_map(|ms| Attempted::Retry {
                            after: Some(Duration::from_millis(ms.into())) })],
            1..200),
        replays in 0usize..3,
        jitter in jitters(),
    ) {
        let policy = RetryPolicy { at_most_once: false, ..policy };
        let mut endings = endings.into_iter().cycle();
        for _ in 0..=replays {
            let mut runs = 0u32;
            loop {
                runs += 1;
                let attempted = endings.next().expect("cycled");
                match decide(&policy, attempted, runs, 1_700_000_000_000, jitter) {
                    Disposition::Dead => break,
                    Disposition::RetryAt { .. } => {}
                    Disposition::Done { .. } => prop_assert!(false, "a failure is never done"),
                }
                prop_assert!(runs < policy.max_attempts, "still retrying after {runs} runs");
            }
            prop_assert_eq!(runs, policy.max_attempts);
        }
    }

    #[test]
    fn stale_exactly_when_a_newer_sequence_is_done(
        sequence in any::<i64>(), newest_done in proptest::option::of(any::<i64>()),
    ) {
        let got = superseded_by(sequence, newest_done);
        match newest_done {
            Some(done) if done > sequence => prop_assert_eq!(got, Some(done)),
            _ => prop_assert_eq!(got, None),
        }
    }
}
