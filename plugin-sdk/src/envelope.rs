//! [`Envelope`]: what a parser tells the host about a request.

/// The identity and ordering of one event: what a [`Parser`](crate::Parser) extracts so the
/// host can deduplicate and order it.
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
    /// Position within the ordering key (e.g. the provider's creation time); an event older
    /// than one already handled for its key is marked stale and never handled.
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
