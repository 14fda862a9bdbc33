//! Test plugin: a handler that always panics.
//!
//! In a wasm component a panic is a trap; the host must record the attempt as `trap`, keep
//! no state from it, retry it like any failure and stay up.

use plugin_sdk::{Event, HandleError, Handler};

/// The crashing handler.
pub struct Crasher;

impl Handler for Crasher {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        panic!("crasher always panics (event {})", event.event_id)
    }
}

plugin_sdk::register!(handler = Crasher);
