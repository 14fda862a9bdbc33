//! The storage contract: what every inbox backend provides, in backend-neutral types.
//!
//! The [`Inbox`](super::Inbox) façade holds one `Arc<dyn Store>` and keeps, beside it, what does
//! not depend on the backend: the backlog and quarantine counters its bounds read on every
//! request, the wake-up of the dispatcher, and the clock. Those are in-process, so they are
//! exact only while one process uses the database; a backend shared by several nodes would
//! sample them from the database and wake through it instead, and they would move behind this
//! trait then. The operations here are each one transition (or one read) of the stored rows;
//! the SQLite room (`sqlite/`, one process per database) and the PostgreSQL room
//! (`postgres/`, shared by several nodes) implement them, and the contract suite
//! (`contract/`) is run against each.
//!
//! Invariants (each implementation keeps them; the contract suite checks them):
//! - A write is answered only once it is durable (committed).
//! - `(source, event_id)` is unique, decided by the database, never by a check-then-insert.
//! - Each operation is one transition: its rows change together or not at all.
//! - Only an implementation names its storage engine; nothing here does.

use super::{
    Accepted, ClaimRequest, Claimed, Commits, DeadLetterGroup, EventDetail, EventFilter,
    EventSummary, Finish, Finished, HeldRequest, InboxError, Pruned, Quarantined, RawRequest,
    ReplayFilter,
    retention::PruneBatch,
    state::{Edited, StateEdit, StateEntry, StateKeyFilter, StateValue},
};
use crate::{
    ids::{PluginName, SourceName},
    model::{DeliveryState, Disposition, Envelope, StateUsage},
};

/// What one accept stores: an event, one pending delivery per handler, and (when it comes from
/// quarantine) the quarantined request it resolves.
#[derive(Debug)]
pub(crate) struct NewEvent {
    pub source: SourceName,
    pub envelope: Envelope,
    pub request: RawRequest,
    pub handlers: Vec<PluginName>,
    /// The SHA-256 of the request's body when its source dedupes by body too
    /// (`dedupe_body`): an event with this digest stored for the source makes it a duplicate,
    /// as its `(source, event_id)` does.
    pub body_sha256: Option<[u8; 32]>,
    /// The quarantined request this event was parsed from: resolved in the same transition,
    /// also when the event is a duplicate.
    pub from_quarantine: Option<i64>,
    /// When the accept happens, by the inbox's clock: the time `from_quarantine` is resolved
    /// at, which retention's `done_after` counts from (the request's own time is when it was
    /// received, maybe long ago).
    pub now_ms: i64,
}

/// What one claim did: the deliveries it leased, and how many it found stale on the way (they
/// left the backlog).
#[derive(Debug, Default)]
pub(crate) struct ClaimOutcome {
    pub leased: Vec<Claimed>,
    pub stale: usize,
}

/// What one reclaim did: the leases it took back, and how many of those deliveries it closed
/// (dead instead of due again: they left the backlog), in all and per handler.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Reclaimed {
    pub taken_back: usize,
    pub closed: usize,
    /// Handler → (leases taken back, deliveries closed).
    pub by_handler: std::collections::BTreeMap<String, (usize, usize)>,
}

impl Reclaimed {
    /// What recording `abandoned` (each a lease taken back) does: a backend builds it from
    /// the finishes of the run that commits (a job run again after a failed batch counts once).
    pub(crate) fn of(abandoned: &[super::Finish]) -> Self {
        let mut reclaimed = Self {
            taken_back: abandoned.len(),
            ..Self::default()
        };
        for finish in abandoned {
            let closes = usize::from(finish.closes());
            reclaimed.closed += closes;
            let handler = reclaimed
                .by_handler
                .entry(finish.plugin.to_string())
                .or_default();
            handler.0 += 1;
            handler.1 += closes;
        }
        reclaimed
    }
}

/// Where a delivery whose lease is taken back goes next: `decide(handler, budget_used)`.
pub(crate) type Decide = Box<dyn Fn(&str, u32) -> Disposition + Send>;

/// The inbox's counters as the stored rows have them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Deliveries in an open state (`DeliveryState::OPEN`).
    pub backlog: i64,
    /// Quarantined requests not yet resolved.
    pub quarantined: i64,
}

/// What a backend can promise beyond the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// No other process can use the database while this one has it open, so every lease in it
    /// is this process's, or a previous process's: [`Store::reclaim_all`] is sound.
    pub single_node: bool,
    /// A state read sees the writes of attempts whose commit is queued but not done yet (and
    /// their versions, so a commit that reads one is checked against it): attempts on one key
    /// can follow each other without waiting for each commit.
    pub reads_queued_state: bool,
}

/// The operations of one storage backend. Times are given by the caller (the façade's clock),
/// never read by the backend.
#[async_trait::async_trait]
pub(crate) trait Store: Send + Sync + 'static {
    /// What this backend promises beyond the contract.
    fn capabilities(&self) -> Capabilities;

    /// The counters as stored: read when the inbox opens, and cheap enough to sample (two
    /// counts) where other nodes change them.
    async fn counts(&self) -> Result<Counts, InboxError>;

    /// Stores the event and its deliveries unless `(source, event_id)` is stored
    /// ([`Accepted::Duplicate`]: nothing new written), resolving `from_quarantine` either way;
    /// but if that request is no longer held ([`Accepted::AlreadyResolved`]), writes nothing.
    /// A backend other processes share tells them of the new deliveries itself, when the
    /// transaction holding them commits (not with [`Store::notify_work`], a transaction of its
    /// own).
    async fn accept(&self, event: NewEvent) -> Result<Accepted, InboxError>;

    /// Whether `(source, event_id)` is stored.
    async fn contains_event(&self, source: String, event_id: String) -> Result<bool, InboxError>;

    /// Answers once the database answers a trivial read (readiness: `GET /readyz`).
    async fn ping(&self) -> Result<(), InboxError>;

    /// Keeps a verified request whose envelope could not be produced; returns its id.
    async fn quarantine(
        &self,
        source: SourceName,
        request: RawRequest,
        reason: String,
    ) -> Result<i64, InboxError>;

    /// Marks quarantined request `id` resolved at `at_ms`, saying how, if it is still held;
    /// returns whether it was (`false`: a concurrent replay or discard resolved it first).
    async fn resolve_quarantine(
        &self,
        id: i64,
        at_ms: i64,
        resolution: String,
    ) -> Result<bool, InboxError>;

    /// Ids of the unresolved quarantined requests matching `filter`'s source and time range
    /// (at most `filter.limit`, oldest first), read without their bodies.
    async fn held_quarantine_ids(&self, filter: ReplayFilter) -> Result<Vec<i64>, InboxError>;

    /// Quarantined request `id` with its body, if it is still unresolved.
    async fn held_quarantined(&self, id: i64) -> Result<Option<Quarantined>, InboxError>;

    /// Quarantined requests not yet resolved.
    async fn quarantine_held_count(&self) -> Result<i64, InboxError>;

    /// Leases due deliveries: per `(source, ordering_key, handler)` only the earliest open one
    /// (by sequence, then arrival), and only while none of its key runs; a candidate older than
    /// a delivery already done for its key is marked `stale` instead. The attempt is counted
    /// when leased (the lease token is the attempt number). A backend whose writes can run
    /// concurrently must make the head check and the lease one exclusive step.
    async fn claim(&self, request: ClaimRequest) -> Result<ClaimOutcome, InboxError>;

    /// Records a finished attempt and moves its delivery on, in one transition, if its lease
    /// is still held ([`Finished::LeaseLost`] otherwise); its state writes are applied only if
    /// nothing it read changed ([`Finished::Conflict`]) and they fit the plugin's total
    /// ([`Finished::OverQuota`]). A backend other processes share tells them of it itself, when
    /// the finish commits (the delivery's key may have a next delivery to run now).
    async fn finish(&self, finish: Finish) -> Result<Finished, InboxError>;

    /// Takes back the leases that expired before `now_ms`, recording each attempt as
    /// `abandoned` at `now_ms` and moving its delivery where `decide` says.
    async fn reclaim_expired(&self, now_ms: i64, decide: Decide) -> Result<Reclaimed, InboxError>;

    /// [`Store::reclaim_expired`] for every lease, live or not: only sound while no other
    /// process can hold one, so the façade calls it only when
    /// [`Capabilities::single_node`] holds.
    async fn reclaim_all(&self, now_ms: i64, decide: Decide) -> Result<Reclaimed, InboxError>;

    /// Sets the deliveries `filter` matches due at `now_ms` (none on a dry run): finished ones
    /// with a fresh attempt budget, passing over those of pruned events (they have no body),
    /// retrying ones with the budget they have (unless due earlier already); returns
    /// `(matched, replayed)`. `pending` or `running` in the filter is
    /// [`InboxError::InvalidFilter`].
    async fn replay(&self, filter: ReplayFilter, now_ms: i64)
    -> Result<(usize, usize), InboxError>;

    /// One batch of retention: walks up to `batch.limit` events not yet pruned from
    /// `batch.after` (in `(received_at, id)` order, received before `batch.finished_before`)
    /// and prunes those whose deliveries are all finished since before it (payload, outputs,
    /// errors and attempts go; the event and delivery rows stay, `pruned_at` stamped); forgets
    /// up to `limit` events pruned before `batch.forget_before`; deletes up to `limit`
    /// quarantined requests resolved before `batch.finished_before`. One short transaction; on
    /// a store several nodes share, a batch while another node runs one is [`Pruned::busy`].
    async fn prune(&self, batch: PruneBatch) -> Result<Pruned, InboxError>;

    /// Sets the `dead` deliveries `filter` matches (at most `filter.limit`, those of pruned
    /// events never) to `discarded` at `now_ms` (none on a dry run); returns
    /// `(matched, discarded)`.
    async fn discard(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError>;

    /// Resolves the held quarantined requests of `filter`'s source and time range (at most
    /// `filter.limit`) as discarded at `now_ms` (none on a dry run); returns
    /// `(matched, discarded)`.
    async fn discard_quarantine(
        &self,
        filter: ReplayFilter,
        now_ms: i64,
    ) -> Result<(usize, usize), InboxError>;

    /// The earliest time after `after_ms` at which a pending or retrying delivery falls due.
    async fn next_due_after(&self, after_ms: i64) -> Result<Option<i64>, InboxError>;

    /// When the waiting delivery (pending or retrying) due longest ago became due, if one is
    /// due at `now_ms`: how far dispatch lags (`hookd_oldest_due_seconds`).
    async fn oldest_due(&self, now_ms: i64) -> Result<Option<i64>, InboxError>;

    /// Committed value and version of a state key (version 0 = never written), or, on a store
    /// that [`reads_queued_state`](Capabilities::reads_queued_state), those of its newest
    /// write whose commit is queued. Blocking: the runtime's `state.get` host call is
    /// synchronous.
    fn state_get_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, i64), InboxError>;

    /// Bytes `key` holds (key + value; `None` = absent) and its version, without its value.
    fn state_stat_blocking(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<(Option<u64>, i64), InboxError>;

    /// What `plugin` holds in committed state.
    fn state_usage_blocking(&self, plugin: &str) -> Result<StateUsage, InboxError>;

    /// A page of `plugin`'s state keys in byte order: those starting with `filter.prefix`,
    /// after `filter.after`, at most `filter.limit`; one range of the `(plugin, key)` order.
    async fn state_keys(
        &self,
        plugin: String,
        filter: StateKeyFilter,
    ) -> Result<Vec<StateEntry>, InboxError>;

    /// `plugin`'s committed value of `key`, if it has one.
    async fn state_value(
        &self,
        plugin: String,
        key: String,
    ) -> Result<Option<StateValue>, InboxError>;

    /// Commits an operator's edit at `now_ms` if its key is still at the version it expects,
    /// as one state commit: the version comes from the clock attempts' commits use, under the
    /// same ordering with them (a commit that checks the key's version either sees the edit or
    /// is seen by it).
    async fn edit_state(&self, edit: StateEdit, now_ms: i64) -> Result<Edited, InboxError>;

    /// Events matching `filter`, newest first (by [`EventSummary::cursor`], descending), with
    /// each handler's delivery state; a page costs index range scans, not a scan of every
    /// event.
    async fn list_events(&self, filter: EventFilter) -> Result<Vec<EventSummary>, InboxError>;

    /// One event with every delivery and its full attempt history.
    async fn event_detail(
        &self,
        source: String,
        event_id: String,
    ) -> Result<Option<EventDetail>, InboxError>;

    /// Deliveries in each of `states` (a state without any may be left out), each counted
    /// through an index on the state, so counting the open states costs the backlog's size,
    /// not the table's.
    async fn state_counts(
        &self,
        states: Vec<DeliveryState>,
    ) -> Result<Vec<(String, i64)>, InboxError>;

    /// Dead deliveries grouped by handler and their last attempt's `error_kind`, largest group
    /// first (then by handler and kind).
    async fn dead_letter_groups(&self) -> Result<Vec<DeadLetterGroup>, InboxError>;

    /// Unresolved quarantined requests, newest first, at most `limit`, with ids below
    /// `before_id` when given; read without their headers and bodies.
    async fn held_requests(
        &self,
        limit: usize,
        before_id: Option<i64>,
    ) -> Result<Vec<HeldRequest>, InboxError>;

    /// Tells every process on this database that work may be due (after a commit that made
    /// some): a shared backend through the database, so other nodes hear it; a backend no other
    /// process uses, in process.
    async fn notify_work(&self) -> Result<(), InboxError>;

    /// Resolves at the next [`Store::notify_work`] of any process on this database (or at once,
    /// for one made while nobody waited).
    async fn work_notified(&self);

    /// The write transactions this store committed (`hookd_inbox_commits_total`), and their
    /// observer.
    fn commits(&self) -> &Commits;

    /// Finishes the writes already queued, then refuses new ones and releases the database.
    fn close(&self);
}

#[cfg(test)]
mod tests {
    use super::Reclaimed;
    use crate::{inbox::Finish, model::Disposition};

    /// Counted from the finishes a run records, per handler: leases taken back, and the
    /// deliveries closed (dead) rather than due again.
    #[test]
    fn a_reclaim_counts_what_it_took_back_per_handler() {
        let abandoned =
            |id, handler, disposition| Finish::abandoned(id, handler, 1, Some(0), 10, disposition);
        let reclaimed = Reclaimed::of(&[
            abandoned(1, "a", Disposition::RetryAt { at_ms: 20 }),
            abandoned(2, "a", Disposition::Dead),
            abandoned(3, "b", Disposition::RetryAt { at_ms: 20 }),
        ]);
        assert_eq!((reclaimed.taken_back, reclaimed.closed), (3, 1));
        assert_eq!(
            reclaimed.by_handler,
            [("a".to_owned(), (2, 1)), ("b".to_owned(), (1, 0))].into()
        );
    }
}
