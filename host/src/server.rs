//! The accept loop both listeners use, hardened for hostile clients.
//!
//! Invariants: a client must send its request head within `header_timeout` (slow-loris), and
//! a head is at most [`MAX_HEAD_BYTES`]; at most `max_connections` connections are served at
//! once (the rest wait in the kernel's backlog), at most `max_connections_per_ip` of them from
//! one client address (more are answered 503 `overloaded` at once and closed, without taking a
//! slot, so one client cannot hold every slot); a connection whose client takes nothing of
//! its answers for `header_timeout` is closed ([`WriteStall`]: a client that pipelines
//! requests and never reads held its slot for good); when every slot is taken and another
//! client connects, one connection is closed for it ([`Connections::shed_one`]: of the address
//! holding the most, an idle one first), so idle keep-alive connections from a few addresses
//! cannot keep every other client waiting; on shutdown no new connection is accepted and open
//! ones finish their request.

use std::sync::LazyLock;

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tracing::Level;

use axum::{Router, response::IntoResponse};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tower::ServiceExt as _;

use crate::{config::ServerConfig, error::ApiError, telemetry::Repeated};

/// hyper's read buffer per connection, and so the largest request head (431 beyond): webhook
/// heads are a few KiB; hyper's default (~400 KiB) let 4 096 slow heads hold 1.6 GiB.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Connections refused over the per-address cap that are being answered at once; beyond it
/// they are closed without an answer.
pub const MAX_REFUSING: usize = 256;

/// How long answering a refused connection may take.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
}

impl From<&ServerConfig> for ServeLimits {
    fn from(server: &ServerConfig) -> Self {
        Self {
            header_timeout: server.header_timeout,
            max_connections: server.max_connections,
            max_connections_per_ip: server.max_connections_per_ip,
        }
    }
}

/// Connections per client address: at most `max` served at once, at most `max` more waiting
/// for one of those slots; the rest are refused.
struct PerAddress {
    addresses: Mutex<HashMap<IpAddr, Arc<Address>>>,
    max: usize,
}

/// One client address's slots and how many connections wait for one.
struct Address {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// The request body bytes its requests hold now (the ingest budget's share per address).
    body_bytes: Arc<AtomicU64>,
}

/// The client a request came from: its address, the key every per-address bound counts it
/// under ([`client_key`]), and the body bytes that key's requests hold now (shared by all
/// connections of the address). Put in each request's extensions by [`serve_connection`].
#[derive(Clone, Debug)]
pub struct Client {
    pub peer: IpAddr,
    pub key: IpAddr,
    pub body_bytes: Arc<AtomicU64>,
}

impl Client {
    /// The client of a request, if it came through [`serve_connection`].
    pub fn of(extensions: &http::Extensions) -> Option<&Client> {
        extensions.get::<Client>()
    }
}

/// One connection's hold on its address: a served slot, or a place in its queue. Either way,
/// the last holder of an address removes it from the map, under the map's lock.
struct AddressHold {
    per_address: Arc<PerAddress>,
    key: IpAddr,
    address: Option<Arc<Address>>,
}

/// One served connection counted against its address; uncounted on drop.
struct AddressSlot {
    _permit: OwnedSemaphorePermit,
    hold: AddressHold,
}

impl AddressSlot {
    /// The client of this connection from `peer`, for its requests.
    fn client(&self, peer: IpAddr) -> Client {
        let address = self.hold.address.as_ref().expect("held while the slot is");
        Client {
            peer,
            key: self.hold.key,
            body_bytes: address.body_bytes.clone(),
        }
    }
}

/// The connections being served, each with what closing it for another client needs: the key
/// of its address, whether a request of it is being answered, and where to ask it to close.
#[derive(Default)]
struct Connections {
    served: Mutex<ServedConnections>,
}

#[derive(Default)]
struct ServedConnections {
    next: u64,
    /// By id, in the order they were accepted.
    open: std::collections::BTreeMap<u64, Served>,
}

struct Served {
    key: IpAddr,
    busy: Arc<AtomicUsize>,
    /// Taken when the connection is asked to close.
    close: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A connection's place in [`Connections`], given up on drop.
struct ServedGuard {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for ServedGuard {
    fn drop(&mut self) {
        let mut served = self.connections.served.lock().expect("never poisoned");
        served.open.remove(&self.id);
    }
}

impl Connections {
    /// Counts a connection from `key` in; its requests being answered are counted in `busy`,
    /// and the receiver fires when it is asked to close.
    fn add(
        self: &Arc<Self>,
        key: IpAddr,
        busy: Arc<AtomicUsize>,
    ) -> (ServedGuard, tokio::sync::oneshot::Receiver<()>) {
        let (close, closing) = tokio::sync::oneshot::channel();
        let mut served = self.served.lock().expect("never poisoned");
        let id = served.next;
        served.next += 1;
        served.open.insert(
            id,
            Served {
                key,
                busy,
                close: Some(close),
            },
        );
        let guard = ServedGuard {
            connections: self.clone(),
            id,
        };
        (guard, closing)
    }

    /// Asks one connection to close, for a client waiting for a slot: of the address with the
    /// most connections open, the oldest idle one, else its oldest (which closes once its
    /// request is answered). An HTTP/1.1 server may close a keep-alive connection between
    /// requests; a client opens another.
    fn shed_one(&self) {
        let mut served = self.served.lock().expect("never poisoned");
        // Those already asked to close are on their way out: not counted.
        let mut per_key: HashMap<IpAddr, usize> = HashMap::new();
        for connection in served.open.values().filter(|c| c.close.is_some()) {
            *per_key.entry(connection.key).or_default() += 1;
        }
        let chosen = served
            .open
            .iter()
            .filter(|(_, c)| c.close.is_some())
            .max_by_key(|(id, c)| {
                let idle = c.busy.load(Ordering::SeqCst) == 0;
                (per_key[&c.key], idle, std::cmp::Reverse(**id))
            })
            .map(|(id, _)| *id);
        if let Some(close) = chosen.and_then(|id| served.open.get_mut(&id)?.close.take()) {
            let _ = close.send(());
        }
    }
}

/// Counts a request of a connection as being answered until its response is ready.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn new(busy: &Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        Self(busy.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The address of the peer a request came from, as [`serve_connection`] put it in the
/// request's extensions (none for a request that did not come through it).
pub fn peer(extensions: &http::Extensions) -> Option<IpAddr> {
    Client::of(extensions).map(|client| client.peer)
}

/// The address a client is counted under, by every per-address bound (connections, body
/// bytes, failed sign-ins): IPv4 as is (also when IPv4-mapped), IPv6 by its /64, since one host
/// is usually given a whole /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !((1u128 << 64) - 1))),
        },
    }
}

impl PerAddress {
    fn hold(self: &Arc<Self>, ip: IpAddr) -> AddressHold {
        let key = client_key(ip);
        let mut addresses = self.addresses.lock().expect("never poisoned");
        let address = addresses
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Address {
                    slots: Arc::new(Semaphore::new(self.max)),
                    waiting: AtomicUsize::new(0),
                    body_bytes: Arc::default(),
                })
            })
            .clone();
        AddressHold {
            per_address: self.clone(),
            key,
            address: Some(address),
        }
    }

    /// Whether a connection from `ip` would get a slot or a place in its address's queue now
    /// ([`PerAddress::take`] would not refuse it at once).
    fn may_take(&self, ip: IpAddr) -> bool {
        let addresses = self.addresses.lock().expect("never poisoned");
        addresses.get(&client_key(ip)).is_none_or(|address| {
            address.slots.available_permits() > 0
                || address.waiting.load(Ordering::SeqCst) < self.max
        })
    }

    /// A slot for a connection from `ip`: at once if one is free; else, if fewer than `max`
    /// connections of that address are already waiting, after waiting up to `patience` for
    /// one; else (or when the wait runs out) `None`.
    async fn take(self: &Arc<Self>, ip: IpAddr, patience: Duration) -> Option<AddressSlot> {
        let hold = self.hold(ip);
        let address = hold.address.clone().expect("held");
        if let Ok(permit) = address.slots.clone().try_acquire_owned() {
            return Some(AddressSlot {
                _permit: permit,
                hold,
            });
        }
        if address.waiting.fetch_add(1, Ordering::SeqCst) >= self.max {
            address.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let permit = tokio::time::timeout(patience, address.slots.clone().acquire_owned()).await;
        address.waiting.fetch_sub(1, Ordering::SeqCst);
        match permit {
            Ok(Ok(permit)) => Some(AddressSlot {
                _permit: permit,
                hold,
            }),
            _ => None,
        }
    }
}

impl Drop for AddressHold {
    fn drop(&mut self) {
        let mut addresses = self.per_address.addresses.lock().expect("never poisoned");
        drop(self.address.take());
        if addresses
            .get(&self.key)
            .is_some_and(|address| Arc::strong_count(address) == 1)
        {
            addresses.remove(&self.key);
        }
    }
}

/// Answers a connection over its address's cap with 503 `overloaded` + Retry-After (once its
/// head is in, within [`REFUSAL_TIME`]) and closes it; its body is never read.
fn refuse(stream: TcpStream, refusing: &Arc<Semaphore>) {
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return; // dropped: closed without an answer
    };
    tokio::spawn(async move {
        let _permit = permit;
        let service = hyper::service::service_fn(|_request| async {
            Ok::<_, Infallible>(
                ApiError::Overloaded {
                    retry_after_secs: 1,
                }
                .into_response(),
            )
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(REFUSAL_TIME)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        let _ = tokio::time::timeout(REFUSAL_TIME, connection).await;
    });
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains open connections
/// (bounded wait).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let per_address = Arc::new(PerAddress {
        addresses: Mutex::default(),
        max: limits.max_connections_per_ip,
    });
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let connections = Arc::new(Connections::default());
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        // With every slot taken, one more connection is accepted (so there is a client to make
        // room for), and waits for the slot the connection closed for it gives back.
        let free = permits.clone().try_acquire_owned().ok();
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    static FAILED: LazyLock<Repeated> = LazyLock::new(|| {
                        Repeated::new(Level::WARN, "accept failed")
                    });
                    if let Some(left_out) = FAILED.write() {
                        tracing::warn!(error = %e, left_out, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A slot freed while the loop waited in accept needs no connection closed for it.
        let free = free.or_else(|| permits.clone().try_acquire_owned().ok());
        let permit = match free {
            Some(permit) => permit,
            None if !per_address.may_take(peer.ip()) => {
                // Refused anyway (its address holds its served and waiting share): no one
                // else's connection is closed for it.
                refuse(stream, &refusing);
                continue;
            }
            None => {
                // One more each second while none comes back (the one asked was answering a
                // long request, or went before it was asked).
                let waited = loop {
                    connections.shed_one();
                    tokio::select! {
                        _ = &mut shutdown => break None,
                        permit = permits.clone().acquire_owned() => {
                            break Some(permit.expect("semaphore never closed"));
                        }
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                };
                match waited {
                    Some(permit) => permit,
                    None => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let per_address = per_address.clone();
        let connections = connections.clone();
        let refusing = refusing.clone();
        let router = router.clone();
        let closing = closing_rx.clone();
        tokio::spawn(async move {
            // A connection waits for its address's slot while holding a connection slot, so
            // waiting is bounded twice: per address (`max_connections_per_ip` waiting) and
            // overall (`max_connections`), and by `header_timeout`, the time a client has
            // anyway to send its head.
            let Some(address_slot) = per_address.take(peer.ip(), limits.header_timeout).await
            else {
                drop(permit);
                refuse(stream, &refusing);
                return;
            };
            serve_connection(
                stream,
                peer,
                router,
                limits,
                closing,
                &connections,
                (permit, address_slot),
            )
            .await;
        });
    }
    let _ = closing_tx.send(true);
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        permits.acquire_many(limits.max_connections as u32),
    )
    .await;
}

/// Serves one connection until it closes, or drains it once `closing` turns true; `slots`
/// (its connection and address slots) are given back when it ends. Each request carries its
/// [`Client`] (the admin token's lockout and the body budget's share count per address).
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: ServeLimits,
    mut closing: tokio::sync::watch::Receiver<bool>,
    connections: &Arc<Connections>,
    slots: (OwnedSemaphorePermit, AddressSlot),
) {
    let client = slots.1.client(peer.ip());
    let busy = Arc::new(AtomicUsize::new(0));
    let (_served, shed) = connections.add(client.key, busy.clone());
    let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
        let answering = Answering::new(&busy);
        request.extensions_mut().insert(client.clone());
        let answer = router.clone().oneshot(request);
        async move {
            let answer = answer.await;
            drop(answering);
            answer
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true)
        // A client may shut its sending side once its request is out (`nc -N`, some proxies):
        // it still gets its answer, which may be the 202 of an event just stored.
        .half_close(true)
        .serve_connection(
            TokioIo::new(WriteStall::new(stream, limits.header_timeout)),
            service,
        );
    tokio::pin!(connection);
    // Asked to close (shutdown, or room for another client): the request being answered, if
    // any, is answered, then the connection closes.
    let asked = async {
        tokio::select! {
            _ = closing.wait_for(|c| *c) => {}
            Ok(()) = shed => {}
        }
    };
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = asked => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(10), connection).await;
        }
    }
}

/// A connection whose writes make no progress for `stall` fails them with `TimedOut`, so hyper
/// closes it: the client is not reading its answers (pipelining requests it never reads the
/// answers of, or gone without a FIN), and would otherwise hold its connection slot for good,
/// since the head and body timeouts cover only reading.
struct WriteStall<S> {
    inner: S,
    stall: Duration,
    /// Armed when a write first cannot proceed; disarmed by any progress.
    blocked: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteStall<S> {
    fn new(inner: S, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            blocked: None,
        }
    }

    /// What a write that did not proceed (`Pending`) answers: still pending, or `TimedOut`
    /// once it has been blocked for `stall`.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stall = self.stall;
        let sleep = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took nothing of its answer for {stall:?}"),
            ))),
        }
    }

    /// `poll` of a write, with the stall bound.
    fn write<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Pending => self.blocked(cx),
            ready => {
                self.blocked = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write(cx, |s, cx| s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for another client is made by closing a connection of the address holding the
    /// most, an idle one before one answering a request, the oldest first.
    #[tokio::test]
    async fn the_connection_closed_for_another_client_is_an_idle_one_of_the_busiest_address() {
        let connections = Arc::new(Connections::default());
        let open = |ip: &str, busy: usize| {
            let key = client_key(ip.parse().unwrap());
            connections.add(key, Arc::new(AtomicUsize::new(busy)))
        };
        let (_a, mut lone) = open("192.0.2.1", 0);
        let (_b1, mut busy) = open("198.51.100.7", 1);
        let (_b2, mut idle_old) = open("198.51.100.7", 0);
        let (_b3, mut idle_new) = open("198.51.100.7", 0);
        let asked = |rx: &mut tokio::sync::oneshot::Receiver<()>| rx.try_recv().is_ok();
        connections.shed_one();
        assert!(
            asked(&mut idle_old),
            "the oldest idle one of the busiest address"
        );
        assert!(!asked(&mut idle_new) && !asked(&mut busy) && !asked(&mut lone));
        connections.shed_one();
        assert!(asked(&mut idle_new), "then the next idle one");
        // Those asked to close are not counted: one connection each now, the idle one first.
        connections.shed_one();
        assert!(asked(&mut lone), "then the other address's idle one");
        connections.shed_one();
        assert!(
            asked(&mut busy),
            "then the one answering (closed once it has answered)"
        );
        drop((_a, _b1, _b2, _b3));
        connections.shed_one();
        assert!(
            connections
                .served
                .lock()
                .unwrap()
                .open
                .values()
                .all(|c| c.close.is_none())
        );
    }

    #[tokio::test]
    async fn clients_are_counted_per_ipv4_address_and_per_ipv6_64_and_a_few_wait() {
        let key = |s: &str| client_key(s.parse().unwrap()).to_string();
        assert_eq!(key("203.0.113.7"), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7"), "203.0.113.7");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        let per_address = Arc::new(PerAddress {
            addresses: Mutex::default(),
            max: 2,
        });
        let now = Duration::ZERO;
        let take = |ip: &str| {
            let per_address = per_address.clone();
            let ip: IpAddr = ip.parse().unwrap();
            async move { per_address.take(ip, now).await }
        };
        let a = take("2001:db8::1").await.unwrap();
        let _b = take("2001:db8::2").await.unwrap();
        assert!(
            take("2001:db8::3").await.is_none(),
            "over the cap, no patience"
        );
        assert!(take("2001:db8:0:1::1").await.is_some(), "another /64");
        // Two may wait for a slot of a full address; a third is refused at once.
        let patient = |ip: &'static str| {
            let per_address = per_address.clone();
            tokio::spawn(async move {
                per_address
                    .take(ip.parse().unwrap(), Duration::from_secs(30))
                    .await
            })
        };
        let (w1, w2) = (patient("2001:db8::4"), patient("2001:db8::5"));
        while per_address.addresses.lock().unwrap()[&key("2001:db8::").parse().unwrap()]
            .waiting
            .load(Ordering::SeqCst)
            < 2
        {
            tokio::task::yield_now().await;
        }
        assert!(
            per_address
                .take("2001:db8::6".parse().unwrap(), Duration::from_secs(30))
                .await
                .is_none(),
            "the queue is full"
        );
        drop(a);
        let (mut w1, mut w2) = (w1, w2);
        let (first, other) = tokio::select! {
            s = &mut w1 => (s.unwrap(), w2),
            s = &mut w2 => (s.unwrap(), w1),
        };
        assert!(first.is_some(), "a freed slot goes to a waiting connection");
        drop(first);
        assert!(
            other.await.unwrap().is_some(),
            "and the next to the next one"
        );
        drop(_b);
        assert!(
            per_address.addresses.lock().unwrap().is_empty(),
            "once nothing holds an address, it is forgotten"
        );
    }
}
