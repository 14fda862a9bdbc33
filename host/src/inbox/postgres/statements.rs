//! How this room's statements reach the server. Every statement is SQL text and its parameters,
//! run on a [`Conn`] (a pooled connection) or a [`Tx`] (a transaction on one) through [`Run`];
//! how it travels depends on what stands between hookd and PostgreSQL (`server.database_pooler`,
//! [`Pooler`]):
//!
//! - Directly, or through a pooler in session mode: each statement is prepared once per
//!   connection and reused (deadpool's statement cache), so it is parsed and planned once.
//! - Through a pooler in transaction mode (PgBouncer's `pool_mode = transaction`): consecutive
//!   transactions of one client connection may run on different server connections, so a
//!   statement prepared in one is unknown in the next. Each statement is sent unnamed with its
//!   parameter types (`Parse`, `Bind`, `Execute` and `Sync` together: one round trip, as a cached
//!   statement takes, but parsed and planned by the server each time). The types of each
//!   statement text with parameters are learned once per store, by an SQL `PREPARE` under a
//!   name of hookd's own inside a transaction (outside one, a message of its own the server
//!   runs as one), deallocated there.
//!
//! Invariants:
//! - No other code of the room prepares a statement or sends one with parameters: [`Conn`] and
//!   [`Tx`] hand out no client, so the compiler holds that wall.
//! - In transaction mode hookd sends no protocol-level named statement, and no statement of
//!   its own outlives its transaction: one is prepared (SQL `PREPARE`, named
//!   `hookd_describe_<random>`) only to learn its types, inside a transaction, and deallocated
//!   before the transaction goes on. Named statements another client left on a server
//!   connection (tokio-postgres names its own `s0`, `s1`, …; a node run without
//!   `database_pooler`, say) can then never collide with hookd's.
//! - Statement texts are the room's constants or built from them, never from input: the types
//!   learned (as deadpool's cache) stay as many as the texts.
//! - Every transaction runs at `READ COMMITTED` ([`BEGIN`], [`Conn::transaction`]), whatever
//!   the database's or the role's `default_transaction_isolation` says.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use deadpool_postgres::{GenericClient as _, Object};
use tokio_postgres::IsolationLevel;
use tokio_postgres::{
    Error, GenericClient as _, Row, SimpleQueryMessage,
    types::{ToSql, Type},
};

use crate::config::Pooler;

/// The parameters of a statement, as tokio-postgres takes them.
pub(super) type Params<'p> = [&'p (dyn ToSql + Sync)];

/// How a store sends its statements, and what it learned of them.
pub(super) struct Statements {
    /// Unnamed, with their types given (behind a pooler in transaction mode).
    unnamed: bool,
    /// Each statement text's parameter types, once learned (unnamed statements only).
    types: Mutex<HashMap<Box<str>, Arc<[Type]>>>,
}

impl Statements {
    pub(super) fn new(pooler: Pooler) -> Self {
        Self {
            unnamed: pooler == Pooler::Transaction,
            types: Mutex::new(HashMap::new()),
        }
    }

    fn known(&self, sql: &str) -> Option<Arc<[Type]>> {
        self.types.lock().expect("poisoned").get(sql).cloned()
    }

    fn learn(&self, sql: &str, types: Arc<[Type]>) {
        self.types
            .lock()
            .expect("poisoned")
            .insert(sql.into(), types);
    }
}

/// How a transaction sent as text begins. The room's statements are written for `READ
/// COMMITTED`: a claim's `SKIP LOCKED` passes over what another node holds, a finish's version
/// check and the migrations' advisory lock wait and then read what the other committed. At
/// `REPEATABLE READ` or above (a database's or role's default) a transaction that waited for a
/// row or a lock fails instead (`could not serialize access`), so each one names its level.
pub(super) const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// A pooled connection, and how its store sends statements.
pub(super) struct Conn {
    client: Object,
    statements: Arc<Statements>,
}

/// A transaction on a [`Conn`]; dropped without [`Tx::commit`], it rolls back.
pub(super) struct Tx<'c> {
    tx: deadpool_postgres::Transaction<'c>,
    statements: &'c Statements,
}

impl Conn {
    pub(super) fn new(client: Object, statements: Arc<Statements>) -> Self {
        Self { client, statements }
    }

    /// Begins a transaction, at `READ COMMITTED` (see [`BEGIN`]).
    pub(super) async fn transaction(&mut self) -> Result<Tx<'_>, Error> {
        Ok(Tx {
            tx: self
                .client
                .build_transaction()
                .isolation_level(IsolationLevel::ReadCommitted)
                .start()
                .await?,
            statements: &self.statements,
        })
    }

    /// Runs `sql` (statements without parameters, `;`-separated) by the simple protocol.
    pub(super) async fn batch_execute(&self, sql: &str) -> Result<(), Error> {
        self.client.batch_execute(sql).await
    }

    /// Runs `statement` as a transaction of its own: `begin` (`BEGIN` and any `SET LOCAL`), the
    /// statement and `COMMIT` are sent together and answered together, one round trip where
    /// awaiting each would take three. Its rows are returned once the `COMMIT` answered, so
    /// nothing is reported done before it is durable; if the statement fails, PostgreSQL turns
    /// the `COMMIT` into a rollback and the statement's error is returned.
    pub(super) async fn in_one_round_trip(
        &self,
        begin: &str,
        statement: &str,
        params: &Params<'_>,
    ) -> Result<Vec<Row>, Error> {
        // Everything the statement needs is at hand before anything is sent (its prepared
        // statement from the connection's cache, or its types): each of the three futures
        // below sends its request when first polled, in this order.
        let client: &tokio_postgres::Client = &self.client;
        if self.statements.unnamed {
            let typed = self.typed(statement, params).await?;
            let (_, rows, _) = tokio::try_join!(
                client.batch_execute(begin),
                client.query_typed(statement, &typed),
                client.batch_execute("COMMIT"),
            )?;
            return Ok(rows);
        }
        let statement = self.client.prepare_cached(statement).await?;
        let (_, rows, _) = tokio::try_join!(
            client.batch_execute(begin),
            client.query(&statement, params),
            client.batch_execute("COMMIT"),
        )?;
        Ok(rows)
    }
}

impl Tx<'_> {
    /// Commits the transaction.
    pub(super) async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await
    }

    /// Rolls the transaction back (as dropping it does, but answered).
    pub(super) async fn rollback(self) -> Result<(), Error> {
        self.tx.rollback().await
    }

    /// Runs `sql` (statements without parameters, `;`-separated) by the simple protocol.
    pub(super) async fn batch_execute(&self, sql: &str) -> Result<(), Error> {
        self.tx.batch_execute(sql).await
    }
}

/// Runs statements (SQL text and parameters) the way their store sends them.
pub(super) trait Run: Sync {
    /// The same connection as deadpool sees it (its statement cache).
    type Cached: deadpool_postgres::GenericClient;
    /// The same connection as tokio-postgres sees it.
    type Plain: tokio_postgres::GenericClient;
    /// Whether statements run inside a transaction.
    const IN_TRANSACTION: bool;

    fn cached(&self) -> &Self::Cached;
    fn plain(&self) -> &Self::Plain;
    fn statements(&self) -> &Statements;

    async fn query(&self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, Error> {
        if self.statements().unnamed {
            let typed = self.typed(sql, params).await?;
            return self.plain().query_typed(sql, &typed).await;
        }
        let statement = self.cached().prepare_cached(sql).await?;
        deadpool_postgres::GenericClient::query(self.cached(), &statement, params).await
    }

    async fn query_one(&self, sql: &str, params: &Params<'_>) -> Result<Row, Error> {
        if self.statements().unnamed {
            let typed = self.typed(sql, params).await?;
            return self.plain().query_typed_one(sql, &typed).await;
        }
        let statement = self.cached().prepare_cached(sql).await?;
        deadpool_postgres::GenericClient::query_one(self.cached(), &statement, params).await
    }

    async fn query_opt(&self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, Error> {
        if self.statements().unnamed {
            let typed = self.typed(sql, params).await?;
            return self.plain().query_typed_opt(sql, &typed).await;
        }
        let statement = self.cached().prepare_cached(sql).await?;
        deadpool_postgres::GenericClient::query_opt(self.cached(), &statement, params).await
    }

    /// Runs `sql`; the number of rows it changed.
    async fn execute(&self, sql: &str, params: &Params<'_>) -> Result<u64, Error> {
        if self.statements().unnamed {
            let typed = self.typed(sql, params).await?;
            return self.plain().execute_typed(sql, &typed).await;
        }
        let statement = self.cached().prepare_cached(sql).await?;
        deadpool_postgres::GenericClient::execute(self.cached(), &statement, params).await
    }

    /// `params` paired with `sql`'s parameter types, learned the first time `sql` is seen (a
    /// parameter past the statement's count gets `unknown`, which tokio-postgres refuses with an
    /// error naming it).
    async fn typed<'p>(
        &self,
        sql: &str,
        params: &Params<'p>,
    ) -> Result<Vec<(&'p (dyn ToSql + Sync), Type)>, Error> {
        let types = match self.statements().known(sql) {
            Some(types) => types,
            None => {
                let types = self.describe(sql, params.len()).await?;
                self.statements().learn(sql, Arc::clone(&types));
                types
            }
        };
        Ok(params
            .iter()
            .enumerate()
            .map(|(i, param)| (*param, types.get(i).cloned().unwrap_or(Type::UNKNOWN)))
            .collect())
    }

    /// `sql`'s parameter types, from the server: the statement is prepared inside a transaction
    /// (this one, or one of its own) and deallocated before that transaction goes on, so no
    /// pooler moves the connection between the two. By SQL (`PREPARE`, then its row of
    /// `pg_prepared_statements`), under a random name of hookd's own: tokio-postgres' `prepare`
    /// names its statements `s0`, `s1`, … from a counter every process starts at 0, and another
    /// client's statement of that name, left on the server connection, refused it. A statement
    /// without parameters needs no types (and may be one `PREPARE` does not take, as `LOCK`).
    async fn describe(&self, sql: &str, params: usize) -> Result<Arc<[Type]>, Error> {
        if params == 0 {
            return Ok(Arc::from([]));
        }
        // Sent by the simple protocol inside `PREPARE`, where a `;` would end it and run the
        // rest: a statement with parameters is one statement (the extended protocol's rule).
        assert!(
            !sql.contains(';'),
            "a statement with parameters holds no `;`: {sql}"
        );
        let plain = self.plain();
        let name = format!("hookd_describe_{:016x}", rand::random::<u64>());
        let describe = async {
            plain
                .batch_execute(&format!("PREPARE {name} AS {sql}"))
                .await?;
            let row = plain
                .query_typed_one(
                    "SELECT parameter_types::oid[] FROM pg_prepared_statements WHERE name = $1",
                    &[(&name, Type::TEXT)],
                )
                .await?;
            plain.batch_execute(&format!("DEALLOCATE {name}")).await?;
            let oids: Vec<u32> = row.get(0);
            Ok::<_, Error>(
                oids.into_iter()
                    .map(|oid| Type::from_oid(oid).unwrap_or(Type::UNKNOWN))
                    .collect(),
            )
        };
        if Self::IN_TRANSACTION {
            return describe.await;
        }
        // Outside a transaction, all of it is one message, which the server runs as one
        // implicit transaction, to its end: a caller that gives up waiting (a timeout, a client
        // gone) cannot leave the connection in an open transaction, as a `BEGIN` answered before
        // the rest was sent would have (and the next statements on it would never commit).
        let answers = plain
            .simple_query(&format!(
                "PREPARE {name} AS {sql};
                 SELECT array_to_string(parameter_types::oid[], ',')
                     FROM pg_prepared_statements WHERE name = '{name}';
                 DEALLOCATE {name}"
            ))
            .await?;
        let oids = answers
            .iter()
            .find_map(|answer| match answer {
                SimpleQueryMessage::Row(row) => row.get(0),
                _ => None,
            })
            .unwrap_or_default();
        Ok(oids
            .split(',')
            .map(|oid| {
                oid.parse()
                    .ok()
                    .and_then(Type::from_oid)
                    .unwrap_or(Type::UNKNOWN)
            })
            .collect())
    }
}

impl Run for Conn {
    type Cached = Object;
    type Plain = tokio_postgres::Client;
    const IN_TRANSACTION: bool = false;

    fn cached(&self) -> &Self::Cached {
        &self.client
    }

    fn plain(&self) -> &Self::Plain {
        &self.client
    }

    fn statements(&self) -> &Statements {
        &self.statements
    }
}

impl<'c> Run for Tx<'c> {
    type Cached = deadpool_postgres::Transaction<'c>;
    type Plain = tokio_postgres::Transaction<'c>;
    const IN_TRANSACTION: bool = true;

    fn cached(&self) -> &Self::Cached {
        &self.tx
    }

    fn plain(&self) -> &Self::Plain {
        &self.tx
    }

    fn statements(&self) -> &Statements {
        self.statements
    }
}
