//! Plugin state in SQL: the reads, the version check of an attempt's reads, and applying its
//! writes within the plugin's total.
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

use std::collections::HashMap;

use deadpool_postgres::{Client, Transaction};

use crate::{
    inbox::{
        Finish, InboxError,
        state::{Changed, usage_after, write_delta},
    },
    model::StateUsage,
};

/// Committed value and version of a state key (version 0 = never written).
pub(super) async fn get(
    client: &Client,
    plugin: &str,
    key: &str,
) -> Result<(Option<Vec<u8>>, i64), InboxError> {
    let row = client
        .query_opt(
            &client
                .prepare_cached(
                    "SELECT value, version FROM plugin_state WHERE plugin = $1 AND key = $2",
                )
                .await?,
            &[&plugin, &key],
        )
        .await?;
    Ok(row.map_or((None, 0), |r| (Some(r.get(0)), r.get(1))))
}

/// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
pub(super) async fn stat(
    client: &Client,
    plugin: &str,
    key: &str,
) -> Result<(Option<u64>, i64), InboxError> {
    let row = client
        .query_opt(
            &client
                .prepare_cached(
                    "SELECT octet_length(value)::bigint, version FROM plugin_state
             WHERE plugin = $1 AND key = $2",
                )
                .await?,
            &[&plugin, &key],
        )
        .await?;
    Ok(row.map_or((None, 0), |r| {
        let len: i64 = r.get(0);
        (Some(len as u64 + key.len() as u64), r.get(1))
    }))
}

/// What `plugin` holds in committed state (live keys, key + value bytes).
pub(super) async fn usage(client: &Client, plugin: &str) -> Result<StateUsage, InboxError> {
    let row = client
        .query_opt(
            &client
                .prepare_cached("SELECT keys, bytes FROM plugin_state_usage WHERE plugin = $1")
                .await?,
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
    tx: &Transaction<'_>,
    plugin: &str,
    keys: Vec<&str>,
) -> Result<(), InboxError> {
    tx.execute(
        &tx.prepare_cached(
            "SELECT pg_advisory_xact_lock(id) FROM (
                 SELECT DISTINCT hashtextextended(length($1) || ':' || $1 || key, 0) AS id
                 FROM unnest($2::text[]) AS k (key)) AS ids
             ORDER BY id",
        )
        .await?,
        &[&plugin, &keys],
    )
    .await?;
    Ok(())
}

/// The committed `(version, value length)` of each of `keys` of `plugin` that is stored.
async fn stored(
    tx: &Transaction<'_>,
    plugin: &str,
    keys: Vec<&str>,
) -> Result<HashMap<String, (i64, usize)>, InboxError> {
    let rows = tx
        .query(
            &tx.prepare_cached(
                "SELECT key, version, octet_length(value)::bigint FROM plugin_state
             WHERE plugin = $1 AND key = ANY($2)",
            )
            .await?,
            &[&plugin, &keys],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get::<_, i64>(2) as usize)))
        .collect())
}

/// The first key `f` read whose committed version is no longer the one it saw (0 = absent).
pub(super) async fn first_changed(
    tx: &Transaction<'_>,
    f: &Finish,
) -> Result<Option<Changed>, InboxError> {
    let keys = f.state.versions.keys().map(String::as_str).collect();
    let stored = stored(tx, f.plugin.as_str(), keys).await?;
    Ok(f.state.versions.iter().find_map(|(key, seen)| {
        let now = stored.get(key).map_or(0, |(version, _)| *version);
        (now != *seen).then(|| Changed {
            key: key.clone(),
            seen: *seen,
            now,
        })
    }))
}

/// Applies an attempt's state writes (its keys locked by [`lock_keys`]) and returns how they
/// change the plugin's `(keys, bytes)`, for [`add_usage`] to count.
pub(super) async fn apply_state(
    tx: &Transaction<'_>,
    f: &Finish,
) -> Result<(i64, i64), InboxError> {
    let plugin = f.plugin.as_str();
    let keys = f.state.writes.keys().map(String::as_str).collect();
    let stored = stored(tx, plugin, keys).await?;
    let mut delta = (0i64, 0i64);
    for (key, value) in &f.state.writes {
        let before = stored.get(key).map(|(_, len)| *len);
        let (keys, bytes) = write_delta(key, before, value.as_deref());
        delta = (delta.0 + keys, delta.1 + bytes);
    }
    let (mut set_keys, mut set_values, mut deleted) = (Vec::new(), Vec::new(), Vec::new());
    for (key, value) in &f.state.writes {
        match value {
            Some(value) => {
                set_keys.push(key.as_str());
                set_values.push(value.as_slice());
            }
            None => deleted.push(key.as_str()),
        }
    }
    if !set_keys.is_empty() {
        tx.execute(
            &tx.prepare_cached(
                "INSERT INTO plugin_state (plugin, key, value, version)
             SELECT $1, key, value, nextval('plugin_state_versions')
             FROM unnest($2::text[], $3::bytea[]) AS w (key, value)
             ON CONFLICT (plugin, key)
                 DO UPDATE SET value = excluded.value, version = excluded.version",
            )
            .await?,
            &[&plugin, &set_keys, &set_values],
        )
        .await?;
    }
    if !deleted.is_empty() {
        tx.execute(
            &tx.prepare_cached("DELETE FROM plugin_state WHERE plugin = $1 AND key = ANY($2)")
                .await?,
            &[&plugin, &deleted],
        )
        .await?;
    }
    Ok(delta)
}

/// Adds `delta` to the plugin's usage (the commit's last statement: the row stays locked only
/// until the commit), unless that takes it over its total: `Err(message)`, and the caller
/// rolls the whole transaction back.
pub(super) async fn add_usage(
    tx: &Transaction<'_>,
    f: &Finish,
    (delta_keys, delta_bytes): (i64, i64),
) -> Result<Result<(), String>, InboxError> {
    let plugin = f.plugin.as_str();
    let row = tx
        .query_one(
            &tx.prepare_cached(
                "INSERT INTO plugin_state_usage AS u (plugin, keys, bytes, clock)
                 VALUES ($1, $2, $3, 0)
                 ON CONFLICT (plugin)
                     DO UPDATE SET keys = u.keys + $2, bytes = u.bytes + $3
                 RETURNING keys, bytes",
            )
            .await?,
            &[&plugin, &delta_keys, &delta_bytes],
        )
        .await?;
    let (keys, bytes): (i64, i64) = (row.get(0), row.get(1));
    let before = StateUsage {
        keys: (keys - delta_keys).max(0) as u64,
        bytes: (bytes - delta_bytes).max(0) as u64,
    };
    Ok(usage_after(plugin, before, (delta_keys, delta_bytes), &f.state.limits).map(|_| ()))
}
