//! Test plugin: a handler that indexes a three-element list at the event body's `index`.
//!
//! Body `{"index": 7}` panics with `index out of bounds: the len is 3 but the index is 7` at
//! the line marked `PANICS HERE`; `{"index": 1}` succeeds. Before panicking it writes a few
//! lines to stderr, as a chatty plugin would, which must not hide the panic.

use plugin_sdk::{Event, HandleError, Handler};

/// The panicking handler.
pub struct Panicker;

impl Handler for Panicker {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let body: serde_json::Value = event.json()?;
        let index = body["index"].as_u64().unwrap_or(7) as usize;
        let list = [10, 20, 30];
        for line in 0..3 {
            eprintln!("panicker: looking up index {index} (line {line})");
        }
        let value = list[index]; // PANICS HERE
        Ok(Some(value.to_string()))
    }
}

plugin_sdk::register!(handler = Panicker);
