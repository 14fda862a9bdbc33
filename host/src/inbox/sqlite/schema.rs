//! Versioned schema migrations, applied in order at open and recorded in `PRAGMA user_version`.
//!
//! Invariant: a migration, once released, is never edited; changes are new entries at the end.

use rusqlite::Connection;

use crate::inbox::InboxError;

/// Migration `i` takes the schema from version `i` to `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
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
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql)?;
        tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))?;
        tx.commit()?;
        if current > 0 {
            tracing::info!(version = index + 1, took = ?started.elapsed(), "schema version applied");
        }
    }
    Ok(())
}
