//! Test plugin: a handler that allocates (and touches) memory without end.
//!
//! The host must stop it at its instance's `memory_mib` and record the attempt as a `trap`
//! whose message says the memory limit was hit; host memory is not affected.

use std::hint::black_box;

use plugin_sdk::{Event, HandleError, Handler};

/// The memory-hogging handler.
pub struct Hog;

impl Handler for Hog {
    fn handle(_event: Event) -> Result<Option<String>, HandleError> {
        let mut kept: Vec<Vec<u8>> = Vec::new();
        loop {
            // 1 MiB at a time, written so the pages are really used.
            kept.push(black_box(vec![0xA5; 1 << 20]));
        }
    }
}

plugin_sdk::register!(handler = Hog);
