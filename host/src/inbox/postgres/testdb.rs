//! A fresh PostgreSQL database per test: the contract suite's PostgreSQL backend, and what the
//! room's own tests open.
//!
//! Invariants:
//! - The server is named by `HOOKD_TEST_POSTGRES_URL` (a role that may create databases); each
//!   [`TestDatabase`] is a database of its own on it (`hookd_t_<random>`), dropped with it.
//! - [`TestDatabase::behind_pooler`] reaches that database through PgBouncer in transaction
//!   mode (`HOOKD_TEST_PGBOUNCER_URL`, `.ci/pgbouncer.sh`), and opens its inboxes with
//!   `database_pooler = "transaction"`.
//! - Without those variables a test passes as skipped and says so in one line, unless
//!   `HOOKD_TEST_POSTGRES_REQUIRED=1` (CI sets them all), which makes it fail instead.
//! - `HOOKD_TEST_POSTGRES_CA` is the CA file of the certificate the server presents (valid for
//!   `localhost`, not `127.0.0.1`), for the tests of TLS to the database.

use tokio_postgres::NoTls;

use crate::{
    clock::Clock,
    config::Pooler,
    inbox::{Inbox, OpenOptions, contract::Database},
};

/// The server the tests use.
const URL_VAR: &str = "HOOKD_TEST_POSTGRES_URL";
/// PgBouncer in transaction mode in front of that server.
const POOLER_VAR: &str = "HOOKD_TEST_PGBOUNCER_URL";
/// The CA whose certificate the test server presents, for `localhost` only
/// (`.ci/postgres.sh --ca`).
const CA_VAR: &str = "HOOKD_TEST_POSTGRES_CA";
/// Set to `1` to fail, not skip, when [`URL_VAR`] is missing.
const REQUIRED_VAR: &str = "HOOKD_TEST_POSTGRES_REQUIRED";

/// A database of its own on the test server, dropped when this is.
pub(in crate::inbox) struct TestDatabase {
    /// The server URL as given (its own database is where the test creates and drops others).
    server: String,
    name: String,
    /// `server` (or the pooler in front of it) with `name` as its database.
    url: String,
    /// What stands between the inboxes opened on it and the server.
    pooler: Pooler,
}

impl TestDatabase {
    /// A new, empty database on the test server; `None` (the test skips) when no server is
    /// given and none is required.
    pub(in crate::inbox) async fn fresh() -> Option<Self> {
        let server = given(URL_VAR)?;
        let name = format!("hookd_t_{:016x}", rand::random::<u64>());
        let admin = connect(&server).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("creating the test database {name}: {e:?}"));
        let url = with_database(&server, &name);
        Some(Self {
            server,
            name,
            url,
            pooler: Pooler::None,
        })
    }

    /// [`TestDatabase::fresh`], reached through PgBouncer in transaction mode.
    pub(in crate::inbox) async fn behind_pooler() -> Option<Self> {
        let pooler = given(POOLER_VAR)?;
        let mut db = Self::fresh().await?;
        db.url = with_database(&pooler, &db.name);
        db.pooler = Pooler::Transaction;
        Some(db)
    }

    /// The URL of this database.
    pub(in crate::inbox) fn url(&self) -> &str {
        &self.url
    }

    /// Sets this database's default of `setting` (`ALTER DATABASE … SET`), which sessions take
    /// when they start: sent to the server itself, so a pooler's server connections made
    /// afterwards take it too.
    pub(in crate::inbox) async fn set_default(&self, setting: &str, value: &str) {
        // From the server's own database: one set read-only could not be set back from itself.
        connect(&self.server)
            .await
            .batch_execute(&format!(
                "ALTER DATABASE {} SET {setting} = '{value}'",
                self.name
            ))
            .await
            .unwrap_or_else(|e| panic!("setting {setting} on {}: {e:?}", self.name));
    }

    /// Makes the server refuse every new connection to this database (and ends those it has),
    /// as a database taken offline does; or take them again.
    pub(in crate::inbox) async fn refuse_connections(&self, refuse: bool) {
        let admin = connect(&self.server).await;
        let name = &self.name;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {name} ALLOW_CONNECTIONS {}",
                !refuse
            ))
            .await
            .unwrap();
        if refuse {
            admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                    &[name],
                )
                .await
                .unwrap();
        }
    }

    /// The test server's URL with `password` instead of the one it has (for tests of what a
    /// refused login says).
    pub(in crate::inbox) fn url_with_password(&self, password: &str) -> String {
        let config: tokio_postgres::Config = self.url.parse().unwrap();
        let user = config.get_user().unwrap_or("postgres");
        let (_, rest) = self.url.split_once("://").expect("a postgres:// URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("postgres://{user}:{password}@{host}")
    }
}

/// The path of the CA file the test server's certificate chains to (`None`: the test skips).
pub(in crate::inbox) fn server_ca() -> Option<String> {
    given(CA_VAR)
}

/// The value of `var`; `None` (the test skips, saying so) when it is not set and no server is
/// required.
fn given(var: &str) -> Option<String> {
    let value = std::env::var(var).ok();
    if value.is_none() {
        assert!(
            std::env::var(REQUIRED_VAR).as_deref() != Ok("1"),
            "{REQUIRED_VAR}=1, but {var} is not set"
        );
        println!("skipped: {var} is not set");
    }
    value
}

/// A client of `url`, its connection driven on the current runtime.
pub(in crate::inbox) async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test server ({URL_VAR}): {e:?}"));
    tokio::spawn(connection);
    client
}

/// `server` (a `postgres://` URL) naming database `name` instead of its own.
fn with_database(server: &str, name: &str) -> String {
    let (scheme, rest) = server.split_once("://").expect("a postgres:// URL");
    let (authority, query) = match rest.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (rest, None),
    };
    let authority = authority.split_once('/').map_or(authority, |(a, _)| a);
    match query {
        Some(query) => format!("{scheme}://{authority}/{name}?{query}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

#[async_trait::async_trait]
impl Database for TestDatabase {
    async fn open(&self, clock: Clock) -> Inbox {
        let options = OpenOptions {
            writer: crate::inbox::WriterOptions::new(crate::config::Durability::Normal),
            clock,
            pooler: self.pooler,
        };
        Inbox::open_postgres(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("opening the inbox on {}: {e}", self.name))
    }

    async fn at_first_schema(&self, rows: &str) {
        // The first release kept each plugin's state usage and version clock beside its keys.
        let usage = "INSERT INTO plugin_state_usage (plugin, keys, bytes, clock)
                     SELECT plugin, COUNT(*), SUM(octet_length(key) + octet_length(value)),
                            MAX(version)
                     FROM plugin_state GROUP BY plugin;";
        connect(&with_database(&self.server, &self.name))
            .await
            .batch_execute(&format!(
                "BEGIN;
                 CREATE TABLE hookd_schema (
                     one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                     version BIGINT  NOT NULL
                 );
                 INSERT INTO hookd_schema (version) VALUES (1);
                 {} {rows} {usage}
                 COMMIT;",
                super::schema::MIGRATIONS[0]
            ))
            .await
            .unwrap_or_else(|e| panic!("making {} a first-schema database: {e:?}", self.name));
    }

    async fn repair(&self, sql: &str) {
        connect(&with_database(&self.server, &self.name))
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql} on {}: {e:?}", self.name));
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // On a thread (and runtime) of its own: a drop may run inside any runtime, or none.
        let (server, name) = (self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                connect(&server)
                    .await
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping the test database {}: {e}", self.name);
        }
    }
}
