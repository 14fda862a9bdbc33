//! Plugin state in SQL: the reads, the version check of an attempt's reads, applying its
//! writes within the plugin's total, and an operator's list, read and edit.
//!
//! Invariants:
//! - Versions come from `plugin_state_usage.clock`, which only grows, so a deleted key's row
//!   can go: a key re-created later never repeats a version a reader saw.
//! - Usage is updated in the savepoint that applies the writes, so it never drifts from the
//!   rows.
//! - An operator's edit is checked and applied by the same functions as an attempt's commit,
//!   as one job of the one writer, so no commit can fall between its check and its write.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, params, types::Value};

use crate::{
    inbox::{
        Edited, InboxError, StateEdit, StateEntry, StateKeyFilter, StateValue,
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

/// The first key of `versions` (key → version seen, 0 = absent) whose committed version in
/// `plugin` is no longer the one seen.
pub(super) fn first_changed(
    conn: &Connection,
    plugin: &str,
    versions: &BTreeMap<String, i64>,
) -> Result<Option<Changed>, InboxError> {
    let mut current =
        conn.prepare_cached("SELECT version FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    for (key, seen) in versions {
        let now: i64 = current
            .query_row(params![plugin, key], |r| r.get(0))
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

/// Applies the state writes of `changes` to `plugin` at `at_ms` if they stay within the
/// plugin's total, returning the version they were stamped with; `Err(message)` (nothing
/// written) if they would not. Versions come from the plugin's clock, which only grows, so a
/// deleted key's row can go: a key re-created later never repeats a version a reader saw.
///
/// `stamp` is the version handed out when the commit was queued (`queued.rs`); should the
/// clock have passed it (a heavier job queued earlier was deferred behind this one), the next
/// version of the clock is used instead, and whoever read the queued write conflicts.
pub(super) fn apply_state(
    conn: &Connection,
    plugin: &str,
    changes: &StateChanges,
    at_ms: i64,
    stamp: i64,
) -> Result<Result<i64, String>, InboxError> {
    let mut size = conn
        .prepare_cached("SELECT length(value) FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    let mut delta = (0i64, 0i64);
    for (key, value) in &changes.writes {
        let before: Option<usize> = size
            .query_row(params![plugin, key], |r| r.get(0))
            .optional()?
            .flatten();
        let (keys, bytes) = write_delta(key, before, value.as_deref());
        delta = (delta.0 + keys, delta.1 + bytes);
    }
    let (usage, clock) = state_usage(conn, plugin)?;
    let (keys, bytes) = match usage_after(plugin, usage, delta, &changes.limits) {
        Ok(after) => after,
        Err(message) => return Ok(Err(message)),
    };
    let version = stamp.max(clock + 1);
    let mut set = conn.prepare_cached(
        "INSERT INTO plugin_state (plugin, key, value, version, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (plugin, key) DO UPDATE
             SET value = excluded.value, version = excluded.version,
                 updated_at = excluded.updated_at",
    )?;
    let mut delete =
        conn.prepare_cached("DELETE FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    for (key, value) in &changes.writes {
        match value {
            Some(value) => set.execute(params![plugin, key, value, version, at_ms])?,
            None => delete.execute(params![plugin, key])?,
        };
    }
    conn.prepare_cached(
        "INSERT INTO plugin_state_usage (plugin, keys, bytes, clock) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (plugin) DO UPDATE
             SET keys = excluded.keys, bytes = excluded.bytes,
                 clock = MAX(clock, excluded.clock)",
    )?
    .execute(params![plugin, keys, bytes, version])?;
    Ok(Ok(version))
}

/// A page of `plugin`'s keys (see [`StateKeyFilter`]): one range of the primary key, whose
/// `BINARY` collation orders keys as bytes.
pub(super) fn list(
    conn: &Connection,
    plugin: &str,
    filter: &StateKeyFilter,
) -> Result<Vec<StateEntry>, InboxError> {
    let (start, inclusive) = filter.start();
    let end = filter.end();
    let sql = format!(
        "SELECT key, length(value), version, updated_at FROM plugin_state
         WHERE plugin = ?1 AND key {} ?2{} ORDER BY key LIMIT ?3",
        if inclusive { ">=" } else { ">" },
        if end.is_some() { " AND key < ?4" } else { "" },
    );
    let mut args = vec![
        Value::from(plugin.to_owned()),
        Value::from(start.to_owned()),
        Value::from(filter.limit as i64),
    ];
    args.extend(end.map(Value::from));
    let mut statement = conn.prepare_cached(&sql)?;
    let rows = statement.query_map(rusqlite::params_from_iter(args), |r| {
        Ok(StateEntry {
            key: r.get(0)?,
            size: r.get(1)?,
            version: r.get(2)?,
            updated_at_ms: r.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// `plugin`'s committed value of `key`, if it has one.
pub(super) fn value(
    conn: &Connection,
    plugin: &str,
    key: &str,
) -> Result<Option<StateValue>, InboxError> {
    Ok(conn
        .prepare_cached(
            "SELECT value, version, updated_at FROM plugin_state WHERE plugin = ?1 AND key = ?2",
        )?
        .query_row(params![plugin, key], |r| {
            Ok(StateValue {
                value: r.get(0)?,
                version: r.get(1)?,
                updated_at_ms: r.get(2)?,
            })
        })
        .optional()?)
}

/// An operator's edit, checked and applied as an attempt's state commit is (stamped `stamp`).
pub(super) fn edit(
    conn: &Connection,
    edit: &StateEdit,
    at_ms: i64,
    stamp: i64,
) -> Result<Edited, InboxError> {
    let plugin = edit.plugin.as_str();
    let changes = edit.changes();
    if let Some(Changed { now, .. }) = first_changed(conn, plugin, &changes.versions)? {
        return Ok(Edited::Changed { now });
    }
    Ok(match apply_state(conn, plugin, &changes, at_ms, stamp)? {
        Ok(version) => Edited::Written {
            version: if edit.value.is_some() { version } else { 0 },
        },
        Err(message) => Edited::OverQuota(message),
    })
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
