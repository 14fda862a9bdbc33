//! The storage contract's test suite, run against every backend: each case is written once,
//! against the [`Inbox`] façade, and [`suite!`] makes it one test per backend (SQLite, and
//! PostgreSQL where a server is given, directly and through PgBouncer in transaction mode:
//! `postgres/testdb.rs`).
//!
//! Invariants:
//! - A case sees the backend only through [`Database`]: a fresh, empty database it opens
//!   inboxes on (a backend that is not available here makes none, and its cases pass as
//!   skipped, saying so), or makes what the backend's first release left (`upgrade.rs`, whose
//!   rows are the one SQL text outside the backends' rooms: test data both first schemas take). What only one backend has (SQLite's writer, lock file, pragmas, migrations)
//!   is tested in that backend's room instead.
//! - A case that is written but not listed in [`suite!`] is dead code, which the lints refuse,
//!   so no case is left out of a backend's run.

mod cases;
pub(super) mod fixtures;
mod ordering;
mod retention;
mod state;
mod upgrade;

use super::Inbox;
use crate::clock::Clock;

/// A fresh, empty database of one backend, for one test.
#[async_trait::async_trait]
pub(super) trait Database: Send + Sync {
    /// Opens the inbox on this database (again, after a close), stamping times with `clock`.
    async fn open(&self, clock: Clock) -> Inbox;

    /// Makes this fresh database what this backend's first release left: its first schema,
    /// recorded as such, holding `rows` (SQL in PostgreSQL's spelling; a blob is
    /// `decode('<hex>', 'hex')`).
    async fn at_first_schema(&self, rows: &str);

    /// Runs `sql` (PostgreSQL's spelling, which SQLite shares for it) on the database beside
    /// the inbox open on it: a hand repair.
    async fn repair(&self, sql: &str);
}

/// Runs `case` on a fresh database (none: skipped) in a runtime of its own built by `runtime`,
/// which is shut down before the database is dropped: a connection the inbox was still opening
/// then closes, instead of holding the drop until the server's `authentication_timeout`.
fn on_fresh<D: Database, F: Future<Output = Option<D>>>(
    runtime: &mut tokio::runtime::Builder,
    fresh: impl Fn() -> F,
    case: impl AsyncFnOnce(&dyn Database),
) {
    let runtime = runtime.enable_all().build().unwrap();
    let Some(db) = runtime.block_on(fresh()) else {
        return;
    };
    runtime.block_on(case(&db));
    drop(runtime);
    drop(db);
}

/// One test per case for the backend whose fresh [`Database`] `$fresh().await` makes (`None`:
/// skipped), in module `$backend`. The cases that read plugin state through the blocking reads
/// run on the multi-thread runtime (a backend may block in place, as under the handler pool);
/// the rest on the current-thread one (the paused clock needs it). `single_node` lists the
/// cases of what only a [`single_node`](super::store::Capabilities) store promises, run for the
/// backends that make that promise; `notices`, those of a store whose nodes hear each other's
/// notices of work (not through a pooler in transaction mode, where they find it by polling).
macro_rules! suite {
    ($backend:ident = $fresh:path;
        single_node: [$($single:ident,)*] notices: [$($notice:ident,)*]) => {
        suite!(@cases $backend = $fresh;
            threaded: [
                a_conflicted_attempt_applies_none_of_its_writes,
                the_commit_refuses_writes_that_take_the_plugin_over_its_total,
                work_stored_under_the_first_schema_goes_on_after_every_migration,
                of_concurrent_accepts_of_one_body_under_many_ids_one_is_new,
            ]
            current: [
            a_later_sequence_waits_for_its_head,
            a_running_head_blocks_its_key,
            a_head_waiting_for_its_retry_blocks_its_key,
            another_key_is_not_blocked_by_a_running_head,
            what_waits_behind_a_long_backlog_of_a_running_key_is_claimed,
            an_older_sequence_than_one_done_is_never_claimed,
            an_older_sequence_than_one_done_becomes_stale,
            a_handler_delivering_stale_events_is_given_the_older_one_marked,
            a_fresh_delivery_is_not_marked_stale,
            a_forced_replay_delivers_a_stale_delivery_and_a_plain_one_does_not,
            a_stale_delivery_leaves_the_backlog,
            a_claim_that_marked_a_head_stale_wakes_the_dispatcher,
            a_done_delivery_replayed_into_a_dead_end_still_makes_older_ones_stale,
            the_second_of_two_attempts_writing_one_key_conflicts,
            a_conflicted_attempt_runs_again_without_using_its_budget,
            an_attempt_given_back_runs_again_without_using_its_budget,
            a_replay_gives_a_fresh_attempt_budget,
            a_replay_touches_at_most_its_limit,
            a_replay_takes_only_the_handlers_it_is_limited_to,
            a_dry_run_replays_nothing,
            replaying_a_pending_or_running_state_is_an_invalid_filter,
            a_retrying_delivery_replayed_is_due_now_with_its_budget,
            a_replayed_delivery_is_due_at_the_inbox_clocks_now,
            an_expired_lease_returns_to_due,
            a_live_lease_is_not_reclaimed,
            a_reclaimed_attempt_is_recorded_as_abandoned,
            a_result_after_its_lease_was_reclaimed_is_discarded,
            a_late_result_beside_the_running_leases_result_is_not_recorded,
            a_second_accept_of_one_event_is_a_duplicate,
            a_body_stored_under_another_id_is_a_duplicate_where_the_source_says,
            a_duplicate_adds_no_delivery,
            quarantine_is_bounded_by_max_held,
            accepting_from_quarantine_resolves_the_request,
            a_duplicate_from_quarantine_still_resolves_the_request,
            a_body_duplicate_from_quarantine_resolves_the_request_and_stores_nothing,
            a_quarantined_request_leaves_quarantine_once,
            a_recount_after_resolving_frees_the_quarantine_slot,
            a_resolved_request_is_no_longer_held,
            list_events_shows_every_handlers_state,
            list_events_is_newest_first_and_limited,
            the_backlog_is_recounted_from_the_database_at_open,
            held_quarantine_is_recounted_from_the_database_at_open,
            the_next_due_time_is_the_earliest_retry_after_now,
            the_oldest_due_is_the_longest_waiting_due_delivery,
            a_finished_event_keeps_its_payload_until_done_after,
            a_pruned_event_keeps_its_id_and_states_but_not_its_payload,
            a_pruned_event_still_dedupes,
            an_older_sequence_is_still_stale_after_the_newer_one_was_pruned,
            a_pruned_id_is_forgotten_after_dedupe_for,
            dead_deliveries_and_held_quarantine_are_never_pruned,
            an_event_is_pruned_only_once_every_delivery_is_finished,
            a_pruned_event_is_not_replayed,
            pruning_walks_in_batches_of_batch_size,
            a_discarded_delivery_is_pruned_like_finished_work,
            discard_takes_only_dead_deliveries,
            the_waiting_deliveries_of_an_orphaned_handler_can_be_discarded,
            a_discarded_quarantined_request_is_resolved_then_deleted,
            list_events_filters_by_type_id_source_and_time,
            list_events_pages_by_cursor_without_gaps_or_repeats,
            list_events_by_state_finds_a_rare_state_newest_first,
            an_event_detail_carries_its_headers_and_body,
            dead_letters_are_grouped_by_handler_and_error_kind,
            a_replay_by_error_kind_takes_only_that_group,
            held_requests_are_listed_newest_first_with_their_reason,
            state_keys_are_listed_by_prefix_a_page_at_a_time,
            an_edit_commits_only_at_the_version_it_expects,
            an_edit_makes_an_attempt_that_read_the_key_run_again,
            an_edit_over_the_plugins_total_writes_nothing,
            text_with_a_nul_is_kept_escaped_and_a_name_with_one_matches_nothing,
            an_open_database_is_ready,
            a_resent_conflict_never_meets_the_next_lease,
            once_done_then_discarded_and_pruned_still_makes_older_stale,
            a_request_accepted_from_quarantine_is_kept_from_its_resolution,
            a_lease_without_its_start_is_taken_back,
            $($single,)*
            $($notice,)*
            ]
        );
    };
    (@cases $backend:ident = $fresh:path;
        threaded: [$($threaded:ident,)*] current: [$($case:ident,)*]) => {
        mod $backend {
            $(
                #[test]
                fn $threaded() {
                    let mut runtime = tokio::runtime::Builder::new_multi_thread();
                    super::on_fresh(runtime.worker_threads(2), $fresh, super::cases::$threaded);
                }
            )*
            $(
                #[test]
                fn $case() {
                    let mut runtime = tokio::runtime::Builder::new_current_thread();
                    super::on_fresh(&mut runtime, $fresh, super::cases::$case);
                }
            )*

            #[test]
            fn ordering_holds_for_any_interleaving() {
                super::ordering::check($fresh);
            }
        }
    };
}

suite!(sqlite = crate::inbox::sqlite::TempDatabase::fresh;
    single_node: [startup_reclaim_takes_every_lease,]
    notices: [a_notice_of_work_wakes_whoever_waits_for_work,]);
suite!(postgres = crate::inbox::postgres::TestDatabase::fresh;
    single_node: [] notices: [a_notice_of_work_wakes_whoever_waits_for_work,]);
suite!(postgres_pooled = crate::inbox::postgres::TestDatabase::behind_pooler;
    single_node: [] notices: []);
