//! Test plugin: a handler whose instance starts with 16 MiB of linear memory (a zeroed static
//! the module's initial memory covers, as a JavaScript or Python plugin's heap image does), so
//! making its instance takes that much of the host's plugin memory before any of its code runs.
//!
//! Outputs `{"room": N}`, N being the static's size in bytes.

use std::hint::black_box;

use plugin_sdk::{Event, HandleError, Handler, output};

/// Bytes of the zeroed static.
const ROOM: usize = 16 << 20;

static mut ROOM_BYTES: [u8; ROOM] = [0; ROOM];

/// The bulky handler.
pub struct Bulky;

impl Handler for Bulky {
    fn handle(_event: Event) -> Result<Option<String>, HandleError> {
        // The static's address through `black_box`, so it is kept whole (and read through a raw
        // pointer, never a `&mut`).
        let room = black_box(std::ptr::addr_of!(ROOM_BYTES)).cast::<u8>();
        let first = unsafe { room.add(black_box(ROOM - 1)).read() };
        output::json(&serde_json::json!({ "room": ROOM + usize::from(first) }))
    }
}

plugin_sdk::register!(handler = Bulky);
