//! Wake-ups between nodes: `NOTIFY hookd_work` says work may be due, and every store listens on
//! a connection of its own (outside the pool), so a node hears the work any node makes. The
//! transactions that make work on the hot path (accepts, finishes) notify in themselves, so the
//! notice costs no transaction of its own and goes out only if they commit; a replay or a
//! reclaim sends one after it ([`super::PostgresStore`]'s `notify_work`).
//!
//! PostgreSQL keeps every notice in one queue (8 GB) until the last session listening has read
//! it, and while that queue is full no transaction that notifies can commit: every node's accepts
//! would be refused. A node frozen with its connection up (a paused VM or container, a process
//! stopped) stops reading, and would end up there. So every listening node also looks, every
//! [`STUCK_CHECK_EVERY`], for hookd listening sessions on its database that the server has been
//! unable to send notices to ever since the last looks ([`Stuck`]), and ends those it has seen so
//! for [`STUCK_FOR`] (`pg_terminate_backend`): the queue then drains, and the frozen node, once it
//! runs again, finds its connection lost and listens anew.
//!
//! Invariants:
//! - A notice is only a hint: a missed one delays work until the next claim or due time, never
//!   loses it (the rows are the queue). So after the listening connection is established again
//!   every waiter is woken once, for the notices it may have missed meanwhile.
//! - The listener reconnects after losing its connection, and stops with the store.
//! - Only a session that runs nothing but hookd's [`LISTEN`], idle, blocked sending to its client
//!   at every look for [`STUCK_FOR`] (the same process: its pid and start time) is ended; a node
//!   that reads its notices is never blocked for long, and being ended costs a listener only a
//!   reconnect. Failing to look or to end one is logged, never fatal.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::{
    sync::{Notify, oneshot},
    time::Instant,
};
use tokio_postgres::{AsyncMessage, Client, Config, Connection, Socket, tls::MakeTlsConnect};

use super::{
    Connections,
    error::Target,
    statements::{Conn, Run},
    tls::Connector,
};
use crate::inbox::InboxError;

/// The listening connection's stream (TLS or not, as the URL asks).
type Stream = <Connector as MakeTlsConnect<Socket>>::Stream;

/// The channel the nodes notify and listen on.
pub(super) const CHANNEL: &str = "hookd_work";

/// The notice, as a statement of the transaction that made the work: PostgreSQL delivers it
/// when that transaction commits, and never if it rolls back.
pub(super) const NOTIFY: &str = "NOTIFY hookd_work";

/// The one statement a listening session runs (so `pg_stat_activity` shows it as that session's
/// query for as long as it lives).
const LISTEN: &str = "LISTEN hookd_work";

/// How often a node looks for listening sessions that stopped reading their notices.
const STUCK_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How long a listening session is seen blocked sending notices, at every look, before it is
/// ended. A node that reads its notices drains them in milliseconds; filling the queue takes
/// hours, so this can afford to be sure.
const STUCK_FOR: Duration = Duration::from_secs(30);

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
    let listen = client.batch_execute(LISTEN);
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

/// A statement selecting `$select` of the hookd listening sessions of this database that the
/// server is blocked sending to (`$1`: [`LISTEN`]) and `$and` holds for; `started` is a
/// session's start in µs since the epoch (with its pid, which session it is).
macro_rules! blocked_listeners {
    ($select:literal, $and:literal) => {
        concat!(
            "SELECT ",
            $select,
            " FROM (SELECT *, (extract(epoch FROM backend_start) * 1000000)::int8 AS started
                    FROM pg_stat_activity) a
             WHERE datname = current_database() AND state = 'idle'
               AND wait_event = 'ClientWrite' AND query = $1 ",
            $and
        )
    };
}

/// The listening sessions a node has seen blocked sending notices to their clients, at every
/// look since it first saw each.
#[derive(Default)]
pub(super) struct Stuck {
    /// By (pid, start in µs since the epoch: a pid the server gives again is another session),
    /// when first seen so.
    seen: HashMap<(i32, i64), Instant>,
}

/// A listening session [`Stuck::look`] ended.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) pid: i32,
    /// The client's address and port, as the server saw it (none over a Unix socket; a pooler's
    /// own behind one).
    pub(super) client: Option<String>,
}

/// What one [`Stuck::look`] did.
#[derive(Debug, Default)]
pub(super) struct Looked {
    pub(super) ended: Vec<Ended>,
    /// The first session it could not end, and why (a role that may not signal another's).
    pub(super) refused: Option<(i32, InboxError)>,
}

impl Stuck {
    /// Looks at the listening sessions of this database once, at `now`: remembers those blocked
    /// sending notices (forgetting any that no longer are), and ends those seen so at every look
    /// for `stuck_for` or more.
    pub(super) async fn look(
        &mut self,
        client: &Conn,
        now: Instant,
        stuck_for: Duration,
    ) -> Result<Looked, InboxError> {
        // `state` and `query` are shown for the sessions of the role looking (and to members of
        // `pg_read_all_stats`): those of other roles are never matched.
        let rows = client
            .query(
                blocked_listeners!("pid, started", "AND pid <> pg_backend_pid()"),
                &[&LISTEN],
            )
            .await?;
        let blocked: HashMap<(i32, i64), Instant> = rows
            .iter()
            .map(|row| {
                let session = (row.get(0), row.get(1));
                (session, self.seen.get(&session).copied().unwrap_or(now))
            })
            .collect();
        self.seen = blocked;
        let due: Vec<(i32, i64)> = self
            .seen
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= stuck_for)
            .map(|(session, _)| *session)
            .collect();
        let mut looked = Looked::default();
        for (pid, started) in due {
            // Still blocked, still the same session: ended by the statement that checks it (in
            // its select list, which only a row past every condition reaches). One statement
            // per session, so one that may not be ended stops no other.
            let ended = client
                .query_opt(
                    blocked_listeners!(
                        "host(client_addr), client_port, pg_terminate_backend(pid)",
                        "AND pid = $2 AND started = $3"
                    ),
                    &[&LISTEN, &pid, &started],
                )
                .await;
            match ended {
                Ok(Some(row)) if row.get::<_, bool>(2) => {
                    self.seen.remove(&(pid, started));
                    let client = row.get::<_, Option<String>>(0).map(|host| {
                        let port: i32 = row.get(1);
                        match host.contains(':') {
                            true => format!("[{host}]:{port}"),
                            false => format!("{host}:{port}"),
                        }
                    });
                    looked.ended.push(Ended { pid, client });
                }
                // Gone, or reading again, since the first read.
                Ok(_) => {}
                Err(e) => {
                    looked.refused.get_or_insert((pid, e.into()));
                }
            }
        }
        Ok(looked)
    }
}

/// Runs [`Stuck::look`] every [`STUCK_CHECK_EVERY`] until aborted (with the store), logging each
/// session it ends. A look missed (no connection, a failure, this node itself paused: a tick
/// long overdue) forgets what earlier ones saw, so a session is ended only after it was seen
/// blocked at every look for [`STUCK_FOR`].
pub(super) fn end_stuck_listeners(connections: Arc<Connections>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stuck = Stuck::default();
        let mut ticks = tokio::time::interval(STUCK_CHECK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Whether the last failure was logged as a warning; reset by a look that works.
        let mut warned = false;
        let mut last_look: Option<Instant> = None;
        loop {
            ticks.tick().await;
            let now = Instant::now();
            if last_look.is_some_and(|at| now.duration_since(at) > STUCK_CHECK_EVERY * 2) {
                stuck = Stuck::default();
            }
            last_look = Some(now);
            // An unreachable database is reported by the operations that need it.
            let Ok(client) = connections.get().await else {
                stuck = Stuck::default();
                continue;
            };
            let looked = match stuck.look(&client, now, STUCK_FOR).await {
                Ok(looked) => looked,
                Err(e) => {
                    stuck = Stuck::default();
                    Looked {
                        ended: Vec::new(),
                        refused: Some((0, e)),
                    }
                }
            };
            for session in looked.ended {
                tracing::warn!(
                    pid = session.pid,
                    client = session.client.as_deref().unwrap_or("local socket"),
                    "inbox: ended a node's listening session that had not read its notices for \
                     {}s (a node frozen with its connection up: the server's notice queue would \
                     fill and refuse every node's accepts); that node listens again when it runs",
                    STUCK_FOR.as_secs()
                );
            }
            match looked.refused {
                // Once in a row: the next failures are most likely the same one (a role that
                // may not end another role's sessions, for one).
                Some((pid, e)) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e, pid,
                        "inbox: looking for, or ending, listening sessions that stopped reading \
                         failed (said once until a look works; a node frozen with its connection \
                         up would fill the server's notice queue)");
                }
                Some((pid, e)) => tracing::debug!(error = %e, pid,
                    "inbox: looking for, or ending, listening sessions that stopped reading failed"),
                None => warned = false,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_notice_is_on_the_channel_listened_to() {
        assert_eq!(super::NOTIFY, format!("NOTIFY {}", super::CHANNEL));
        assert_eq!(super::LISTEN, format!("LISTEN {}", super::CHANNEL));
    }
}
