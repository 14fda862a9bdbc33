//! Retry policy as pure functions: how an attempt's result is classified ([`Classified`]) and
//! where its delivery goes next ([`decide`]).
//!
//! Invariant: no clock, no randomness and no I/O inside — `now` and the jitter draw are
//! arguments, so every decision is unit-tested without sleeping.

use std::time::Duration;

use crate::{
    config::{DeliveryMode, PluginConfig},
    model::{AttemptOutcome, Disposition},
    runtime::{CallError, HandleVerdict, StateLimit, StateRefused},
    text,
};

/// The retry settings of one plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// `delivery = "at-most-once"`: an attempt that ended without the handler's own verdict
    /// ([`Attempted::Failed`]) is never run again by the host.
    pub at_most_once: bool,
}

impl From<&PluginConfig> for RetryPolicy {
    fn from(plugin: &PluginConfig) -> Self {
        Self {
            max_attempts: plugin.max_attempts,
            backoff_base: plugin.backoff_base,
            backoff_max: plugin.backoff_max,
            at_most_once: plugin.delivery == DeliveryMode::AtMostOnce,
        }
    }
}

/// How an attempt ended, as far as [`decide`] cares. (The runtime's `HandleVerdict` is what the
/// handler said; this is what the policy makes of it.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    Ok(Option<String>),
    /// The handler asked to retry, optionally not before `after`.
    Retry {
        after: Option<Duration>,
    },
    /// The attempt ended without the handler's own verdict, at a point the host cannot know: a
    /// trap, a timeout, its host memory refused, an output over its cap, a state write over the
    /// plugin's total, its worker gone. Whether the handler acted (an outbound call made) is
    /// unknown: retried with backoff, or dead at once under at-most-once.
    Failed,
    /// Never retry.
    Permanent,
    /// The host could not start the handler (the calls in flight held its plugin memory) and
    /// nothing of the call went out: the attempt is not counted against `max_attempts` under
    /// either delivery mode. It is due again after the backoff of its `tries` (the delivery's
    /// attempts so far, these included), no sooner than [`MIN_WISH`]: repeated refusals wait
    /// longer and longer, up to `backoff_max`.
    NotStarted {
        tries: u32,
    },
}

/// An attempt's result as its history row records it and as [`decide`] is given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub outcome: AttemptOutcome,
    pub attempted: Attempted,
    /// Why an attempt did not succeed; `None` exactly when it did.
    pub error: Option<AttemptError>,
}

/// The stored `error_kind` and error text of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    pub kind: &'static str,
    /// Capped at [`text::MAX_REASON_BYTES`]: a handler's reason is untrusted text of any size.
    pub message: String,
}

impl AttemptError {
    fn new(kind: &'static str, message: String) -> Self {
        Self {
            kind,
            message: text::cap(message, text::MAX_REASON_BYTES),
        }
    }
}

impl Classified {
    /// Classifies what a handler call returned.
    pub fn from_call(result: Result<HandleVerdict, CallError>) -> Self {
        let failed = |outcome, attempted, error| Self {
            outcome,
            attempted,
            error: Some(error),
        };
        match result {
            Ok(HandleVerdict::Ok(output)) => Self {
                outcome: AttemptOutcome::Ok,
                attempted: Attempted::Ok(output),
                error: None,
            },
            Ok(HandleVerdict::Retry { reason, after }) => failed(
                AttemptOutcome::Retry,
                Attempted::Retry { after },
                AttemptError::new("retry", reason),
            ),
            Ok(HandleVerdict::Permanent(reason)) => failed(
                AttemptOutcome::Permanent,
                Attempted::Permanent,
                AttemptError::new("permanent", reason),
            ),
            Err(CallError::StateRefused(refused)) => Self::state_refused(refused),
            Err(e @ CallError::NoMemoryToStart(_)) => failed(
                AttemptOutcome::Abandoned,
                // Its tries are the delivery's: the dispatcher, which knows them, sets them.
                Attempted::NotStarted { tries: 1 },
                AttemptError::new(e.kind(), e.to_string()),
            ),
            Err(e) => {
                let (outcome, attempted) = match e {
                    CallError::Timeout { .. } => (AttemptOutcome::Timeout, Attempted::Failed),
                    CallError::MissingRole(_) => (AttemptOutcome::Permanent, Attempted::Permanent),
                    _ => (AttemptOutcome::Trap, Attempted::Failed),
                };
                failed(
                    outcome,
                    attempted,
                    AttemptError::new(e.kind(), e.to_string()),
                )
            }
        }
    }

    /// A state write the host refused, during the call or when committing its writes. The same
    /// event writes the same again: over the attempt caps it is dead-lettered at once (raise
    /// the cap, then replay). Over the plugin's total it is retried with backoff: deletes by
    /// other deliveries, or a raised limit, may make room.
    pub fn state_refused(refused: StateRefused) -> Self {
        let (outcome, attempted) = match refused.limit {
            StateLimit::Attempt => (AttemptOutcome::Permanent, Attempted::Permanent),
            StateLimit::Total => (AttemptOutcome::Retry, Attempted::Failed),
        };
        let error = CallError::StateRefused(refused);
        Self {
            outcome,
            attempted,
            error: Some(AttemptError::new(error.kind(), error.to_string())),
        }
    }
}

/// Delay before retry number `failures + 1`: exponential from `base` (base, 2·base, 4·base …),
/// capped at `max`, with "equal jitter": half fixed, half drawn from `jitter` in `[0, 1)`, so
/// retries of many deliveries that failed together spread out instead of stampeding.
pub fn backoff(policy: &RetryPolicy, failures: u32, jitter: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(32);
    let full = policy
        .backoff_base
        .saturating_mul(1u32 << exp.min(31))
        .min(policy.backoff_max);
    let half = full / 2;
    // NaN is no draw at all; the final cap absorbs float rounding on huge durations.
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    (half + half.mul_f64(jitter)).min(full)
}

/// The soonest a plugin's `after` may bring its retry (unless its `backoff_base` is shorter).
pub const MIN_WISH: Duration = Duration::from_secs(1);

/// Where a delivery goes after an attempt. `budget_used` counts this attempt.
pub fn decide(
    policy: &RetryPolicy,
    attempted: Attempted,
    budget_used: u32,
    now_ms: i64,
    jitter: f64,
) -> Disposition {
    let delay = match attempted {
        Attempted::Ok(output) => return Disposition::Done { output },
        Attempted::Permanent => return Disposition::Dead,
        Attempted::NotStarted { tries } => backoff(policy, tries, jitter).max(MIN_WISH),
        Attempted::Failed if policy.at_most_once => return Disposition::Dead,
        _ if budget_used >= policy.max_attempts => return Disposition::Dead,
        // The plugin's own wish is honoured (a service's `Retry-After` may bring a retry sooner
        // than the backoff), within the plugin's configured maximum and no sooner than
        // [`MIN_WISH`] (or `backoff_base` if less): a service answering `Retry-After: 0`
        // would otherwise spend every attempt at once.
        Attempted::Retry { after: Some(after) } => after
            .max(policy.backoff_base.min(MIN_WISH))
            .min(policy.backoff_max),
        Attempted::Retry { after: None } | Attempted::Failed => {
            backoff(policy, budget_used, jitter)
        }
    };
    // Saturating: a huge `backoff_max_ms` means "much later", never a wrap into the past.
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    Disposition::RetryAt {
        at_ms: now_ms.saturating_add(delay_ms),
    }
}

/// The ordering rule's one decision: a delivery with an ordering key and `sequence` is stale —
/// recorded, never run — exactly when a strictly newer sequence is already done for its key
/// (same source and handler); `newest_done` is the highest such done sequence. Returns that
/// newer sequence. Equal sequences both run; without a done one nothing is stale.
pub fn superseded_by(sequence: i64, newest_done: Option<i64>) -> Option<i64> {
    newest_done.filter(|done| *done > sequence)
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        backoff_base: Duration::from_millis(1000),
        backoff_max: Duration::from_millis(5000),
        at_most_once: false,
    };

    #[test]
    fn backoff_doubles_and_caps_with_bounded_jitter() {
        let cases = [
            // (failures, jitter, expected ms)
            (1, 0.0, 500),
            (1, 1.0, 1000),
            (2, 0.0, 1000),
            (2, 0.5, 1500),
            (3, 1.0, 4000),
            (4, 1.0, 5000),
            (40, 0.99, 4975),
            (0, 1.0, 1000),
        ];
        for (failures, jitter, expected) in cases {
            assert_eq!(
                backoff(&POLICY, failures, jitter).as_millis(),
                expected,
                "failures={failures} jitter={jitter}"
            );
        }
    }

    #[test]
    fn a_handlers_retry_keeps_its_wish_and_reason() {
        let classified = Classified::from_call(Ok(HandleVerdict::Retry {
            reason: "busy".into(),
            after: Some(Duration::from_secs(7)),
        }));
        assert_eq!(
            classified,
            Classified {
                outcome: AttemptOutcome::Retry,
                attempted: Attempted::Retry {
                    after: Some(Duration::from_secs(7))
                },
                error: Some(AttemptError {
                    kind: "retry",
                    message: "busy".into()
                }),
            }
        );
    }

    #[test]
    fn a_timeout_is_a_failure_retried_with_backoff() {
        let classified = Classified::from_call(Err(CallError::Timeout {
            limit: Duration::from_secs(1),
            key: "timeout_ms",
        }));
        assert_eq!(
            (classified.outcome, classified.attempted),
            (AttemptOutcome::Timeout, Attempted::Failed)
        );
    }

    #[test]
    fn a_missing_handler_role_is_permanent() {
        let classified = Classified::from_call(Err(CallError::MissingRole("handler")));
        assert_eq!(classified.attempted, Attempted::Permanent);
    }

    #[test]
    fn a_state_write_over_the_attempt_cap_is_permanent() {
        let classified = Classified::state_refused(StateRefused {
            limit: StateLimit::Attempt,
            message: "too many keys".into(),
        });
        assert_eq!(
            (classified.outcome, classified.attempted),
            (AttemptOutcome::Permanent, Attempted::Permanent)
        );
    }

    #[test]
    fn a_state_write_over_the_plugins_total_is_retried_with_backoff() {
        let classified = Classified::from_call(Err(CallError::StateRefused(StateRefused {
            limit: StateLimit::Total,
            message: "over state_max_keys".into(),
        })));
        assert_eq!(
            (
                classified.outcome,
                classified.attempted,
                classified.error.unwrap().kind
            ),
            (AttemptOutcome::Retry, Attempted::Failed, "state_quota")
        );
    }

    #[test]
    fn a_handlers_reason_is_stored_capped() {
        let classified = Classified::from_call(Ok(HandleVerdict::Permanent("x".repeat(1_000_000))));
        assert!(classified.error.unwrap().message.len() < 2 * text::MAX_REASON_BYTES);
    }

    #[test]
    fn decisions() {
        let now = 10_000;
        let cases = [
            (
                Attempted::Ok(Some("x".into())),
                1,
                Disposition::Done {
                    output: Some("x".into()),
                },
            ),
            (Attempted::Permanent, 1, Disposition::Dead),
            (
                Attempted::Failed,
                1,
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Attempted::Failed,
                3,
                Disposition::RetryAt { at_ms: now + 4000 },
            ),
            (Attempted::Failed, 4, Disposition::Dead),
            (
                Attempted::Retry { after: None },
                2,
                Disposition::RetryAt { at_ms: now + 2000 },
            ),
            (
                Attempted::Retry {
                    after: Some(Duration::from_millis(1500)),
                },
                1,
                Disposition::RetryAt { at_ms: now + 1500 },
            ),
            // Sooner than the backoff, as the plugin asked: a wish may shorten it.
            (
                Attempted::Retry {
                    after: Some(Duration::from_millis(1200)),
                },
                3,
                Disposition::RetryAt { at_ms: now + 1200 },
            ),
            // Never sooner than `MIN_WISH` (a `Retry-After: 0` spends no attempt at once).
            (
                Attempted::Retry {
                    after: Some(Duration::from_millis(250)),
                },
                1,
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Attempted::Retry {
                    after: Some(Duration::ZERO),
                },
                3,
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Attempted::Retry {
                    after: Some(Duration::from_secs(3600)),
                },
                1,
                Disposition::RetryAt { at_ms: now + 5000 },
            ),
            (
                Attempted::Retry {
                    after: Some(Duration::ZERO),
                },
                4,
                Disposition::Dead,
            ),
            // Not started: never dead, whatever was used; later as it is tried again, never
            // sooner than 1 s.
            (
                Attempted::NotStarted { tries: 1 },
                4,
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Attempted::NotStarted { tries: 3 },
                4,
                Disposition::RetryAt { at_ms: now + 4000 },
            ),
            (
                Attempted::NotStarted { tries: 30 },
                4,
                Disposition::RetryAt { at_ms: now + 5000 },
            ),
        ];
        for (attempted, used, expected) in cases {
            assert_eq!(
                decide(&POLICY, attempted.clone(), used, now, 1.0),
                expected,
                "{attempted:?} used={used}"
            );
        }
        // At-most-once: what ended without the handler's verdict is dead at once; the handler's
        // own retry and an attempt that never started are still due again.
        let once = RetryPolicy {
            at_most_once: true,
            ..POLICY
        };
        let cases = [
            (Attempted::Failed, Disposition::Dead),
            (
                Attempted::Retry { after: None },
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Attempted::NotStarted { tries: 1 },
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
        ];
        for (attempted, expected) in cases {
            assert_eq!(
                decide(&once, attempted.clone(), 1, now, 1.0),
                expected,
                "{attempted:?}"
            );
        }
    }
}
