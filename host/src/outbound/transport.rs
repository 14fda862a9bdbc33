//! Outbound transport: resolve a vetted target once, connect to one of its vetted addresses,
//! speak HTTP/1.1 over it, and hand back a response whose body is capped and deadline-bound.
//!
//! Invariants:
//! - No policy here: the caller passes a target that [`super::policy::check_target`] admitted
//!   and addresses that [`super::policy::usable_addrs`] kept; this module never resolves a name
//!   again after [`resolve`], so DNS cannot rebind a listed name between the check and the
//!   connect.
//! - Connect, first byte and the whole response are bounded by [`Timeouts`], never beyond the
//!   attempt's deadline plus [`DEADLINE_GRACE`]; the body errs once past [`RESPONSE_BYTES`] (an
//!   error, never a truncation), whatever its head declared, so the status and the start of
//!   the body still reach a plugin that reads no further; redirects are not followed.
//! - What a peer can make the host hold or parse for one request is bounded whatever it sends:
//!   a response head of at most [`RESPONSE_HEAD_BYTES`] (hyper's read buffer: a longer head is
//!   an error), and at most [`BEFORE_HEAD_BYTES`] read from the connection before the final
//!   head (interim `1xx` answers, which hyper otherwise skips without end); after it, the body
//!   cap (and hyper's own bounds on chunk extensions and trailers).
//! - How bytes reach the peer is the [`Connector`]'s business alone. Over TLS the server name
//!   (SNI and the name verified) is the listed host, the address comes from the vetted list; an
//!   IP-literal host is verified against the certificate's IP addresses and sends no SNI. The
//!   TLS handshake is bounded by the connect deadline.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    time::Sleep,
};

use super::{
    lookups::Lookups,
    policy::{Host, HostPort},
};
use crate::ids::PluginName;

/// Longest wait for DNS plus the TCP connect, unless the plugin asks for less.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body a plugin may receive; more is an error, not a truncation.
pub const RESPONSE_BYTES: u64 = 8 * 1024 * 1024;
/// Largest response head a plugin may receive (hyper's read buffer for the connection, so
/// also its largest read): more is an error. nginx, proxying, refuses heads over 4 or 8 KiB.
pub const RESPONSE_HEAD_BYTES: usize = 16 * 1024;
/// Most bytes read from a request's connection before its final response head (that head and
/// any interim `1xx` answers before it). More is an error.
pub const BEFORE_HEAD_BYTES: u64 = 1024 * 1024;
/// How long after the attempt's deadline these timers fire. The attempt's own wall clock fires
/// first, so a request still waiting at the deadline makes the attempt a `timeout` (not a
/// plugin-visible error); these timers are the backstop.
pub const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// Why a request got no (complete) response.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("DNS lookup timed out")]
    DnsTimeout,
    #[error("DNS lookup failed: {0}")]
    Dns(io::Error),
    #[error("the name resolved to no address")]
    NoAddress,
    #[error("connecting timed out")]
    ConnectTimeout,
    #[error("connecting failed: {0}")]
    Connect(io::Error),
    /// The TLS handshake did not finish by the connect deadline.
    #[error("the TLS handshake timed out")]
    TlsTimeout,
    /// The TLS handshake failed: the peer's certificate, an alert it sent, or the protocol.
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    /// The TLS handshake failed below TLS (the connection closed or reset mid-handshake).
    #[error("TLS handshake: {0}")]
    TlsIo(io::Error),
    #[error("the request's path is not a valid URI")]
    InvalidUri,
    /// No response head before the first-byte deadline.
    #[error("no response before the first-byte timeout")]
    FirstByteTimeout,
    /// The peer went quiet for longer than the between-bytes timeout.
    #[error("the response stalled past the between-bytes timeout")]
    Stalled,
    #[error("the response did not finish in time")]
    ResponseTimeout,
    /// The response body (announced or received) exceeds [`RESPONSE_BYTES`].
    #[error("the response body of {0} bytes exceeds the cap")]
    TooLarge(u64),
    /// The response head exceeds [`RESPONSE_HEAD_BYTES`], or hyper's 100 fields.
    #[error("the response head exceeds {RESPONSE_HEAD_BYTES} bytes or 100 fields")]
    HeadTooLarge,
    /// The peer sent more than [`BEFORE_HEAD_BYTES`] before its final head (endless interim
    /// answers, say).
    #[error("the peer sent more than {BEFORE_HEAD_BYTES} bytes before its response head")]
    WireTooLarge,
    #[error("HTTP error: {0}")]
    Http(hyper::Error),
}

impl TransportError {
    /// A hyper error, with its own timeouts counted as the response's, and TLS's errors after
    /// the handshake (a TLS 1.3 server's alert refusing the client, sent once the client has
    /// finished its side: `certificate_required`) as TLS's, not HTTP's.
    fn from_hyper(e: hyper::Error) -> Self {
        if e.is_timeout() {
            Self::ResponseTimeout
        } else if e.is_parse_too_large() {
            Self::HeadTooLarge
        } else if cause::<WireCapReached>(&e).is_some() {
            Self::WireTooLarge
        } else if let Some(tls) = cause::<rustls::Error>(&e) {
            Self::Tls(tls.clone())
        } else {
            Self::Http(e)
        }
    }
}

/// The `T` under `error`, if any. An `io::Error` holding one is looked into, since its
/// `source()` skips the error it holds.
fn cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        let held = error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<T>());
        if held.is_some() {
            return held;
        }
        next = error.source();
    }
    None
}

/// What a [`WireCapped`] connection's read fails with once its allowance is spent.
#[derive(Debug, thiserror::Error)]
#[error("more than {BEFORE_HEAD_BYTES} bytes read before the response head")]
struct WireCapReached;

/// A connection whose reads fail once `left` bytes were read from it; `left` is shared, so
/// the caller can lift the cap ([`u64::MAX`]) once the response head is in.
struct WireCapped {
    inner: Box<dyn Io>,
    left: Arc<AtomicU64>,
}

impl AsyncRead for WireCapped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.left.load(Ordering::Relaxed) == 0 {
            return Poll::Ready(Err(io::Error::other(WireCapReached)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let read = (buf.filled().len() - before) as u64;
        // The only reader: no other read runs between the load and this update (a lift may).
        let _ = self
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(read))
            });
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WireCapped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The timeouts a request asked for (`wasi:http` request options); `None` is the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked {
    pub connect: Option<Duration>,
    pub first_byte: Option<Duration>,
    pub between_bytes: Option<Duration>,
}

/// When each phase of one request must be done (all within the attempt's deadline + grace).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    connect_by: tokio::time::Instant,
    first_byte_by: tokio::time::Instant,
    done_by: tokio::time::Instant,
    between_bytes: Option<Duration>,
}

impl Timeouts {
    /// The phases' deadlines for a request starting now, in an attempt that ends at `deadline`.
    pub fn new(asked: Asked, deadline: Instant) -> Self {
        let now = Instant::now();
        let done_by = (deadline + DEADLINE_GRACE).max(now);
        let within = |d: Duration| now.checked_add(d).map_or(done_by, |t| t.min(done_by));
        Self {
            connect_by: within(asked.connect.unwrap_or(CONNECT_TIMEOUT)).into(),
            first_byte_by: asked.first_byte.map_or(done_by, within).into(),
            done_by: done_by.into(),
            between_bytes: asked.between_bytes,
        }
    }
}

/// Resolves the target once, with a slot of `lookups` held until the resolver returns (see
/// [`super::lookups`]). An IP literal is used as is.
pub async fn resolve(
    target: &HostPort,
    timeouts: &Timeouts,
    lookups: &Lookups,
    plugin: &PluginName,
) -> Result<Vec<SocketAddr>, TransportError> {
    let name = match &target.host {
        Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, target.port)]),
        Host::Name(name) => name.clone(),
    };
    let port = target.port;
    let lookup = async {
        let slot = lookups.take(plugin).await;
        // What `tokio::net::lookup_host` does, with the slot moved in: it is given back when
        // the resolver returns, also after this request stopped waiting for it.
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), port))
                .map(Iterator::collect::<Vec<_>>)
        })
        .await
        .map_err(io::Error::other)
    };
    let addrs: Vec<SocketAddr> = tokio::time::timeout_at(timeouts.connect_by, lookup)
        .await
        .map_err(|_| TransportError::DnsTimeout)?
        .and_then(|resolved| resolved)
        .map_err(TransportError::Dns)?;
    if addrs.is_empty() {
        return Err(TransportError::NoAddress);
    }
    Ok(addrs)
}

/// How a connection to a vetted address is made: plain TCP, or TLS over it with a plugin's
/// client configuration (its trust roots, built when its configuration loaded).
#[derive(Debug, Clone, Default)]
pub enum Connector {
    #[default]
    Plain,
    Tls(Arc<rustls::ClientConfig>),
}

/// A connection's byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl Connector {
    /// Connects to the first reachable address of `addrs`, in order, by `timeouts`' connect
    /// deadline (no further resolution), then, for TLS, shakes hands as `target`'s host.
    async fn connect(
        &self,
        target: &HostPort,
        addrs: &[SocketAddr],
        timeouts: &Timeouts,
    ) -> Result<Box<dyn Io>, TransportError> {
        let stream = tcp_connect(addrs, timeouts).await?;
        let config = match self {
            Connector::Plain => return Ok(Box::new(stream)),
            Connector::Tls(config) => config.clone(),
        };
        let name = match &target.host {
            Host::Name(name) => ServerName::try_from(name.clone()).map_err(|_| {
                TransportError::Tls(rustls::Error::General(format!(
                    "{name:?} is not a DNS name a certificate can name"
                )))
            })?,
            Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
        };
        let handshake = tokio_rustls::TlsConnector::from(config).connect(name, stream);
        let stream = tokio::time::timeout_at(timeouts.connect_by, handshake)
            .await
            .map_err(|_| TransportError::TlsTimeout)?
            .map_err(tls_error)?;
        Ok(Box::new(stream))
    }
}

/// A failed handshake's cause: rustls reports its own errors inside the `io::Error`.
fn tls_error(e: io::Error) -> TransportError {
    let kind = e.kind();
    match e.into_inner() {
        None => TransportError::TlsIo(kind.into()),
        Some(inner) => match inner.downcast::<rustls::Error>() {
            Ok(tls) => TransportError::Tls(*tls),
            Err(other) => TransportError::TlsIo(io::Error::new(kind, other)),
        },
    }
}

/// A TCP connection to the first address of `addrs` that answers by the connect deadline.
async fn tcp_connect(
    addrs: &[SocketAddr],
    timeouts: &Timeouts,
) -> Result<TcpStream, TransportError> {
    let mut last_error = TransportError::NoAddress;
    for &addr in addrs {
        match tokio::time::timeout_at(timeouts.connect_by, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last_error = TransportError::Connect(e),
            Err(_) => return Err(TransportError::ConnectTimeout),
        }
    }
    Err(last_error)
}

/// Drives the connection while the response body streams; poll it to completion alongside the
/// body.
pub type Driver = Pin<Box<dyn Future<Output = Result<(), TransportError>> + Send>>;

/// Connects to the first reachable address (over TLS as `target` for [`Connector::Tls`]),
/// sends the request over HTTP/1.1 and returns the response head, with a capped,
/// deadline-bound body, and the connection's [`Driver`].
pub async fn send<B>(
    connector: &Connector,
    target: &HostPort,
    mut request: Request<B>,
    addrs: &[SocketAddr],
    timeouts: Timeouts,
) -> Result<(Response<CappedBody>, Driver), TransportError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let before_head = Arc::new(AtomicU64::new(BEFORE_HEAD_BYTES));
    let stream = WireCapped {
        inner: connector.connect(target, addrs, &timeouts).await?,
        left: before_head.clone(),
    };
    let (mut sender, conn) = tokio::time::timeout_at(
        timeouts.connect_by,
        hyper::client::conn::http1::Builder::new()
            .max_buf_size(RESPONSE_HEAD_BYTES)
            .handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| TransportError::ConnectTimeout)?
    .map_err(TransportError::from_hyper)?;

    // The request line carries only the path; the authority went into the Host header.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| TransportError::InvalidUri)?;

    // Drive the connection while waiting for the response head; keep driving it afterwards
    // (the returned driver) while the body streams.
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
        .map_err(|_| TransportError::FirstByteTimeout)?
        .map_err(TransportError::from_hyper)?
    };
    // The final head is in: from here the body's own cap bounds what is read.
    before_head.store(u64::MAX, Ordering::Relaxed);
    // A body declared over the cap is not refused with the head: the status is the server's
    // answer, and a plugin that reads only the start of the body (or none of it) gets it. Read
    // on, it errs once past the cap, as an undeclared one does; a response without a body
    // (to HEAD; a 1xx, 204 or 304) never reaches it, whatever its Content-Length says.
    let done_by = timeouts.done_by;
    let response = response.map(|incoming| CappedBody {
        inner: incoming,
        received: 0,
        limit: RESPONSE_BYTES,
        deadline: Box::pin(tokio::time::sleep_until(done_by)),
        between: timeouts
            .between_bytes
            .map(|d| (d, Box::pin(tokio::time::sleep(d)))),
    });
    let driver: Driver = Box::pin(async move {
        let Some(conn) = conn else { return Ok(()) };
        match tokio::time::timeout_at(done_by, conn).await {
            Err(_) => Err(TransportError::ResponseTimeout),
            Ok(Err(e)) => Err(TransportError::from_hyper(e)),
            Ok(Ok(())) => Ok(()),
        }
    });
    Ok((response, driver))
}

/// A response body that errs past its byte cap, past the deadline, or when the peer goes quiet
/// for longer than the plugin's between-bytes timeout.
pub struct CappedBody {
    inner: Incoming,
    received: u64,
    limit: u64,
    deadline: Pin<Box<Sleep>>,
    between: Option<(Duration, Pin<Box<Sleep>>)>,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = TransportError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, TransportError>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(TransportError::ResponseTimeout)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if this.received > this.limit {
                        return Poll::Ready(Some(Err(TransportError::TooLarge(this.received))));
                    }
                }
                if let Some((every, sleep)) = &mut this.between {
                    sleep.as_mut().reset(tokio::time::Instant::now() + *every);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(TransportError::from_hyper(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if let Some((_, sleep)) = &mut this.between {
                    ready!(sleep.as_mut().poll(cx));
                    return Poll::Ready(Some(Err(TransportError::Stalled)));
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

    #[test]
    fn no_phase_outlives_the_attempt_deadline_plus_grace() {
        let deadline = Instant::now() + Duration::from_secs(1);
        let hour = Some(Duration::from_secs(3600));
        let asked = Asked {
            connect: hour,
            first_byte: hour,
            between_bytes: None,
        };
        let timeouts = Timeouts::new(asked, deadline);
        let limit = tokio::time::Instant::from_std(deadline + DEADLINE_GRACE);
        assert_eq!(
            [
                timeouts.connect_by,
                timeouts.first_byte_by,
                timeouts.done_by
            ],
            [limit; 3]
        );
    }

    #[test]
    fn a_connect_waits_the_default_timeout_when_none_is_asked() {
        let start = tokio::time::Instant::now();
        let deadline = Instant::now() + Duration::from_secs(3600);
        let wait = Timeouts::new(Asked::default(), deadline).connect_by - start;
        assert!(
            wait >= CONNECT_TIMEOUT && wait < CONNECT_TIMEOUT + Duration::from_secs(1),
            "{wait:?}"
        );
    }

    /// A peer that accepts the connection but never answers the ClientHello: the handshake
    /// ends at the connect deadline as a timeout (a retry), not as a TLS failure.
    #[tokio::test]
    async fn a_silent_tls_peer_is_a_handshake_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        });
        let asked = Asked {
            connect: Some(Duration::from_millis(200)),
            ..Asked::default()
        };
        let timeouts = Timeouts::new(asked, Instant::now() + Duration::from_secs(30));
        let target = HostPort::parse(&format!("localhost:{}", addr.port())).unwrap();
        let connector = Connector::Tls(super::super::tls::default_client());
        let result = connector.connect(&target, &[addr], &timeouts).await;
        assert!(
            matches!(result, Err(TransportError::TlsTimeout)),
            "{:?}",
            result.err()
        );
        hold.abort();
    }

    #[test]
    fn a_connect_waits_less_when_the_plugin_asks_for_less() {
        let start = tokio::time::Instant::now();
        let deadline = Instant::now() + Duration::from_secs(3600);
        let asked = Asked {
            connect: Some(Duration::from_secs(1)),
            ..Asked::default()
        };
        let wait = Timeouts::new(asked, deadline).connect_by - start;
        assert!(wait < Duration::from_secs(2), "{wait:?}");
    }

    /// A peer on loopback answering by path: `/big` and `/not-modified` declare 100 MiB
    /// (`GET /big` sends 9 MiB of it, a 304 has no body); `/head/<n>` answers with `n` header
    /// fields of about 1 KiB; `/interim` with `103` heads without end; `/chunked` with a body
    /// of [`RESPONSE_BYTES`] in 32-byte chunks.
    async fn peer() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serve = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut head = vec![0; 4096];
                    let n = stream.read(&mut head).await.unwrap();
                    let head = String::from_utf8_lossy(&head[..n]).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    if path == "/interim" {
                        let hint =
                            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n";
                        while stream.write_all(&hint.repeat(64)).await.is_ok() {}
                        return;
                    }
                    if path == "/chunked" {
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        let chunk = format!("20\r\n{}\r\n", "c".repeat(32));
                        let whole = chunk.repeat(RESPONSE_BYTES as usize / 32) + "0\r\n\r\n";
                        let _ = stream.write_all(whole.as_bytes()).await;
                        return;
                    }
                    if let Some(n) = path.strip_prefix("/head/") {
                        let n: usize = n.parse().unwrap();
                        let field = format!("x-filler: {}\r\n", "f".repeat(1000));
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\n{}content-length: 0\r\n\r\n",
                            field.repeat(n)
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                        return;
                    }
                    let status = match path.as_str() {
                        "/not-modified" => "304 Not Modified",
                        _ => "200 OK",
                    };
                    let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 104857600\r\n\r\n");
                    let _ = stream.write_all(answer.as_bytes()).await;
                    if head.starts_with("GET /big") {
                        // More than the cap, less than declared; the reader stops first.
                        let _ = stream.write_all(&vec![b'x'; 9 << 20]).await;
                    }
                });
            }
        });
        (addr, serve)
    }

    /// `method` `path` sent to the [`peer`] at `addr`, in an attempt with 10 s left.
    async fn request(
        addr: SocketAddr,
        method: http::Method,
        path: &str,
    ) -> Result<(Response<CappedBody>, Driver), TransportError> {
        let target = HostPort::parse(&format!("127.0.0.1:{}", addr.port())).unwrap();
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(http::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let timeouts = Timeouts::new(Asked::default(), Instant::now() + Duration::from_secs(10));
        send(&Connector::Plain, &target, request, &[addr], timeouts).await
    }

    /// No response is refused for the `Content-Length` it declares: one without a body by its
    /// method or status (HEAD; 1xx, 204, 304) has none to read, and a GET declaring more than
    /// the cap keeps its status (before, the head was refused, and a plugin that wanted only
    /// the status lost it); read on, its body errs once past the cap.
    #[tokio::test]
    async fn a_declared_length_over_the_cap_keeps_the_status_and_errs_past_the_cap() {
        let (addr, serve) = peer().await;
        let send = |method, path| request(addr, method, path);
        let status = |sent: Result<(Response<CappedBody>, Driver), TransportError>| {
            sent.map(|(response, _)| response.status())
        };
        let head = status(send(http::Method::HEAD, "/big").await);
        assert_eq!(head.unwrap(), http::StatusCode::OK);
        let not_modified = status(send(http::Method::GET, "/not-modified").await);
        assert_eq!(not_modified.unwrap(), http::StatusCode::NOT_MODIFIED);
        let (get, driver) = send(http::Method::GET, "/big").await.unwrap();
        assert_eq!(get.status(), http::StatusCode::OK);
        let driving = tokio::spawn(driver);
        let read = http_body_util::BodyExt::collect(get.into_body()).await;
        assert!(
            matches!(read, Err(TransportError::TooLarge(n)) if n > RESPONSE_BYTES),
            "{:?}",
            read.map(|_| ())
        );
        driving.abort();
        serve.abort();
    }

    /// A peer cannot make the host hold a large head for a request, nor keep it parsing
    /// interim answers until the attempt's deadline: before, a head of up to ~400 KiB was
    /// read (64 of them per call, 64 calls at once: 1.5 GB), and `103`s sent without end kept
    /// a request (and a core) busy until the deadline.
    #[tokio::test]
    async fn a_peer_cannot_send_an_endless_head_or_endless_interim_answers() {
        let (addr, serve) = peer().await;
        let status = |sent: Result<(Response<CappedBody>, Driver), TransportError>| {
            sent.map(|(response, _)| response.status())
        };
        let twelve = status(request(addr, http::Method::GET, "/head/12").await);
        assert_eq!(twelve.unwrap(), http::StatusCode::OK, "12 KiB of head");
        let twenty = status(request(addr, http::Method::GET, "/head/20").await);
        assert!(
            matches!(twenty, Err(TransportError::HeadTooLarge)),
            "{twenty:?}"
        );
        let interim = status(request(addr, http::Method::GET, "/interim").await);
        assert!(
            matches!(interim, Err(TransportError::WireTooLarge)),
            "{interim:?}"
        );
        // The cap ends with the head: a body at its own cap, in 32-byte chunks (6 bytes of
        // framing each), is read whole.
        let (chunked, driver) = request(addr, http::Method::GET, "/chunked").await.unwrap();
        let driving = tokio::spawn(driver);
        let read = http_body_util::BodyExt::collect(chunked.into_body()).await;
        assert_eq!(
            read.map(|body| body.to_bytes().len() as u64).ok(),
            Some(RESPONSE_BYTES)
        );
        driving.abort();
        serve.abort();
    }
}
