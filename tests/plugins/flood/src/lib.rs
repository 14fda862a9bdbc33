//! Test plugin: a handler that writes 10 MB of logs and returns a 10 MB output; or, for an event
//! whose body is `empty-lines`, writes 200 000 empty log lines and outputs `logged`.
//!
//! The host must keep only its per-attempt log budget (then one truncation marker), counting
//! each line's own cost so short lines cannot outrun it, and refuse the output as
//! `output_too_large` instead of storing or silently truncating it.

use plugin_sdk::{Event, HandleError, Handler, log};

/// Bytes of output, and of logs, the flood produces.
const FLOOD_BYTES: usize = 10 * 1000 * 1000;
/// The logs go out as 10 lines of 1 MB each.
const LOG_LINES: usize = 10;
/// Empty lines written for an `empty-lines` event.
const EMPTY_LINES: usize = 200_000;

/// The flooding handler.
pub struct Flood;

impl Handler for Flood {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        if event.body == b"empty-lines" {
            for _ in 0..EMPTY_LINES {
                log::info("");
            }
            return Ok(Some("logged".into()));
        }
        let line = "L".repeat(FLOOD_BYTES / LOG_LINES);
        for i in 0..LOG_LINES {
            log::info(format!("flood line {i} for {}: {line}", event.event_id));
        }
        drop(line);
        Ok(Some("O".repeat(FLOOD_BYTES)))
    }
}

plugin_sdk::register!(handler = Flood);
