//! The PostgreSQL backend of the inbox: one database that several hookd nodes share, reached
//! through a pool of connections (`deadpool-postgres` over `tokio-postgres`).
//!
//! [`PostgresStore`] implements the storage contract ([`Store`]) with each write operation in
//! one transaction on a pooled connection (concurrent accepts, and finishes that write no
//! plugin state, share one: `batch.rs`; such a batch is one statement, sent with its `BEGIN`
//! and `COMMIT` in one round trip) and each read as statements on one: the SQL of each
//! role is a file of the same name (`accept`, `quarantine`, `lease`, `replay`, `retention`,
//! `state`, `views`); `schema.rs` holds the migrations and `error.rs` sorts PostgreSQL's errors into the
//! inbox's (and names a database without its password). Every statement reaches the server
//! through `statements.rs`, prepared and cached per connection, or sent unnamed behind a
//! pooler in transaction mode (`server.database_pooler`).
//!
//! Nodes wake each other through the database (`wakeup.rs`: `NOTIFY`, and a listening
//! connection of each store's own; none behind a pooler in transaction mode, where `LISTEN`
//! cannot pass and the nodes find each other's work by polling).
//!
//! The connection is encrypted as the URL's libpq options say (`sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`; `tls.rs`): the roots every TLS client of hookd trusts, or only the
//! `sslrootcert` file when one is named.
//!
//! Invariants:
//! - This room is the only code that names `tokio_postgres` or `deadpool_postgres`.
//! - A caller is answered only after the transaction that holds its change committed.
//! - Every guarantee holds across nodes as within one: a duplicate is decided by the unique
//!   constraint (`ON CONFLICT`), a claim locks what it leases (`FOR UPDATE SKIP LOCKED`) and a
//!   second running delivery of one ordering key is refused by a unique index, a finish
//!   re-checks its lease under the row's lock, and a state commit locks the keys it read or
//!   writes (transaction advisory locks, in one order) before checking their versions.
//! - Other nodes may hold leases: [`Capabilities::single_node`] is false, and
//!   [`Store::reclaim_all`] is refused.
//! - The blocking state reads need tokio's multi-thread runtime (they block in place), as the
//!   runtime's handler pool is.

/// Runs `$body` in a transaction `$tx` on a connection of `$connections` (a [`Connections`]),
/// commits, and counts the commit in `$commits`; a `?` in `$body` rolls the transaction back
/// (it is dropped uncommitted).
macro_rules! in_transaction {
    ($connections:expr, $commits:expr, $tx:ident => $body:expr) => {{
        let started = std::time::Instant::now();
        let mut connection = $connections.get().await?;
        let $tx = connection.transaction().await?;
        let value = $body;
        $tx.commit().await?;
        $commits.committed(1, started);
        value
    }};
}

mod accept;
mod batch;
mod cluster;
mod error;
mod lease;
mod quarantine;
mod replay;
mod retention;
pub(in crate::inbox) mod schema;
mod state;
mod statements;
mod statistics;
mod tls;
mod views;
mod wakeup;

#[cfg(test)]
mod testdb;
#[cfg(test)]
pub(super) use testdb::TestDatabase;
#[cfg(test)]
mod tests;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::Config;

use self::{
    error::Target,
    statements::{Conn, Run, Statements},
};
use super::{
    Accepted, ClaimRequest, Commits, DeadLetterGroup, Edited, EventDetail, EventFilter,
    EventSummary, Finish, Finished, HeldRequest, InboxError, Pruned, Quarantined, RawRequest,
    ReplayFilter, StateEdit, StateEntry, StateKeyFilter, StateValue,
    error::StorageError,
    retention::PruneBatch,
    store::{Capabilities, ClaimOutcome, Counts, Decide, NewEvent, Reclaimed, Store},
};
use crate::{
    config::Pooler,
    ids::SourceName,
    model::{DeliveryState, StateUsage},
};

/// Connections a store keeps to the database unless told otherwise.
pub(super) const DEFAULT_POOL_SIZE: usize = 16;

/// How long connecting to the server may take when the URL sets no `connect_timeout`: an
/// address that drops packets fails the start-up instead of hanging it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// After a new connection to the database failed, no other is tried for this long: callers
/// meanwhile are answered [`InboxError::Unavailable`] at once, instead of each opening (and
/// authenticating) a connection of its own to a server that is away.
const CONNECT_BACKOFF: Duration = Duration::from_millis(250);

/// A connection to a server that stopped acknowledging for this long is closed by the kernel
/// (`TCP_USER_TIMEOUT`), and an idle one is probed by keepalives after [`KEEPALIVE_IDLE`], unless
/// the URL sets its own: a dead server's connections fail, and are replaced, in seconds instead of
/// the default quarter of an hour.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// A session that sits this long inside a transaction is ended by the server
/// (`idle_in_transaction_session_timeout`, sent when connecting unless the URL's `options` set
/// it), which rolls it back and frees its locks. hookd's transactions never wait between their
/// statements; a session that does belongs to a node that froze (stopped, swapped out) or lost
/// its network mid-transaction, and its row and key locks would otherwise hold every other
/// node's finishes of those deliveries and keys, and keep its leases from being taken back,
/// until the server's TCP keepalive gave up on it: two hours by default.
const IDLE_IN_TRANSACTION: &str = "idle_in_transaction_session_timeout=30s";

/// The isolation level of every statement sent outside hookd's own transactions (a heartbeat,
/// a notice), as its transactions name it themselves ([`statements::BEGIN`]): a database's or
/// role's `REPEATABLE READ` default would fail a statement that waited for a row another node
/// changed. Sent like [`IDLE_IN_TRANSACTION`], when connecting unless the URL's `options` set
/// it (the space escaped as the server's option syntax wants).
const READ_COMMITTED: &str = r"default_transaction_isolation=read\ committed";

/// No JIT compilation of hookd's statements. PostgreSQL compiles a statement with LLVM once its
/// plan's estimated cost passes `jit_above_cost` (100 000 by default), and the claim's generic
/// plan is costed by the deliveries its statistics count as waiting: with some 100 000 waiting
/// for a handler that is not loaded (or a large backlog of any), each claim spent 17–400 ms
/// compiling a statement that runs in under 1 ms, and a node handled 1 100–1 300 deliveries/s
/// instead of 3 500–3 600. hookd's statements are small lookups and writes, which JIT never
/// pays back. Sent like [`IDLE_IN_TRANSACTION`]; behind a pooler the claim's and the finish's
/// transactions set it themselves ([`generic_plans`], [`BEGIN_GENERIC`]).
const NO_JIT: &str = "jit=off";

/// The inbox's PostgreSQL database, shared with whatever other nodes use it.
pub(super) struct PostgresStore {
    connections: Arc<Connections>,
    /// Accepts, committed in shared transactions.
    accepts: batch::Batcher<NewEvent, Accepted>,
    /// Finishes that write no plugin state, committed in shared transactions.
    finishes: batch::Batcher<Finish, Finished>,
    /// The database, as errors name it.
    target: Target,
    /// Write transactions committed by this store (`hookd_inbox_commits_total`).
    commits: Arc<Commits>,
    /// Woken by every notice of work on the database, this node's own included.
    work: Arc<tokio::sync::Notify>,
    /// The store's own tasks (listening for those notices, keeping the planner's statistics
    /// current); stopped at close.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The pool of connections to the database, which pauses new connects after one failed.
pub(super) struct Connections {
    pool: Pool,
    /// How statements are sent on them.
    statements: Arc<Statements>,
    /// Until when new connections are not tried, and why the last one failed.
    refused: Mutex<Option<(tokio::time::Instant, StorageError)>>,
}

impl Connections {
    /// A pooled connection ([`InboxError::WriterGone`] once closed). Within
    /// [`CONNECT_BACKOFF`] of a failed connect, with no idle connection to hand out, the
    /// failure is the answer again without a new attempt.
    async fn get(&self) -> Result<Conn, InboxError> {
        let refused = self.refused.lock().expect("poisoned").clone();
        if let Some((until, why)) = refused
            && tokio::time::Instant::now() < until
            && self.pool.status().available == 0
        {
            return Err(InboxError::Unavailable(why));
        }
        match self.pool.get().await {
            Ok(client) => Ok(Conn::new(client, Arc::clone(&self.statements))),
            Err(e) => {
                let e = InboxError::from(e);
                if let InboxError::Unavailable(why) = &e {
                    let until = tokio::time::Instant::now() + CONNECT_BACKOFF;
                    *self.refused.lock().expect("poisoned") = Some((until, Arc::clone(why)));
                }
                Err(e)
            }
        }
    }
}

/// The connection settings of `url`, with hookd's defaults where the URL sets none: a connect
/// timeout, and a dead server noticed in tens of seconds (unacknowledged data, idle keepalives)
/// rather than the kernel's minutes or hours; and the TLS its `ssl*` options ask for
/// ([`tls`]).
///
/// When hookd talks to PostgreSQL itself (`pooler` none), the server is also told to end a
/// session idle inside a transaction ([`IDLE_IN_TRANSACTION`]), to run statements outside a
/// transaction at `READ COMMITTED` ([`READ_COMMITTED`]) and not to JIT-compile any
/// ([`NO_JIT`]); a pooler in any mode refuses those
/// startup options (PgBouncer's own `idle_transaction_timeout` does the first's job there, and
/// the few statements hookd sends outside a transaction then run at the database's default).
fn connection_config(url: &str, pooler: Pooler) -> Result<(Config, tls::Connector), InboxError> {
    let (url, tls_options) = tls::split(url)?;
    let mut config: Config = url.parse().map_err(|e| InboxError::InvalidUrl {
        // The parser's reasons name an option, never its value.
        reason: error::chain(&e),
    })?;
    let connector = tls::connector(&tls_options, &mut config)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        // tokio-postgres' default (two hours), so not set by the URL.
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if pooler == Pooler::None {
        let mut options = config.get_options().unwrap_or("").to_owned();
        for (name, setting) in [
            ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION),
            ("default_transaction_isolation", READ_COMMITTED),
            ("jit", NO_JIT),
        ] {
            if !sets_option(&options, name) {
                options = format!("{options} -c {setting}");
            }
        }
        config.options(options.trim_start());
    }
    Ok((config, connector))
}

/// Whether a connection's `options` (`-c name=value`, `-cname=value` or `--name=value`, as
/// PostgreSQL takes them) set `name`, by its exact name (`jit_above_cost` does not set `jit`).
fn sets_option(options: &str, name: &str) -> bool {
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let assignment = match word {
            "-c" => words.next().unwrap_or(""),
            _ => word
                .strip_prefix("-c")
                .or_else(|| word.strip_prefix("--"))
                .unwrap_or(""),
        };
        let set = assignment
            .split_once('=')
            .map_or(assignment, |(set, _)| set);
        if set.replace('-', "_") == name {
            return true;
        }
    }
    false
}

impl PostgresStore {
    /// Connects to the database at `url` (a `postgres://` URL or a key=value string) with up
    /// to `pool_size` connections, through `pooler`, and brings its schema to this hookd's
    /// version.
    pub(super) async fn connect(
        url: &str,
        pool_size: usize,
        pooler: Pooler,
    ) -> Result<Self, InboxError> {
        let (config, connector) = connection_config(url, pooler)?;
        let target = Target::of(&config);
        let manager = Manager::from_config(
            config.clone(),
            connector.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| InboxError::Storage(std::sync::Arc::new(e)))?;
        let statements = Arc::new(Statements::new(pooler));
        let client = pool.get().await.map_err(|e| target.pool_error(e))?;
        let mut conn = Conn::new(client, Arc::clone(&statements));
        schema::migrate(&mut conn, &target).await?;
        schema::check_privileges(&conn, &target).await?;
        drop(conn);
        let work = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        // A pooler in transaction mode hands `LISTEN` a server connection only for that
        // statement: the other nodes' work is found by polling alone.
        if pooler != Pooler::Transaction {
            tasks.push(wakeup::listen(config, connector, &target, Arc::clone(&work)).await?);
        }
        let connections = Arc::new(Connections {
            pool,
            statements,
            refused: Mutex::new(None),
        });
        tasks.push(statistics::start(Arc::clone(&connections)));
        if pooler != Pooler::Transaction {
            tasks.push(wakeup::end_stuck_listeners(Arc::clone(&connections)));
        }
        let commits = Arc::new(Commits::default());
        Ok(Self {
            accepts: {
                let (connections, commits) = (Arc::clone(&connections), Arc::clone(&commits));
                batch::Batcher::start(move |batch| {
                    let (connections, commits) = (Arc::clone(&connections), Arc::clone(&commits));
                    async move { accept::commit_accepts(&connections, &commits, batch).await }
                })
            },
            finishes: {
                let (connections, commits) = (Arc::clone(&connections), Arc::clone(&commits));
                batch::Batcher::start(move |batch| {
                    let (connections, commits) = (Arc::clone(&connections), Arc::clone(&commits));
                    async move { lease::commit_finishes(&connections, &commits, batch).await }
                })
            },
            tasks: Mutex::new(tasks),
            connections,
            target,
            commits,
            work,
        })
    }

    /// A pooled connection (see [`Connections::get`]).
    async fn client(&self) -> Result<Conn, InboxError> {
        self.connections.get().await
    }

    /// Counts a committed write transaction of one operation, begun at `started`.
    fn committed(&self, started: std::time::Instant) {
        self.commits.committed(1, started);
    }

    /// Runs a read from a synchronous caller: blocks this worker thread in place (so the
    /// runtime moves its other tasks away) until the read is answered. Needs tokio's
    /// multi-thread runtime.
    fn block_on<T>(
        &self,
        read: impl Future<Output = Result<T, InboxError>>,
    ) -> Result<T, InboxError> {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(read))
    }
}

impl Drop for PostgresStore {
    /// A store dropped without [`Store::close`] stops its tasks too (the listener would hold
    /// its connection, and reconnect, for ever).
    fn drop(&mut self) {
        for task in self.tasks.get_mut().expect("poisoned").drain(..) {
            task.abort();
        }
    }
}

/// Makes the rest of transaction `tx` run each prepared statement on its cached generic plan.
///
/// For the claim's and the finish's statements PostgreSQL otherwise re-plans most executions
/// (their arrays make each custom plan look cheaper): measured, 2 500 plans costing 0.7 s of
/// the server's CPU for 20 000 handled events, where the generic plans run as fast. Only the
/// transactions of that path ask for it; the admin views, whose optional filters need plans
/// for the values given, keep PostgreSQL's choice. `SET LOCAL` ends with the transaction, so
/// behind a pooler in transaction mode nothing leaks to another client.
/// The same transactions compile nothing ([`NO_JIT`]; set here too for a pooler, to which the
/// connection's own setting cannot be sent).
async fn generic_plans(tx: &statements::Tx<'_>) -> Result<(), InboxError> {
    tx.batch_execute(GENERIC_PLANS).await?;
    Ok(())
}

/// What [`generic_plans`] sets (a macro, so [`BEGIN_GENERIC`] is one literal with it).
macro_rules! generic_plans_sql {
    () => {
        "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL jit = off"
    };
}
const GENERIC_PLANS: &str = generic_plans_sql!();

/// `BEGIN` and what sets up a transaction of the claim's or the finish's path ([`generic_plans`]
/// for one whose statements are sent before it answered).
pub(super) const BEGIN_GENERIC: &str = concat!(
    "BEGIN ISOLATION LEVEL READ COMMITTED; ",
    generic_plans_sql!()
);

/// The names of `states`, as a `text[]` parameter (`state = ANY($n)`), so the sets of states
/// are `DeliveryState`'s constants, not SQL text.
fn state_names(states: &[DeliveryState]) -> Vec<&'static str> {
    states.iter().map(|state| state.as_str()).collect()
}

/// `WITH RECURSIVE {name}({column}) AS (…)`: every distinct `column` of `table`'s rows that
/// satisfy `filter` (SQL, or `TRUE`), each found by one probe of an index led by `column` past
/// the last one found. A loose index scan, which PostgreSQL does not plan by itself: as many
/// probes as values, however many rows.
fn distinct_by_probes(name: &str, column: &str, table: &str, filter: &str) -> String {
    format!(
        "WITH RECURSIVE {name}({column}) AS (
             (SELECT {column} FROM {table} WHERE {filter} ORDER BY {column} LIMIT 1)
             UNION ALL
             SELECT next.{column} FROM {name} CROSS JOIN LATERAL (
                 SELECT {column} FROM {table}
                 WHERE {filter} AND {column} > {name}.{column}
                 ORDER BY {column} LIMIT 1
             ) next) "
    )
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            single_node: false,
            reads_queued_state: false,
        }
    }

    async fn counts(&self) -> Result<Counts, InboxError> {
        views::counts(&self.client().await?).await
    }

    async fn accept(&self, event: NewEvent) -> Result<Accepted, InboxError> {
        if event.from_quarantine.is_some() {
            return accept::one(&self.connections, &self.commits, &event).await;
        }
        self.accepts.submit(event).await
    }

    async fn contains_event(&self, source: String, event_id: String) -> Result<bool, InboxError> {
        accept::contains_event(&self.client().await?, &source, &event_id).await
    }

    async fn ping(&self) -> Result<(), InboxError> {
        Ok(self.client().await?.batch_execute("SELECT 1").await?)
    }

    async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
    ) -> Result<i64, InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => quarantine::insert(&tx, &source, &request, &reason).await?),
        )
    }

    async fn resolve_quarantine(
        &self,
        id: i64,
        at_ms: i64,
        resolution: String,
    ) -> Result<bool, InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => quarantine::resolve(&tx, id, at_ms, &resolution).await?),
        )
    }

    async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError> {
        quarantine::held_ids(&self.client().await?, &filter).await
    }

    async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError> {
        quarantine::held(&self.client().await?, id).await
    }

    async fn quarantine_held_count(&self) -> Result<i64, InboxError> {
        quarantine::count_held(&self.client().await?).await
    }

    async fn claim(&self, request: ClaimRequest) -> Result<ClaimOutcome, InboxError> {
        let started = std::time::Instant::now();
        let mut connection = self.connections.get().await?;
        let tx = connection.transaction().await?;
        // The wait for a connection is before the transaction, which the claim's statement
        // measures its own wait from: its leases run from when it runs.
        let request = request.ran_after(started.elapsed());
        let (claimed, xid) = lease::claim_due(&tx, &request).await?;
        let Err(lost) = tx.commit().await else {
            self.commits.committed(1, started);
            return Ok(claimed);
        };
        // A `COMMIT` whose answer is an error may have committed all the same: the connection
        // lost as it was sent, a pooler's "server conn crashed", a backend ended while it
        // waited for a synchronous standby after committing locally. Its leases would then
        // stand with no worker running them until they expired and were taken back as
        // abandoned (an at-most-once delivery dead-lettered that never ran). So the database is
        // asked (a refused `COMMIT` is answered "aborted" at once).
        drop(connection);
        match xid {
            Some(xid) if lease::committed(&self.connections, xid).await => {
                tracing::info!(
                    leased = claimed.leased.len(),
                    "a claim's COMMIT went unanswered, and the database says it committed: its \
                     leases are run"
                );
                self.commits.committed(1, started);
                Ok(claimed)
            }
            _ => Err(lost.into()),
        }
    }

    async fn finish(&self, finish: Finish) -> Result<Finished, InboxError> {
        if lease::commits_state(&finish) {
            return lease::finish_one(&self.connections, &self.commits, &finish).await;
        }
        self.finishes.submit(finish).await
    }

    async fn reclaim_expired(&self, now_ms: i64, decide: Decide) -> Result<Reclaimed, InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => lease::take_back(&tx, now_ms, decide).await?),
        )
    }

    async fn reclaim_all(&self, _now_ms: i64, _decide: Decide) -> Result<Reclaimed, InboxError> {
        // Another node's live lease is not this node's to take.
        Err(InboxError::NotSingleNode)
    }

    async fn replay(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => replay::replay_matching(&tx, &filter, now_ms).await?),
        )
    }

    async fn oldest_due(&self, now_ms: i64) -> Result<Option<i64>, InboxError> {
        lease::oldest_due(&self.client().await?, now_ms).await
    }

    async fn prune(&self, batch: PruneBatch) -> Result<Pruned, InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => retention::prune(&tx, &batch).await?),
        )
    }

    async fn discard(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        Ok(
            in_transaction!(self.connections, self.commits, tx => retention::discard(&tx, &filter, now_ms).await?),
        )
    }

    async fn discard_quarantine(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError> {
        let ids = quarantine::held_ids(&self.client().await?, &filter).await?;
        if filter.dry_run || ids.is_empty() {
            return Ok((ids.len(), 0));
        }
        let discarded = in_transaction!(self.connections, self.commits, tx => retention::discard_quarantine(&tx, &ids, now_ms).await?);
        Ok((ids.len(), discarded))
    }

    async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError> {
        lease::next_due_after(&self.client().await?, after_ms).await
    }

    fn state_get_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), InboxError> {
        self.block_on(async { state::get(&self.client().await?, plugin, key).await })
    }

    fn state_stat_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<u64>, i64), InboxError> {
        self.block_on(async { state::stat(&self.client().await?, plugin, key).await })
    }

    fn state_usage_blocking(&self, plugin: &str) -> Result<StateUsage, InboxError> {
        self.block_on(async { state::usage(&self.client().await?, plugin).await })
    }

    async fn state_keys(
        &self,
        plugin: String,
        filter: StateKeyFilter,
    ) -> Result<Vec<StateEntry>, InboxError> {
        state::list(&self.client().await?, &plugin, &filter).await
    }

    async fn state_value(
        &self,
        plugin: String,
        key: String,
    ) -> Result<Option<StateValue>, InboxError> {
        state::value(&self.client().await?, &plugin, &key).await
    }

    async fn edit_state(&self, edit: StateEdit, now_ms: i64) -> Result<Edited, InboxError> {
        state::edit(&self.connections, &self.commits, &edit, now_ms).await
    }

    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError> {
        views::list_events(&self.client().await?, &filter).await
    }

    async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError> {
        views::event_detail(&self.client().await?, &source, &event_id).await
    }

    async fn state_counts(
        &self,
        states: Vec<DeliveryState>,
    ) -> Result<Vec<(String, i64)>, InboxError> {
        views::state_counts(&self.client().await?, &states).await
    }

    async fn dead_letter_groups(&self) -> Result<Vec<DeadLetterGroup>, InboxError> {
        views::dead_letter_groups(&self.client().await?).await
    }

    async fn held_requests(
        &self,
        limit: usize,
        before_id: Option<i64>,
    ) -> Result<Vec<HeldRequest>, InboxError> {
        views::held_requests(&self.client().await?, limit, before_id).await
    }

    async fn notify_work(&self) -> Result<(), InboxError> {
        let client = self.client().await?;
        client
            .execute("SELECT pg_notify($1, '')", &[&wakeup::CHANNEL])
            .await?;
        Ok(())
    }

    async fn work_notified(&self) {
        self.work.notified().await
    }

    fn commits(&self) -> &Commits {
        &self.commits
    }

    fn close(&self) {
        // Transactions under way finish on the connections they hold; new ones are refused.
        tracing::debug!(database = %self.target, "inbox: closing the database pool");
        self.connections.pool.close();
        for task in self.tasks.lock().expect("poisoned").drain(..) {
            task.abort();
        }
    }
}
