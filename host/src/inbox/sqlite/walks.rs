//! What a claim's last complete walk over a handler's keys found, so the claims after it read
//! what changed since instead of walking every key again.
//!
//! When every key of a handler waits on its head (each head running, or retrying later: a
//! downstream outage), a claim finds nothing in its window and walks every key with open
//! deliveries, a few seeks each (`lease.rs`). That walk runs on the writer, and the dispatcher
//! claims again after every accept and finish: with 10 000 such keys each claim took ~32 ms
//! of the writer, which every accept waited behind. A walk that found every head that may run
//! (fewer than it wanted), all of them leased, is remembered here per handler: `checked_at`,
//! the claim's clock, and `newest_id`, the highest delivery id then. Until something clears it,
//! a head that may run at any `now` from `checked_at` on either arrived since
//! (`id > newest_id`) or came due since (`checked_at < next_attempt_at <= now`), and the next
//! claim at such a `now` reads just those
//! ([`super::lease::KEYED_SINCE`]), advancing the record when that read too was complete.
//!
//! Invariants:
//! - The record lives in a `TEMP` table of the writer's connection, the only connection that
//!   writes (`mod.rs`), and its triggers see every write to `deliveries`. Being in a table, it
//!   is rolled back with the transaction or savepoint that wrote it: a claim redone after its
//!   batch failed, or whose commit failed, finds the record as it was before.
//! - A trigger clears a handler's record at every write that can let one of its keys' heads run
//!   without that head having arrived or come due since the record: a waiting delivery leaving
//!   the open states (the next of its key may head it now); a run ending in a final state, or
//!   back to waiting behind an earlier delivery of its key; a delivery come to wait (a replay,
//!   a retry moved earlier, a run given back) already due at `checked_at`; a change of a
//!   delivery's key; an open delivery deleted, or any delivery at or past `newest_id` (its id
//!   could be given again). Leasing a head, or a head's run ending in a retry due later, keeps
//!   it.
//! - A record is used for at most [`WALK_AT_LEAST_EVERY_MS`] after its walk, and never by a
//!   claim whose clock is behind it (a clock stepped back): that claim walks. Whatever this
//!   file has missed costs at most that delay, never a delivery.

use rusqlite::{Connection, OptionalExtension, params};

use super::sql::{open_states, waiting_states};
use crate::inbox::InboxError;

/// How long after a complete walk its record is used before a claim walks the keys again.
pub(super) const WALK_AT_LEAST_EVERY_MS: i64 = 1_000;

/// The table and its triggers, on the writer's connection (`TEMP`: in that connection only,
/// never in the database file).
const INSTALL: &str = concat!(
    "CREATE TEMP TABLE key_walks (
         handler    TEXT    PRIMARY KEY,
         checked_at INTEGER NOT NULL,
         newest_id  INTEGER NOT NULL,
         walked_at  INTEGER NOT NULL
     ) WITHOUT ROWID;
     CREATE TEMP TRIGGER key_walks_on_update
     AFTER UPDATE OF state, next_attempt_at, handler, source, ordering_key, sequence
     ON deliveries
     WHEN (old.ordering_key IS NOT NULL OR new.ordering_key IS NOT NULL)
       AND EXISTS (SELECT 1 FROM key_walks WHERE handler IN (old.handler, new.handler))
     BEGIN
       DELETE FROM key_walks WHERE handler IN (old.handler, new.handler) AND (
            old.handler IS NOT new.handler OR old.source IS NOT new.source
            OR old.ordering_key IS NOT new.ordering_key OR old.sequence IS NOT new.sequence
            OR (old.state IN ",
    waiting_states!(),
    " AND new.state NOT IN ",
    open_states!(),
    ")
            OR (new.state IN ",
    waiting_states!(),
    " AND new.next_attempt_at <= checked_at
                AND NOT (old.state IN ",
    waiting_states!(),
    " AND old.next_attempt_at <= checked_at))
            OR (old.state = 'running' AND new.state IS NOT 'running'
                AND (new.state NOT IN ",
    waiting_states!(),
    " OR EXISTS (SELECT 1 FROM deliveries p
                               WHERE p.handler = new.handler AND p.source = new.source
                                 AND p.ordering_key = new.ordering_key
                                 AND p.state IN ",
    open_states!(),
    " AND p.state IN ",
    waiting_states!(),
    " AND (COALESCE(p.sequence, 0) < COALESCE(new.sequence, 0)
                                      OR (COALESCE(p.sequence, 0) = COALESCE(new.sequence, 0)
                                          AND p.id < new.id)))))
       );
     END;
     CREATE TEMP TRIGGER key_walks_on_delete AFTER DELETE ON deliveries
     WHEN EXISTS (SELECT 1 FROM key_walks)
     BEGIN
       DELETE FROM key_walks WHERE newest_id <= old.id
           OR (handler = old.handler AND old.ordering_key IS NOT NULL AND old.state IN ",
    open_states!(),
    ");
     END;"
);

/// Creates the record's table and triggers on `conn`, the writer's connection, once it is
/// migrated.
pub(super) fn install(conn: &Connection) -> Result<(), InboxError> {
    conn.execute_batch(INSTALL)?;
    Ok(())
}

/// A complete walk's record: no key of the handler had a head that may run at `checked_at`
/// but those the claim leased.
#[derive(Clone, Copy, Debug)]
pub(super) struct Since {
    pub(super) checked_at: i64,
    pub(super) newest_id: i64,
    walked_at: i64,
}

/// `handler`'s record, if there is one still to be used at `now_ms`: not from the future (a
/// clock stepped back would leave a delivery that arrived due between `now_ms` and the
/// record's clock outside both of [`super::lease::KEYED_SINCE`]'s ranges once the record moved
/// on), nor older than [`WALK_AT_LEAST_EVERY_MS`].
pub(super) fn remembered(
    conn: &Connection,
    handler: &str,
    now_ms: i64,
) -> Result<Option<Since>, InboxError> {
    Ok(conn
        .prepare_cached(
            "SELECT checked_at, newest_id, walked_at FROM key_walks
             WHERE handler = ?1 AND checked_at <= ?2 AND walked_at <= ?2
               AND ?2 < walked_at + ?3",
        )?
        .query_row(params![handler, now_ms, WALK_AT_LEAST_EVERY_MS], |r| {
            Ok(Since {
                checked_at: r.get(0)?,
                newest_id: r.get(1)?,
                walked_at: r.get(2)?,
            })
        })
        .optional()?)
}

/// Records that a claim at `now_ms` found and leased every head of `handler`'s keys that may
/// run: by a walk (`since` is `None`), or by reading what changed since the record `since`.
pub(super) fn remember(
    conn: &Connection,
    handler: &str,
    now_ms: i64,
    since: Option<Since>,
) -> Result<(), InboxError> {
    // A record is used only at or after its clock, so `now_ms` never moves it back.
    let walked_at = since.map_or(now_ms, |since| since.walked_at);
    conn.prepare_cached(
        "INSERT INTO key_walks (handler, checked_at, newest_id, walked_at)
         VALUES (?1, ?2, (SELECT COALESCE(MAX(id), 0) FROM deliveries), ?3)
         ON CONFLICT (handler) DO UPDATE SET checked_at = excluded.checked_at,
             newest_id = excluded.newest_id, walked_at = excluded.walked_at",
    )?
    .execute(params![handler, now_ms, walked_at])?;
    Ok(())
}

/// Drops `handler`'s record: the next claim that needs more than its window walks the keys.
pub(super) fn forget(conn: &Connection, handler: &str) -> Result<(), InboxError> {
    conn.prepare_cached("DELETE FROM key_walks WHERE handler = ?1")?
        .execute([handler])?;
    Ok(())
}
