//! What the inbox stores of a request: its headers, body and receipt time.
//!
//! Invariants:
//! - A [`RawRequest`] is only ever built from a [`Verified`] request (or loaded back from
//!   quarantine, which only holds verified ones), so nothing unverified is stored.
//! - Every backend stores headers as the same text (a JSON array of pairs), written and read
//!   only by the two functions here.

use bytes::Bytes;

use crate::{model::Header, verify::Verified};

/// A request the host has verified: the only thing the inbox stores as an event or quarantines.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub(super) headers: Vec<Header>,
    pub(super) body: Bytes,
    pub(super) received_at_ms: i64,
    /// The first header whose value was not UTF-8 (so decoded lossily), when it was received
    /// now; `None` for one loaded back from quarantine, whose headers were stored decoded.
    pub(super) not_utf8: Option<String>,
}

impl RawRequest {
    /// The verified request's headers (values decoded lossily as UTF-8) and body, received at
    /// `received_at_ms`.
    pub fn from_verified(verified: Verified, received_at_ms: i64) -> Self {
        let (header_map, body) = verified.into_parts();
        let not_utf8 = header_map
            .iter()
            .find(|(_, value)| std::str::from_utf8(value.as_bytes()).is_err())
            .map(|(name, _)| name.as_str().to_owned());
        let headers = header_map
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        Self {
            headers,
            body,
            received_at_ms,
            not_utf8,
        }
    }

    /// The first header whose value was not UTF-8 when it was received (its bytes became
    /// U+FFFD), if any; unknown (`None`) for a request loaded back from quarantine.
    pub fn not_utf8(&self) -> Option<&str> {
        self.not_utf8.as_deref()
    }

    /// Headers, names lower-cased, in arrival order.
    pub fn headers(&self) -> &[Header] {
        &self.headers
    }

    /// The body as received.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// When hookd received it, in unix milliseconds.
    pub fn received_at_ms(&self) -> i64 {
        self.received_at_ms
    }
}

/// Headers as stored with an event or a quarantined request: a JSON array of pairs.
pub(super) fn headers_json(headers: &[Header]) -> String {
    serde_json::to_string(headers).expect("string pairs serialize")
}

/// Headers back from their stored JSON (none if the text is not such an array).
pub(super) fn headers_from_json(text: &str) -> Vec<Header> {
    serde_json::from_str(text).unwrap_or_default()
}
