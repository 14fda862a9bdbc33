//! Outbound HTTP from a handler: a small blocking client over the standard
//! `wasi:http/outgoing-handler` interface.
//!
//! ```no_run
//! use plugin_sdk::{Event, HandleError, Handler, config, http, output};
//! use plugin_sdk::serde_json::json;
//!
//! struct Notify;
//!
//! impl Handler for Notify {
//!     fn handle(event: Event) -> Result<Option<String>, HandleError> {
//!         let url = config::get("notify_url").ok_or(HandleError::permanent("notify_url is not set"))?;
//!         let response = http::post(&url)
//!             .header("x-source", &event.source)
//!             .json(&json!({ "event": event.event_id }))
//!             .send()?                 // transport failures retry; a refused host is permanent
//!             .error_for_status()?;    // 5xx, 408 and 429 retry, other non-2xx are permanent
//!         output::json(&json!({ "status": response.status }))
//!     }
//! }
//! # plugin_sdk::register!(handler = Notify);
//! ```
//!
//! # The outbound policy
//!
//! This is the normative description of what the host grants and enforces on every request,
//! per plugin instance (so a plugin needs no checks of its own):
//!
//! - **Grant.** Only `host:port` pairs listed in the plugin's `allow_hosts` in `hookd.toml`
//!   can be reached (when the URL has no port: 443 for `https://`, 80 for `http://`); without
//!   any, every request fails with [`HttpError::Denied`]. Parsers never get network. The match is literal: `localhost`,
//!   `[::1]`, `2130706433` or another port are different entries. Entries are checked at
//!   start-up: the port is required, IPv6 goes in brackets, numeric spellings other than a
//!   dotted quad (`2130706433`, `127.1`, `0x7f000001`) are refused, and so are the unspecified
//!   addresses (`0.0.0.0/8`, `[::]`, `[::ffff:0.0.0.0]`), which connect to the host itself.
//! - **Addresses.** A listed name is resolved once and the connection goes to the address it
//!   resolved to, so DNS cannot rebind it in between. These addresses are refused even through
//!   a listed name, unless that exact `ip:port` is itself listed (which is how a local service
//!   on `127.0.0.1:9000` is reached): loopback (`127.0.0.0/8`, `::1`), private (`10.0.0.0/8`,
//!   `172.16.0.0/12`, `192.168.0.0/16`), link-local (`169.254.0.0/16`, which holds cloud
//!   metadata at `169.254.169.254`, and `fe80::/10`), shared/CGNAT (`100.64.0.0/10`),
//!   benchmarking (`198.18.0.0/15`), IETF protocol assignments (`192.0.0.0/24`, where some
//!   clouds answer metadata), Azure's platform endpoint (`168.63.129.16`), unique-local
//!   (`fc00::/7`), site-local (`fec0::/10`), local-use NAT64 (`64:ff9b:1::/48`), unspecified (`0.0.0.0/8`, `::`), broadcast, multicast
//!   (`224.0.0.0/4`, `ff00::/8`), reserved (`240.0.0.0/4`), and IPv6 that embeds any refused
//!   IPv4 address (IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96`, NAT64 `64:ff9b::/96`,
//!   6to4 `2002::/16`).
//! - **Scheme.** `https://` and `http://`. Over `https` the host connects to the address it
//!   checked, then speaks TLS 1.2/1.3 and verifies the certificate against the URL's host
//!   name (an IP-literal URL against the certificate's IP addresses), trusting the Mozilla
//!   roots, the host machine's store and the plugin's `ca_file`; there is no way to skip
//!   verification. A certificate that is untrusted, for another name or expired fails with
//!   [`HttpError::Tls`] (`TLS-certificate-error` for raw `wasi:http` users; also
//!   `TLS-alert-received`, `TLS-protocol-error`), a permanent error; a handshake that does not
//!   finish in time is a [`HttpError::Timeout`].
//! - **Credentials.** A header the operator configured for a listed `host:port`
//!   (`[plugins.<name>.credentials]`) is added by the host after the request leaves the
//!   plugin, replacing a header of the same name set here: the plugin never holds the value.
//!   It is sent only over `https` (or to a listed loopback `ip:port`); a plain `http` request
//!   to any other credentialed target is refused with [`HttpError::Denied`].
//! - **Time.** DNS plus connect take at most 10 s; [`RequestBuilder::timeout`] can shorten
//!   the connect, first-byte and between-bytes waits. Nothing outlives the attempt: a request
//!   still waiting when its `timeout_ms` passes ends the attempt as a `timeout`.
//! - **Size.** Response bodies are capped at [`MAX_RESPONSE_BYTES`] (an error,
//!   [`HttpError::TooLarge`], never a silent truncation); a call that needs only the status
//!   and the start of the body asks for that with [`RequestBuilder::response_body_limit`],
//!   and the rest is dropped unread. One attempt may send at most 64 requests, after which
//!   requests fail with [`HttpError::Denied`].
//! - **Headers** are the plugin's but for those the host and the SDK set: `Host`,
//!   `Content-Length` (from the body), `Transfer-Encoding`, `Connection`, `Keep-Alive`,
//!   `Upgrade`, `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization` and
//!   `HTTP2-Settings`. A request setting one, or a header whose name is no HTTP token or whose
//!   value holds a control character, fails with [`HttpError::InvalidRequest`] before anything
//!   is sent, in hookd and in the test harness alike (the value is never printed).
//! - **Redirects** are not followed: a 3xx is returned as it is.
//! - **Idempotency.** Every request carries `Idempotency-Key: {source}:{event_id}:{handler}`,
//!   set by the host over any value given here: the same on every retry of a delivery, so a
//!   service that honours the header performs the effect once. Bytes outside printable ASCII,
//!   and `%`, are percent-encoded.
//! - **Refusals** reach the plugin as [`HttpError::Denied`] carrying the host's reason
//!   (`localhost:9100 is not in allow_hosts`; `example.test:80 resolves to 127.0.0.1:80,
//!   which is loopback (127.0.0.0/8); list 127.0.0.1:80 itself in allow_hosts to reach it`).
//!   The host also adds the first refusal's reason to a failed attempt's stored error (unless
//!   the error already says it) and logs the refusals once per attempt, when it ends: the
//!   plugin, the event, how many requests were refused and the first one's reason with its
//!   `host:port` — never the path or query, which may carry secrets.
//! - **Retries.** With `?`, transport failures, timeouts, an unreadable body and the statuses
//!   5xx, 408 and 429 (honouring `Retry-After`) retry the attempt; a refused host, an
//!   unsupported or invalid request, another non-2xx status and an oversized response are
//!   permanent (see [`HttpError`]'s conversion into [`HandleError`]).
//!
//! Outside hookd (unit tests on the host target) there is no host to send through: during a
//! [`Harness`](crate::testing::Harness) call, [`RequestBuilder::send`] is answered by the
//! harness's stubs (and refused, like an unlisted host, for a URL without one); outside one it
//! panics, like [`config`](crate::config) and [`state`](crate::state).

use std::{
    fmt,
    time::{Duration, SystemTime},
};

use serde::{Serialize, de::DeserializeOwned};

use crate::{HandleError, Header};

/// The most response body bytes the client reads (the host enforces the same cap).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
    /// `OPTIONS`
    Options,
}

impl Method {
    /// The method's name, upper-case (`POST`).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
        }
    }

    /// The method called `name`, in any case; `None` for a method this client does not send.
    pub fn from_name(name: &str) -> Option<Method> {
        [
            Method::Get,
            Method::Head,
            Method::Post,
            Method::Put,
            Method::Patch,
            Method::Delete,
            Method::Options,
        ]
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(name))
    }
}

/// Starts a `GET` request to `url` (`https://host[:port]/path?query`, or `http://`).
pub fn get(url: &str) -> RequestBuilder {
    request(Method::Get, url)
}

/// Starts a `POST` request to `url`.
pub fn post(url: &str) -> RequestBuilder {
    request(Method::Post, url)
}

/// Starts a request with any [`Method`].
pub fn request(method: Method, url: &str) -> RequestBuilder {
    RequestBuilder {
        method,
        url: Url::parse(url),
        headers: Vec::new(),
        body: Vec::new(),
        timeout: None,
        response_body_limit: None,
        error: None,
    }
}

/// A request being built; [`send`](RequestBuilder::send) sends it and waits for the response.
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder {
    method: Method,
    url: Result<Url, HttpError>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
    /// Read at most this many bytes of the response's body, dropping the rest.
    response_body_limit: Option<usize>,
    /// The first problem met while building (e.g. a body that does not serialise).
    error: Option<HttpError>,
}

impl RequestBuilder {
    /// Adds a header (sent as given; a header the host manages, such as `Host` or
    /// `Idempotency-Key`, is replaced by the host's value or refused).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds `Authorization: Bearer <token>`.
    pub fn bearer_auth(self, token: impl fmt::Display) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// Sets the body, as is.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the body to `value` as JSON, with `Content-Type: application/json`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body;
                self.header("content-type", "application/json")
            }
            Err(e) => {
                self.error.get_or_insert(HttpError::InvalidRequest(format!(
                    "the JSON body does not serialise: {e}"
                )));
                self
            }
        }
    }

    /// Bounds connecting, waiting for the response head, and each wait between body chunks.
    /// The attempt's own deadline bounds everything regardless.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Reads at most `max_bytes` of the response's body (at most [`MAX_RESPONSE_BYTES`]) and
    /// drops the rest unread, however long it is: a longer body is then no error, and
    /// [`Response::body`] holds its first `max_bytes` (all of it, if shorter). For a call that needs the status and at
    /// most the start of the body, such as a relay whose target may answer a success with a
    /// large document: without it, a body over the cap is [`HttpError::TooLarge`], and the
    /// status is lost with it.
    pub fn response_body_limit(mut self, max_bytes: usize) -> Self {
        self.response_body_limit = Some(max_bytes.min(MAX_RESPONSE_BYTES));
        self
    }

    /// Sends the request and reads the whole response (up to [`MAX_RESPONSE_BYTES`], or the
    /// [`response_body_limit`](RequestBuilder::response_body_limit)).
    ///
    /// Any status is a `Ok(Response)`, including 3xx, 4xx and 5xx; see
    /// [`Response::error_for_status`].
    ///
    /// # Panics
    ///
    /// Outside hookd (on a non-wasm target) when no [`Harness`](crate::testing::Harness) call
    /// is running, as there is no host to send through.
    pub fn send(self) -> Result<Response, HttpError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let url = self.url?;
        check_headers(&self.headers)?;
        if matches!(self.method, Method::Get | Method::Head) && !self.body.is_empty() {
            return Err(HttpError::InvalidRequest(
                "a GET or HEAD request has no body".into(),
            ));
        }
        #[cfg(target_arch = "wasm32")]
        {
            wasi::send(
                self.method,
                &url,
                &self.headers,
                &self.body,
                self.timeout,
                self.response_body_limit,
            )
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            // A stub answers at once: there is nothing for the timeout to bound.
            let _ = self.timeout;
            let answer = crate::testing::send(self.method, &url, &self.headers, self.body)
                .unwrap_or_else(|| crate::outside_hookd("http::send", &url.to_string()));
            match (answer, self.response_body_limit) {
                (Ok(mut response), Some(limit)) => {
                    response.body.truncate(limit);
                    Ok(response)
                }
                // As hookd's cap ends the read, whatever the stub holds.
                (Ok(response), None) if response.body.len() > MAX_RESPONSE_BYTES => {
                    Err(HttpError::TooLarge(format!(
                        "{} sent more than {MAX_RESPONSE_BYTES} bytes",
                        url.authority
                    )))
                }
                (answer, _) => answer,
            }
        }
    }
}

/// A response, read in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The response headers, names lower-cased, in the order received.
    pub headers: Vec<Header>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with `status` and `body`, without headers (e.g. for a
    /// [`Harness`](crate::testing::Harness) stub).
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (the name is lower-cased, as received headers are).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(crate::input::header(name, value));
        self
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, HttpError> {
        std::str::from_utf8(&self.body)
            .map_err(|e| HttpError::Body(format!("the response body is not UTF-8: {e}")))
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            HttpError::Body(format!("the response body is not the JSON expected: {e}"))
        })
    }

    /// `Ok(self)` for a 2xx, else [`HttpError::Status`] (with the server's `Retry-After`, if
    /// it sent one: delay-seconds, or an HTTP-date counted from now).
    pub fn error_for_status(self) -> Result<Self, HttpError> {
        if self.is_success() {
            return Ok(self);
        }
        let retry_after = self
            .header("retry-after")
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let mut body = String::from_utf8_lossy(&self.body).into_owned();
        if body.len() > 512 {
            let mut cut = 512;
            while !body.is_char_boundary(cut) {
                cut -= 1;
            }
            body.truncate(cut);
            body.push('…');
        }
        Err(HttpError::Status {
            status: self.status,
            retry_after,
            body,
        })
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3): `delay-seconds`, or an `HTTP-date` read as the
/// time left from `now` (zero if it has passed). Anything else is ignored, as if absent.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Why a request produced no usable response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The request cannot be sent as built: a malformed URL, a header the host refuses, a body
    /// that does not serialise.
    InvalidRequest(String),
    /// Something hookd's client does not do, such as an `ftp://` URL.
    Unsupported(String),
    /// The TLS handshake failed: the server's certificate is untrusted, for another name or
    /// expired, the server sent an alert, or the protocol failed. The reason says which.
    Tls(String),
    /// The host refused to send it: the `host:port` is not in the plugin's `allow_hosts`, its
    /// address is in a refused range, or the call sent too many requests. The hookd log says
    /// which.
    Denied(String),
    /// Connecting, the response head, or the body took too long.
    Timeout(String),
    /// The response body exceeds [`MAX_RESPONSE_BYTES`].
    TooLarge(String),
    /// DNS, connection or protocol failure.
    Transport(String),
    /// The response body could not be read or decoded.
    Body(String),
    /// A non-2xx status, from [`Response::error_for_status`].
    Status {
        /// The status code.
        status: u16,
        /// The server's `Retry-After` (seconds, or an HTTP-date as the time left), if any.
        retry_after: Option<Duration>,
        /// The start of the response body, for the error message.
        body: String,
    },
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::InvalidRequest(m) => write!(f, "invalid request: {m}"),
            HttpError::Unsupported(m) => write!(f, "unsupported: {m}"),
            HttpError::Tls(m) => write!(f, "TLS: {m}"),
            HttpError::Denied(m) => write!(f, "denied: {m}"),
            HttpError::Timeout(m) => write!(f, "timed out: {m}"),
            HttpError::TooLarge(m) => write!(f, "response too large: {m}"),
            HttpError::Transport(m) => write!(f, "transport error: {m}"),
            HttpError::Body(m) => write!(f, "bad response body: {m}"),
            HttpError::Status { status, body, .. } => write!(f, "status {status}: {body}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// With `?` in a handler: failures a later attempt may not meet (transport, timeout, 5xx,
/// 408, 429, an unreadable body) are retries, honouring `Retry-After`; the rest — a refused
/// host, a failed TLS handshake, an unsupported or invalid request, another 4xx, a response
/// over the cap — are
/// permanent, since retrying cannot change them (fix the config or the plugin, then replay).
impl From<HttpError> for HandleError {
    fn from(err: HttpError) -> Self {
        match &err {
            HttpError::Timeout(_) | HttpError::Transport(_) | HttpError::Body(_) => {
                HandleError::retry(err.to_string())
            }
            HttpError::Status {
                status,
                retry_after,
                ..
            } if *status >= 500 || *status == 408 || *status == 429 => match retry_after {
                Some(after) => HandleError::retry_after(err.to_string(), *after),
                None => HandleError::retry(err.to_string()),
            },
            _ => HandleError::permanent(err.to_string()),
        }
    }
}

/// An `http://` or `https://` URL split the way `wasi:http` wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    /// `https://`.
    https: bool,
    /// `host[:port]`, as written.
    pub(crate) authority: String,
    /// `/path?query`; `/` when the URL has none. The fragment is dropped.
    path_with_query: String,
}

impl Url {
    pub(crate) fn parse(url: &str) -> Result<Url, HttpError> {
        let invalid =
            |why: &str| HttpError::InvalidRequest(format!("URL {:?}: {why}", Url::shown(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected http(s)://host[:port]/path"))?;
        let https = scheme.eq_ignore_ascii_case("https");
        if !https && !scheme.eq_ignore_ascii_case("http") {
            return Err(invalid("only http:// and https:// URLs are supported"));
        }
        let rest = rest.split('#').next().unwrap_or("");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.is_empty() {
            return Err(invalid("no host"));
        }
        if authority.contains('@') {
            return Err(invalid(
                "credentials in the URL are not supported; send them in a header",
            ));
        }
        if authority
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid("the host contains whitespace"));
        }
        let path_with_query = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        Ok(Url {
            https,
            authority: authority.to_owned(),
            path_with_query,
        })
    }
}

impl Url {
    /// `host:port`, the port spelled out when the URL leaves it to the scheme: how hookd names
    /// a target in its refusals (and its `allow_hosts` lists it).
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn host_port(&self) -> String {
        // A port follows the last `:`, after any bracketed IPv6 address.
        let has_port =
            self.authority.rsplit_once(':').is_some_and(|(_, port)| {
                !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
            }) && !self.authority.ends_with(']');
        if has_port {
            self.authority.clone()
        } else {
            format!("{}:{}", self.authority, if self.https { 443 } else { 80 })
        }
    }

    /// `url` as an error message may show it: the scheme and the host, with any user
    /// information and everything after the host cut to `…`. A webhook URL often carries its
    /// secret in the path or the query (Discord, Slack, signed links), and error messages reach
    /// the log, the admin API and the dashboard.
    pub(crate) fn shown(url: &str) -> String {
        let (scheme, rest) = match url.split_once("://") {
            Some((scheme, rest)) => (format!("{scheme}://"), rest),
            None => (String::new(), url),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let mut authority = &rest[..end];
        let mut shown = scheme;
        if let Some(at) = authority.rfind('@') {
            shown.push_str("…@");
            authority = &authority[at + 1..];
        }
        shown.push_str(authority);
        if end < rest.len() {
            shown.push_str("/…");
        }
        shown
    }

    /// This URL as an error message may show it: see [`Url::shown`].
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub(crate) fn redacted(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        let path = if self.path_with_query == "/" {
            "/"
        } else {
            "/…"
        };
        format!("{scheme}://{}{path}", self.authority)
    }
}

/// Headers the host and the SDK set, which `wasi:http` refuses from a plugin: the framing and
/// the connection (`content-length` is the SDK's, from the body).
const RESERVED_HEADERS: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
    "http2-settings",
    "content-length",
];

/// Whether `name` is an HTTP field name: an RFC 9110 token (one or more `tchar`s).
pub(crate) fn is_field_name(name: &str) -> bool {
    const TCHAR: &[u8] = b"!#$%&'*+-.^_`|~";
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || TCHAR.contains(&b))
}

/// Refuses the headers `wasi:http` would (an invalid name or value, one of
/// [`RESERVED_HEADERS`]), naming the header, never its value: the same answer in hookd and in
/// the test harness.
fn check_headers(headers: &[(String, String)]) -> Result<(), HttpError> {
    for (name, value) in headers {
        if !is_field_name(name) {
            return Err(HttpError::InvalidRequest(format!(
                "header name {name:?} is not a valid HTTP field name"
            )));
        }
        if RESERVED_HEADERS
            .iter()
            .any(|r| name.eq_ignore_ascii_case(r))
        {
            return Err(HttpError::InvalidRequest(format!(
                "header {name:?} is hookd's to set (the framing and the connection): leave it out"
            )));
        }
        if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(HttpError::InvalidRequest(format!(
                "the value of header {name:?} holds a control character (a newline?)"
            )));
        }
    }
    Ok(())
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path_with_query)
    }
}

/// The `wasi:http` calls: the only code in the SDK that touches `wasip2`.
#[cfg(target_arch = "wasm32")]
mod wasi {
    use std::time::Duration;

    use wasip2::{
        http::{
            outgoing_handler,
            types::{
                self, ErrorCode, Fields, IncomingBody, OutgoingBody, OutgoingRequest,
                RequestOptions, Scheme,
            },
        },
        io::streams::StreamError,
    };

    use super::{HttpError, MAX_RESPONSE_BYTES, Method, Response, Url};
    use crate::Header;

    pub(super) fn send(
        method: Method,
        url: &Url,
        headers: &[(String, String)],
        body: &[u8],
        timeout: Option<Duration>,
        body_limit: Option<usize>,
    ) -> Result<Response, HttpError> {
        let mut entries: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.clone().into_bytes()))
            .collect();
        if !body.is_empty() || method == Method::Post || method == Method::Put {
            entries.push(("content-length".into(), body.len().to_string().into_bytes()));
        }
        let fields = Fields::from_list(&entries).map_err(|e| {
            HttpError::InvalidRequest(format!("a header is invalid or not allowed: {e:?}"))
        })?;
        let request = OutgoingRequest::new(fields);
        let invalid =
            |what: &str| HttpError::InvalidRequest(format!("{what} refused: {}", url.redacted()));
        request
            .set_method(&match method {
                Method::Get => types::Method::Get,
                Method::Head => types::Method::Head,
                Method::Post => types::Method::Post,
                Method::Put => types::Method::Put,
                Method::Patch => types::Method::Patch,
                Method::Delete => types::Method::Delete,
                Method::Options => types::Method::Options,
            })
            .map_err(|()| invalid("method"))?;
        request
            .set_scheme(Some(if url.https {
                &Scheme::Https
            } else {
                &Scheme::Http
            }))
            .map_err(|()| invalid("scheme"))?;
        request
            .set_authority(Some(&url.authority))
            .map_err(|()| invalid("host"))?;
        request
            .set_path_with_query(Some(&url.path_with_query))
            .map_err(|()| invalid("path"))?;
        let outgoing_body = request.body().map_err(|()| invalid("body"))?;
        let options = timeout.map(|t| {
            let options = RequestOptions::new();
            let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
            let _ = options.set_connect_timeout(Some(nanos));
            let _ = options.set_first_byte_timeout(Some(nanos));
            let _ = options.set_between_bytes_timeout(Some(nanos));
            options
        });

        // Send first, then stream the body: the host consumes it while the request is on the
        // wire, so a body larger than its buffer cannot block before sending starts.
        let pending = outgoing_handler::handle(request, options)
            .map_err(|code| from_code(code, &url.authority))?;
        let written = write_body(outgoing_body, body);
        pending.subscribe().block();
        let response = match pending.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(from_code(code, &url.authority)),
            Some(Err(())) | None => {
                return Err(HttpError::Transport("the response was lost".into()));
            }
        };
        // A server may answer before reading the whole body (e.g. 413); its answer wins.
        let _ = written;

        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| Header {
                name: name.to_ascii_lowercase(),
                value: String::from_utf8_lossy(&value).into_owned(),
            })
            .collect();
        let incoming = response
            .consume()
            .map_err(|()| HttpError::Body("the response body was already taken".into()))?;
        let body = read_body(&incoming, &url.authority, body_limit);
        let _ = IncomingBody::finish(incoming);
        Ok(Response {
            status,
            headers,
            body: body?,
        })
    }

    fn write_body(outgoing: OutgoingBody, body: &[u8]) -> Result<(), HttpError> {
        let stream = outgoing.write().map_err(|()| {
            HttpError::Transport("the request body stream was already taken".into())
        })?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| HttpError::Transport(format!("writing the request body: {e:?}")))?;
        }
        drop(stream);
        OutgoingBody::finish(outgoing, None)
            .map_err(|code| HttpError::Transport(format!("finishing the request body: {code:?}")))
    }

    /// Reads the body to its end, or only its first `limit` bytes (the rest is then dropped
    /// unread). A body over the cap is over any limit: with one, it ends the read with what
    /// arrived.
    fn read_body(
        incoming: &IncomingBody,
        authority: &str,
        limit: Option<usize>,
    ) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        match (read_into(&mut body, incoming, authority, limit), limit) {
            (Ok(()), _) => Ok(body),
            (Err(HttpError::TooLarge(_)), Some(limit)) => {
                body.truncate(limit);
                Ok(body)
            }
            (Err(e), _) => Err(e),
        }
    }

    fn read_into(
        body: &mut Vec<u8>,
        incoming: &IncomingBody,
        authority: &str,
        limit: Option<usize>,
    ) -> Result<(), HttpError> {
        let stream = incoming
            .stream()
            .map_err(|()| HttpError::Body("the response body stream was already taken".into()))?;
        loop {
            if let Some(limit) = limit
                && body.len() >= limit
            {
                body.truncate(limit);
                return Ok(());
            }
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_RESPONSE_BYTES {
                        return Err(HttpError::TooLarge(format!(
                            "{authority} sent more than {MAX_RESPONSE_BYTES} bytes"
                        )));
                    }
                }
                Err(StreamError::Closed) => return Ok(()),
                Err(StreamError::LastOperationFailed(e)) => {
                    if let Some(code) = types::http_error_code(&e) {
                        return Err(from_code(code, authority));
                    }
                    // wasmtime-wasi-http 48 reports body errors as plain messages rather than
                    // error codes: read the message's first line (the rest is a backtrace).
                    let debug = e.to_debug_string();
                    let what = debug.lines().next().unwrap_or("").trim();
                    let what = format!("reading the response body from {authority}: {what}");
                    return Err(if what.contains("body size exceeds limit") {
                        // Its number is what had arrived when the host stopped reading: the
                        // cap is what to say.
                        HttpError::TooLarge(format!(
                            "{authority} sent more than {MAX_RESPONSE_BYTES} bytes"
                        ))
                    } else if what.contains("timeout") {
                        HttpError::Timeout(what)
                    } else {
                        HttpError::Body(what)
                    });
                }
            }
        }
    }

    fn from_code(code: ErrorCode, authority: &str) -> HttpError {
        match code {
            ErrorCode::HttpRequestDenied
            | ErrorCode::DestinationIpProhibited
            | ErrorCode::ConnectionLimitReached => {
                // The error code carries no text; the host says why when asked.
                let why = crate::__private::network::last_refusal()
                    .unwrap_or_else(|| "no reason given".into());
                HttpError::Denied(format!("hookd refused the request to {authority}: {why}"))
            }
            ErrorCode::DnsTimeout
            | ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::HttpResponseTimeout => {
                HttpError::Timeout(format!("{authority}: {code:?}"))
            }
            ErrorCode::HttpResponseBodySize(size) => HttpError::TooLarge(format!(
                "{authority} sent {} bytes, over the {MAX_RESPONSE_BYTES}-byte cap",
                size.map_or_else(|| "too many".to_owned(), |s| s.to_string())
            )),
            ErrorCode::TlsCertificateError => HttpError::Tls(format!(
                "{authority}: the server's certificate is not trusted, is for another name or \
                 has expired (TLS-certificate-error)"
            )),
            ErrorCode::TlsAlertReceived(alert) => HttpError::Tls(format!(
                "{authority}: the server sent TLS alert {}{}",
                alert.alert_id.map_or_else(String::new, |id| id.to_string()),
                alert
                    .alert_message
                    .map_or_else(String::new, |m| format!(" ({m})"))
            )),
            ErrorCode::TlsProtocolError => {
                HttpError::Tls(format!("{authority}: the TLS handshake failed"))
            }
            ErrorCode::HttpRequestUriInvalid | ErrorCode::HttpRequestMethodInvalid => {
                HttpError::InvalidRequest(format!("{authority}: {code:?}"))
            }
            other => HttpError::Transport(format!("{authority}: {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        let ok = [
            (
                "http://127.0.0.1:9000/v1/chat?x=1#top",
                "127.0.0.1:9000",
                "/v1/chat?x=1",
            ),
            ("HTTP://example.com", "example.com", "/"),
            ("http://example.com?q", "example.com", "/?q"),
            ("http://[::1]:80/", "[::1]:80", "/"),
        ];
        for (url, authority, path) in ok {
            let got = Url::parse(url).unwrap();
            assert_eq!(
                (got.authority.as_str(), got.path_with_query.as_str()),
                (authority, path),
                "{url}"
            );
        }
        let https = Url::parse("https://example.com:8443/v1?x").unwrap();
        assert!(https.https);
        assert_eq!(https.to_string(), "https://example.com:8443/v1?x");
        assert!(!Url::parse("http://example.com/").unwrap().https);
        for bad in [
            "example.com/x",
            "ftp://x/",
            "http:///x",
            "http://u:p@x/",
            "http://a b/",
        ] {
            assert!(
                matches!(Url::parse(bad), Err(HttpError::InvalidRequest(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn url_errors_show_no_path_query_or_credentials() {
        for (url, shown) in [
            ("ftp://files.example/s3cret?k=v", "ftp://files.example/…"),
            ("discord.com/api/webhooks/1/s3cret", "discord.com/…"),
            ("http://user:s3cret@example.com/x", "http://…@example.com/…"),
            ("https://a b/s3cret", "https://a b/…"),
            ("http://a\tb?token=s3cret", "http://a\tb/…"),
            ("http://#s3cret", "http:///…"),
        ] {
            let Err(HttpError::InvalidRequest(message)) = Url::parse(url) else {
                panic!("{url} was not refused");
            };
            assert!(!message.contains("s3cret"), "{message}");
            assert!(message.contains(&format!("{shown:?}")), "{message}");
        }
        let url = Url::parse("https://hooks.example/T0/s3cret?x=1").unwrap();
        assert_eq!(url.redacted(), "https://hooks.example/…");
        let url = Url::parse("https://hooks.example").unwrap();
        assert_eq!(url.redacted(), "https://hooks.example/");
    }

    #[test]
    fn status_errors_keep_retry_after_and_a_short_body() {
        let response = |status, retry: Option<&str>| Response {
            status,
            headers: retry
                .map(|r| Header {
                    name: "retry-after".into(),
                    value: r.into(),
                })
                .into_iter()
                .collect(),
            body: "x".repeat(2000).into_bytes(),
        };
        assert!(response(204, None).error_for_status().is_ok());
        let err = response(429, Some("7")).error_for_status().unwrap_err();
        let HttpError::Status {
            status,
            retry_after,
            body,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((*status, *retry_after), (429, Some(Duration::from_secs(7))));
        assert!(body.len() < 600);
        let want = HandleError::retry_after(format!("status 429: {body}"), Duration::from_secs(7));
        assert_eq!(HandleError::from(err), want);
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let parse = |v| parse_retry_after(v, now);
        assert_eq!(parse(" 120 "), Some(Duration::from_secs(120)));
        // The three date forms RFC 9110 makes a recipient accept.
        assert_eq!(
            parse("Wed, 21 Oct 2015 07:29:30 GMT"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse("Wednesday, 21-Oct-15 07:28:05 GMT"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            parse("Wed Oct 21 07:28:10 2015"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse("Wed, 21 Oct 2015 07:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(parse("soon"), None);
        assert_eq!(parse("-5"), None);
    }

    #[test]
    fn handler_errors_retry_only_what_may_change() {
        let retry = |e: HttpError| matches!(HandleError::from(e), HandleError::Retry { .. });
        assert!(retry(HttpError::Timeout("t".into())));
        assert!(retry(HttpError::Transport("t".into())));
        assert!(retry(HttpError::Status {
            status: 503,
            retry_after: None,
            body: String::new()
        }));
        assert!(!retry(HttpError::Status {
            status: 404,
            retry_after: None,
            body: String::new()
        }));
        assert!(!retry(HttpError::Denied("d".into())));
        assert!(!retry(HttpError::Unsupported("u".into())));
        assert!(!retry(HttpError::Tls("certificate".into())));
    }

    #[test]
    fn building_errors_surface_on_send() {
        let err = get("http://x/").body("no").send().unwrap_err();
        assert!(matches!(err, HttpError::InvalidRequest(_)), "{err:?}");
        let err = post("ftp://x/").send().unwrap_err();
        assert!(matches!(err, HttpError::InvalidRequest(_)), "{err:?}");
    }
}
