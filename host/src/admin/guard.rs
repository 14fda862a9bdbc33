//! Browser defences of the admin listener: the `Host` check (against DNS rebinding) and the
//! `Origin` check (against cross-site requests), on top of the bearer token.
//!
//! Invariants:
//! - `/admin/*` answers only requests whose `Host` names this listener: an IP literal of the
//!   address it is bound to (any IP when bound to `0.0.0.0`/`::`, any loopback IP when bound to
//!   loopback), `localhost` (when bound to loopback or to all addresses), or a name listed in
//!   `server.admin_hosts`. A rebinding page's requests carry its own domain name, so they are
//!   refused whatever address that name resolves to.
//! - No route (not even `/healthz` and `/metrics`) answers a request a browser marks as coming
//!   from another origin: an `Origin` other than `http://<Host>` or `https://<Host>` (behind a
//!   TLS-terminating proxy), or `Sec-Fetch-Site` of
//!   `cross-site`/`same-site`. Non-browser clients (the CLI, curl, probes) send neither.
//! - The host checked is the request target's authority when it has one (absolute form), else
//!   its one `Host` header; a repeated `Host`, `Origin` or `Sec-Fetch-Site` is refused.
//! - A refusal is a 403 `{"error":"forbidden","detail":...}` and acts on nothing.

use std::net::{IpAddr, SocketAddr};

use axum::{
    Json,
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};

use super::api::ErrorBody;

/// What a request must match to reach the admin listener.
#[derive(Debug, Clone)]
pub struct Guard {
    /// The address the admin listener is bound to.
    pub local: SocketAddr,
    /// `server.admin_hosts`: further names (lowercase) `Host` may carry.
    pub names: Vec<String>,
}

/// A 403 with the contract's error shape.
pub fn forbidden(detail: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Json(ErrorBody {
            detail: Some(detail.to_owned()),
            error: "forbidden".to_owned(),
        }),
    )
        .into_response()
}

/// The host a request is for: the request target's authority when it has one (absolute form:
/// it overrides `Host`, RFC 9112 §3.2.2), else its one `Host` header. A repeated `Host` is
/// refused: which of them a check read would be a guess.
fn request_host<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Result<&'a str, &'static str> {
    if let Some(authority) = uri.authority() {
        return Ok(authority.as_str());
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next().ok_or("a Host header is required")?;
    if hosts.next().is_some() {
        return Err("a repeated Host header is refused");
    }
    host.to_str().map_err(|_| "the Host header is malformed")
}

/// The one value of `name`, if any; a repeated one is refused.
fn at_most_one<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<Option<&'a HeaderValue>, &'static str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err("a repeated Origin or Sec-Fetch-Site header is refused");
    }
    Ok(first)
}

impl Guard {
    /// `Err(detail)` unless the request's host ([`request_host`]) names this listener.
    pub fn check_host(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), &'static str> {
        let host = request_host(headers, uri)?;
        let name = host_name(host).ok_or("the Host header is malformed")?;
        if self.names.contains(&name) {
            return Ok(());
        }
        let local = self.local.ip();
        let ok = match name.parse::<IpAddr>() {
            Ok(ip) => {
                local.is_unspecified() || ip == local || (ip.is_loopback() && local.is_loopback())
            }
            Err(_) => {
                (name == "localhost" || name.ends_with(".localhost"))
                    && (local.is_loopback() || local.is_unspecified())
            }
        };
        if ok {
            Ok(())
        } else {
            Err(
                "the Host header does not name this admin listener (add the name to server.admin_hosts)",
            )
        }
    }

    /// `Err(detail)` if a browser says the request comes from another origin (or says it twice).
    pub fn check_origin(headers: &HeaderMap, uri: &Uri) -> Result<(), &'static str> {
        if let Some(site) = at_most_one(headers, "sec-fetch-site")?
            && (site.as_bytes().eq_ignore_ascii_case(b"cross-site")
                || site.as_bytes().eq_ignore_ascii_case(b"same-site"))
        {
            return Err("cross-site requests are refused");
        }
        let Some(origin) = at_most_one(headers, "origin")? else {
            return Ok(());
        };
        // Either scheme: behind a TLS-terminating proxy the browser's origin is
        // `https://<Host>` while hookd itself speaks http. The Host was checked already, and a
        // page of the same host and port under the other scheme is this listener's own.
        let host = request_host(headers, uri).ok().map(str::as_bytes);
        let same = host.is_some_and(|host| {
            let origin = origin.as_bytes();
            [&b"http://"[..], b"https://"].iter().any(|scheme| {
                origin.len() == host.len() + scheme.len()
                    && origin[..scheme.len()].eq_ignore_ascii_case(scheme)
                    && origin[scheme.len()..].eq_ignore_ascii_case(host)
            })
        });
        if same {
            Ok(())
        } else {
            Err("cross-origin requests are refused")
        }
    }
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]`, `[v6]:port`), lowercased and
/// without a trailing dot; `None` if it is not one of those forms.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let bracketed = host.starts_with('[');
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (inside, port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    let valid = !name.is_empty()
        && (bracketed || !name.contains(':'))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    valid.then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    /// An origin-form request target, as browsers and the CLI send.
    fn root() -> Uri {
        Uri::from_static("/admin/events")
    }

    fn guard(local: &str, names: &[&str]) -> Guard {
        Guard {
            local: local.parse().unwrap(),
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    /// A repeated Host, Origin or Sec-Fetch-Site is refused (which one a check read would be a
    /// guess), and an absolute-form target's authority is the host, as RFC 9112 says.
    #[test]
    fn repeated_guard_headers_and_a_foreign_absolute_target_are_refused() {
        let loopback = guard("127.0.0.1:8081", &[]);
        let mut twice = headers(&[("host", "localhost:8081")]);
        twice.append(header::HOST, HeaderValue::from_static("evil.example"));
        assert!(loopback.check_host(&twice, &root()).is_err());
        let absolute = Uri::from_static("http://evil.example/admin/events");
        let local = headers(&[("host", "localhost:8081")]);
        assert!(loopback.check_host(&local, &absolute).is_err());
        let ours = Uri::from_static("http://localhost:8081/admin/events");
        assert_eq!(loopback.check_host(&local, &ours), Ok(()));
        for name in ["origin", "sec-fetch-site"] {
            let mut h = headers(&[("host", "localhost:8081")]);
            let (first, second) = if name == "origin" {
                ("http://localhost:8081", "http://evil")
            } else {
                ("none", "cross-site")
            };
            h.append(name, HeaderValue::from_static(first));
            h.append(name, HeaderValue::from_static(second));
            assert!(Guard::check_origin(&h, &root()).is_err(), "{name}");
        }
    }

    #[test]
    fn host_names_this_listener_or_is_refused() {
        let loopback = guard("127.0.0.1:8081", &[]);
        for ok in [
            "127.0.0.1:8081",
            "127.0.0.1",
            "127.0.0.2:9",
            "localhost:8081",
            "LOCALHOST",
            "localhost.:8081",
            "app.localhost:8081",
            "[::1]:8081",
        ] {
            assert_eq!(
                loopback.check_host(&headers(&[("host", ok)]), &root()),
                Ok(()),
                "{ok}"
            );
        }
        for bad in [
            "evil.example:8081",
            "evil.example",
            "localhost.evil.example:8081",
            "10.0.0.1:8081",
            "127.0.0.1:80:80",
            "127.0.0.1:x",
            "[::1",
            "",
        ] {
            assert!(
                loopback
                    .check_host(&headers(&[("host", bad)]), &root())
                    .is_err(),
                "{bad}"
            );
        }
        assert!(loopback.check_host(&HeaderMap::new(), &root()).is_err());

        let everywhere = guard("0.0.0.0:8081", &["hookd.internal"]);
        for ok in [
            "10.1.2.3:8081",
            "[fd00::1]:8081",
            "hookd.internal:8081",
            "localhost",
        ] {
            assert_eq!(
                everywhere.check_host(&headers(&[("host", ok)]), &root()),
                Ok(()),
                "{ok}"
            );
        }
        assert!(
            everywhere
                .check_host(&headers(&[("host", "evil.example:8081")]), &root())
                .is_err()
        );

        let one = guard("10.0.0.5:8081", &[]);
        assert_eq!(
            one.check_host(&headers(&[("host", "10.0.0.5:8081")]), &root()),
            Ok(())
        );
        assert!(
            one.check_host(&headers(&[("host", "10.0.0.6:8081")]), &root())
                .is_err()
        );
        assert!(
            one.check_host(&headers(&[("host", "localhost:8081")]), &root())
                .is_err()
        );
    }

    #[test]
    fn only_a_same_origin_browser_request_passes() {
        assert_eq!(
            Guard::check_origin(&headers(&[("host", "127.0.0.1:8081")]), &root()),
            Ok(())
        );
        let same = headers(&[
            ("host", "127.0.0.1:8081"),
            ("origin", "http://127.0.0.1:8081"),
        ]);
        assert_eq!(Guard::check_origin(&same, &root()), Ok(()));
        // A TLS-terminating proxy passing the Host on: the browser's origin is https.
        let proxied = headers(&[
            ("host", "hookd.example"),
            ("origin", "https://hookd.example"),
        ]);
        assert_eq!(Guard::check_origin(&proxied, &root()), Ok(()));
        for origin in [
            "https://127.0.0.1:80811",
            "httpss://127.0.0.1:8081",
            "ftp://127.0.0.1:8081",
            "https://evil.example",
            "null",
            "http://127.0.0.1:8082",
            "http://127.0.0.1:80811",
            "http://localhost:8081",
        ] {
            let h = headers(&[("host", "127.0.0.1:8081"), ("origin", origin)]);
            assert!(Guard::check_origin(&h, &root()).is_err(), "{origin}");
        }
        assert!(Guard::check_origin(&headers(&[("origin", "http://x")]), &root()).is_err());
        let cross = headers(&[("host", "127.0.0.1:8081"), ("sec-fetch-site", "cross-site")]);
        assert!(Guard::check_origin(&cross, &root()).is_err());
        let none = headers(&[("host", "127.0.0.1:8081"), ("sec-fetch-site", "none")]);
        assert_eq!(Guard::check_origin(&none, &root()), Ok(()));
    }
}
