//! The contract's upgrade case: work a database held under the first schema goes on after every
//! migration since. Each backend makes the database as its first release left it
//! ([`Database::at_first_schema`], with [`FIRST_SCHEMA_ROWS`] in it: an event done, one waiting
//! behind it on its ordering key, one dead after a trap, a held quarantined request, a state
//! key), and the inbox opened on it, which migrates it, dedupes, claims, records, counts,
//! replays and prunes that work as if it had stored it itself.

use std::time::Duration;

use bytes::Bytes;

use super::{
    Database,
    fixtures::{
        self, HANDLER, accept, assert_backlog, claim, detail, done, keyed, state_of, state_writes,
    },
};
use crate::{
    clock::Clock,
    config::Retention,
    inbox::{Accepted, Finished, ReplayFilter},
    model::StateLimits,
};

/// What the first schema's rows hold, for the checks to compare with.
const DONE_BODY: &[u8] = b"{\"n\":1}";
const PENDING_BODY: &[u8] = b"{\"n\":2}";

/// Work in every state, as the first release stored it (its payloads in `events`, no usage
/// rows), of source `s` and handler `p` (the fixtures'), long ago (1970, in unix ms). Each
/// blob is written `decode('<hex>', 'hex')`, PostgreSQL's spelling; SQLite's room spells it
/// its own way.
const FIRST_SCHEMA_ROWS: &str = "
    INSERT INTO events (source, event_id, event_type, ordering_key, sequence, received_at,
                        headers, body)
    VALUES ('s', 'old-done', 't', 'k', 1, 1000, '[[\"x-old\",\"1\"]]',
            decode('7b226e223a317d', 'hex')),
           ('s', 'old-pending', 't', 'k', 2, 2000, '[[\"x-old\",\"2\"]]',
            decode('7b226e223a327d', 'hex')),
           ('s', 'old-dead', 't', NULL, NULL, 3000, '[]', decode('7b7d', 'hex'));
    INSERT INTO deliveries (event, source, handler, ordering_key, sequence, state, attempts,
                            next_attempt_at, output, last_error, updated_at)
    SELECT id, source, 'p', ordering_key, sequence,
           CASE event_id WHEN 'old-done' THEN 'done' WHEN 'old-pending' THEN 'pending'
                         ELSE 'dead' END,
           CASE event_id WHEN 'old-pending' THEN 0 ELSE 1 END,
           received_at,
           CASE event_id WHEN 'old-done' THEN '{\"ok\":true}' END,
           CASE event_id WHEN 'old-dead' THEN 'attempt 1 failed: trap' END,
           received_at + 500
    FROM events;
    INSERT INTO attempts (delivery, attempt, started_at, finished_at, outcome, error_kind, error,
                          plugin_sha256)
    SELECT d.id, 1, d.updated_at - 10, d.updated_at,
           CASE d.state WHEN 'done' THEN 'ok' ELSE 'trap' END,
           CASE d.state WHEN 'dead' THEN 'trap' END,
           CASE d.state WHEN 'dead' THEN 'attempt 1 failed: trap' END,
           'feed'
    FROM deliveries d WHERE d.state <> 'pending';
    INSERT INTO quarantine (source, received_at, headers, body, reason)
    VALUES ('s', 4000, '[]', decode('7b7d', 'hex'), 'parser trapped');
    INSERT INTO plugin_state (plugin, key, value, version)
    VALUES ('p', 'count', decode('0102', 'hex'), 3);
";

pub(super) async fn work_stored_under_the_first_schema_goes_on_after_every_migration(
    db: &dyn Database,
) {
    db.at_first_schema(FIRST_SCHEMA_ROWS).await;
    let inbox = fixtures::open(db).await;
    // What it counts at open, and what it dedupes.
    assert_backlog(&inbox, 1).await;
    assert_eq!(inbox.quarantine_held(), 1);
    assert_eq!(
        accept(&inbox, keyed("old-pending", "k", 2)).await,
        Accepted::Duplicate
    );
    // What the admin reads show of it.
    let old = detail(&inbox, "old-done").await;
    assert_eq!(
        (old.body, old.headers),
        (
            Bytes::from_static(DONE_BODY),
            vec![("x-old".into(), "1".into())]
        )
    );
    let delivery = &old.deliveries[0];
    assert_eq!(
        (delivery.state.as_str(), delivery.history.len()),
        ("done", 1)
    );
    let groups = inbox.dead_letter_groups().await.unwrap();
    assert_eq!(
        (
            groups.len(),
            groups[0].error_kind.as_deref(),
            groups[0].count
        ),
        (1, Some("trap"), 1)
    );
    // The delivery waiting behind its key's done sequence is claimed with its payload, and its
    // attempt commits a write to the old key at the version that key had.
    let claimed = claim(&inbox, Clock::system().now_ms()).await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(
        (claimed[0].event_id.as_str(), claimed[0].attempt),
        ("old-pending", 1)
    );
    assert_eq!(claimed[0].body, Bytes::from_static(PENDING_BODY));
    let writes = state_writes(&inbox, &[("count", Some(4))], StateLimits::DEFAULT);
    assert_eq!(writes.versions["count"], 3);
    assert_eq!(
        inbox.finish(done(&claimed[0], writes)).await.unwrap(),
        Finished::Recorded
    );
    let (value, version) = inbox.state_get_blocking(HANDLER, "count").unwrap();
    assert_eq!(value, Some(vec![7; 4]));
    assert!(version > 3, "versions go on past the old ones: {version}");
    // An older sequence of the key arriving now is stale; the dead one replays by its kind.
    accept(&inbox, keyed("late", "k", 1)).await;
    assert!(claim(&inbox, Clock::system().now_ms()).await.is_empty());
    assert_eq!(state_of(&inbox, "late").await, "stale");
    let traps = ReplayFilter {
        error_kind: Some("trap".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(inbox.replay(traps).await.unwrap(), (1, 1));
    assert_eq!(state_of(&inbox, "old-dead").await, "pending");
    // Retention prunes the old payload, kept in the event's own row, and the id still dedupes.
    let rules = Retention {
        done_after: Some(Duration::from_secs(3600)),
        dedupe_for: None,
        interval: Duration::from_secs(1),
        batch_size: 100,
    };
    assert_eq!(inbox.prune(&rules, None).await.unwrap().events, 1);
    let pruned = detail(&inbox, "old-done").await;
    assert!(
        pruned.pruned_at.is_some() && pruned.body.is_empty(),
        "{pruned:?}"
    );
    assert_eq!(
        accept(&inbox, keyed("old-done", "k", 1)).await,
        Accepted::Duplicate
    );
}
