//! The inbox's operations: accept, quarantine, claim, finish, reclaim, replay, state, and the
//! read models behind the admin API.
//!
//! Invariant: every state transition of a delivery happens here, in one statement or one
//! savepoint, so a crash between two steps of one transition is impossible.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::{Inbox, InboxError};
use crate::{
    dispatch::fair::{self, Fairness},
    ids::{EventId, PluginName, SourceName},
    model::{
        AttemptOutcome, DeliveryState, Disposition, Envelope, Header, StateChanges, StateUsage,
    },
    verify::Verified,
};

/// A request the host has verified: the only thing the inbox stores as an event or quarantines.
/// Built from a [`Verified`] request, or loaded back from quarantine (which only holds verified ones).
#[derive(Debug, Clone)]
pub struct RawRequest {
    headers: Vec<Header>,
    body: Bytes,
    received_at_ms: i64,
}

impl RawRequest {
    pub fn from_verified(verified: Verified, received_at_ms: i64) -> Self {
        let (header_map, body) = verified.into_parts();
        let headers = header_map
            .iter()
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        Self {
            headers,
            body,
            received_at_ms,
        }
    }

    pub fn headers(&self) -> &[Header] {
        &self.headers
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn received_at_ms(&self) -> i64 {
        self.received_at_ms
    }
}

/// An accept's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    New,
    Duplicate,
}

/// A delivery leased to a worker, with everything the handler needs.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub delivery_id: i64,
    /// This attempt's number, counting every attempt of the delivery (the lease token too).
    pub attempt: u32,
    /// Attempts used since the last replay, this one included.
    pub budget_used: u32,
    pub leased_at_ms: i64,
    pub source: SourceName,
    pub handler: PluginName,
    pub event_id: EventId,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<u64>,
    pub received_at_ms: i64,
    pub headers: Vec<Header>,
    pub body: Bytes,
}

/// What the dispatcher asks for in one claim.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub now_ms: i64,
    /// Free workers: at most this many deliveries are leased.
    pub limit: usize,
    /// Handler → how many more attempts of it may run now; only handlers listed are claimed.
    pub capacity: HashMap<String, usize>,
    /// Handler → lease length; handlers absent get [`DEFAULT_LEASE_MS`].
    pub lease_ms: HashMap<String, i64>,
    /// How the free workers are shared among the handlers ([`fair::allot`]); the default (no
    /// standing, no headroom) takes the handlers round-robin, oldest first.
    pub fairness: Fairness,
}

pub const DEFAULT_LEASE_MS: i64 = 60_000;

/// One finished attempt, to be recorded with its delivery's next state in one transaction.
#[derive(Debug, Clone)]
pub struct Finish {
    pub delivery_id: i64,
    pub attempt: u32,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub outcome: AttemptOutcome,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    pub plugin_sha256: Option<String>,
    pub disposition: Disposition,
    /// Namespace of the state writes: the plugin instance.
    pub plugin: PluginName,
    pub state: StateChanges,
}

/// How recording a finished attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    Recorded,
    /// State read by the attempt changed meanwhile: nothing applied, the delivery is due again.
    Conflict,
    /// The lease was taken away (expired and reclaimed): the result is discarded.
    LeaseLost,
    /// Committing the state writes would take the plugin over its total (`limits.max_keys` /
    /// `max_bytes`): nothing was applied or recorded, the lease is still held; the message names
    /// the limit. The caller records the attempt as failed.
    OverQuota(String),
}

/// Filters for `GET /admin/events`.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub source: Option<String>,
    pub state: Option<DeliveryState>,
    pub handler: Option<String>,
    pub limit: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventSummary {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub received_at: i64,
    /// Handler → delivery state.
    pub states: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventDetail {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub ordering_key: Option<String>,
    pub sequence: Option<i64>,
    pub received_at: i64,
    pub deliveries: Vec<DeliveryDetail>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeliveryDetail {
    pub handler: String,
    pub state: String,
    pub attempts: i64,
    pub output: Option<String>,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub history: Vec<AttemptRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AttemptRecord {
    pub attempt: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub outcome: String,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    pub plugin_sha256: Option<String>,
}

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

/// A quarantined request waiting to be parsed again.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub id: i64,
    pub source: SourceName,
    pub request: RawRequest,
}

fn headers_json(headers: &[Header]) -> String {
    serde_json::to_string(headers).expect("string pairs serialize")
}

fn headers_from_json(text: &str) -> Vec<Header> {
    serde_json::from_str(text).unwrap_or_default()
}

pub(super) fn count_open(conn: &Connection) -> Result<i64, InboxError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM deliveries WHERE state IN ('pending', 'running', 'retrying')",
        [],
        |row| row.get(0),
    )?)
}

pub(super) fn count_quarantined(conn: &Connection) -> Result<i64, InboxError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM quarantine WHERE resolved_at IS NULL",
        [],
        |row| row.get(0),
    )?)
}

fn insert_attempt(conn: &Connection, delivery: i64, f: &Finish) -> Result<(), InboxError> {
    conn.prepare_cached(
        "INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome, error_kind,
                               error, plugin_sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        delivery,
        f.attempt,
        f.started_at_ms,
        f.finished_at_ms,
        f.outcome.as_str(),
        f.error_kind,
        f.error,
        f.plugin_sha256
    ])?;
    Ok(())
}

impl Inbox {
    /// Stores a new event and one pending delivery per handler, or reports a duplicate.
    /// `from_quarantine` marks that quarantined request resolved in the same transaction.
    pub async fn accept(
        &self,
        source: SourceName,
        envelope: Envelope,
        request: RawRequest,
        handlers: Vec<PluginName>,
        from_quarantine: Option<i64>,
    ) -> Result<Accepted, InboxError> {
        let handler_count = handlers.len() as i64;
        let accepted = self
            .write(move |conn| {
                let inserted = conn
                    .prepare_cached(
                        "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                             received_at, headers, body)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                         ON CONFLICT (source, event_id) DO NOTHING",
                    )?
                    .execute(params![
                        source.as_str(),
                        envelope.event_id.as_str(),
                        envelope.event_type,
                        envelope.ordering_key,
                        envelope.sequence.map(|s| s as i64),
                        request.received_at_ms,
                        headers_json(&request.headers),
                        &request.body[..],
                    ])?;
                let accepted = if inserted == 1 {
                    let event = conn.last_insert_rowid();
                    let mut insert = conn.prepare_cached(
                        "INSERT INTO deliveries (event, source, handler, ordering_key, sequence,
                                                 state, next_attempt_at, updated_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
                    )?;
                    for handler in &handlers {
                        insert.execute(params![
                            event,
                            source.as_str(),
                            handler.as_str(),
                            envelope.ordering_key,
                            envelope.sequence.map(|s| s as i64),
                            request.received_at_ms,
                        ])?;
                    }
                    Accepted::New
                } else {
                    Accepted::Duplicate
                };
                if let Some(id) = from_quarantine {
                    conn.prepare_cached(
                        "UPDATE quarantine SET resolved_at = ?2, resolution = ?3 WHERE id = ?1",
                    )?
                    .execute(params![
                        id,
                        request.received_at_ms,
                        format!("accepted as {}", envelope.event_id)
                    ])?;
                }
                Ok(accepted)
            })
            .await?;
        if accepted == Accepted::New && handler_count > 0 {
            self.add_backlog(handler_count);
            self.wake_workers();
        }
        Ok(accepted)
    }

    /// Keeps a verified request whose envelope could not be produced; returns its id, or `None`
    /// (nothing written) when `max_held` requests are already held: quarantine is bounded like
    /// the backlog. The slot is taken before the write, so concurrent requests cannot overshoot.
    pub async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
        max_held: u64,
    ) -> Result<Option<i64>, InboxError> {
        let max_held = i64::try_from(max_held).unwrap_or(i64::MAX);
        if !self.reserve_quarantine(max_held) {
            return Ok(None);
        }
        let written = self
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO quarantine (source, received_at, headers, body, reason)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![
                    source.as_str(),
                    request.received_at_ms,
                    headers_json(&request.headers),
                    &request.body[..],
                    reason
                ])?;
                Ok(conn.last_insert_rowid())
            })
            .await;
        if written.is_err() {
            self.release_quarantine();
        }
        written.map(Some)
    }

    /// Sets the held-quarantine count (the bound's measure) from the table: after a replay, whose
    /// accepts resolve quarantined requests in their own transactions.
    pub async fn recount_quarantine(&self) -> Result<i64, InboxError> {
        let held = self.quarantine_held_count().await?;
        self.set_quarantine_held(held);
        Ok(held)
    }

    /// Leases due deliveries. Per `(source, ordering_key, handler)` only the earliest open
    /// delivery (by sequence, then arrival) is eligible, so a key runs one at a time, in order.
    /// A candidate older than a delivery already done for its key is marked `stale` instead.
    pub async fn claim(&self, request: ClaimRequest) -> Result<Vec<Claimed>, InboxError> {
        let (claimed, stale) = self.write(move |conn| claim_due(conn, &request)).await?;
        self.add_backlog(-(stale as i64));
        Ok(claimed)
    }

    /// Records a finished attempt and moves its delivery on, applying the attempt's state
    /// writes only if nothing it read changed since (else: `Conflict`, and it is due again).
    pub async fn finish(&self, finish: Finish) -> Result<Finished, InboxError> {
        let closes = !matches!(finish.disposition, Disposition::RetryAt { .. });
        // Weighted by its state bytes, so one group commit carries a bounded amount of them.
        let weight = state_bytes(&finish.state);
        let result = self
            .write_weighted(weight, move |conn| finish_attempt(conn, &finish))
            .await?;
        match result {
            Finished::Recorded if closes => self.add_backlog(-1),
            Finished::Recorded | Finished::Conflict => self.wake_workers(),
            Finished::LeaseLost | Finished::OverQuota(_) => {}
        }
        Ok(result)
    }

    /// Takes back leases: all of them (`expired_before = i64::MAX`, at start-up, when no other
    /// process can hold one) or those that expired. `decide(handler, budget_used)` says where
    /// each goes; the abandoned attempt is recorded as `abandoned`.
    pub async fn reclaim(
        &self,
        now_ms: i64,
        expired_before: i64,
        decide: impl Fn(&str, u32) -> Disposition + Send + 'static,
    ) -> Result<usize, InboxError> {
        let (count, closed) = self
            .write(move |conn| {
                let rows: Vec<(i64, String, u32, u32, i64)> = conn
                    .prepare_cached(
                        "SELECT id, handler, attempts, attempts - budget_base, leased_at
                         FROM deliveries WHERE state = 'running' AND lease_until < ?1",
                    )?
                    .query_map([expired_before], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })?
                    .collect::<Result<_, _>>()?;
                let mut closed = 0;
                for (id, handler, attempt, used, leased_at) in &rows {
                    let disposition = decide(handler, *used);
                    if !matches!(disposition, Disposition::RetryAt { .. }) {
                        closed += 1;
                    }
                    let finish = Finish {
                        delivery_id: *id,
                        attempt: *attempt,
                        started_at_ms: *leased_at,
                        finished_at_ms: now_ms,
                        outcome: AttemptOutcome::Abandoned,
                        error_kind: Some("lease_expired".into()),
                        error: Some(
                            "the attempt's worker stopped before it finished (crash, kill or \
                             restart); whether the handler acted is unknown"
                                .into(),
                        ),
                        plugin_sha256: None,
                        disposition,
                        plugin: PluginName::new(handler.as_str()),
                        state: StateChanges::default(),
                    };
                    finish_attempt(conn, &finish)?;
                }
                Ok((rows.len(), closed))
            })
            .await?;
        self.add_backlog(-(closed as i64));
        if count > 0 {
            self.wake_workers();
        }
        Ok(count)
    }

    /// The earliest time after `after_ms` at which a pending or retrying delivery falls due.
    /// (Deliveries already due but not claimed are waiting on something else — their key's
    /// head, or their plugin — and are woken by that, not by the clock.)
    pub async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError> {
        self.read(move |conn| {
            Ok(conn.query_row(
                "SELECT MIN(next_attempt_at) FROM deliveries
                 WHERE state IN ('pending', 'retrying') AND next_attempt_at > ?1",
                [after_ms],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// Committed value and version of a state key (version 0 = never written). Blocking: for
    /// the runtime's synchronous `state.get` host call.
    pub fn state_get_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), InboxError> {
        self.read_blocking(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT value, version FROM plugin_state WHERE plugin = ?1 AND key = ?2",
                )?
                .query_row(params![plugin, key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?
                .unwrap_or((None, 0)))
        })
    }

    /// Bytes `key` holds (key + value; None = absent) and its version, without reading the value.
    pub fn state_stat_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<u64>, i64), InboxError> {
        self.read_blocking(|conn| {
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
        })
    }

    /// What `plugin` holds in committed state (live keys, key + value bytes).
    pub fn state_usage_blocking(&self, plugin: &str) -> Result<StateUsage, InboxError> {
        self.read_blocking(|conn| Ok(state_usage(conn, plugin)?.0))
    }

    /// Sets deliveries matched by `filter` due again with a fresh attempt budget.
    /// Returns `(matched, replayed)`; a dry run replays nothing.
    pub async fn replay(&self, filter: ReplayFilter) -> Result<(usize, usize), InboxError> {
        let (matched, replayed) = self
            .write(move |conn| {
                let ids = matching_deliveries(conn, &filter)?;
                if filter.dry_run {
                    return Ok((ids.len(), 0));
                }
                let now = crate::model::unix_ms(std::time::SystemTime::now());
                let mut update = conn.prepare_cached(
                    "UPDATE deliveries SET state = 'pending', budget_base = attempts,
                         next_attempt_at = ?2, lease_until = NULL, updated_at = ?2
                     WHERE id = ?1 AND state NOT IN ('pending', 'running', 'retrying')",
                )?;
                let mut replayed = 0;
                for id in &ids {
                    replayed += update.execute(params![id, now])?;
                }
                Ok((ids.len(), replayed))
            })
            .await?;
        if replayed > 0 {
            self.add_backlog(replayed as i64);
            self.wake_workers();
        }
        Ok((matched, replayed))
    }

    /// Ids of the quarantined requests not yet resolved that match the replay filter's source
    /// and time range (at most `filter.limit`, oldest first). Reads no body.
    pub async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError> {
        self.read(move |conn| {
            let ids = conn
                .prepare_cached(
                    "SELECT id FROM quarantine
                     WHERE resolved_at IS NULL
                       AND (?1 IS NULL OR source = ?1)
                       AND (?2 IS NULL OR received_at >= ?2)
                       AND (?3 IS NULL OR received_at <= ?3)
                     ORDER BY id LIMIT ?4",
                )?
                .query_map(
                    params![
                        filter.source,
                        filter.since_ms,
                        filter.until_ms,
                        filter.limit as i64
                    ],
                    |r| r.get(0),
                )?
                .collect::<Result<_, _>>()?;
            Ok(ids)
        })
        .await
    }

    /// How many quarantined requests [`Inbox::held_quarantine_ids`] would return. Reads no body.
    pub async fn held_quarantine_count(&self, filter: ReplayFilter) -> Result<usize, InboxError> {
        self.read(move |conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM quarantine
                     WHERE resolved_at IS NULL
                       AND (?1 IS NULL OR source = ?1)
                       AND (?2 IS NULL OR received_at >= ?2)
                       AND (?3 IS NULL OR received_at <= ?3)
                     LIMIT ?4)",
                )?
                .query_row(
                    params![
                        filter.source,
                        filter.since_ms,
                        filter.until_ms,
                        filter.limit as i64
                    ],
                    |r| r.get(0),
                )?;
            Ok(n as usize)
        })
        .await
    }

    /// One quarantined request with its body, if it is still unresolved.
    pub async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT source, received_at, headers, body FROM quarantine
                     WHERE id = ?1 AND resolved_at IS NULL",
                )?
                .query_row(params![id], |r| {
                    let headers: String = r.get(2)?;
                    let body: Vec<u8> = r.get(3)?;
                    Ok(Quarantined {
                        id,
                        source: SourceName::new(r.get::<_, String>(0)?),
                        request: RawRequest {
                            headers: headers_from_json(&headers),
                            body: Bytes::from(body),
                            received_at_ms: r.get(1)?,
                        },
                    })
                })
                .optional()?)
        })
        .await
    }

    /// Marks a quarantined request resolved without an event (its parser now says invalid/ignore).
    pub async fn resolve_quarantine(&self, id: i64, resolution: String) -> Result<(), InboxError> {
        let now = crate::model::unix_ms(std::time::SystemTime::now());
        self.write(move |conn| {
            conn.execute(
                "UPDATE quarantine SET resolved_at = ?2, resolution = ?3 WHERE id = ?1",
                params![id, now, resolution],
            )?;
            Ok(())
        })
        .await
    }

    /// Whether `(source, event_id)` is stored (lets an overloaded host still answer a
    /// provider's retry of a stored event with `duplicate`, not 503).
    pub async fn contains_event(
        &self,
        source: String,
        event_id: String,
    ) -> Result<bool, InboxError> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT 1 FROM events WHERE source = ?1 AND event_id = ?2")?
                .exists(params![source, event_id])?)
        })
        .await
    }

    /// Quarantined requests not yet resolved.
    pub async fn quarantine_held_count(&self) -> Result<i64, InboxError> {
        self.read(count_quarantined).await
    }

    /// Events, newest first, with each handler's delivery state.
    pub async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT e.id, e.source, e.event_id, e.event_type, e.received_at FROM events e
                 WHERE (?1 IS NULL OR e.source = ?1)
                   AND (?2 IS NULL AND ?3 IS NULL OR EXISTS (
                        SELECT 1 FROM deliveries d WHERE d.event = e.id
                          AND (?2 IS NULL OR d.state = ?2) AND (?3 IS NULL OR d.handler = ?3)))
                 ORDER BY e.id DESC LIMIT ?4",
            )?;
            let events: Vec<(i64, EventSummary)> = stmt
                .query_map(
                    params![
                        filter.source,
                        filter.state.map(|s| s.as_str()),
                        filter.handler,
                        filter.limit as i64
                    ],
                    |r| {
                        Ok((
                            r.get(0)?,
                            EventSummary {
                                source: r.get(1)?,
                                event_id: r.get(2)?,
                                event_type: r.get(3)?,
                                received_at: r.get(4)?,
                                states: BTreeMap::new(),
                            },
                        ))
                    },
                )?
                .collect::<Result<_, _>>()?;
            let mut states =
                conn.prepare_cached("SELECT handler, state FROM deliveries WHERE event = ?1")?;
            let mut out = Vec::with_capacity(events.len());
            for (id, mut summary) in events {
                summary.states = states
                    .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                out.push(summary);
            }
            Ok(out)
        })
        .await
    }

    /// One event with every delivery and its full attempt history.
    pub async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError> {
        self.read(move |conn| {
            let event = conn
                .query_row(
                    "SELECT id, source, event_id, event_type, ordering_key, sequence, received_at
                     FROM events WHERE source = ?1 AND event_id = ?2",
                    params![source, event_id],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            EventDetail {
                                source: r.get(1)?,
                                event_id: r.get(2)?,
                                event_type: r.get(3)?,
                                ordering_key: r.get(4)?,
                                sequence: r.get(5)?,
                                received_at: r.get(6)?,
                                deliveries: Vec::new(),
                            },
                        ))
                    },
                )
                .optional()?;
            let Some((id, mut detail)) = event else {
                return Ok(None);
            };
            let deliveries: Vec<(i64, DeliveryDetail)> = conn
                .prepare_cached(
                    "SELECT id, handler, state, attempts, output, last_error, next_attempt_at
                     FROM deliveries WHERE event = ?1 ORDER BY id",
                )?
                .query_map([id], |r| {
                    let state: String = r.get(2)?;
                    let waiting = matches!(state.as_str(), "pending" | "retrying");
                    Ok((
                        r.get(0)?,
                        DeliveryDetail {
                            handler: r.get(1)?,
                            attempts: r.get(3)?,
                            output: r.get(4)?,
                            last_error: r.get(5)?,
                            next_attempt_at: if waiting { Some(r.get(6)?) } else { None },
                            state,
                            history: Vec::new(),
                        },
                    ))
                })?
                .collect::<Result<_, _>>()?;
            let mut history = conn.prepare_cached(
                "SELECT attempt, started_at, finished_at, outcome, error_kind, error, plugin_sha256
                 FROM attempts WHERE delivery = ?1 ORDER BY id",
            )?;
            for (delivery_id, mut delivery) in deliveries {
                delivery.history = history
                    .query_map([delivery_id], |r| {
                        Ok(AttemptRecord {
                            attempt: r.get(0)?,
                            started_at: r.get(1)?,
                            finished_at: r.get(2)?,
                            outcome: r.get(3)?,
                            error_kind: r.get(4)?,
                            error: r.get(5)?,
                            plugin_sha256: r.get(6)?,
                        })
                    })?
                    .collect::<Result<_, _>>()?;
                detail.deliveries.push(delivery);
            }
            Ok(Some(detail))
        })
        .await
    }

    /// Deliveries per state, for `/metrics`.
    pub async fn state_counts(&self) -> Result<Vec<(String, i64)>, InboxError> {
        self.read(|conn| {
            Ok(conn
                .prepare("SELECT state, COUNT(*) FROM deliveries GROUP BY state")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?)
        })
        .await
    }
}

/// A due delivery that may be leased: the head of its key, if it has one.
struct Candidate {
    id: i64,
    due_ms: i64,
    key: Option<String>,
    sequence: Option<i64>,
    source: String,
}

fn claim_due(
    conn: &Connection,
    request: &ClaimRequest,
) -> Result<(Vec<Claimed>, usize), InboxError> {
    // Per handler, its oldest claimable deliveries, as many as it could be given; then the
    // free workers are shared out fairly among them, so no handler's backlog, however old,
    // hides another's due delivery.
    let mut handlers: Vec<(&String, usize)> = request
        .capacity
        .iter()
        .map(|(handler, room)| (handler, *room))
        .collect();
    handlers.sort();
    let mut stale = 0;
    let mut queues = Vec::with_capacity(handlers.len());
    for (handler, room) in &handlers {
        let want = (*room).min(request.limit);
        let queue = if want == 0 {
            Vec::new()
        } else {
            due_heads(conn, handler, request.now_ms, want, &mut stale)?
        };
        queues.push(queue);
    }
    let due: Vec<Vec<i64>> = queues
        .iter()
        .map(|queue| queue.iter().map(|c| c.due_ms).collect())
        .collect();
    let lanes: Vec<fair::Lane> = handlers
        .iter()
        .zip(&due)
        .map(|((handler, room), due)| request.fairness.lane(handler, *room, due))
        .collect();
    let picks = fair::allot(request.limit, &request.fairness, &lanes);

    let mut taken = vec![0usize; handlers.len()];
    let mut claimed = Vec::with_capacity(picks.len());
    for lane in picks {
        let handler = handlers[lane].0;
        let candidate = &queues[lane][taken[lane]];
        taken[lane] += 1;
        claimed.push(lease(conn, request, handler, candidate)?);
    }
    Ok((claimed, stale))
}

/// Up to `want` of `handler`'s due deliveries that may run now, oldest first: per
/// `(source, ordering_key, handler)` only the earliest open one (by sequence, then arrival). One
/// older than a delivery already done for its key is marked `stale` on the way (counted in
/// `stale`) and skipped.
fn due_heads(
    conn: &Connection,
    handler: &str,
    now_ms: i64,
    want: usize,
    stale: &mut usize,
) -> Result<Vec<Candidate>, InboxError> {
    let mut heads: Vec<Candidate> = Vec::new();
    let mut taken = HashSet::new();
    // Pages after (next_attempt_at, id). A stale head hands its key on to the next delivery,
    // which may sort before the page: a pass that marked one is followed by another from the
    // start (finitely many: each marks at least one more), skipping the heads already taken.
    let page = (want + 4) as i64;
    let mut after = (i64::MIN, i64::MIN);
    let mut marked = false;
    loop {
        let rows: Vec<Candidate> = conn
            .prepare_cached(
                "SELECT d.id, d.next_attempt_at, d.ordering_key, d.sequence, d.source
                 FROM deliveries d
                 WHERE d.handler = ?1 AND d.state IN ('pending', 'retrying')
                   AND d.next_attempt_at <= ?2
                   AND (d.next_attempt_at, d.id) > (?4, ?5)
                   AND (d.ordering_key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM deliveries p
                        WHERE p.source = d.source AND p.handler = d.handler
                          AND p.ordering_key = d.ordering_key
                          AND p.state IN ('pending', 'running', 'retrying')
                          AND (p.state = 'running'
                               OR COALESCE(p.sequence, 0) < COALESCE(d.sequence, 0)
                               OR (COALESCE(p.sequence, 0) = COALESCE(d.sequence, 0)
                                   AND p.id < d.id))))
                 ORDER BY d.next_attempt_at, d.id
                 LIMIT ?3",
            )?
            .query_map(params![handler, now_ms, page, after.0, after.1], |r| {
                Ok(Candidate {
                    id: r.get(0)?,
                    due_ms: r.get(1)?,
                    key: r.get(2)?,
                    sequence: r.get(3)?,
                    source: r.get(4)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        let full = rows.len() as i64 == page;
        for candidate in rows {
            after = (candidate.due_ms, candidate.id);
            if taken.contains(&candidate.id) {
                continue;
            }
            if is_stale(conn, handler, &candidate, now_ms)? {
                *stale += 1;
                marked = true;
                continue;
            }
            taken.insert(candidate.id);
            heads.push(candidate);
            if heads.len() == want {
                return Ok(heads);
            }
        }
        if full {
            continue;
        }
        if !marked {
            return Ok(heads);
        }
        (after, marked) = ((i64::MIN, i64::MIN), false);
    }
}

/// Marks `candidate` stale if a later delivery of its key is already done.
fn is_stale(
    conn: &Connection,
    handler: &str,
    candidate: &Candidate,
    now_ms: i64,
) -> Result<bool, InboxError> {
    let (Some(key), Some(sequence)) = (&candidate.key, candidate.sequence) else {
        return Ok(false);
    };
    let newest_done: Option<i64> = conn
        .prepare_cached(
            "SELECT MAX(sequence) FROM deliveries
             WHERE source = ?1 AND handler = ?2 AND ordering_key = ?3 AND state = 'done'",
        )?
        .query_row(params![candidate.source, handler, key], |r| r.get(0))?;
    let Some(done) = crate::dispatch::policy::superseded_by(sequence, newest_done) else {
        return Ok(false);
    };
    conn.prepare_cached(
        "UPDATE deliveries SET state = 'stale', updated_at = ?2, last_error = ?3
         WHERE id = ?1",
    )?
    .execute(params![
        candidate.id,
        now_ms,
        format!("stale: sequence {sequence} is older than {done}, already done for key {key:?}")
    ])?;
    Ok(true)
}

/// Leases `candidate` to a worker: the attempt is counted now.
fn lease(
    conn: &Connection,
    request: &ClaimRequest,
    handler: &str,
    candidate: &Candidate,
) -> Result<Claimed, InboxError> {
    let lease = request
        .lease_ms
        .get(handler)
        .copied()
        .unwrap_or(DEFAULT_LEASE_MS);
    let (attempt, budget_used, event) = conn
        .prepare_cached(
            "UPDATE deliveries SET state = 'running', attempts = attempts + 1,
                 lease_until = ?2, leased_at = ?3, updated_at = ?3
             WHERE id = ?1
             RETURNING attempts, attempts - budget_base, event",
        )?
        .query_row(
            params![candidate.id, request.now_ms + lease, request.now_ms],
            |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )?;
    let claim = conn
        .prepare_cached(
            "SELECT event_id, event_type, received_at, headers, body FROM events WHERE id = ?1",
        )?
        .query_row([event], |r| {
            let headers: String = r.get(3)?;
            let body: Vec<u8> = r.get(4)?;
            Ok(Claimed {
                delivery_id: candidate.id,
                attempt,
                budget_used,
                leased_at_ms: request.now_ms,
                source: SourceName::new(candidate.source.as_str()),
                handler: PluginName::new(handler),
                event_id: EventId::new(r.get::<_, String>(0)?),
                event_type: r.get(1)?,
                ordering_key: candidate.key.clone(),
                sequence: candidate.sequence.map(|s| s as u64),
                received_at_ms: r.get(2)?,
                headers: headers_from_json(&headers),
                body: Bytes::from(body),
            })
        })?;
    Ok(claim)
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod claim_tests;
/// Key + value bytes an attempt's writes carry (what its commit writes).
fn state_bytes(changes: &StateChanges) -> usize {
    changes
        .writes
        .iter()
        .map(|(key, value)| key.len() + value.as_ref().map_or(0, Vec::len))
        .sum()
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
fn apply_state(conn: &Connection, f: &Finish) -> Result<Result<(), String>, InboxError> {
    let plugin = f.plugin.as_str();
    let mut size = conn
        .prepare_cached("SELECT length(value) FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
    let (mut delta_keys, mut delta_bytes) = (0i64, 0i64);
    for (key, value) in &f.state.writes {
        let before: Option<u64> = size
            .query_row(params![plugin, key], |r| r.get(0))
            .optional()?
            .flatten();
        let before = before.map(|len| (len as usize + key.len()) as i64);
        let after = value.as_ref().map(|v| (v.len() + key.len()) as i64);
        delta_keys += i64::from(after.is_some()) - i64::from(before.is_some());
        delta_bytes += after.unwrap_or(0) - before.unwrap_or(0);
    }
    let (usage, clock) = state_usage(conn, plugin)?;
    let limits = &f.state.limits;
    let keys = usage.keys as i64 + delta_keys;
    let bytes = usage.bytes as i64 + delta_bytes;
    if delta_keys > 0 && keys > limits.max_keys as i64 {
        return Ok(Err(format!(
            "state writes refused at commit: plugin {plugin} would hold {keys} keys, over \
             plugins.{plugin}.state_max_keys = {}; delete keys or raise the limit",
            limits.max_keys
        )));
    }
    if delta_bytes > 0 && bytes > limits.max_bytes as i64 {
        return Ok(Err(format!(
            "state writes refused at commit: plugin {plugin} would hold {bytes} bytes, over \
             plugins.{plugin}.state_max_mib = {} ({} bytes); delete keys or raise the limit",
            limits.max_bytes / (1024 * 1024),
            limits.max_bytes
        )));
    }
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
    .execute(params![plugin, keys.max(0), bytes.max(0), version])?;
    Ok(Ok(()))
}

fn finish_attempt(conn: &Connection, f: &Finish) -> Result<Finished, InboxError> {
    let leased: Option<u32> = conn
        .prepare_cached("SELECT attempts FROM deliveries WHERE id = ?1 AND state = 'running'")?
        .query_row([f.delivery_id], |r| r.get(0))
        .optional()?;
    if leased != Some(f.attempt) {
        return Ok(Finished::LeaseLost);
    }
    if matches!(f.disposition, Disposition::Done { .. }) && !f.state.is_empty() {
        let mut current =
            conn.prepare_cached("SELECT version FROM plugin_state WHERE plugin = ?1 AND key = ?2")?;
        for (key, seen) in &f.state.versions {
            let now: i64 = current
                .query_row(params![f.plugin.as_str(), key], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            if now != *seen {
                // Recorded without the attempt's writes (no copy of its values).
                let conflict = Finish {
                    delivery_id: f.delivery_id,
                    attempt: f.attempt,
                    started_at_ms: f.started_at_ms,
                    finished_at_ms: f.finished_at_ms,
                    outcome: AttemptOutcome::Conflict,
                    error_kind: Some("state_conflict".into()),
                    error: Some(format!(
                        "state key {key:?} changed during the attempt (version {seen} → {now}); re-running"
                    )),
                    plugin_sha256: f.plugin_sha256.clone(),
                    disposition: f.disposition.clone(),
                    plugin: f.plugin.clone(),
                    state: StateChanges::default(),
                };
                insert_attempt(conn, f.delivery_id, &conflict)?;
                // Not counted against max_attempts: the attempt number is given back.
                conn.prepare_cached(
                    "UPDATE deliveries SET state = 'pending', attempts = attempts - 1,
                         next_attempt_at = ?2, lease_until = NULL, updated_at = ?2
                     WHERE id = ?1",
                )?
                .execute(params![f.delivery_id, f.finished_at_ms])?;
                return Ok(Finished::Conflict);
            }
        }
        if !f.state.writes.is_empty()
            && let Err(message) = apply_state(conn, f)?
        {
            return Ok(Finished::OverQuota(message));
        }
    }
    let (state, output, next_at) = match &f.disposition {
        Disposition::Done { output } => (DeliveryState::Done, output.clone(), f.finished_at_ms),
        Disposition::RetryAt { at_ms } => (DeliveryState::Retrying, None, *at_ms),
        Disposition::Dead => (DeliveryState::Dead, None, f.finished_at_ms),
    };
    let last_error = match (&f.error_kind, &f.error) {
        (Some(kind), Some(error)) => Some(format!("{kind}: {error}")),
        (Some(kind), None) => Some(kind.clone()),
        (None, error) => error.clone(),
    };
    conn.prepare_cached(
        "UPDATE deliveries SET state = ?2, output = COALESCE(?3, output), last_error = ?4,
             next_attempt_at = ?5, lease_until = NULL, updated_at = ?6
         WHERE id = ?1",
    )?
    .execute(params![
        f.delivery_id,
        state.as_str(),
        output,
        last_error,
        next_at,
        f.finished_at_ms
    ])?;
    insert_attempt(conn, f.delivery_id, f)?;
    Ok(Finished::Recorded)
}

fn matching_deliveries(conn: &Connection, filter: &ReplayFilter) -> Result<Vec<i64>, InboxError> {
    let state = filter.state.unwrap_or(DeliveryState::Dead);
    if state.is_open() {
        return Err(InboxError::Invalid(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Durability, model::StateLimits};

    const PLUGIN: &str = "p";

    async fn open() -> (tempfile::TempDir, Inbox) {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(&dir.path().join("hookd.db"), Durability::Normal).unwrap();
        (dir, inbox)
    }

    /// Accepts event `id` for handler [`PLUGIN`] and leases its delivery.
    async fn lease(inbox: &Inbox, id: &str) -> Claimed {
        let request = RawRequest {
            headers: Vec::new(),
            body: Bytes::from_static(b"{}"),
            received_at_ms: 1,
        };
        let envelope = Envelope {
            event_id: EventId::new(id),
            event_type: "t".into(),
            ordering_key: None,
            sequence: None,
        };
        let handlers = vec![PluginName::new(PLUGIN)];
        inbox
            .accept(SourceName::new("s"), envelope, request, handlers, None)
            .await
            .unwrap();
        let mut claimed = inbox
            .claim(ClaimRequest {
                now_ms: 10,
                limit: 1,
                capacity: [(PLUGIN.to_string(), 1)].into(),
                lease_ms: Default::default(),
                fairness: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{id} leased");
        claimed.remove(0)
    }

    fn done(claim: &Claimed, state: StateChanges) -> Finish {
        Finish {
            delivery_id: claim.delivery_id,
            attempt: claim.attempt,
            started_at_ms: 10,
            finished_at_ms: 11,
            outcome: AttemptOutcome::Ok,
            error_kind: None,
            error: None,
            plugin_sha256: None,
            disposition: Disposition::Done { output: None },
            plugin: PluginName::new(PLUGIN),
            state,
        }
    }

    fn changes(
        inbox: &Inbox,
        writes: &[(&str, Option<usize>)],
        limits: StateLimits,
    ) -> StateChanges {
        let mut changes = StateChanges {
            limits,
            ..Default::default()
        };
        for (key, len) in writes {
            let (_, version) = inbox.state_stat_blocking(PLUGIN, key).unwrap();
            changes.versions.insert(key.to_string(), version);
            changes
                .writes
                .insert(key.to_string(), len.map(|len| vec![7; len]));
        }
        changes
    }

    fn rows(dir: &tempfile::TempDir) -> i64 {
        let conn = Connection::open(dir.path().join("hookd.db")).unwrap();
        conn.query_row("SELECT COUNT(*) FROM plugin_state", [], |r| r.get(0))
            .unwrap()
    }

    #[tokio::test]
    async fn the_commit_keeps_usage_and_deletes_leave_no_rows() {
        let (dir, inbox) = open().await;
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
        assert_eq!(rows(&dir), 1);
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

    #[tokio::test]
    async fn the_commit_refuses_writes_that_take_the_plugin_over_its_total() {
        let (dir, inbox) = open().await;
        let limits = StateLimits {
            max_keys: 2,
            max_bytes: 1000,
            ..StateLimits::DEFAULT
        };
        // Two attempts that each fit, checked against the same committed usage (as concurrent
        // attempts are): the first commits, the second would make three keys.
        let a = lease(&inbox, "a").await;
        let b = lease(&inbox, "b").await;
        let first = changes(&inbox, &[("a1", Some(1)), ("a2", Some(1))], limits);
        let second = changes(&inbox, &[("b1", Some(1))], limits);
        assert_eq!(
            inbox.finish(done(&a, first)).await.unwrap(),
            Finished::Recorded
        );
        let Finished::OverQuota(message) = inbox.finish(done(&b, second)).await.unwrap() else {
            panic!("the second commit must be refused");
        };
        assert!(
            message.contains("would hold 3 keys")
                && message.contains("plugins.p.state_max_keys = 2"),
            "{message}"
        );
        // Nothing of it applied, and the lease is still held: the caller records the failure.
        assert_eq!(rows(&dir), 2);
        let failed = Finish {
            outcome: AttemptOutcome::Retry,
            error_kind: Some("state_quota".into()),
            error: Some(message),
            disposition: Disposition::RetryAt { at_ms: 1000 },
            ..done(&b, StateChanges::default())
        };
        assert_eq!(inbox.finish(failed).await.unwrap(), Finished::Recorded);

        // Over the bytes, too; while a delete with a bigger write that nets fewer bytes passes.
        let c = lease(&inbox, "c").await;
        let grow = changes(&inbox, &[("a1", Some(999))], limits);
        assert!(matches!(
            inbox.finish(done(&c, grow)).await.unwrap(),
            Finished::OverQuota(m) if m.contains("state_max_mib")
        ));
        let failed = Finish {
            disposition: Disposition::Dead,
            ..done(&c, StateChanges::default())
        };
        inbox.finish(failed).await.unwrap();
        let d = lease(&inbox, "d").await;
        let swap = changes(
            &inbox,
            &[("a1", None), ("a2", None), ("b1", Some(900))],
            limits,
        );
        assert_eq!(
            inbox.finish(done(&d, swap)).await.unwrap(),
            Finished::Recorded
        );
        assert_eq!(
            inbox.state_usage_blocking(PLUGIN).unwrap(),
            StateUsage {
                keys: 1,
                bytes: 902
            }
        );
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
