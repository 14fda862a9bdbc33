//! Test plugin: a handler doing what each event's body asks, the same in Rust as in its
//! JavaScript (`tests/plugins-js/scenario`) and Python (`tests/plugins-py/scenario`) twins,
//! so one black-box test (`tests/it/languages.rs`) holds all three languages to the same
//! guarantees.
//!
//! The body is JSON `{"do": OP, ...}`:
//!
//! - `count` with `key`: reads the state key (a JSON number, absent = 0), writes n + 1,
//!   outputs `{"count": n + 1}`.
//! - `fail` with `until`: an attempt below `until` fails with retry `attempt A fails` (retry
//!   after 1 ms); later ones output `{"attempt": A}`.
//! - `permanent`: fails for good with `asked to fail for good`.
//! - `write-then-fail` with `key`: sets the key to `"written"`, then fails with retry
//!   `wrote then failed` (so the write must not persist).
//! - `fetch` with `url`: POSTs the body to `url`; a 2xx outputs `{"status": S}`; failures map
//!   as the SDK maps them (5xx, 408, 429 retry; a refusal and other statuses are permanent).
//! - `copy` with `key`, `copy` and `url`: stores the event's body under `key`, reads it back
//!   and stores what it read under `copy`, POSTs the body to `url` as it is; a 2xx outputs
//!   `{"status": S, "bytes": N}` (N: the bytes read back). Both keys and the request hold the
//!   body byte for byte (the JavaScript twin once JSON-encoded it, its bytes being of another
//!   realm of the engine).
//! - `peek` with `url` and `bytes`: GETs `url` reading at most `bytes` of the answer's body
//!   (however long it is), outputs `{"status": S, "bytes": N}` (N: the bytes read).
//! - `spin`: loops forever. `grow`: allocates without bound.
//! - `output` with `bytes`: outputs that many `x`. `log` with `bytes`: logs 1 KiB lines until
//!   that many bytes were logged, then outputs `logged`.
//! - `stale`: outputs `{"stale": S}`.
//! - anything else: fails for good with `unknown op OP`.

use plugin_sdk::{Event, HandleError, Handler, http, log, output, serde_json, state};
use serde_json::{Value, json};

/// The scenario handler.
pub struct Scenario;

impl Handler for Scenario {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let body: Value = event.json()?;
        let op = body["do"].as_str().unwrap_or_default();
        let number = |key: &str| body[key].as_u64().unwrap_or(0);
        let text = |key: &str| body[key].as_str().unwrap_or_default().to_owned();
        match op {
            "count" => {
                let key = text("key");
                let n = state::get_json::<u64>(&key)?.unwrap_or(0) + 1;
                state::set_json(&key, &n)?;
                output::json(&json!({ "count": n }))
            }
            "fail" if u64::from(event.attempt) < number("until") => Err(HandleError::retry_after(
                format!("attempt {} fails", event.attempt),
                std::time::Duration::from_millis(1),
            )),
            "fail" => output::json(&json!({ "attempt": event.attempt })),
            "permanent" => Err(HandleError::permanent("asked to fail for good")),
            "write-then-fail" => {
                state::set_json(&text("key"), &"written")?;
                Err(HandleError::retry("wrote then failed"))
            }
            "fetch" => {
                let response = http::post(&text("url"))
                    .body(event.body.clone())
                    .send()?
                    .error_for_status()?;
                output::json(&json!({ "status": response.status }))
            }
            "copy" => {
                let key = text("key");
                state::set(&key, &event.body);
                let stored = state::get(&key).unwrap_or_default();
                state::set(&text("copy"), &stored);
                let response = http::post(&text("url"))
                    .body(event.body.clone())
                    .send()?
                    .error_for_status()?;
                output::json(&json!({ "status": response.status, "bytes": stored.len() }))
            }
            "peek" => {
                let limit = usize::try_from(number("bytes")).unwrap_or(usize::MAX);
                let response = http::get(&text("url")).response_body_limit(limit).send()?;
                output::json(&json!({ "status": response.status, "bytes": response.body.len() }))
            }
            "spin" => {
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "output" => Ok(Some("x".repeat(number("bytes") as usize))),
            "log" => {
                let line = "l".repeat(1024);
                let mut logged = 0;
                while logged < number("bytes") {
                    log::info(&line);
                    logged += 1024;
                }
                Ok(Some("logged".into()))
            }
            "stale" => output::json(&json!({ "stale": event.stale })),
            other => Err(HandleError::permanent(format!("unknown op {other}"))),
        }
    }
}

plugin_sdk::register!(handler = Scenario);
