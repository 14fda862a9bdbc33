//! The domain vocabulary every layer shares: envelopes, delivery states, attempt outcomes.
//!
//! Invariant: these types carry no behaviour that touches I/O; `inbox` stores them, `runtime`
//! produces them, `dispatch` decides with them.

use std::{collections::BTreeMap, fmt};

use serde::Serialize;

use crate::ids::EventId;

/// One request header, name lower-cased, in arrival order.
pub type Header = (String, String);

/// What a parser (or the scheme's id header) says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub event_id: EventId,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<u64>,
}

/// The life of one `(event, handler)` delivery. The names are a contract (DESIGN.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Due now (or at `next_attempt_at`).
    Pending,
    /// Leased by a worker.
    Running,
    /// Waiting for `next_attempt_at` after a failed attempt.
    Retrying,
    /// Handled; the output is stored.
    Done,
    /// Needs a human: replay it.
    Dead,
    /// Older `sequence` than one already done for the same ordering key; never shown to the handler.
    Stale,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 6] = [
        Self::Pending,
        Self::Running,
        Self::Retrying,
        Self::Done,
        Self::Dead,
        Self::Stale,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Done => "done",
            Self::Dead => "dead",
            Self::Stale => "stale",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// States that still need work (they count towards the backlog).
    pub fn is_open(self) -> bool {
        matches!(self, Self::Pending | Self::Running | Self::Retrying)
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt ended. The names are a contract (DESIGN.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    Ok,
    Retry,
    Permanent,
    Trap,
    Timeout,
    /// The worker running it died (its lease expired); nobody knows if the handler acted.
    Abandoned,
    /// The handler's state writes lost a race; the attempt is re-run and not counted.
    Conflict,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Retry => "retry",
            Self::Permanent => "permanent",
            Self::Trap => "trap",
            Self::Timeout => "timeout",
            Self::Abandoned => "abandoned",
            Self::Conflict => "conflict",
        }
    }
}

/// Where a delivery goes after an attempt: decided by `dispatch::policy`, written by `inbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    Done { output: Option<String> },
    RetryAt { at_ms: i64 },
    Dead,
}

/// An attempt's buffered state traffic: the versions it read and the writes it wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateChanges {
    /// Key → version seen at first read or write (0 = absent). Checked at commit.
    pub versions: BTreeMap<String, i64>,
    /// Key → new value (`None` = delete).
    pub writes: BTreeMap<String, Option<Vec<u8>>>,
}

impl StateChanges {
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty() && self.writes.is_empty()
    }
}

/// Milliseconds since the Unix epoch: the unit of every stored time.
pub fn unix_ms(time: std::time::SystemTime) -> i64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `text` with control characters (newlines, ESC, …) and bidirectional overrides escaped, for
/// log lines: a value from a request or a plugin can neither forge a line nor drive a terminal.
pub fn escape_control(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(unsafe_char) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_for_logs() {
        assert_eq!(super::escape_control("evt_1 ok"), "evt_1 ok");
        assert_eq!(
            super::escape_control("a\nINFO forged\r\u{1b}[31m\u{202e}z"),
            "a\\nINFO forged\\r\\u{1b}[31m\\u{202e}z"
        );
    }
}
