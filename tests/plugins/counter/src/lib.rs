//! Test plugin: a handler that counts the events it has handled, in plugin state.
//!
//! State key `count` holds the count as decimal text (absent = 0). Each attempt reads it,
//! writes count + 1 and returns `{"count": N}`. The host commits the write only with the
//! delivery's success, so the integration tests use it to check that state is atomic with
//! `done` and that concurrent deliveries never lose an update.
//!
//! With config `per_key = "true"`, an event with an ordering key counts under `count/<key>`
//! instead and returns `{"count": N, "key": "<key>"}`: handled in order, the `N` of each
//! event is its position among its key's handled events.
//!
//! An event delivered although it is stale (`on_stale = "deliver"`, or a forced replay) is
//! counted like any other, and its output says so: `"stale": true`.

use plugin_sdk::{Event, HandleError, Handler, config, output, state};

/// The counting handler.
pub struct Counter;

impl Handler for Counter {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let key = event
            .ordering_key
            .filter(|_| config::get("per_key").as_deref() == Some("true"));
        let name = match &key {
            Some(key) => format!("count/{key}"),
            None => "count".to_owned(),
        };
        let count = match state::get(&name) {
            None => 0,
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    HandleError::permanent(format!("state `{name}` is not a decimal number"))
                })?,
        } + 1;
        state::set(&name, count.to_string().as_bytes());
        let mut out = serde_json::json!({ "count": count });
        if let Some(key) = key {
            out["key"] = key.into();
        }
        if event.stale {
            out["stale"] = true.into();
        }
        output::json(&out)
    }
}

plugin_sdk::register!(handler = Counter);
