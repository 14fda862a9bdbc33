//! The set-up handshakes providers send before any event, and the answers hookd gives itself.
//!
//! Invariants:
//! - An answer that needs a secret (zoom's `encryptedToken`, twitter's `response_token`) is
//!   computed here, with the first configured secret (the current one of a rotation), so no
//!   secret leaves this crate; a verify token is compared in constant time.
//! - A signed handshake (slack, discord, zoom) is answered only after its signature verified,
//!   exactly like an event; an unsigned one (meta, twitter, dropbox, msgraph) carries nothing
//!   but the challenge it asks to be echoed.
//! - Only bodies up to [`MAX_HANDSHAKE_BODY`] are looked at as handshakes, and a challenge longer
//!   than [`crate::MAX_HEADER_LEN`] is refused, so answering costs little and echoes little.
//! - A provider that wants an answer of its own shape for a stored event, too (discord's
//!   interactions), gets it from [`Verifier::accepted_reply`], decided by the verified body alone.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use std::time::SystemTime;

use crate::{MAX_HEADER_LEN, Scheme, Verifier, VerifyError, schemes};

/// The largest body considered as a possible handshake; larger ones are events.
pub const MAX_HANDSHAKE_BODY: usize = 16 * 1024;

/// The longest `crc_token` answered, in bytes.
pub const MAX_CRC_TOKEN: usize = 256;

/// hookd's answer to a handshake: always `200`, with this content type and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// `application/json` or `text/plain; charset=utf-8`.
    pub content_type: &'static str,
    /// The answer's bytes.
    pub body: Vec<u8>,
}

impl Reply {
    fn json(value: &Value) -> Self {
        Self {
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }

    fn text(text: &str) -> Self {
        Self {
            content_type: "text/plain; charset=utf-8",
            body: text.as_bytes().to_vec(),
        }
    }
}

/// Why a handshake was refused. Messages name parameters, never a token or a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// A signed handshake's signature did not verify.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// meta: `hub.verify_token` is not the configured verify token.
    #[error("hub.verify_token does not match")]
    TokenMismatch,
    /// The handshake lacks a parameter it needs.
    #[error("missing {0}")]
    Missing(&'static str),
    /// twitter: the `crc_token` is longer than [`MAX_CRC_TOKEN`] or has a character other than
    /// letters, digits and `-_.~+/=`.
    #[error("crc_token must be at most {MAX_CRC_TOKEN} letters, digits or -_.~+/=")]
    InvalidCrcToken,
    /// meta: `hub.mode` is not `subscribe`.
    #[error("hub.mode must be subscribe")]
    UnsupportedMode,
    /// The challenge is longer than [`MAX_HEADER_LEN`] bytes.
    #[error("{what} is longer than {max} bytes")]
    TooLong { what: &'static str, max: usize },
}

impl HandshakeError {
    /// The HTTP status to refuse with: 401 for a bad signature, 403 for a wrong verify token,
    /// 400 for a malformed handshake.
    pub fn status(&self) -> StatusCode {
        match self {
            HandshakeError::Verify(_) => StatusCode::UNAUTHORIZED,
            HandshakeError::TokenMismatch => StatusCode::FORBIDDEN,
            HandshakeError::Missing(_)
            | HandshakeError::InvalidCrcToken
            | HandshakeError::UnsupportedMode
            | HandshakeError::TooLong { .. } => StatusCode::BAD_REQUEST,
        }
    }
}

impl Verifier {
    /// The answer to a `GET` for this source: `Ok(None)` if its scheme has no `GET` handshake
    /// ([`crate::SchemeKind::answers_get`] is false).
    pub fn answer_get(&self, query: &[(String, String)]) -> Result<Option<Reply>, HandshakeError> {
        let param = |name: &'static str| param(query, name);
        Ok(Some(match self.scheme {
            Scheme::Meta => {
                if param("hub.mode")? != "subscribe" {
                    return Err(HandshakeError::UnsupportedMode);
                }
                let presented = param("hub.verify_token")?;
                let token = self.token.as_ref().expect("meta has a verify token");
                if !token.matches(presented.as_bytes()) {
                    return Err(HandshakeError::TokenMismatch);
                }
                Reply::text(param("hub.challenge")?)
            }
            Scheme::Twitter => {
                let crc = param("crc_token")?;
                // The CRC is unsigned and its answer is an HMAC under the same key as events'
                // signatures: an event body (JSON) as the token would get the body signed. Only
                // token characters are answered, and the scheme takes only a body that starts
                // as a JSON object, which no such string does (see `schemes::verify`).
                if crc.len() > MAX_CRC_TOKEN
                    || !crc
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b))
                {
                    return Err(HandshakeError::InvalidCrcToken);
                }
                let tag = self.keys[0].tag(&[crc.as_bytes()]);
                Reply::json(&json!({"response_token": format!("sha256={}", STANDARD.encode(tag))}))
            }
            Scheme::Dropbox => Reply::text(param("challenge")?),
            _ => return Ok(None),
        }))
    }

    /// The answer to a `POST` that is a handshake, checked before the request is treated as an
    /// event: `Ok(None)` when it is not one. A signed handshake whose signature fails is an
    /// error, like an event would be.
    pub fn answer_post(
        &self,
        query: &[(String, String)],
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Option<Reply>, HandshakeError> {
        if body.len() > MAX_HANDSHAKE_BODY {
            return Ok(None);
        }
        if self.scheme == Scheme::Msgraph {
            // Graph validates a subscription with an empty, unsigned POST carrying the token.
            return match query.iter().find(|(name, _)| name == "validationToken") {
                Some((_, token)) => Ok(Some(Reply::text(capped("validationToken", token)?))),
                None => Ok(None),
            };
        }
        if !matches!(self.scheme, Scheme::Slack | Scheme::Discord | Scheme::Zoom) {
            return Ok(None);
        }
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return Ok(None);
        };
        let field = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
        let handshake = match self.scheme {
            Scheme::Slack => field("/type") == Some("url_verification"),
            // An interactions PING. A Discord webhook event of type 1 carries an `event`: it is
            // an event, never answered as a PING (which would drop it).
            Scheme::Discord => {
                value.get("type").and_then(Value::as_u64) == Some(1) && value.get("event").is_none()
            }
            Scheme::Zoom => field("/event") == Some("endpoint.url_validation"),
            _ => false,
        };
        if !handshake {
            return Ok(None);
        }
        // The signature first: an unsigned request learns nothing of what a handshake needs.
        schemes::verify(self, headers, body, now)?;
        let reply = match self.scheme {
            Scheme::Slack => {
                let challenge = field("/challenge").ok_or(HandshakeError::Missing("challenge"))?;
                json!({"challenge": capped("challenge", challenge)?})
            }
            Scheme::Zoom => {
                let plain = field("/payload/plainToken")
                    .ok_or(HandshakeError::Missing("payload.plainToken"))?;
                let plain = capped("plainToken", plain)?;
                // With the secret Zoom signed with: it checks the answer with that one.
                let key = schemes::signing_key(self, headers, body, now).unwrap_or(&self.keys[0]);
                let tag = key.tag(&[plain.as_bytes()]);
                json!({"plainToken": plain, "encryptedToken": hex::encode(tag)})
            }
            _ => json!({"type": 1}),
        };
        Ok(Some(Reply::json(&reply)))
    }
}

impl Verifier {
    /// The answer to a verified request that was stored as an event (or was already), where its
    /// provider needs more than hookd's `202`: `None` for every scheme but discord.
    ///
    /// discord shows an interaction as failed unless it is answered within 3 s with an
    /// interaction response, and the handler's work may take longer: the handler completes it
    /// later through Discord's follow-up webhook, with the interaction's token. So an
    /// application command (type 2) or a modal submit (5) is acknowledged as
    /// `DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE` (5), a message component (3) as
    /// `DEFERRED_UPDATE_MESSAGE` (6), and an autocomplete (4), which cannot be deferred, with no
    /// choices (8).
    pub fn accepted_reply(&self, body: &[u8]) -> Option<Reply> {
        if self.scheme != Scheme::Discord {
            return None;
        }
        let interaction = serde_json::from_slice::<Value>(body).ok()?;
        let answer = match interaction.get("type").and_then(Value::as_u64)? {
            2 | 5 => json!({"type": 5}),
            3 => json!({"type": 6}),
            4 => json!({"type": 8, "data": {"choices": []}}),
            _ => return None,
        };
        Some(Reply::json(&answer))
    }
}

/// The first value of query parameter `name`, capped.
fn param<'a>(query: &'a [(String, String)], name: &'static str) -> Result<&'a str, HandshakeError> {
    let value = query
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
        .ok_or(HandshakeError::Missing(name))?;
    capped(name, value)
}

fn capped<'a>(what: &'static str, value: &'a str) -> Result<&'a str, HandshakeError> {
    if value.len() > MAX_HEADER_LEN {
        return Err(HandshakeError::TooLong {
            what,
            max: MAX_HEADER_LEN,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests;
