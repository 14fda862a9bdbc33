//! Versioned schema migrations, applied in order at open and recorded in `PRAGMA user_version`.
//!
//! Invariants:
//! - A migration, once released, is never edited; changes are new entries at the end (the
//!   tests hold each one's SHA-256).
//! - Each migration and its new `user_version` are one transaction; a failed one names the
//!   database and the version it was going to.

use rusqlite::Connection;

use crate::inbox::InboxError;

/// The SHA-256 of each released migration's SQL, which a test holds them to
/// (`inbox/frozen.rs`): a new migration appends its hash, an edited one fails.
#[cfg(test)]
pub(in crate::inbox) const RELEASED: &[&str] = &[
    "3b5d990f580a94c251f0b7772e1eb38052dddcb296b6a691ea6c677108e660a0",
    "08475420abfa41e9016f46848276ebefe317ef428e25afcb9b0e24699eac10b2",
    "e04672bd1f27537dc15d0df857976998be46f87d191238dea2a9702e023e8aa7",
    "f9850f952dee7b692b5185f8dc732622ab4d24cd40359a2f3d34259a5fb9097f",
    "2966be822840bdfd3899075ba4af17b69eb4c95ac9309a48b08cbbebe9b78629",
    "0cb178afee1116a3767ff0323f94a2e4dd348268417ad65ecf0777f6d8869e22",
    "003edad2a8c990a80a3825623121a7707e03ce7f158b12c152517688c3706623",
    "f2c50cb4b5a53bdd4f48ba3cd0e1754d39efe72cb2b6e22466ca5237236e0b62",
    "3f935d80efa87619112a6d29a4e17171ad6cab6bafe332e6c459a08e66a1c721",
    "2065b75516fbdf12381ba2761d83a8eccdcaf59da184913d8e200fcc224e56cb",
    "75ad33aa2f30ef4724dbca600e20b0cbd6285c474326b13d1024595be1a0e1c6",
    "bddeb8a99184b80fce2ccee95bf98b91a6f3f12b2e70f1f2c24d0d2e0e5d80f5",
    "bc2a73224a8102e9d166f32b210ff7f5f718f9b89a390a82dd55feb82abd613b",
];

/// Migration `i` takes the schema from version `i` to `i + 1`.
pub(in crate::inbox) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "
    CREATE TABLE events (
        id           INTEGER PRIMARY KEY,
        source       TEXT    NOT NULL,
        event_id     TEXT    NOT NULL,
        event_type   TEXT    NOT NULL,
        ordering_key TEXT,
        sequence     INTEGER,
        received_at  INTEGER NOT NULL,
        headers      TEXT    NOT NULL,
        body         BLOB    NOT NULL,
        UNIQUE (source, event_id)
    );
    CREATE INDEX events_received ON events (received_at);

    -- One row per (event, handler). `attempts` counts every attempt ever made; `budget_base` is
    -- the value it had at the last replay, so `attempts - budget_base` is the current budget use.
    CREATE TABLE deliveries (
        id              INTEGER PRIMARY KEY,
        event           INTEGER NOT NULL REFERENCES events (id),
        source          TEXT    NOT NULL,
        handler         TEXT    NOT NULL,
        ordering_key    TEXT,
        sequence        INTEGER,
        state           TEXT    NOT NULL,
        attempts        INTEGER NOT NULL DEFAULT 0,
        budget_base     INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        lease_until     INTEGER,
        leased_at       INTEGER,
        output          TEXT,
        last_error      TEXT,
        updated_at      INTEGER NOT NULL,
        UNIQUE (event, handler)
    );
    CREATE INDEX deliveries_due ON deliveries (state, next_attempt_at);
    CREATE INDEX deliveries_key ON deliveries (source, handler, ordering_key)
        WHERE ordering_key IS NOT NULL;

    CREATE TABLE attempts (
        id            INTEGER PRIMARY KEY,
        delivery      INTEGER NOT NULL REFERENCES deliveries (id),
        attempt       INTEGER NOT NULL,
        started_at    INTEGER NOT NULL,
        finished_at   INTEGER NOT NULL,
        outcome       TEXT    NOT NULL,
        error_kind    TEXT,
        error         TEXT,
        plugin_sha256 TEXT
    );
    CREATE INDEX attempts_delivery ON attempts (delivery);

    -- Verified requests whose parser trapped, timed out or was missing: replayable.
    CREATE TABLE quarantine (
        id          INTEGER PRIMARY KEY,
        source      TEXT    NOT NULL,
        received_at INTEGER NOT NULL,
        headers     TEXT    NOT NULL,
        body        BLOB    NOT NULL,
        reason      TEXT    NOT NULL,
        resolved_at INTEGER,
        resolution  TEXT
    );

    -- Plugin state. A deleted key keeps its row (value NULL) so its version keeps counting.
    CREATE TABLE plugin_state (
        plugin  TEXT    NOT NULL,
        key     TEXT    NOT NULL,
        value   BLOB,
        version INTEGER NOT NULL,
        PRIMARY KEY (plugin, key)
    ) WITHOUT ROWID;
    ",
    // 2: held quarantined requests are counted and listed by id from this covering index
    // alone: a row's later columns (`resolved_at`) sit behind its body's overflow pages, so a
    // table scan would read every quarantined body.
    "
    CREATE INDEX quarantine_held ON quarantine (resolved_at, source, received_at);
    ",
    // 3: a claim looks up each handler's oldest due deliveries on its own (fair dispatch), so
    // one handler's backlog is never scanned to find another's.
    "CREATE INDEX deliveries_handler_due ON deliveries (handler, state, next_attempt_at);",
    // 4: per-plugin state usage, kept in the transaction that applies the writes, so a plugin's
    // total (keys, key + value bytes) is checked without scanning its keys. `clock` is the
    // plugin's version counter: every commit stamps its writes with clock + 1, so versions
    // never repeat and a deleted key's row can go (tombstones used to keep versions counting,
    // and grew without bound).
    "
    CREATE TABLE plugin_state_usage (
        plugin TEXT    PRIMARY KEY,
        keys   INTEGER NOT NULL,
        bytes  INTEGER NOT NULL,
        clock  INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO plugin_state_usage (plugin, keys, bytes, clock)
        SELECT plugin, COUNT(value),
               COALESCE(SUM(length(CAST(key AS BLOB)) + length(value)), 0), MAX(version)
        FROM plugin_state GROUP BY plugin;
    DELETE FROM plugin_state WHERE value IS NULL;
    ",
    // 5: retention. `pruned_at` says an event's payload (headers, body, its deliveries' outputs
    // and errors, its attempts) was pruned; its rows stay to dedupe its id and to remember the
    // newest done sequence of its ordering key. The pruner walks the events not yet pruned in
    // arrival order (so never the compact rows, however many), and forgets the pruned ones in
    // the order they were pruned.
    "
    ALTER TABLE events ADD COLUMN pruned_at INTEGER;
    CREATE INDEX events_unpruned ON events (received_at, id) WHERE pruned_at IS NULL;
    CREATE INDEX events_pruned ON events (pruned_at) WHERE pruned_at IS NOT NULL;
    ",
    // 6: the event list's filters and cursor stay index range scans on millions of events: by
    // source or type newest first, by provider event id, and the events having a delivery in
    // a state (a rare one, dead, included) newest first.
    "
    CREATE INDEX events_source_id ON events (source, id);
    CREATE INDEX events_type_id ON events (event_type, id);
    CREATE INDEX events_event_id ON events (event_id);
    CREATE INDEX deliveries_state_event ON deliveries (state, event);
    ",
    // 7: a replay with `force` delivers the delivery even when a newer sequence of its key was
    // handled since (it reaches the handler with `stale` set instead of being marked `stale`).
    "
    ALTER TABLE deliveries ADD COLUMN deliver_stale INTEGER NOT NULL DEFAULT 0;
    ",
    // 8: when each state key was last written (by an attempt's commit or an operator's edit),
    // for the admin API's key list; keys written before this migration have none.
    "ALTER TABLE plugin_state ADD COLUMN updated_at INTEGER;",
    // 9: an event's headers and body live in a table of their own. Pruning deletes the row
    // whole, so its pages go to the freelist and new events reuse them, and it touches no index
    // of `events` (a row of `events` shrunk in place left its page nearly empty for good: the
    // file grew as fast with pruning as without). Events stored before this keep theirs in
    // `events` (and have no `payloads` row); readers take whichever holds it.
    "
    CREATE TABLE payloads (
        event   INTEGER PRIMARY KEY REFERENCES events (id),
        headers TEXT    NOT NULL,
        body    BLOB    NOT NULL
    );
    ",
    // 10: a claim's checks on an ordering key are seeks, whatever the key's history: whether
    // one of its open deliveries runs or comes first (by state, then sequence), and its newest
    // `done` sequence. `deliveries_key` made each check walk every delivery the key ever had.
    // And `events_event_id` goes: a filter by provider event id looks it up in the
    // `(source, event_id)` index once per stored source instead, and every accept writes one
    // random index page fewer.
    "
    CREATE INDEX deliveries_key_state
        ON deliveries (source, handler, ordering_key, state, COALESCE(sequence, 0))
        WHERE ordering_key IS NOT NULL;
    DROP INDEX deliveries_key;
    DROP INDEX events_event_id;
    ",
    // 11: `deliveries_due` goes. Every change of a delivery's state moved its entry there, for
    // the earliest waiting delivery (the dispatcher's timer, the lag gauge), now a seek of
    // `deliveries_handler_due` per handler and waiting state; lookups by state (counts,
    // reclaim, replay, dead letters) read `deliveries_state_event`.
    "DROP INDEX deliveries_due;",
    // 12: a claim finds the heads of the keys with open deliveries by walking those keys, one
    // seek each, when the earliest due deliveries all wait behind their keys' heads (one key's
    // backlog of thousands made every claim read all of it, on the writer). So the key index
    // holds open deliveries only (done ones, read for the newest done sequence, and those with
    // a `budget_base`, read for the newest handled one, have indexes of their own), led by the
    // handler; and due deliveries with and without a key are ranges of two indexes, so those
    // without one are never found behind a wall of keyed ones. A delivery is written to as
    // many of these indexes as before (one with a key and a `budget_base` to one more; one
    // with a key that is dead, stale or discarded to one fewer).
    "
    CREATE INDEX deliveries_keyed_due ON deliveries (handler, state, next_attempt_at)
        WHERE ordering_key IS NOT NULL;
    CREATE INDEX deliveries_unkeyed_due ON deliveries (handler, state, next_attempt_at)
        WHERE ordering_key IS NULL;
    CREATE INDEX deliveries_open_keys
        ON deliveries (handler, source, ordering_key, state, COALESCE(sequence, 0))
        WHERE state IN ('pending', 'running', 'retrying') AND ordering_key IS NOT NULL;
    CREATE INDEX deliveries_done_sequence ON deliveries (source, handler, ordering_key, sequence)
        WHERE state = 'done' AND ordering_key IS NOT NULL;
    CREATE INDEX deliveries_once_handled ON deliveries (source, handler, ordering_key, sequence)
        WHERE budget_base > 0 AND ordering_key IS NOT NULL;
    DROP INDEX deliveries_handler_due;
    DROP INDEX deliveries_key_state;
    ",
    // 13: a source with `dedupe_body` stores the SHA-256 of each event's body, unique per
    // source beside its event id: under a scheme that signs only the body, a captured request
    // sent again with a new (unsigned) id is a duplicate too. Other sources store none, and
    // their events are in no entry of the index.
    "
    ALTER TABLE events ADD COLUMN body_sha256 BLOB;
    CREATE UNIQUE INDEX events_source_body ON events (source, body_sha256)
        WHERE body_sha256 IS NOT NULL;
    ",
];

/// Brings the database to the latest version; refuses a database newer than this binary.
pub fn migrate(conn: &Connection) -> Result<(), InboxError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let latest = MIGRATIONS.len() as i64;
    if current > latest {
        return Err(InboxError::SchemaTooNew {
            found: current,
            known: latest,
        });
    }
    if current > 0 && current < latest {
        // Some upgrades build an index over every row: say why the start waits.
        tracing::info!(
            from = current,
            to = latest,
            "upgrading the database schema (a large database may take a while)"
        );
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let started = std::time::Instant::now();
        let target = index as i64 + 1;
        let failed = |e: rusqlite::Error| InboxError::Migration {
            database: conn.path().unwrap_or(":memory:").to_owned(),
            target,
            reason: e.to_string(),
        };
        let tx = conn.unchecked_transaction().map_err(failed)?;
        tx.execute_batch(sql).map_err(failed)?;
        tx.execute_batch(&format!("PRAGMA user_version = {target}"))
            .map_err(failed)?;
        tx.commit().map_err(failed)?;
        if current > 0 {
            tracing::info!(version = index + 1, took = ?started.elapsed(), "schema version applied");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A migration that fails names the database and the version it was going to.
    #[test]
    fn a_failed_migration_names_its_database_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        super::migrate(&conn).unwrap();
        let latest = super::MIGRATIONS.len();
        // Recorded one version back, with what the last migration creates already there.
        conn.execute_batch(&format!("PRAGMA user_version = {}", latest - 1))
            .unwrap();
        let e = super::migrate(&conn).unwrap_err();
        let shown = e.to_string();
        assert!(
            matches!(e, crate::inbox::InboxError::Migration { .. })
                && shown.contains(&path.display().to_string())
                && shown.contains(&format!("schema version {latest}"))
                && shown.contains("body_sha256"),
            "{shown}"
        );
    }
}
