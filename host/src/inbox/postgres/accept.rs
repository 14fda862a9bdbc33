//! Accept in SQL: the event row, its delivery rows, and the quarantine resolution; concurrent
//! accepts in one transaction (`batch.rs`'s queue), a request from quarantine in its own.
//!
//! Invariants:
//! - All of one accept is in one transaction, and the insert is
//!   `ON CONFLICT (source, event_id) DO NOTHING`: the unique constraint decides a duplicate,
//!   also between nodes accepting one event at the same time (the second insert waits for the
//!   first's commit, then inserts nothing). Within one batch an event is sent once: its first
//!   request is the one inserted, the rest are `Duplicate`.
//! - An event of a source that dedupes by body has a second unique index to meet,
//!   `(source, body_sha256)`, and PostgreSQL names one conflict target at most: its insert is
//!   `ON CONFLICT DO NOTHING`, which any unique index decides, the primary key included. So
//!   an event such an insert skipped is a `Duplicate` only once a stored event with its id or
//!   its body is found; one found with neither (a primary key taken: an identity sequence left
//!   behind its rows) fails instead, so nothing unstored is ever answered as stored.
//! - A batch's requests are answered once its `COMMIT` has answered (the statement and the
//!   `COMMIT` travel together, but the answer waits for both).
//! - A transaction that inserted a delivery notifies the other nodes as it commits (never
//!   before, never if it rolls back), in the statement that inserted it.
//! - A batch inserts in `(source, event_id)` order, so two nodes' batches wait for each other's
//!   rows in one order and never deadlock on event ids. Bodies come in no such order: two
//!   nodes each inserting, at once, the bodies the other is inserting under other ids (of a
//!   source that dedupes by body) can deadlock; PostgreSQL then ends one transaction, and a
//!   batch it ended has its requests accepted again one at a time (finding the other's events
//!   stored), not all refused.

use std::{collections::HashMap, time::Instant};

use tokio_postgres::error::SqlState;

use super::{
    Connections,
    batch::{Reply, Weigh, answer},
    error::storage_error,
    quarantine,
    statements::{self, Conn, Run, Tx},
    wakeup,
};
use crate::inbox::{
    Accepted, Commits, InboxError, quarantine::accepted_as, request::headers_json, store::NewEvent,
};

/// Inserts the event and its deliveries unless `(source, event_id)` is stored, and resolves the
/// quarantined request it came from either way; writes nothing if that request is no longer
/// held.
pub(super) async fn store_event(tx: &Tx<'_>, new: &NewEvent) -> Result<Accepted, InboxError> {
    let NewEvent {
        source,
        envelope,
        request,
        handlers,
        body_sha256,
        from_quarantine,
        now_ms,
    } = new;
    if let Some(id) = from_quarantine {
        // Which stored event another id's body makes this one a duplicate of, if any, and its
        // own id is not stored (a duplicate of its id is that); as of now: one committed
        // before the insert below is not named.
        let body_of: Option<String> = match body_sha256 {
            Some(digest) => tx
                .query_opt(
                    "SELECT event_id FROM events
                     WHERE source = $1 AND body_sha256 = $2 AND event_id <> $3
                       AND NOT EXISTS (SELECT 1 FROM events WHERE source = $1 AND event_id = $3)",
                    &[&source.as_str(), &&digest[..], &envelope.event_id.as_str()],
                )
                .await?
                .map(|row| row.get(0)),
            None => None,
        };
        let resolution = accepted_as(envelope.event_id.as_str(), body_of.as_deref());
        if !quarantine::resolve(tx, *id, *now_ms, &resolution).await? {
            return Ok(Accepted::AlreadyResolved);
        }
    }
    let sequence = envelope.sequence.map(|s| s as i64);
    let digest = body_sha256.as_ref().map(|digest| &digest[..]);
    macro_rules! insert_sql {
        ($conflict:literal) => {
            concat!(
                "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                     received_at, headers, body, body_sha256)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT ",
                $conflict,
                " DO NOTHING RETURNING id"
            )
        };
    }
    // Only the event id decides, unless there is a digest (see the module's invariants).
    let insert = match digest {
        None => insert_sql!("(source, event_id)"),
        Some(_) => insert_sql!(""),
    };
    let inserted = tx
        .query_opt(
            insert,
            &[
                &source.as_str(),
                &envelope.event_id.as_str(),
                &envelope.event_type,
                &envelope.ordering_key,
                &sequence,
                &request.received_at_ms,
                &headers_json(&request.headers),
                &&request.body[..],
                &digest,
            ],
        )
        .await?;
    let accepted = match inserted {
        Some(row) => {
            let event: i64 = row.get(0);
            let handlers: Vec<&str> = handlers.iter().map(|h| h.as_str()).collect();
            tx.execute(
                "INSERT INTO deliveries (event, source, handler, ordering_key, sequence,
                                         state, next_attempt_at, updated_at)
                 SELECT $1, $2, handler, $4, $5, 'pending', $6, $6
                 FROM unnest($3::text[]) WITH ORDINALITY AS h (handler, n) ORDER BY n
                 RETURNING pg_notify($7, '')",
                &[
                    &event,
                    &source.as_str(),
                    &handlers,
                    &envelope.ordering_key,
                    &sequence,
                    &request.received_at_ms,
                    &wakeup::CHANNEL,
                ],
            )
            .await?;
            Accepted::New
        }
        None if digest.is_some() => {
            let sources = [source.as_str()];
            let ids = [envelope.event_id.as_str()];
            let unstored = unstored(tx, &sources, &ids, &[digest]).await?;
            match unstored.is_empty() {
                true => Accepted::Duplicate,
                false => return Err(neither_stored(&sources, &ids, &unstored)),
            }
        }
        None => Accepted::Duplicate,
    };
    Ok(accepted)
}

/// Of the events given by `sources`, `ids` and `digests` (arrays alike), the positions (the
/// first is 1) of those with no stored event of their `(source, event_id)` nor of their
/// `(source, body_sha256)`: after an insert of theirs that `ON CONFLICT DO NOTHING` skipped,
/// those met another unique index than these two.
async fn unstored(
    client: &impl Run,
    sources: &[&str],
    ids: &[&str],
    digests: &[Option<&[u8]>],
) -> Result<Vec<i64>, InboxError> {
    let rows = client
        .query(
            "SELECT d.n FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY
                 AS d (source, event_id, body_sha256, n)
             WHERE NOT EXISTS (SELECT 1 FROM events v
                               WHERE v.source = d.source AND v.event_id = d.event_id)
               AND NOT EXISTS (SELECT 1 FROM events v
                               WHERE v.source = d.source AND v.body_sha256 = d.body_sha256)",
            &[&sources, &ids, &digests],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The error of events [`unstored`] found (positions from 1 in `sources` and `ids`).
fn neither_stored(sources: &[&str], ids: &[&str], unstored: &[i64]) -> InboxError {
    let named: Vec<String> = unstored
        .iter()
        .map(|&n| {
            let i = n as usize - 1;
            format!("{}/{}", sources[i], ids[i])
        })
        .collect();
    let why = format!(
        "events {} were neither stored nor found stored: their insert met a unique index other \
         than the event id's and the body's (the `events` primary key's identity sequence \
         behind its rows?)",
        named.join(", ")
    );
    storage_error(why)
}

/// Whether `(source, event_id)` is stored.
pub(super) async fn contains_event(
    client: &Conn,
    source: &str,
    event_id: &str,
) -> Result<bool, InboxError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM events WHERE source = $1 AND event_id = $2",
            &[&source, &event_id],
        )
        .await?
        .is_some())
}

impl Weigh for NewEvent {
    fn weight(&self) -> usize {
        self.request.body.len()
            + self
                .request
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
    }
}

/// Commits a batch of accepts and answers every request in it.
pub(super) async fn commit_accepts(
    pool: &Connections,
    commits: &Commits,
    mut batch: Vec<(NewEvent, Reply<Accepted>)>,
) {
    batch.sort_by(|(a, _), (b, _)| {
        (a.source.as_str(), a.envelope.event_id.as_str())
            .cmp(&(b.source.as_str(), b.envelope.event_id.as_str()))
    });
    let events: Vec<&NewEvent> = batch.iter().map(|(event, _)| event).collect();
    let started = Instant::now();
    let together = in_one_transaction(pool, &events).await;
    drop(events);
    for (event, reply) in answer(commits, started, batch, together) {
        let _ = reply.send(one(pool, commits, &event).await);
    }
}

/// The one-event path: a transaction of its own (and the quarantine row it resolves).
pub(super) async fn one(
    pool: &Connections,
    commits: &Commits,
    event: &NewEvent,
) -> Result<Accepted, InboxError> {
    Ok(in_transaction!(pool, commits, tx => store_event(&tx, event).await?))
}

/// The statement of [`in_one_transaction`], with `$conflict` as its `ON CONFLICT` target: the
/// events not stored yet, in the order given, and one pending delivery per handler of each
/// inserted, in event then handler order (`$9`: the event's position in the arrays, from 1;
/// `$10`: the handler); returns the inserted events' ids, sources and event ids. A transaction
/// that inserted a delivery notifies `$11` (the other nodes' wake-up) as it commits. `$12`:
/// the bodies' SHA-256, for the events of a source that dedupes by body.
macro_rules! accept_sql {
    ($conflict:literal) => {
        concat!(
            "WITH e AS (
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                              $6::bigint[], $7::text[], $8::bytea[], $12::bytea[])
              WITH ORDINALITY
              AS e (source, event_id, event_type, ordering_key, sequence, received_at,
                    headers, body, body_sha256, n)
     ), stored AS (
         INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                             received_at, headers, body, body_sha256)
         SELECT source, event_id, event_type, ordering_key, sequence, received_at, headers, body,
                body_sha256
         FROM e ORDER BY n
         ON CONFLICT ",
            $conflict,
            " DO NOTHING
         RETURNING id, source, event_id, ordering_key, sequence, received_at
     ), delivered AS (
         INSERT INTO deliveries (event, source, handler, ordering_key, sequence, state,
                                 next_attempt_at, updated_at)
         SELECT s.id, s.source, h.handler, s.ordering_key, s.sequence, 'pending',
                s.received_at, s.received_at
         FROM stored s
         JOIN e ON e.source = s.source AND e.event_id = s.event_id
         JOIN unnest($9::bigint[], $10::text[]) WITH ORDINALITY AS h (event, handler, k)
           ON h.event = e.n
         ORDER BY e.n, h.k
         RETURNING pg_notify($11, '')
     )
     SELECT id, source, event_id FROM stored"
        )
    };
}

/// [`accept_sql`] for a batch without a body digest: only the event id decides a duplicate.
const ACCEPT_SQL: &str = accept_sql!("(source, event_id)");

/// [`accept_sql`] for a batch with a body digest: any unique index decides (see the module's
/// invariants for what is checked after).
const ACCEPT_DEDUPING_SQL: &str = accept_sql!("");

/// Inserts `events` (sorted by `(source, event_id)`) and the deliveries of those new, as one
/// statement in one transaction, in one round trip; what each became, in order. Of requests
/// for one event in the batch the first is the one inserted, the rest are duplicates.
pub(super) async fn in_one_transaction(
    pool: &Connections,
    events: &[&NewEvent],
) -> Result<Vec<Accepted>, InboxError> {
    fn key(e: &NewEvent) -> (&str, &str) {
        (e.source.as_str(), e.envelope.event_id.as_str())
    }
    // The statement sees each event once (a second row of it would meet the first's
    // deliveries); sorted, a repeat follows its first.
    let mut firsts: Vec<&NewEvent> = events.to_vec();
    firsts.dedup_by(|later, first| key(later) == key(first));
    let sources: Vec<&str> = firsts.iter().map(|e| e.source.as_str()).collect();
    let ids: Vec<&str> = firsts
        .iter()
        .map(|e| e.envelope.event_id.as_str())
        .collect();
    let types: Vec<&str> = firsts
        .iter()
        .map(|e| e.envelope.event_type.as_str())
        .collect();
    let keys: Vec<Option<&str>> = firsts
        .iter()
        .map(|e| e.envelope.ordering_key.as_deref())
        .collect();
    let sequences: Vec<Option<i64>> = firsts
        .iter()
        .map(|e| e.envelope.sequence.map(|s| s as i64))
        .collect();
    let received: Vec<i64> = firsts.iter().map(|e| e.request.received_at_ms).collect();
    let headers: Vec<String> = firsts
        .iter()
        .map(|e| headers_json(&e.request.headers))
        .collect();
    let bodies: Vec<&[u8]> = firsts.iter().map(|e| &e.request.body[..]).collect();
    let digests: Vec<Option<&[u8]>> = firsts
        .iter()
        .map(|e| e.body_sha256.as_ref().map(|digest| &digest[..]))
        .collect();
    let mut of_event: Vec<i64> = Vec::new();
    let mut handlers: Vec<&str> = Vec::new();
    for (n, event) in (1..).zip(&firsts) {
        for handler in &event.handlers {
            of_event.push(n);
            handlers.push(handler.as_str());
        }
    }
    let deduping = digests.iter().any(Option::is_some);
    let client = pool.get().await?;
    let rows = client
        .in_one_round_trip(
            statements::BEGIN,
            if deduping {
                ACCEPT_DEDUPING_SQL
            } else {
                ACCEPT_SQL
            },
            &[
                &sources,
                &ids,
                &types,
                &keys,
                &sequences,
                &received,
                &headers,
                &bodies,
                &of_event,
                &handlers,
                &wakeup::CHANNEL,
                &digests,
            ],
        )
        .await
        .map_err(|e| match e.code() {
            // Answered as a whole, a deadlock would refuse every request of the batch for the
            // sake of two: those are accepted again one at a time instead.
            Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED && firsts.len() > 1 => {
                storage_error(format!(
                    "a batch of accepts deadlocked with another transaction ({}); its requests \
                     are accepted again one at a time",
                    super::error::chain(&e)
                ))
            }
            _ => InboxError::from(e),
        })?;
    let mut new: HashMap<(String, String), i64> = rows
        .iter()
        .map(|row| ((row.get(1), row.get(2)), row.get(0)))
        .collect();
    if deduping && new.len() < firsts.len() {
        // Committed: one found neither stored nor a duplicate fails the batch, whose requests
        // are then accepted again one at a time (the stored ones as duplicates).
        let unstored = unstored(&client, &sources, &ids, &digests).await?;
        if !unstored.is_empty() {
            return Err(neither_stored(&sources, &ids, &unstored));
        }
    }
    Ok(events
        .iter()
        .map(
            |e| match new.remove(&(e.source.to_string(), e.envelope.event_id.to_string())) {
                Some(_) => Accepted::New,
                None => Accepted::Duplicate,
            },
        )
        .collect())
}
