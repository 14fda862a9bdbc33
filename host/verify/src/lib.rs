//! Webhook signature verification and signing for every scheme hookd speaks.
//!
//! Invariants:
//! - This crate is the only code that knows signature formats and scheme names. It is pure: no
//!   I/O, no logging, no clock (callers pass `now`); its dependencies make that a fact.
//! - A [`Verified`] request can only come out of [`Verifier::verify`], which checks the exact raw
//!   bytes with a constant-time comparison, never panics on hostile input, and never puts a secret
//!   or an expected signature into an error.
//!
//! Layout:
//! - `lib.rs`: the public types: [`Scheme`], [`Verifier`], [`Verified`], the errors, [`sign`].
//! - `kind.rs`: [`SchemeKind`] and [`Encoding`], their names, and the headers each scheme uses.
//! - `settings.rs`: checking the generic scheme's settings as a config or a CLI gives them.
//! - `secret.rs`: [`Secret`], the redacted configured value.
//! - `wire.rs`: reading untrusted header values: caps, duplicates, timestamps, decoding.
//! - `schemes.rs`: what each provider signs, with which key, in which header.
//! - `handshake.rs`: the set-up handshakes providers send before any event, and their answers.
//!
//! Header policy (the same for every scheme):
//! - A header value longer than [`MAX_HEADER_LEN`] bytes is refused before it is parsed.
//! - Headers that carry an id or a timestamp (`webhook-id`, `webhook-timestamp`,
//!   `Stripe-Signature`, `X-Slack-Request-Timestamp`, `x-zm-request-timestamp`,
//!   `X-Signature-Timestamp`, and the scheme's [`Scheme::id_header`]), and discord's single
//!   Ed25519 `X-Signature-Ed25519`, must appear at most once: a repeated one is [`VerifyError::MalformedHeader`], because it
//!   would be ambiguous which value was signed or which id dedupe should use.
//! - Headers that only carry HMAC signatures (`webhook-signature`, `X-Hub-Signature-256`,
//!   `X-Shopify-Hmac-Sha256`, `X-Slack-Signature`, `x-zm-signature`,
//!   `x-twitter-webhooks-signature`, `X-Dropbox-Signature`, the generic header) may repeat: all their
//!   values are pooled, at most [`MAX_SIGNATURES`] signatures in total.
//! - A signature that does not decode to exactly 32 bytes (discord: 64) is simply not a match; a value whose
//!   structure is wrong (missing `sha256=`/`v0=`/prefix, missing `t=`, no `v1` entry, empty,
//!   not visible ASCII, non-numeric timestamp) is malformed.
//! - Timestamps (standard-webhooks, stripe, slack, zoom, discord) are unix seconds, digits only, and must be
//!   within the tolerance both in the past and in the future (whole seconds, bounds included).
//!   They are checked before any HMAC is computed, so stale replays cost no hashing.

mod graph;
mod handshake;
mod kind;
mod schemes;
mod secret;
mod settings;
#[cfg(test)]
mod tests;
mod wire;

use std::fmt;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

pub use handshake::{HandshakeError, MAX_CRC_TOKEN, MAX_HANDSHAKE_BODY, Reply};
pub use kind::{Credential, Encoding, SchemeKind, UnknownEncoding, UnknownScheme};
pub use secret::Secret;
pub use settings::{HmacParts, HmacSetting, HmacSettingsError};

/// The longest header value `verify` is willing to parse, in bytes.
pub const MAX_HEADER_LEN: usize = 8 * 1024;

/// The most signatures `verify` will try for one request (all values of the signature header).
pub const MAX_SIGNATURES: usize = 32;

/// How a source's requests are signed: a [`SchemeKind`] with the settings it needs.
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
    /// Discord interactions: `X-Signature-Ed25519` over `X-Signature-Timestamp` + body.
    Discord,
    /// `x-zm-signature: v0=<hex>` over `v0:{x-zm-request-timestamp}:{body}`.
    Zoom,
    /// `X-Hub-Signature-256: sha256=<hex>` with the app secret, plus a `GET` verify token.
    Meta,
    /// `x-twitter-webhooks-signature: sha256=<base64>` with the consumer secret.
    Twitter,
    /// `X-Dropbox-Signature: <hex>` with the app secret.
    Dropbox,
    /// Microsoft Graph change notifications: each carries the configured `clientState`.
    Msgraph,
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

impl Scheme {
    /// Which scheme this is, without its settings.
    pub fn kind(&self) -> SchemeKind {
        match self {
            Scheme::StandardWebhooks => SchemeKind::StandardWebhooks,
            Scheme::Stripe => SchemeKind::Stripe,
            Scheme::Github => SchemeKind::Github,
            Scheme::Shopify => SchemeKind::Shopify,
            Scheme::Slack => SchemeKind::Slack,
            Scheme::Discord => SchemeKind::Discord,
            Scheme::Zoom => SchemeKind::Zoom,
            Scheme::Meta => SchemeKind::Meta,
            Scheme::Twitter => SchemeKind::Twitter,
            Scheme::Dropbox => SchemeKind::Dropbox,
            Scheme::Msgraph => SchemeKind::Msgraph,
            Scheme::HmacSha256(_) => SchemeKind::HmacSha256,
            Scheme::None => SchemeKind::None,
        }
    }

    /// The config name ([`SchemeKind::name`]).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Header carrying the provider's stable delivery id ([`SchemeKind::id_header`]).
    ///
    /// In a [`Verified`] request this header appears at most once. Only standard-webhooks
    /// signs it; for github and shopify it is not authenticated.
    pub fn id_header(&self) -> Option<&'static str> {
        self.kind().id_header().map(HeaderName::as_str)
    }

    /// Every header that may carry the delivery id, [`Self::id_header`] first
    /// ([`SchemeKind::id_headers`]); a [`Verified`] request carries each at most once.
    pub fn id_headers(&self) -> impl Iterator<Item = &'static str> {
        self.kind().id_headers().iter().map(|h| h.as_str())
    }

    /// Header naming the event's type ([`SchemeKind::type_header`]); never authenticated.
    pub fn type_header(&self) -> Option<&'static str> {
        self.kind().type_header().map(HeaderName::as_str)
    }
}

/// A source's verifier: scheme + secrets (several = rotation) + the scheme's [`Credential`], if
/// it takes one + timestamp tolerance.
#[derive(Clone)]
pub struct Verifier {
    pub(crate) scheme: Scheme,
    /// HMAC keys derived once from the secrets, in configured order (standard-webhooks secrets
    /// are already base64-decoded), so a bad secret fails at start-up, not per request.
    pub(crate) keys: Vec<schemes::Key>,
    /// discord: the application's public key, parsed once.
    pub(crate) public_key: Option<ed25519_dalek::VerifyingKey>,
    /// meta's verify token, msgraph's client state.
    pub(crate) token: Option<Secret>,
    /// How far a signed timestamp may be from `now`, in either direction.
    pub(crate) tolerance: Duration,
}

impl Verifier {
    /// Derives one key per secret, so a secret that can never verify is refused here, not per
    /// request: none at all for a scheme other than `none`, an empty one (an unset environment
    /// variable, usually), a standard-webhooks secret that is not `whsec_` + base64, or a
    /// generic prefix no header could carry. For `none`, secrets are ignored.
    pub fn new(
        scheme: Scheme,
        secrets: Vec<Secret>,
        tolerance: Duration,
    ) -> Result<Self, VerifierConfigError> {
        Self::with_credential(scheme, secrets, None, tolerance)
    }

    /// [`Verifier::new`] for every scheme, including those configured with a [`Credential`]:
    /// discord takes its public key (hex, 32 bytes) and no secrets, msgraph its client state and
    /// no secrets, meta its verify token besides the secrets. A credential for a scheme that takes
    /// none, a missing or empty one, or secrets where the credential replaces them, are refused.
    pub fn with_credential(
        scheme: Scheme,
        secrets: Vec<Secret>,
        credential: Option<Secret>,
        tolerance: Duration,
    ) -> Result<Self, VerifierConfigError> {
        schemes::check_scheme(&scheme)?;
        let kind = scheme.kind();
        let wanted = kind.credential();
        let credential = match (wanted, credential) {
            (None, Some(_)) => {
                return Err(VerifierConfigError::CredentialNotApplicable { scheme: kind });
            }
            (Some(credential), None) => {
                return Err(VerifierConfigError::MissingCredential {
                    scheme: kind,
                    credential,
                });
            }
            (Some(credential), Some(value)) if value.expose().is_empty() => {
                return Err(VerifierConfigError::EmptyCredential { credential });
            }
            (_, value) => value,
        };
        let replaces_secrets = wanted.is_some_and(Credential::replaces_secrets);
        if replaces_secrets && !secrets.is_empty() {
            return Err(VerifierConfigError::SecretsNotApplicable { scheme: kind });
        }
        let keys = if scheme == Scheme::None || replaces_secrets {
            Vec::new()
        } else {
            if secrets.is_empty() {
                return Err(VerifierConfigError::NoSecrets { scheme: kind });
            }
            secrets
                .iter()
                .enumerate()
                .map(|(index, secret)| schemes::Key::derive(&scheme, secret, index))
                .collect::<Result<_, _>>()?
        };
        let (public_key, token) = match (&scheme, credential) {
            (Scheme::Discord, Some(hex)) => (Some(schemes::public_key(hex.expose())?), None),
            (_, token) => (None, token),
        };
        Ok(Self {
            scheme,
            keys,
            public_key,
            token,
            tolerance,
        })
    }

    /// The length in bytes of each key derived from the secrets, in configured order (for a
    /// standard-webhooks secret, what its base64 decodes to): what a start-up warning about a
    /// short key needs, and nothing of the key itself.
    pub fn key_lengths(&self) -> impl Iterator<Item = usize> + '_ {
        self.keys.iter().map(schemes::Key::len)
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// How far a signed timestamp may be from `now`; unused by schemes without a timestamp.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Checks the request over its exact raw bytes: it is verified if any configured secret made
    /// any of its signatures.
    pub fn verify(
        &self,
        headers: HeaderMap,
        body: Bytes,
        now: SystemTime,
    ) -> Result<Verified, VerifyError> {
        schemes::verify(self, &headers, &body, now)?;
        Ok(Verified { headers, body })
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &format_args!("{} [REDACTED]", self.keys.len()))
            .field(
                "public_key",
                &self.public_key.map(|key| hex::encode(key.as_bytes())),
            )
            .field("token", &self.token)
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
    /// msgraph: the body is not a notification list whose every item has a `clientState`.
    #[error("malformed body: {reason}")]
    MalformedBody { reason: &'static str },
    /// msgraph: a notification's `clientState` is not the configured one.
    #[error("clientState does not match")]
    ClientStateMismatch,
    /// The request is signed, but its event-id header ([`Scheme::id_headers`]) is repeated,
    /// empty, not visible ASCII or too long: authentic, and still no event (a 400, not a 401).
    #[error("event id header {header}: {reason}")]
    MalformedId {
        header: HeaderName,
        reason: &'static str,
    },
}

impl VerifyError {
    /// Whether the request failed as a request (its id header), not as a signature: its
    /// signature held.
    pub fn is_malformed_request(&self) -> bool {
        matches!(self, Self::MalformedId { .. })
    }
}

/// Why a [`Verifier`] (or a signature) cannot be made from this configuration. Secrets are
/// named by their index in the configured list, never by value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifierConfigError {
    /// A scheme other than `none` was given no secret.
    #[error("scheme {scheme} needs at least one secret")]
    NoSecrets { scheme: SchemeKind },
    /// A secret (or a standard-webhooks secret's decoded key) is empty.
    #[error("secrets[{index}] is empty")]
    EmptySecret { index: usize },
    /// A standard-webhooks secret does not start with `whsec_`.
    #[error(
        "secrets[{index}] must start with \"whsec_\" for {}",
        SchemeKind::StandardWebhooks
    )]
    MissingWhsecPrefix { index: usize },
    /// A standard-webhooks secret is not standard base64 after `whsec_`.
    #[error(
        "secrets[{index}] is not valid base64 after \"whsec_\" ({})",
        SchemeKind::StandardWebhooks
    )]
    InvalidBase64 { index: usize },
    /// The generic scheme's prefix contains something a header value cannot carry.
    #[error(
        "the {} prefix must be printable ASCII without spaces",
        SchemeKind::HmacSha256
    )]
    InvalidPrefix,
    /// The scheme is configured with a [`Credential`] and none was given.
    #[error("scheme {scheme} needs {credential}")]
    MissingCredential {
        scheme: SchemeKind,
        credential: Credential,
    },
    /// A [`Credential`] was given for a scheme that takes none.
    #[error("scheme {scheme} takes no public_key, verify_token or client_state")]
    CredentialNotApplicable { scheme: SchemeKind },
    /// The credential is empty (an unset environment variable, usually).
    #[error("{credential} is empty")]
    EmptyCredential { credential: Credential },
    /// Secrets were given for a scheme whose credential replaces them (discord, msgraph).
    #[error("scheme {scheme} takes no secrets (it is configured with {})", .scheme.credential().map_or("nothing", Credential::key))]
    SecretsNotApplicable { scheme: SchemeKind },
    /// discord's public key is not 64 hex digits of a valid Ed25519 point.
    #[error("public_key is not a hex Ed25519 public key (64 hex digits)")]
    InvalidPublicKey,
}

impl VerifierConfigError {
    /// The index in the configured list of the secret this error is about, if it is about one.
    pub fn secret_index(&self) -> Option<usize> {
        match *self {
            Self::EmptySecret { index }
            | Self::MissingWhsecPrefix { index }
            | Self::InvalidBase64 { index } => Some(index),
            _ => None,
        }
    }
}

/// Why [`sign`] could not sign.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    /// The secret or scheme would be refused by [`Verifier::new`] (the secret as index 0).
    #[error(transparent)]
    Config(#[from] VerifierConfigError),
    /// The event id is empty or cannot be a header value, for a scheme that sends it.
    #[error("the event id cannot be sent in header {header} (empty or not a valid header value)")]
    InvalidEventId { header: HeaderName },
    /// discord signs with the application's private key: 64 hex digits (the Ed25519 seed).
    #[error("the discord signing key must be 64 hex digits (an Ed25519 private key seed)")]
    InvalidSigningKey,
}

/// Signs `body` like the provider would, at `now`: the headers to add, including the id and
/// timestamp headers the scheme sends (none for [`Scheme::None`]). `event_id` is only checked,
/// and only used, by schemes that send it in a header.
pub fn sign(
    scheme: &Scheme,
    secret: &Secret,
    event_id: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, SignError> {
    schemes::sign(scheme, secret, event_id, body, now)
}
