//! The host side of `wasi:http/outgoing-handler`: per-call hooks that put every request through
//! [`crate::outbound::policy`] and send it with [`crate::outbound::transport`], translating
//! their outcomes into `wasi:http` error codes.
//!
//! Invariants:
//! - Nothing leaves without a grant: a call starts with none ([`OutboundHooks::new`]) and only a
//!   handler attempt is given one ([`Outbound`], by `dispatch`); parsers never get network.
//! - Every admitted request carries `Idempotency-Key` ([`IDEMPOTENCY_KEY`]), set here over any
//!   value the plugin chose, so a retried attempt is recognisable downstream; a host-injected
//!   credential for the target is set here too, after the guest let go of the request, so its
//!   value never enters guest memory.
//! - `https` requests go through the plugin's own TLS client ([`Outbound::tls`]); a certificate
//!   the roots do not vouch for reaches the guest as `TLS-certificate-error`.
//! - A refusal reaches the guest as a `wasi:http` error code, its reason through
//!   `network.last-refusal` (0.3.0) and the attempt's stored error, and is logged with the
//!   plugin, the event and the refused `host:port` (never the path or query) — once per call: a call's
//!   refusals are counted and logged as one line when the call ends (the first refusal's
//!   reason and the count), so a loop of refused requests cannot flood the host log.
//! - Every connection holds a slot of the host-wide [`SocketPool`] from before its connect to
//!   its close; a request that finds none free is refused, so no plugin can use up the file
//!   descriptors the listeners and the database need. Every DNS lookup holds a slot of
//!   [`Lookups`] until the resolver returns, so no plugin can fill the blocking threads with
//!   lookups that never answer.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use http::{HeaderValue, Request, Response, uri::Scheme};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
    p2::bindings::http::types::ErrorCode,
};

use super::host::HostState;
use crate::{
    ids::{EventId, PluginName},
    outbound::{
        lookups::Lookups,
        policy::{
            AllowList, Denied, HostPort, IDEMPOTENCY_KEY, Outbound, REQUESTS_PER_CALL,
            check_target, usable_addrs,
        },
        sockets::SocketPool,
        transport::{self, Asked, Connector, Timeouts, TransportError},
    },
    telemetry::{OutboundMeter, OutboundResult},
};

/// The `wasi:http` error the guest sees for a refusal. The host's socket cap is not the
/// plugin's doing and passes: it is an internal error carrying the reason, which the SDK (and
/// any client) takes as a failure to retry, not as the refusal of a request that will be
/// refused again (`connection-limit-reached`, which the SDK makes permanent, dead-lettered
/// other plugins' events while one plugin held the sockets).
fn denied_error(denied: &Denied) -> HttpError {
    match denied {
        Denied::Prohibited { .. } => HttpError::DestinationIpProhibited,
        Denied::HostSockets(_) | Denied::PluginSockets(_) => {
            HttpError::InternalError(Some(denied.to_string()))
        }
        Denied::TooManyRequests => HttpError::ConnectionLimitReached,
        Denied::NoNetwork
        | Denied::Scheme(_)
        | Denied::NoHost
        | Denied::Userinfo
        | Denied::NotListed(_)
        | Denied::CredentialOverPlainHttp(_)
        | Denied::CredentialMethod { .. } => HttpError::HttpRequestDenied,
    }
}

/// The `wasi:http` error the guest sees for a transport failure.
fn transport_error(error: TransportError) -> HttpError {
    match error {
        TransportError::DnsTimeout => HttpError::DnsTimeout,
        TransportError::Dns(e) => HttpError::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        },
        TransportError::NoAddress => HttpError::DestinationNotFound,
        TransportError::ConnectTimeout => HttpError::ConnectionTimeout,
        TransportError::Connect(e) => HttpError::Connect(e),
        // A handshake that did not finish in time may finish next time: a timeout, not TLS.
        TransportError::TlsTimeout => HttpError::ConnectionTimeout,
        TransportError::Tls(e) => tls_error(e),
        // The connection failed under TLS (closed or reset mid-handshake: a server restarting,
        // a balancer dropping it): what a plain connection's failure is, to retry, not a TLS
        // refusal.
        TransportError::TlsIo(_) => HttpError::ConnectionTerminated,
        TransportError::InvalidUri => HttpError::HttpRequestUriInvalid,
        TransportError::FirstByteTimeout | TransportError::Stalled => {
            HttpError::ConnectionReadTimeout
        }
        TransportError::ResponseTimeout => HttpError::HttpResponseTimeout,
        TransportError::TooLarge(size) => HttpError::HttpResponseBodySize(Some(size)),
        // Too long, or too many fields: the size is not the one thing to say.
        TransportError::HeadTooLarge => HttpError::HttpResponseHeaderSectionSize(None),
        TransportError::WireTooLarge => HttpError::HttpProtocolError,
        TransportError::Http(e) => HttpError::Hyper(e),
    }
}

/// How a failed request is counted in `hookd_outbound_requests_total`.
fn counted(error: &TransportError) -> OutboundResult {
    match error {
        TransportError::DnsTimeout
        | TransportError::ConnectTimeout
        | TransportError::TlsTimeout
        | TransportError::FirstByteTimeout
        | TransportError::Stalled
        | TransportError::ResponseTimeout => OutboundResult::Timeout,
        TransportError::Tls(_) | TransportError::TlsIo(_) => OutboundResult::TlsError,
        TransportError::Dns(_)
        | TransportError::NoAddress
        | TransportError::Connect(_)
        | TransportError::InvalidUri
        | TransportError::TooLarge(_)
        | TransportError::HeadTooLarge
        | TransportError::WireTooLarge
        | TransportError::Http(_) => OutboundResult::Error,
    }
}

/// The `wasi:http` error for a failed handshake: the certificate (untrusted, wrong name,
/// expired), an alert from the peer, or anything else in the protocol.
fn tls_error(error: rustls::Error) -> HttpError {
    match error {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::InvalidCertRevocationList(_) => HttpError::TlsCertificateError,
        rustls::Error::AlertReceived(alert) => HttpError::TlsAlertReceived {
            alert_id: Some(u8::from(alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        _ => HttpError::TlsProtocolError,
    }
}

/// One call's refused requests: counted as they happen, logged as one line when the last
/// holder (the call's hooks, or a request future that outlived them) drops it.
struct Refusals {
    plugin: PluginName,
    event: Option<EventId>,
    count: u64,
    /// The first refusal's reason (names the `host:port`, never the path or query).
    first: Option<String>,
    /// The most recent refusal's reason, for the guest to ask (`network.last-refusal`).
    last: Option<String>,
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
struct RefusalLog(Arc<Mutex<Refusals>>);

impl RefusalLog {
    /// Records a refusal for the call's log line and returns the error the guest sees.
    fn deny(&self, denied: &Denied) -> HttpError {
        let mut refusals = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        refusals.count += 1;
        let reason = denied.to_string();
        if refusals.first.is_none() {
            refusals.first = Some(reason.clone());
        }
        refusals.last = Some(reason);
        denied_error(denied)
    }
}

/// Per-call `wasi:http` hooks: the grant, the attempt's deadline, and who to blame in logs.
pub struct OutboundHooks {
    plugin: PluginName,
    deadline: Instant,
    connector: Connector,
    /// The host-wide socket budget every call draws on.
    sockets: Arc<SocketPool>,
    /// The bounds on DNS lookups in flight every call draws on.
    lookups: Arc<Lookups>,
    grant: Option<Outbound>,
    requests_left: u32,
    refusals: RefusalLog,
}

impl OutboundHooks {
    /// No grant: every request is refused until [`OutboundHooks::grant`].
    pub fn new(
        plugin: PluginName,
        event: Option<EventId>,
        deadline: Instant,
        connector: Connector,
        sockets: Arc<SocketPool>,
        lookups: Arc<Lookups>,
    ) -> Self {
        Self {
            plugin: plugin.clone(),
            deadline,
            connector,
            sockets,
            lookups,
            grant: None,
            requests_left: REQUESTS_PER_CALL,
            refusals: RefusalLog(Arc::new(Mutex::new(Refusals {
                plugin,
                event,
                count: 0,
                first: None,
                last: None,
            }))),
        }
    }

    pub fn grant(&mut self, grant: Outbound) {
        self.grant = Some(grant);
    }

    /// Why the most recent refused request of this call was refused, if one was.
    pub fn last_refusal(&self) -> Option<String> {
        self.lock().last.clone()
    }

    /// Why the first refused request of this call was refused, if one was, and how many were.
    /// Whether the call let any request out (past the allow-list, to be sent): what a plugin
    /// can do to the world beyond its state, which commits only with a success.
    pub fn sent_any(&self) -> bool {
        self.requests_left < REQUESTS_PER_CALL
    }

    pub fn first_refusal(&self) -> Option<(String, u64)> {
        let refusals = self.lock();
        refusals.first.clone().map(|first| (first, refusals.count))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Refusals> {
        self.refusals
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The synchronous checks: grant, scheme, allow-list, credential over plain http, per-call
    /// cap; then the host's headers, and the connector for the scheme.
    fn admit(
        &mut self,
        request: &mut Request<WasiBody>,
    ) -> Result<(HostPort, AllowList, Connector), Denied> {
        let Some(grant) = &self.grant else {
            return Err(Denied::NoNetwork);
        };
        let uri = request.uri();
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Denied::Userinfo);
        }
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        let target = check_target(&grant.allow, uri.scheme(), uri.host(), uri.port_u16())?;
        let credential = grant
            .credentials
            .for_request(&target, https, request.method())?;
        if self.requests_left == 0 {
            return Err(Denied::TooManyRequests);
        }
        self.requests_left -= 1;
        let key = HeaderValue::from_str(&grant.idempotency_key)
            .expect("idempotency_key() yields visible ASCII only");
        // The server is told the host it was checked as, not the plugin's spelling of it (a
        // port `019110` or `+19110` is the checked port to the allow-list, another string to
        // a server reading its `Host`).
        let default_port = if https { 443 } else { 80 };
        let checked = if target.port == default_port {
            target.host.to_string()
        } else {
            target.to_string()
        };
        let headers = request.headers_mut();
        headers.insert(
            http::header::HOST,
            HeaderValue::from_str(&checked).expect("a checked host:port is a valid header value"),
        );
        headers.insert(IDEMPOTENCY_KEY, key);
        if let Some((name, value)) = credential {
            // `insert` drops every value the plugin set for this header.
            headers.insert(name.clone(), value.clone());
        }
        let connector = if https {
            Connector::Tls(grant.tls.clone())
        } else {
            self.connector.clone()
        };
        Ok((target, grant.allow.clone(), connector))
    }
}

/// Counts one request's outcome in `hookd_outbound_requests_total`, once. A request whose
/// future is dropped before it had one was cut off: by the attempt's deadline (`timeout`), or
/// abandoned by the plugin or its call's end otherwise (`error`).
struct Outcome {
    meter: Option<OutboundMeter>,
    /// Counted already (a request is counted once).
    counted: bool,
    deadline: Instant,
}

impl Outcome {
    fn count(&mut self, result: OutboundResult) {
        if let Some(meter) = &self.meter
            && !std::mem::replace(&mut self.counted, true)
        {
            meter.record(result);
        }
    }

    /// Whether this failed TLS handshake is logged: `Some(failures left out since the line
    /// before)` (always, for a call outside any host), or `None` (counted; at most one line per
    /// period for the plugin).
    fn tls_failure_line(&self) -> Option<u64> {
        self.meter
            .as_ref()
            .map_or(Some(0), OutboundMeter::tls_failure_line)
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.counted {
            let cut_off = if Instant::now() >= self.deadline {
                OutboundResult::Timeout
            } else {
                OutboundResult::Error
            };
            self.count(cut_off);
        }
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
        let deadline = self.deadline;
        let mut outcome = Outcome {
            meter: self.grant.as_ref().map(|grant| grant.meter.clone()),
            counted: false,
            deadline,
        };
        let admitted = self.admit(&mut request).map_err(|denied| {
            outcome.count(OutboundResult::Denied);
            self.refusals.deny(&denied)
        });
        let refusals = self.refusals.clone();
        let plugin = self.plugin.clone();
        let sockets = self.sockets.clone();
        let lookups = self.lookups.clone();
        // The request may be driven outside the call's poll (wasmtime-wasi-http spawns it):
        // its lines keep the attempt's and the call's spans all the same.
        let span = tracing::Span::current();
        Box::new(tracing::Instrument::instrument(
            async move {
                let mut count = |result| outcome.count(result);
                let (target, allow, connector) = admitted?;
                let options = options.unwrap_or_default();
                let asked = Asked {
                    connect: options.connect_timeout,
                    first_byte: options.first_byte_timeout,
                    between_bytes: options.between_bytes_timeout,
                };
                let timeouts = Timeouts::new(asked, deadline);
                let resolved = transport::resolve(&target, &timeouts, &lookups, &plugin).await;
                let addrs = resolved.map_err(|e| {
                    count(counted(&e));
                    transport_error(e)
                })?;
                let addrs = usable_addrs(&allow, &target, &addrs).map_err(|denied| {
                    count(OutboundResult::Denied);
                    refusals.deny(&denied)
                })?;
                // Held as long as the connection is: it rides with the connection's driver.
                let slot = sockets.take(&plugin).map_err(|denied| {
                    count(OutboundResult::Denied);
                    refusals.deny(&denied)
                })?;
                // The call's refusal line is due when the call ends, not when this response does.
                drop(refusals);
                let method = request.method().clone();
                let result = transport::send(&connector, &target, request, &addrs, timeouts).await;
                match &result {
                    Ok((response, _)) => {
                        count(OutboundResult::Ok);
                        tracing::debug!(
                            target: "plugin", plugin = %plugin, host = %target,
                            "outbound {method} answered {}", response.status()
                        )
                    }
                    // A certificate or handshake refusal is a configuration to fix, and the code
                    // the guest gets carries no text: the reason is logged where it is seen, at
                    // most once per period for the plugin (counting those left out).
                    Err(e @ TransportError::Tls(_)) => {
                        count(counted(e));
                        if let Some(left_out) = outcome.tls_failure_line() {
                            // The reason may quote the certificate's names: the peer's
                            // text, escaped like any other.
                            let reason = crate::text::escape(&e.to_string()).into_owned();
                            tracing::warn!(
                                target: "plugin", plugin = %plugin, host = %target, left_out,
                                "outbound {method} failed: {reason}"
                            )
                        }
                    }
                    Err(e) => {
                        count(counted(e));
                        tracing::debug!(
                            target: "plugin", plugin = %plugin, host = %target,
                            "outbound {method} failed: {e}"
                        )
                    }
                }
                let (response, driver) = result.map_err(transport_error)?;
                let response = response.map(|body| body.map_err(transport_error).boxed_unsync());
                let io: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
                    Box::new(async move {
                        let _slot = slot;
                        driver.await.map_err(transport_error)
                    });
                Ok((response, io))
            },
            span,
        ))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::outbound::{
        credentials::{Credential, Credentials},
        idempotency_key, tls,
    };

    /// The host's socket cap and a connection that failed under TLS are failures a later
    /// attempt may not meet: the guest sees codes the SDK retries (an internal error carrying
    /// the reason, a terminated connection), not a refusal or a TLS error, which it makes
    /// permanent (they dead-lettered events at the first attempt). A plugin's own request cap
    /// stays a refusal.
    #[test]
    fn passing_failures_reach_the_guest_as_failures_to_retry() {
        let capped = denied_error(&Denied::HostSockets(128));
        assert!(
            matches!(&capped, HttpError::InternalError(Some(why)) if why.contains("(128")),
            "{capped:?}"
        );
        assert!(matches!(
            denied_error(&Denied::TooManyRequests),
            HttpError::ConnectionLimitReached
        ));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(
            transport_error(TransportError::TlsIo(reset)),
            HttpError::ConnectionTerminated
        ));
    }

    fn request() -> Request<WasiBody> {
        Request::builder()
            .uri("http://127.0.0.1:9000/x")
            .header(IDEMPOTENCY_KEY, "plugin-chosen")
            .body(
                http_body_util::Empty::<Bytes>::new()
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
            .unwrap()
    }

    fn hooks() -> OutboundHooks {
        let deadline = Instant::now() + Duration::from_secs(5);
        OutboundHooks::new(
            PluginName::from("p"),
            None,
            deadline,
            Connector::Plain,
            Arc::default(),
            Arc::default(),
        )
    }

    fn granted() -> OutboundHooks {
        let mut hooks = hooks();
        hooks.grant(grant(Credentials::default()));
        hooks
    }

    fn grant(credentials: Credentials) -> Outbound {
        Outbound {
            allow: AllowList::parse(&["127.0.0.1:9000", "api.example.com:443"]).unwrap(),
            tls: tls::client_config(None).unwrap(),
            credentials,
            idempotency_key: idempotency_key("s", "e", "p"),
            meter: OutboundMeter::detached(),
        }
    }

    fn request_to(url: &str, authorization: &str) -> Request<WasiBody> {
        let mut request = request();
        *request.uri_mut() = url.parse().unwrap();
        request.headers_mut().append(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(authorization).unwrap(),
        );
        request
    }

    /// `user@` before a listed address would reach that server's `Host` header as written
    /// (and the allow-list sees only what follows the `@`): refused, whatever the userinfo.
    #[test]
    fn an_authority_with_userinfo_is_refused() {
        let mut hooks = granted();
        for url in [
            "http://internal-admin.example:443@127.0.0.1:9000/",
            "http://user:pw@127.0.0.1:9000/",
            "https://x%0d%0aX-Injected:1@api.example.com/",
        ] {
            let mut req = request_to(url, "plugin-chosen");
            let denied = hooks.admit(&mut req).err();
            assert!(
                matches!(denied, Some(Denied::Userinfo)),
                "{url}: {denied:?}"
            );
        }
        let mut req = request_to("http://127.0.0.1:9000/a@b", "plugin-chosen");
        assert!(
            hooks.admit(&mut req).is_ok(),
            "an @ in the path is no userinfo"
        );
    }

    #[test]
    fn a_credential_replaces_the_plugins_header_of_the_same_name() {
        let allow = AllowList::parse(&["api.example.com:443"]).unwrap();
        let env = |_: &str| Some("sk-1".to_owned());
        let credential = Credential::new(
            &allow,
            "api.example.com:443",
            "authorization",
            "K",
            "Bearer ",
            &env,
        )
        .unwrap();
        let mut hooks = hooks();
        hooks.grant(grant(Credentials::new(vec![credential]).unwrap()));
        let mut req = request_to("https://api.example.com/v1", "plugin-chosen");
        let (_, _, connector) = hooks.admit(&mut req).unwrap();
        let values: Vec<_> = req
            .headers()
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .collect();
        assert_eq!(values, ["Bearer sk-1"]);
        assert!(matches!(connector, Connector::Tls(_)));
        // Other listed targets get the plugin's own header, untouched.
        let mut req = request_to("http://127.0.0.1:9000/", "plugin-chosen");
        hooks.admit(&mut req).unwrap();
        let values: Vec<_> = req
            .headers()
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .collect();
        assert_eq!(values, ["plugin-chosen"]);
    }

    #[test]
    fn tls_failures_reach_the_guest_as_their_wasi_http_codes() {
        use rustls::{AlertDescription, CertificateError};
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert!(matches!(tls_error(expired), HttpError::TlsCertificateError));
        let wrong_name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert!(matches!(
            tls_error(wrong_name),
            HttpError::TlsCertificateError
        ));
        let alert = rustls::Error::AlertReceived(AlertDescription::HandshakeFailure);
        assert!(matches!(
            tls_error(alert),
            HttpError::TlsAlertReceived {
                alert_id: Some(40),
                ..
            }
        ));
        assert!(matches!(
            transport_error(TransportError::TlsTimeout),
            HttpError::ConnectionTimeout
        ));
    }

    #[test]
    fn a_call_without_a_grant_sends_nothing() {
        assert_eq!(
            hooks().admit(&mut request()).unwrap_err(),
            Denied::NoNetwork
        );
    }

    #[test]
    fn the_host_sets_the_idempotency_key_over_the_plugins() {
        let mut req = request();
        granted().admit(&mut req).unwrap();
        let keys: Vec<_> = req.headers().get_all(IDEMPOTENCY_KEY).iter().collect();
        assert_eq!(keys, ["s:e:p"]);
    }

    #[test]
    fn a_call_sends_at_most_its_share_of_requests() {
        let mut hooks = granted();
        for _ in 0..REQUESTS_PER_CALL {
            hooks.admit(&mut request()).unwrap();
        }
        assert_eq!(
            hooks.admit(&mut request()).unwrap_err(),
            Denied::TooManyRequests
        );
    }

    /// The SDK tells a refused host (permanent) from a prohibited address and the call's cap
    /// by these codes.
    #[test]
    fn refusals_reach_the_guest_as_their_wasi_http_codes() {
        let target = HostPort::parse("model.example.com:80").unwrap();
        let cases = [
            (Denied::NoNetwork, "HTTP request denied"),
            (Denied::Scheme("https".into()), "HTTP request denied"),
            (Denied::NoHost, "HTTP request denied"),
            (Denied::NotListed(target.clone()), "HTTP request denied"),
            (
                Denied::Prohibited {
                    target,
                    addr: "10.0.0.7:80".parse().unwrap(),
                    range: "private (10.0.0.0/8)",
                },
                "destination IP address is prohibited",
            ),
            (Denied::TooManyRequests, "connection limit reached"),
        ];
        for (denied, want) in cases {
            assert_eq!(denied_error(&denied).to_string(), want, "{denied:?}");
        }
    }
}
