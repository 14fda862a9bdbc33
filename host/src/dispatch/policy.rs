//! Retry policy as pure functions: what happens to a delivery after an attempt.
//!
//! Invariant: no clock and no randomness inside — `now` and the jitter draw are arguments, so
//! every decision is unit-tested without sleeping.

use std::time::Duration;

use crate::model::Disposition;

/// The retry settings of one plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

/// How an attempt ended, as far as the policy cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok(Option<String>),
    /// The handler asked to retry, optionally not before `after`.
    Retry {
        after: Option<Duration>,
    },
    /// A trap, timeout or other failure of the attempt itself: retried with backoff.
    Failed,
    /// Never retry.
    Permanent,
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

/// Where a delivery goes after an attempt. `budget_used` counts this attempt.
pub fn decide(
    policy: &RetryPolicy,
    verdict: Verdict,
    budget_used: u32,
    now_ms: i64,
    jitter: f64,
) -> Disposition {
    let delay = match verdict {
        Verdict::Ok(output) => return Disposition::Done { output },
        Verdict::Permanent => return Disposition::Dead,
        _ if budget_used >= policy.max_attempts => return Disposition::Dead,
        // The plugin's own wish is honoured, within the plugin's configured maximum.
        Verdict::Retry { after: Some(after) } => after.min(policy.backoff_max),
        Verdict::Retry { after: None } | Verdict::Failed => backoff(policy, budget_used, jitter),
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
    fn decisions() {
        let now = 10_000;
        let cases = [
            (
                Verdict::Ok(Some("x".into())),
                1,
                Disposition::Done {
                    output: Some("x".into()),
                },
            ),
            (Verdict::Permanent, 1, Disposition::Dead),
            (
                Verdict::Failed,
                1,
                Disposition::RetryAt { at_ms: now + 1000 },
            ),
            (
                Verdict::Failed,
                3,
                Disposition::RetryAt { at_ms: now + 4000 },
            ),
            (Verdict::Failed, 4, Disposition::Dead),
            (
                Verdict::Retry { after: None },
                2,
                Disposition::RetryAt { at_ms: now + 2000 },
            ),
            (
                Verdict::Retry {
                    after: Some(Duration::from_millis(250)),
                },
                1,
                Disposition::RetryAt { at_ms: now + 250 },
            ),
            (
                Verdict::Retry {
                    after: Some(Duration::from_secs(3600)),
                },
                1,
                Disposition::RetryAt { at_ms: now + 5000 },
            ),
            (
                Verdict::Retry {
                    after: Some(Duration::ZERO),
                },
                4,
                Disposition::Dead,
            ),
        ];
        for (verdict, used, expected) in cases {
            assert_eq!(
                decide(&POLICY, verdict.clone(), used, now, 1.0),
                expected,
                "{verdict:?} used={used}"
            );
        }
    }
}
