//! Plugin state in SQL: the reads, the version check of an attempt's reads, applying its
//! writes within the plugin's total, and an operator's list, read and edit.
//!
//! Invariants:
//! - Versions come from one sequence (`plugin_state_versions`), which only grows, so a deleted
//!   key's row can go: a key re-created later never repeats a version a reader saw.
//! - A commit holds a transaction-scoped advisory lock on each key it read or writes (taken in
//!   one order, so two commits cannot deadlock), from before its version check to its end: of
//!   two attempts that read one key and write it, the second sees the first's version and
//!   conflicts, whichever nodes they ran on; commits touching other keys do not wait.
//! - The plugin's usage row is updated by a delta as the commit's last statement, so it is held
//!   locked only for the commit itself, and its total is checked against what every node
//!   committed.
//! - An operator's edit is an attempt's commit of one key: the same key lock, version check,
//!   versions and usage delta, so it conflicts with an attempt exactly as another attempt does.
//! - Keys are listed in byte order (`COLLATE "C"`, whatever the database's collation), through
//!   the index of that order (`plugin_state_keys`).

use std::{collections::BTreeMap, collections::HashMap, time::Instant};

use super::{
    Connections,
    statements::{Conn, Run, Tx},
};
use crate::{
    inbox::{
        Commits, Edited, InboxError, StateEdit, StateEntry, StateKeyFilter, StateValue,
        state::{Changed, usage_after, write_delta},
    },
    model::{StateChanges, StateLimits, StateUsage},
};

/// Committed value and version of a state key (version 0 = never written).
pub(super) async fn get(
    client: &Conn,
    plugin: &str,
    key: &str,
) -> Result<(Option<Vec<u8>>, i64), InboxError> {
    let row = client
        .query_opt(
            "SELECT value, version FROM plugin_state WHERE plugin = $1 AND key = $2",
            &[&plugin, &key],
        )
        .await?;
    Ok(row.map_or((None, 0), |r| (Some(r.get(0)), r.get(1))))
}

/// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
pub(super) async fn stat(
    client: &Conn,
    plugin: &str,
    key: &str,
) -> Result<(Option<u64>, i64), InboxError> {
    let row = client
        .query_opt(
            "SELECT octet_length(value)::bigint, version FROM plugin_state
             WHERE plugin = $1 AND key = $2",
            &[&plugin, &key],
        )
        .await?;
    Ok(row.map_or((None, 0), |r| {
        let len: i64 = r.get(0);
        (Some(len as u64 + key.len() as u64), r.get(1))
    }))
}

/// What `plugin` holds in committed state (live keys, key + value bytes).
pub(super) async fn usage(client: &Conn, plugin: &str) -> Result<StateUsage, InboxError> {
    let row = client
        .query_opt(
            "SELECT keys, bytes FROM plugin_state_usage WHERE plugin = $1",
            &[&plugin],
        )
        .await?;
    Ok(row.map_or_else(StateUsage::default, |r| StateUsage {
        keys: r.get::<_, i64>(0) as u64,
        bytes: r.get::<_, i64>(1) as u64,
    }))
}

/// Takes the transaction-scoped lock of each of `keys` of `plugin` (absent keys too), in the
/// order of their lock ids, so concurrent commits of overlapping keys queue instead of
/// deadlocking.
pub(super) async fn lock_keys(
    tx: &Tx<'_>,
    plugin: &str,
    keys: Vec<&str>,
) -> Result<(), InboxError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(id) FROM (
                 SELECT DISTINCT hashtextextended(length($1) || ':' || $1 || key, 0) AS id
                 FROM unnest($2::text[]) AS k (key)) AS ids
             ORDER BY id",
        &[&plugin, &keys],
    )
    .await?;
    Ok(())
}

/// The committed `(version, value length)` of each of `keys` of `plugin` that is stored.
async fn stored(
    tx: &Tx<'_>,
    plugin: &str,
    keys: Vec<&str>,
) -> Result<HashMap<String, (i64, usize)>, InboxError> {
    let rows = tx
        .query(
            "SELECT key, version, octet_length(value)::bigint FROM plugin_state
             WHERE plugin = $1 AND key = ANY($2)",
            &[&plugin, &keys],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get::<_, i64>(2) as usize)))
        .collect())
}

/// The first key of `versions` (key → version seen, 0 = absent) whose committed version in
/// `plugin` is no longer the one seen.
pub(super) async fn first_changed(
    tx: &Tx<'_>,
    plugin: &str,
    versions: &BTreeMap<String, i64>,
) -> Result<Option<Changed>, InboxError> {
    let keys = versions.keys().map(String::as_str).collect();
    let stored = stored(tx, plugin, keys).await?;
    Ok(versions.iter().find_map(|(key, seen)| {
        let now = stored.get(key).map_or(0, |(version, _)| *version);
        (now != *seen).then(|| Changed {
            key: key.clone(),
            seen: *seen,
            now,
        })
    }))
}

/// Applies the state writes of `changes` to `plugin` at `at_ms` (their keys locked by
/// [`lock_keys`]) and returns how they change the plugin's `(keys, bytes)`, for [`add_usage`]
/// to count, and the highest version they were stamped with (0: nothing set).
pub(super) async fn apply_state(
    tx: &Tx<'_>,
    plugin: &str,
    changes: &StateChanges,
    at_ms: i64,
) -> Result<((i64, i64), i64), InboxError> {
    let keys = changes.writes.keys().map(String::as_str).collect();
    let stored = stored(tx, plugin, keys).await?;
    let mut delta = (0i64, 0i64);
    for (key, value) in &changes.writes {
        let before = stored.get(key).map(|(_, len)| *len);
        let (keys, bytes) = write_delta(key, before, value.as_deref());
        delta = (delta.0 + keys, delta.1 + bytes);
    }
    let (mut set_keys, mut set_values, mut deleted) = (Vec::new(), Vec::new(), Vec::new());
    for (key, value) in &changes.writes {
        match value {
            Some(value) => {
                set_keys.push(key.as_str());
                set_values.push(value.as_slice());
            }
            None => deleted.push(key.as_str()),
        }
    }
    let mut version = 0;
    if !set_keys.is_empty() {
        version = tx
            .query_one(
                "WITH set AS (
                         INSERT INTO plugin_state (plugin, key, value, version, updated_at)
                         SELECT $1, key, value, nextval('plugin_state_versions'), $4
                         FROM unnest($2::text[], $3::bytea[]) AS w (key, value)
                         ON CONFLICT (plugin, key)
                             DO UPDATE SET value = excluded.value, version = excluded.version,
                                           updated_at = excluded.updated_at
                         RETURNING version)
                     SELECT MAX(version) FROM set",
                &[&plugin, &set_keys, &set_values, &at_ms],
            )
            .await?
            .get(0);
    }
    if !deleted.is_empty() {
        tx.execute(
            "DELETE FROM plugin_state WHERE plugin = $1 AND key = ANY($2)",
            &[&plugin, &deleted],
        )
        .await?;
    }
    Ok((delta, version))
}

/// Adds `delta` to the plugin's usage (the commit's last statement: the row stays locked only
/// until the commit), unless that takes it over its total: `Err(message)`, and the caller
/// rolls the whole transaction back.
pub(super) async fn add_usage(
    tx: &Tx<'_>,
    plugin: &str,
    limits: &StateLimits,
    (delta_keys, delta_bytes): (i64, i64),
) -> Result<Result<(), String>, InboxError> {
    let row = tx
        .query_one(
            "INSERT INTO plugin_state_usage AS u (plugin, keys, bytes, clock)
                 VALUES ($1, $2, $3, 0)
                 ON CONFLICT (plugin)
                     DO UPDATE SET keys = u.keys + $2, bytes = u.bytes + $3
                 RETURNING keys, bytes",
            &[&plugin, &delta_keys, &delta_bytes],
        )
        .await?;
    let (keys, bytes): (i64, i64) = (row.get(0), row.get(1));
    let before = StateUsage {
        keys: (keys - delta_keys).max(0) as u64,
        bytes: (bytes - delta_bytes).max(0) as u64,
    };
    Ok(usage_after(plugin, before, (delta_keys, delta_bytes), limits).map(|_| ()))
}

/// A page of `plugin`'s keys (see [`StateKeyFilter`]), in byte order: one range of the
/// `plugin_state_keys` index.
pub(super) async fn list(
    client: &Conn,
    plugin: &str,
    filter: &StateKeyFilter,
) -> Result<Vec<StateEntry>, InboxError> {
    let (start, inclusive) = filter.start();
    let end = filter.end();
    let limit = filter.limit as i64;
    let sql = format!(
        "SELECT key, octet_length(value)::bigint, version, updated_at FROM plugin_state
         WHERE plugin = $1 AND key COLLATE \"C\" {} $2{}
         ORDER BY key COLLATE \"C\" LIMIT $3",
        if inclusive { ">=" } else { ">" },
        if end.is_some() {
            " AND key COLLATE \"C\" < $4"
        } else {
            ""
        },
    );
    let rows = match &end {
        Some(end) => client.query(&sql, &[&plugin, &start, &limit, end]).await?,
        None => client.query(&sql, &[&plugin, &start, &limit]).await?,
    };
    Ok(rows
        .iter()
        .map(|r| StateEntry {
            key: r.get(0),
            size: r.get::<_, i64>(1) as u64,
            version: r.get(2),
            updated_at_ms: r.get(3),
        })
        .collect())
}

/// `plugin`'s committed value of `key`, if it has one.
pub(super) async fn value(
    client: &Conn,
    plugin: &str,
    key: &str,
) -> Result<Option<StateValue>, InboxError> {
    let row = client
        .query_opt(
            "SELECT value, version, updated_at FROM plugin_state
                     WHERE plugin = $1 AND key = $2",
            &[&plugin, &key],
        )
        .await?;
    Ok(row.map(|r| StateValue {
        value: r.get(0),
        version: r.get(1),
        updated_at_ms: r.get(2),
    }))
}

/// An operator's edit in a transaction of its own, checked and applied as an attempt's state
/// commit is (its key locked, its version checked, then written and counted); nothing of a
/// refused one stays.
pub(super) async fn edit(
    pool: &Connections,
    commits: &Commits,
    edit: &StateEdit,
    at_ms: i64,
) -> Result<Edited, InboxError> {
    let started = Instant::now();
    let plugin = edit.plugin.as_str();
    let changes = edit.changes();
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    lock_keys(&tx, plugin, vec![edit.key.as_str()]).await?;
    if let Some(Changed { now, .. }) = first_changed(&tx, plugin, &changes.versions).await? {
        tx.rollback().await?;
        return Ok(Edited::Changed { now });
    }
    let (delta, version) = apply_state(&tx, plugin, &changes, at_ms).await?;
    if let Err(message) = add_usage(&tx, plugin, &changes.limits, delta).await? {
        tx.rollback().await?;
        return Ok(Edited::OverQuota(message));
    }
    tx.commit().await?;
    commits.committed(1, started);
    Ok(Edited::Written { version })
}
