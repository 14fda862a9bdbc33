//! Group commit for PostgreSQL: a queue whose operations (accepts, `accept.rs`; finishes that
//! write no plugin state, `lease.rs`) share one transaction, whose few statements write every
//! operation of the batch at once (`unnest` of arrays), so a request costs the server a share
//! of one commit, not a transaction of its own.
//!
//! Invariants:
//! - An operation is answered only after the transaction holding it committed, with its own
//!   result.
//! - One operation cannot fail the others: a batch refused for anything but the server being
//!   away or busy is run again one operation per transaction ([`answer`] hands those back), so
//!   only the operation at fault gets the error.
//! - An operation waits at most for the transactions under way: a batch smaller than
//!   [`FULL_ENOUGH`] goes as soon as no other transaction of its queue is under way.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use crate::inbox::{Commits, InboxError};

/// Operations one transaction takes at most.
const MAX_ITEMS: usize = 128;
/// Request bytes (bodies and headers) one transaction takes at most, past its first event.
const MAX_BYTES: usize = 4 << 20;
/// Transactions under way at once per queue (each on a pooled connection of its own).
const COMMITTERS: usize = 4;
/// A transaction starts while another of its queue is under way only with at least this many
/// operations; a smaller batch waits for more, or for the queue's other transactions to end.
/// (Measured with three nodes on one database: committers that each took whatever was queued
/// ran 5.3 accepts per WAL flush, waiting for a fuller batch 8.4, with less of the server's CPU
/// per accept; a lone operation on an idle queue still commits at once.)
const FULL_ENOUGH: usize = 8;

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
        let under_way = Arc::new(UnderWay::default());
        for _ in 0..COMMITTERS {
            let (commit, received, under_way) =
                (commit.clone(), received.clone(), under_way.clone());
            tokio::spawn(async move {
                while let Some(batch) = next_batch(&received, &under_way).await {
                    under_way.count.fetch_add(1, Ordering::SeqCst);
                    commit(batch).await;
                    under_way.count.fetch_sub(1, Ordering::SeqCst);
                    under_way.ended.notify_one();
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

/// A queue's transactions under way, and a wake-up when one ends.
#[derive(Default)]
struct UnderWay {
    count: AtomicUsize,
    ended: Notify,
}

/// Waits for an operation, then takes whatever else is queued, up to a batch's limits; while
/// another transaction of the queue is under way, keeps taking until the batch is
/// [`FULL_ENOUGH`] or none is. `None` once the store is gone.
async fn next_batch<T: Weigh, R>(
    received: &Mutex<mpsc::Receiver<(T, Reply<R>)>>,
    under_way: &UnderWay,
) -> Option<Vec<(T, Reply<R>)>> {
    let mut received = received.lock().await;
    let first = received.recv().await?;
    let mut bytes = first.0.weight();
    let mut batch = vec![first];
    let full = |batch: &Vec<_>, bytes: usize| batch.len() >= MAX_ITEMS || bytes >= MAX_BYTES;
    loop {
        while !full(&batch, bytes) {
            let Ok(next) = received.try_recv() else {
                break;
            };
            bytes += next.0.weight();
            batch.push(next);
        }
        if full(&batch, bytes)
            || batch.len() >= FULL_ENOUGH
            || under_way.count.load(Ordering::SeqCst) == 0
        {
            return Some(batch);
        }
        tokio::select! {
            next = received.recv() => match next {
                Some(next) => {
                    bytes += next.0.weight();
                    batch.push(next);
                }
                None => return Some(batch),
            },
            // A permit left by an earlier end only makes this look again.
            () = under_way.ended.notified() => {}
        }
    }
}

/// Whether a batch that failed with `e` is to be answered with it as a whole (the server is
/// away or busy: one at a time would fare no better), not retried one operation at a time.
pub(super) fn fails_as_a_whole<T>(batch: &[T], e: &InboxError) -> bool {
    batch.len() == 1 || matches!(e, InboxError::Unavailable(_) | InboxError::Busy(_))
}

/// Answers every operation of `batch` by `together`, the result of running them all in one
/// transaction: once it committed (counted in `commits`), each with its own result; when it
/// failed as a whole (see [`fails_as_a_whole`]), each with the failure. What is left (the
/// batch failed for one operation's sake) is returned, to be run one per transaction so only
/// the operation at fault fails.
pub(super) fn answer<T, R>(
    commits: &Commits,
    started: Instant,
    batch: Vec<(T, Reply<R>)>,
    together: Result<Vec<R>, InboxError>,
) -> Vec<(T, Reply<R>)> {
    match together {
        Ok(results) => {
            commits.committed(batch.len(), started);
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

/// `e` for each request of a batch that failed as a whole.
pub(super) fn shared(e: &InboxError) -> InboxError {
    match e {
        InboxError::Unavailable(why) => InboxError::Unavailable(Arc::clone(why)),
        InboxError::Busy(why) => InboxError::Busy(Arc::clone(why)),
        InboxError::Storage(why) => InboxError::Storage(Arc::clone(why)),
        InboxError::WriterGone => InboxError::WriterGone,
        other => super::error::storage_error(other.to_string()),
    }
}
