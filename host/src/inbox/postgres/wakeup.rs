//! Wake-ups between nodes: `NOTIFY hookd_work` says work may be due, and every store listens on
//! a connection of its own (outside the pool), so a node hears the work any node makes. The
//! transactions that make work on the hot path (accepts, finishes) notify in themselves, so the
//! notice costs no transaction of its own and goes out only if they commit; a replay or a
//! reclaim sends one after it ([`super::PostgresStore`]'s `notify_work`).
//!
//! Invariants:
//! - A notice is only a hint: a missed one delays work until the next claim or due time, never
//!   loses it (the rows are the queue). So after the listening connection is established again
//!   every waiter is woken once, for the notices it may have missed meanwhile.
//! - The listener reconnects after losing its connection, and stops with the store.

use std::{sync::Arc, time::Duration};

use tokio::sync::{Notify, oneshot};
use tokio_postgres::{AsyncMessage, Client, Config, Connection, Socket, tls::MakeTlsConnect};

use super::{error::Target, tls::Connector};
use crate::inbox::InboxError;

/// The listening connection's stream (TLS or not, as the URL asks).
type Stream = <Connector as MakeTlsConnect<Socket>>::Stream;

/// The channel the nodes notify and listen on.
pub(super) const CHANNEL: &str = "hookd_work";

/// The notice, as a statement of the transaction that made the work: PostgreSQL delivers it
/// when that transaction commits, and never if it rolls back.
pub(super) const NOTIFY: &str = "NOTIFY hookd_work";

/// How long the listener waits before connecting again after losing its connection; each
/// failed attempt doubles it, up to [`RECONNECT_AT_MOST`] (the claims' polling covers the
/// notices missed meanwhile).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
const RECONNECT_AT_MOST: Duration = Duration::from_secs(8);

/// While the database stays away, a failed reconnect is logged as a warning at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Wakes every waiter, and the next one to come if none waits (as the façade's wake-up does).
pub(super) fn wake(work: &Notify) {
    work.notify_waiters();
    work.notify_one();
}

/// Starts listening for notices of work on a connection of its own, waking `work` on each;
/// returns once the first `LISTEN` is in place (so no notice sent after it is missed), with
/// the listener's task.
pub(super) async fn listen(
    config: Config,
    connector: Connector,
    target: &Target,
    work: Arc<Notify>,
) -> Result<tokio::task::JoinHandle<()>, InboxError> {
    let (client, connection) = config
        .connect(connector.clone())
        .await
        .map_err(|e| target.connect_error(e))?;
    let (listening, listened) = oneshot::channel();
    let task = tokio::spawn(listen_loop(
        config,
        connector,
        (client, connection),
        work,
        listening,
        target.clone(),
    ));
    match listened.await {
        Ok(Ok(())) => Ok(task),
        Ok(Err(e)) => {
            task.abort();
            Err(target.connect_error(e))
        }
        Err(_) => Err(InboxError::Unreachable {
            database: target.to_string(),
            reason: "the connection closed before it listened for other nodes' work".into(),
        }),
    }
}

/// Listens on `client`, then on every connection made again after it is lost.
/// Its warnings say why, through `target` (the error's causes, the password masked: a
/// `tokio_postgres::Error` shown alone says only "db error").
async fn listen_loop(
    config: Config,
    connector: Connector,
    (client, connection): (Client, Connection<Socket, Stream>),
    work: Arc<Notify>,
    listening: oneshot::Sender<Result<(), tokio_postgres::Error>>,
    target: Target,
) {
    let mut first = Some(listening);
    let mut connected = Some((client, connection));
    let mut wait = RECONNECT_AFTER;
    // When a failed reconnect was last logged as a warning, while the database stays away.
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        if let Some((client, connection)) = connected.take() {
            let listened = listen_until_lost(client, connection, &work, first.take()).await;
            if let Err(e) = listened {
                let error = target.reason(&e);
                tracing::warn!(%error, "inbox: lost the connection that hears other nodes' work");
            }
            wait = RECONNECT_AFTER;
        }
        tokio::time::sleep(wait).await;
        match config.connect(connector.clone()).await {
            Ok(pair) => {
                if warned.take().is_some() {
                    tracing::info!("inbox: hearing other nodes' work again");
                }
                connected = Some(pair);
            }
            Err(e) => {
                wait = (wait * 2).min(RECONNECT_AT_MOST);
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    warned = Some(tokio::time::Instant::now());
                    let error = target.reason(&e);
                    tracing::warn!(%error, retry_in = ?wait,
                        "inbox: cannot reconnect to hear other nodes' work (said again at most once a minute)");
                } else {
                    let error = target.reason(&e);
                    tracing::debug!(%error, "inbox: cannot reconnect to hear other nodes' work");
                }
            }
        }
    }
}

/// Sends `LISTEN` on `client` and wakes `work` on every notice until the connection ends.
async fn listen_until_lost(
    client: Client,
    mut connection: Connection<Socket, Stream>,
    work: &Notify,
    listening: Option<oneshot::Sender<Result<(), tokio_postgres::Error>>>,
) -> Result<(), tokio_postgres::Error> {
    let messages = async {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(_))) => wake(work),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            }
        }
    };
    let mut messages = std::pin::pin!(messages);
    let reconnected = listening.is_none();
    let sql = format!("LISTEN {CHANNEL}");
    let listen = client.batch_execute(&sql);
    // `Ok(false)`: the connection closed before the `LISTEN` was answered.
    let listened = tokio::select! {
        listened = listen => listened.map(|()| true),
        ended = &mut messages => ended.map(|()| false),
    };
    match (listened, listening) {
        (Ok(true), Some(first)) => {
            let _ = first.send(Ok(()));
        }
        (Ok(true), None) => {}
        (Ok(false), _) => return Ok(()),
        (Err(e), Some(first)) => {
            let _ = first.send(Err(e));
            return Ok(());
        }
        (Err(e), None) => return Err(e),
    }
    if reconnected {
        // Whatever was notified while not listening is found by a claim now.
        wake(work);
    }
    let ended = messages.await;
    drop(client);
    ended
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_notice_is_on_the_channel_listened_to() {
        assert_eq!(super::NOTIFY, format!("NOTIFY {}", super::CHANNEL));
    }
}
