//! Reading untrusted header values: length caps, repeated headers, signature budgets,
//! timestamps, and strict decoding of a 32-byte tag.
//!
//! Invariant: every function here is total over attacker-controlled input — it returns a
//! `VerifyError` (or "no tag"), never panics, and never reads more than `MAX_HEADER_LEN` bytes
//! of any value or accepts more than `MAX_SIGNATURES` signatures.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::{Encoding, MAX_HEADER_LEN, MAX_SIGNATURES, VerifyError};

/// Length of an HMAC-SHA256 tag in bytes.
pub(crate) const TAG_LEN: usize = 32;

/// An HMAC-SHA256 tag as decoded from a header (or as computed).
pub(crate) type Tag = [u8; TAG_LEN];

pub(crate) fn malformed(header: &HeaderName, reason: &'static str) -> VerifyError {
    VerifyError::MalformedHeader {
        header: header.clone(),
        reason,
    }
}

/// The value of a header that must appear exactly once.
pub(crate) fn single<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<&'a str, VerifyError> {
    at_most_once(headers, name)?.ok_or_else(|| VerifyError::MissingHeader(name.clone()))
}

/// The value of a header that may be absent but must not be repeated.
pub(crate) fn at_most_once<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a str>, VerifyError> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(malformed(name, "header appears more than once"));
    }
    text(name, first).map(Some)
}

/// All values of a signature-only header (which may repeat); at least one.
pub(crate) fn pooled<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Vec<&'a str>, VerifyError> {
    let mut out = Vec::new();
    // Repeated lines mean what one line of them joined means (RFC 9110 §5.3), so the cap on a
    // value's length holds for them together, not per line.
    let mut total = 0;
    for value in headers.get_all(name) {
        // Every value holds at least one signature (empty ones are refused), so this bounds
        // the work before the per-signature budget takes over.
        if out.len() == MAX_SIGNATURES {
            return Err(too_many(name));
        }
        total += value.len() + usize::from(!out.is_empty());
        if total > MAX_HEADER_LEN {
            return Err(VerifyError::HeaderTooLong {
                header: name.clone(),
                max: MAX_HEADER_LEN,
            });
        }
        out.push(text(name, value)?);
    }
    if out.is_empty() {
        return Err(VerifyError::MissingHeader(name.clone()));
    }
    Ok(out)
}

/// A header value as text: capped, visible ASCII and spaces (no tab, which `to_str` lets
/// through and which an event id would then carry), non-empty.
fn text<'a>(name: &HeaderName, value: &'a HeaderValue) -> Result<&'a str, VerifyError> {
    if value.len() > MAX_HEADER_LEN {
        return Err(VerifyError::HeaderTooLong {
            header: name.clone(),
            max: MAX_HEADER_LEN,
        });
    }
    let text = value
        .to_str()
        .ok()
        .filter(|text| !text.contains('\t'))
        .ok_or_else(|| malformed(name, "value is not visible ASCII"))?;
    if text.trim_ascii().is_empty() {
        return Err(malformed(name, "value is empty"));
    }
    Ok(text)
}

fn too_many(name: &HeaderName) -> VerifyError {
    VerifyError::TooManySignatures {
        header: name.clone(),
        max: MAX_SIGNATURES,
    }
}

/// Counts signature entries across all values of one header against `MAX_SIGNATURES`.
pub(crate) struct Budget<'a> {
    header: &'a HeaderName,
    used: usize,
}

impl<'a> Budget<'a> {
    pub(crate) fn new(header: &'a HeaderName) -> Self {
        Self { header, used: 0 }
    }

    /// Account for one more entry (including ones that will be ignored).
    pub(crate) fn take(&mut self) -> Result<(), VerifyError> {
        self.used += 1;
        if self.used > MAX_SIGNATURES {
            return Err(too_many(self.header));
        }
        Ok(())
    }
}

/// Unix seconds, ASCII digits only (no sign, no fraction, no milliseconds guesswork).
pub(crate) fn timestamp(header: &HeaderName, raw: &str) -> Result<u64, VerifyError> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(header, "timestamp is not a number of seconds"));
    }
    raw.parse()
        .map_err(|_| malformed(header, "timestamp is out of range"))
}

/// Seconds since the epoch; a clock before 1970 reads as 0.
pub(crate) fn unix_secs(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Refuses a timestamp further than `tolerance` from `now`, in either direction.
pub(crate) fn fresh(ts: u64, now: SystemTime, tolerance: Duration) -> Result<(), VerifyError> {
    let now = unix_secs(now);
    let tolerance_secs = tolerance.as_secs();
    if now >= ts {
        let age_secs = now - ts;
        if age_secs > tolerance_secs {
            return Err(VerifyError::TimestampTooOld {
                age_secs,
                tolerance_secs,
            });
        }
    } else {
        let ahead_secs = ts - now;
        if ahead_secs > tolerance_secs {
            return Err(VerifyError::TimestampInFuture {
                ahead_secs,
                tolerance_secs,
            });
        }
    }
    Ok(())
}

/// Decodes a signature strictly: anything that is not exactly 32 bytes in `encoding`
/// (bad characters, wrong length, non-canonical base64) is `None`, i.e. no match.
pub(crate) fn decode_tag(encoding: Encoding, text: &str) -> Option<Tag> {
    let mut tag = [0u8; TAG_LEN];
    match encoding {
        Encoding::Hex => hex::decode_to_slice(text, &mut tag).ok()?,
        Encoding::Base64 => {
            // 32 bytes are 44 base64 characters; checking first keeps the decode bounded.
            if text.len() != TAG_LEN.div_ceil(3) * 4 {
                return None;
            }
            let n = STANDARD.decode_slice(text, &mut tag).ok()?;
            if n != TAG_LEN {
                return None;
            }
        }
    }
    Some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tab is refused like any other character outside visible ASCII (`HeaderValue::to_str`
    /// lets it through, and an event id `a<TAB>b` was stored); spaces stay (Standard Webhooks
    /// separates its signatures with them).
    #[test]
    fn a_header_value_with_a_tab_is_malformed() {
        let name = HeaderName::from_static("x-github-delivery");
        let mut headers = HeaderMap::new();
        headers.insert(name.clone(), HeaderValue::from_static("a\tb"));
        assert!(matches!(
            single(&headers, &name),
            Err(VerifyError::MalformedHeader { .. })
        ));
        headers.insert(name.clone(), HeaderValue::from_static("v1,a v1,b"));
        assert_eq!(single(&headers, &name).unwrap(), "v1,a v1,b");
    }
}
