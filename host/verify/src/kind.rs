//! [`SchemeKind`] and [`Encoding`]: the names a config or a CLI uses for them, and the headers
//! each scheme reads or writes.
//!
//! Invariant: every scheme name, and every header a scheme is known by, is written once, here, in
//! one arm of [`SchemeKind::vocabulary`]. Config parsing, `hookd send`, the no-parser event
//! envelope and the README table all ask it, so naming a new scheme touches nothing outside
//! this crate.

use std::fmt;
use std::str::FromStr;

use http::HeaderName;

pub(crate) static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
pub(crate) static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
pub(crate) static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
/// Svix's own names for the three Standard Webhooks headers: what Svix (and Resend, which
/// sends through it) puts on a request unless an account is white-labelled to `webhook-*`.
pub(crate) static SVIX_ID: HeaderName = HeaderName::from_static("svix-id");
pub(crate) static SVIX_TIMESTAMP: HeaderName = HeaderName::from_static("svix-timestamp");
pub(crate) static SVIX_SIGNATURE: HeaderName = HeaderName::from_static("svix-signature");
pub(crate) static STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");
pub(crate) static HUB_SIGNATURE_256: HeaderName = HeaderName::from_static("x-hub-signature-256");
pub(crate) static GITHUB_DELIVERY: HeaderName = HeaderName::from_static("x-github-delivery");
pub(crate) static GITHUB_EVENT: HeaderName = HeaderName::from_static("x-github-event");
pub(crate) static SHOPIFY_HMAC: HeaderName = HeaderName::from_static("x-shopify-hmac-sha256");
pub(crate) static SHOPIFY_EVENT_ID: HeaderName = HeaderName::from_static("x-shopify-event-id");
pub(crate) static SHOPIFY_TOPIC: HeaderName = HeaderName::from_static("x-shopify-topic");
pub(crate) static SLACK_SIGNATURE: HeaderName = HeaderName::from_static("x-slack-signature");
pub(crate) static SLACK_TIMESTAMP: HeaderName =
    HeaderName::from_static("x-slack-request-timestamp");
pub(crate) static DISCORD_SIGNATURE: HeaderName = HeaderName::from_static("x-signature-ed25519");
pub(crate) static DISCORD_TIMESTAMP: HeaderName = HeaderName::from_static("x-signature-timestamp");
pub(crate) static ZOOM_SIGNATURE: HeaderName = HeaderName::from_static("x-zm-signature");
pub(crate) static ZOOM_TIMESTAMP: HeaderName = HeaderName::from_static("x-zm-request-timestamp");
pub(crate) static TWITTER_SIGNATURE: HeaderName =
    HeaderName::from_static("x-twitter-webhooks-signature");
pub(crate) static DROPBOX_SIGNATURE: HeaderName = HeaderName::from_static("x-dropbox-signature");
/// The id headers of the schemes that have one (see [`SchemeKind::id_headers`]).
static STANDARD_WEBHOOKS_IDS: [&HeaderName; 2] = [&WEBHOOK_ID, &SVIX_ID];
static GITHUB_IDS: [&HeaderName; 1] = [&GITHUB_DELIVERY];
static SHOPIFY_IDS: [&HeaderName; 1] = [&SHOPIFY_EVENT_ID];

/// Which scheme a source uses, without the settings the generic one needs (see
/// [`crate::Scheme`] for the scheme with its settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemeKind {
    StandardWebhooks,
    Stripe,
    Github,
    Shopify,
    Slack,
    Discord,
    Zoom,
    Meta,
    Twitter,
    Dropbox,
    Msgraph,
    HmacSha256,
    None,
}

impl SchemeKind {
    /// Every scheme, in the order error messages and help texts list them.
    pub const ALL: [SchemeKind; 13] = [
        SchemeKind::StandardWebhooks,
        SchemeKind::Stripe,
        SchemeKind::Github,
        SchemeKind::Shopify,
        SchemeKind::Slack,
        SchemeKind::Discord,
        SchemeKind::Zoom,
        SchemeKind::Meta,
        SchemeKind::Twitter,
        SchemeKind::Dropbox,
        SchemeKind::Msgraph,
        SchemeKind::HmacSha256,
        SchemeKind::None,
    ];

    /// The name in the config's `scheme` key and in `hookd send --scheme`.
    pub fn name(self) -> &'static str {
        self.vocabulary().name
    }

    /// One line on what a request of this scheme carries, for help texts.
    pub fn summary(self) -> &'static str {
        self.vocabulary().summary
    }

    /// The header that carries the signature; `None` for `hmac-sha256` (its header is a
    /// setting) and for `none`.
    pub fn signature_header(self) -> Option<&'static HeaderName> {
        self.vocabulary().signature_header
    }

    /// Whether a request of this scheme carries a signature (so signing one needs a key): false
    /// for `none` and for `msgraph`, whose proof is the `clientState` written in the body.
    pub fn signs(self) -> bool {
        self.signature_header().is_some() || self == SchemeKind::HmacSha256
    }

    /// The header carrying the provider's stable delivery id, if the scheme has one.
    pub fn id_header(self) -> Option<&'static HeaderName> {
        self.id_headers().first().copied()
    }

    /// Every header that may carry the delivery id, [`Self::id_header`] first: a request
    /// carries one of them (standard-webhooks: `webhook-id`, or Svix's `svix-id`).
    pub fn id_headers(self) -> &'static [&'static HeaderName] {
        self.vocabulary().id_headers
    }

    /// The header naming the event's type, if the provider sends one (it is never signed).
    pub fn type_header(self) -> Option<&'static HeaderName> {
        self.vocabulary().type_header
    }

    /// The set-up handshake hookd answers for this scheme, for help texts and the README.
    pub fn handshake(self) -> &'static str {
        self.vocabulary().handshake
    }

    /// Whether the provider proves the endpoint with a `GET` (so `GET /hooks/{source}` is
    /// answered; for every other scheme it is 405).
    pub fn answers_get(self) -> bool {
        self.vocabulary().answers_get
    }

    /// The extra value the scheme is configured with besides (or instead of) its secrets, as
    /// the config key names it: `public_key`, `verify_token` or `client_state`.
    pub fn credential(self) -> Option<Credential> {
        self.vocabulary().credential
    }

    /// What the signature covers: for a scheme that signs only the body, its id and type
    /// headers are the sender's word.
    pub fn covers(self) -> &'static str {
        self.vocabulary().covers
    }

    /// Whether the scheme signs a timestamp, checked against `tolerance_secs`: only then is a
    /// captured request refused once it is old (for the others the setting does nothing).
    pub fn signs_timestamp(self) -> bool {
        self.vocabulary().timestamped
    }

    /// Everything but the signature format, in one arm per scheme.
    fn vocabulary(self) -> Vocabulary {
        match self {
            SchemeKind::StandardWebhooks => Vocabulary {
                name: "standard-webhooks",
                summary: "webhook-id, webhook-timestamp, webhook-signature, or the same as svix-id, \
                          svix-timestamp, svix-signature (Svix, Resend, ...)",
                signature_header: Some(&WEBHOOK_SIGNATURE),
                id_headers: &STANDARD_WEBHOOKS_IDS,
                type_header: None,
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "the id, the timestamp and the body",
                timestamped: true,
            },
            SchemeKind::Stripe => Vocabulary {
                name: "stripe",
                summary: "Stripe-Signature: t=...,v1=... (the event id is in the body)",
                signature_header: Some(&STRIPE_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "the timestamp and the body (the event id in it)",
                timestamped: true,
            },
            SchemeKind::Github => Vocabulary {
                name: "github",
                summary: "X-Hub-Signature-256 and X-GitHub-Delivery",
                signature_header: Some(&HUB_SIGNATURE_256),
                id_headers: &GITHUB_IDS,
                type_header: Some(&GITHUB_EVENT),
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::Shopify => Vocabulary {
                name: "shopify",
                summary: "X-Shopify-Hmac-Sha256 and X-Shopify-Event-Id",
                signature_header: Some(&SHOPIFY_HMAC),
                id_headers: &SHOPIFY_IDS,
                type_header: Some(&SHOPIFY_TOPIC),
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::Slack => Vocabulary {
                name: "slack",
                summary: "X-Slack-Signature and X-Slack-Request-Timestamp",
                signature_header: Some(&SLACK_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "signed `url_verification` POST: the `challenge` is echoed",
                answers_get: false,
                credential: None,
                covers: "the timestamp and the body",
                timestamped: true,
            },
            SchemeKind::Discord => Vocabulary {
                name: "discord",
                summary: "Ed25519 X-Signature-Ed25519 over X-Signature-Timestamp + body (`public_key`)",
                signature_header: Some(&DISCORD_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "signed `PING` (`type` 1): answered `{\"type\":1}`",
                answers_get: false,
                credential: Some(Credential::PublicKey),
                covers: "the timestamp and the body",
                timestamped: true,
            },
            SchemeKind::Zoom => Vocabulary {
                name: "zoom",
                summary: "x-zm-signature: v0=... with x-zm-request-timestamp",
                signature_header: Some(&ZOOM_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "signed `endpoint.url_validation`: answered with the `plainToken` and its HMAC",
                answers_get: false,
                credential: None,
                covers: "the timestamp and the body",
                timestamped: true,
            },
            SchemeKind::Meta => Vocabulary {
                name: "meta",
                summary: "X-Hub-Signature-256 (WhatsApp, Messenger, Instagram; the app secret)",
                signature_header: Some(&HUB_SIGNATURE_256),
                id_headers: &[],
                type_header: None,
                handshake: "`GET ?hub.mode=subscribe&hub.verify_token=...&hub.challenge=...`: the challenge is echoed if the token matches",
                answers_get: true,
                credential: Some(Credential::VerifyToken),
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::Twitter => Vocabulary {
                name: "twitter",
                summary: "x-twitter-webhooks-signature: sha256=<base64> (the consumer secret)",
                signature_header: Some(&TWITTER_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "`GET ?crc_token=...`: answered with the token's HMAC as `response_token`",
                answers_get: true,
                credential: None,
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::Dropbox => Vocabulary {
                name: "dropbox",
                summary: "X-Dropbox-Signature: hex HMAC of the body (the app secret)",
                signature_header: Some(&DROPBOX_SIGNATURE),
                id_headers: &[],
                type_header: None,
                handshake: "`GET ?challenge=...`: the challenge is echoed as text/plain",
                answers_get: true,
                credential: None,
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::Msgraph => Vocabulary {
                name: "msgraph",
                summary: "Microsoft Graph: every notification's `clientState` equals `client_state`",
                signature_header: None,
                id_headers: &[],
                type_header: None,
                handshake: "`POST ?validationToken=...`: the token is echoed as text/plain",
                answers_get: false,
                credential: Some(Credential::ClientState),
                covers: "—",
                timestamped: false,
            },
            SchemeKind::HmacSha256 => Vocabulary {
                name: "hmac-sha256",
                summary: "An HMAC-SHA256 of the body in a configured header",
                signature_header: None,
                id_headers: &[],
                type_header: None,
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "the body only",
                timestamped: false,
            },
            SchemeKind::None => Vocabulary {
                name: "none",
                summary: "No signature",
                signature_header: None,
                id_headers: &[],
                type_header: None,
                handshake: "—",
                answers_get: false,
                credential: None,
                covers: "nothing",
                timestamped: false,
            },
        }
    }
}

/// What [`SchemeKind`]'s accessors return, for one scheme.
#[derive(Clone, Copy)]
struct Vocabulary {
    name: &'static str,
    summary: &'static str,
    signature_header: Option<&'static HeaderName>,
    /// Every header that may carry the delivery id, the usual one first.
    id_headers: &'static [&'static HeaderName],
    type_header: Option<&'static HeaderName>,
    handshake: &'static str,
    answers_get: bool,
    credential: Option<Credential>,
    /// What the signature covers, for the README.
    covers: &'static str,
    /// Whether a signed timestamp is checked against `tolerance_secs`.
    timestamped: bool,
}

/// A value a scheme is configured with besides its secrets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Credential {
    /// discord: the application's hex Ed25519 public key, instead of secrets.
    PublicKey,
    /// meta: the token the `GET` subscription handshake must present, besides the app secret.
    VerifyToken,
    /// msgraph: the `clientState` every notification must carry, instead of secrets.
    ClientState,
}

impl Credential {
    /// The config key (and `hookd send` flag without the dashes) that gives it.
    pub fn key(self) -> &'static str {
        match self {
            Credential::PublicKey => "public_key",
            Credential::VerifyToken => "verify_token",
            Credential::ClientState => "client_state",
        }
    }

    /// Whether it replaces the secrets (discord, msgraph) rather than comes with them (meta).
    pub fn replaces_secrets(self) -> bool {
        !matches!(self, Credential::VerifyToken)
    }
}

impl fmt::Display for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

impl fmt::Display for SchemeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scheme name that is not one of [`SchemeKind::ALL`]; the message lists them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not one of {}", Self::choices())]
pub struct UnknownScheme {
    /// The name as given.
    pub given: String,
}

impl UnknownScheme {
    /// The names a scheme may have, as the message lists them (for a message that must not
    /// show what was given: a secret written in the wrong place).
    pub fn choices() -> String {
        list(&SchemeKind::ALL.map(SchemeKind::name), false)
    }
}

impl FromStr for SchemeKind {
    type Err = UnknownScheme;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == given)
            .ok_or_else(|| UnknownScheme {
                given: given.to_owned(),
            })
    }
}

/// How a signature is written in a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Hex digits, either case.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

impl Encoding {
    /// Every encoding, in the order error messages and help texts list them.
    pub const ALL: [Encoding; 2] = [Encoding::Hex, Encoding::Base64];

    /// The name in the config's `signature_encoding` key and in `--signature-encoding`.
    pub const fn name(self) -> &'static str {
        match self {
            Encoding::Hex => "hex",
            Encoding::Base64 => "base64",
        }
    }

    /// One line on what the signature looks like, for help texts.
    pub const fn summary(self) -> &'static str {
        match self {
            Encoding::Hex => "Hex digits",
            Encoding::Base64 => "Standard base64 with padding",
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An encoding name that is not one of [`Encoding::ALL`]; the message lists them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not one of {}", Self::choices())]
pub struct UnknownEncoding {
    /// The name as given.
    pub given: String,
}

impl UnknownEncoding {
    /// The names an encoding may have, as the message lists them.
    pub fn choices() -> String {
        list(&Encoding::ALL.map(Encoding::name), true)
    }
}

impl FromStr for Encoding {
    type Err = UnknownEncoding;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|encoding| encoding.name() == given)
            .ok_or_else(|| UnknownEncoding {
                given: given.to_owned(),
            })
    }
}

/// `a, b, c`, or `"a", "b", "c"` when `quoted`.
fn list(names: &[&str], quoted: bool) -> String {
    let quote = |name: &&str| {
        if quoted {
            format!("{name:?}")
        } else {
            (*name).to_owned()
        }
    };
    names.iter().map(quote).collect::<Vec<_>>().join(", ")
}

#[cfg(feature = "clap")]
mod cli {
    use clap::{ValueEnum, builder::PossibleValue};

    use super::{Encoding, SchemeKind};

    impl ValueEnum for SchemeKind {
        fn value_variants<'a>() -> &'a [Self] {
            &Self::ALL
        }

        fn to_possible_value(&self) -> Option<PossibleValue> {
            Some(PossibleValue::new(self.name()).help(self.summary()))
        }
    }

    impl ValueEnum for Encoding {
        fn value_variants<'a>() -> &'a [Self] {
            &Self::ALL
        }

        fn to_possible_value(&self) -> Option<PossibleValue> {
            Some(PossibleValue::new(self.name()).help(self.summary()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's scheme table, between its markers.
    const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"));
    const TABLE_BEGIN: &str = "<!-- scheme table: generated from SchemeKind, checked by `cargo test -p hookd-verify` -->\n";
    const TABLE_END: &str = "<!-- end of scheme table -->";

    /// The table as the code describes the schemes.
    fn scheme_table() -> String {
        let cell =
            |header: Option<&HeaderName>| header.map_or("—".to_owned(), |h| format!("`{h}`"));
        let mut table = String::from(
            "| scheme | signature header | signs | event id header | event type header | a request carries | set-up handshake |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for kind in SchemeKind::ALL {
            let signature = match kind {
                SchemeKind::HmacSha256 => "`signature_header`".to_owned(),
                SchemeKind::Msgraph => "— (`clientState` in the body)".to_owned(),
                _ => cell(kind.signature_header()),
            };
            table.push_str(&format!(
                "| `{kind}` | {signature} | {} | {} | {} | {} | {} |\n",
                kind.covers(),
                cell(kind.id_header()),
                cell(kind.type_header()),
                kind.summary(),
                kind.handshake()
            ));
        }
        table
    }

    #[test]
    fn readme_scheme_table_matches_the_code() {
        let start = README
            .find(TABLE_BEGIN)
            .expect("README has the scheme table marker")
            + TABLE_BEGIN.len();
        let len = README[start..]
            .find(TABLE_END)
            .expect("README has the end marker");
        let expected = scheme_table();
        assert!(
            README[start..start + len] == expected,
            "README's scheme table is out of date; it should read:\n{expected}"
        );
    }

    #[test]
    fn every_name_parses_back_to_its_scheme() {
        for kind in SchemeKind::ALL {
            assert_eq!(kind.name().parse(), Ok(kind));
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_every_valid_one_listed() {
        let err = "gitlab".parse::<SchemeKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"gitlab\" is not one of standard-webhooks, stripe, github, shopify, slack, \
             discord, zoom, meta, twitter, dropbox, msgraph, hmac-sha256, none"
        );
    }

    #[test]
    fn names_are_matched_exactly() {
        assert!("GitHub".parse::<SchemeKind>().is_err());
    }

    #[test]
    fn every_encoding_name_parses_back_to_its_encoding() {
        for encoding in Encoding::ALL {
            assert_eq!(encoding.name().parse(), Ok(encoding));
        }
    }

    #[test]
    fn an_unknown_encoding_is_refused_with_the_valid_ones_quoted() {
        let err = "b64".parse::<Encoding>().unwrap_err();
        assert_eq!(err.to_string(), "\"b64\" is not one of \"hex\", \"base64\"");
    }
}
