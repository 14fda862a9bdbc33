//! The accept loop both listeners use, hardened for hostile clients.
//!
//! Invariants: a client must send its request head within `header_timeout` (slow-loris);
//! at most `max_connections` connections are served at once (the rest wait in the kernel's
//! backlog); on shutdown no new connection is accepted and open ones finish their request.

use std::{sync::Arc, time::Duration};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};

use crate::config::ServerConfig;

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

impl From<&ServerConfig> for ServeLimits {
    fn from(server: &ServerConfig) -> Self {
        Self {
            header_timeout: server.header_timeout,
            max_connections: server.max_connections,
        }
    }
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
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
        };
        let (stream, _) = tokio::select! {
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
        let service = TowerToHyperService::new(router.clone());
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
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
