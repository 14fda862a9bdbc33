//! Test plugin: a handler that fails as its event's JSON body tells it to.
//!
//! - `{"permanent": true}`: a permanent error (the delivery is dead-lettered at once);
//! - `{"fail_times": K}`: a retryable error on attempts 1..=K, with `after_ms` from the body
//!   (`{"fail_times": 2, "after_ms": 50}`) as the requested retry delay when present;
//! - otherwise, and from attempt K + 1: success with output `{"attempt": N}`.
//!
//! Two more fields combine with any of the above:
//!
//! - `{"sleep_ms": T}`: every attempt sleeps T ms (WASI monotonic clock) before answering, so a
//!   test can catch it running (e.g. to kill the host mid-attempt);
//! - `{"remember": "k"}`: every attempt first reads state key `k` and writes its own attempt
//!   number there (before any sleep); a success then outputs
//!   `{"attempt": N, "remembered": M}`, M being what it read (`null` if nothing). Since only a
//!   successful attempt's writes are committed, M names the last attempt that succeeded.
//!
//! - `{"hold_mib": M}`: every attempt first allocates and touches M MiB of linear memory, and
//!   keeps it for the rest of the attempt (its sleep included).
//!
//! A body that is not JSON counts as `{}`.

use std::time::Duration;

use plugin_sdk::{Event, HandleError, Handler, output, state};
use serde::Deserialize;

/// What the event body asks for.
#[derive(Debug, Default, Deserialize)]
struct Instructions {
    #[serde(default)]
    permanent: bool,
    #[serde(default)]
    fail_times: u32,
    after_ms: Option<u64>,
    sleep_ms: Option<u64>,
    remember: Option<String>,
    hold_mib: Option<usize>,
}

/// The flaky handler.
pub struct Flaky;

impl Handler for Flaky {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let wanted: Instructions = event.json().unwrap_or_default();
        let remembered = match &wanted.remember {
            Some(key) => {
                let seen = state::get_json::<u32>(key)?;
                state::set_json(key, &event.attempt)?;
                Some(seen)
            }
            None => None,
        };
        let held = vec![0x5A_u8; wanted.hold_mib.unwrap_or(0) << 20];
        if let Some(ms) = wanted.sleep_ms {
            std::thread::sleep(Duration::from_millis(ms));
        }
        drop(std::hint::black_box(held));
        if wanted.permanent {
            return Err(HandleError::permanent("asked to fail permanently"));
        }
        if event.attempt <= wanted.fail_times {
            let reason = format!("failing attempt {} of {}", event.attempt, wanted.fail_times);
            return Err(match wanted.after_ms {
                Some(ms) => HandleError::retry_after(reason, Duration::from_millis(ms)),
                None => HandleError::retry(reason),
            });
        }
        match remembered {
            Some(seen) => output::json(&serde_json::json!({
                "attempt": event.attempt,
                "remembered": seen,
            })),
            None => output::json(&serde_json::json!({ "attempt": event.attempt })),
        }
    }
}

plugin_sdk::register!(handler = Flaky);
