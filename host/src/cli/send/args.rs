//! `hookd send`'s flags, and their checking into a [`Target`]: a URL, a [`Scheme`] and a secret,
//! from the flags or from a `hookd.toml` source ([`ClientSource`]).
//!
//! Invariant: the scheme names, which flags a scheme takes, and the encodings all come from
//! `verify`; this file only spells `verify`'s errors as flags.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use http::{HeaderName, HeaderValue};

use crate::{
    config::ClientSource,
    verify::{Encoding, HmacParts, HmacSetting, HmacSettingsError, Scheme, SchemeKind},
};

/// `hookd send`: what to sign, how, where, and how often.
#[derive(Debug, Args)]
#[command(after_help = "\
Prints one line per request (#index, status, latency, body) and then \
`sent N: 2xx=a 4xx=b 5xx=c errors=d`. Exits non-zero only if some request got no HTTP \
response at all (connect failure, timeout); a 401 or 503 is a result, not a failure.

Example (a provider that retries too eagerly):
  HOOKD_SEND_SECRET=s3cret hookd send --url http://127.0.0.1:8080/hooks/github \\
      --scheme github --repeat 3 --concurrency 3 push.json

The same, with everything taken from the config:
  hookd send --config hookd.toml --source github --repeat 3 --concurrency 3 push.json")]
pub struct SendArgs {
    /// Take the URL, the scheme (with its hmac-sha256 header, prefix and encoding) and the
    /// secret from this hookd.toml's `[sources.<--source>]` and `server.listen`, instead of
    /// repeating them as flags (`--url` and `--secret` still override).
    #[arg(long, value_name = "FILE", requires = "source",
          conflicts_with_all = ["scheme", "signature_header", "signature_prefix", "signature_encoding"])]
    pub(super) config: Option<PathBuf>,

    /// With `--config`: the source to send to, as named in the config.
    #[arg(long, value_name = "NAME", requires = "config")]
    pub(super) source: Option<String>,

    /// The ingest URL, e.g. http://127.0.0.1:8080/hooks/stripe. Plain http only: https is out
    /// of scope.
    #[arg(long, value_name = "URL", required_unless_present_any = ["config", "source"])]
    pub(super) url: Option<String>,

    /// How to sign: the source's `scheme` from the config.
    #[arg(
        long,
        value_enum,
        value_name = "SCHEME",
        // With `--source` alone, what is missing is `--config` (which `--source` requires),
        // not these: clap named all three.
        required_unless_present_any = ["config", "source"]
    )]
    pub(super) scheme: Option<SchemeKind>,

    /// The signing secret, as configured for the source (standard-webhooks: `whsec_<base64>`;
    /// discord: the Ed25519 private key seed, 64 hex digits, whose public key the source has).
    /// Not needed for `--scheme none` or `msgraph` (put the `clientState` in FILE). Prefer the
    /// environment variable: a flag shows in `ps`.
    #[arg(
        long,
        env = "HOOKD_SEND_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub(super) secret: Option<String>,

    /// The event id, for schemes that send it in a header: standard-webhooks (`webhook-id`),
    /// github (`X-GitHub-Delivery`), shopify (`X-Shopify-Event-Id`). For every other scheme the
    /// id is in the body (your FILE), so this has no effect there.
    /// Default: random (`msg_...`, or a UUID for github/shopify), chosen once and sent with every
    /// copy.
    #[arg(long, value_name = "ID")]
    pub(super) event_id: Option<String>,

    /// Send N copies of the same event (same id, freshly signed each time).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) repeat: u32,

    /// Wait M ms before each send after the first: after the previous answer with
    /// `--concurrency 1`, otherwise between starts.
    #[arg(long, value_name = "M", default_value_t = 0)]
    pub(super) interval_ms: u64,

    /// Keep up to C requests in flight at once.
    #[arg(long, value_name = "C", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(super) concurrency: u32,

    /// An extra request header, `Name: value` (repeatable). It replaces a header of the same
    /// name that hookd would set (content-type, the scheme's id and signature headers), so a
    /// tampered request can be sent too. Default content-type: application/json.
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE", value_parser = parse_header)]
    pub(super) headers: Vec<ExtraHeader>,

    /// hmac-sha256 only (required there): the header that carries the signature.
    #[arg(long, value_name = "NAME", required_if_eq("scheme", SchemeKind::HmacSha256.name()))]
    pub(super) signature_header: Option<String>,

    /// hmac-sha256 only: literal text before the signature, e.g. `sha256=` (default: none).
    #[arg(long, value_name = "PREFIX")]
    pub(super) signature_prefix: Option<String>,

    /// hmac-sha256 only: how the signature is written (default: hex).
    #[arg(long, value_enum, value_name = "ENCODING")]
    pub(super) signature_encoding: Option<Encoding>,

    /// The payload, sent byte for byte; `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub(super) file: PathBuf,
}

/// One `--header 'Name: value'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExtraHeader {
    pub(super) name: HeaderName,
    pub(super) value: HeaderValue,
}

/// Parses `Name: value` (whitespace around the value is dropped; the value may be empty).
pub(super) fn parse_header(text: &str) -> Result<ExtraHeader, String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not `Name: value` (no colon)"))?;
    let name = name.trim();
    let name =
        HeaderName::try_from(name).map_err(|_| format!("{name:?} is not a valid header name"))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of header {name} is not a valid header value"))?;
    Ok(ExtraHeader { name, value })
}

/// Where to send, how to sign and with which secret: from the flags, or from the config file.
pub(super) struct Target {
    pub(super) url: String,
    pub(super) scheme: Scheme,
    /// `None`: not given (an error for a scheme that signs).
    pub(super) secret: Option<String>,
}

impl SendArgs {
    /// The target: `--config`'s source, with `--url` and `--secret` overriding it; or the
    /// flags alone.
    pub(super) fn target(&self) -> anyhow::Result<Target> {
        if self
            .url
            .as_deref()
            .is_some_and(super::super::client::has_user_info)
        {
            anyhow::bail!(
                "--url holds user info (`user:password@`): hookd send sends none (it would only \
                 be printed back); give http://host:port/hooks/<source>, and the source's secret \
                 with --secret (or HOOKD_SEND_SECRET)"
            );
        }
        if let (Some(config), Some(source)) = (&self.config, &self.source) {
            let from = ClientSource::load(config, source)?;
            return Ok(Target {
                url: self.url.clone().unwrap_or(from.url),
                scheme: from.scheme,
                secret: self.secret.clone().or(from.secret),
            });
        }
        Ok(Target {
            url: self
                .url
                .clone()
                .context("--url is required without --config")?,
            scheme: self.scheme()?,
            secret: self.secret.clone(),
        })
    }

    /// The scheme, with the hmac-sha256 flags checked by `verify` and named here as flags.
    fn scheme(&self) -> anyhow::Result<Scheme> {
        let kind = self
            .scheme
            .context("--scheme is required without --config")?;
        let parts = HmacParts {
            header: self.signature_header.as_deref(),
            prefix: self.signature_prefix.as_deref(),
            encoding: self.signature_encoding.map(Encoding::name),
        };
        let hmac = SchemeKind::HmacSha256;
        Scheme::from_parts(kind, parts).map_err(|e| match e {
            HmacSettingsError::NotApplicable { setting } => {
                anyhow!("{} only applies to --scheme {hmac}", flag(setting))
            }
            HmacSettingsError::MissingHeader => {
                anyhow!("--signature-header is required for --scheme {hmac}")
            }
            HmacSettingsError::InvalidHeader { given } => {
                anyhow!("--signature-header {given:?} is not a valid header name")
            }
            HmacSettingsError::InvalidEncoding(e) => anyhow!("--signature-encoding: {e}"),
        })
    }
}

/// The flag that sets `setting`.
fn flag(setting: HmacSetting) -> &'static str {
    match setting {
        HmacSetting::Header => "--signature-header",
        HmacSetting::Prefix => "--signature-prefix",
        HmacSetting::Encoding => "--signature-encoding",
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_argv;
    use super::*;

    /// `hookd send --url … <extra> payload.json`.
    fn parse(extra: &[&str]) -> Result<SendArgs, clap::Error> {
        let mut argv = vec!["send", "--url", "http://127.0.0.1:8080/hooks/a"];
        argv.extend_from_slice(extra);
        argv.push("payload.json");
        parse_argv(argv)
    }

    #[test]
    fn header_parsing() {
        let h = parse_header("X-Test:  a value: with colon ").unwrap();
        assert_eq!(h.name, "x-test");
        assert_eq!(h.value, "a value: with colon");
        assert_eq!(parse_header("X-Empty:").unwrap().value, "");
        let no_colon = parse_header("X-Test value").unwrap_err();
        assert!(no_colon.contains("X-Test value"), "{no_colon}");
        let bad_name = parse_header("Bad Name: x").unwrap_err();
        assert!(bad_name.contains("Bad Name"), "{bad_name}");
        assert!(
            parse_header("X-Ctl: a\u{1}b")
                .unwrap_err()
                .contains("x-ctl")
        );
    }

    /// `--source` without `--config` names `--config` as what is missing, not `--url` and
    /// `--scheme` too (which `--config` makes unnecessary).
    #[test]
    fn a_source_without_a_config_asks_for_the_config_alone() {
        let err = parse_argv(vec!["send", "--source", "github", "payload.json"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--config <FILE>"), "{err}");
        assert!(!err.contains("--url") && !err.contains("--scheme"), "{err}");
        // Without either, what a send needs is asked for.
        let err = parse_argv(vec!["send", "payload.json"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--url <URL>") && err.contains("--scheme"),
            "{err}"
        );
    }

    /// A URL with user info is refused without being echoed: the client sends none, and it
    /// was printed in the announcement and in every error.
    #[test]
    fn a_url_with_user_info_is_refused_unechoed() {
        let args: SendArgs = parse_argv(vec![
            "send",
            "--url",
            "http://hooks:pw-9876@127.0.0.1:8080/hooks/a",
            "--scheme",
            "none",
            "payload.json",
        ])
        .unwrap();
        let err = args.target().err().expect("refused").to_string();
        assert!(err.contains("--url holds user info"), "{err}");
        assert!(!err.contains("pw-9876"), "{err}");
    }

    #[test]
    fn header_flag_errors_name_the_value() {
        let err = parse(&["--scheme", "none", "--header", "nocolon"]).unwrap_err();
        assert!(err.to_string().contains("nocolon"), "{err}");
    }

    #[test]
    fn every_scheme_name_parses_except_hmac_without_its_header() {
        for kind in SchemeKind::ALL {
            let parsed = parse(&["--scheme", kind.name()]);
            if kind == SchemeKind::HmacSha256 {
                assert!(parsed.is_err(), "--signature-header is required");
            } else {
                assert_eq!(parsed.unwrap().scheme().unwrap().kind(), kind);
            }
        }
    }

    #[test]
    fn unknown_scheme_errors_name_the_bad_value_and_the_valid_ones() {
        let err = parse(&["--scheme", "strype"]).unwrap_err().to_string();
        assert!(err.contains("strype"), "{err}");
        assert!(
            err.contains("standard-webhooks"),
            "lists the valid names: {err}"
        );
    }

    #[test]
    fn hmac_flags_build_the_generic_scheme() {
        let args = parse(&[
            "--scheme",
            "hmac-sha256",
            "--signature-header",
            "X-Sig",
            "--signature-prefix",
            "sha256=",
            "--signature-encoding",
            "base64",
        ])
        .unwrap();
        let Scheme::HmacSha256(hmac) = args.scheme().unwrap() else {
            panic!("not hmac-sha256");
        };
        assert_eq!(hmac.header, "x-sig");
        assert_eq!(hmac.prefix, "sha256=");
        assert_eq!(hmac.encoding, Encoding::Base64);
    }

    #[test]
    fn an_invalid_signature_header_is_named() {
        let args = parse(&[
            "--scheme",
            "hmac-sha256",
            "--signature-header",
            "bad header",
        ])
        .unwrap();
        let err = args.scheme().unwrap_err().to_string();
        assert_eq!(
            err,
            "--signature-header \"bad header\" is not a valid header name"
        );
    }

    #[test]
    fn hmac_flags_are_refused_for_other_schemes() {
        let args = parse(&["--scheme", "github", "--signature-prefix", "x"]).unwrap();
        let err = args.scheme().unwrap_err().to_string();
        assert_eq!(
            err,
            "--signature-prefix only applies to --scheme hmac-sha256"
        );
    }

    #[test]
    fn repeat_and_concurrency_must_be_positive() {
        assert!(parse(&["--scheme", "none", "--repeat", "0"]).is_err());
        assert!(parse(&["--scheme", "none", "--concurrency", "0"]).is_err());
        let args = parse(&["--scheme", "none"]).unwrap();
        assert_eq!((args.repeat, args.concurrency, args.interval_ms), (1, 1, 0));
    }
}
