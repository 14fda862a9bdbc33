//! Outbound policy: what a handler may reach over HTTP, decided without any I/O.
//!
//! Invariants:
//! - Pure: parsing, range checks and target checks touch no socket, resolver or clock, so every
//!   rule here is unit-tested on its own; [`super::transport`] only ever connects to addresses
//!   [`usable_addrs`] returned.
//! - A target passes only if its scheme is `http` or `https`, its `host:port` (port 80 or 443
//!   when absent) is literally in the [`AllowList`], and the address it will connect to is outside every
//!   [`refused_range`] — unless that exact `ip:port` is itself listed. An empty list grants no
//!   network at all.
//! - Allow-list entries are strict: the port is required, numeric host spellings other than a
//!   dotted quad are refused (some resolvers read `127.1` as loopback), and unspecified
//!   addresses (`0.0.0.0/8`, `::`, their IPv4-mapped forms) are refused because connecting to
//!   one reaches this machine.
//! - A [`Denied`] names the `host:port` at most, never the path or query (which may carry
//!   secrets), so it is safe to log.
//!
//! The plugin-facing statement of this policy is the `plugin_sdk::http` module documentation.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use http::{HeaderName, uri::Scheme};

/// Requests one call may send; more are refused (a loop cannot hammer a listed host forever).
pub const REQUESTS_PER_CALL: u32 = 64;
/// The header every outgoing request carries.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The headers of a message's framing and its connection (RFC 9110 §7.6.1 and RFC 9112),
/// which hyper writes: neither a parser's answer nor a credential the host injects may set
/// one.
pub const CONNECTION_HEADERS: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "host",
];

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
        // An address with a trailing dot is no name to resolve, and no listed address either:
        // kept as written, so a refusal names what was asked for, dot and all.
        if name.parse::<Ipv4Addr>().is_ok() {
            return Host::Name(host.to_owned());
        }
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

/// Why an allow-list entry is not a `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPortError {
    #[error("an entry is `host:port`, not a URL")]
    Url,
    #[error("an entry is `host:port`; the port is required")]
    NoPort,
    #[error("an IPv6 entry is `[address]:port`")]
    Ipv6NoPort,
    #[error("IPv6 addresses go in brackets: `[address]:port`")]
    Ipv6Unbracketed,
    #[error("{0:?} is not an IPv6 address")]
    NotIpv6(String),
    #[error("{0:?} is not a host name or IP address")]
    NotHost(String),
    #[error(
        "{0:?} is a numeric host that is not a dotted-quad IPv4 address; write the address as \
         a.b.c.d"
    )]
    Numeric(String),
    #[error(
        "{0} is an unspecified address, which connects to this machine; list the address or \
         name of the host to reach"
    )]
    Unspecified(IpAddr),
    #[error("{0:?} is not a port (1-65535)")]
    Port(String),
}

/// An `allow_hosts` list with an entry that does not parse: the entry and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?}: {reason}")]
pub struct AllowListError {
    pub entry: String,
    pub reason: HostPortError,
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
    pub fn parse(entry: &str) -> Result<Self, HostPortError> {
        if entry.contains("://") || entry.contains('/') {
            return Err(HostPortError::Url);
        }
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (ip, port) = rest.split_once("]:").ok_or(HostPortError::Ipv6NoPort)?;
            let ip: Ipv6Addr = ip
                .parse()
                .map_err(|_| HostPortError::NotIpv6(ip.to_owned()))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = entry.rsplit_once(':').ok_or(HostPortError::NoPort)?;
            if host.contains(':') {
                return Err(HostPortError::Ipv6Unbracketed);
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
            return Err(HostPortError::Unspecified(ip));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| HostPortError::Port(port.to_owned()))?;
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
fn check_name(host: &str) -> Result<String, HostPortError> {
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
        return Err(HostPortError::NotHost(host.to_owned()));
    }
    let last = name.rsplit('.').next().unwrap_or("");
    if !last.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(HostPortError::Numeric(host.to_owned()));
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
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, AllowListError> {
        let entries = entries
            .iter()
            .map(|e| {
                let e = e.as_ref();
                HostPort::parse(e).map_err(|reason| AllowListError {
                    entry: e.to_owned(),
                    reason,
                })
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

/// A public address that answers, inside Azure, with the instance's own configuration and
/// metadata (its "WireServer"): as much a metadata endpoint as `169.254.169.254`.
const AZURE_PLATFORM: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 16);

/// Why an address may not be reached unless it is listed itself, or `None` if it may.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => refused_v4(ip),
        IpAddr::V6(ip) => refused_v6(ip),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    if ip == AZURE_PLATFORM {
        return Some("Azure's platform endpoint (168.63.129.16, an instance's own metadata)");
    }
    Some(match (a, b) {
        (0, _) => "unspecified (0.0.0.0/8)",
        (127, _) => "loopback (127.0.0.0/8)",
        (10, _) => "private (10.0.0.0/8)",
        (172, 16..=31) => "private (172.16.0.0/12)",
        (192, 168) => "private (192.168.0.0/16)",
        (169, 254) => "link-local (169.254.0.0/16, cloud metadata)",
        (100, 64..=127) => "shared address space (CGNAT, 100.64.0.0/10)",
        (198, 18..=19) => "benchmarking (198.18.0.0/15)",
        (192, 0) if c == 0 => "IETF protocol assignments (192.0.0.0/24, some clouds' metadata)",
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
        _ if segments[..3] == [0x64, 0xff9b, 1] => "local-use NAT64 (64:ff9b:1::/48)",
        _ if ip.is_loopback() => "loopback (::1)",
        s if s & 0xfe00 == 0xfc00 => "unique-local (fc00::/7)",
        s if s & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        s if s & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        s if s & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        _ => return None,
    })
}

/// Why a request was refused. The message names the host, never the path or query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The plugin has no grant: a parser, or a handler with an empty `allow_hosts`.
    #[error(
        "the plugin has no network grant here (parsers never have one; a handler has one only \
         with a non-empty allow_hosts)"
    )]
    NoNetwork,
    /// Only `http` and `https` are spoken.
    #[error("scheme {0:?} is not supported: hookd's outbound HTTP speaks http and https")]
    Scheme(String),
    /// The request has no host.
    #[error("the request names no host")]
    NoHost,
    /// The authority carries userinfo (`user@host`), which would reach the server's `Host`
    /// header as written (RFC 9110 forbids it there); credentials go in a header.
    #[error("the request's authority carries userinfo (user@host): send credentials in a header")]
    Userinfo,
    /// `host:port` is not in the allow-list.
    #[error("{0} is not in allow_hosts")]
    NotListed(HostPort),
    /// Every address the host resolved to is in a refused range and not itself listed.
    #[error(
        "{target} resolves to {addr}, which is {range}; list {addr} itself in allow_hosts to \
         reach it"
    )]
    Prohibited {
        target: HostPort,
        addr: SocketAddr,
        range: &'static str,
    },
    /// A credentialed target asked for over plain `http` (not loopback): the credential would
    /// cross the network in the clear.
    #[error("{0} has a host-injected credential, which is sent only over https")]
    CredentialOverPlainHttp(HostPort),
    /// A credentialed target asked for with a method a server may answer by echoing the
    /// request, injected header and all (`TRACE`, or one not in the list).
    #[error(
        "{target} has a host-injected credential, which is not sent with {method} (only GET, \
         HEAD, POST, PUT, PATCH, DELETE and OPTIONS)"
    )]
    CredentialMethod { target: HostPort, method: String },
    /// The call already sent its share of requests.
    #[error("the call already sent {REQUESTS_PER_CALL} requests (the per-call cap)")]
    TooManyRequests,
    /// Every outbound socket the host allows, all plugin calls together, is open.
    #[error(
        "hookd's outbound sockets, all plugins' together, are at their cap ({0}, set from the \
         open-files limit): try again later"
    )]
    HostSockets(usize),
    /// The plugin holds its share of them.
    #[error(
        "this plugin holds its share of hookd's outbound sockets ({0}: the cap, set from the \
         open-files limit, over the plugins that may send requests): try again later"
    )]
    PluginSockets(usize),
}

/// Checks a request's target against the grant before anything is resolved. The target's
/// port defaults to the scheme's (80 for `http`, 443 for `https`).
pub fn check_target(
    allow: &AllowList,
    scheme: Option<&Scheme>,
    host: Option<&str>,
    port: Option<u16>,
) -> Result<HostPort, Denied> {
    if allow.is_empty() {
        return Err(Denied::NoNetwork);
    }
    let default_port = match scheme {
        Some(s) if *s == Scheme::HTTP => 80,
        Some(s) if *s == Scheme::HTTPS => 443,
        other => {
            return Err(Denied::Scheme(
                other.map_or_else(|| "none".to_owned(), |s| s.to_string()),
            ));
        }
    };
    let host = Host::from_url_host(host.filter(|h| !h.is_empty()).ok_or(Denied::NoHost)?);
    let target = HostPort {
        host,
        port: port.unwrap_or(default_port),
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
    /// The plugin's TLS client (its trust roots), for `https` targets.
    pub tls: Arc<rustls::ClientConfig>,
    /// Headers the host adds for particular targets ([`super::credentials`]).
    pub credentials: super::credentials::Credentials,
    /// The value of every request's `Idempotency-Key` ([`idempotency_key`]).
    pub idempotency_key: String,
    /// Where each request's result is counted (`hookd_outbound_requests_total`).
    pub meter: crate::telemetry::OutboundMeter,
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn allow(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn allow_list_entries_parse_to_their_canonical_form() {
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
    }

    #[test]
    fn malformed_allow_list_entries_are_refused_with_their_reason() {
        use HostPortError as E;
        let unspecified = |ip: &str| E::Unspecified(ip.parse().unwrap());
        let bad = [
            ("api.example.com", E::NoPort),
            ("api.example.com:", E::Port("".into())),
            ("api.example.com:0", E::Port("0".into())),
            ("api.example.com:70000", E::Port("70000".into())),
            ("::1:80", E::Ipv6Unbracketed),
            ("[::1]", E::Ipv6NoPort),
            ("[nope]:80", E::NotIpv6("nope".into())),
            ("2130706433:80", E::Numeric("2130706433".into())),
            ("127.1:80", E::Numeric("127.1".into())),
            ("0x7f000001:80", E::Numeric("0x7f000001".into())),
            ("exa mple.com:80", E::NotHost("exa mple.com".into())),
            ("http://example.com:80", E::Url),
            (":80", E::NotHost("".into())),
            ("0.0.0.0:8080", unspecified("0.0.0.0")),
            ("0.1.2.3:8080", unspecified("0.1.2.3")),
            ("[::]:8080", unspecified("::")),
            ("[::ffff:0.0.0.0]:8080", unspecified("::ffff:0.0.0.0")),
            ("[::0.0.0.0]:8080", unspecified("::")),
        ];
        for (entry, want) in bad {
            assert_eq!(HostPort::parse(entry), Err(want), "{entry}");
        }
    }

    #[test]
    fn an_allow_list_error_names_the_entry_at_fault() {
        let err = AllowList::parse(&["a.com:1", "b.com"]).unwrap_err();
        assert_eq!(
            err,
            AllowListError {
                entry: "b.com".into(),
                reason: HostPortError::NoPort
            }
        );
        assert!(err.to_string().starts_with("\"b.com\": "), "{err}");
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
            "198.18.0.1",
            "198.19.255.255",
            "192.0.0.192",
            "192.0.0.1",
            "168.63.129.16",
            "::ffff:168.63.129.16",
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
            "64:ff9b:1::808:808",
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
            "198.17.255.255",
            "198.20.0.1",
            "192.0.1.1",
            "192.0.2.1",
            "168.63.129.17",
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
    fn listed_http_host_ports_pass_the_first_check() {
        let list = allow(&["127.0.0.1:9000", "model.example.com:80", "[fd00::5]:8080"]);
        for url in [
            "http://127.0.0.1:9000/v1",
            "http://model.example.com/x",
            "http://MODEL.example.com.:80/x",
            "http://[fd00::5]:8080/",
        ] {
            assert!(target(&list, url).is_ok(), "{url}");
        }
    }

    #[test]
    fn other_spellings_of_a_listed_host_are_not_listed() {
        let list = allow(&["127.0.0.1:9000", "model.example.com:80"]);
        for url in [
            "http://127.0.0.1:9001/",
            "http://localhost:9000/",
            "http://[::1]:9000/",
            "http://2130706433:9000/",
            "http://0x7f000001:9000/",
            "http://127.1:9000/",
            "http://[::ffff:127.0.0.1]:9000/",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let err = target(&list, url).unwrap_err();
            assert!(matches!(err, Denied::NotListed(_)), "{url}: {err:?}");
            assert!(err.to_string().ends_with("is not in allow_hosts"), "{url}");
        }
        // Refused as written: not as the listed address it is not.
        let err = target(&list, "http://127.0.0.1.:9000/").unwrap_err();
        assert_eq!(err.to_string(), "127.0.0.1.:9000 is not in allow_hosts");
    }

    #[test]
    fn a_refusal_names_the_host_port_but_never_the_path_or_query() {
        let list = allow(&["model.example.com:80"]);
        let err = target(&list, "http://model.example.com:81/secret?token=t0k").unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("model.example.com:81")
                && !message.contains("secret")
                && !message.contains("t0k"),
            "{message}"
        );
    }

    #[test]
    fn https_defaults_to_port_443_and_http_to_80() {
        let list = allow(&["model.example.com:443", "plain.example.com:80"]);
        assert_eq!(
            target(&list, "https://model.example.com/v1").map(|t| t.port),
            Ok(443)
        );
        assert_eq!(
            target(&list, "http://plain.example.com/").map(|t| t.port),
            Ok(80)
        );
        assert!(matches!(
            target(&list, "http://model.example.com/"),
            Err(Denied::NotListed(_))
        ));
    }

    #[test]
    fn schemes_other_than_http_and_https_are_refused() {
        let list = allow(&["model.example.com:80"]);
        for (url, scheme) in [
            ("ftp://model.example.com:80/", "ftp"),
            ("ws://model.example.com:80/", "ws"),
        ] {
            assert_eq!(
                target(&list, url),
                Err(Denied::Scheme(scheme.into())),
                "{url}"
            );
        }
    }

    #[test]
    fn an_empty_allow_list_is_no_network() {
        assert_eq!(
            target(&AllowList::default(), "http://127.0.0.1:9000/"),
            Err(Denied::NoNetwork)
        );
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_listed_name_resolving_into_a_refused_range_is_prohibited() {
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
        let model = HostPort::parse("model.example.com:80").unwrap();
        for rebound in ["169.254.169.254:80", "10.0.0.7:80", "[::ffff:127.0.0.1]:80"] {
            assert!(
                usable_addrs(&list, &model, &[addr(rebound)]).is_err(),
                "{rebound}"
            );
        }
    }

    #[test]
    fn refused_addresses_are_dropped_from_a_mixed_answer() {
        let list = allow(&["model.example.com:80"]);
        let model = HostPort::parse("model.example.com:80").unwrap();
        assert_eq!(
            usable_addrs(
                &list,
                &model,
                &[addr("10.0.0.7:80"), addr("93.184.216.34:80")]
            ),
            Ok(vec![addr("93.184.216.34:80")])
        );
    }

    #[test]
    fn an_address_listed_itself_is_reachable_through_its_literal_or_a_name() {
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
}
