//! Retention: the background pruner that keeps the database from growing forever, and
//! discard, the operator's way to close what needs no human any more.
//!
//! [`run`] is a task of the host (started by `lib::run`, stopped at shutdown) that prunes in
//! small batches through [`Inbox::prune`]: each batch is one short transaction of the store
//! (one writer job on SQLite, so ingest's commits queue behind at most one batch), and after a
//! batch that found more to do it pauses at least as long as the batch took, so pruning uses at
//! most about half of the store's write time while it catches up. Once caught up it rests
//! `retention.interval`. [`discard`] is the service behind `POST /admin/discard` and the
//! dashboard's discards.
//!
//! Invariants:
//! - Nothing here decides what may be pruned: the store does, in the batch's transaction
//!   (finished work only; never `dead` deliveries nor held quarantine).
//! - A failing batch is logged and retried after `retention.interval`; it never stops the host.
//! - Logs say what was pruned or discarded and how many, never a payload.

pub mod discard;

use std::time::Duration;

use crate::{
    config::Retention,
    inbox::{Inbox, PruneCursor, Pruned},
};

/// The shortest pause between two batches while catching up.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// Prunes by `rules` until `stop` resolves (at once when `done_after` is forever).
pub async fn run(inbox: Inbox, rules: Retention, stop: impl Future<Output = ()>) {
    if rules.done_after.is_none() {
        tracing::info!("retention.done_after is forever: nothing is pruned");
        return;
    }
    tokio::pin!(stop);
    let mut cursor: PruneCursor = None;
    let mut round = Pruned::default();
    loop {
        let started = tokio::time::Instant::now();
        let rest = match inbox.prune(&rules, cursor).await {
            Ok(batch) => {
                cursor = batch.next;
                round.events += batch.events;
                round.forgotten += batch.forgotten;
                round.quarantine += batch.quarantine;
                if !batch.busy && batch.more(rules.batch_size) {
                    started.elapsed().max(MIN_PAUSE)
                } else {
                    log_round(&std::mem::take(&mut round), batch.busy);
                    rules.interval
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "retention: a pruning batch failed; trying again later");
                cursor = None;
                rules.interval
            }
        };
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(rest) => {}
        }
    }
}

/// Logs what a round of batches pruned (nothing when it pruned nothing).
fn log_round(round: &Pruned, busy: bool) {
    if busy {
        tracing::debug!("retention: another node is pruning");
    }
    if round.events + round.forgotten + round.quarantine > 0 {
        tracing::info!(
            events = round.events,
            forgotten = round.forgotten,
            quarantine = round.quarantine,
            "retention: pruned the payloads of finished events, forgot expired ids, deleted \
             resolved quarantined requests"
        );
    }
}
