//! Test plugin: a handler that recurses without end.
//!
//! The host must stop it at the wasm stack limit (512 KiB) and record the attempt as a `trap`
//! whose message says `stack overflow`; the host's own stack is never at risk.

use std::hint::black_box;

use plugin_sdk::{Event, HandleError, Handler};

/// One more frame, forever. Not a tail call (the result is used after the call returns) and
/// opaque to the optimiser, so every level is a real wasm call frame.
#[inline(never)]
fn descend(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return depth;
    }
    black_box(descend(black_box(depth + 1))).wrapping_add(1)
}

/// The recursing handler.
pub struct Deep;

impl Handler for Deep {
    fn handle(_event: Event) -> Result<Option<String>, HandleError> {
        let depth = descend(0);
        Ok(Some(depth.to_string()))
    }
}

plugin_sdk::register!(handler = Deep);
