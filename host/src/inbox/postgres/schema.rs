//! Versioned schema migrations for PostgreSQL, applied at connect and recorded in the one row
//! of `hookd_schema`.
//!
//! Invariants:
//! - A migration, once released, is never edited; changes are new entries at the end (the
//!   tests hold each one's SHA-256).
//! - Every pending migration and the new version are one transaction, taken under a
//!   transaction-scoped advisory lock, so nodes starting together apply each migration once and
//!   none sees a half-migrated schema.
//! - A database already at the latest version is only read (no `CREATE`, no `UPDATE`), so a
//!   role that may not create tables starts hookd once the schema's owner migrated it.
//! - The rows are SQLite's (`sqlite/schema.rs` at its latest version), times as `BIGINT` unix
//!   milliseconds and bodies as `BYTEA`, but not all the tables: a body and its headers stay in
//!   `events` (SQLite moved them to `payloads`), a state version comes from one sequence (not a
//!   clock per plugin), and what PostgreSQL adds is what several nodes need (`nodes`,
//!   `plugin_files`, `plugin_releases`, the index that lets one delivery per ordering key run
//!   at a time).

use super::{
    error::Target,
    statements::{Conn, Run},
};
use crate::inbox::InboxError;

/// The advisory lock the migrations run under (any constant, the same in every hookd).
pub(super) const MIGRATION_LOCK: i64 = 0x686f_6f6b_6400_0001;

/// The SHA-256 of each released migration's SQL, which a test holds them to
/// (`inbox/frozen.rs`): a new migration appends its hash, an edited one fails.
#[cfg(test)]
pub(in crate::inbox) const RELEASED: &[&str] = &[
    "04a8c43a5f57d0c4578bfaf036449b019566f239e860b9544ec2ff8915090a3f",
    "b906f8af9144c645adab2ba3cece78ca90d39782490836c40506fa0f3b1b2449",
    "79848c1fa028160ce2d02779bc2fc75de49fa10ab7ac22fccca0da949780de21",
    "44c2cccd02c5ed31a581eeb14ca479ba6d12e84078b90af288c5255e7bf25f10",
    "231217f3da0672904b27fcdae8c2241d4a29c9d73bbee70373f0811c9eb116d4",
    "0cb178afee1116a3767ff0323f94a2e4dd348268417ad65ecf0777f6d8869e22",
    "d18dc11ca29f276b3b2f2fcaf15ec155e99eaa171dc405cce1d54a6f8b7fc9ec",
    "132fdcbfa07b19f71bdc04efcad71be09565f1ded3dae2ce8896a5318d0a6129",
    "a2ea33c0da1a1d929ba89e84ca149df49fb1bce32a6bcbc28ac1e9d9800311b6",
    "f170aabd0f36b699eb4088ca7f451cfc8ffa738d8b23b0d9ec0464c5fdc5cf37",
    "02008a7b1b7c3ea9cfe79c1f79c112260f8d562b5546afdbdb611a3e951a29a3",
    "d4f7d29276b6eba8ff759c5341548d8d1041f865cc49a932016152df4f47ca02",
    "303df11a097e9e6a52bd4c80925597f634db3dbb7165e9a37f5c97e8c3069721",
];

/// Migration `i` takes the schema from version `i` to `i + 1`.
pub(in crate::inbox) const MIGRATIONS: &[&str] = &[
    // 1: the schema SQLite reached in four steps, at once.
    "
    CREATE TABLE events (
        id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        source       TEXT   NOT NULL,
        event_id     TEXT   NOT NULL,
        event_type   TEXT   NOT NULL,
        ordering_key TEXT,
        sequence     BIGINT,
        received_at  BIGINT NOT NULL,
        headers      TEXT   NOT NULL,
        body         BYTEA  NOT NULL,
        UNIQUE (source, event_id)
    );
    CREATE INDEX events_received ON events (received_at);

    -- One row per (event, handler). `attempts` counts every attempt ever made; `budget_base` is
    -- the value it had at the last replay, so `attempts - budget_base` is the current budget use.
    CREATE TABLE deliveries (
        id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event           BIGINT NOT NULL REFERENCES events (id),
        source          TEXT   NOT NULL,
        handler         TEXT   NOT NULL,
        ordering_key    TEXT,
        sequence        BIGINT,
        state           TEXT   NOT NULL,
        attempts        BIGINT NOT NULL DEFAULT 0,
        budget_base     BIGINT NOT NULL DEFAULT 0,
        next_attempt_at BIGINT NOT NULL,
        lease_until     BIGINT,
        leased_at       BIGINT,
        output          TEXT,
        last_error      TEXT,
        updated_at      BIGINT NOT NULL,
        UNIQUE (event, handler)
    );
    CREATE INDEX deliveries_due ON deliveries (state, next_attempt_at);
    CREATE INDEX deliveries_key ON deliveries (source, handler, ordering_key)
        WHERE ordering_key IS NOT NULL;
    CREATE INDEX deliveries_handler_due ON deliveries (handler, state, next_attempt_at);
    -- Whatever claims race, two nodes never run two deliveries of one key at once: the second
    -- lease of a key is refused by the database.
    CREATE UNIQUE INDEX deliveries_one_running_per_key ON deliveries (source, handler, ordering_key)
        WHERE state = 'running' AND ordering_key IS NOT NULL;

    CREATE TABLE attempts (
        id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        delivery      BIGINT NOT NULL REFERENCES deliveries (id),
        attempt       BIGINT NOT NULL,
        started_at    BIGINT NOT NULL,
        finished_at   BIGINT NOT NULL,
        outcome       TEXT   NOT NULL,
        error_kind    TEXT,
        error         TEXT,
        plugin_sha256 TEXT
    );
    CREATE INDEX attempts_delivery ON attempts (delivery);

    -- Verified requests whose parser trapped, timed out or was missing: replayable.
    CREATE TABLE quarantine (
        id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        source      TEXT   NOT NULL,
        received_at BIGINT NOT NULL,
        headers     TEXT   NOT NULL,
        body        BYTEA  NOT NULL,
        reason      TEXT   NOT NULL,
        resolved_at BIGINT,
        resolution  TEXT
    );
    CREATE INDEX quarantine_held ON quarantine (resolved_at, source, received_at);

    -- Plugin state; a deleted key's row goes (versions come from the plugin's clock).
    CREATE TABLE plugin_state (
        plugin  TEXT   NOT NULL,
        key     TEXT   NOT NULL,
        value   BYTEA  NOT NULL,
        version BIGINT NOT NULL,
        PRIMARY KEY (plugin, key)
    );

    -- Per-plugin usage and version clock, kept in the transaction that applies the writes; its
    -- row is also the lock that orders one plugin's state commits across nodes.
    CREATE TABLE plugin_state_usage (
        plugin TEXT   PRIMARY KEY,
        keys   BIGINT NOT NULL,
        bytes  BIGINT NOT NULL,
        clock  BIGINT NOT NULL
    );
    ",
    // 2: what the nodes tell each other: a heartbeat row per node (`live`: a JSON object of
    // plugin file stem -> sha256 live on it), plugin files by sha256, and the cluster's release
    // of each file (`version` from one sequence, so every change is newer than the last).
    "
    CREATE TABLE nodes (
        id           TEXT   PRIMARY KEY,
        listen       TEXT   NOT NULL,
        admin_listen TEXT   NOT NULL,
        started_at   BIGINT NOT NULL,
        heartbeat_at BIGINT NOT NULL,
        in_flight    BIGINT NOT NULL,
        live         TEXT   NOT NULL
    );
    CREATE TABLE plugin_files (
        sha256 TEXT  PRIMARY KEY,
        bytes  BYTEA NOT NULL
    );
    CREATE SEQUENCE plugin_release_versions;
    CREATE TABLE plugin_releases (
        stem    TEXT   PRIMARY KEY,
        sha256  TEXT   NOT NULL REFERENCES plugin_files (sha256),
        version BIGINT NOT NULL,
        node    TEXT   NOT NULL
    );
    ",
    // 3: state versions from one sequence, so a commit no longer locks its plugin's usage row
    // for the version (`clock` stays, unused): it starts past every version handed out.
    "
    CREATE SEQUENCE plugin_state_versions;
    SELECT setval('plugin_state_versions',
                  GREATEST(1, (SELECT COALESCE(MAX(clock), 0) FROM plugin_state_usage),
                              (SELECT COALESCE(MAX(version), 0) FROM plugin_state)));
    ",
    // 4: what keeps a claim cheap behind a long backlog of a few keys: the due deliveries in
    // order (all, and those without a key), the open deliveries of each key in order (a key's
    // head is one probe, and walking the keys is one probe each), and the newest done sequence
    // of a key.
    "
    CREATE INDEX deliveries_waiting ON deliveries (handler, next_attempt_at, id)
        WHERE state IN ('pending', 'retrying');
    CREATE INDEX deliveries_waiting_unkeyed ON deliveries (handler, next_attempt_at, id)
        WHERE state IN ('pending', 'retrying') AND ordering_key IS NULL;
    CREATE INDEX deliveries_open_heads
        ON deliveries (handler, source, ordering_key, (COALESCE(sequence, 0)), id)
        WHERE state IN ('pending', 'running', 'retrying') AND ordering_key IS NOT NULL;
    CREATE INDEX deliveries_done_sequence ON deliveries (source, handler, ordering_key, sequence)
        WHERE state = 'done' AND ordering_key IS NOT NULL;
    ",
    // 5: retention, as SQLite's migration 5: `pruned_at` marks an event whose payload was
    // pruned (its rows stay, to dedupe and to remember its key's newest done sequence); the
    // pruner walks the events not yet pruned in arrival order and forgets pruned ones in the
    // order they were pruned, each through its own partial index.
    "
    ALTER TABLE events ADD COLUMN pruned_at BIGINT;
    CREATE INDEX events_unpruned ON events (received_at, id) WHERE pruned_at IS NULL;
    CREATE INDEX events_pruned ON events (pruned_at) WHERE pruned_at IS NOT NULL;
    ",
    // 6: the event list's filters and cursor stay index range scans on millions of events: by
    // source or type newest first, by provider event id, and the events having a delivery in
    // a state (a rare one, dead, included) newest first. SQLite's migration 6.
    "
    CREATE INDEX events_source_id ON events (source, id);
    CREATE INDEX events_type_id ON events (event_type, id);
    CREATE INDEX events_event_id ON events (event_id);
    CREATE INDEX deliveries_state_event ON deliveries (state, event);
    ",
    // 7: a forced replay delivers a stale delivery, as SQLite's migration 7.
    "
    ALTER TABLE deliveries ADD COLUMN deliver_stale BOOLEAN NOT NULL DEFAULT false;
    ",
    // 8: when each state key was last written, as SQLite's migration 8; and the keys of each
    // plugin in byte order (what SQLite's primary key is), so the admin API's key list is one
    // index range whatever the database's collation.
    "
    ALTER TABLE plugin_state ADD COLUMN updated_at BIGINT;
    CREATE INDEX plugin_state_keys ON plugin_state (plugin, key COLLATE \"C\");
    ",
    // 9: three indexes that cost every accept or every change of a delivery's state a write,
    // for no statement that needs them any more: a claim reads `deliveries_waiting` (4), not
    // `deliveries_handler_due`; a key's checks read `deliveries_open_heads`,
    // `deliveries_one_running_per_key` and `deliveries_done_sequence`, not `deliveries_key`;
    // and the event list finds a provider event id through the dedupe index, once per stored
    // source, not through `events_event_id` (written in random order by every accept). SQLite's
    // migration 10 dropped its `events_event_id` likewise.
    "
    DROP INDEX IF EXISTS deliveries_handler_due;
    DROP INDEX IF EXISTS deliveries_key;
    DROP INDEX IF EXISTS events_event_id;
    ",
    // 10: `deliveries_due` goes too. Every version of a delivery (accepted, running, done)
    // wrote an entry in it, for two rare reads: the earliest due waiting delivery (the idle
    // poll's timer, the lag gauge), now one probe of `deliveries_waiting` per handler with
    // waiting deliveries; and lookups by state (counts, reclaim, replay), which
    // `deliveries_state_event` serves as well.
    "
    DROP INDEX IF EXISTS deliveries_due;
    ",
    // 11: each release keeps the cluster's earlier versions of its file (newest first), kept
    // by the publish that moves it, so every node sees one history and a rollback on any node
    // goes to the same version (each node's own, in memory, differed after a restart or two
    // drops at once).
    "
    ALTER TABLE plugin_releases ADD COLUMN previous TEXT[] NOT NULL DEFAULT '{}';
    ",
    // 12: a claim's stale check reads the newest sequence of a key once done and replayed since
    // (`lease::NEWEST_HANDLED`); no index served it once `deliveries_key` went (9), so each
    // check read every delivery. A replay gives a delivery a `budget_base` (so does an attempt
    // not counted: a conflict's re-run, one given back), so this index holds those, and costs
    // every other delivery no write.
    "
    CREATE INDEX deliveries_once_handled
        ON deliveries (source, handler, ordering_key, sequence)
        WHERE budget_base > 0 AND ordering_key IS NOT NULL;
    ",
    // 13: a source with `dedupe_body` stores the SHA-256 of each event's body, unique per
    // source beside its event id: under a scheme that signs only the body, a captured request
    // sent again with a new (unsigned) id is a duplicate too. Other sources store none, and
    // their events are in no entry of the index.
    "
    ALTER TABLE events ADD COLUMN body_sha256 BYTEA;
    CREATE UNIQUE INDEX events_source_body ON events (source, body_sha256)
        WHERE body_sha256 IS NOT NULL;
    ",
];

/// Brings the database to the latest version; refuses a database newer than this binary.
///
/// A database already at the latest version is only read: a role with no right to create
/// tables (the schema migrated once by its owner, hookd run by a role that may only read and
/// write rows) starts as well as the owner does.
pub(super) async fn migrate(client: &mut Conn, target: &Target) -> Result<(), InboxError> {
    let latest = MIGRATIONS.len() as i64;
    let failed = |e: tokio_postgres::Error| InboxError::Migration {
        database: target.to_string(),
        target: latest,
        reason: target.reason(&e),
    };
    let recorded = client
        .query_one("SELECT to_regclass('hookd_schema') IS NOT NULL", &[])
        .await
        .map_err(failed)?
        .get::<_, bool>(0);
    if recorded {
        let current = schema_version(client)
            .await
            .map_err(|e| InboxError::Migration {
                database: target.to_string(),
                target: latest,
                reason: format!(
                    "reading the version it is at (table hookd_schema, which the role must be \
                     able to read): {}",
                    target.reason(&e)
                ),
            })?;
        if current == latest {
            return Ok(());
        }
        refuse_newer(current, latest)?;
    }
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS hookd_schema (
             one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
             version BIGINT  NOT NULL
         );
         INSERT INTO hookd_schema (version) VALUES (0) ON CONFLICT (one) DO NOTHING;",
    )
    .await
    .map_err(failed)?;
    let current = schema_version(&tx).await.map_err(failed)?;
    refuse_newer(current, latest)?;
    for sql in MIGRATIONS.iter().skip(current as usize) {
        tx.batch_execute(sql).await.map_err(failed)?;
    }
    tx.execute("UPDATE hookd_schema SET version = $1", &[&latest])
        .await
        .map_err(failed)?;
    tx.commit().await.map_err(failed)
}

/// What a node does to the rows of each table (all of them, once migrated): the privileges its
/// statements need, no more (`attempts` are never updated, ...; an upsert's `DO UPDATE` and a
/// `FOR UPDATE` lock need `UPDATE`). Deleting the plugin files no release names any more is
/// not asked for: a role that may not (the grants of before hookd did) keeps them.
const TABLES: [(&str, &[&str]); 9] = [
    ("events", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("deliveries", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("attempts", &["SELECT", "INSERT", "DELETE"]),
    ("quarantine", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("plugin_state", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("plugin_state_usage", &["SELECT", "INSERT", "UPDATE"]),
    ("nodes", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("plugin_files", &["SELECT", "INSERT"]),
    ("plugin_releases", &["SELECT", "INSERT", "UPDATE"]),
];
/// The sequences a node draws from with `nextval`, which `USAGE` or `UPDATE` allows (an
/// identity column's needs no grant).
const SEQUENCES: [&str; 2] = ["plugin_state_versions", "plugin_release_versions"];

/// Refuses a role that could start but not do its work: one without a row privilege a node's
/// statements need on one of hookd's tables, or unable to draw versions from its sequences,
/// failed later (a plugin's state never committed, its attempt taken back as a crash and run
/// again; a cluster's sync, retention, a state delete failing) instead of at start-up.
pub(super) async fn check_privileges(client: &Conn, target: &Target) -> Result<(), InboxError> {
    let (tables, privileges): (Vec<&str>, Vec<&str>) = TABLES
        .iter()
        .flat_map(|(table, needs)| needs.iter().map(move |privilege| (*table, *privilege)))
        .unzip();
    let sequences: Vec<&str> = SEQUENCES.to_vec();
    let rows = client
        .query(
            "SELECT t.name || ' (' || t.privilege || ')'
             FROM unnest($1::text[], $2::text[]) AS t(name, privilege)
             WHERE NOT has_table_privilege(t.name, t.privilege)
             UNION ALL
             SELECT s.name || ' (USAGE)' FROM unnest($3::text[]) AS s(name)
             WHERE NOT has_sequence_privilege(s.name, 'USAGE, UPDATE')
             ORDER BY 1",
            &[&tables, &privileges, &sequences],
        )
        .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let missing: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    Err(InboxError::MissingPrivileges {
        database: target.to_string(),
        missing: missing.join(", "),
    })
}

/// The version `hookd_schema` records.
async fn schema_version(client: &impl Run) -> Result<i64, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT version FROM hookd_schema", &[])
        .await?
        .get(0))
}

/// Refuses a database a newer hookd migrated past what this one knows.
fn refuse_newer(current: i64, latest: i64) -> Result<(), InboxError> {
    if current > latest {
        return Err(InboxError::SchemaTooNew {
            found: current,
            known: latest,
        });
    }
    Ok(())
}
