//! Test plugin: a handler that counts the events it has handled, in plugin state.
//!
//! State key `count` holds the count as decimal text (absent = 0). Each attempt reads it,
//! writes count + 1 and returns `{"count": N}`. The host commits the write only with the
//! delivery's success, so the integration tests use it to check that state is atomic with
//! `done` and that concurrent deliveries never lose an update.

use plugin_sdk::{Event, HandleError, Handler, output, state};

/// The counting handler.
pub struct Counter;

impl Handler for Counter {
    fn handle(_event: Event) -> Result<Option<String>, HandleError> {
        let count = match state::get("count") {
            None => 0,
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| HandleError::permanent("state `count` is not a decimal number"))?,
        } + 1;
        state::set("count", count.to_string().as_bytes());
        output::json(&serde_json::json!({ "count": count }))
    }
}

plugin_sdk::register!(handler = Counter);
