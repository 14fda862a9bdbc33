//! `hookd events | replay | discard | plugins | state`: thin clients of the admin API (a
//! contract: README "HTTP API"), plus the small plain-HTTP helper that `hookd send` shares.
//!
//! Invariants: requests and answers are the server's own wire types ([`crate::admin::api`]), so
//! an answer of the wrong shape is an error, not printed; every request carries a deadline ([`TIMEOUT`], connect to last body byte) and reads
//! at most [`MAX_RESPONSE_BYTES`] of the response; every error names the method and URL; the
//! admin token is only ever put in the `Authorization` header (marked sensitive), never printed.
//! Only plain `http://` is spoken: https is out of scope (put a TLS proxy in front, or use the
//! loopback address).

use std::{fmt::Write as _, time::Duration};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum, builder::PossibleValuesParser};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::{Serialize, de::DeserializeOwned};

use super::AdminArgs;
use crate::{admin::api, config::ClientAdmin, model::DeliveryState};

/// How long one request may take, from connecting to reading the last body byte.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

/// The most response-body bytes any command reads.
pub(crate) const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// How much of a response body an error message quotes.
const ERROR_BODY_CHARS: usize = 2_000;

/// Delivery states, as the admin API names them.
fn state_names() -> impl Iterator<Item = &'static str> {
    DeliveryState::ALL.into_iter().map(DeliveryState::as_str)
}

/// The states a replay may take: the finished ones, and `retrying` (run now); `pending` is
/// due already and `running` is being worked on.
fn replay_state_names() -> impl Iterator<Item = &'static str> {
    DeliveryState::ALL
        .into_iter()
        .filter(|state| !matches!(state, DeliveryState::Pending | DeliveryState::Running))
        .map(DeliveryState::as_str)
}

/// The states a discard may name: `dead`, and the waiting ones (`pending`, `retrying`), which
/// the server takes only for a handler the configuration no longer declares.
fn discard_state_names() -> impl Iterator<Item = &'static str> {
    [
        DeliveryState::Dead,
        DeliveryState::Pending,
        DeliveryState::Retrying,
    ]
    .into_iter()
    .map(DeliveryState::as_str)
}

// ---------------------------------------------------------------------------------------------
// The shared HTTP helper.

/// A plain-http client (no TLS): connections are pooled, so `--repeat` reuses them.
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new plain-http client.
pub(crate) fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Parses `url`, which must be an absolute `http://host[:port]/...` URL.
pub(crate) fn parse_url(url: &str) -> anyhow::Result<Uri> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("{url:?} is not a valid URL"))?;
    match uri.scheme_str() {
        Some("http") if uri.authority().is_some() => Ok(uri),
        Some("https") => bail!(
            "{url}: https is not supported, hookd's client speaks plain http only \
             (use http:// to a loopback or TLS-terminating address)"
        ),
        _ => bail!("{url:?} is not an absolute http:// URL (e.g. http://127.0.0.1:8080/...)"),
    }
}

/// A request with exactly these headers and body (hyper adds `Host` and `Content-Length`).
pub(crate) fn build_request(
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    request
}

/// What came back: the status and the body as text (invalid UTF-8 is replaced, not refused).
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

/// Sends `request` and reads the whole body, within [`TIMEOUT`] and [`MAX_RESPONSE_BYTES`].
/// Any failure (connect, timeout, oversized body) is an error naming the method and URL.
pub(crate) async fn send(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<Reply> {
    let what = format!("{} {}", request.method(), request.uri());
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the response body: {e}"))?
            .to_bytes();
        anyhow::Ok(Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(reply) => reply.with_context(|| what),
        Err(_) => bail!(
            "{what}: no complete response within {} s",
            TIMEOUT.as_secs()
        ),
    }
}

/// `text` on one line (line breaks become spaces), at most `max` characters (then `…`).
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let text = text.trim();
    let mut out: String = text
        .chars()
        .take(max)
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`), so
/// the result is safe as one path segment or one query value.
pub(crate) fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// `?k=v&...` for the pairs that have a value (both sides percent-encoded); empty if none do.
pub(crate) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut out = String::new();
    for (key, value) in pairs {
        if let Some(value) = value {
            out.push(if out.is_empty() { '?' } else { '&' });
            out.push_str(&percent_encode(key));
            out.push('=');
            out.push_str(&percent_encode(value));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The admin commands.

/// `hookd events`: list events, or show one.
#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// Show one event (with EVENT_ID): its source. Omit both to list events.
    #[arg(
        value_name = "SOURCE",
        requires = "event_id",
        conflicts_with_all = [
            "source", "state", "handler", "limit", "event_type", "only_event_id", "since",
            "until", "before",
        ]
    )]
    show_source: Option<String>,
    /// Show one event: the provider's event id, with its deliveries and attempt history.
    #[arg(value_name = "EVENT_ID")]
    event_id: Option<String>,
    /// List only events from this source.
    #[arg(long)]
    source: Option<String>,
    /// List only events with a delivery in this state.
    #[arg(long, value_parser = PossibleValuesParser::new(state_names()))]
    state: Option<String>,
    /// List only events with a delivery to this handler.
    #[arg(long)]
    handler: Option<String>,
    /// List at most N events (the server defaults to 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=crate::admin::MAX_EVENTS as i64))]
    limit: Option<u32>,
    /// List only events of this type.
    #[arg(long, value_name = "TYPE")]
    event_type: Option<String>,
    /// List only events with this provider event id (from any source).
    #[arg(long = "event-id", value_name = "ID")]
    only_event_id: Option<String>,
    /// List only events received at or after this time, in ms since the Unix epoch.
    #[arg(long, value_name = "MS")]
    since: Option<i64>,
    /// List only events received at or before this time, in ms since the Unix epoch.
    #[arg(long, value_name = "MS")]
    until: Option<i64>,
    /// The next page: the cursor a full page printed (`more events: … --before N`).
    #[arg(long, value_name = "CURSOR")]
    before: Option<i64>,
}

/// `hookd replay`: which deliveries to run again.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    filter: ReplayFilter,
    /// Which deliveries (the server defaults to dead): finished ones run again with a fresh
    /// attempt budget; `retrying` ones run now instead of after their backoff, with the budget
    /// they have.
    #[arg(long, value_parser = PossibleValuesParser::new(replay_state_names()))]
    state: Option<String>,
    /// Deliver each replayed delivery even if a newer sequence of its ordering key is done by
    /// then: the handler gets it with `event.stale` set, instead of it being marked `stale`.
    #[arg(long)]
    force: bool,
}

/// `hookd discard`: which dead deliveries (and held quarantined requests) to close for good.
#[derive(Debug, Args)]
pub struct DiscardArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    filter: ReplayFilter,
    /// Which deliveries (the server defaults to dead): dead ones, or the `pending` or
    /// `retrying` ones of a `--handler` the configuration no longer declares (nothing will run
    /// them).
    #[arg(long, value_parser = PossibleValuesParser::new(discard_state_names()))]
    state: Option<String>,
}

/// The replay (or discard) selection, sent as the `POST /admin/replay` (`/admin/discard`) body
/// ([`api::ReplayRequest`]). With no `--handler`, `--state`, `--event-id` or `--error-kind`, held quarantined
/// requests matching the source and time range are re-parsed (discarded) too. At most 10 000
/// per call.
#[derive(Debug, Clone, Default, Args)]
struct ReplayFilter {
    /// Only this source.
    #[arg(long)]
    source: Option<String>,
    /// Only deliveries to this handler.
    #[arg(long)]
    handler: Option<String>,
    /// Only this event id (repeat the flag for several).
    #[arg(long = "event-id", value_name = "ID")]
    event_ids: Vec<String>,
    /// Only events received at or after this time, in ms since the Unix epoch.
    #[arg(long, value_name = "MS")]
    since: Option<i64>,
    /// Only events received at or before this time, in ms since the Unix epoch.
    #[arg(long, value_name = "MS")]
    until: Option<i64>,
    /// Only deliveries whose last attempt failed with this error kind (`trap`, `timeout`,
    /// `permanent`, `state_limit`, …).
    #[arg(long, value_name = "KIND")]
    error_kind: Option<String>,
    /// Only count what would be replayed or discarded (`matched`); change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl From<ReplayFilter> for api::ReplayRequest {
    fn from(f: ReplayFilter) -> Self {
        Self {
            source: f.source,
            handler: f.handler,
            state: None,
            // No flag means no event-id filter (an empty list would match nothing).
            event_ids: (!f.event_ids.is_empty()).then_some(f.event_ids),
            since: f.since,
            until: f.until,
            error_kind: f.error_kind,
            dry_run: f.dry_run,
            force: false,
        }
    }
}

/// `hookd plugins`: list the plugins, or roll one back.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// What to do with NAME. Omit it to list the plugins (name, wasm file, sha256, exports,
    /// load error, previous versions).
    #[arg(value_enum, value_name = "ACTION", requires = "name")]
    action: Option<PluginAction>,
    /// The plugin instance to roll back (its `[plugins.<name>]` name).
    #[arg(value_name = "NAME", requires = "action")]
    name: Option<String>,
}

/// What `hookd plugins` can do besides listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PluginAction {
    /// Make the previous version of NAME live again.
    Rollback,
}

/// `hookd events`: `GET /admin/events?...` or `GET /admin/events/{source}/{event_id}`.
pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    match (&args.show_source, &args.event_id) {
        (Some(source), Some(event_id)) => {
            let path = format!(
                "/admin/events/{}/{}",
                percent_encode(source),
                percent_encode(event_id)
            );
            admin_call::<api::EventDetail>(&args.admin, Method::GET, &path, NO_BODY).await
        }
        _ => {
            let filter = api::EventsQuery {
                source: args.source,
                state: args.state,
                handler: args.handler,
                limit: args.limit.map(|n| n as usize),
                event_type: args.event_type,
                event_id: args.only_event_id,
                since: args.since,
                until: args.until,
                before: args.before,
            };
            let path = format!("/admin/events{}", query(&filter.pairs()));
            let (events, headers): (Vec<api::EventSummary>, _) =
                admin_exchange(&args.admin, Method::GET, &path, HeaderMap::new(), NO_BODY).await?;
            say!("{}", pretty(&events)?);
            if let Some(before) = next_cursor(&headers) {
                eprintln!("more events: run it again with --before {before} for the next page");
            }
            Ok(())
        }
    }
}

/// `hookd replay`: `POST /admin/replay` with the filter as JSON.
pub async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let body = replay_request(args.filter, args.state, args.force);
    admin_call::<api::ReplayAnswer>(&args.admin, Method::POST, "/admin/replay", Some(&body)).await
}

/// The `POST /admin/replay` body: the filter, and whether to deliver stale deliveries anyway.
fn replay_request(filter: ReplayFilter, state: Option<String>, force: bool) -> api::ReplayRequest {
    api::ReplayRequest {
        state,
        force,
        ..filter.into()
    }
}

/// `hookd discard`: `POST /admin/discard` with the filter as JSON.
pub async fn discard(args: DiscardArgs) -> anyhow::Result<()> {
    let body = api::ReplayRequest {
        state: args.state,
        ..args.filter.into()
    };
    admin_call::<api::DiscardAnswer>(&args.admin, Method::POST, "/admin/discard", Some(&body)).await
}

/// `hookd plugins`: `GET /admin/plugins` or `POST /admin/plugins/{name}/rollback`.
pub async fn plugins(args: PluginsArgs) -> anyhow::Result<()> {
    match (args.action, &args.name) {
        (Some(PluginAction::Rollback), Some(name)) => {
            let path = format!("/admin/plugins/{}/rollback", percent_encode(name));
            admin_call::<api::RollbackAnswer>(&args.admin, Method::POST, &path, NO_BODY).await
        }
        _ => {
            admin_call::<Vec<api::PluginInfo>>(&args.admin, Method::GET, "/admin/plugins", NO_BODY)
                .await
        }
    }
}

/// `hookd state`: a plugin instance's durable state (`/admin/plugins/{name}/state`).
#[derive(Debug, Args)]
pub struct StateArgs {
    /// Taken before the subcommand or after it (`hookd state --config X get ...` and `hookd
    /// state get --config X ...` alike), as every other admin command takes them anywhere.
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: StateCommand,
}

/// What `hookd state` does.
#[derive(Debug, Subcommand)]
enum StateCommand {
    /// List the keys of PLUGIN (size, version, when written), a page at a time: the answer's
    /// `next_after` is the next page's --after.
    List {
        /// The plugin instance (its `[plugins.<name>]` name).
        plugin: String,
        /// Only keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// The page after this key.
        #[arg(long, value_name = "KEY")]
        after: Option<String>,
        /// At most N keys (the server defaults to 100).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=crate::admin::MAX_KEYS as i64))]
        limit: Option<u32>,
    },
    /// Show KEY's value (as JSON when it is JSON, else base64) and its version.
    Get { plugin: String, key: String },
    /// Store VALUE (or the bytes of --file) under KEY, exactly as given. With --if-match only if
    /// KEY is still at that version (what `hookd state get` shows); without it only if KEY is
    /// absent.
    Set {
        plugin: String,
        key: String,
        /// The value (JSON text, or any text).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file (any bytes).
        #[arg(long, value_name = "F")]
        file: Option<std::path::PathBuf>,
        /// The version the value replaces.
        #[arg(long, value_name = "V")]
        if_match: Option<i64>,
    },
    /// Delete KEY, only if it is still at version --if-match.
    Delete {
        plugin: String,
        key: String,
        /// The version deleted (what `hookd state get` shows).
        #[arg(long, value_name = "V")]
        if_match: i64,
    },
}

/// The admin path of `plugin`'s state, or of its `key`.
fn state_path(plugin: &str, key: Option<&str>) -> String {
    let mut path = format!("/admin/plugins/{}/state", percent_encode(plugin));
    if let Some(key) = key {
        path.push('/');
        path.push_str(&percent_encode(key));
    }
    path
}

/// `If-Match: "<version>"`.
fn if_match(version: i64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("\"{version}\"")).expect("digits");
    headers.insert(header::IF_MATCH, value);
    headers
}

/// `hookd state`: `GET /admin/plugins/{name}/state[?...]`, `GET`, `PUT` or `DELETE
/// /admin/plugins/{name}/state/{key}`.
pub async fn state(args: StateArgs) -> anyhow::Result<()> {
    let admin = args.admin;
    match args.command {
        StateCommand::List {
            plugin,
            prefix,
            after,
            limit,
        } => {
            let filter = api::StateKeysQuery {
                prefix,
                after,
                limit: limit.map(|n| n as usize),
            };
            let path = format!("{}{}", state_path(&plugin, None), query(&filter.pairs()));
            admin_call::<api::StateKeys>(&admin, Method::GET, &path, NO_BODY).await
        }
        StateCommand::Get { plugin, key } => {
            let path = state_path(&plugin, Some(&key));
            let value: api::StateValue =
                admin_request(&admin, Method::GET, &path, HeaderMap::new(), NO_BODY).await?;
            // Printed as sent: the value's JSON byte for byte.
            say!("{}", serde_json::to_string_pretty(&value)?);
            Ok(())
        }
        StateCommand::Set {
            plugin,
            key,
            value,
            file,
            if_match: version,
        } => {
            let bytes = match (value, file) {
                (Some(value), _) => value.into_bytes(),
                (None, Some(file)) => std::fs::read(&file)
                    .with_context(|| format!("reading the value from {}", file.display()))?,
                (None, None) => bail!("give the value, or --file"),
            };
            // Refused here, naming the cap: sent, it is refused from its length before the
            // server reads it, and a large one ends in a broken pipe that says nothing of why.
            let cap = crate::model::MAX_STATE_VALUE_BYTES;
            if bytes.len() > cap {
                bail!(
                    "a value of {} bytes is over the {cap}-byte cap on a state value; nothing \
                     was sent",
                    bytes.len()
                );
            }
            let headers = match version {
                Some(version) => if_match(version),
                None => {
                    let mut headers = HeaderMap::new();
                    headers.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
                    headers
                }
            };
            let path = state_path(&plugin, Some(&key));
            let body = api::StatePut::of(&bytes);
            let answer: api::StateWritten =
                admin_request(&admin, Method::PUT, &path, headers, Some(&body)).await?;
            say!("{}", pretty(&answer)?);
            Ok(())
        }
        StateCommand::Delete {
            plugin,
            key,
            if_match: version,
        } => {
            let path = state_path(&plugin, Some(&key));
            let answer: api::StateWritten =
                admin_request(&admin, Method::DELETE, &path, if_match(version), NO_BODY).await?;
            say!("{}", pretty(&answer)?);
            Ok(())
        }
    }
}

/// No request body (a `POST` without one is an empty filter or needs none).
const NO_BODY: Option<&()> = None;

/// One admin API call: reads the answer as `T` and prints it pretty-printed on success (see
/// [`admin_request`]).
async fn admin_call<T: DeserializeOwned + Serialize>(
    admin: &AdminArgs,
    method: Method,
    path: &str,
    json: Option<&impl Serialize>,
) -> anyhow::Result<()> {
    let answer: T = admin_request(admin, method, path, HeaderMap::new(), json).await?;
    say!("{}", pretty(&answer)?);
    Ok(())
}

/// One admin API call with `headers` (beside the token and content type), its answer read as
/// `T`; a non-2xx status, or an answer that is not a `T`, is an error that carries the status
/// and (the start of) the body.
async fn admin_request<T: DeserializeOwned>(
    admin: &AdminArgs,
    method: Method,
    path: &str,
    headers: HeaderMap,
    json: Option<&impl Serialize>,
) -> anyhow::Result<T> {
    Ok(admin_exchange(admin, method, path, headers, json).await?.0)
}

/// [`admin_request`], also returning the answer's headers.
async fn admin_exchange<T: DeserializeOwned>(
    admin: &AdminArgs,
    method: Method,
    path: &str,
    mut headers: HeaderMap,
    json: Option<&impl Serialize>,
) -> anyhow::Result<(T, HeaderMap)> {
    let base = admin_base(admin)?;
    let base = base.trim_end_matches('/');
    parse_url(base).context("--admin-url (or HOOKD_ADMIN_URL)")?;
    let url = format!("{base}{path}");
    let uri = parse_url(&url)?;

    let (token, from) = admin_token(admin)?;
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    if let Some(token) = &token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            anyhow::anyhow!("the admin token cannot be sent in a header (control characters?)")
        })?;
        value.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, value);
    }
    let body = match json {
        Some(json) => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Bytes::from(serde_json::to_vec(json)?)
        }
        None => Bytes::new(),
    };

    let method_name = method.clone();
    let sent = send(&http_client(), build_request(method, uri, headers, body)).await;
    let reply = sent.with_context(|| {
        address_from(
            admin.admin_url.is_some(),
            config_file(admin),
            token.is_some(),
        )
    })?;
    if !reply.status.is_success() {
        let hint = if reply.status == StatusCode::UNAUTHORIZED {
            format!(" ({from})")
        } else {
            String::new()
        };
        bail!(
            "{method_name} {url} answered {}{hint}: {}",
            reply.status,
            one_line(&reply.body, ERROR_BODY_CHARS)
        );
    }
    let answer: T = serde_json::from_str(&reply.body).with_context(|| {
        format!(
            "{method_name} {url} answered {} with an unexpected body: {}",
            reply.status,
            one_line(&reply.body, ERROR_BODY_CHARS)
        )
    })?;
    Ok((answer, reply.headers))
}

/// The `before` cursor of an events page's `Link: <...>; rel="next"`, if it has one.
fn next_cursor(headers: &HeaderMap) -> Option<i64> {
    let link = headers.get(header::LINK)?.to_str().ok()?;
    let target = link.strip_suffix("; rel=\"next\"")?;
    target
        .trim_start_matches('<')
        .trim_end_matches('>')
        .split_once('?')?
        .1
        .split('&')
        .find_map(|pair| pair.strip_prefix("before="))?
        .parse()
        .ok()
}

/// Where the admin address a call could not reach came from (given `--admin-url`, else the
/// config file read, else neither), for its error.
fn address_from(url_given: bool, config: Option<&std::path::Path>, token: bool) -> String {
    match (url_given, config) {
        (true, _) => "--admin-url (or HOOKD_ADMIN_URL)".to_owned(),
        (false, Some(config)) => format!("the admin address of {}", config.display()),
        (false, None) => format!(
            "no --admin-url (HOOKD_ADMIN_URL), no --config (HOOKD_CONFIG) and no hookd.toml in \
             this directory: the default admin address was tried{}",
            if token { "" } else { ", without a token" }
        ),
    }
}

/// The config file the admin commands read: `--config`/`HOOKD_CONFIG`, else `./hookd.toml` if
/// there is one.
fn config_file(admin: &AdminArgs) -> Option<&std::path::Path> {
    let default = std::path::Path::new("hookd.toml");
    match &admin.config {
        Some(path) => Some(path.as_path()),
        None if default.is_file() => Some(default),
        None => None,
    }
}

/// The admin API's base URL: `--admin-url`/`HOOKD_ADMIN_URL`, else the config file's
/// `server.admin_listen`, else the default listen address.
fn admin_base(admin: &AdminArgs) -> anyhow::Result<String> {
    if let Some(url) = &admin.admin_url {
        check_admin_url(url)?;
        return Ok(url.clone());
    }
    match config_file(admin) {
        Some(config) => Ok(ClientAdmin::load(config)
            .context("--config (or HOOKD_CONFIG)")?
            .url),
        None => Ok(ClientAdmin::default_url()),
    }
}

/// Refuses an `--admin-url` whose parts would not be used as given: user info (no password is
/// sent from there, the token goes in `--token`; and errors would print the URL), a query or a
/// fragment (the API's paths are appended to the URL). Its text is not echoed.
fn check_admin_url(url: &str) -> anyhow::Result<()> {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    if has_user_info(url) {
        anyhow::bail!(
            "--admin-url (or HOOKD_ADMIN_URL) holds user info (`user:password@`): hookd's \
             client sends none; give http://host:port, and the admin token with --token (or \
             HOOKD_ADMIN_TOKEN)"
        );
    }
    if after_scheme.contains(['?', '#']) {
        anyhow::bail!(
            "--admin-url (or HOOKD_ADMIN_URL) has a query or a fragment: give http://host:port \
             (and a path prefix, if a proxy serves the admin API under one)"
        );
    }
    Ok(())
}

/// Whether `url` holds user info (`user:password@`) — anywhere before its query: `http://u:p/w@host`
/// is read as user info by some, a path by others. hookd's clients send none, and would print
/// it back in every line naming the URL, so such a URL is refused without being echoed.
pub(super) fn has_user_info(url: &str) -> bool {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let before_query = after_scheme.split(['?', '#']).next().unwrap_or("");
    before_query.contains('@')
}

/// The admin token to send, and where it came from (for the hint on a 401; never the value):
/// `--token`/`HOOKD_ADMIN_TOKEN`, else the config file's `server.admin_token`, else the token
/// file hookd generated beside the config's database.
fn admin_token(admin: &AdminArgs) -> anyhow::Result<(Option<String>, String)> {
    if admin.token.as_deref().is_some_and(str::is_empty) {
        // An empty bearer is refused as any wrong token would be: say so before sending it.
        anyhow::bail!(
            "--token (or HOOKD_ADMIN_TOKEN) is set but empty: set the admin token there, or \
             unset it to use the config's"
        );
    }
    if let Some(token) = &admin.token {
        return Ok((
            Some(token.clone()),
            "token from --token or HOOKD_ADMIN_TOKEN".into(),
        ));
    }
    config_token(admin, config_file(admin))
}

/// [`admin_token`] from `config` (the file `--config` names, or the `./hookd.toml` found).
fn config_token(
    admin: &AdminArgs,
    config: Option<&std::path::Path>,
) -> anyhow::Result<(Option<String>, String)> {
    let Some(config) = config else {
        return Ok((
            None,
            "no token given: set --token or HOOKD_ADMIN_TOKEN, or --config with the server's \
             hookd.toml"
                .into(),
        ));
    };
    let settings = ClientAdmin::load(config).context("--config (or HOOKD_CONFIG)")?;
    // The token of a `./hookd.toml` found here goes only to the admin API that file names: to
    // another `--admin-url` it would send this directory's server's token there (a dev token
    // to production, in plain http), unless --config names the file.
    if let Some(url) = &admin.admin_url
        && admin.config.is_none()
        && url.trim_end_matches('/') != settings.url.trim_end_matches('/')
    {
        return Ok((
            None,
            format!(
                "no token given: set --token or HOOKD_ADMIN_TOKEN (the token of {} goes to \
                 another --admin-url than its own only when --config names the file)",
                config.display()
            ),
        ));
    }
    if let Some(token) = settings.token {
        let from = format!("token from server.admin_token in {}", config.display());
        return Ok((Some(token), from));
    }
    let Some(file) = settings.token_file else {
        return Ok((
            None,
            format!(
                "no token given: set --token or HOOKD_ADMIN_TOKEN; {} sets no \
                 server.admin_token (with a PostgreSQL database there is no token file)",
                config.display()
            ),
        ));
    };
    match crate::admin::token::read(&file)? {
        Some(token) => Ok((Some(token), format!("token from {}", file.display()))),
        None => Ok((
            None,
            format!(
                "no token given: set --token or HOOKD_ADMIN_TOKEN; {} sets no server.admin_token \
                 and {} does not exist (hookd writes it at its first start)",
                config.display(),
                file.display()
            ),
        )),
    }
}

/// `answer` as pretty-printed JSON, object keys sorted (as the CLI has always printed them).
fn pretty(answer: &impl Serialize) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&serde_json::to_value(answer)?)
}

#[cfg(test)]
mod tests {
    /// A call that reached nothing says where its address came from: the defaults (no URL, no
    /// config found) are named as such, since nothing else would tell the user none was read.
    #[test]
    fn an_unreachable_admin_address_says_where_it_came_from() {
        let defaulted = super::address_from(false, None, false);
        assert!(
            defaulted.contains("no hookd.toml in this directory")
                && defaulted.ends_with("without a token"),
            "{defaulted}"
        );
        assert!(!super::address_from(false, None, true).contains("without a token"));
        let config = std::path::Path::new("/etc/hookd/hookd.toml");
        assert_eq!(
            super::address_from(false, Some(config), false),
            "the admin address of /etc/hookd/hookd.toml"
        );
        assert!(super::address_from(true, Some(config), false).starts_with("--admin-url"));
    }

    use clap::Parser;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Parser)]
    struct Events {
        #[command(flatten)]
        args: EventsArgs,
    }

    #[derive(Debug, Parser)]
    struct Replay {
        #[command(flatten)]
        args: ReplayArgs,
    }

    #[derive(Debug, Parser)]
    struct Plugins {
        #[command(flatten)]
        args: PluginsArgs,
    }

    /// User info, a query or a fragment in the admin URL is refused without echoing it (a
    /// password there was printed in every error, and a query got the API's path glued after it).
    #[test]
    fn an_admin_url_with_user_info_a_query_or_a_fragment_is_refused_unechoed() {
        for url in [
            "http://user:pa55-MARK@127.0.0.1:8081",
            "http://user:pa55-MARK@127.0.0.1:8081/x?y",
            "http://u:pa55-MARK/w@127.0.0.1:8081",
            "http://127.0.0.1:8081/?token=MARK",
            "http://127.0.0.1:8081/#MARK",
        ] {
            let admin = AdminArgs {
                admin_url: Some(url.into()),
                token: None,
                config: None,
            };
            let e = format!("{:#}", admin_base(&admin).unwrap_err());
            assert!(e.starts_with("--admin-url (or HOOKD_ADMIN_URL) h"), "{e}");
            assert!(!e.contains("MARK"), "{e}");
        }
        for url in ["http://127.0.0.1:8081", "http://admin.internal/hookd/"] {
            let admin = AdminArgs {
                admin_url: Some(url.into()),
                token: None,
                config: None,
            };
            assert_eq!(admin_base(&admin).unwrap(), url);
        }
    }

    #[test]
    fn an_empty_token_is_refused_before_anything_is_sent() {
        let admin = AdminArgs {
            admin_url: None,
            token: Some(String::new()),
            config: None,
        };
        let e = admin_token(&admin).unwrap_err().to_string();
        assert!(e.contains("HOOKD_ADMIN_TOKEN) is set but empty"), "{e}");
    }

    /// A config's token goes to an `--admin-url` other than the config's own admin address only
    /// when `--config` names the config: a `./hookd.toml` found in the directory is another
    /// server's (a dev token was sent to whatever `--admin-url` said).
    #[test]
    fn a_found_configs_token_goes_only_to_its_own_admin_api() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("hookd.toml"),
            "[server]\nadmin_listen = \"127.0.0.1:9181\"\nadmin_token = \"dev-token\"\n",
        )
        .unwrap();
        let config = dir.path().join("hookd.toml");
        let found = |url: &str| {
            let asked = AdminArgs {
                admin_url: Some(url.into()),
                token: None,
                config: None,
            };
            config_token(&asked, Some(&config)).unwrap()
        };
        let (elsewhere, why) = found("http://prod.example:8081");
        assert_eq!(elsewhere, None, "{why}");
        assert!(why.contains("only when --config names the file"), "{why}");
        assert_eq!(
            found("http://127.0.0.1:9181/").0.as_deref(),
            Some("dev-token")
        );
        let named = AdminArgs {
            admin_url: Some("http://prod.example:8081".into()),
            token: None,
            config: Some(dir.path().join("hookd.toml")),
        };
        assert_eq!(admin_token(&named).unwrap().0.as_deref(), Some("dev-token"));
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("evt_1-a.b~C9"), "evt_1-a.b~C9");
        assert_eq!(
            percent_encode("a/b c?d#e&f=g+h%"),
            "a%2Fb%20c%3Fd%23e%26f%3Dg%2Bh%25"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode(""), "");
    }

    #[test]
    fn query_skips_absent_values_and_encodes_present_ones() {
        assert_eq!(query(&[("source", None), ("limit", None)]), "");
        let pairs = [
            ("source", Some("a b".to_string())),
            ("state", None),
            ("handler", Some("x&y".to_string())),
        ];
        assert_eq!(query(&pairs), "?source=a%20b&handler=x%26y");
    }

    #[test]
    fn replay_body_omits_absent_fields() {
        let empty = Replay::try_parse_from(["replay"]).unwrap();
        assert_eq!(
            serde_json::to_value(api::ReplayRequest::from(empty.args.filter)).unwrap(),
            json!({})
        );

        let full = Replay::try_parse_from([
            "replay",
            "--source",
            "stripe",
            "--handler",
            "classifier",
            "--state",
            "stale",
            "--event-id",
            "evt_1",
            "--event-id",
            "evt_2",
            "--since",
            "10",
            "--until",
            "20",
            "--dry-run",
        ])
        .unwrap();
        let args = full.args;
        let request = replay_request(args.filter, args.state, args.force);
        assert_eq!(
            serde_json::to_value(request).unwrap(),
            json!({
                "source": "stripe", "handler": "classifier", "state": "stale",
                "event_ids": ["evt_1", "evt_2"], "since": 10, "until": 20, "dry_run": true,
            })
        );

        let forced = Replay::try_parse_from([
            "replay",
            "--state",
            "stale",
            "--force",
            "--error-kind",
            "trap",
        ])
        .unwrap();
        let args = forced.args;
        assert_eq!(
            serde_json::to_value(replay_request(args.filter, args.state, args.force)).unwrap(),
            json!({"state": "stale", "force": true, "error_kind": "trap"})
        );

        let some = Replay::try_parse_from(["replay", "--event-id", "evt_1"]).unwrap();
        assert_eq!(
            serde_json::to_value(api::ReplayRequest::from(some.args.filter)).unwrap(),
            json!({"event_ids": ["evt_1"]})
        );
    }

    #[test]
    fn replay_refuses_open_states() {
        let err = Replay::try_parse_from(["replay", "--state", "pending"]).unwrap_err();
        assert!(err.to_string().contains("pending"), "{err}");
    }

    /// A discard may name `dead` and the waiting states (the server takes them for a handler no
    /// longer configured), never `running` nor a finished state (the server refuses them), and
    /// takes a dead-letter group by its error kind as a replay does.
    #[test]
    fn discard_takes_dead_and_waiting_states_and_an_error_kind() {
        #[derive(Debug, Parser)]
        struct Discard {
            #[command(flatten)]
            args: DiscardArgs,
        }
        let waiting =
            Discard::try_parse_from(["discard", "--handler", "old", "--state", "pending"]);
        assert_eq!(waiting.unwrap().args.state.as_deref(), Some("pending"));
        for never in ["running", "done", "stale", "discarded"] {
            assert!(Discard::try_parse_from(["discard", "--state", never]).is_err());
        }
        let group = Discard::try_parse_from(["discard", "--error-kind", "trap"]).unwrap();
        assert_eq!(
            serde_json::to_value(api::ReplayRequest::from(group.args.filter)).unwrap(),
            json!({"error_kind": "trap"})
        );
    }

    #[test]
    fn events_takes_source_and_event_id_together_and_not_with_filters() {
        let one = Events::try_parse_from(["events", "github", "a/b"]).unwrap();
        assert_eq!(one.args.show_source.as_deref(), Some("github"));
        assert_eq!(one.args.event_id.as_deref(), Some("a/b"));
        assert!(Events::try_parse_from(["events", "github"]).is_err());
        assert!(Events::try_parse_from(["events", "github", "x", "--state", "dead"]).is_err());
        let err = Events::try_parse_from(["events", "--state", "sleeping"]).unwrap_err();
        assert!(err.to_string().contains("sleeping"), "{err}");
        assert!(Events::try_parse_from(["events", "--limit", "0"]).is_err());
    }

    #[test]
    fn plugins_rollback_needs_a_name() {
        let list = Plugins::try_parse_from(["plugins"]).unwrap();
        assert_eq!(list.args.action, None);
        let back = Plugins::try_parse_from(["plugins", "rollback", "classifier"]).unwrap();
        assert_eq!(back.args.action, Some(PluginAction::Rollback));
        assert_eq!(back.args.name.as_deref(), Some("classifier"));
        assert!(Plugins::try_parse_from(["plugins", "rollback"]).is_err());
        let err = Plugins::try_parse_from(["plugins", "classifier"]).unwrap_err();
        assert!(err.to_string().contains("classifier"), "{err}");
    }

    #[derive(Debug, Parser)]
    struct State {
        #[command(flatten)]
        args: StateArgs,
    }

    #[test]
    fn state_set_takes_a_value_or_a_file_and_delete_needs_a_version() {
        let set = State::try_parse_from(["state", "set", "counter", "count", "10"]).unwrap();
        assert!(matches!(
            set.args.command,
            StateCommand::Set { value: Some(v), if_match: None, .. } if v == "10"
        ));
        let set = State::try_parse_from([
            "state",
            "set",
            "counter",
            "count",
            "--file",
            "v.bin",
            "--if-match",
            "7",
        ])
        .unwrap();
        assert!(matches!(
            set.args.command,
            StateCommand::Set {
                value: None,
                file: Some(_),
                if_match: Some(7),
                ..
            }
        ));
        assert!(State::try_parse_from(["state", "set", "counter", "count"]).is_err());
        assert!(
            State::try_parse_from(["state", "set", "counter", "count", "1", "--file", "f"])
                .is_err()
        );
        assert!(State::try_parse_from(["state", "delete", "counter", "count"]).is_err());
        assert!(State::try_parse_from(["state", "list", "counter", "--limit", "0"]).is_err());
    }

    #[test]
    fn state_takes_the_admin_options_before_its_subcommand_or_after_it() {
        for argv in [
            &[
                "state", "--config", "a.toml", "--token", "t", "get", "counter", "count",
            ][..],
            &[
                "state", "get", "--config", "a.toml", "--token", "t", "counter", "count",
            ][..],
            &[
                "state", "get", "counter", "count", "--config", "a.toml", "--token", "t",
            ][..],
        ] {
            let parsed = State::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(
                parsed.args.admin.config.as_deref(),
                Some(std::path::Path::new("a.toml")),
                "{argv:?}"
            );
            assert_eq!(parsed.args.admin.token.as_deref(), Some("t"), "{argv:?}");
            assert!(
                matches!(&parsed.args.command, StateCommand::Get { plugin, key } if plugin == "counter" && key == "count"),
                "{argv:?}"
            );
        }
    }

    #[test]
    fn state_paths_encode_plugin_and_key_as_one_segment_each() {
        assert_eq!(
            state_path("counter", Some("count/a b")),
            "/admin/plugins/counter/state/count%2Fa%20b"
        );
        assert_eq!(state_path("c", None), "/admin/plugins/c/state");
    }

    #[test]
    fn urls_must_be_plain_http() {
        assert!(parse_url("http://127.0.0.1:8081/admin/events?x=1").is_ok());
        let https = parse_url("https://example.com/").unwrap_err().to_string();
        assert!(https.contains("https is not supported"), "{https}");
        let bare = parse_url("127.0.0.1:8081").unwrap_err().to_string();
        assert!(bare.contains("127.0.0.1:8081"), "{bare}");
        assert!(parse_url("not a url").is_err());
    }

    #[test]
    fn one_line_flattens_and_truncates() {
        assert_eq!(one_line("  {\"a\":\n1}\n", 100), "{\"a\": 1}");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("abc", 3), "abc");
    }

    #[test]
    fn pretty_prints_with_sorted_keys() {
        let answer = api::RollbackAnswer {
            name: "h".into(),
            sha256: "ab".into(),
            instances: vec!["h".into()],
        };
        let value = json!({"sha256": "ab", "name": "h", "instances": ["h"]});
        assert_eq!(pretty(&answer).unwrap(), pretty(&value).unwrap());
        assert_eq!(
            pretty(&json!({"sha256": "ab", "name": "h"})).unwrap(),
            "{\n  \"name\": \"h\",\n  \"sha256\": \"ab\"\n}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url() {
        // Port 1 on loopback: nothing listens there in a test environment.
        let uri = parse_url("http://127.0.0.1:1/admin/plugins").unwrap();
        let request = build_request(Method::GET, uri, HeaderMap::new(), Bytes::new());
        let err = send(&http_client(), request).await.unwrap_err();
        assert!(
            format!("{err:#}").contains("GET http://127.0.0.1:1/admin/plugins"),
            "{err:#}"
        );
    }
}
