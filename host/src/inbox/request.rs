//! What the inbox stores of a request: its headers, body and receipt time.
//!
//! Invariant: a [`RawRequest`] is only ever built from a [`Verified`] request (or loaded back
//! from quarantine, which only holds verified ones), so nothing unverified is stored.

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
    /// The verified request's headers (values decoded lossily as UTF-8) and body, received at
    /// `received_at_ms`.
    pub fn from_verified(verified: Verified, received_at_ms: i64) -> Self {
        let (header_map, body) = verified.into_parts();
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
