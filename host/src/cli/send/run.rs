//! Running `hookd send`: the [`Plan`] shared by the concurrent senders, the request each one
//! builds, and the result lines.
//!
//! Invariant: each request is signed when it is sent (fresh timestamps), and a request that got
//! an HTTP answer, whatever its status, is a result; only no answer at all is a failure.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};
use tokio::{io::AsyncReadExt as _, sync::Semaphore, task::JoinSet};

use super::args::{ExtraHeader, SendArgs, Target};
use super::ids::random_event_id;
use crate::cli::client::{self, HttpClient};
use crate::verify::{self, Scheme, Secret};

/// How much of each response body a result line shows.
const LINE_BODY_CHARS: usize = 1_000;

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

/// The event id a `--header` sets in the scheme's id header (the last, if repeated): the one the
/// request carries, so it is the one signed and announced. One that is not visible ASCII is
/// refused here, as hookd would refuse it (it was sent while another id was signed and shown).
fn id_from_headers(scheme: &Scheme, extra: &[ExtraHeader]) -> anyhow::Result<Option<String>> {
    let Some(name) = scheme.id_header() else {
        return Ok(None);
    };
    let Some(header) = extra.iter().rev().find(|e| e.name == *name) else {
        return Ok(None);
    };
    match header.value.to_str() {
        Ok(id) => Ok(Some(id.to_owned())),
        Err(_) => bail!(
            "--header {name}: an event id must be visible ASCII (hookd refuses any other); \
             give one, or leave the header out for a random id"
        ),
    }
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

impl Plan {
    /// Checks the flags, reads the payload, and signs once up front, so a bad secret or id is
    /// refused once rather than once per request.
    async fn new(args: &SendArgs) -> anyhow::Result<Self> {
        let Target {
            url,
            scheme,
            secret,
        } = args.target()?;
        let uri = client::parse_url(&url).context("--url")?;
        let secret = match (secret, &scheme) {
            (_, scheme) if !scheme.kind().signs() => Secret::new(String::new()),
            (Some(secret), _) => Secret::new(secret),
            (None, scheme) if args.config.is_some() => bail!(
                "--secret (or HOOKD_SEND_SECRET) is required: the config holds no secret to sign \
                 {} requests with (a discord source keeps only the public key)",
                scheme.name()
            ),
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
        let event_id = match (
            args.event_id.clone(),
            id_from_headers(&scheme, &args.headers)?,
        ) {
            (Some(flag), Some(header)) if flag != header => bail!(
                "--event-id {flag:?} and --header {}: {header:?} name two event ids; give one",
                scheme.id_header().unwrap_or_default()
            ),
            (Some(id), _) | (None, Some(id)) => id,
            (None, None) => random_event_id(&scheme),
        };
        let body = read_payload(&args.file).await?;
        verify::sign(&scheme, &secret, &event_id, &body, SystemTime::now())
            .with_context(|| format!("cannot sign for --scheme {}", scheme.name()))?;
        Ok(Self {
            client: client::http_client(),
            uri,
            scheme,
            secret,
            event_id,
            body,
            extra: args.headers.clone(),
            repeat: args.repeat,
        })
    }

    /// The line announcing what is about to be sent.
    fn announcement(&self) -> String {
        let id_note = match self.scheme.id_header() {
            Some(header) => format!("{header}: {}", self.event_id),
            None => "event id in the body".to_string(),
        };
        format!(
            "sending {} × POST {} ({}, {id_note}, {} bytes)",
            self.repeat,
            self.uri,
            self.scheme.name(),
            self.body.len()
        )
    }
}

/// How one request ended.
enum Outcome {
    Status(u16),
    Error,
}

/// Requests counted by how they ended, for the summary line.
#[derive(Default)]
struct Tally {
    ok: u32,
    client_err: u32,
    server_err: u32,
    other: u32,
    errors: u32,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Status(200..=299) => self.ok += 1,
            Outcome::Status(400..=499) => self.client_err += 1,
            Outcome::Status(500..=599) => self.server_err += 1,
            Outcome::Status(_) => self.other += 1,
            Outcome::Error => self.errors += 1,
        }
    }

    /// `sent N: 2xx=a 4xx=b 5xx=c errors=d`, plus ` other=e` only when some status was outside
    /// those classes.
    fn summary(&self, sent: u32) -> String {
        let other = if self.other > 0 {
            format!(" other={}", self.other)
        } else {
            String::new()
        };
        format!(
            "sent {sent}: 2xx={} 4xx={} 5xx={} errors={}{other}",
            self.ok, self.client_err, self.server_err, self.errors
        )
    }
}

/// `hookd send`.
pub async fn run(args: SendArgs) -> anyhow::Result<()> {
    let plan = Arc::new(Plan::new(&args).await?);
    eprintln!("{}", plan.announcement());
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

    let mut tally = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        tally.add(joined?);
    }
    say!("{}", tally.summary(args.repeat));
    if tally.errors > 0 {
        bail!(
            "{} of {} requests got no HTTP response",
            tally.errors,
            args.repeat
        );
    }
    Ok(())
}

/// Signs (now) and sends copy `index`, printing its result line.
async fn send_one(plan: &Plan, index: u32) -> Outcome {
    let width = plan.repeat.to_string().len();
    let signed = match verify::sign(
        &plan.scheme,
        &plan.secret,
        &plan.event_id,
        &plan.body,
        SystemTime::now(),
    ) {
        Ok(signed) => signed,
        Err(e) => {
            say!("#{index:<width$} error cannot sign: {e}");
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
            say!("#{index:<width$} {} {ms}ms {body}", reply.status.as_u16());
            Outcome::Status(reply.status.as_u16())
        }
        Err(e) => {
            say!("#{index:<width$} error {ms}ms {e:#}");
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
    use super::super::{args::parse_header, parse_argv};
    use super::*;

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

    /// The id header names the id that is signed and announced; one hookd would refuse (not
    /// visible ASCII) is refused here, naming the header (before, a random id was signed and
    /// announced while the header went out).
    #[test]
    fn an_id_header_names_the_id_or_is_refused() {
        let ascii = [parse_header("X-GitHub-Delivery: d-2").unwrap()];
        let id = id_from_headers(&Scheme::Github, &ascii).unwrap();
        assert_eq!(id.as_deref(), Some("d-2"));
        let other = [parse_header("X-GitHub-Delivery: café").unwrap()];
        let refused = id_from_headers(&Scheme::Github, &other)
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("--header x-github-delivery: an event id must be visible ASCII"),
            "{refused}"
        );
        let none = id_from_headers(&Scheme::Github, &[parse_header("X-Other: é").unwrap()]);
        assert_eq!(none.unwrap(), None);
    }

    /// What a test receiver saw: each request's `X-GitHub-Delivery` (empty without one) and
    /// whether it verified.
    type Seen = Arc<std::sync::Mutex<Vec<(String, bool)>>>;

    /// A one-test HTTP server that verifies like a github source and records what it saw.
    async fn github_receiver() -> (String, Seen) {
        let secrets = vec![Secret::new("s3cret".into())];
        let verifier =
            verify::Verifier::new(Scheme::Github, secrets, Duration::from_secs(300)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/github", listener.local_addr().unwrap());
        (url, receive(listener, verifier))
    }

    /// Serves `listener`, verifying every request with `verifier`.
    fn receive(listener: tokio::net::TcpListener, verifier: verify::Verifier) -> Seen {
        use http_body_util::{BodyExt as _, Full};
        use hyper::{Request, Response, body::Incoming, service::service_fn};
        use hyper_util::rt::TokioIo;

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
                        let id = parts
                            .headers
                            .get("x-github-delivery")
                            .map(|id| id.to_str().unwrap().to_owned())
                            .unwrap_or_default();
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
        seen
    }

    /// `--config` and `--source` take the URL, the scheme with its header, prefix and
    /// encoding, and the secret from the config: what the source configured there verifies.
    #[tokio::test]
    async fn a_source_of_the_config_is_signed_as_the_config_says() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\nlisten = \"{addr}\"\n\
             [sources.acme]\nscheme = \"hmac-sha256\"\nsecrets = [\"acme-secret\"]\n\
             signature_header = \"x-acme-signature\"\nsignature_prefix = \"v1=\"\n\
             signature_encoding = \"base64\"\n\
             [sources.other]\nscheme = \"none\"\n"
        );
        let config_path = dir.path().join("hookd.toml");
        std::fs::write(&config_path, &text).unwrap();
        let config = crate::config::Config::parse(&text, dir.path(), &|_| None).unwrap();
        let verifier = config.sources["acme"].verifier.clone();
        let seen = receive(listener, verifier);
        let payload = dir.path().join("event.json");
        std::fs::write(&payload, br#"{"id":"evt_1"}"#).unwrap();
        let (config_arg, payload_arg) = (config_path.to_str().unwrap(), payload.to_str().unwrap());

        let argv = vec![
            "send",
            "--config",
            config_arg,
            "--source",
            "acme",
            payload_arg,
        ];
        run(parse_argv(argv).unwrap()).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [(String::new(), true)]);

        // An explicit --secret still wins (here: a wrong one, refused by the receiver).
        let argv = vec![
            "send",
            "--config",
            config_arg,
            "--source",
            "acme",
            "--secret",
            "wrong",
            payload_arg,
        ];
        run(parse_argv(argv).unwrap()).await.unwrap();
        assert_eq!(seen.lock().unwrap()[1], (String::new(), false));

        let argv = vec![
            "send",
            "--config",
            config_arg,
            "--source",
            "nope",
            payload_arg,
        ];
        let err = run(parse_argv(argv).unwrap()).await.unwrap_err();
        assert!(
            format!("{err:#}").contains("has no [sources.nope] (its sources: acme, other)"),
            "{err:#}"
        );
        // The scheme comes from the config, never from a flag beside it.
        let argv = vec![
            "send", "--config", config_arg, "--source", "acme", "--scheme", "github",
        ];
        assert!(parse_argv(argv).is_err());
    }

    /// An id set with `--header` in the scheme's id header is the request's event id: it is
    /// signed (standard-webhooks signs it) and announced, not a random one the header then
    /// replaced. Naming two different ids is refused.
    #[tokio::test]
    async fn an_id_header_given_with_header_is_the_event_id() {
        let payload = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(payload.path(), br#"{"type":"t"}"#).unwrap();
        let file = payload.path().to_str().unwrap();
        let argv = |extra: &[&'static str]| {
            let mut argv = vec![
                "send",
                "--url",
                "http://127.0.0.1:9/hooks/x",
                "--scheme",
                "standard-webhooks",
                "--secret",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "--header",
                "Webhook-Id: msg_mine",
            ];
            argv.extend_from_slice(extra);
            argv.push(file);
            argv
        };
        let args = parse_argv(argv(&[])).unwrap();
        let plan = Plan::new(&args).await.unwrap();
        assert_eq!(plan.event_id, "msg_mine");
        assert!(
            plan.announcement().contains("webhook-id: msg_mine"),
            "{}",
            plan.announcement()
        );
        let args = parse_argv(argv(&["--event-id", "msg_other"])).unwrap();
        let err = Plan::new(&args).await.err().expect("two ids refused");
        assert!(format!("{err:#}").contains("name two event ids"), "{err:#}");
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
        run(parse_argv(argv).unwrap()).await.unwrap();
        let good: Vec<_> = seen.lock().unwrap().drain(..).collect();
        assert_eq!(good, vec![("d-1".to_string(), true); 3]);

        // A wrong secret is answered 401: a result, not a failure of `send`.
        let mut argv = base.to_vec();
        argv.extend(["--secret", "wrong", "--interval-ms", "1", path]);
        run(parse_argv(argv).unwrap()).await.unwrap();
        let bad: Vec<_> = seen.lock().unwrap().drain(..).collect();
        assert_eq!(bad.len(), 3);
        assert!(bad.iter().all(|(id, ok)| *id == bad[0].0 && !ok), "{bad:?}");
    }

    #[test]
    fn the_summary_names_other_statuses_only_when_there_are_some() {
        let mut tally = Tally::default();
        for outcome in [Outcome::Status(202), Outcome::Status(401), Outcome::Error] {
            tally.add(outcome);
        }
        assert_eq!(tally.summary(3), "sent 3: 2xx=1 4xx=1 5xx=0 errors=1");
        tally.add(Outcome::Status(304));
        assert_eq!(
            tally.summary(4),
            "sent 4: 2xx=1 4xx=1 5xx=0 errors=1 other=1"
        );
    }
}
