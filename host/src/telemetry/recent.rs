//! The last hour of ingest and attempt figures, minute by minute, in memory: what the
//! dashboard's overview charts without a time-series database.
//!
//! Invariant: bounded: at most [`MINUTES`] minutes are kept, each with one entry per source and
//! per (plugin, outcome) seen in it (names the configuration bounds); older minutes are dropped
//! as time moves on. Latency percentiles are estimated from the same buckets as the
//! `hookd_ingest_duration_seconds` histogram (linear within a bucket).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use super::INGEST_BUCKETS;

/// How many minutes are kept (the current one included).
pub const MINUTES: usize = 60;
const MINUTE_MS: i64 = 60_000;

/// The last hour, oldest minute first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recent {
    /// [`MINUTES`] entries, one per minute ending with the current one (empty where nothing
    /// happened).
    pub minutes: Vec<Minute>,
}

/// One minute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Minute {
    /// Its start, ms since the epoch (a multiple of 60 000).
    pub start_ms: i64,
    /// Per source (by name), its requests.
    pub ingest: Vec<SourceMinute>,
    /// Per plugin and outcome, its attempts.
    pub attempts: Vec<AttemptMinute>,
}

/// One source's requests in one minute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceMinute {
    pub source: String,
    /// `(outcome, count)`, by outcome name; only outcomes that occurred.
    pub outcomes: Vec<(String, u64)>,
    /// Median acknowledgement time (request start to answer), ms.
    pub ack_p50_ms: Option<f64>,
    /// 99th percentile acknowledgement time, ms.
    pub ack_p99_ms: Option<f64>,
}

/// One plugin's attempts with one outcome in one minute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptMinute {
    pub plugin: String,
    pub outcome: String,
    pub count: u64,
}

/// The minutes kept, newest last.
#[derive(Default)]
pub(super) struct History(Mutex<VecDeque<Bucket>>);

struct Bucket {
    start_ms: i64,
    ingest: BTreeMap<String, SourceBucket>,
    attempts: BTreeMap<(String, &'static str), u64>,
}

#[derive(Default)]
struct SourceBucket {
    outcomes: BTreeMap<&'static str, u64>,
    /// Counts per latency bucket of [`INGEST_BUCKETS`], plus one past the last bound.
    latency: [u64; INGEST_BUCKETS.len() + 1],
}

impl History {
    pub(super) fn ingest(&self, now_ms: i64, source: &str, outcome: &'static str, took: Duration) {
        self.with_minute(now_ms, |bucket| {
            let entry = match bucket.ingest.get_mut(source) {
                Some(entry) => entry,
                None => bucket.ingest.entry(source.to_owned()).or_default(),
            };
            *entry.outcomes.entry(outcome).or_default() += 1;
            let secs = took.as_secs_f64();
            let i = INGEST_BUCKETS
                .iter()
                .position(|bound| secs <= *bound)
                .unwrap_or(INGEST_BUCKETS.len());
            entry.latency[i] += 1;
        });
    }

    pub(super) fn attempt(&self, now_ms: i64, plugin: &str, outcome: &'static str) {
        self.with_minute(now_ms, |bucket| {
            *bucket
                .attempts
                .entry((plugin.to_owned(), outcome))
                .or_default() += 1;
        });
    }

    /// The minute holding `now_ms`, made (and the oldest dropped) if it is new.
    fn with_minute(&self, now_ms: i64, f: impl FnOnce(&mut Bucket)) {
        let start_ms = now_ms - now_ms.rem_euclid(MINUTE_MS);
        let mut minutes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // A clock that stepped back counts into the newest minute rather than reordering.
        if minutes.back().is_none_or(|b| b.start_ms < start_ms) {
            minutes.push_back(Bucket {
                start_ms,
                ingest: BTreeMap::new(),
                attempts: BTreeMap::new(),
            });
        }
        let oldest_kept = start_ms - (MINUTES as i64 - 1) * MINUTE_MS;
        while minutes.front().is_some_and(|b| b.start_ms < oldest_kept) {
            minutes.pop_front();
        }
        f(minutes.back_mut().expect("just made"));
    }

    pub(super) fn view(&self, now_ms: i64) -> Recent {
        let current = now_ms - now_ms.rem_euclid(MINUTE_MS);
        let minutes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let view = (0..MINUTES as i64)
            .rev()
            .map(|back| {
                let start_ms = current - back * MINUTE_MS;
                let Some(bucket) = minutes.iter().find(|b| b.start_ms == start_ms) else {
                    return Minute {
                        start_ms,
                        ..Minute::default()
                    };
                };
                Minute {
                    start_ms,
                    ingest: bucket
                        .ingest
                        .iter()
                        .map(|(source, b)| SourceMinute {
                            source: source.clone(),
                            outcomes: b
                                .outcomes
                                .iter()
                                .map(|(o, n)| ((*o).to_owned(), *n))
                                .collect(),
                            ack_p50_ms: percentile_ms(&b.latency, 0.50),
                            ack_p99_ms: percentile_ms(&b.latency, 0.99),
                        })
                        .collect(),
                    attempts: bucket
                        .attempts
                        .iter()
                        .map(|((plugin, outcome), count)| AttemptMinute {
                            plugin: plugin.clone(),
                            outcome: (*outcome).to_owned(),
                            count: *count,
                        })
                        .collect(),
                }
            })
            .collect();
        Recent { minutes: view }
    }
}

/// The `q` quantile of the counts per bucket, in ms: linear within the bucket it falls in (a
/// value past the last bound is reported as that bound).
fn percentile_ms(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, n) in counts.iter().enumerate() {
        if *n > 0 && (below + n) as f64 >= rank {
            let Some(upper) = INGEST_BUCKETS.get(i) else {
                return INGEST_BUCKETS.last().map(|b| b * 1000.0);
            };
            let lower = if i == 0 { 0.0 } else { INGEST_BUCKETS[i - 1] };
            let within = ((rank - below as f64) / *n as f64).clamp(0.0, 1.0);
            return Some((lower + (upper - lower) * within) * 1000.0);
        }
        below += n;
    }
    INGEST_BUCKETS.last().map(|b| b * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000; // a minute boundary

    #[test]
    fn minutes_are_kept_for_an_hour_and_counted_apart() {
        let history = History::default();
        history.ingest(T0, "gh", "accepted", Duration::from_millis(2));
        history.ingest(T0 + 59_999, "gh", "accepted", Duration::from_millis(2));
        history.ingest(T0 + 60_000, "gh", "duplicate", Duration::from_millis(2));
        history.attempt(T0 + 60_000, "classifier", "ok");
        let view = history.view(T0 + 60_000);
        assert_eq!(view.minutes.len(), MINUTES);
        let [.., before, now] = &view.minutes[..] else {
            panic!()
        };
        assert_eq!(
            (before.start_ms, before.ingest[0].outcomes.clone()),
            (T0, vec![("accepted".to_owned(), 2)])
        );
        assert_eq!(now.ingest[0].outcomes, vec![("duplicate".to_owned(), 1)]);
        assert_eq!(
            now.attempts,
            vec![AttemptMinute {
                plugin: "classifier".into(),
                outcome: "ok".into(),
                count: 1
            }]
        );
        // An hour on, the first minute is gone from the view and from memory.
        let later = T0 + MINUTES as i64 * MINUTE_MS;
        history.ingest(later, "gh", "accepted", Duration::from_millis(2));
        let view = history.view(later);
        assert!(view.minutes.iter().all(|m| m.start_ms > T0));
        assert_eq!(history.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn percentiles_fall_in_the_bucket_of_their_rank() {
        let history = History::default();
        for _ in 0..99 {
            history.ingest(T0, "s", "accepted", Duration::from_micros(700));
        }
        history.ingest(T0, "s", "accepted", Duration::from_millis(700));
        let minute = &history.view(T0).minutes[MINUTES - 1].ingest[0];
        let p50 = minute.ack_p50_ms.unwrap();
        let p99 = minute.ack_p99_ms.unwrap();
        // 0.7 ms lies in (0.5, 1] ms; the slowest request alone is past the 99th rank.
        assert!((0.5..=1.0).contains(&p50), "{p50}");
        assert!((0.5..=1.0).contains(&p99), "{p99}");
        assert_eq!(percentile_ms(&[0; INGEST_BUCKETS.len() + 1], 0.5), None);
        let mut slow = [0; INGEST_BUCKETS.len() + 1];
        slow[INGEST_BUCKETS.len()] = 1;
        assert_eq!(percentile_ms(&slow, 0.99), Some(10_000.0));
    }
}
