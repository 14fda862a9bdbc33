//! Test plugin: makes the host allocate memory for it through `wasi:http`, which its own
//! linear-memory limit does not see.
//!
//! - As a handler, event body `{"mode": "fields"}` (the default): creates `wasi:http` `fields`
//!   resources of ~120 KiB each (one header value) and keeps every handle, up to `count`
//!   (default 10 000, ~1.2 GB of host memory without a host budget). `{"mode": "clone"}` fills
//!   one and clones it `count` times. Output (if the host lets it finish): `{"held": N}`.
//! - `{"mode": "one-call", "count": N}`: one `fields.set` of `count` one-byte values (two
//!   million: 16 MB of arguments in the guest, ~160 MB of host heap if copied whole).
//! - `{"mode": "refusals", "url": "http://...", "count": N}`: sends `count` GETs to `url`,
//!   which the host refuses, and reports `{"denied": D, "other": O}`.
//! - As a parser: the `fields` mode on every request, then an envelope with the
//!   `webhook-id` header as the event id.
//!
//! The host must stop it at its per-call host budget with an error naming that limit.

use plugin_sdk::{Envelope, Event, HandleError, Handler, ParseError, Parser, Request, http};
use serde::Deserialize;
use wasip2::http::types::Fields;

#[derive(Debug, Deserialize)]
struct Orders {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    count: Option<usize>,
    #[serde(default)]
    url: Option<String>,
}

/// One header value of ~120 KiB: just under the host's 128 KiB per-`fields` cap.
fn big_value() -> Vec<u8> {
    vec![b'x'; 120 * 1024]
}

/// Creates `count` full `fields` and keeps them all alive; returns how many it got.
fn hoard(count: usize) -> usize {
    let value = big_value();
    let mut held = Vec::new();
    for _ in 0..count {
        let fields = Fields::new();
        if fields.append("x-hog", &value).is_err() {
            break;
        }
        held.push(fields);
    }
    held.len()
}

/// Fills one `fields` and clones it `count` times, keeping every clone.
fn clones(count: usize) -> usize {
    let first = Fields::new();
    let _ = first.append("x-hog", &big_value());
    let mut held = Vec::new();
    for _ in 0..count {
        let copy = first.clone();
        // The clone's first change copies the whole map.
        let _ = copy.append("x-more", b"1");
        held.push(copy);
    }
    held.len()
}

/// The field-hoarding handler and parser.
pub struct Fieldhog;

impl Handler for Fieldhog {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let orders: Orders = event.json()?;
        let count = orders.count.unwrap_or(10_000);
        match orders.mode.as_deref().unwrap_or("fields") {
            "fields" => Ok(Some(format!("{{\"held\":{}}}", hoard(count)))),
            "clone" => Ok(Some(format!("{{\"held\":{}}}", clones(count)))),
            "one-call" => {
                let values = vec![vec![b'x']; count];
                let set = Fields::new().set("x-many", &values).is_ok();
                Ok(Some(format!("{{\"set\":{set}}}")))
            }
            "refusals" => {
                let url = orders.url.ok_or(HandleError::permanent("url is not set"))?;
                let (mut denied, mut other) = (0u64, 0u64);
                for _ in 0..count {
                    match http::get(&url).send() {
                        Err(http::HttpError::Denied(_)) => denied += 1,
                        _ => other += 1,
                    }
                }
                Ok(Some(format!("{{\"denied\":{denied},\"other\":{other}}}")))
            }
            mode => Err(HandleError::permanent(format!("unknown mode {mode:?}"))),
        }
    }
}

impl Parser for Fieldhog {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        hoard(10_000);
        let id = req
            .header("webhook-id")
            .ok_or(ParseError::invalid("missing webhook-id"))?;
        Ok(Envelope::new(id, "fieldhog"))
    }
}

plugin_sdk::register!(parser = Fieldhog, handler = Fieldhog);
