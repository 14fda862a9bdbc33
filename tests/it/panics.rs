//! A handler that panics: the attempt's stored error (and the host's log line) starts with the
//! panic's location and message, read from the guest's stderr, and the delivery is retried up
//! to `max_attempts` like any trap.

use std::time::Duration;

use serde_json::json;

use crate::support::{AdminApi, ProcessHost, install_plugins, plugins, post_sw, sw_source};

const WAIT: Duration = Duration::from_secs(60);

/// `FILE:LINE:COL` of the indexing the `panicker` test plugin marks `PANICS HERE`, read from
/// its source: the location Rust reports for an out-of-bounds index, the file relative to the
/// workspace it was built in.
fn panic_location() -> String {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/plugins/panicker/src/lib.rs"
    ))
    .unwrap();
    let (line, text) = source
        .lines()
        .enumerate()
        .find(|(_, text)| text.contains("// PANICS HERE"))
        .expect("the marked line");
    let column = text.find("list[index]").expect("the indexing") + 1;
    format!("tests/plugins/panicker/src/lib.rs:{}:{column}", line + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_recorded_with_its_message_and_location_first_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("panicker", plugins::PANICKER)]);
    let config = sw_source(
        "s",
        &["panicker"],
        "[plugins.panicker]\nmax_attempts = 3\nbackoff_base_ms = 10\nbackoff_max_ms = 20",
    );
    let host = ProcessHost::start(dir.path(), &config).await;
    let post = async |id: &str, index: u64| {
        let body = json!({ "index": index }).to_string();
        let (status, reply) = post_sw(host.ingest, "s", id, body.as_bytes())
            .await
            .unwrap();
        assert_eq!(status, http::StatusCode::ACCEPTED, "{id}: {reply}");
    };
    post("boom", 7).await;

    let delivery = host.wait_state("s", "boom", "panicker", "dead", WAIT).await;
    let expected = format!(
        "panicked at {}: index out of bounds: the len is 3 but the index is 7",
        panic_location()
    );
    let history = delivery["history"].as_array().unwrap();
    assert_eq!(history.len(), 3, "retried up to max_attempts: {delivery:#}");
    for attempt in history {
        assert_eq!(attempt["outcome"], "trap", "{delivery:#}");
        let error = attempt["error"].as_str().unwrap();
        assert!(
            error.starts_with(&expected),
            "want {expected:?} first: {error}"
        );
        assert!(
            error.contains("unreachable (the guest panicked or aborted)"),
            "the trap follows the panic: {error}"
        );
        // The stored backtrace starts at the plugin's own code (its handler, inlined into the
        // export): no panic machinery.
        let frames = error
            .split_once(" | at ")
            .map(|(_, f)| f)
            .unwrap_or_default();
        let first = frames.split(" <- ").next().unwrap_or_default();
        assert!(
            first.contains("handle"),
            "the plugin's frame first: {error}"
        );
        for machinery in ["core::", "std::", "__rustc", "rust_begin_unwind", "abort"] {
            assert!(!frames.contains(machinery), "{machinery} kept: {error}");
        }
        // What the plugin wrote to stderr before panicking is not part of the error.
        assert!(!error.contains("looking up index"), "{error}");
    }
    let last = delivery["last_error"].as_str().unwrap();
    // `last_error` names the outcome, then the same error.
    assert!(last.starts_with(&format!("trap: {expected}")), "{last}");

    // The host's log line for the attempt says the same.
    host.wait_log(&expected, WAIT).await;

    // An event that does not panic is handled; its stderr output goes nowhere.
    post("fine", 1).await;
    let delivery = host.wait_state("s", "fine", "panicker", "done", WAIT).await;
    assert_eq!(delivery["output"], "20", "{delivery:#}");
    assert!(
        !host.log().contains("looking up index"),
        "stderr of a call reached the log"
    );
}
