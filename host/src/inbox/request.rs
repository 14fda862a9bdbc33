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
}

impl RawRequest {
    /// The verified request's headers (values as text: [`header_text`]) and body, received at
    /// `received_at_ms`.
    pub fn from_verified(verified: Verified, received_at_ms: i64) -> Self {
        let (header_map, body) = verified.into_parts();
        let headers = header_map
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), header_text(value.as_bytes())))
            .collect();
        Self {
            headers,
            body,
            received_at_ms,
        }
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

/// A header value as text: UTF-8 when it is, else read as ISO-8859-1 (each byte one character,
/// as HTTP/1.1 defined header text). No byte is lost: two values that differ and are both UTF-8,
/// or both not, stay different (with U+FFFD for every byte that is not UTF-8, `q-\xe9` and
/// `q-\xe8` were one event id, the second acknowledged as a duplicate and never delivered). A
/// value that is not UTF-8 may read as one that is does (`\xff\xfe` and the UTF-8 of `ÿþ` both
/// read `ÿþ`): HTTP gives header bytes no other meaning, and providers' ids are ASCII.
pub fn header_text(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) => text.to_owned(),
        Err(_) => value.iter().map(|&byte| char::from(byte)).collect(),
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
