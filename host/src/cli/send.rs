//! `hookd send`: sign a payload exactly as a provider would and POST it, optionally many times
//! with the same event id (a retry-happy provider, which resends a delivery it got no answer for).
//!
//! Invariants: the payload is sent byte for byte as read; signatures come only from
//! [`verify::try_sign`] (no signature format is known here), computed per request with the
//! current time so timestamps are fresh; every copy carries the same event id; the secret is never
//! printed. HTTP goes through the shared helper in `client.rs` (plain http only).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};
use rand::distr::{Alphanumeric, SampleString as _};
use tokio::{io::AsyncReadExt as _, sync::Semaphore, task::JoinSet};

use super::client::{self, HttpClient};
use crate::verify::{self, Encoding, HmacScheme, Scheme, Secret};

/// How much of each response body a result line shows.
const LINE_BODY_CHARS: usize = 1_000;

/// `hookd send`: what to sign, how, where, and how often.
#[derive(Debug, Args)]
#[command(after_help = "\
Prints one line per request (#index, status, latency, body) and then \
`sent N: 2xx=a 4xx=b 5xx=c errors=d`. Exits non-zero only if some request got no HTTP \
response at all (connect failure, timeout); a 401 or 503 is a result, not a failure.

Example (a provider that retries too eagerly):
  HOOKD_SEND_SECRET=s3cret hookd send --url http://127.0.0.1:8080/hooks/github \\
      --scheme github --repeat 3 --concurrency 3 push.json")]
pub struct SendArgs {
    /// The ingest URL, e.g. http://127.0.0.1:8080/hooks/stripe. Plain http only: https is out
    /// of scope.
    #[arg(long, value_name = "URL")]
    url: String,

    /// How to sign: the source's `scheme` from the config.
    #[arg(long, value_enum, value_name = "SCHEME")]
    scheme: SchemeName,

    /// The signing secret, as configured for the source (standard-webhooks: `whsec_<base64>`).
    /// Not needed for `--scheme none`. Prefer the environment variable: a flag shows in `ps`.
    #[arg(
        long,
        env = "HOOKD_SEND_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    secret: Option<String>,

    /// The event id, for schemes that send it in a header: standard-webhooks (`webhook-id`),
    /// github (`X-GitHub-Delivery`), shopify (`X-Shopify-Event-Id`). For stripe, slack,
    /// hmac-sha256 and none the id is in the body (your FILE), so this has no effect there.
    /// Default: random (`msg_...`, or a UUID for github/shopify), chosen once and sent with every
    /// copy.
    #[arg(long, value_name = "ID")]
    event_id: Option<String>,

    /// Send N copies of the same event (same id, freshly signed each time).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,

    /// Wait M ms before each send after the first: after the previous answer with
    /// `--concurrency 1`, otherwise between starts.
    #[arg(long, value_name = "M", default_value_t = 0)]
    interval_ms: u64,

    /// Keep up to C requests in flight at once.
    #[arg(long, value_name = "C", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,

    /// An extra request header, `Name: value` (repeatable). It replaces a header of the same
    /// name that hookd would set (content-type, the scheme's id and signature headers), so a
    /// tampered request can be sent too. Default content-type: application/json.
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<ExtraHeader>,

    /// hmac-sha256 only (required there): the header that carries the signature.
    #[arg(long, value_name = "NAME", required_if_eq("scheme", "hmac-sha256"))]
    signature_header: Option<String>,

    /// hmac-sha256 only: literal text before the signature, e.g. `sha256=` (default: none).
    #[arg(long, value_name = "PREFIX")]
    signature_prefix: Option<String>,

    /// hmac-sha256 only: how the signature is written (default: hex).
    #[arg(long, value_enum, value_name = "ENCODING")]
    signature_encoding: Option<EncodingName>,

    /// The payload, sent byte for byte; `-` reads standard input.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// The config's scheme names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SchemeName {
    /// webhook-id, webhook-timestamp, webhook-signature (Svix, Resend, ...).
    #[value(name = "standard-webhooks")]
    StandardWebhooks,
    /// Stripe-Signature: t=...,v1=... (the event id is in the body).
    Stripe,
    /// X-Hub-Signature-256 and X-GitHub-Delivery.
    Github,
    /// X-Shopify-Hmac-Sha256 and X-Shopify-Event-Id.
    Shopify,
    /// X-Slack-Signature and X-Slack-Request-Timestamp.
    Slack,
    /// An HMAC-SHA256 of the body in --signature-header.
    #[value(name = "hmac-sha256")]
    HmacSha256,
    /// No signature.
    None,
}

/// `--signature-encoding` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EncodingName {
    /// Hex digits.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

/// One `--header 'Name: value'`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExtraHeader {
    name: HeaderName,
    value: HeaderValue,
}

/// Parses `Name: value` (whitespace around the value is dropped; the value may be empty).
fn parse_header(text: &str) -> Result<ExtraHeader, String> {
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

impl SendArgs {
    /// The scheme, with the hmac-sha256 settings checked and refused for other schemes.
    fn scheme(&self) -> anyhow::Result<Scheme> {
        let hmac_only = [
            ("--signature-header", self.signature_header.is_some()),
            ("--signature-prefix", self.signature_prefix.is_some()),
            ("--signature-encoding", self.signature_encoding.is_some()),
        ];
        if self.scheme != SchemeName::HmacSha256
            && let Some((flag, _)) = hmac_only.iter().find(|(_, given)| *given)
        {
            bail!("{flag} only applies to --scheme hmac-sha256");
        }
        Ok(match self.scheme {
            SchemeName::StandardWebhooks => Scheme::StandardWebhooks,
            SchemeName::Stripe => Scheme::Stripe,
            SchemeName::Github => Scheme::Github,
            SchemeName::Shopify => Scheme::Shopify,
            SchemeName::Slack => Scheme::Slack,
            SchemeName::None => Scheme::None,
            SchemeName::HmacSha256 => {
                let header = self
                    .signature_header
                    .as_deref()
                    .context("--signature-header is required for --scheme hmac-sha256")?;
                let header = HeaderName::try_from(header).map_err(|_| {
                    anyhow::anyhow!("--signature-header {header:?} is not a valid header name")
                })?;
                Scheme::HmacSha256(HmacScheme {
                    header,
                    prefix: self.signature_prefix.clone().unwrap_or_default(),
                    encoding: match self.signature_encoding {
                        Some(EncodingName::Base64) => Encoding::Base64,
                        Some(EncodingName::Hex) | None => Encoding::Hex,
                    },
                })
            }
        })
    }
}

/// A random event id in the style of the scheme's provider.
fn random_event_id(scheme: &Scheme) -> String {
    let mut rng = rand::rng();
    match scheme {
        Scheme::Github | Scheme::Shopify => {
            let mut bytes: [u8; 16] = rand::random();
            bytes[6] = (bytes[6] & 0x0f) | 0x40; // version 4
            bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
            let hex = hex::encode(bytes);
            format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            )
        }
        Scheme::StandardWebhooks => format!("msg_{}", Alphanumeric.sample_string(&mut rng, 27)),
        _ => format!("evt_{}", Alphanumeric.sample_string(&mut rng, 24)),
    }
}

/// The request headers: content-type, then the signed headers, then the user's `--header`s,
/// each of which replaces every earlier value of its name (repeats of one name are all kept).
fn request_headers(signed: Vec<(HeaderName, HeaderValue)>, extra: &[ExtraHeader]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in signed {
        headers.insert(name, value);
    }
    for ExtraHeader { name, .. } in extra {
        headers.remove(name);
    }
    for ExtraHeader { name, value } in extra {
        headers.append(name.clone(), value.clone());
    }
    headers
}

/// Everything a request needs, shared by the concurrent senders.
struct Plan {
    client: HttpClient,
    uri: Uri,
    scheme: Scheme,
    secret: Secret,
    event_id: String,
    body: Bytes,
    extra: Vec<ExtraHeader>,
    repeat: u32,
}

/// How one request ended.
enum Outcome {
    Status(u16),
    Error,
}

/// `hookd send`.
pub async fn run(args: SendArgs) -> anyhow::Result<()> {
    let scheme = args.scheme()?;
    let uri = client::parse_url(&args.url).context("--url")?;
    let secret = match (&args.secret, &scheme) {
        (_, Scheme::None) => Secret::new(String::new()),
        (Some(secret), _) => Secret::new(secret.clone()),
        (None, scheme) => bail!(
            "--secret (or HOOKD_SEND_SECRET) is required for --scheme {}",
            scheme.name()
        ),
    };
    if args.event_id.is_some() && scheme.id_header().is_none() {
        eprintln!(
            "note: --event-id has no effect for --scheme {}: the event id is in the body",
            scheme.name()
        );
    }
    let event_id = args
        .event_id
        .clone()
        .unwrap_or_else(|| random_event_id(&scheme));
    let body = read_payload(&args.file).await?;
    // Refuse a bad secret or id once, up front, rather than once per request.
    verify::try_sign(&scheme, &secret, &event_id, &body, SystemTime::now())
        .with_context(|| format!("cannot sign for --scheme {}", scheme.name()))?;

    let id_note = match scheme.id_header() {
        Some(header) => format!("{header}: {event_id}"),
        None => "event id in the body".to_string(),
    };
    eprintln!(
        "sending {} × POST {} ({}, {id_note}, {} bytes)",
        args.repeat,
        uri,
        scheme.name(),
        body.len()
    );

    let plan = Arc::new(Plan {
        client: client::http_client(),
        uri,
        scheme,
        secret,
        event_id,
        body,
        extra: args.headers.clone(),
        repeat: args.repeat,
    });
    let interval = Duration::from_millis(args.interval_ms);
    let slots = Arc::new(Semaphore::new(args.concurrency as usize));
    let mut tasks = JoinSet::new();
    for index in 1..=args.repeat {
        // Take a slot first: with --concurrency 1 the interval then starts after the answer.
        let permit = slots.clone().acquire_owned().await?;
        if index > 1 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        let plan = plan.clone();
        tasks.spawn(async move {
            let outcome = send_one(&plan, index).await;
            drop(permit);
            outcome
        });
    }

    let (mut ok, mut client_err, mut server_err, mut other, mut errors) = (0, 0, 0, 0, 0);
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Outcome::Status(200..=299) => ok += 1,
            Outcome::Status(400..=499) => client_err += 1,
            Outcome::Status(500..=599) => server_err += 1,
            Outcome::Status(_) => other += 1,
            Outcome::Error => errors += 1,
        }
    }
    let other = if other > 0 {
        format!(" other={other}")
    } else {
        String::new()
    };
    println!(
        "sent {}: 2xx={ok} 4xx={client_err} 5xx={server_err} errors={errors}{other}",
        args.repeat
    );
    if errors > 0 {
        bail!("{errors} of {} requests got no HTTP response", args.repeat);
    }
    Ok(())
}

/// Signs (now) and sends copy `index`, printing its result line.
async fn send_one(plan: &Plan, index: u32) -> Outcome {
    let width = plan.repeat.to_string().len();
    let signed = match verify::try_sign(
        &plan.scheme,
        &plan.secret,
        &plan.event_id,
        &plan.body,
        SystemTime::now(),
    ) {
        Ok(signed) => signed,
        Err(e) => {
            println!("#{index:<width$} error cannot sign: {e}");
            return Outcome::Error;
        }
    };
    let headers = request_headers(signed, &plan.extra);
    let request = client::build_request(Method::POST, plan.uri.clone(), headers, plan.body.clone());
    let started = Instant::now();
    let result = client::send(&plan.client, request).await;
    let ms = started.elapsed().as_millis();
    match result {
        Ok(reply) => {
            let body = client::one_line(&reply.body, LINE_BODY_CHARS);
            println!("#{index:<width$} {} {ms}ms {body}", reply.status.as_u16());
            Outcome::Status(reply.status.as_u16())
        }
        Err(e) => {
            println!("#{index:<width$} error {ms}ms {e:#}");
            Outcome::Error
        }
    }
}

/// The payload bytes from FILE, or from standard input for `-`.
async fn read_payload(file: &Path) -> anyhow::Result<Bytes> {
    if file.as_os_str() == "-" {
        let mut body = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut body)
            .await
            .context("reading the payload from standard input")?;
        Ok(body.into())
    } else {
        let body = tokio::fs::read(file)
            .await
            .with_context(|| format!("reading the payload {}", file.display()))?;
        Ok(body.into())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Send {
        #[command(flatten)]
        args: SendArgs,
    }

    fn parse(extra: &[&str]) -> Result<SendArgs, clap::Error> {
        let mut argv = vec!["send", "--url", "http://127.0.0.1:8080/hooks/a"];
        argv.extend_from_slice(extra);
        argv.push("payload.json");
        Send::try_parse_from(argv).map(|cli| cli.args)
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

    #[test]
    fn header_flag_errors_name_the_value() {
        let err = parse(&["--scheme", "none", "--header", "nocolon"]).unwrap_err();
        assert!(err.to_string().contains("nocolon"), "{err}");
    }

    #[test]
    fn scheme_names_parse_and_errors_name_the_bad_value() {
        for name in [
            "standard-webhooks",
            "stripe",
            "github",
            "shopify",
            "slack",
            "none",
        ] {
            let args = parse(&["--scheme", name]).unwrap();
            assert_eq!(args.scheme().unwrap().name(), name);
        }
        let err = parse(&["--scheme", "strype"]).unwrap_err().to_string();
        assert!(err.contains("strype"), "{err}");
        assert!(
            err.contains("standard-webhooks"),
            "lists the valid names: {err}"
        );
    }

    #[test]
    fn hmac_settings_are_required_there_and_refused_elsewhere() {
        assert!(
            parse(&["--scheme", "hmac-sha256"]).is_err(),
            "header required"
        );
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

        let args = parse(&[
            "--scheme",
            "hmac-sha256",
            "--signature-header",
            "bad header",
        ])
        .unwrap();
        assert!(
            args.scheme()
                .unwrap_err()
                .to_string()
                .contains("bad header")
        );

        let args = parse(&["--scheme", "github", "--signature-prefix", "x"]).unwrap();
        let err = args.scheme().unwrap_err().to_string();
        assert!(err.contains("--signature-prefix"), "{err}");
    }

    #[test]
    fn repeat_and_concurrency_must_be_positive() {
        assert!(parse(&["--scheme", "none", "--repeat", "0"]).is_err());
        assert!(parse(&["--scheme", "none", "--concurrency", "0"]).is_err());
        let args = parse(&["--scheme", "none"]).unwrap();
        assert_eq!((args.repeat, args.concurrency, args.interval_ms), (1, 1, 0));
    }

    #[test]
    fn headers_default_content_type_and_let_the_user_override() {
        let sig = HeaderName::from_static("x-hub-signature-256");
        let signed = vec![(sig.clone(), HeaderValue::from_static("sha256=00"))];

        let plain = request_headers(signed.clone(), &[]);
        assert_eq!(plain[header::CONTENT_TYPE], "application/json");
        assert_eq!(plain[&sig], "sha256=00");

        let extra = [
            parse_header("Content-Type: text/plain").unwrap(),
            parse_header("X-Hub-Signature-256: sha256=11").unwrap(),
            parse_header("X-Hub-Signature-256: sha256=22").unwrap(),
            parse_header("X-Other: 1").unwrap(),
        ];
        let merged = request_headers(signed, &extra);
        assert_eq!(merged[header::CONTENT_TYPE], "text/plain");
        let sigs: Vec<_> = merged.get_all(&sig).iter().collect();
        assert_eq!(sigs, ["sha256=11", "sha256=22"]);
        assert_eq!(merged["x-other"], "1");
    }

    /// A one-test HTTP server that verifies like a github source and records what it saw.
    async fn github_receiver() -> (String, Arc<std::sync::Mutex<Vec<(String, bool)>>>) {
        use http_body_util::{BodyExt as _, Full};
        use hyper::{Request, Response, body::Incoming, service::service_fn};
        use hyper_util::rt::TokioIo;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/github", listener.local_addr().unwrap());
        let secrets = vec![Secret::new("s3cret".into())];
        let verifier =
            verify::Verifier::new(Scheme::Github, secrets, Duration::from_secs(300)).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (verifier, record) = (verifier.clone(), record.clone());
                let service = service_fn(move |req: Request<Incoming>| {
                    let (verifier, record) = (verifier.clone(), record.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let id = parts.headers["x-github-delivery"]
                            .to_str()
                            .unwrap()
                            .to_owned();
                        let ok = verifier
                            .verify(parts.headers, body, SystemTime::now())
                            .is_ok();
                        record.lock().unwrap().push((id, ok));
                        let status = if ok { 202 } else { 401 };
                        let reply = Full::new(Bytes::from_static(b"{\"accepted\":true}"));
                        Ok::<_, hyper::Error>(
                            Response::builder().status(status).body(reply).unwrap(),
                        )
                    }
                });
                tokio::spawn(async move {
                    let io = TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn repeated_sends_carry_one_id_and_verify_as_the_provider_would() {
        let (url, seen) = github_receiver().await;
        let payload = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(payload.path(), br#"{"action":"opened"}"#).unwrap();
        let path = payload.path().to_str().unwrap();
        let base = ["send", "--url", &url, "--scheme", "github", "--repeat", "3"];

        let mut argv = base.to_vec();
        argv.extend([
            "--secret",
            "s3cret",
            "--concurrency",
            "2",
            "--event-id",
            "d-1",
            path,
        ]);
        run(Send::try_parse_from(argv).unwrap().args).await.unwrap();
        let good: Vec<_> = seen.lock().unwrap().drain(..).collect();
        assert_eq!(good, vec![("d-1".to_string(), true); 3]);

        // A wrong secret is answered 401: a result, not a failure of `send`.
        let mut argv = base.to_vec();
        argv.extend(["--secret", "wrong", "--interval-ms", "1", path]);
        run(Send::try_parse_from(argv).unwrap().args).await.unwrap();
        let bad: Vec<_> = seen.lock().unwrap().drain(..).collect();
        assert_eq!(bad.len(), 3);
        assert!(bad.iter().all(|(id, ok)| *id == bad[0].0 && !ok), "{bad:?}");
    }

    #[test]
    fn random_ids_look_like_the_providers() {
        let msg = random_event_id(&Scheme::StandardWebhooks);
        assert!(msg.starts_with("msg_") && msg.len() == 31, "{msg}");
        let evt = random_event_id(&Scheme::Stripe);
        assert!(evt.starts_with("evt_") && evt.len() == 28, "{evt}");
        let uuid = random_event_id(&Scheme::Github);
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(uuid.as_bytes()[14], b'4', "{uuid}");
        assert_ne!(random_event_id(&Scheme::Github), uuid);
        // Every generated id can be signed (it is a valid header value).
        for scheme in [Scheme::StandardWebhooks, Scheme::Github, Scheme::Shopify] {
            let id = random_event_id(&scheme);
            let secret = Secret::new("whsec_c2VjcmV0".into());
            verify::try_sign(&scheme, &secret, &id, b"{}", SystemTime::now()).unwrap();
        }
    }
}
