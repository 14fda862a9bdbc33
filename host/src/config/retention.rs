//! `[retention]`: how long finished work keeps its payload and its id, as durations people
//! write (`"30d"`, `"12h"`, `"90s"`, `"forever"`), validated into [`Retention`].
//!
//! Invariant: a [`Retention`] never asks to prune sooner than [`MIN_DONE_AFTER`] after the work
//! finished, and every refusal names the key and the value it got.

use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// The shortest `done_after`: below it a just-finished event could lose its payload while an
/// operator is still looking at it. Tests and benchmarks use it; production wants days.
pub const MIN_DONE_AFTER: Duration = Duration::from_secs(1);

/// How long providers go on retrying an event (Stripe: up to three days): event ids forgotten
/// sooner after their work finished are warned about at start-up.
pub const PROVIDER_RETRY_WINDOW: Duration = Duration::from_secs(3 * 24 * 3600);

/// The most rows one pruning batch touches (per kind: payloads, forgotten ids, resolved
/// quarantine), so one batch is always a short transaction.
pub const MAX_BATCH_SIZE: usize = 10_000;

/// The word that means "never" for `done_after` and `dedupe_for`.
const FOREVER: &str = "forever";

/// `[retention]` exactly as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RetentionFile {
    /// After every delivery of an event is finished (`done`, `stale`, `discarded`), how long its
    /// body, headers, outputs and attempt rows are kept. 30 days: long enough to look into and
    /// replay last month's events, short enough that the database stops growing.
    done_after: String,
    /// After that, how long its `(source, event_id)` keeps deduplicating (a compact row).
    /// Forever by default: a provider's late retry must never run twice.
    dedupe_for: String,
    /// How long the pruner rests once it has caught up (it keeps going, batch after batch,
    /// while there is work).
    interval: String,
    /// Rows of each kind one batch (one short transaction) prunes at most.
    batch_size: usize,
}

impl Default for RetentionFile {
    fn default() -> Self {
        Self {
            done_after: "30d".into(),
            dedupe_for: FOREVER.into(),
            interval: "1m".into(),
            batch_size: 500,
        }
    }
}

/// The validated `[retention]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// `None`: payloads are kept forever (and nothing is pruned at all).
    pub done_after: Option<Duration>,
    /// `None`: a pruned event's id dedupes forever.
    pub dedupe_for: Option<Duration>,
    pub interval: Duration,
    pub batch_size: usize,
}

impl Default for Retention {
    fn default() -> Self {
        RetentionFile::default()
            .validate()
            .expect("the defaults are valid")
    }
}

impl Retention {
    /// How long after its work finished an event's id still dedupes (`done_after` and then
    /// `dedupe_for`); `None`: for good.
    pub fn remembers_ids_for(&self) -> Option<Duration> {
        Some(self.done_after?.saturating_add(self.dedupe_for?))
    }
}

impl RetentionFile {
    pub(super) fn validate(self) -> anyhow::Result<Retention> {
        let done_after = duration_or_forever("retention.done_after", &self.done_after)?;
        if let Some(after) = done_after
            && after < MIN_DONE_AFTER
        {
            bail!(
                "retention.done_after = {:?} is shorter than {}s: give a duration such as \"30d\" \
                 (or \"forever\" to keep every payload)",
                self.done_after,
                MIN_DONE_AFTER.as_secs()
            );
        }
        let dedupe_for = duration_or_forever("retention.dedupe_for", &self.dedupe_for)?;
        let interval = duration("retention.interval", &self.interval)?;
        if interval.is_zero() {
            bail!(
                "retention.interval = {:?} must be longer than zero",
                self.interval
            );
        }
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            bail!(
                "retention.batch_size = {} must be between 1 and {MAX_BATCH_SIZE}",
                self.batch_size
            );
        }
        Ok(Retention {
            done_after,
            dedupe_for,
            interval,
            batch_size: self.batch_size,
        })
    }
}

/// `value` of `key` as a duration, or `None` for `"forever"`.
fn duration_or_forever(key: &str, value: &str) -> anyhow::Result<Option<Duration>> {
    if value.trim() == FOREVER {
        return Ok(None);
    }
    duration(key, value).map(Some)
}

/// `value` of `key` as a duration (`humantime`'s grammar: `"30d"`, `"12h"`, `"1h 30m"`, `"90s"`,
/// `"500ms"`).
fn duration(key: &str, value: &str) -> anyhow::Result<Duration> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        anyhow::anyhow!(
            "{key} = {value:?} is not a duration ({e}): write e.g. \"30d\", \"12h\", \"90s\"{}",
            if key.ends_with("interval") {
                ""
            } else {
                " or \"forever\""
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> anyhow::Result<Retention> {
        let file: RetentionFile = toml::from_str(toml_text)?;
        file.validate()
    }

    #[test]
    fn the_defaults_keep_payloads_30_days_and_ids_forever() {
        assert_eq!(
            parse("").unwrap(),
            Retention {
                done_after: Some(Duration::from_secs(30 * 86_400)),
                dedupe_for: None,
                interval: Duration::from_secs(60),
                batch_size: 500,
            }
        );
    }

    #[test]
    fn durations_are_written_as_people_write_them() {
        let r = parse(
            "done_after = \"12h\"\ndedupe_for = \"90d\"\ninterval = \"90s\"\nbatch_size = 20",
        )
        .unwrap();
        assert_eq!(r.done_after, Some(Duration::from_secs(12 * 3600)));
        assert_eq!(r.dedupe_for, Some(Duration::from_secs(90 * 86_400)));
        assert_eq!(r.interval, Duration::from_secs(90));
        assert_eq!(r.batch_size, 20);
        let forever = parse("done_after = \"forever\"\ndedupe_for = \"forever\"").unwrap();
        assert_eq!((forever.done_after, forever.dedupe_for), (None, None));
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_key_and_the_value() {
        for (text, key, value) in [
            (
                "done_after = \"30 parsecs\"",
                "retention.done_after",
                "30 parsecs",
            ),
            ("dedupe_for = \"soon\"", "retention.dedupe_for", "soon"),
            ("interval = \"forever\"", "retention.interval", "forever"),
            ("done_after = \"10ms\"", "retention.done_after", "10ms"),
            ("interval = \"0s\"", "retention.interval", "0s"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(
                error.contains(key) && error.contains(&format!("{value:?}")),
                "{text}: {error}"
            );
        }
        let error = parse("batch_size = 0").unwrap_err().to_string();
        assert!(error.contains("retention.batch_size"), "{error}");
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let error = parse("keep_for = \"1d\"").unwrap_err().to_string();
        assert!(error.contains("keep_for"), "{error}");
    }
}
