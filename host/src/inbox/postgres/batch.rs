//! Group commit for PostgreSQL: concurrent accepts (and finishes, `lease.rs`) share one
//! transaction, whose few statements write every operation of the batch at once (`unnest` of
//! arrays), so a request costs the server a share of one commit, not a transaction of its own.
//!
//! Invariants:
//! - A caller is answered only after the transaction holding its event committed, with what its
//!   own event became (`New`, or `Duplicate` when its `(source, event_id)` was stored before or
//!   by an earlier request of the same batch).
//! - Dedupe stays the unique constraint's (`ON CONFLICT DO NOTHING`); a batch inserts in
//!   `(source, event_id)` order, so two nodes' batches wait for each other's rows in one order
//!   and never deadlock.
//! - One request cannot fail the others: a batch refused for anything but the server being away
//!   or busy is retried one event per transaction, so only the event at fault gets the error.
//! - A request from quarantine (rare: a replay) takes the one-event path, which also resolves
//!   its quarantine row.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
};

use deadpool_postgres::Transaction;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{Connections, accept};
use crate::inbox::{
    Accepted, InboxError, error::StorageError, request::headers_json, store::NewEvent,
};

/// Operations one transaction takes at most.
const MAX_ITEMS: usize = 128;
/// Request bytes (bodies and headers) one transaction takes at most, past its first event.
const MAX_BYTES: usize = 4 << 20;
/// Transactions under way at once per queue (each on a pooled connection of its own).
const COMMITTERS: usize = 4;

/// Where an operation's answer goes.
pub(super) type Reply<R> = oneshot::Sender<Result<R, InboxError>>;

/// What a queue's operations weigh, against a batch's [`MAX_BYTES`].
pub(super) trait Weigh {
    fn weight(&self) -> usize {
        0
    }
}

/// A queue of operations waiting for a transaction, and the tasks that commit them: each task
/// takes what is queued (up to a batch's limits) and hands it to `commit`, which must answer
/// every operation, after its transaction committed.
pub(super) struct Batcher<T, R> {
    queue: mpsc::Sender<(T, Reply<R>)>,
}

impl<T: Weigh + Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the committers.
    pub(super) fn start<F, Fut>(commit: F) -> Self
    where
        F: Fn(Vec<(T, Reply<R>)>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (queue, received) = mpsc::channel(MAX_ITEMS * COMMITTERS);
        let received = Arc::new(Mutex::new(received));
        for _ in 0..COMMITTERS {
            let (commit, received) = (commit.clone(), received.clone());
            tokio::spawn(async move {
                while let Some(batch) = next_batch(&received).await {
                    commit(batch).await;
                }
            });
        }
        Self { queue }
    }

    /// Queues `item` for the next transaction; answers once it committed.
    pub(super) async fn submit(&self, item: T) -> Result<R, InboxError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((item, reply))
            .await
            .map_err(|_| InboxError::WriterGone)?;
        answer.await.map_err(|_| InboxError::WriterGone)?
    }
}

/// Waits for an operation, then takes whatever else is queued, up to a batch's limits; `None`
/// once the store is gone.
async fn next_batch<T: Weigh, R>(
    received: &Mutex<mpsc::Receiver<(T, Reply<R>)>>,
) -> Option<Vec<(T, Reply<R>)>> {
    let mut received = received.lock().await;
    let first = received.recv().await?;
    let mut bytes = first.0.weight();
    let mut batch = vec![first];
    while batch.len() < MAX_ITEMS && bytes < MAX_BYTES {
        let Ok(next) = received.try_recv() else {
            break;
        };
        bytes += next.0.weight();
        batch.push(next);
    }
    Some(batch)
}

/// Whether a batch that failed with `e` is to be answered with it as a whole (the server is
/// away or busy: one at a time would fare no better), not retried one operation at a time.
pub(super) fn fails_as_a_whole<T>(batch: &[T], e: &InboxError) -> bool {
    batch.len() == 1 || matches!(e, InboxError::Unavailable(_) | InboxError::Busy(_))
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
    commits: &AtomicI64,
    mut batch: Vec<(NewEvent, Reply<Accepted>)>,
) {
    batch.sort_by(|(a, _), (b, _)| {
        (a.source.as_str(), a.envelope.event_id.as_str())
            .cmp(&(b.source.as_str(), b.envelope.event_id.as_str()))
    });
    let events: Vec<&NewEvent> = batch.iter().map(|(event, _)| event).collect();
    let together = in_one_transaction(pool, &events).await;
    drop(events);
    for (event, reply) in answer(commits, batch, together) {
        let _ = reply.send(one(pool, commits, &event).await);
    }
}

/// Answers every operation of `batch` by `together`, the result of running them all in one
/// transaction: once it committed (counted in `commits`), each with its own result; when it
/// failed as a whole (see [`fails_as_a_whole`]), each with the failure. What is left (the
/// batch failed for one operation's sake) is returned, to be run one per transaction so only
/// the operation at fault fails.
pub(super) fn answer<T, R>(
    commits: &AtomicI64,
    batch: Vec<(T, Reply<R>)>,
    together: Result<Vec<R>, InboxError>,
) -> Vec<(T, Reply<R>)> {
    match together {
        Ok(results) => {
            commits.fetch_add(1, Ordering::Relaxed);
            for ((_, reply), result) in batch.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
            Vec::new()
        }
        Err(e) if fails_as_a_whole(&batch, &e) => {
            for (_, reply) in batch {
                let _ = reply.send(Err(shared(&e)));
            }
            Vec::new()
        }
        Err(_) => batch,
    }
}

/// The one-event path: a transaction of its own (and the quarantine row it resolves).
pub(super) async fn one(
    pool: &Connections,
    commits: &AtomicI64,
    event: &NewEvent,
) -> Result<Accepted, InboxError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let accepted = accept::store_event(&tx, event).await?;
    tx.commit().await?;
    commits.fetch_add(1, Ordering::Relaxed);
    Ok(accepted)
}

/// Inserts `events` (sorted by `(source, event_id)`) and the deliveries of those new, in one
/// transaction; what each became, in order.
async fn in_one_transaction(
    pool: &Connections,
    events: &[&NewEvent],
) -> Result<Vec<Accepted>, InboxError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let inserted = insert_events(&tx, events).await?;
    insert_deliveries(&tx, events, &inserted).await?;
    tx.commit().await?;
    Ok(inserted
        .iter()
        .map(|id| {
            if id.is_some() {
                Accepted::New
            } else {
                Accepted::Duplicate
            }
        })
        .collect())
}

/// Inserts the events not stored yet; per event, its new row id (`None`: a duplicate, of a
/// stored event or of an earlier one in `events`).
async fn insert_events(
    tx: &Transaction<'_>,
    events: &[&NewEvent],
) -> Result<Vec<Option<i64>>, InboxError> {
    let sources: Vec<&str> = events.iter().map(|e| e.source.as_str()).collect();
    let ids: Vec<&str> = events
        .iter()
        .map(|e| e.envelope.event_id.as_str())
        .collect();
    let types: Vec<&str> = events
        .iter()
        .map(|e| e.envelope.event_type.as_str())
        .collect();
    let keys: Vec<Option<&str>> = events
        .iter()
        .map(|e| e.envelope.ordering_key.as_deref())
        .collect();
    let sequences: Vec<Option<i64>> = events
        .iter()
        .map(|e| e.envelope.sequence.map(|s| s as i64))
        .collect();
    let received: Vec<i64> = events.iter().map(|e| e.request.received_at_ms).collect();
    let headers: Vec<String> = events
        .iter()
        .map(|e| headers_json(&e.request.headers))
        .collect();
    let bodies: Vec<&[u8]> = events.iter().map(|e| &e.request.body[..]).collect();
    let rows = tx
        .query(
            &tx.prepare_cached(
                "INSERT INTO events (source, event_id, event_type, ordering_key, sequence,
                                     received_at, headers, body)
                 SELECT source, event_id, event_type, ordering_key, sequence, received_at,
                        headers, body
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                             $6::bigint[], $7::text[], $8::bytea[]) WITH ORDINALITY
                      AS e (source, event_id, event_type, ordering_key, sequence, received_at,
                            headers, body, n)
                 ORDER BY n
                 ON CONFLICT (source, event_id) DO NOTHING
                 RETURNING id, source, event_id",
            )
            .await?,
            &[
                &sources, &ids, &types, &keys, &sequences, &received, &headers, &bodies,
            ],
        )
        .await?;
    let mut new: HashMap<(String, String), i64> = rows
        .iter()
        .map(|row| ((row.get(1), row.get(2)), row.get(0)))
        .collect();
    // The first request of a pair in one batch is the one inserted (rows go in order).
    Ok(events
        .iter()
        .map(|e| new.remove(&(e.source.to_string(), e.envelope.event_id.to_string())))
        .collect())
}

/// Inserts one pending delivery per handler of each event inserted (`inserted[i]` of
/// `events[i]`), in event order.
async fn insert_deliveries(
    tx: &Transaction<'_>,
    events: &[&NewEvent],
    inserted: &[Option<i64>],
) -> Result<(), InboxError> {
    let mut event_ids = Vec::new();
    let mut sources = Vec::new();
    let mut handlers = Vec::new();
    let mut keys = Vec::new();
    let mut sequences = Vec::new();
    let mut due = Vec::new();
    for (event, id) in events.iter().zip(inserted) {
        let Some(id) = id else { continue };
        for handler in &event.handlers {
            event_ids.push(*id);
            sources.push(event.source.as_str());
            handlers.push(handler.as_str());
            keys.push(event.envelope.ordering_key.as_deref());
            sequences.push(event.envelope.sequence.map(|s| s as i64));
            due.push(event.request.received_at_ms);
        }
    }
    if event_ids.is_empty() {
        return Ok(());
    }
    tx.execute(
        &tx.prepare_cached(
            "INSERT INTO deliveries (event, source, handler, ordering_key, sequence, state,
                                     next_attempt_at, updated_at)
             SELECT event, source, handler, ordering_key, sequence, 'pending', due, due
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                         $6::bigint[]) WITH ORDINALITY
                  AS d (event, source, handler, ordering_key, sequence, due, n)
             ORDER BY n",
        )
        .await?,
        &[&event_ids, &sources, &handlers, &keys, &sequences, &due],
    )
    .await?;
    Ok(())
}

/// `e` for each request of a batch that failed as a whole.
pub(super) fn shared(e: &InboxError) -> InboxError {
    match e {
        InboxError::Unavailable(why) => InboxError::Unavailable(Arc::clone(why)),
        InboxError::Busy(why) => InboxError::Busy(Arc::clone(why)),
        InboxError::Storage(why) => InboxError::Storage(Arc::clone(why)),
        InboxError::WriterGone => InboxError::WriterGone,
        other => {
            let why: StorageError = Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                other.to_string(),
            ));
            InboxError::Storage(why)
        }
    }
}
