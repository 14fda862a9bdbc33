//! Property test of ordering against the real inbox (a fresh database of the backend under
//! test, `claim` and `finish` as the dispatcher calls them): any interleaving of arrivals, claims and outcomes over a few ordering
//! keys keeps the contract — one delivery per key at a time, the lowest open sequence first,
//! never a run older than a sequence already done, and `stale` exactly for those.
//!
//! Invariant: the model below only records what happened (arrivals, claims, outcomes); every
//! expectation is the documented rule applied to that record, not a copy of the store's query.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderMap;
use proptest::prelude::*;

use super::{Database, fixtures};
use crate::ids::{EventId, PluginName, SourceName};
use crate::inbox::{EventFilter, Inbox, RawRequest};
use crate::model::{Disposition, Envelope};
use crate::verify::{Scheme, Verifier};

const HANDLER: &str = "h";
const KEYS: [&str; 2] = ["k0", "k1"];

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// A new event for key `KEYS[key]` with `sequence`.
    Arrive { key: usize, sequence: u8 },
    /// The dispatcher leases what is due.
    Claim,
    /// The `nth` running attempt (modulo how many run) ends with `outcome`.
    Finish { nth: usize, outcome: Outcome },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Done,
    Retry,
    Dead,
}

/// Interleavings of arrivals, claims and outcomes.
pub(super) fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..KEYS.len(), 0u8..6).prop_map(|(key, sequence)| Op::Arrive { key, sequence }),
        2 => Just(Op::Claim),
        2 => (any::<usize>(), prop_oneof![
                3 => Just(Outcome::Done), 2 => Just(Outcome::Retry), 1 => Just(Outcome::Dead)])
            .prop_map(|(nth, outcome)| Op::Finish { nth, outcome }),
    ];
    proptest::collection::vec(op, 1..40)
}

/// What the test knows of one delivery (one handler, so one per event).
#[derive(Debug, Clone)]
struct Delivery {
    key: usize,
    sequence: i64,
    /// Arrival order, which is also the store's id order.
    arrival: usize,
    state: &'static str,
}

struct Sim {
    inbox: Inbox,
    now_ms: i64,
    deliveries: BTreeMap<String, Delivery>,
    /// Event id → (delivery id, attempt) of what is leased now.
    running: BTreeMap<String, (i64, u32)>,
}

impl Sim {
    fn newest_done(&self, key: usize) -> Option<i64> {
        self.deliveries
            .values()
            .filter(|d| d.key == key && d.state == "done")
            .map(|d| d.sequence)
            .max()
    }

    async fn arrive(&mut self, key: usize, sequence: u8) {
        let n = self.deliveries.len();
        let event_id = format!("e{n}");
        let verified = Verifier::new(Scheme::None, Vec::new(), Duration::ZERO)
            .unwrap()
            .verify(HeaderMap::new(), Bytes::new(), UNIX_EPOCH)
            .unwrap();
        let envelope = Envelope {
            event_id: EventId::new(event_id.as_str()),
            event_type: "t".into(),
            ordering_key: Some(KEYS[key].into()),
            sequence: Some(sequence.into()),
        };
        self.inbox
            .accept(
                SourceName::new("s"),
                envelope,
                RawRequest::from_verified(verified, self.now_ms),
                vec![PluginName::new(HANDLER)],
                None,
            )
            .await
            .unwrap();
        self.deliveries.insert(
            event_id,
            Delivery {
                key,
                sequence: sequence.into(),
                arrival: n,
                state: "pending",
            },
        );
    }

    /// Claims, checks every lease against the rules, and learns which deliveries went stale.
    async fn claim(&mut self) -> Result<(), TestCaseError> {
        let before = self.deliveries.clone();
        let claimed = self
            .inbox
            .claim(fixtures::claim_request(self.now_ms, 8, &[(HANDLER, 8)]))
            .await
            .unwrap();
        let stored = self
            .inbox
            .list_events(EventFilter {
                limit: 10_000,
                ..EventFilter::default()
            })
            .await
            .unwrap();
        for event in stored {
            let state = event.states[HANDLER].clone();
            let d = self.deliveries.get_mut(&event.event_id).unwrap();
            if state == "stale" && d.state != "stale" {
                let done = before
                    .values()
                    .filter(|o| o.key == d.key && o.state == "done")
                    .map(|o| o.sequence)
                    .max();
                prop_assert!(
                    done.is_some_and(|done| done > d.sequence),
                    "{} (sequence {}) went stale, newest done {done:?}",
                    event.event_id,
                    d.sequence
                );
                d.state = "stale";
            }
        }
        for c in claimed {
            let id = c.event_id.to_string();
            let d = self.deliveries[&id].clone();
            prop_assert_eq!(c.sequence, Some(d.sequence as u64));
            // One at a time per key.
            let busy = self.running.keys().any(|r| self.deliveries[r].key == d.key);
            prop_assert!(!busy, "{id} leased while its key {} runs", KEYS[d.key]);
            // Never older than what is done for the key.
            if let Some(done) = self.newest_done(d.key) {
                prop_assert!(
                    d.sequence >= done,
                    "{id} seq {} runs after {done} was done",
                    d.sequence
                );
            }
            // The lowest open (sequence, arrival) of its key.
            let first = before
                .values()
                .filter(|o| o.key == d.key && matches!(o.state, "pending" | "retrying"))
                .filter(|o| self.deliveries[&format!("e{}", o.arrival)].state != "stale")
                .map(|o| (o.sequence, o.arrival))
                .min();
            prop_assert_eq!(
                first,
                Some((d.sequence, d.arrival)),
                "{} is not first in line",
                id
            );
            self.deliveries.get_mut(&id).unwrap().state = "running";
            self.running.insert(id, (c.delivery_id, c.attempt));
        }
        Ok(())
    }

    async fn finish(&mut self, nth: usize, outcome: Outcome) {
        if self.running.is_empty() {
            return;
        }
        let id = self
            .running
            .keys()
            .nth(nth % self.running.len())
            .unwrap()
            .clone();
        let (delivery_id, attempt) = self.running.remove(&id).unwrap();
        let (disposition, state) = match outcome {
            Outcome::Done => (Disposition::Done { output: None }, "done"),
            Outcome::Retry => (Disposition::RetryAt { at_ms: self.now_ms }, "retrying"),
            Outcome::Dead => (Disposition::Dead, "dead"),
        };
        let record = fixtures::record(delivery_id, attempt, HANDLER, disposition, self.now_ms);
        self.inbox.finish(record).await.unwrap();
        self.deliveries.get_mut(&id).unwrap().state = state;
    }
}

async fn run(db: &dyn Database, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut sim = Sim {
        inbox: fixtures::open(db).await,
        now_ms: 1_700_000_000_000,
        deliveries: BTreeMap::new(),
        running: BTreeMap::new(),
    };
    for op in ops {
        sim.now_ms += 1;
        match op {
            Op::Arrive { key, sequence } => sim.arrive(key, sequence).await,
            Op::Claim => sim.claim().await?,
            Op::Finish { nth, outcome } => sim.finish(nth, outcome).await,
        }
    }
    // Drain: everything still open runs to done, in order, until nothing is left due.
    loop {
        while !sim.running.is_empty() {
            sim.finish(0, Outcome::Done).await;
        }
        sim.now_ms += 1;
        let stale = |sim: &Sim| {
            sim.deliveries
                .values()
                .filter(|d| d.state == "stale")
                .count()
        };
        let before = stale(&sim);
        sim.claim().await?;
        // A claim that only marked the head of a key stale lets the next one move up.
        if sim.running.is_empty() && stale(&sim) == before {
            break;
        }
    }
    for (id, d) in &sim.deliveries {
        prop_assert!(
            matches!(d.state, "done" | "dead" | "stale"),
            "{id} ended {}",
            d.state
        );
        if d.state == "stale" {
            prop_assert!(sim.newest_done(d.key).is_some_and(|done| done > d.sequence));
        }
    }
    sim.inbox.close();
    Ok(())
}

/// Runs interleavings of [`ops`] (48 of them, shrunk on failure), each on a fresh database
/// from `fresh`, and checks every claim and the end state against the ordering rules. A
/// backend that is not available here (`fresh` gives none) is skipped.
pub(super) fn check<D: Database, F: Future<Output = Option<D>>>(fresh: impl Fn() -> F) {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let probe = runtime();
    if probe.block_on(fresh()).is_none() {
        return;
    }
    let config = proptest::test_runner::Config::with_cases(48);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let checked = runner.run(&ops(), |ops| {
        // A runtime per case, shut down before its database is dropped (see `on_fresh`).
        let runtime = runtime();
        let db = runtime
            .block_on(fresh())
            .expect("the backend was available a moment ago");
        let result = runtime.block_on(run(&db, ops));
        drop(runtime);
        drop(db);
        result
    });
    if let Err(e) = checked {
        panic!("{e}");
    }
}
