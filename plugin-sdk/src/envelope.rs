//! [`Envelope`]: what a parser tells the host about a request; [`Response`]: what it answers
//! instead when the request is not an event.

use crate::input::{Header, header};

/// The identity and ordering of one event: what a [`Parser`](crate::Parser) extracts so the
/// host can deduplicate and order it. The host stores the id, the type and the key up to
/// 1 KiB each: a longer one makes the request a 400 `unparsable` naming the field.
///
/// ```
/// use plugin_sdk::Envelope;
///
/// let env = Envelope::new("evt_1", "invoice.paid").ordering_key("in_42").sequence(1_700_000_000);
/// assert_eq!(env.ordering_key.as_deref(), Some("in_42"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Envelope {
    /// The provider's id for this logical event, stable across the provider's retries:
    /// `(source, event_id)` is deduplicated forever.
    pub event_id: String,
    /// The event's type, e.g. `issues.opened` or `invoice.paid`.
    pub event_type: String,
    /// Events with the same key are handled one at a time, in `sequence` order; typically the
    /// id of the object the event is about.
    pub ordering_key: Option<String>,
    /// Position within the ordering key (e.g. the provider's creation time).
    ///
    /// An event older than one a handler already handled for its key is *stale*. What the
    /// handler gets of it is its own setting, `on_stale` in its `[plugins.<name>]`:
    ///
    /// - `"skip"` (the default): nothing; the delivery is marked `stale`. Right when the newest
    ///   state wins, such as syncing an object's latest version: an older snapshot would
    ///   overwrite a newer one.
    /// - `"deliver"`: the event, with [`Event::stale`](crate::Event::stale) set. Right for
    ///   additive events, such as payments to be summed: skipping a late one would silently
    ///   lose it (and a dead-lettered payment replayed after a newer one would be skipped too).
    ///
    /// An operator can deliver one stale event regardless with a forced replay
    /// (`hookd replay --force`).
    pub sequence: Option<u64>,
}

impl Envelope {
    /// An envelope with an id and a type, without ordering.
    pub fn new(event_id: impl Into<String>, event_type: impl Into<String>) -> Self {
        Envelope {
            event_id: event_id.into(),
            event_type: event_type.into(),
            ordering_key: None,
            sequence: None,
        }
    }

    /// Sets the ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets the sequence number within the ordering key.
    pub fn sequence(mut self, sequence: u64) -> Self {
        self.sequence = Some(sequence);
        self
    }
}

/// A parser's own answer to a request that is not an event (e.g. a provider's set-up
/// challenge), returned as [`ParseError::respond`](crate::ParseError::respond): the provider
/// gets it as-is and nothing is stored.
///
/// The status must be 200 to 599 and the headers valid HTTP, or the host treats the parse as
/// failed; headers and body together count against the plugin's output cap (64 KiB unless
/// configured).
///
/// ```
/// use plugin_sdk::Response;
///
/// let answer = Response::new(200, "the-challenge").with_header("Content-Type", "text/plain");
/// assert_eq!(answer.headers[0].name, "content-type");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// Response headers, names lower-case.
    pub headers: Vec<Header>,
    /// The response body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with `status` and `body`, without headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (the name is lower-cased).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(header(name, value));
        self
    }
}
