//! Test plugin: a handler that hoards plugin state, or gives an oversized, hostile reason.
//!
//! What it does comes from its instance's `config` table, each value overridable per event by
//! the same field in the event's JSON body:
//!
//! - `keys` (default 1) and `value_bytes` (default 1024): set keys `{prefix}/0` …
//!   `{prefix}/{keys - 1}`, each to `value_bytes` bytes; `prefix` defaults to the event id, so
//!   every event adds new keys;
//! - `delete = true`: delete those keys instead;
//! - `reads` (default 0): first read keys `{prefix}/r0` … `{prefix}/r{reads - 1}` (absent ones);
//! - `log`: first log this text verbatim (control characters and all);
//! - `reason_bytes`: after the writes, fail permanently with a reason of that many bytes that
//!   starts with a forged log line (`\n… ERROR …`) and a terminal escape sequence.
//!
//! Otherwise it succeeds with `{"written": N}`. The host must refuse writes over the instance's
//! state limits with an error naming the limit, and store and log reasons capped and escaped.

use plugin_sdk::{Event, HandleError, Handler, config, log, output, state};
use serde::Deserialize;

/// How a hostile reason starts: a forged host log line, then a terminal "clear screen".
const FORGED: &str = "hoarder gives up\n2026-01-01T00:00:00Z ERROR hookd: forged line\x1b[2J";

/// Per-event overrides of the instance's config.
#[derive(Debug, Default, Deserialize)]
struct Overrides {
    keys: Option<u64>,
    value_bytes: Option<usize>,
    prefix: Option<String>,
    delete: Option<bool>,
    reads: Option<u64>,
    log: Option<String>,
    reason_bytes: Option<usize>,
}

fn setting<T: std::str::FromStr>(name: &str) -> Option<T> {
    config::get(name).and_then(|v| v.parse().ok())
}

/// The hoarding handler.
pub struct Hoarder;

impl Handler for Hoarder {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let body: Overrides = event.json().unwrap_or_default();
        let keys = body.keys.or_else(|| setting("keys")).unwrap_or(1);
        let value_bytes = body
            .value_bytes
            .or_else(|| setting("value_bytes"))
            .unwrap_or(1024);
        let prefix = body
            .prefix
            .or_else(|| config::get("prefix"))
            .unwrap_or_else(|| event.event_id.clone());
        let delete = body.delete.or_else(|| setting("delete")).unwrap_or(false);
        if let Some(text) = body.log.or_else(|| config::get("log")) {
            log::warn(text);
        }
        let reads = body.reads.or_else(|| setting("reads")).unwrap_or(0);
        for i in 0..reads {
            let _ = state::get(&format!("{prefix}/r{i}"));
        }
        let value = vec![0x5A; value_bytes];
        for i in 0..keys {
            let key = format!("{prefix}/{i}");
            if delete {
                state::delete(&key);
            } else {
                state::set(&key, &value);
            }
        }
        drop(value);
        if let Some(bytes) = body.reason_bytes.or_else(|| setting("reason_bytes")) {
            let mut reason = String::with_capacity(bytes.max(FORGED.len()));
            reason.push_str(FORGED);
            reason.extend(std::iter::repeat_n('R', bytes.saturating_sub(FORGED.len())));
            return Err(HandleError::permanent(reason));
        }
        output::json(&serde_json::json!({ "written": keys }))
    }
}

plugin_sdk::register!(handler = Hoarder);
