//! Test plugin: a handler that spins forever without calling the host.
//!
//! The host must end the attempt at its deadline (epoch interruption) and record it as
//! `timeout`, while the guest yields every tick so that ingest and other plugins keep running.

use std::hint::black_box;

use plugin_sdk::{Event, HandleError, Handler};

/// The spinning handler.
pub struct Spinner;

impl Handler for Spinner {
    fn handle(_event: Event) -> Result<Option<String>, HandleError> {
        let mut n: u64 = 0;
        loop {
            // Opaque to the optimiser, so the loop is real work that never ends.
            n = black_box(n.wrapping_add(1));
        }
    }
}

plugin_sdk::register!(handler = Spinner);
