//! The ways a plugin call can fail, as the host understands them.

use std::fmt;
use std::time::Duration;

/// Why a [`Parser`](crate::Parser) produced no envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The request is malformed: the provider gets a 400 with this message, nothing is stored.
    Invalid(String),
    /// The request is well-formed but not worth storing (e.g. a ping): the provider gets a 200
    /// and nothing is stored.
    Ignore(String),
    /// The request is not an event but needs this answer (e.g. a provider's challenge): the
    /// provider gets it as-is and nothing is stored.
    Respond(crate::Response),
}

impl ParseError {
    /// The request is malformed; `msg` is sent back to the provider, so say what is missing.
    pub fn invalid(msg: impl Into<String>) -> Self {
        ParseError::Invalid(msg.into())
    }

    /// The request is acknowledged but not stored; `msg` says why.
    pub fn ignore(msg: impl Into<String>) -> Self {
        ParseError::Ignore(msg.into())
    }

    /// The request is answered with `response` (e.g. a handshake) and not stored.
    pub fn respond(response: crate::Response) -> Self {
        ParseError::Respond(response)
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Invalid(msg) => write!(f, "invalid request: {msg}"),
            ParseError::Ignore(msg) => write!(f, "ignored request: {msg}"),
            ParseError::Respond(r) => write!(f, "answered with status {}", r.status),
        }
    }
}

impl std::error::Error for ParseError {}

/// Why a [`Handler`](crate::Handler) attempt did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    /// Try again later, until the plugin's `max_attempts` is reached; then the delivery is
    /// dead-lettered.
    Retry {
        /// Why; stored on the attempt and shown by the admin API.
        reason: String,
        /// Retry no sooner than this (the host keeps it within its bounds); `None` lets the
        /// host use exponential backoff with jitter.
        after: Option<Duration>,
    },
    /// Never retry: the delivery is dead-lettered at once (a human can replay it).
    Permanent(String),
}

impl HandleError {
    /// A failure that may succeed later (e.g. a downstream service is unavailable); the host
    /// chooses when to retry.
    pub fn retry(reason: impl Into<String>) -> Self {
        HandleError::Retry {
            reason: reason.into(),
            after: None,
        }
    }

    /// A failure that may succeed after `after` (e.g. a rate limit's `Retry-After`): retried
    /// after that instead of the host's backoff, within the plugin's `backoff_max_ms` and no
    /// sooner than 1 s (or its `backoff_base_ms` if less).
    pub fn retry_after(reason: impl Into<String>, after: Duration) -> Self {
        HandleError::Retry {
            reason: reason.into(),
            after: Some(after),
        }
    }

    /// A failure that no retry can fix (e.g. the event is not one this handler understands).
    pub fn permanent(reason: impl Into<String>) -> Self {
        HandleError::Permanent(reason.into())
    }
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Retry {
                reason,
                after: None,
            } => write!(f, "retry: {reason}"),
            HandleError::Retry {
                reason,
                after: Some(after),
            } => write!(f, "retry after {} ms: {reason}", after.as_millis()),
            HandleError::Permanent(reason) => write!(f, "permanent failure: {reason}"),
        }
    }
}

impl std::error::Error for HandleError {}

/// A body that could not be decoded as text or JSON.
///
/// It converts with `?` into [`ParseError::Invalid`] in a parser and into
/// [`HandleError::Permanent`] in a handler (the same bytes never decode on a retry).
#[derive(Debug)]
pub struct BodyError(BodyErrorKind);

#[derive(Debug)]
enum BodyErrorKind {
    Utf8(std::str::Utf8Error),
    Json(serde_json::Error),
}

impl BodyError {
    pub(crate) fn text(body: &[u8]) -> Result<&str, BodyError> {
        std::str::from_utf8(body).map_err(|e| BodyError(BodyErrorKind::Utf8(e)))
    }

    pub(crate) fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
        serde_json::from_slice(body).map_err(|e| BodyError(BodyErrorKind::Json(e)))
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            BodyErrorKind::Utf8(e) => write!(f, "body is not valid UTF-8: {e}"),
            // Valid JSON of another shape (a missing field, a wrong type) is said as such.
            BodyErrorKind::Json(e) if e.is_data() => {
                write!(f, "body is JSON of another shape than expected: {e}")
            }
            BodyErrorKind::Json(e) => write!(f, "body is not valid JSON: {e}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            BodyErrorKind::Utf8(e) => Some(e),
            BodyErrorKind::Json(e) => Some(e),
        }
    }
}

impl From<BodyError> for ParseError {
    fn from(err: BodyError) -> Self {
        ParseError::invalid(err.to_string())
    }
}

impl From<BodyError> for HandleError {
    fn from(err: BodyError) -> Self {
        HandleError::permanent(err.to_string())
    }
}
