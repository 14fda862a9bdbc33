//! Outbound HTTP for handlers: the host side of `wasi:http/outgoing-handler`, granted per plugin
//! instance by its `allow_hosts`.
//!
//! Invariants:
//! - Nothing leaves without a grant: a call starts with none ([`OutboundHooks::new`]) and only a
//!   handler attempt is given one ([`Outbound`], by `dispatch`); parsers never get network. An
//!   empty allow-list is no network at all.
//! - A request goes out only if its scheme is `http`, its `host:port` (port 80 when absent) is
//!   literally in the allow-list, and the address it connects to is not in a refused range
//!   ([`refused_range`]: loopback, private, link-local incl. cloud metadata, CGNAT, unique-local,
//!   unspecified, broadcast, multicast, and IPv4-mapped/-embedded IPv6 of those) — unless that
//!   exact `ip:port` is itself listed. A listed name is resolved once and the connection goes to
//!   the resolved address, so DNS cannot rebind a listed name into a refused range between the
//!   check and the connect.
//! - Connect, first-byte and whole-response time are bounded, never beyond the attempt's
//!   deadline; the response body is capped; redirects are not followed (the plugin sees the 3xx).
//! - Every request carries `Idempotency-Key: {source}:{event_id}:{handler}`, set here over any
//!   value the plugin chose, so a retried attempt is recognisable downstream.
//! - A refusal reaches the guest as a `wasi:http` error code and is logged with the plugin, the
//!   event and the refused `host:port` (never the path or query, which may carry secrets) —
//!   once per call: a call's refusals are counted and logged as one line when the call ends
//!   (the first refusal's reason and the count), so a loop of refused requests cannot flood
//!   the host log.
//! - The unspecified addresses (`0.0.0.0/8`, `::`, and their IPv4-mapped forms) are refused as
//!   allow-list entries: connecting to one reaches this machine.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, uri::Scheme};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, time::Sleep};
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
    p2::bindings::http::types::ErrorCode,
};

use super::host::HostState;
use crate::ids::{EventId, PluginName};

/// Longest wait for DNS plus the TCP connect, unless the plugin asks for less.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body a plugin may receive; more is an error, not a truncation.
pub const RESPONSE_BYTES: u64 = 8 * 1024 * 1024;
/// Requests one call may send; more are refused (a loop cannot hammer a listed host forever).
pub const REQUESTS_PER_CALL: u32 = 64;
/// How long after the attempt's deadline the host's own HTTP timers fire. The attempt's wall
/// clock fires first, so a request still waiting at the deadline makes the attempt a `timeout`
/// (not a plugin-visible error); these timers are the backstop.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);
/// The header every outgoing request carries.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A host as written in an allow-list entry or a request URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lower-cased, without a trailing dot.
    Name(String),
    /// An IP address literal (`[...]` brackets removed for IPv6).
    Ip(IpAddr),
}

impl Host {
    /// Reads the host of a request URL. Any name is accepted here (a name that is not in the
    /// allow-list is refused later); IP literals become [`Host::Ip`].
    fn from_url_host(host: &str) -> Self {
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'))
            && let Ok(ip) = inner.parse::<Ipv6Addr>()
        {
            return Host::Ip(IpAddr::V6(ip));
        }
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Host::Ip(IpAddr::V4(ip));
        }
        let name = host.strip_suffix('.').unwrap_or(host);
        Host::Name(name.to_ascii_lowercase())
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// One allow-list entry: `host:port`, e.g. `api.example.com:80`, `127.0.0.1:9000`,
/// `[fd00::1]:8080`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: Host,
    pub port: u16,
}

impl HostPort {
    /// Parses an allow-list entry. The port is required; IPv6 goes in brackets; a host must be
    /// a dotted-quad IPv4 address, a bracketed IPv6 address or a DNS name whose last label
    /// starts with a letter — so numeric spellings such as `2130706433` or `127.1` (which some
    /// resolvers read as `127.0.0.1`) are refused rather than silently meaning loopback.
    pub fn parse(entry: &str) -> Result<Self, String> {
        if entry.contains("://") || entry.contains('/') {
            return Err("an entry is `host:port`, not a URL".into());
        }
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (ip, port) = rest
                .split_once("]:")
                .ok_or("an IPv6 entry is `[address]:port`")?;
            let ip: Ipv6Addr = ip
                .parse()
                .map_err(|_| format!("{ip:?} is not an IPv6 address"))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = entry
                .rsplit_once(':')
                .ok_or("an entry is `host:port`; the port is required")?;
            if host.contains(':') {
                return Err("IPv6 addresses go in brackets: `[address]:port`".into());
            }
            if let Ok(ip) = host.parse::<Ipv4Addr>() {
                (Host::Ip(IpAddr::V4(ip)), port)
            } else {
                (Host::Name(check_name(host)?), port)
            }
        };
        if let Host::Ip(ip) = host
            && is_unspecified(ip)
        {
            return Err(format!(
                "{ip} is an unspecified address, which connects to this machine; list the \
                 address or name of the host to reach"
            ));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{port:?} is not a port (1-65535)"))?;
        Ok(Self { host, port })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// `0.0.0.0/8` ("this network": connecting to it reaches the local host), `::`, and the
/// IPv4-mapped form of `0.0.0.0/8`.
fn is_unspecified(ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) if v6.is_unspecified() => return true,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return false,
        },
    };
    v4.octets()[0] == 0
}

/// A DNS name, lower-cased, trailing dot removed; refuses what is not one.
fn check_name(host: &str) -> Result<String, String> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let labels_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !labels_ok {
        return Err(format!("{host:?} is not a host name or IP address"));
    }
    let last = name.rsplit('.').next().unwrap_or("");
    if !last.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!(
            "{host:?} is a numeric host that is not a dotted-quad IPv4 address; write the \
             address as a.b.c.d"
        ));
    }
    Ok(name)
}

/// A plugin instance's `allow_hosts`: the only `host:port` pairs its handler may reach.
/// Empty (the default) means no network.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Arc<[HostPort]>,
}

impl fmt::Debug for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.to_string()))
            .finish()
    }
}

impl AllowList {
    /// Parses `entries`; the error names the entry at fault and why.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|e| {
                let e = e.as_ref();
                HostPort::parse(e).map_err(|why| format!("{e:?}: {why}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            entries: entries.into(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[HostPort] {
        &self.entries
    }

    fn allows(&self, host: &Host, port: u16) -> bool {
        self.entries
            .iter()
            .any(|e| e.port == port && &e.host == host)
    }

    /// Whether this exact address is listed (as an IP literal).
    fn lists_addr(&self, addr: SocketAddr) -> bool {
        self.allows(&Host::Ip(addr.ip()), addr.port())
    }
}

/// Why an address may not be reached unless it is listed itself, or `None` if it may.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => refused_v4(ip),
        IpAddr::V6(ip) => refused_v6(ip),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        (0, _) => "unspecified (0.0.0.0/8)",
        (127, _) => "loopback (127.0.0.0/8)",
        (10, _) => "private (10.0.0.0/8)",
        (172, 16..=31) => "private (172.16.0.0/12)",
        (192, 168) => "private (192.168.0.0/16)",
        (169, 254) => "link-local (169.254.0.0/16, cloud metadata)",
        (100, 64..=127) => "shared address space (CGNAT, 100.64.0.0/10)",
        (224..=239, _) => "multicast (224.0.0.0/4)",
        (255, 255) if ip.is_broadcast() => "broadcast",
        (240..=255, _) => "reserved (240.0.0.0/4)",
        _ => return None,
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // Addresses that embed an IPv4 address are judged by it.
    let embedded = if let Some(v4) = ip.to_ipv4_mapped() {
        Some((
            v4,
            "IPv4-mapped IPv6 (::ffff:0:0/96) of a refused IPv4 range",
        ))
    } else if segments[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        ip.to_ipv4()
            .map(|v4| (v4, "IPv4-compatible IPv6 (::/96) of a refused IPv4 range"))
    } else if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., hi, lo] = segments;
        Some((
            Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)),
            "NAT64 (64:ff9b::/96) of a refused IPv4 range",
        ))
    } else if segments[0] == 0x2002 {
        Some((
            Ipv4Addr::from((u32::from(segments[1]) << 16) | u32::from(segments[2])),
            "6to4 (2002::/16) of a refused IPv4 range",
        ))
    } else {
        None
    };
    if let Some((v4, why)) = embedded {
        return refused_v4(v4).map(|_| why);
    }
    Some(match segments[0] {
        _ if ip.is_unspecified() => "unspecified (::)",
        _ if ip.is_loopback() => "loopback (::1)",
        s if s & 0xfe00 == 0xfc00 => "unique-local (fc00::/7)",
        s if s & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        s if s & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        s if s & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        _ => return None,
    })
}

/// Why a request was refused. The `Display` names the host, never the path or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The plugin has no grant: a parser, or a handler with an empty `allow_hosts`.
    NoNetwork,
    /// Only plain `http` is spoken.
    Scheme(String),
    /// The request has no host.
    NoHost,
    /// `host:port` is not in the allow-list.
    NotListed(HostPort),
    /// Every address the host resolved to is in a refused range and not itself listed.
    Prohibited {
        target: HostPort,
        addr: SocketAddr,
        range: &'static str,
    },
    /// The call already sent its share of requests.
    TooManyRequests,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::NoNetwork => {
                f.write_str("the plugin has no network grant (allow_hosts is empty)")
            }
            Denied::Scheme(scheme) => write!(
                f,
                "scheme {scheme:?} is not supported: hookd's outbound HTTP speaks plain http only \
                 (no TLS client yet)"
            ),
            Denied::NoHost => f.write_str("the request names no host"),
            Denied::NotListed(target) => write!(f, "{target} is not in allow_hosts"),
            Denied::Prohibited {
                target,
                addr,
                range,
            } => write!(
                f,
                "{target} resolves to {addr}, which is {range}; list {addr} itself in allow_hosts \
                 to reach it"
            ),
            Denied::TooManyRequests => write!(
                f,
                "the call already sent {REQUESTS_PER_CALL} requests (the per-call cap)"
            ),
        }
    }
}

impl Denied {
    /// The `wasi:http` error the guest sees.
    fn error(&self) -> HttpError {
        match self {
            Denied::Prohibited { .. } => HttpError::DestinationIpProhibited,
            Denied::TooManyRequests => HttpError::ConnectionLimitReached,
            _ => HttpError::HttpRequestDenied,
        }
    }
}

/// Checks a request's target against the grant before anything is resolved.
pub fn check_target(
    allow: &AllowList,
    scheme: Option<&Scheme>,
    host: Option<&str>,
    port: Option<u16>,
) -> Result<HostPort, Denied> {
    if allow.is_empty() {
        return Err(Denied::NoNetwork);
    }
    match scheme {
        Some(s) if *s == Scheme::HTTP => {}
        other => {
            return Err(Denied::Scheme(
                other.map_or_else(|| "none".to_owned(), |s| s.to_string()),
            ));
        }
    }
    let host = Host::from_url_host(host.filter(|h| !h.is_empty()).ok_or(Denied::NoHost)?);
    let target = HostPort {
        host,
        port: port.unwrap_or(80),
    };
    if !allow.allows(&target.host, target.port) {
        return Err(Denied::NotListed(target));
    }
    Ok(target)
}

/// Keeps the resolved addresses that may be reached: those outside every refused range, and
/// those listed themselves. Errs with the first refused one when none is left.
pub fn usable_addrs(
    allow: &AllowList,
    target: &HostPort,
    resolved: &[SocketAddr],
) -> Result<Vec<SocketAddr>, Denied> {
    let mut usable = Vec::new();
    let mut refused = None;
    for &addr in resolved {
        match refused_range(addr.ip()) {
            Some(range) if !allow.lists_addr(addr) => {
                refused.get_or_insert(Denied::Prohibited {
                    target: target.clone(),
                    addr,
                    range,
                });
            }
            _ => usable.push(addr),
        }
    }
    match (usable.is_empty(), refused) {
        (false, _) => Ok(usable),
        (true, Some(denied)) => Err(denied),
        (true, None) => Err(Denied::NotListed(target.clone())),
    }
}

/// `{source}:{event_id}:{handler}`, with bytes that may not appear in a header value (and `%`)
/// percent-encoded, so the key is always sendable and distinct ids stay distinct.
pub fn idempotency_key(source: &str, event_id: &str, handler: &str) -> String {
    let raw = format!("{source}:{event_id}:{handler}");
    let mut key = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if (0x21..=0x7e).contains(&byte) && byte != b'%' {
            key.push(char::from(byte));
        } else {
            key.push_str(&format!("%{byte:02X}"));
        }
    }
    key
}

/// A handler attempt's network grant, built by `dispatch` from the plugin's config.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// Where the handler may connect.
    pub allow: AllowList,
    /// The value of every request's `Idempotency-Key` ([`idempotency_key`]).
    pub idempotency_key: String,
}

/// One call's refused requests: counted as they happen, logged as one line when the last
/// holder (the call's hooks, or a request future that outlived them) drops it.
struct Refusals {
    plugin: PluginName,
    event: Option<EventId>,
    count: u64,
    /// The first refusal's reason (names the `host:port`, never the path or query).
    first: Option<String>,
}

impl Refusals {
    fn record(&mut self, denied: &Denied) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(denied.to_string());
        }
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        let Some(first) = &self.first else { return };
        let plugin = self.plugin.as_str();
        let event = self.event.as_ref().map(|e| e.as_str()).unwrap_or("");
        if self.count == 1 {
            tracing::warn!(target: "plugin", plugin, event, "outbound request denied: {first}");
        } else {
            tracing::warn!(
                target: "plugin",
                plugin,
                event,
                denied = self.count,
                "outbound requests denied: {} in this call; the first: {first}",
                self.count
            );
        }
    }
}

/// A call's [`Refusals`], shared with its request futures.
#[derive(Clone)]
struct RefusalLog(Arc<std::sync::Mutex<Refusals>>);

impl RefusalLog {
    fn record(&self, denied: &Denied) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(denied);
    }
}

/// Per-call `wasi:http` hooks: the grant, the attempt's deadline, and who to blame in logs.
pub struct OutboundHooks {
    plugin: PluginName,
    deadline: Instant,
    grant: Option<Outbound>,
    requests_left: u32,
    refusals: RefusalLog,
}

impl OutboundHooks {
    /// No grant: every request is refused until [`OutboundHooks::grant`].
    pub fn new(plugin: PluginName, event: Option<EventId>, deadline: Instant) -> Self {
        Self {
            plugin: plugin.clone(),
            deadline,
            grant: None,
            requests_left: REQUESTS_PER_CALL,
            refusals: RefusalLog(Arc::new(std::sync::Mutex::new(Refusals {
                plugin,
                event,
                count: 0,
                first: None,
            }))),
        }
    }

    pub fn grant(&mut self, grant: Outbound) {
        self.grant = Some(grant);
    }

    fn deny(&self, denied: &Denied) -> HttpError {
        self.refusals.record(denied);
        denied.error()
    }

    /// The synchronous checks: grant, scheme, allow-list, per-call cap; then the host's headers.
    fn admit(&mut self, request: &mut Request<WasiBody>) -> Result<(HostPort, AllowList), Denied> {
        let Some(grant) = &self.grant else {
            return Err(Denied::NoNetwork);
        };
        let uri = request.uri();
        let target = check_target(&grant.allow, uri.scheme(), uri.host(), uri.port_u16())?;
        if self.requests_left == 0 {
            return Err(Denied::TooManyRequests);
        }
        self.requests_left -= 1;
        let key = HeaderValue::from_str(&grant.idempotency_key)
            .expect("idempotency_key() yields visible ASCII only");
        request.headers_mut().insert(IDEMPOTENCY_KEY, key);
        Ok((target, grant.allow.clone()))
    }
}

type SendResult = Result<
    (
        Response<WasiBody>,
        Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ),
    HttpError,
>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        mut request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_done: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        let admitted = self.admit(&mut request);
        let refusals = self.refusals.clone();
        let plugin = self.plugin.clone();
        let hard_deadline = self.deadline + DEADLINE_GRACE;
        let denied_error = match &admitted {
            Err(denied) => Some(self.deny(denied)),
            Ok(_) => None,
        };
        Box::new(async move {
            let (target, allow) = match (admitted, denied_error) {
                (Ok(admitted), _) => admitted,
                (Err(_), Some(error)) => return Err(error),
                (Err(_), None) => unreachable!("a refusal always has its error"),
            };
            let timeouts = Timeouts::new(options, hard_deadline);
            let addrs = resolve(&target, timeouts.connect_by).await?;
            let addrs = usable_addrs(&allow, &target, &addrs).map_err(|denied| {
                refusals.record(&denied);
                denied.error()
            })?;
            drop(refusals);
            let method = request.method().clone();
            let result = send(request, &addrs, timeouts).await;
            match &result {
                Ok((response, _)) => tracing::debug!(
                    target: "plugin", plugin = %plugin, host = %target,
                    "outbound {method} answered {}", response.status()
                ),
                Err(e) => tracing::debug!(
                    target: "plugin", plugin = %plugin, host = %target,
                    "outbound {method} failed: {e}"
                ),
            }
            result
        })
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        super::budget::BODY_CHUNK_BYTES
    }

    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        super::budget::BODY_BUFFER_CHUNKS
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        if err.is_timeout() {
            ErrorCode::HttpResponseTimeout
        } else if err.is_incomplete_message() {
            ErrorCode::HttpResponseIncomplete
        } else {
            ErrorCode::HttpProtocolError
        }
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        use std::io::ErrorKind;
        match err.kind() {
            ErrorKind::TimedOut => ErrorCode::ConnectionTimeout,
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
                ErrorCode::ConnectionTerminated
            }
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
                ErrorCode::DestinationUnavailable
            }
            _ => ErrorCode::ConnectionRefused,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

/// When each phase of one request must be done (all within the attempt's deadline + grace).
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    connect_by: tokio::time::Instant,
    first_byte_by: tokio::time::Instant,
    done_by: tokio::time::Instant,
    between_bytes: Option<Duration>,
}

impl Timeouts {
    fn new(options: Option<RequestOptions>, hard_deadline: Instant) -> Self {
        let now = Instant::now();
        let options = options.unwrap_or_default();
        let done_by = hard_deadline.max(now);
        let within = |d: Duration| now.checked_add(d).map_or(done_by, |t| t.min(done_by));
        Self {
            connect_by: within(options.connect_timeout.unwrap_or(CONNECT_TIMEOUT)).into(),
            first_byte_by: options.first_byte_timeout.map_or(done_by, within).into(),
            done_by: done_by.into(),
            between_bytes: options.between_bytes_timeout,
        }
    }
}

/// Resolves the target once. An IP literal is used as is.
async fn resolve(
    target: &HostPort,
    by: tokio::time::Instant,
) -> Result<Vec<SocketAddr>, HttpError> {
    let name = match &target.host {
        Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, target.port)]),
        Host::Name(name) => name.clone(),
    };
    let lookup = tokio::net::lookup_host((name, target.port));
    let addrs: Vec<SocketAddr> = tokio::time::timeout_at(by, lookup)
        .await
        .map_err(|_| HttpError::DnsTimeout)?
        .map_err(|e| HttpError::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(HttpError::DestinationNotFound);
    }
    Ok(addrs)
}

/// Connects to the first reachable address (no further resolution), sends the request over
/// HTTP/1.1 and returns the response head, with a capped, deadline-bound body.
async fn send(
    mut request: Request<WasiBody>,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
) -> SendResult {
    let mut last_error = HttpError::ConnectionRefused;
    let mut stream = None;
    for &addr in addrs {
        match tokio::time::timeout_at(timeouts.connect_by, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) => last_error = HttpError::Connect(e),
            Err(_) => {
                last_error = HttpError::ConnectionTimeout;
                break;
            }
        }
    }
    let stream = stream.ok_or(last_error)?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = tokio::time::timeout_at(
        timeouts.connect_by,
        hyper::client::conn::http1::handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| HttpError::ConnectionTimeout)??;

    // The request line carries only the path; the authority went into the Host header.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;

    // Drive the connection while waiting for the response head; keep driving it afterwards
    // (the returned I/O future) while the body streams.
    let mut conn = Some(conn);
    let response = {
        let send = tokio::time::timeout_at(timeouts.first_byte_by, sender.send_request(request));
        tokio::pin!(send);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = send.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            if let Some(c) = conn.as_mut()
                && let Poll::Ready(done) = Pin::new(c).poll(cx)
            {
                conn = None;
                if let Err(e) = done {
                    return Poll::Ready(Ok(Err(e)));
                }
                return send.as_mut().poll(cx);
            }
            Poll::Pending
        })
        .await
        .map_err(|_| HttpError::ConnectionReadTimeout)?
        .map_err(|e| {
            if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::Hyper(e)
            }
        })?
    };
    if let Some(length) = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > RESPONSE_BYTES
    {
        return Err(HttpError::HttpResponseBodySize(Some(length)));
    }
    let done_by = timeouts.done_by;
    let response = response.map(|incoming| {
        CappedBody {
            inner: incoming,
            received: 0,
            limit: RESPONSE_BYTES,
            deadline: Box::pin(tokio::time::sleep_until(done_by)),
            between: timeouts
                .between_bytes
                .map(|d| (d, Box::pin(tokio::time::sleep(d)))),
        }
        .boxed_unsync()
    });
    let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> = Box::new(async move {
        let Some(conn) = conn else { return Ok(()) };
        match tokio::time::timeout_at(done_by, conn).await {
            Err(_) => Err(HttpError::HttpResponseTimeout),
            Ok(Err(e)) => Err(HttpError::Hyper(e)),
            Ok(Ok(())) => Ok(()),
        }
    });
    Ok((response, io))
}

/// A response body that errs past its byte cap, past the deadline, or when the peer goes quiet
/// for longer than the plugin's between-bytes timeout.
struct CappedBody {
    inner: Incoming,
    received: u64,
    limit: u64,
    deadline: Pin<Box<Sleep>>,
    between: Option<(Duration, Pin<Box<Sleep>>)>,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(HttpError::HttpResponseTimeout)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if this.received > this.limit {
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            this.received,
                        )))));
                    }
                }
                if let Some((every, sleep)) = &mut this.between {
                    sleep.as_mut().reset(tokio::time::Instant::now() + *every);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(if e.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::Hyper(e)
            }))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if let Some((_, sleep)) = &mut this.between {
                    ready!(sleep.as_mut().poll(cx));
                    return Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn allow_list_entries_parse_or_name_the_problem() {
        let ok = [
            ("api.example.com:80", "api.example.com:80"),
            ("API.Example.COM.:8080", "api.example.com:8080"),
            ("127.0.0.1:9000", "127.0.0.1:9000"),
            ("[::1]:9000", "[::1]:9000"),
            ("[fd00::1]:443", "[fd00::1]:443"),
            ("localhost:11434", "localhost:11434"),
        ];
        for (entry, want) in ok {
            assert_eq!(HostPort::parse(entry).unwrap().to_string(), want, "{entry}");
        }
        let bad = [
            ("api.example.com", "port is required"),
            ("api.example.com:", "not a port"),
            ("api.example.com:0", "not a port"),
            ("api.example.com:70000", "not a port"),
            ("::1:80", "brackets"),
            ("[::1]", "[address]:port"),
            ("[nope]:80", "not an IPv6 address"),
            ("2130706433:80", "numeric host"),
            ("127.1:80", "numeric host"),
            ("0x7f000001:80", "numeric host"),
            ("exa mple.com:80", "not a host name"),
            ("http://example.com:80", "not a URL"),
            (":80", "not a host name"),
            ("0.0.0.0:8080", "unspecified address"),
            ("0.1.2.3:8080", "unspecified address"),
            ("[::]:8080", "unspecified address"),
            ("[::ffff:0.0.0.0]:8080", "unspecified address"),
            ("[::0.0.0.0]:8080", "unspecified address"),
        ];
        for (entry, needle) in bad {
            let err = HostPort::parse(entry).unwrap_err();
            assert!(
                err.contains(needle),
                "{entry}: {err:?} should say {needle:?}"
            );
        }
        let err = AllowList::parse(&["a.com:1", "b.com"]).unwrap_err();
        assert!(err.starts_with("\"b.com\""), "{err}");
    }

    #[test]
    fn refused_ranges() {
        let refused = [
            "0.0.0.0",
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
        ];
        for ip in refused {
            assert!(
                refused_range(ip.parse().unwrap()).is_some(),
                "{ip} should be refused"
            );
        }
        let reachable = [
            "8.8.8.8",
            "172.32.0.1",
            "172.15.255.255",
            "100.128.0.1",
            "169.253.0.1",
            "192.169.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::",
        ];
        for ip in reachable {
            assert_eq!(refused_range(ip.parse().unwrap()), None, "{ip}");
        }
    }

    fn target(list: &AllowList, url: &str) -> Result<HostPort, Denied> {
        let uri: http::Uri = url.parse().unwrap();
        check_target(list, uri.scheme(), uri.host(), uri.port_u16())
    }

    #[test]
    fn only_listed_http_host_ports_pass_the_first_check() {
        let list = allow(&["127.0.0.1:9000", "model.example.com:80", "[fd00::5]:8080"]);
        for url in [
            "http://127.0.0.1:9000/v1",
            "http://model.example.com/x",
            "http://MODEL.example.com.:80/x",
            "http://[fd00::5]:8080/",
        ] {
            assert!(target(&list, url).is_ok(), "{url}");
        }
        let denied = [
            ("http://127.0.0.1:9001/", "not in allow_hosts"),
            ("http://localhost:9000/", "not in allow_hosts"),
            ("http://[::1]:9000/", "not in allow_hosts"),
            ("http://2130706433:9000/", "not in allow_hosts"),
            ("http://0x7f000001:9000/", "not in allow_hosts"),
            ("http://127.1:9000/", "not in allow_hosts"),
            ("http://[::ffff:127.0.0.1]:9000/", "not in allow_hosts"),
            (
                "http://169.254.169.254/latest/meta-data/",
                "not in allow_hosts",
            ),
            ("https://model.example.com:80/", "plain http only"),
            ("ftp://model.example.com:80/", "plain http only"),
        ];
        for (url, needle) in denied {
            let err = target(&list, url).unwrap_err();
            assert_eq!(err.error().to_string(), "HTTP request denied", "{url}");
            assert!(err.to_string().contains(needle), "{url}: {err}");
        }
        assert_eq!(
            target(&AllowList::default(), "http://127.0.0.1:9000/"),
            Err(Denied::NoNetwork)
        );
    }

    #[test]
    fn resolved_addresses_in_refused_ranges_need_their_own_entry() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        // A listed name that resolves (or is rebound) into a refused range is refused...
        let list = allow(&["localhost:8081", "model.example.com:80"]);
        let localhost = HostPort::parse("localhost:8081").unwrap();
        let err = usable_addrs(
            &list,
            &localhost,
            &[addr("127.0.0.1:8081"), addr("[::1]:8081")],
        )
        .unwrap_err();
        assert!(
            matches!(err, Denied::Prohibited { addr: a, .. } if a == addr("127.0.0.1:8081")),
            "{err:?}"
        );
        assert_eq!(
            err.error().to_string(),
            "destination IP address is prohibited"
        );
        let model = HostPort::parse("model.example.com:80").unwrap();
        for rebound in ["169.254.169.254:80", "10.0.0.7:80", "[::ffff:127.0.0.1]:80"] {
            assert!(
                usable_addrs(&list, &model, &[addr(rebound)]).is_err(),
                "{rebound}"
            );
        }
        // ...public addresses pass, and refused ones are dropped from a mixed answer...
        assert_eq!(
            usable_addrs(
                &list,
                &model,
                &[addr("10.0.0.7:80"), addr("93.184.216.34:80")]
            ),
            Ok(vec![addr("93.184.216.34:80")])
        );
        // ...and an address listed itself is reachable, through its literal or a name.
        let list = allow(&["127.0.0.1:9000", "localhost:9000"]);
        let literal = HostPort::parse("127.0.0.1:9000").unwrap();
        assert_eq!(
            usable_addrs(&list, &literal, &[addr("127.0.0.1:9000")]),
            Ok(vec![addr("127.0.0.1:9000")])
        );
        let name = HostPort::parse("localhost:9000").unwrap();
        assert_eq!(
            usable_addrs(&list, &name, &[addr("[::1]:9000"), addr("127.0.0.1:9000")]),
            Ok(vec![addr("127.0.0.1:9000")])
        );
    }

    #[test]
    fn idempotency_keys_are_header_safe_and_injective() {
        assert_eq!(
            idempotency_key("github", "d-1", "classifier"),
            "github:d-1:classifier"
        );
        assert_eq!(idempotency_key("s", "a b%\n", "h"), "s:a%20b%25%0A:h");
        assert_ne!(
            idempotency_key("s", "a b", "h"),
            idempotency_key("s", "a%20b", "h")
        );
        assert!(HeaderValue::from_str(&idempotency_key("s", "é\u{0}", "h")).is_ok());
    }

    #[test]
    fn a_call_without_a_grant_sends_nothing_and_the_host_sets_the_key() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut hooks = OutboundHooks::new(PluginName::from("p"), None, deadline);
        let request = || {
            Request::builder()
                .uri("http://127.0.0.1:9000/x")
                .header(IDEMPOTENCY_KEY, "plugin-chosen")
                .body(
                    http_body_util::Empty::<Bytes>::new()
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                )
                .unwrap()
        };
        assert_eq!(hooks.admit(&mut request()).unwrap_err(), Denied::NoNetwork);
        hooks.grant(Outbound {
            allow: allow(&["127.0.0.1:9000"]),
            idempotency_key: idempotency_key("s", "e", "p"),
        });
        let mut req = request();
        hooks.admit(&mut req).unwrap();
        let keys: Vec<_> = req.headers().get_all(IDEMPOTENCY_KEY).iter().collect();
        assert_eq!(keys, ["s:e:p"]);
        for _ in 1..REQUESTS_PER_CALL {
            hooks.admit(&mut request()).unwrap();
        }
        assert_eq!(
            hooks.admit(&mut request()).unwrap_err(),
            Denied::TooManyRequests
        );
    }
}
