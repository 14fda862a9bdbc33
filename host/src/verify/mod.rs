//! Webhook signature verification and signing for every scheme hookd speaks.
//!
//! Invariant: this is the only module that knows signature formats, and it is pure: no I/O, no
//! logging, no clock (callers pass `now`). A [`Verified`] request can only come out of
//! [`Verifier::verify`], which checks the exact raw bytes with a constant-time comparison, never
//! panics on hostile input, and never puts a secret or an expected signature into an error.
//!
//! Layout:
//! - `mod.rs` — the public types: [`Scheme`], [`Verifier`], [`Verified`], the errors, [`sign`].
//! - `secret.rs` — [`Secret`], the redacted configured value.
//! - `wire.rs` — reading untrusted header values: caps, duplicates, timestamps, decoding.
//! - `schemes.rs` — what each provider signs, with which key, in which header.
//!
//! Header policy (the same for every scheme):
//! - A header value longer than [`MAX_HEADER_LEN`] bytes is refused before it is parsed.
//! - Headers that carry an id or a timestamp (`webhook-id`, `webhook-timestamp`,
//!   `Stripe-Signature`, `X-Slack-Request-Timestamp`, and the scheme's [`Scheme::id_header`])
//!   must appear at most once: a repeated one is [`VerifyError::MalformedHeader`], because it
//!   would be ambiguous which value was signed or which id dedupe should use.
//! - Headers that only carry signatures (`webhook-signature`, `X-Hub-Signature-256`,
//!   `X-Shopify-Hmac-Sha256`, `X-Slack-Signature`, the generic header) may repeat: all their
//!   values are pooled, at most [`MAX_SIGNATURES`] signatures in total.
//! - A signature that does not decode to exactly 32 bytes is simply not a match; a value whose
//!   structure is wrong (missing `sha256=`/`v0=`/prefix, missing `t=`, no `v1` entry, empty,
//!   not visible ASCII, non-numeric timestamp) is malformed.
//! - Timestamps (standard-webhooks, stripe, slack) are unix seconds, digits only, and must be
//!   within the tolerance both in the past and in the future (whole seconds, bounds included).
//!   They are checked before any HMAC is computed, so stale replays cost no hashing.

mod schemes;
mod secret;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

pub use secret::Secret;

/// The longest header value `verify` is willing to parse, in bytes.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

/// The most signatures `verify` will try for one request (all values of the signature header).
pub const MAX_SIGNATURES: usize = 32;

/// How a source's requests are signed. The config name of each variant is [`Scheme::name`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// <https://www.standardwebhooks.com>: `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    StandardWebhooks,
    /// `Stripe-Signature: t=<unix>,v1=<hex>`.
    Stripe,
    /// `X-Hub-Signature-256: sha256=<hex>`.
    Github,
    /// `X-Shopify-Hmac-Sha256: <base64>`.
    Shopify,
    /// `X-Slack-Signature: v0=<hex>` with `X-Slack-Request-Timestamp`.
    Slack,
    /// Any provider that puts an HMAC-SHA256 of the raw body in one header.
    HmacSha256(HmacScheme),
    /// No verification at all: every request is accepted.
    None,
}

/// The generic HMAC-SHA256 scheme's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HmacScheme {
    /// Header that carries the signature.
    pub header: HeaderName,
    /// Literal text before the signature (e.g. `sha256=`); empty for none. It must be present
    /// when non-empty, and must be printable ASCII without spaces.
    pub prefix: String,
    /// How the 32-byte HMAC is written after the prefix.
    pub encoding: Encoding,
}

/// How a signature is written in a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Hex digits, either case.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

impl Scheme {
    /// The config name: "standard-webhooks" | "stripe" | "github" | "shopify" | "slack" | "hmac-sha256" | "none".
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::Slack => "slack",
            Scheme::HmacSha256(_) => "hmac-sha256",
            Scheme::None => "none",
        }
    }

    /// Header carrying the provider's stable delivery/event id, if the scheme has one:
    /// standard-webhooks "webhook-id", github "x-github-delivery", shopify "x-shopify-event-id"; else None.
    ///
    /// In a [`Verified`] request this header appears at most once. Only standard-webhooks
    /// signs it; for github and shopify it is not authenticated.
    pub fn id_header(&self) -> Option<&'static str> {
        match self {
            Scheme::StandardWebhooks => Some("webhook-id"),
            Scheme::Github => Some("x-github-delivery"),
            Scheme::Shopify => Some("x-shopify-event-id"),
            Scheme::Stripe | Scheme::Slack | Scheme::HmacSha256(_) | Scheme::None => None,
        }
    }
}

/// A source's verifier: scheme + secrets (several = rotation) + timestamp tolerance.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    /// HMAC keys derived once from the secrets, in configured order (standard-webhooks secrets
    /// are already base64-decoded), so a bad secret fails at start-up, not per request.
    keys: Vec<schemes::Key>,
    /// How far a signed timestamp may be from `now`, in either direction.
    tolerance: Duration,
}

impl Verifier {
    /// Errors (VerifierConfigError, thiserror) if a non-`none` scheme has no secrets, or a
    /// standard-webhooks secret is not `whsec_` + valid base64 (message names which secret index, never its value).
    ///
    /// Also refused: an empty secret (an unset environment variable, usually) and a generic
    /// prefix that no header could carry. For `none`, secrets are ignored.
    pub fn new(
        scheme: Scheme,
        secrets: Vec<Secret>,
        tolerance: Duration,
    ) -> Result<Self, VerifierConfigError> {
        schemes::check_scheme(&scheme)?;
        let keys = if scheme == Scheme::None {
            Vec::new()
        } else {
            if secrets.is_empty() {
                return Err(VerifierConfigError::NoSecrets {
                    scheme: scheme.name(),
                });
            }
            secrets
                .iter()
                .enumerate()
                .map(|(index, secret)| schemes::Key::derive(&scheme, secret, index))
                .collect::<Result<_, _>>()?
        };
        Ok(Self {
            scheme,
            keys,
            tolerance,
        })
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// How far a signed timestamp may be from `now`; unused by schemes without a timestamp.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Verify over the exact raw bytes. Valid if ANY (secret, signature) pair matches, constant-time compare (subtle / hmac's verify_slice).
    pub fn verify(
        &self,
        headers: HeaderMap,
        body: Bytes,
        now: SystemTime,
    ) -> Result<Verified, VerifyError> {
        schemes::verify(
            &self.scheme,
            &self.keys,
            self.tolerance,
            &headers,
            &body,
            now,
        )?;
        Ok(Verified { headers, body })
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &format_args!("{} [REDACTED]", self.keys.len()))
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// A request whose signature checked out. Only [`Verifier::verify`] can build one (private
/// fields, no public constructor), so the inbox can demand one in its signature.
pub struct Verified {
    headers: HeaderMap,
    body: Bytes,
}

impl Verified {
    /// The request headers, exactly as received.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The raw body the signature was checked over.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Takes the request apart (this gives up the proof that it was verified).
    pub fn into_parts(self) -> (HeaderMap, Bytes) {
        (self.headers, self.body)
    }
}

impl fmt::Debug for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified")
            .field("headers", &self.headers)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Why a request was refused. The messages are safe to return to the caller: they name
/// headers and limits, never a secret, an expected signature, or the offending value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A header the scheme needs is absent.
    #[error("missing header {0}")]
    MissingHeader(HeaderName),
    /// A header is present but its structure is wrong (see the module doc for what counts).
    #[error("malformed header {header}: {reason}")]
    MalformedHeader {
        header: HeaderName,
        reason: &'static str,
    },
    /// A header value is longer than [`MAX_HEADER_LEN`]; it was not parsed.
    #[error("header {header} is longer than {max} bytes")]
    HeaderTooLong { header: HeaderName, max: usize },
    /// The signature header carries more than [`MAX_SIGNATURES`] entries.
    #[error("header {header} carries more than {max} signatures")]
    TooManySignatures { header: HeaderName, max: usize },
    /// The signed timestamp is older than `now - tolerance`.
    #[error("timestamp is {age_secs} s old, tolerance is {tolerance_secs} s")]
    TimestampTooOld { age_secs: u64, tolerance_secs: u64 },
    /// The signed timestamp is newer than `now + tolerance`.
    #[error("timestamp is {ahead_secs} s in the future, tolerance is {tolerance_secs} s")]
    TimestampInFuture {
        ahead_secs: u64,
        tolerance_secs: u64,
    },
    /// Well-formed, fresh, but no (secret, signature) pair matches the raw bytes.
    #[error("no signature matches")]
    NoMatchingSignature,
}

/// Why a [`Verifier`] (or a signature) cannot be made from this configuration. Secrets are
/// named by their index in the configured list, never by value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifierConfigError {
    /// A scheme other than `none` was given no secret.
    #[error("scheme {scheme} needs at least one secret")]
    NoSecrets { scheme: &'static str },
    /// A secret (or a standard-webhooks secret's decoded key) is empty.
    #[error("secrets[{index}] is empty")]
    EmptySecret { index: usize },
    /// A standard-webhooks secret does not start with `whsec_`.
    #[error("secrets[{index}] must start with \"whsec_\" for standard-webhooks")]
    MissingWhsecPrefix { index: usize },
    /// A standard-webhooks secret is not standard base64 after `whsec_`.
    #[error("secrets[{index}] is not valid base64 after \"whsec_\" (standard-webhooks)")]
    InvalidBase64 { index: usize },
    /// The generic scheme's prefix contains something a header value cannot carry.
    #[error("the hmac-sha256 prefix must be printable ASCII without spaces")]
    InvalidPrefix,
}

/// Why [`try_sign`] could not sign.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// The secret or scheme would be refused by [`Verifier::new`].
    #[error(transparent)]
    Config(#[from] VerifierConfigError),
    /// The event id is empty or cannot be a header value, for a scheme that sends it.
    #[error("the event id cannot be sent in header {header} (empty or not a valid header value)")]
    InvalidEventId { header: HeaderName },
}

/// Sign like the provider would (used by `hookd send` and by tests). Returns the headers to add
/// (including the id/timestamp headers the scheme needs: webhook-id/webhook-timestamp/webhook-signature;
/// Stripe-Signature t=..,v1=..; X-Hub-Signature-256 + X-GitHub-Delivery; X-Shopify-Hmac-Sha256 + X-Shopify-Event-Id;
/// X-Slack-Signature + X-Slack-Request-Timestamp; the generic header with prefix; none → no signature header).
///
/// A secret or event id that cannot be used yields no headers at all (the receiver then
/// answers "missing header"); use [`try_sign`] to learn why.
pub fn sign(
    scheme: &Scheme,
    secret: &Secret,
    event_id: &str,
    body: &[u8],
    now: SystemTime,
) -> Vec<(HeaderName, HeaderValue)> {
    try_sign(scheme, secret, event_id, body, now).unwrap_or_default()
}

/// [`sign`], reporting a secret that [`Verifier::new`] would refuse (as secret index 0) or an
/// event id that cannot be a header value (only checked for schemes that send it).
pub fn try_sign(
    scheme: &Scheme,
    secret: &Secret,
    event_id: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, SignError> {
    schemes::sign(scheme, secret, event_id, body, now)
}
