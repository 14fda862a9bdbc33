//! The generic scheme's settings as a config file or a command line gives them, checked into a
//! [`Scheme`].
//!
//! Invariant: this is the one place that decides which settings a scheme takes: `hmac-sha256`
//! requires a valid signature header and takes a prefix and an encoding; every other scheme
//! refuses all three. Errors name the setting, and callers spell it their way (a config key, a
//! flag).

use std::fmt;

use http::HeaderName;

use crate::{Encoding, HmacScheme, Scheme, SchemeKind, UnknownEncoding};

/// The generic scheme's settings as written, each `None` when not given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HmacParts<'a> {
    /// The header that carries the signature.
    pub header: Option<&'a str>,
    /// Literal text before the signature (default: none).
    pub prefix: Option<&'a str>,
    /// An [`Encoding`] name (default: hex).
    pub encoding: Option<&'a str>,
}

/// One of the generic scheme's settings, for callers to name in their own words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HmacSetting {
    Header,
    Prefix,
    Encoding,
}

impl fmt::Display for HmacSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HmacSetting::Header => "the signature header",
            HmacSetting::Prefix => "the signature prefix",
            HmacSetting::Encoding => "the signature encoding",
        })
    }
}

/// Why [`Scheme::from_parts`] refused the settings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HmacSettingsError {
    /// A setting was given for a scheme other than `hmac-sha256`.
    #[error("{setting} only applies to scheme hmac-sha256")]
    NotApplicable { setting: HmacSetting },
    /// `hmac-sha256` without a signature header.
    #[error("the signature header is required for scheme hmac-sha256")]
    MissingHeader,
    /// The signature header is not a valid header name.
    #[error("{given:?} is not a valid header name")]
    InvalidHeader { given: String },
    /// The encoding is not one of [`Encoding::ALL`].
    #[error(transparent)]
    InvalidEncoding(#[from] UnknownEncoding),
}

impl Scheme {
    /// The scheme `kind` with the generic settings `parts`: what `hmac-sha256` requires, and
    /// nothing for any other scheme. Settings are checked in the order header, prefix, encoding.
    pub fn from_parts(kind: SchemeKind, parts: HmacParts<'_>) -> Result<Self, HmacSettingsError> {
        let given = [
            (HmacSetting::Header, parts.header.is_some()),
            (HmacSetting::Prefix, parts.prefix.is_some()),
            (HmacSetting::Encoding, parts.encoding.is_some()),
        ];
        if kind != SchemeKind::HmacSha256
            && let Some((setting, _)) = given.into_iter().find(|(_, given)| *given)
        {
            return Err(HmacSettingsError::NotApplicable { setting });
        }
        Ok(match kind {
            SchemeKind::StandardWebhooks => Scheme::StandardWebhooks,
            SchemeKind::Stripe => Scheme::Stripe,
            SchemeKind::Github => Scheme::Github,
            SchemeKind::Shopify => Scheme::Shopify,
            SchemeKind::Slack => Scheme::Slack,
            SchemeKind::Discord => Scheme::Discord,
            SchemeKind::Zoom => Scheme::Zoom,
            SchemeKind::Meta => Scheme::Meta,
            SchemeKind::Twitter => Scheme::Twitter,
            SchemeKind::Dropbox => Scheme::Dropbox,
            SchemeKind::Msgraph => Scheme::Msgraph,
            SchemeKind::HmacSha256 => Scheme::HmacSha256(HmacScheme::from_parts(parts)?),
            SchemeKind::None => Scheme::None,
        })
    }
}

impl HmacScheme {
    /// The generic scheme from its settings: the header is required; the prefix defaults to
    /// none and the encoding to hex. Whether the prefix can be sent is [`crate::Verifier::new`]'s
    /// check, because a `HmacScheme` can also be built directly.
    pub fn from_parts(parts: HmacParts<'_>) -> Result<Self, HmacSettingsError> {
        let header = parts.header.ok_or(HmacSettingsError::MissingHeader)?;
        let header =
            HeaderName::try_from(header).map_err(|_| HmacSettingsError::InvalidHeader {
                given: header.to_owned(),
            })?;
        let encoding = match parts.encoding {
            Some(name) => name.parse()?,
            None => Encoding::Hex,
        };
        Ok(Self {
            header,
            prefix: parts.prefix.unwrap_or_default().to_owned(),
            encoding,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str) -> HmacParts<'_> {
        HmacParts {
            header: Some(name),
            ..HmacParts::default()
        }
    }

    #[test]
    fn hmac_sha256_requires_a_signature_header() {
        let result = Scheme::from_parts(SchemeKind::HmacSha256, HmacParts::default());
        assert_eq!(result, Err(HmacSettingsError::MissingHeader));
    }

    #[test]
    fn an_invalid_signature_header_is_refused_by_name() {
        let result = HmacScheme::from_parts(header("bad header"));
        assert_eq!(
            result,
            Err(HmacSettingsError::InvalidHeader {
                given: "bad header".into()
            })
        );
    }

    #[test]
    fn prefix_and_encoding_default_to_none_and_hex() {
        let scheme = HmacScheme::from_parts(header("X-Sig")).unwrap();
        assert_eq!(
            (
                scheme.header.as_str(),
                scheme.prefix.as_str(),
                scheme.encoding
            ),
            ("x-sig", "", Encoding::Hex)
        );
    }

    #[test]
    fn an_unknown_encoding_is_refused() {
        let parts = HmacParts {
            encoding: Some("b64"),
            ..header("X-Sig")
        };
        assert!(matches!(
            HmacScheme::from_parts(parts),
            Err(HmacSettingsError::InvalidEncoding(_))
        ));
    }

    #[test]
    fn every_other_scheme_refuses_every_hmac_setting() {
        let each = [
            (HmacSetting::Header, header("X-Sig")),
            (
                HmacSetting::Prefix,
                HmacParts {
                    prefix: Some(""),
                    ..HmacParts::default()
                },
            ),
            (
                HmacSetting::Encoding,
                HmacParts {
                    encoding: Some("hex"),
                    ..HmacParts::default()
                },
            ),
        ];
        for kind in SchemeKind::ALL
            .into_iter()
            .filter(|k| *k != SchemeKind::HmacSha256)
        {
            for (setting, parts) in each {
                let result = Scheme::from_parts(kind, parts);
                assert_eq!(
                    result,
                    Err(HmacSettingsError::NotApplicable { setting }),
                    "{kind}"
                );
            }
        }
    }

    #[test]
    fn a_refused_setting_is_reported_before_the_encoding_is_parsed() {
        let parts = HmacParts {
            encoding: Some("b64"),
            ..HmacParts::default()
        };
        assert_eq!(
            Scheme::from_parts(SchemeKind::Github, parts),
            Err(HmacSettingsError::NotApplicable {
                setting: HmacSetting::Encoding
            })
        );
    }

    #[test]
    fn every_scheme_without_settings_is_built_from_its_kind_alone() {
        for kind in SchemeKind::ALL
            .into_iter()
            .filter(|k| *k != SchemeKind::HmacSha256)
        {
            assert_eq!(
                Scheme::from_parts(kind, HmacParts::default()).map(|s| s.kind()),
                Ok(kind)
            );
        }
    }
}
