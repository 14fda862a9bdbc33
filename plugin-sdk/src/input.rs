//! What the host hands a plugin: a [`Request`] to parse or an [`Event`] to handle.
//!
//! Both carry the raw body exactly as the provider signed it; decoding it (as text or JSON)
//! is the plugin's choice, through [`Request::json`] / [`Event::json`].

use serde::{Serialize, de::DeserializeOwned};

use crate::BodyError;

/// One HTTP header as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header name, lower-cased by the host.
    pub name: String,
    /// The header value.
    pub value: String,
}

/// A webhook request whose signature the host has already verified; the input of a
/// [`Parser`](crate::Parser).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Request {
    /// The source name: the `{source}` in `POST /hooks/{source}`.
    pub source: String,
    /// The HTTP method, upper-case (`POST`; a request replayed from quarantine is a `POST`).
    pub method: String,
    /// The raw query string, without the `?`; empty when there is none (and for a request
    /// replayed from quarantine, whose query is not kept).
    pub query: String,
    /// Every request header in the order received; a header sent twice appears twice.
    pub headers: Vec<Header>,
    /// The raw request body, byte for byte as signed by the provider.
    pub body: Vec<u8>,
    /// When hookd received the request, in milliseconds since the Unix epoch.
    pub received_at_ms: u64,
}

impl Request {
    /// A `POST` on `source` with `body`, no query and no headers; add them with
    /// [`with_query`](Self::with_query) and [`with_header`](Self::with_header). Useful to
    /// unit-test a parser.
    pub fn new(source: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Request {
            source: source.into(),
            method: "POST".to_owned(),
            query: String::new(),
            headers: Vec::new(),
            body: body.into(),
            received_at_ms: 0,
        }
    }

    /// Sets the HTTP method (upper-cased, as the host hands it in).
    pub fn with_method(mut self, method: impl Into<String>) -> Self {
        self.method = method.into().to_ascii_uppercase();
        self
    }

    /// Sets the raw query string (without the `?`).
    pub fn with_query(mut self, query: impl Into<String>) -> Self {
        self.query = query.into();
        self
    }

    /// Sets when hookd received the request, in milliseconds since the Unix epoch.
    pub fn with_received_at_ms(mut self, received_at_ms: u64) -> Self {
        self.received_at_ms = received_at_ms;
        self
    }

    /// Replaces the body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Replaces the body with `value` as JSON.
    ///
    /// # Panics
    ///
    /// If `value` does not serialise (a test input that cannot be built).
    pub fn with_json<T: Serialize + ?Sized>(self, value: &T) -> Self {
        self.with_body(json_body(value))
    }

    /// Adds a header (the name is lower-cased, as the host does).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(header(name, value));
        self
    }

    /// The value of the first header called `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The raw body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, BodyError> {
        BodyError::text(&self.body)
    }

    /// The body decoded as JSON into `T` (use [`serde_json::Value`] for ad-hoc access).
    ///
    /// A parser runs on every request: a `#[derive(Deserialize)]` struct with only the fields
    /// the envelope needs decodes faster than a `Value`, because serde skips the other fields
    /// without building them (it took the `github` example parser's whole call, instance
    /// included, from 20 to 14 µs on a 1.7 KB body).
    ///
    /// The error converts into [`ParseError::invalid`](crate::ParseError::invalid) with `?`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, BodyError> {
        BodyError::json(&self.body)
    }
}

/// One event, deduplicated and durably stored; the input of a [`Handler`](crate::Handler).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// The source the event arrived on.
    pub source: String,
    /// The provider's event id, unique within the source.
    pub event_id: String,
    /// The event's type, e.g. `issues.opened`.
    pub event_type: String,
    /// The ordering key, if the parser gave one: events with the same key are handled one at
    /// a time, in `sequence` order.
    pub ordering_key: Option<String>,
    /// The position of the event within its ordering key, if the parser gave one.
    pub sequence: Option<u64>,
    /// Which attempt this is for this handler, starting at 1; counts retries and replays.
    pub attempt: u32,
    /// When hookd received the event, in milliseconds since the Unix epoch.
    pub received_at_ms: u64,
    /// The original request headers.
    pub headers: Vec<Header>,
    /// The original raw request body.
    pub body: Vec<u8>,
    /// A newer [`sequence`](Event::sequence) of this ordering key was already handled by this
    /// handler: it gets the event only because its `on_stale` is `"deliver"` or an operator
    /// forced a replay (see [`Envelope::sequence`](crate::Envelope::sequence)). A handler
    /// keeping "last state wins" data should ignore it; one adding things up counts it.
    pub stale: bool,
}

impl Event {
    /// A first attempt at an event of `event_type` with `body`, no ordering and no headers.
    /// Useful to unit-test a handler.
    pub fn new(
        source: impl Into<String>,
        event_id: impl Into<String>,
        event_type: impl Into<String>,
        body: impl Into<Vec<u8>>,
    ) -> Self {
        Event {
            source: source.into(),
            event_id: event_id.into(),
            event_type: event_type.into(),
            ordering_key: None,
            sequence: None,
            attempt: 1,
            received_at_ms: 0,
            headers: Vec::new(),
            body: body.into(),
            stale: false,
        }
    }

    /// Adds a header (the name is lower-cased, as the host does).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(header(name, value));
        self
    }

    /// Sets the attempt number (1 is the first attempt).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Sets the ordering key, as a parser's [`Envelope::ordering_key`](crate::Envelope::ordering_key) would.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Sets the sequence within the ordering key, as a parser's
    /// [`Envelope::sequence`](crate::Envelope::sequence) would.
    pub fn with_sequence(mut self, sequence: u64) -> Self {
        self.sequence = Some(sequence);
        self
    }

    /// Marks the event stale, as hookd hands it to a handler with `on_stale = "deliver"` (or
    /// after a forced replay) when a newer sequence of its key was already handled.
    pub fn with_stale(mut self, stale: bool) -> Self {
        self.stale = stale;
        self
    }

    /// Sets when hookd received the event, in milliseconds since the Unix epoch.
    pub fn with_received_at_ms(mut self, received_at_ms: u64) -> Self {
        self.received_at_ms = received_at_ms;
        self
    }

    /// Replaces the body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Replaces the body with `value` as JSON.
    ///
    /// # Panics
    ///
    /// If `value` does not serialise (a test input that cannot be built).
    pub fn with_json<T: Serialize + ?Sized>(self, value: &T) -> Self {
        self.with_body(json_body(value))
    }

    /// The value of the first header called `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The raw body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, BodyError> {
        BodyError::text(&self.body)
    }

    /// The body decoded as JSON into `T` (use [`serde_json::Value`] for ad-hoc access).
    ///
    /// The error converts into [`HandleError::permanent`](crate::HandleError::permanent) with
    /// `?`: the same bytes will not decode any better on a retry.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, BodyError> {
        BodyError::json(&self.body)
    }
}

fn json_body<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|e| panic!("the JSON body does not serialise: {e}"))
}

pub(crate) fn header(name: impl Into<String>, value: impl Into<String>) -> Header {
    Header {
        name: name.into().to_ascii_lowercase(),
        value: value.into(),
    }
}

fn find_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lookup_ignores_case_and_returns_the_first() {
        let req = Request::new("s", "{}")
            .with_header("X-GitHub-Event", "issues")
            .with_header("x-github-event", "second");
        assert_eq!(req.header("x-github-event"), Some("issues"));
        assert_eq!(req.header("X-GITHUB-EVENT"), Some("issues"));
        assert_eq!(req.header("x-missing"), None);
    }

    #[test]
    fn builders_set_every_field() {
        let req = Request::new("s", "x")
            .with_method("patch")
            .with_query("a=1")
            .with_received_at_ms(7)
            .with_json(&serde_json::json!({"k": 1}));
        assert_eq!(
            (req.method.as_str(), req.query.as_str(), req.received_at_ms),
            ("PATCH", "a=1", 7)
        );
        assert_eq!(req.body(), br#"{"k":1}"#);
        let ev = Event::new("s", "e", "t", "x")
            .with_ordering_key("k")
            .with_sequence(3)
            .with_attempt(2)
            .with_received_at_ms(9)
            .with_body("y");
        assert_eq!(
            (ev.ordering_key.as_deref(), ev.sequence, ev.attempt),
            (Some("k"), Some(3), 2)
        );
        assert_eq!((ev.received_at_ms, ev.body()), (9, &b"y"[..]));
        assert_eq!(ev.with_json(&[1, 2]).body(), b"[1,2]");
    }

    #[test]
    fn json_body_decodes_and_reports_errors() {
        let ev = Event::new("s", "e", "t", r#"{"n": 3}"#);
        let v: serde_json::Value = ev.json().unwrap();
        assert_eq!(v["n"], 3);
        let err = Event::new("s", "e", "t", "nope")
            .json::<serde_json::Value>()
            .unwrap_err();
        assert!(
            err.to_string().starts_with("body is not valid JSON"),
            "{err}"
        );
        let err = Event::new("s", "e", "t", r#"{"n": "three"}"#)
            .json::<std::collections::BTreeMap<String, u32>>()
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("body is JSON of another shape than expected: invalid type"),
            "{err}"
        );
        let err = Request::new("s", vec![0xff]).text().unwrap_err();
        assert!(
            err.to_string().starts_with("body is not valid UTF-8"),
            "{err}"
        );
    }
}
