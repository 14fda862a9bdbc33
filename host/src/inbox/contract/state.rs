//! The contract's cases of an operator's view of plugin state: listing keys by prefix a page at
//! a time, reading one, and edits that commit only at the version they expect, count against
//! the plugin's totals, and make an attempt that read the key before them conflict and run
//! again, as another delivery's write would.

use super::{
    Database,
    fixtures::{self, HANDLER, LEASED_MS, claim, done, lease},
};
use crate::{
    ids::PluginName,
    inbox::{Edited, Finished, Inbox, StateEdit, StateKeyFilter},
    model::{StateChanges, StateLimits},
};

/// Sets (`Some`) or deletes (`None`) `key` of `plugin` if it is at version `expected`.
async fn edit_of(
    inbox: &Inbox,
    plugin: &str,
    key: &str,
    expected: i64,
    value: Option<&[u8]>,
    limits: StateLimits,
) -> Edited {
    let edit = StateEdit {
        plugin: PluginName::new(plugin),
        key: key.to_owned(),
        expected,
        value: value.map(<[u8]>::to_vec),
        limits,
    };
    inbox.edit_state(edit).await.unwrap()
}

/// [`edit_of`] of [`HANDLER`] under the default limits.
async fn edit(inbox: &Inbox, key: &str, expected: i64, value: Option<&[u8]>) -> Edited {
    edit_of(inbox, HANDLER, key, expected, value, StateLimits::DEFAULT).await
}

/// The version an edit committed (panics if it did not).
fn written(edited: Edited) -> i64 {
    match edited {
        Edited::Written { version } => version,
        other => panic!("not written: {other:?}"),
    }
}

/// The keys of a page of [`HANDLER`]'s state.
async fn page(inbox: &Inbox, prefix: &str, after: Option<&str>, limit: usize) -> Vec<String> {
    let filter = StateKeyFilter {
        prefix: prefix.to_owned(),
        after: after.map(str::to_owned),
        limit,
    };
    let entries = inbox.state_keys(HANDLER, filter).await.unwrap();
    entries.into_iter().map(|e| e.key).collect()
}

pub(super) async fn state_keys_are_listed_by_prefix_a_page_at_a_time(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    for key in [
        "count0",
        "count/b",
        "count/a",
        "count/\u{10FFFF}",
        "a",
        "count",
        "é",
    ] {
        written(edit(&inbox, key, 0, Some(key.as_bytes())).await);
    }
    written(
        edit_of(
            &inbox,
            "other",
            "count/c",
            0,
            Some(b"1"),
            StateLimits::DEFAULT,
        )
        .await,
    );

    // Byte order, every key of this plugin only.
    assert_eq!(
        page(&inbox, "", None, 100).await,
        [
            "a",
            "count",
            "count/a",
            "count/b",
            "count/\u{10FFFF}",
            "count0",
            "é"
        ]
    );
    // A prefix, two at a time, resumed after the last key of each page.
    assert_eq!(
        page(&inbox, "count/", None, 2).await,
        ["count/a", "count/b"]
    );
    assert_eq!(
        page(&inbox, "count/", Some("count/b"), 2).await,
        ["count/\u{10FFFF}"]
    );
    assert!(
        page(&inbox, "count/", Some("count/\u{10FFFF}"), 2)
            .await
            .is_empty()
    );
    assert!(page(&inbox, "nothing", None, 2).await.is_empty());

    // Each with its value's size, its version and when it was written.
    let filter = StateKeyFilter {
        prefix: "count/a".into(),
        limit: 10,
        ..Default::default()
    };
    let listed = inbox.state_keys(HANDLER, filter).await.unwrap();
    let value = inbox
        .state_value(HANDLER, "count/a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].size, listed[0].version, listed[0].updated_at_ms),
        (7, value.version, value.updated_at_ms)
    );
    assert!(value.updated_at_ms.is_some_and(|at| at > 0), "{value:?}");
    assert_eq!(value.value, b"count/a");
}

pub(super) async fn an_edit_commits_only_at_the_version_it_expects(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let v1 = written(edit(&inbox, "k", 0, Some(b"1")).await);
    assert!(v1 > 0, "{v1}");
    // Creating a key that exists, or writing at a version it no longer has, writes nothing.
    assert_eq!(
        edit(&inbox, "k", 0, Some(b"x")).await,
        Edited::Changed { now: v1 }
    );
    let v2 = written(edit(&inbox, "k", v1, Some(b"2")).await);
    assert!(v2 > v1, "{v2} > {v1}");
    assert_eq!(
        edit(&inbox, "k", v1, Some(b"x")).await,
        Edited::Changed { now: v2 }
    );
    let stored = inbox.state_value(HANDLER, "k").await.unwrap().unwrap();
    assert_eq!((stored.value.as_slice(), stored.version), (&b"2"[..], v2));

    // A delete at a stale version is refused too; at the current one the key goes.
    assert_eq!(
        edit(&inbox, "k", v1, None).await,
        Edited::Changed { now: v2 }
    );
    assert_eq!(written(edit(&inbox, "k", v2, None).await), 0);
    assert_eq!(inbox.state_value(HANDLER, "k").await.unwrap(), None);
    assert_eq!(
        edit(&inbox, "k", v2, None).await,
        Edited::Changed { now: 0 }
    );
    // Re-created, it gets a version no reader of the old key saw.
    let v3 = written(edit(&inbox, "k", 0, Some(b"3")).await);
    assert!(v3 > v2, "{v3} > {v2}");
}

pub(super) async fn an_edit_makes_an_attempt_that_read_the_key_run_again(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let v1 = written(edit(&inbox, "count", 0, Some(b"1")).await);
    // The attempt reads `count` at v1 (and `fresh` absent) and will write both...
    let a = lease(&inbox, "a").await;
    let reads = StateChanges {
        versions: [("count".to_owned(), v1), ("fresh".to_owned(), 0)].into(),
        writes: [
            ("count".to_owned(), Some(b"2".to_vec())),
            ("fresh".to_owned(), Some(b"y".to_vec())),
        ]
        .into(),
        ..Default::default()
    };
    // ...while an operator sets it to 10.
    let v2 = written(edit(&inbox, "count", v1, Some(b"10")).await);
    assert_eq!(
        inbox.finish(done(&a, reads.clone())).await.unwrap(),
        Finished::Conflict
    );
    let stored = inbox.state_value(HANDLER, "count").await.unwrap().unwrap();
    assert_eq!((stored.value.as_slice(), stored.version), (&b"10"[..], v2));
    assert_eq!(inbox.state_value(HANDLER, "fresh").await.unwrap(), None);
    // It runs again, its budget kept, as after any conflict.
    let again = claim(&inbox, LEASED_MS + 5).await.remove(0);
    assert_eq!(
        (again.event_id.as_str(), again.attempt, again.budget_used),
        ("a", 2, 1)
    );

    // An attempt that read a key absent conflicts with an operator creating it.
    let reread = StateChanges {
        versions: [("count".to_owned(), v2), ("fresh".to_owned(), 0)].into(),
        ..reads
    };
    written(edit(&inbox, "fresh", 0, Some(b"z")).await);
    assert_eq!(
        inbox.finish(done(&again, reread)).await.unwrap(),
        Finished::Conflict
    );
}

pub(super) async fn an_edit_over_the_plugins_total_writes_nothing(db: &dyn Database) {
    let inbox = fixtures::open(db).await;
    let limits = StateLimits {
        max_keys: 1,
        max_bytes: 100,
        ..StateLimits::DEFAULT
    };
    let v1 = written(edit_of(&inbox, HANDLER, "a", 0, Some(b"1"), limits).await);
    let refused = edit_of(&inbox, HANDLER, "b", 0, Some(b"1"), limits).await;
    assert!(
        matches!(&refused, Edited::OverQuota(m) if m.contains("plugins.p.state_max_keys = 1")),
        "{refused:?}"
    );
    let refused = edit_of(&inbox, HANDLER, "a", v1, Some(&[0; 200]), limits).await;
    assert!(
        matches!(&refused, Edited::OverQuota(m) if m.contains("state_max_mib")),
        "{refused:?}"
    );
    assert_eq!(page(&inbox, "", None, 10).await, ["a"]);
    let stored = inbox.state_value(HANDLER, "a").await.unwrap().unwrap();
    assert_eq!((stored.value.as_slice(), stored.version), (&b"1"[..], v1));
    // Replacing the one key within the totals is no new key.
    written(edit_of(&inbox, HANDLER, "a", v1, Some(b"22"), limits).await);
}
