//! PostgreSQL's errors sorted into the inbox's: what a user can act on at connect (unreachable,
//! refused credentials, a bad URL) by name, a server away and a prepared statement a pooler
//! lost (saying what to set) as [`InboxError::Unavailable`], lock and serialization failures as
//! [`InboxError::Busy`], the pool's closing as [`InboxError::WriterGone`], the rest as
//! [`InboxError::Storage`].
//!
//! Invariants:
//! - A `tokio_postgres::Error` never leaves this room as itself; it crosses only as the text of
//!   its cause chain (in an [`InboxError`]'s [`StorageError`](crate::inbox::StorageError), or
//!   as a reason), so whatever shows an inbox error shows what the server said.
//! - No error names the password: the database is named by [`Target`], which never holds it,
//!   and a reason that would quote it has it masked.

use std::{fmt::Write as _, sync::Arc};

use deadpool_postgres::PoolError;
use tokio_postgres::{Config, config::Host, error::SqlState};

use crate::inbox::InboxError;

/// Where a database is, as errors and logs may name it: `user@host:port/name`, without the
/// password (which is kept only to mask it should a server message ever quote it).
#[derive(Clone)]
pub(super) struct Target {
    shown: String,
    password: Option<String>,
}

impl Target {
    pub(super) fn of(config: &Config) -> Self {
        let mut shown = String::new();
        if let Some(user) = config.get_user() {
            let _ = write!(shown, "{user}@");
        }
        let ports = config.get_ports();
        for (i, host) in config.get_hosts().iter().enumerate() {
            if i > 0 {
                shown.push(',');
            }
            match host {
                Host::Tcp(name) => shown.push_str(name),
                Host::Unix(path) => shown.push_str(&path.display().to_string()),
            }
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let _ = write!(shown, ":{port}");
        }
        let _ = write!(shown, "/{}", config.get_dbname().unwrap_or_default());
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .filter(|p| !p.is_empty());
        Self { shown, password }
    }

    /// The error's cause chain as text, the password masked should any part quote it (and what
    /// to set, for a prepared statement a pooler lost).
    pub(super) fn reason(&self, e: &(dyn std::error::Error + 'static)) -> String {
        let reason = match e.downcast_ref::<tokio_postgres::Error>() {
            Some(e) => described(e),
            None => chain(e),
        };
        match &self.password {
            Some(password) => reason.replace(password.as_str(), "***"),
            None => reason,
        }
    }

    /// A failure to connect (or to use the first connection), sorted by what the user must fix.
    pub(super) fn connect_error(&self, e: tokio_postgres::Error) -> InboxError {
        let code = e.code();
        let refused_credentials = code.is_some_and(|code| {
            *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        }) // The client's own kind when the server asks for a password it was not given.
            || e.to_string() == "authentication error";
        let unreachable =
            e.as_db_error().is_none() || code == Some(&SqlState::INVALID_CATALOG_NAME);
        if refused_credentials {
            InboxError::AuthFailed {
                database: self.to_string(),
                reason: self.reason(&e),
            }
        } else if unreachable {
            InboxError::Unreachable {
                database: self.to_string(),
                reason: self.reason(&e),
            }
        } else {
            e.into()
        }
    }

    /// A pool failure met while connecting: the backend's error sorted as [`Target::connect_error`].
    pub(super) fn pool_error(&self, e: PoolError) -> InboxError {
        match e {
            PoolError::Backend(e) => self.connect_error(e),
            other => other.into(),
        }
    }
}

/// Whether `e` says the server is gone or going (a cut connection, one that cannot be made, a
/// server shutting down or recovering, too many connections): the operation may work once it is
/// back. Class 08, connection exceptions, is what a pooler between them answers when it cannot
/// reach the server (PgBouncer: `08P01 server_login_retry`, `server conn crashed?`).
fn server_away(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        return away(db.code()) || notify_queue_full(db.code(), db.file());
    }
    // The client's own errors: only the transport ones (not a row that fails to convert).
    let io = std::iter::successors(std::error::Error::source(e), |cause| cause.source())
        .any(|cause| cause.is::<std::io::Error>());
    let text = e.to_string();
    e.is_closed()
        || io
        || text.starts_with("error connecting")
        || text.starts_with("error communicating")
        || text.starts_with("timeout")
}

/// A storage error that is only `text` (said by hookd, not by the server).
pub(super) fn storage_error(text: String) -> InboxError {
    InboxError::Storage(Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
        text,
    )))
}

/// Lets the room's SQL use `?`: a server that is away is [`InboxError::Unavailable`] (too many
/// connections included, see [`away`]), lock and serialization failures are
/// [`InboxError::Busy`] (the operation may be tried again), the rest [`InboxError::Storage`].
impl From<tokio_postgres::Error> for InboxError {
    fn from(e: tokio_postgres::Error) -> Self {
        if server_away(&e) {
            return InboxError::Unavailable(Arc::new(Described::from(e)));
        }
        if pooled_statement_lost(&e) {
            // Answered 503 (the provider retries, an attempt's record is sent again), never a
            // 500; its text says what to set.
            return InboxError::Unavailable(Arc::new(Described::from(e)));
        }
        // A statement cancelled (`statement_timeout`, `lock_timeout`'s kin, `pg_cancel_backend`)
        // may run in time when tried again, as a lock it lost may be won.
        let busy = e.code().is_some_and(|code| {
            [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::QUERY_CANCELED,
            ]
            .contains(code)
        });
        if busy {
            InboxError::Busy(Arc::new(Described::from(e)))
        } else {
            InboxError::Storage(Arc::new(Described::from(e)))
        }
    }
}

/// A `tokio_postgres::Error` shown with its causes: by itself it says only "db error" and keeps
/// the server's message (`ERROR: relation "x" does not exist`) as its source, which a log line
/// of the error's text drops. The causes are in the text, so it has no source of its own.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Described(String);

impl From<tokio_postgres::Error> for Described {
    fn from(e: tokio_postgres::Error) -> Self {
        Self(described(&e))
    }
}

/// `e` as text: its cause chain, and what to set when a pooler lost a prepared statement.
fn described(e: &tokio_postgres::Error) -> String {
    let text = chain(e);
    if pooled_statement_lost(e) {
        format!("{text}: {POOLER_HINT}")
    } else {
        text
    }
}

/// A pool that is closed has stopped taking work ([`InboxError::WriterGone`], as a closed
/// SQLite writer); one with no connection free in time is busy. A backend error is a new
/// connection that could not be made: whatever the server said (a database taken offline,
/// `ALLOW_CONNECTIONS false`, answers with no connection-class code), the server is away for
/// this node while it lasts. (At start-up, [`Target::connect_error`] names it instead.)
impl From<PoolError> for InboxError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Closed => InboxError::WriterGone,
            PoolError::Backend(e) => InboxError::Unavailable(Arc::new(Described::from(e))),
            timeout @ PoolError::Timeout(_) => InboxError::Busy(Arc::new(timeout)),
            other => InboxError::Storage(Arc::new(other)),
        }
    }
}

/// Whether a server's `code` says it is away for now: class 08, the shutdowns, class 53 (its
/// disk full, out of memory, too many connections), a read-only transaction (a failover that
/// landed on a standby, or a primary demoted or set `default_transaction_read_only`), and
/// class 28, a login refused to a new connection while hookd runs (a password being rotated, a
/// `pg_hba.conf` being edited): answered 503 and retried like an outage, never a 500 nor an
/// attempt's record given up. (At start-up the same refusal stops hookd, named as such:
/// [`Target::connect_error`].)
fn away(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || code.code().starts_with("28")
        || code.code().starts_with("53")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(code)
}

/// Whether an error raised in PostgreSQL's source file `file` with `code` is its NOTIFY queue
/// full (`too many notifications in the NOTIFY queue`, raised at COMMIT, which then rolls
/// back): a listening session that stopped reading (a node frozen, its kernel still up) holds
/// the queue's tail, and once the queue is full every transaction that notifies fails. hookd's
/// accepts and finishes notify in their own transaction (the wake-up hint), so that is the
/// server unable to take writes for now: a 503 and a record sent again, as an outage, never a
/// 500 nor an attempt's result given up. The code alone (`54000`, program limit exceeded) also
/// stands for limits that no retry passes (an index row too large), hence the file.
fn notify_queue_full(code: &SqlState, file: Option<&str>) -> bool {
    *code == SqlState::PROGRAM_LIMIT_EXCEEDED && file == Some("async.c")
}

/// What an error whose prepared statement was lost between transactions says: the one cause
/// hookd knows of.
const POOLER_HINT: &str = "hookd's prepared statements do not survive from one transaction to \
     the next, as behind a pooler in transaction mode (PgBouncer's pool_mode = transaction): set \
     server.database_pooler = \"transaction\"";

/// Whether `e` says a statement hookd prepared is missing, or a name it prepared one under is
/// taken: without `database_pooler`, hookd keeps its statements prepared on its connections, so
/// that happens only when a pooler in transaction mode runs them on other server connections
/// (with it, hookd prepares no statement of those names).
fn pooled_statement_lost(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| {
        [
            SqlState::INVALID_SQL_STATEMENT_NAME,
            SqlState::DUPLICATE_PSTATEMENT,
        ]
        .contains(code)
    })
}

/// Whether `e` is a unique-index violation (a claim that lost a race for a key's one lease).
pub(super) fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// An error and its causes as one line (`tokio_postgres` shows the cause only as the source).
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(e) = cause {
        let _ = write!(text, ": {e}");
        cause = e.source();
    }
    text
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A login refused to a new connection while hookd runs (a rotated password) is the server
    /// away for now, as a shutdown is: a 503 and a record sent again, not a 500 nor an
    /// attempt's record given up. A missing privilege or a conflict is not.
    #[test]
    fn a_login_refused_while_running_is_the_server_away() {
        for code in [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::CONNECTION_FAILURE,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::TOO_MANY_CONNECTIONS,
        ] {
            assert!(away(&code), "{}", code.code());
        }
        for code in [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNIQUE_VIOLATION,
            SqlState::T_R_SERIALIZATION_FAILURE,
        ] {
            assert!(!away(&code), "{}", code.code());
        }
    }

    #[test]
    fn a_full_notify_queue_is_the_server_away_and_other_limits_are_not() {
        let limit = SqlState::PROGRAM_LIMIT_EXCEEDED;
        assert!(notify_queue_full(&limit, Some("async.c")));
        // An index row over the B-tree's maximum: the same code, no retry passes it.
        assert!(!notify_queue_full(&limit, Some("nbtutils.c")));
        assert!(!notify_queue_full(&limit, None));
        assert!(!notify_queue_full(
            &SqlState::UNIQUE_VIOLATION,
            Some("async.c")
        ));
    }
}
