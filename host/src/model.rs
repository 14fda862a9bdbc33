//! The domain vocabulary every layer shares: envelopes, delivery states, attempt outcomes.
//!
//! Invariant: these types carry no behaviour that touches I/O; `inbox` stores them, `runtime`
//! produces them, `dispatch` decides with them.

use std::{collections::BTreeMap, fmt};

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

/// The life of one `(event, handler)` delivery. The names are a contract (README "HTTP API").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Was dead; an operator closed it without running it again (`POST /admin/discard`).
    /// Finished work: retention prunes it like `done`; a replay can still run it again until then.
    Discarded,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 7] = [
        Self::Pending,
        Self::Running,
        Self::Retrying,
        Self::Done,
        Self::Dead,
        Self::Stale,
        Self::Discarded,
    ];

    /// States that still need work (they count towards the backlog).
    pub const OPEN: [DeliveryState; 3] = [Self::Pending, Self::Running, Self::Retrying];

    /// States nobody needs to act on again: an event whose deliveries are all in one of them
    /// is pruned by retention once they are old enough. `dead` is not one (it needs a human).
    pub const FINISHED: [DeliveryState; 3] = [Self::Done, Self::Stale, Self::Discarded];

    /// Open states not leased: they wait for their `next_attempt_at` (and their key's head).
    pub const WAITING: [DeliveryState; 2] = [Self::Pending, Self::Retrying];

    /// The states besides `done` a delivery that was done once may be in (replayed since:
    /// waiting, running, retrying, dead or discarded again); its event was handled all the
    /// same, so it still makes older sequences of its key stale. (`stale` is not one: a stale
    /// delivery's sequence is below one already handled, so it can make nothing stale.)
    pub const ONCE_DONE: [DeliveryState; 5] = [
        Self::Pending,
        Self::Running,
        Self::Retrying,
        Self::Dead,
        Self::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Done => "done",
            Self::Dead => "dead",
            Self::Stale => "stale",
            Self::Discarded => "discarded",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether this state is in [`DeliveryState::OPEN`].
    pub fn is_open(self) -> bool {
        Self::OPEN.contains(&self)
    }

    /// Whether this state is in [`DeliveryState::WAITING`].
    pub fn is_waiting(self) -> bool {
        Self::WAITING.contains(&self)
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one attempt ended. The names are a contract (README "HTTP API").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    Ok,
    Retry,
    Permanent,
    Trap,
    Timeout,
    /// The attempt ended without running to a verdict, for want of what runs it: its worker
    /// died (`lease_expired`: nobody knows if the handler acted), or the host gave it back
    /// before the handler could act (`plugin_unavailable`, `plugin_memory`: not counted).
    Abandoned,
    /// The handler's state writes lost a race; the attempt is re-run and not counted.
    Conflict,
}

impl AttemptOutcome {
    pub const ALL: [Self; 7] = [
        Self::Ok,
        Self::Retry,
        Self::Permanent,
        Self::Trap,
        Self::Timeout,
        Self::Abandoned,
        Self::Conflict,
    ];

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
    /// The limits the writes were made under; the commit enforces the plugin's total again
    /// (concurrent attempts may each fit while together they would not).
    pub limits: StateLimits,
}

/// The longest state key, in bytes: the runtime refuses a longer one from a plugin, and the admin
/// API from an operator.
pub const MAX_STATE_KEY_BYTES: usize = 1024;

/// The largest state value, in bytes (bounded so one write cannot bloat the database), for a
/// plugin's `state.set` and an operator's edit alike.
pub const MAX_STATE_VALUE_BYTES: usize = 1024 * 1024;

/// How much plugin state one plugin instance may write: per attempt (bounding host memory and
/// the size of one commit) and in total (bounding the database). Sizes count key + value bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Distinct keys one attempt may set or delete (`attempt_state_keys`).
    pub attempt_keys: usize,
    /// Bytes one attempt may buffer: keys and values it sets, keys it deletes (`attempt_state_kib`).
    pub attempt_bytes: u64,
    /// Keys the plugin may hold (`state_max_keys`).
    pub max_keys: u64,
    /// Bytes the plugin may hold (`state_max_mib`).
    pub max_bytes: u64,
}

impl StateLimits {
    /// The documented defaults: 1000 keys / 4 MiB per attempt, 100 000 keys / 256 MiB in total.
    pub const DEFAULT: Self = Self {
        attempt_keys: 1000,
        attempt_bytes: 4 * 1024 * 1024,
        max_keys: 100_000,
        max_bytes: 256 * 1024 * 1024,
    };
}

impl Default for StateLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a plugin instance holds in committed state: live keys and their key + value bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateUsage {
    pub keys: u64,
    pub bytes: u64,
}

impl StateChanges {
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty() && self.writes.is_empty()
    }
}

pub use crate::clock::unix_ms;
