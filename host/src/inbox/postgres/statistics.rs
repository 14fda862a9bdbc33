//! Planner statistics that keep up with a growing inbox: the tables are analyzed as soon as they
//! have doubled since the planner last looked, instead of when autovacuum next visits (up to a
//! minute later, `autovacuum_naptime`).
//!
//! Why: every statement is prepared once per connection and PostgreSQL caches a generic plan
//! for it. A plan made while a table was nearly empty (a new database, the first seconds of a
//! burst) scans the whole table where it should probe the primary key, and keeps doing so as
//! the table grows, until an `ANALYZE` invalidates it. Measured on a fresh database: 2 152
//! sequential scans reading 35 million rows for 20 000 handled events, and a third of the
//! handled rate, in the minute before autovacuum's first visit.
//!
//! Invariants:
//! - Only the hookd tables that grow with traffic are looked at, once a second per store (one
//!   catalog read); a table is analyzed when it holds more than [`AT_LEAST`] rows and more
//!   than twice what its statistics say, so a table is analyzed about log2(rows) times while
//!   it grows and never at a steady size (autovacuum keeps those statistics).
//! - These passes sample [`SAMPLE_TARGET`]'s 3 000 rows, not the server's default 30 000: they
//!   are there to keep generic plans probing keys as a table grows, which a row count and a
//!   coarse histogram do, and reading a tenth of the rows makes each one about a tenth as dear
//!   (on an `events` table of 80 000 rows, 36 ms instead of 340). Autovacuum's own analyses,
//!   at the server's setting, bring the finer statistics once the table settles.
//! - Nodes never queue behind each other's `ANALYZE` (`SKIP_LOCKED`), and a failure is only
//!   logged: statistics are an optimisation, never a condition for serving.

use std::{sync::Arc, time::Duration};

use super::{
    Connections,
    statements::{Conn, Run},
};
use crate::inbox::InboxError;

/// How often the tables' sizes are compared with their statistics.
const EVERY: Duration = Duration::from_secs(1);

/// A table smaller than this is left to autovacuum: any plan is fast on it.
const AT_LEAST: f64 = 1_000.0;

/// The statistics target of the store's own analyses (PostgreSQL samples 300 rows per unit):
/// set for their transaction only, so nothing else the connection runs sees it.
const SAMPLE_TARGET: u32 = 10;

/// The tables that grow with traffic (a claim, a finish, an accept and the admin views read
/// them by key).
const TABLES: [&str; 3] = ["deliveries", "events", "attempts"];

/// Analyzes each table of [`TABLES`] that outgrew its statistics; returns those it analyzed.
pub(super) async fn refresh(client: &Conn) -> Result<Vec<String>, InboxError> {
    // `n_live_tup` is the statistics system's running count (flushed by each backend about once
    // a second); `reltuples` is what the planner believes (-1 before the first analyze).
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_class c
                     JOIN pg_stat_user_tables s ON s.relid = c.oid
                     WHERE c.oid = ANY(ARRAY(SELECT to_regclass(t) FROM unnest($1::text[]) t))
                       AND s.n_live_tup::float8 > $2::float8
                       AND s.n_live_tup::float8 > 2 * GREATEST(c.reltuples, 0)",
            &[&TABLES.as_slice(), &AT_LEAST],
        )
        .await?;
    let grown: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    if !grown.is_empty() {
        // Names from the catalog, and only those of TABLES: quoting them is enough. One query
        // string is one transaction, so the target is set for this `ANALYZE` alone.
        let tables: Vec<String> = grown.iter().map(|t| format!("\"{t}\"")).collect();
        client
            .batch_execute(&format!(
                "SET LOCAL default_statistics_target = {SAMPLE_TARGET};
                 ANALYZE (SKIP_LOCKED) {}",
                tables.join(", ")
            ))
            .await?;
    }
    Ok(grown)
}

/// Runs [`refresh`] every [`EVERY`] until aborted (with the store).
pub(super) fn start(connections: Arc<Connections>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(EVERY);
        let mut warned = false;
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            // An unreachable database is reported by the operations that need it.
            let Ok(client) = connections.get().await else {
                continue;
            };
            match refresh(&client).await {
                Ok(analyzed) if !analyzed.is_empty() => {
                    tracing::debug!(tables = ?analyzed, "analyzed tables that outgrew their statistics")
                }
                Ok(_) => {}
                // Once: the next failures are most likely the same one.
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e, "refreshing the planner's statistics failed")
                }
                Err(e) => tracing::debug!(error = %e, "refreshing the planner's statistics failed"),
            }
        }
    })
}
