//! Credentials the host injects into a plugin's outbound requests, so an API key never enters
//! plugin memory (a plugin cannot leak what it never holds, to another listed host or anywhere).
//!
//! Invariants:
//! - One credential per listed `host:port`: it is added only to requests for that exact target,
//!   replacing any value of the same header the plugin set.
//! - Sent only where it cannot be read off the wire: over `https`, or to a listed loopback
//!   `ip:port` (a local service, e.g. in tests). A plain-`http` request to any other credentialed
//!   target is refused ([`Denied::CredentialOverPlainHttp`]), never sent without encryption.
//! - Sent only with a method that does not echo the request back: `GET`, `HEAD`, `POST`, `PUT`,
//!   `PATCH`, `DELETE`, `OPTIONS`. A server or proxy answering `TRACE` (or a look-alike such as
//!   `TRACK`) returns the request it received, injected header and all, as the body the plugin
//!   reads; such a request to a credentialed target is refused ([`Denied::CredentialMethod`]).
//! - The value is a sensitive [`HeaderValue`]: its `Debug` is redacted, it is never logged and
//!   never shown by the admin API; only the header name and target are.
//! - Pure: the value is looked up through the `env` function the caller passes, at load time.

use std::{fmt, net::IpAddr, sync::Arc};

use http::{HeaderName, HeaderValue, Method};

use super::policy::{AllowList, Denied, Host, HostPort, HostPortError};

/// Why a `[plugins.<name>.credentials]` entry cannot be used. Never carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("{entry:?}: {reason}")]
    Target {
        entry: String,
        reason: HostPortError,
    },
    #[error("{0}: is not in allow_hosts; a credential goes only to a listed host:port")]
    NotListed(HostPort),
    /// The name is not shown: a value written there by mistake (`Bearer sk-…`) is a secret.
    #[error(
        "{target}: header is not a valid header name (a name such as Authorization; the value \
         comes from env)"
    )]
    Header { target: HostPort },
    #[error(
        "{target}: {header} is set by the host itself (the request's idempotency key, its \
         framing or its connection) and cannot carry a credential"
    )]
    Reserved {
        target: HostPort,
        header: HeaderName,
    },
    #[error("{target}: environment variable {env} is not set")]
    Missing { target: HostPort, env: String },
    #[error("{target}: environment variable {env} is set but empty")]
    Empty { target: HostPort, env: String },
    #[error(
        "{target}: environment variable {env} starts or ends with whitespace, which no secret \
         or token does (a newline from the file it was read from?)"
    )]
    Whitespace { target: HostPort, env: String },
    #[error("{target}: environment variable {env} is not a valid header value")]
    Value { target: HostPort, env: String },
    #[error("{target}: prefix is not a valid header value (a control character or a newline?)")]
    Prefix { target: HostPort },
    #[error("{0}: has two credentials (spellings of one target); give it one")]
    Duplicate(HostPort),
}

/// One injected header: for requests to `target`, `header: value`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub target: HostPort,
    pub header: HeaderName,
    value: HeaderValue,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: <redacted>", self.target, self.header)
    }
}

impl Credential {
    /// A credential for the listed `entry`: `header` set to `prefix` + the value of `env`.
    pub fn new(
        allow: &AllowList,
        entry: &str,
        header: &str,
        env_name: &str,
        prefix: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, CredentialError> {
        let target = HostPort::parse(entry).map_err(|reason| CredentialError::Target {
            entry: entry.to_owned(),
            reason,
        })?;
        if !allow.entries().contains(&target) {
            return Err(CredentialError::NotListed(target));
        }
        let header = HeaderName::try_from(header).map_err(|_| CredentialError::Header {
            target: target.clone(),
        })?;
        if header == super::policy::IDEMPOTENCY_KEY
            || super::policy::CONNECTION_HEADERS.contains(&header.as_str())
        {
            return Err(CredentialError::Reserved { target, header });
        }
        if HeaderValue::try_from(prefix).is_err() {
            return Err(CredentialError::Prefix { target });
        }
        let secret = env(env_name).ok_or_else(|| CredentialError::Missing {
            target: target.clone(),
            env: env_name.to_owned(),
        })?;
        if secret.trim().is_empty() {
            return Err(CredentialError::Empty {
                target,
                env: env_name.to_owned(),
            });
        }
        if secret.trim() != secret {
            return Err(CredentialError::Whitespace {
                target,
                env: env_name.to_owned(),
            });
        }
        let mut value = HeaderValue::try_from(format!("{prefix}{secret}")).map_err(|_| {
            CredentialError::Value {
                target: target.clone(),
                env: env_name.to_owned(),
            }
        })?;
        value.set_sensitive(true);
        Ok(Self {
            target,
            header,
            value,
        })
    }
}

/// A plugin instance's credentials, at most one per target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    entries: Arc<[Credential]>,
}

impl Credentials {
    /// At most one credential per target.
    pub fn new(entries: Vec<Credential>) -> Result<Self, CredentialError> {
        for (i, credential) in entries.iter().enumerate() {
            if entries[..i].iter().any(|c| c.target == credential.target) {
                return Err(CredentialError::Duplicate(credential.target.clone()));
            }
        }
        Ok(Self {
            entries: entries.into(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The header to inject into a `method` request for `target`, if it has a credential;
    /// refused when the request would carry it in the clear to anything but a loopback address,
    /// or with a method a server may answer by echoing the request.
    pub fn for_request(
        &self,
        target: &HostPort,
        https: bool,
        method: &Method,
    ) -> Result<Option<(&HeaderName, &HeaderValue)>, Denied> {
        let Some(credential) = self.entries.iter().find(|c| &c.target == target) else {
            return Ok(None);
        };
        let loopback = matches!(target.host, Host::Ip(ip) if is_loopback(ip));
        if !https && !loopback {
            return Err(Denied::CredentialOverPlainHttp(target.clone()));
        }
        if !CREDENTIAL_METHODS.contains(method) {
            return Err(Denied::CredentialMethod {
                target: target.clone(),
                method: method.to_string(),
            });
        }
        Ok(Some((&credential.header, &credential.value)))
    }
}

/// The methods a credential is sent with: none of them has a server echo the request back.
const CREDENTIAL_METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-0123";

    fn env(name: &str) -> Option<String> {
        (name == "API_KEY").then(|| KEY.to_owned())
    }

    fn allow() -> AllowList {
        AllowList::parse(&[
            "api.example.com:443",
            "api.example.com:80",
            "127.0.0.1:9000",
        ])
        .unwrap()
    }

    fn credential(entry: &str) -> Result<Credential, CredentialError> {
        Credential::new(&allow(), entry, "Authorization", "API_KEY", "Bearer ", &env)
    }

    /// Why a credential for `api.example.com:443` with these fields is refused.
    fn refused(
        header: &str,
        var: &str,
        prefix: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> CredentialError {
        Credential::new(&allow(), "api.example.com:443", header, var, prefix, env).unwrap_err()
    }

    /// A bad prefix is named as the prefix, not blamed on the variable's value.
    #[test]
    fn a_prefix_that_is_no_header_value_is_named() {
        let err = refused("authorization", "API_KEY", "Bearer\n", &env);
        assert_eq!(
            err.to_string(),
            "api.example.com:443: prefix is not a valid header value (a control character or a \
             newline?)"
        );
    }

    /// An empty variable (a substitution that found nothing) would send an empty credential.
    #[test]
    fn an_empty_variable_is_named() {
        let empty = |_: &str| Some(" ".to_owned());
        let err = refused("authorization", "API_KEY", "Bearer ", &empty);
        assert_eq!(
            err.to_string(),
            "api.example.com:443: environment variable API_KEY is set but empty"
        );
    }

    /// A value with whitespace around it (a newline from a file) is refused, as every other
    /// secret from the environment is.
    #[test]
    fn a_variable_with_whitespace_around_it_is_refused() {
        for padded in ["sk-test-0123\n", " sk-test-0123", "sk-test-0123\t"] {
            let padded_env = |_: &str| Some(padded.to_owned());
            let err = refused("authorization", "API_KEY", "Bearer ", &padded_env);
            assert!(matches!(err, CredentialError::Whitespace { .. }), "{err:?}");
            assert!(!err.to_string().contains("sk-test"), "{err}");
        }
    }

    /// A value written as the header's name by mistake is not echoed.
    #[test]
    fn a_header_name_that_is_no_name_is_not_echoed() {
        let err = refused("Authorization: Bearer sk-live-9876", "API_KEY", "", &env);
        assert!(matches!(err, CredentialError::Header { .. }), "{err:?}");
        assert!(!err.to_string().contains("sk-live"), "{err}");
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = refused("authorization", "NOPE", "", &env);
        assert!(err.to_string().contains("NOPE"), "{err}");
    }

    #[test]
    fn a_credential_goes_only_to_a_listed_target() {
        assert!(matches!(
            credential("other.example.com:443"),
            Err(CredentialError::NotListed(_))
        ));
    }

    #[test]
    fn the_value_never_shows_in_debug_output() {
        let credentials =
            Credentials::new(vec![credential("api.example.com:443").unwrap()]).unwrap();
        let shown = format!("{credentials:?}");
        assert!(
            !shown.contains(KEY) && shown.contains("authorization"),
            "{shown}"
        );
    }

    #[test]
    fn it_is_injected_over_https_and_to_loopback_only() {
        let credentials = Credentials::new(vec![
            credential("api.example.com:443").unwrap(),
            credential("api.example.com:80").unwrap(),
            credential("127.0.0.1:9000").unwrap(),
        ])
        .unwrap();
        let target = |e: &str| HostPort::parse(e).unwrap();
        let (name, value) = credentials
            .for_request(&target("api.example.com:443"), true, &Method::POST)
            .unwrap()
            .unwrap();
        assert_eq!(
            (name.as_str(), value.to_str().unwrap()),
            ("authorization", "Bearer sk-test-0123")
        );
        assert!(value.is_sensitive());
        assert_eq!(
            credentials.for_request(&target("api.example.com:80"), false, &Method::GET),
            Err(Denied::CredentialOverPlainHttp(target(
                "api.example.com:80"
            )))
        );
        assert!(
            credentials
                .for_request(&target("127.0.0.1:9000"), false, &Method::GET)
                .unwrap()
                .is_some()
        );
        assert!(
            credentials
                .for_request(&target("unlisted.example.com:443"), true, &Method::TRACE)
                .unwrap()
                .is_none()
        );
    }

    /// A server answering `TRACE` (Apache's default) sends the request back as its body,
    /// credential and all; a look-alike method may be treated the same way by a proxy.
    #[test]
    fn it_is_never_sent_with_a_method_that_echoes_the_request() {
        let credentials =
            Credentials::new(vec![credential("api.example.com:443").unwrap()]).unwrap();
        let target = HostPort::parse("api.example.com:443").unwrap();
        for method in ["TRACE", "TRACK", "CONNECT", "DEBUG"] {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let denied = credentials.for_request(&target, true, &method).unwrap_err();
            assert_eq!(
                denied.to_string(),
                format!(
                    "api.example.com:443 has a host-injected credential, which is not sent with \
                     {method} (only GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS)"
                )
            );
        }
        for method in CREDENTIAL_METHODS {
            assert!(
                credentials
                    .for_request(&target, true, &method)
                    .unwrap()
                    .is_some(),
                "{method}"
            );
        }
        // Another target takes any method: it has nothing injected to echo.
        let other = HostPort::parse("api.example.com:80").unwrap();
        assert_eq!(
            credentials.for_request(&other, false, &Method::TRACE),
            Ok(None)
        );
    }

    #[test]
    fn one_target_has_at_most_one_credential() {
        let twice = vec![
            credential("api.example.com:443").unwrap(),
            credential("API.example.com.:443").unwrap(),
        ];
        assert!(matches!(
            Credentials::new(twice),
            Err(CredentialError::Duplicate(_))
        ));
    }

    #[test]
    fn host_set_headers_cannot_carry_a_credential() {
        for header in [
            "Idempotency-Key",
            "Host",
            "Content-Length",
            "Transfer-Encoding",
            "Connection",
            "Upgrade",
        ] {
            let err = refused(header, "API_KEY", "", &env);
            assert!(matches!(err, CredentialError::Reserved { .. }), "{err:?}");
        }
    }
}
