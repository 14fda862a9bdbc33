//! The cluster's coordination rows in SQL: node heartbeats, plugin files by sha256, releases.
//!
//! Invariants:
//! - A publish stores the bytes (if new) and moves the release in one transaction, and the
//!   release row only changes when it names another sha256 (a re-publish of the live version
//!   keeps its version).
//! - A file is kept while a release names it, live or in its history (what a rollback may go
//!   back to): the transaction that moves a release deletes the files no release names any
//!   more, so the table holds at most `1 + PREVIOUS_KEPT` files per plugin, however many
//!   versions were published (all of them under a role that may not delete). A file a publish
//!   is inserting is invisible to that delete until committed, and named then; one it found
//!   stored is locked by its release's foreign key check, and a delete that reaches it after
//!   that fails its own check and is undone alone. A publish that loses its file to a delete
//!   between the two fails and is tried again (with its bytes, the file stored again).

use std::{collections::BTreeMap, time::Instant};

use bytes::Bytes;
use tokio_postgres::{Row, error::SqlState};

use super::{
    PostgresStore,
    statements::{Run, Tx},
};
use crate::{
    clock::Reading,
    inbox::{
        InboxError,
        cluster::{ClusterStore, NodeBeat, PREVIOUS_KEPT, Release},
    },
};

/// Deletes, in `tx` (the one that moved a release, as its last statement), the plugin files no
/// release names any more, live or in its history; answers how many. Housekeeping never fails
/// the move: if the delete does (a role that may not delete them, as the grants hookd asked for
/// before it did; a file another node's publish names by the time the delete's check runs; a
/// deadlock with another node's delete; a lock held past a second), it is undone alone and the
/// files wait for the next move, with a warning.
async fn drop_unnamed_files(tx: &Tx<'_>) -> Result<u64, InboxError> {
    tx.batch_execute("SAVEPOINT unnamed_files; SET LOCAL lock_timeout = '1s'")
        .await?;
    let deleted = tx
        .execute(
            "DELETE FROM plugin_files f
             WHERE NOT EXISTS (SELECT 1 FROM plugin_releases r
                               WHERE r.sha256 = f.sha256 OR f.sha256 = ANY (r.previous))",
            &[],
        )
        .await;
    let e = match deleted {
        Ok(deleted) => {
            tx.batch_execute("RELEASE SAVEPOINT unnamed_files").await?;
            return Ok(deleted);
        }
        // The connection itself failed: the move did too.
        Err(e) if e.code().is_none() => return Err(e.into()),
        Err(e) => e,
    };
    tx.batch_execute("ROLLBACK TO SAVEPOINT unnamed_files")
        .await?;
    if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "cluster: plugin files no release names any more are kept: this node's database \
                 role may not delete them (GRANT DELETE ON plugin_files)"
            );
        });
    } else {
        tracing::warn!(error = %e, "cluster: plugin files no release names any more are kept until the next release moves");
    }
    Ok(0)
}

fn release(row: &Row) -> Release {
    Release {
        stem: row.get(0),
        sha256: row.get(1),
        version: row.get(2),
        node: row.get(3),
        previous: row.get(4),
    }
}

#[async_trait::async_trait]
impl ClusterStore for PostgresStore {
    async fn heartbeat(&self, beat: NodeBeat, forget_before_ms: i64) -> Result<(), InboxError> {
        let live = serde_json::to_string(&beat.live).expect("a map of strings serialises");
        let mut client = self.client().await?;
        // One transaction (at `READ COMMITTED`, whatever the database's default): another
        // node forgetting the same silent row at once must not fail this one.
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO nodes (id, listen, admin_listen, started_at, heartbeat_at, in_flight,
                                    live)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (id) DO UPDATE SET listen = EXCLUDED.listen,
                     admin_listen = EXCLUDED.admin_listen, heartbeat_at = EXCLUDED.heartbeat_at,
                     in_flight = EXCLUDED.in_flight, live = EXCLUDED.live",
            &[
                &beat.id,
                &beat.listen,
                &beat.admin_listen,
                &beat.started_at_ms,
                &beat.at_ms,
                &(beat.in_flight as i64),
                &live,
            ],
        )
        .await?;
        tx.execute(
            "DELETE FROM nodes WHERE heartbeat_at < $1",
            &[&forget_before_ms],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn leave(&self, id: &str) -> Result<(), InboxError> {
        self.client()
            .await?
            .execute("DELETE FROM nodes WHERE id = $1", &[&id])
            .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeBeat>, InboxError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT id, listen, admin_listen, started_at, heartbeat_at, in_flight, live
                 FROM nodes ORDER BY started_at, id",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| NodeBeat {
                id: row.get(0),
                listen: row.get(1),
                admin_listen: row.get(2),
                started_at_ms: row.get(3),
                at_ms: row.get(4),
                in_flight: row.get::<_, i64>(5).max(0) as u64,
                // Written by `heartbeat` only; an unreadable one shows as no plugins.
                live: serde_json::from_str::<BTreeMap<String, String>>(row.get(6))
                    .unwrap_or_default(),
            })
            .collect())
    }

    async fn database_clock(&self, tries: usize) -> Result<Reading, InboxError> {
        // `clock_timestamp()`, not `now()`: the time of the reading, not of a transaction's
        // start. A round trip may also prepare the statement (or describe it, behind a pooler):
        // the shortest is the reading.
        const SQL: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";
        let client = self.client().await?;
        let mut best: Option<Reading> = None;
        for _ in 0..tries.max(1) {
            let sent = Instant::now();
            let time_ms: i64 = client.query_one(SQL, &[]).await?.get(0);
            let round_trip = sent.elapsed();
            if best.is_none_or(|best| round_trip < best.round_trip) {
                best = Some(Reading {
                    time_ms,
                    at: sent + round_trip / 2,
                    round_trip,
                });
            }
        }
        Ok(best.expect("at least one reading"))
    }

    async fn publish(
        &self,
        stem: &str,
        sha256: &str,
        bytes: Option<Bytes>,
        node: &str,
    ) -> Result<Release, InboxError> {
        let mut client = self.client().await?;
        let started = std::time::Instant::now();
        let tx = client.transaction().await?;
        let stored = match &bytes {
            Some(bytes) => {
                tx.execute(
                    "INSERT INTO plugin_files (sha256, bytes) VALUES ($1, $2)
                     ON CONFLICT (sha256) DO NOTHING",
                    &[&sha256, &&bytes[..]],
                )
                .await?;
                true
            }
            None => tx
                .query_opt("SELECT 1 FROM plugin_files WHERE sha256 = $1", &[&sha256])
                .await?
                .is_some(),
        };
        if !stored {
            return Err(InboxError::UnknownPluginVersion {
                stem: stem.to_owned(),
                sha256: sha256.to_owned(),
            });
        }
        // The history: the newest earlier version coming back is a step back (it leaves the
        // history, and the version it replaces is dropped); any other pushes the one replaced.
        let kept = PREVIOUS_KEPT as i32;
        let moved = tx
            .query_opt(
                "INSERT INTO plugin_releases (stem, sha256, version, node)
                 VALUES ($1, $2, nextval('plugin_release_versions'), $3)
                 ON CONFLICT (stem) DO UPDATE SET sha256 = EXCLUDED.sha256,
                     version = EXCLUDED.version, node = EXCLUDED.node,
                     previous = CASE
                         WHEN plugin_releases.previous[1] = EXCLUDED.sha256
                         THEN plugin_releases.previous[2:]
                         ELSE (array_prepend(plugin_releases.sha256,
                               array_remove(plugin_releases.previous, EXCLUDED.sha256)))[1:$4]
                     END
                 WHERE plugin_releases.sha256 <> EXCLUDED.sha256
                 RETURNING stem, sha256, version, node, previous",
                &[&stem, &sha256, &node, &kept],
            )
            .await?;
        let current = match moved {
            Some(row) => {
                drop_unnamed_files(&tx).await?;
                release(&row)
            }
            None => release(
                &tx.query_one(
                    "SELECT stem, sha256, version, node, previous FROM plugin_releases WHERE stem = $1",
                    &[&stem],
                )
                .await?,
            ),
        };
        tx.commit().await?;
        self.committed(started);
        Ok(current)
    }

    async fn roll_back(
        &self,
        stem: &str,
        from: &str,
        to: &str,
        node: &str,
    ) -> Result<Option<Release>, InboxError> {
        let started = std::time::Instant::now();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // One statement: the check of what the rollback read and the step back (the same as a
        // publish of the history's newest version) cannot be split by another node's publish.
        let row = tx
            .query_opt(
                "UPDATE plugin_releases SET sha256 = $3,
                     version = nextval('plugin_release_versions'), node = $4,
                     previous = previous[2:]
                 WHERE stem = $1 AND sha256 = $2 AND previous[1] = $3
                 RETURNING stem, sha256, version, node, previous",
                &[&stem, &from, &to, &node],
            )
            .await?;
        if row.is_some() {
            // The version stepped back from has left the history.
            drop_unnamed_files(&tx).await?;
        }
        tx.commit().await?;
        self.committed(started);
        Ok(row.as_ref().map(release))
    }

    async fn releases(&self) -> Result<Vec<Release>, InboxError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT stem, sha256, version, node, previous FROM plugin_releases ORDER BY stem",
                &[],
            )
            .await?;
        Ok(rows.iter().map(release).collect())
    }

    async fn plugin_bytes(&self, sha256: &str) -> Result<Option<Bytes>, InboxError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT bytes FROM plugin_files WHERE sha256 = $1",
                &[&sha256],
            )
            .await?;
        Ok(row.map(|row| Bytes::from(row.get::<_, Vec<u8>>(0))))
    }
}
