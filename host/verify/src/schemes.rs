//! What each provider signs, with which key, and in which headers — for verifying and signing.
//!
//! Invariant: the HMAC always covers the exact raw body bytes and the header text as sent,
//! computed tags are only ever compared in constant time, and every timestamp is checked
//! against the tolerance before any HMAC is computed.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

use crate::kind::{
    DISCORD_SIGNATURE, DISCORD_TIMESTAMP, DROPBOX_SIGNATURE, GITHUB_DELIVERY, HUB_SIGNATURE_256,
    SHOPIFY_EVENT_ID, SHOPIFY_HMAC, SLACK_SIGNATURE, SLACK_TIMESTAMP, STRIPE_SIGNATURE, SVIX_ID,
    SVIX_SIGNATURE, SVIX_TIMESTAMP, TWITTER_SIGNATURE, WEBHOOK_ID, WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP, ZOOM_SIGNATURE, ZOOM_TIMESTAMP,
};
use crate::wire::{self, Budget, Tag, decode_tag, malformed};
use crate::{
    Encoding, HmacScheme, Scheme, Secret, SignError, Verifier, VerifierConfigError, VerifyError,
};

const WHSEC: &str = "whsec_";

/// An HMAC key derived from one configured secret, zeroized on drop.
#[derive(Clone)]
pub(crate) struct Key(SecretSlice<u8>);

impl Key {
    /// standard-webhooks: base64 after `whsec_`; stripe: the whole `whsec_...` string as
    /// bytes; everything else: the secret as UTF-8. `index` only names the secret in errors.
    pub(crate) fn derive(
        scheme: &Scheme,
        secret: &Secret,
        index: usize,
    ) -> Result<Self, VerifierConfigError> {
        let raw = secret.expose();
        let bytes = match scheme {
            Scheme::StandardWebhooks => {
                let encoded = raw
                    .strip_prefix(WHSEC)
                    .ok_or(VerifierConfigError::MissingWhsecPrefix { index })?;
                STANDARD
                    .decode(encoded)
                    .map_err(|_| VerifierConfigError::InvalidBase64 { index })?
            }
            _ => raw.as_bytes().to_vec(),
        };
        if bytes.is_empty() {
            return Err(VerifierConfigError::EmptySecret { index });
        }
        Ok(Self(SecretSlice::from(bytes)))
    }

    /// The key's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.expose_secret().len()
    }

    /// HMAC-SHA256 over the concatenation of `parts`.
    pub(crate) fn tag(&self, parts: &[&[u8]]) -> Tag {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret())
            .expect("HMAC accepts keys of any length");
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

/// Refuses scheme settings that could never verify anything.
pub(crate) fn check_scheme(scheme: &Scheme) -> Result<(), VerifierConfigError> {
    if let Scheme::HmacSha256(HmacScheme { prefix, .. }) = scheme
        && !prefix.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(VerifierConfigError::InvalidPrefix);
    }
    Ok(())
}

/// discord's configured public key: 64 hex digits of a valid Ed25519 point.
pub(crate) fn public_key(hex_key: &str) -> Result<VerifyingKey, VerifierConfigError> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(hex_key.trim_ascii(), &mut bytes)
        .map_err(|_| VerifierConfigError::InvalidPublicKey)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| VerifierConfigError::InvalidPublicKey)
}

/// Ok if the request carries a signature by one of the verifier's keys over the scheme's signed
/// bytes (msgraph: the configured client state in every notification).
pub(crate) fn verify(
    verifier: &Verifier,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    signature(verifier, &verifier.keys, headers, body, now)?;
    // After the signature: a signed request whose id header is unusable is a bad request, not
    // a forgery.
    for id in verifier.scheme.kind().id_headers() {
        wire::at_most_once(headers, id).map_err(|e| match e {
            VerifyError::MalformedHeader { header, reason } => {
                VerifyError::MalformedId { header, reason }
            }
            VerifyError::HeaderTooLong { header, .. } => VerifyError::MalformedId {
                header,
                reason: "value is longer than MAX_HEADER_LEN (8 KiB)",
            },
            e => e,
        })?;
    }
    Ok(())
}

/// The first of the verifier's keys that signed the request, if one did: the one a signed
/// handshake is answered with, since during a rotation the provider checks the answer with the
/// secret it signed with, whichever of the configured ones that is.
pub(crate) fn signing_key<'v>(
    verifier: &'v Verifier,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Option<&'v Key> {
    verifier
        .keys
        .iter()
        .find(|key| signature(verifier, std::slice::from_ref(*key), headers, body, now).is_ok())
}

/// The signature check of [`verify`], by scheme, against `keys` (the verifier's, or some).
fn signature(
    verifier: &Verifier,
    keys: &[Key],
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let (scheme, tolerance) = (&verifier.scheme, verifier.tolerance);
    match scheme {
        Scheme::None => Ok(()),
        Scheme::StandardWebhooks => standard_webhooks(keys, tolerance, headers, body, now),
        Scheme::Stripe => stripe(keys, tolerance, headers, body, now),
        Scheme::Github | Scheme::Meta => {
            let tags = prefixed(
                headers,
                &HUB_SIGNATURE_256,
                "sha256=",
                "expected sha256=<hex>",
                Encoding::Hex,
            )?;
            matches(keys, &[body], &tags)
        }
        Scheme::Shopify => {
            let tags = prefixed(headers, &SHOPIFY_HMAC, "", "", Encoding::Base64)?;
            matches(keys, &[body], &tags)
        }
        Scheme::Slack => v0(
            keys,
            tolerance,
            headers,
            body,
            now,
            (&SLACK_SIGNATURE, &SLACK_TIMESTAMP),
        ),
        Scheme::Zoom => v0(
            keys,
            tolerance,
            headers,
            body,
            now,
            (&ZOOM_SIGNATURE, &ZOOM_TIMESTAMP),
        ),
        Scheme::Twitter => {
            let tags = prefixed(
                headers,
                &TWITTER_SIGNATURE,
                "sha256=",
                "expected sha256=<base64>",
                Encoding::Base64,
            )?;
            matches(keys, &[body], &tags)?;
            // The unsigned CRC handshake answers HMAC(key, token) under this same key, for any
            // token of letters, digits and `-_.~+/=`: such a string (`1234567890`, `true`) as a
            // body would carry a signature anyone can get. Every Twitter event is a JSON object,
            // which no token can be, so only a body that starts as one is taken.
            if body.trim_ascii_start().first() == Some(&b'{') {
                Ok(())
            } else {
                Err(VerifyError::MalformedBody {
                    reason: "a Twitter event is a JSON object (a body that is not could have \
                             been signed by the CRC handshake)",
                })
            }
        }
        Scheme::Dropbox => {
            let tags = prefixed(headers, &DROPBOX_SIGNATURE, "", "", Encoding::Hex)?;
            matches(keys, &[body], &tags)
        }
        Scheme::Discord => {
            let key = verifier
                .public_key
                .as_ref()
                .expect("Verifier::with_credential sets discord's public key");
            discord(key, tolerance, headers, body, now)
        }
        Scheme::Msgraph => {
            let token = verifier
                .token
                .as_ref()
                .expect("Verifier::with_credential sets msgraph's client state");
            crate::graph::client_states(token, body)
        }
        Scheme::HmacSha256(generic) => {
            let tags = prefixed(
                headers,
                &generic.header,
                &generic.prefix,
                "missing the configured prefix",
                generic.encoding,
            )?;
            matches(keys, &[body], &tags)
        }
    }
}

/// `{signature}: v0=<hex>` over `v0:{timestamp}:{body}` (slack, zoom).
fn v0(
    keys: &[Key],
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
    (signature, timestamp): (&HeaderName, &HeaderName),
) -> Result<(), VerifyError> {
    let ts_raw = wire::single(headers, timestamp)?;
    let ts = wire::timestamp(timestamp, ts_raw)?;
    let tags = prefixed(
        headers,
        signature,
        "v0=",
        "expected v0=<hex>",
        Encoding::Hex,
    )?;
    wire::fresh(ts, now, tolerance)?;
    matches(keys, &[b"v0:", ts_raw.as_bytes(), b":", body], &tags)
}

/// `X-Signature-Ed25519: <hex>` over `{X-Signature-Timestamp}{body}`, strict verification (no
/// malleable signatures, no weak keys).
fn discord(
    key: &VerifyingKey,
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let ts_raw = wire::single(headers, &DISCORD_TIMESTAMP)?;
    let ts = wire::timestamp(&DISCORD_TIMESTAMP, ts_raw)?;
    let signature = wire::single(headers, &DISCORD_SIGNATURE)?;
    let mut bytes = [0u8; 64];
    if hex::decode_to_slice(signature, &mut bytes).is_err() {
        return Err(VerifyError::NoMatchingSignature);
    }
    wire::fresh(ts, now, tolerance)?;
    let message = [ts_raw.as_bytes(), body].concat();
    key.verify_strict(&message, &Signature::from_bytes(&bytes))
        .map_err(|_| VerifyError::NoMatchingSignature)
}

/// `webhook-signature: v1,<b64> v1,<b64> v1a,<ed25519>` over `{id}.{ts}.{body}`; or the same
/// under Svix's names (`svix-id`, `svix-timestamp`, `svix-signature`) when a request carries no
/// `webhook-id` but a `svix-id`: one family or the other, never a mix.
fn standard_webhooks(
    keys: &[Key],
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let (id_header, ts_header, signature_header) =
        if headers.contains_key(&WEBHOOK_ID) || !headers.contains_key(&SVIX_ID) {
            (&WEBHOOK_ID, &WEBHOOK_TIMESTAMP, &WEBHOOK_SIGNATURE)
        } else {
            (&SVIX_ID, &SVIX_TIMESTAMP, &SVIX_SIGNATURE)
        };
    let id = wire::single(headers, id_header)?;
    let ts_raw = wire::single(headers, ts_header)?;
    let ts = wire::timestamp(ts_header, ts_raw)?;
    let mut budget = Budget::new(signature_header);
    let mut saw_v1 = false;
    let mut tags = Vec::new();
    for value in wire::pooled(headers, signature_header)? {
        for entry in value.split_ascii_whitespace() {
            budget.take()?;
            let (version, signature) = entry
                .split_once(',')
                .ok_or_else(|| malformed(signature_header, "entry is not version,signature"))?;
            if version != "v1" {
                continue; // v1a (ed25519) and future versions: not ours to check
            }
            saw_v1 = true;
            tags.extend(decode_tag(Encoding::Base64, signature));
        }
    }
    if !saw_v1 {
        return Err(malformed(signature_header, "no v1 signature"));
    }
    wire::fresh(ts, now, tolerance)?;
    matches(
        keys,
        &[id.as_bytes(), b".", ts_raw.as_bytes(), b".", body],
        &tags,
    )
}

/// `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>][,v0=<hex>]` over `{t}.{body}`.
fn stripe(
    keys: &[Key],
    tolerance: Duration,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), VerifyError> {
    let header = &STRIPE_SIGNATURE;
    let value = wire::single(headers, header)?;
    let mut budget = Budget::new(header);
    let mut ts_raw = None;
    let mut saw_v1 = false;
    let mut tags = Vec::new();
    for item in value.split(',').map(str::trim_ascii) {
        if item.is_empty() {
            continue;
        }
        let (key, val) = item
            .split_once('=')
            .ok_or_else(|| malformed(header, "entry is not key=value"))?;
        if key != "t" {
            budget.take()?; // every other entry is a signature, even if ignored
        }
        match key {
            "t" if ts_raw.replace(val).is_some() => {
                return Err(malformed(header, "more than one t= timestamp"));
            }
            "t" => {}
            "v1" => {
                saw_v1 = true;
                tags.extend(decode_tag(Encoding::Hex, val));
            }
            _ => {} // v0 (test-mode legacy) and unknown keys are ignored, as Stripe's libraries do
        }
    }
    let ts_raw = ts_raw.ok_or_else(|| malformed(header, "no t= timestamp"))?;
    let ts = wire::timestamp(header, ts_raw)?;
    if !saw_v1 {
        return Err(malformed(header, "no v1 signature"));
    }
    wire::fresh(ts, now, tolerance)?;
    matches(keys, &[ts_raw.as_bytes(), b".", body], &tags)
}

/// One signature per value, each `{prefix}{encoded tag}`, values pooled.
fn prefixed(
    headers: &HeaderMap,
    header: &HeaderName,
    prefix: &str,
    missing_prefix: &'static str,
    encoding: Encoding,
) -> Result<Vec<Tag>, VerifyError> {
    let mut budget = Budget::new(header);
    let mut tags = Vec::new();
    for value in wire::pooled(headers, header)? {
        budget.take()?;
        let signature = value
            .strip_prefix(prefix)
            .ok_or_else(|| malformed(header, missing_prefix))?;
        tags.extend(decode_tag(encoding, signature));
    }
    Ok(tags)
}

/// Ok if any key's tag over `message` equals any candidate. Every pair is compared in
/// constant time and the loop never exits early, so timing says nothing about which matched.
fn matches(keys: &[Key], message: &[&[u8]], candidates: &[Tag]) -> Result<(), VerifyError> {
    if candidates.is_empty() {
        return Err(VerifyError::NoMatchingSignature);
    }
    let mut found = Choice::from(0);
    for key in keys {
        let expected = key.tag(message);
        for candidate in candidates {
            found |= expected[..].ct_eq(&candidate[..]);
        }
    }
    if bool::from(found) {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

pub(crate) fn sign(
    scheme: &Scheme,
    secret: &Secret,
    event_id: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, SignError> {
    // msgraph's proof is the client state inside the body, which the caller writes.
    if matches!(scheme, Scheme::None | Scheme::Msgraph) {
        return Ok(Vec::new());
    }
    check_scheme(scheme)?;
    if *scheme == Scheme::Discord {
        return discord_sign(secret, body, now);
    }
    let key = Key::derive(scheme, secret, 0)?;
    let ts = wire::unix_secs(now).to_string();
    let id = |header: HeaderName| match HeaderValue::from_str(event_id) {
        Ok(value) if !event_id.trim_ascii().is_empty() => Ok((header, value)),
        _ => Err(SignError::InvalidEventId { header }),
    };
    let hex = |tag: Tag| hex::encode(tag);
    let b64 = |tag: Tag| STANDARD.encode(tag);
    Ok(match scheme {
        Scheme::None | Scheme::Msgraph | Scheme::Discord => Vec::new(),
        Scheme::StandardWebhooks => {
            let id = id(WEBHOOK_ID.clone())?;
            let tag = key.tag(&[event_id.as_bytes(), b".", ts.as_bytes(), b".", body]);
            vec![
                id,
                (WEBHOOK_TIMESTAMP.clone(), encoded(&ts)),
                (
                    WEBHOOK_SIGNATURE.clone(),
                    encoded(&format!("v1,{}", b64(tag))),
                ),
            ]
        }
        Scheme::Stripe => {
            let tag = key.tag(&[ts.as_bytes(), b".", body]);
            let value = format!("t={ts},v1={}", hex(tag));
            vec![(STRIPE_SIGNATURE.clone(), encoded(&value))]
        }
        Scheme::Github => {
            let id = id(GITHUB_DELIVERY.clone())?;
            let value = format!("sha256={}", hex(key.tag(&[body])));
            vec![(HUB_SIGNATURE_256.clone(), encoded(&value)), id]
        }
        Scheme::Shopify => {
            let id = id(SHOPIFY_EVENT_ID.clone())?;
            vec![(SHOPIFY_HMAC.clone(), encoded(&b64(key.tag(&[body])))), id]
        }
        Scheme::Slack | Scheme::Zoom => {
            let (signature, timestamp) = if *scheme == Scheme::Slack {
                (&SLACK_SIGNATURE, &SLACK_TIMESTAMP)
            } else {
                (&ZOOM_SIGNATURE, &ZOOM_TIMESTAMP)
            };
            let tag = key.tag(&[b"v0:", ts.as_bytes(), b":", body]);
            vec![
                (signature.clone(), encoded(&format!("v0={}", hex(tag)))),
                (timestamp.clone(), encoded(&ts)),
            ]
        }
        Scheme::Meta => {
            let value = format!("sha256={}", hex(key.tag(&[body])));
            vec![(HUB_SIGNATURE_256.clone(), encoded(&value))]
        }
        Scheme::Twitter => {
            let value = format!("sha256={}", b64(key.tag(&[body])));
            vec![(TWITTER_SIGNATURE.clone(), encoded(&value))]
        }
        Scheme::Dropbox => vec![(DROPBOX_SIGNATURE.clone(), encoded(&hex(key.tag(&[body]))))],
        Scheme::HmacSha256(generic) => {
            let tag = key.tag(&[body]);
            let signature = match generic.encoding {
                Encoding::Hex => hex(tag),
                Encoding::Base64 => b64(tag),
            };
            let value = format!("{}{signature}", generic.prefix);
            vec![(generic.header.clone(), encoded(&value))]
        }
    })
}

/// discord: the secret is the application's private key seed in hex.
fn discord_sign(
    secret: &Secret,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, SignError> {
    let mut seed = [0u8; 32];
    hex::decode_to_slice(secret.expose().trim_ascii(), &mut seed)
        .map_err(|_| SignError::InvalidSigningKey)?;
    let key = SigningKey::from_bytes(&seed);
    let ts = wire::unix_secs(now).to_string();
    let signature = key.sign(&[ts.as_bytes(), body].concat());
    Ok(vec![
        (
            DISCORD_SIGNATURE.clone(),
            encoded(&hex::encode(signature.to_bytes())),
        ),
        (DISCORD_TIMESTAMP.clone(), encoded(&ts)),
    ])
}

/// A header value made of digits, hex, base64, `=`, `,` and a checked prefix: always valid.
fn encoded(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).expect("digits, hex, base64 and a printable prefix are valid")
}
