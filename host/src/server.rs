//! The accept loop both listeners use, hardened for hostile clients.
//!
//! Invariants: a client must send its request head within `header_timeout` (slow-loris), and
//! a head is at most [`MAX_HEAD_BYTES`]; at most `max_connections` connections are served at
//! once (the rest wait in the kernel's backlog), at most `max_connections_per_ip` of them from
//! one client address (more are answered 503 `overloaded` at once and closed, without taking a
//! slot, so one client cannot hold every slot); on shutdown no new connection is accepted and
//! open ones finish their request.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, Ipv6Addr},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, response::IntoResponse};
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::{config::ServerConfig, error::ApiError};

/// hyper's read buffer per connection, and so the largest request head (431 beyond): webhook
/// heads are a few KiB; hyper's default (~400 KiB) let 4 096 slow heads hold 1.6 GiB.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Connections refused over the per-address cap that are being answered at once; beyond it
/// they are closed without an answer.
const MAX_REFUSING: usize = 256;

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

/// Open connections per client address.
struct PerAddress {
    open: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

/// One open connection counted against its address; uncounted on drop.
struct AddressSlot {
    per_address: Arc<PerAddress>,
    key: IpAddr,
}

impl PerAddress {
    /// The address a client is counted under: IPv4 as is (also when IPv4-mapped), IPv6 by its
    /// /64, since one host is usually given a whole /64.
    fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !((1u128 << 64) - 1))),
            },
        }
    }

    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let key = Self::key(ip);
        let mut open = self.open.lock().expect("never poisoned");
        let count = open.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            per_address: self.clone(),
            key,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.per_address.open.lock().expect("never poisoned");
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
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
        open: Mutex::default(),
        max: limits.max_connections_per_ip,
    });
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Some(address_slot) = per_address.take(peer.ip()) else {
            drop(permit);
            refuse(stream, &refusing);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _address_slot = address_slot;
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = async { let _ = closing.wait_for(|c| *c).await; } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(10), connection).await;
                }
            }
        });
    }
    let _ = closing_tx.send(true);
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        permits.acquire_many(limits.max_connections as u32),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_counted_per_ipv4_address_and_per_ipv6_64() {
        let key = |s: &str| PerAddress::key(s.parse().unwrap()).to_string();
        assert_eq!(key("203.0.113.7"), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7"), "203.0.113.7");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        let per_address = Arc::new(PerAddress {
            open: Mutex::default(),
            max: 2,
        });
        let a = per_address.take("2001:db8::1".parse().unwrap()).unwrap();
        let _b = per_address.take("2001:db8::2".parse().unwrap()).unwrap();
        assert!(per_address.take("2001:db8::3".parse().unwrap()).is_none());
        assert!(
            per_address
                .take("2001:db8:0:1::1".parse().unwrap())
                .is_some()
        );
        drop(a);
        assert!(per_address.take("2001:db8::3".parse().unwrap()).is_some());
    }
}
