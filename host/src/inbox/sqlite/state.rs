//! Plugin state in SQL: the reads, the version check of an attempt's reads, and applying its
//! writes within the plugin's total.
//!
//! Invariants:
//! - Versions come from `plugin_state_usage.clock`, which only grows, so a deleted key's row
//!   can go: a key re-created later never repeats a version a reader saw.
//! - Usage is updated in the savepoint that applies the writes, so it never drifts from the
//!   rows.

use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    inbox::{
        Finish, InboxError,
        state::{Changed, usage_after, write_delta},
    },
    model::{StateChanges, StateUsage},
};

/// Committed value and version of a state key (version 0 = never written).
pub(super) fn get(
    conn: &Connection,
    plugin: &str,
    key: &str,
) -> Result<(Option<Vec<u8>>, i64), InboxError> {
    Ok(conn
        .prepare_cached("SELECT value, version FROM plugin_state WHERE plugin = ?1 AND key = ?2")?
        .query_row(params![plugin, key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((None, 0)))
}

/// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
pub(super) fn stat(
    conn: &Connection,
    plugin: &str,
    key: &str,
) -> Result<(Option<u64>, i64), InboxError> {
    Ok(conn
        .prepare_cached(
            "SELECT length(value), version FROM plugin_state WHERE plugin = ?1 AND key = ?2",
        )?
        .query_row(params![plugin, key], |r| {
            let len: Option<u64> = r.get(0)?;
            Ok((len.map(|len| len + key.len() as u64), r.get(1)?))
        })
        .optional()?
        .unwrap_or((None, 0)))
}

/// What `plugin` holds in committed state (live keys, key + value bytes).
pub(super) fn usage(conn: &Connection, plugin: &str) -> Result<StateUsage, InboxError> {
    Ok(state_usage(conn, plugin)?.0)
}

/// Key + value bytes an attempt's writes carry (what its commit writes): its writer job's
/// weight.
pub(super) fn state_bytes(changes: &StateChanges) -> usize {
    changes
        .writes
        .iter()
        .map(|(key, value)| key.len() + value.as_ref().map_or(0, Vec::len))
        .sum()
}

/// The first key `f` read whose committed version is no longer the one it saw (0 = absent).
pub(super) fn first_changed(conn: &Connection, f: &Finish) -> Result<Option<Changed>, InboxError> {
    let mut current =
        conn.prepare_cached("SELECT version FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    for (key, seen) in &f.state.versions {
        let now: i64 = current
            .query_row(params![f.plugin.as_str(), key], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        if now != *seen {
            return Ok(Some(Changed {
                key: key.clone(),
                seen: *seen,
                now,
            }));
        }
    }
    Ok(None)
}

/// A plugin's committed usage and its version clock (0s for a plugin that never wrote).
fn state_usage(conn: &Connection, plugin: &str) -> Result<(StateUsage, i64), InboxError> {
    Ok(conn
        .prepare_cached("SELECT keys, bytes, clock FROM plugin_state_usage WHERE plugin = ?1")?
        .query_row([plugin], |r| {
            Ok((
                StateUsage {
                    keys: r.get(0)?,
                    bytes: r.get(1)?,
                },
                r.get(2)?,
            ))
        })
        .optional()?
        .unwrap_or_default())
}

/// Applies an attempt's state writes if it stays within the plugin's total: `Err(message)`
/// (nothing written) if it would not. Versions come from the plugin's clock, which only grows,
/// so a deleted key's row can go: a key re-created later never repeats a version a reader saw.
pub(super) fn apply_state(conn: &Connection, f: &Finish) -> Result<Result<(), String>, InboxError> {
    let plugin = f.plugin.as_str();
    let mut size = conn
        .prepare_cached("SELECT length(value) FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    let mut delta = (0i64, 0i64);
    for (key, value) in &f.state.writes {
        let before: Option<usize> = size
            .query_row(params![plugin, key], |r| r.get(0))
            .optional()?
            .flatten();
        let (keys, bytes) = write_delta(key, before, value.as_deref());
        delta = (delta.0 + keys, delta.1 + bytes);
    }
    let (usage, clock) = state_usage(conn, plugin)?;
    let (keys, bytes) = match usage_after(plugin, usage, delta, &f.state.limits) {
        Ok(after) => after,
        Err(message) => return Ok(Err(message)),
    };
    let version = clock + 1;
    let mut set = conn.prepare_cached(
        "INSERT INTO plugin_state (plugin, key, value, version) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (plugin, key) DO UPDATE SET value = excluded.value, version = excluded.version",
    )?;
    let mut delete =
        conn.prepare_cached("DELETE FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    for (key, value) in &f.state.writes {
        match value {
            Some(value) => set.execute(params![plugin, key, value, version])?,
            None => delete.execute(params![plugin, key])?,
        };
    }
    conn.prepare_cached(
        "INSERT INTO plugin_state_usage (plugin, keys, bytes, clock) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (plugin) DO UPDATE
             SET keys = excluded.keys, bytes = excluded.bytes, clock = excluded.clock",
    )?
    .execute(params![plugin, keys, bytes, version])?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::Durability,
        inbox::{
            Finished, Inbox,
            contract::fixtures::{self, done, lease, state_writes as changes},
            sqlite::TempDatabase,
        },
        model::StateLimits,
    };

    const PLUGIN: &str = fixtures::HANDLER;

    fn rows(db: &TempDatabase) -> i64 {
        let conn = Connection::open(db.path()).unwrap();
        conn.query_row("SELECT COUNT(*) FROM plugin_state", [], |r| r.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn the_commit_keeps_usage_and_deletes_leave_no_rows() {
        let db = TempDatabase::new();
        let inbox = fixtures::open(&db).await;
        let limits = StateLimits::DEFAULT;
        let a = lease(&inbox, "a").await;
        let writes = changes(&inbox, &[("k1", Some(10)), ("k2", Some(20))], limits);
        assert_eq!(
            inbox.finish(done(&a, writes)).await.unwrap(),
            Finished::Recorded
        );
        let usage = inbox.state_usage_blocking(PLUGIN).unwrap();
        assert_eq!(
            usage,
            StateUsage {
                keys: 2,
                bytes: 2 + 10 + 2 + 20
            }
        );
        let (_, v1) = inbox.state_stat_blocking(PLUGIN, "k1").unwrap();

        // Deleting k1 (and a key that never existed) frees it and leaves no row behind.
        let b = lease(&inbox, "b").await;
        let writes = changes(&inbox, &[("k1", None), ("never", None)], limits);
        assert_eq!(
            inbox.finish(done(&b, writes)).await.unwrap(),
            Finished::Recorded
        );
        assert_eq!(
            inbox.state_usage_blocking(PLUGIN).unwrap(),
            StateUsage { keys: 1, bytes: 22 }
        );
        assert_eq!(rows(&db), 1);
        assert_eq!(inbox.state_stat_blocking(PLUGIN, "k1").unwrap(), (None, 0));

        // Re-created, k1 gets a version it never had, so a reader of the old k1 conflicts.
        let c = lease(&inbox, "c").await;
        let writes = changes(&inbox, &[("k1", Some(10))], limits);
        assert_eq!(
            inbox.finish(done(&c, writes)).await.unwrap(),
            Finished::Recorded
        );
        let (size, v2) = inbox.state_stat_blocking(PLUGIN, "k1").unwrap();
        assert_eq!(size, Some(12));
        assert!(v2 > v1, "{v2} > {v1}");
        inbox.close();
    }

    #[test]
    fn the_state_usage_migration_counts_existing_state_and_drops_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.db");
        {
            // A database at schema 1, with live keys and a tombstone.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(super::super::schema::MIGRATIONS[0])
                .unwrap();
            conn.execute_batch(
                "PRAGMA user_version = 1;
                 INSERT INTO plugin_state VALUES ('p', 'é', x'0102', 5), ('p', 'gone', NULL, 9),
                                                 ('q', 'k', x'01', 1);",
            )
            .unwrap();
        }
        let inbox = Inbox::open(&path, Durability::Normal).unwrap();
        assert_eq!(
            inbox.state_usage_blocking("p").unwrap(),
            StateUsage {
                keys: 1,
                bytes: 2 + 2
            }
        );
        assert_eq!(
            inbox.state_usage_blocking("q").unwrap(),
            StateUsage { keys: 1, bytes: 2 }
        );
        assert_eq!(inbox.state_stat_blocking("p", "gone").unwrap(), (None, 0));
        inbox.close();
        let conn = Connection::open(&path).unwrap();
        let clock: i64 = conn
            .query_row(
                "SELECT clock FROM plugin_state_usage WHERE plugin = 'p'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(clock, 9, "new versions start above every version ever used");
    }
}
