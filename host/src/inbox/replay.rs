//! Replay: finished deliveries (dead, stale or done) become due again with a fresh budget.
//!
//! Invariant: a replay never touches an open delivery (the update re-checks the state), and it
//! resets the attempt budget, not the attempt count: `attempts` keeps counting every attempt
//! (it is the lease token), `budget_base` moves up to it.

use rusqlite::{Connection, params};

use super::{Inbox, InboxError, sql::open_states};
use crate::model::DeliveryState;

/// Filters for `POST /admin/replay`.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    pub source: Option<String>,
    pub handler: Option<String>,
    /// Which deliveries to replay; `dead` when not given.
    pub state: Option<DeliveryState>,
    pub event_ids: Option<Vec<String>>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub limit: usize,
    pub dry_run: bool,
}

impl Inbox {
    /// Sets deliveries matched by `filter` due again with a fresh attempt budget.
    /// Returns `(matched, replayed)`; a dry run replays nothing.
    pub async fn replay(&self, filter: ReplayFilter) -> Result<(usize, usize), InboxError> {
        let now = self.now_ms();
        let (matched, replayed) = self
            .write(move |conn| replay_matching(conn, &filter, now))
            .await?;
        if replayed > 0 {
            self.add_backlog(replayed as i64);
            self.wake_workers();
        }
        Ok((matched, replayed))
    }
}

/// Sets the deliveries `filter` matches due at `now_ms` with a fresh budget (none on a dry
/// run); returns `(matched, replayed)`.
fn replay_matching(
    conn: &Connection,
    filter: &ReplayFilter,
    now_ms: i64,
) -> Result<(usize, usize), InboxError> {
    let ids = matching_deliveries(conn, filter)?;
    if filter.dry_run {
        return Ok((ids.len(), 0));
    }
    let mut update = conn.prepare_cached(concat!(
        "UPDATE deliveries SET state = 'pending', budget_base = attempts,
             next_attempt_at = ?2, lease_until = NULL, updated_at = ?2
         WHERE id = ?1 AND state NOT IN ",
        open_states!()
    ))?;
    let mut replayed = 0;
    for id in &ids {
        replayed += update.execute(params![id, now_ms])?;
    }
    Ok((ids.len(), replayed))
}

/// The deliveries `filter` selects, oldest first, at most `filter.limit`; an open state is
/// refused (those are still being worked on).
fn matching_deliveries(conn: &Connection, filter: &ReplayFilter) -> Result<Vec<i64>, InboxError> {
    let state = filter.state.unwrap_or(DeliveryState::Dead);
    if state.is_open() {
        return Err(InboxError::InvalidFilter(format!(
            "state {state} is still being worked on; replay takes dead, stale or done deliveries"
        )));
    }
    let ids_json = filter
        .event_ids
        .as_ref()
        .map(|ids| serde_json::to_string(ids).expect("strings serialize"));
    let ids = conn
        .prepare_cached(
            "SELECT d.id FROM deliveries d JOIN events e ON e.id = d.event
             WHERE d.state = ?1
               AND (?2 IS NULL OR d.source = ?2)
               AND (?3 IS NULL OR d.handler = ?3)
               AND (?4 IS NULL OR e.event_id IN (SELECT value FROM json_each(?4)))
               AND (?5 IS NULL OR e.received_at >= ?5)
               AND (?6 IS NULL OR e.received_at <= ?6)
             ORDER BY d.id LIMIT ?7",
        )?
        .query_map(
            params![
                state.as_str(),
                filter.source,
                filter.handler,
                ids_json,
                filter.since_ms,
                filter.until_ms,
                filter.limit as i64
            ],
            |r| r.get(0),
        )?
        .collect::<Result<_, _>>()?;
    Ok(ids)
}
