//! Bindings of `hookd:plugin@0.2.0` (`wit/v0.2.0`, frozen), adapted to the latest version:
//! its imports delegate to the latest imports' one implementation, and its exports are called
//! with latest shapes converted down and their results converted up.
//!
//! Invariants:
//! - A 0.2.0 component sees exactly what it saw before 0.3.0 existed: an event carries no
//!   `stale` flag (a handler with `on_stale = "deliver"` gets stale events without it), and
//!   there is no `network` import to ask why a request was refused (the attempt's stored error
//!   says why all the same).
//! - `wasi:*` types come from wasmtime-wasi(-http), so the `wasi:http` import the handler world
//!   declares is the one the engine links, never a second binding of it.

use wasmtime::Store;

use super::{super::host::HostState, latest};

super::bind_worlds!("../wit/v0.2.0");

use handler_world::hookd::plugin::state;
use parser_world::hookd::plugin::{config, log, types};

/// Instantiates a 0.2.0 parser in `store` and calls `parse` with `input` in 0.2.0's shape.
pub async fn parse(
    pre: &parser_world::ParserPluginPre<HostState>,
    store: &mut Store<HostState>,
    input: &latest::types::Request,
) -> wasmtime::Result<Result<latest::types::Envelope, latest::types::ParseError>> {
    let request = types::Request {
        source: input.source.clone(),
        method: input.method.clone(),
        query: input.query.clone(),
        headers: headers_down(&input.headers),
        body: input.body.clone(),
        received_at_ms: input.received_at_ms,
    };
    let instance = pre.instantiate_async(&mut *store).await?;
    store.data_mut().started = true;
    let result = instance
        .hookd_plugin_parser()
        .call_parse(store, &request)
        .await?;
    Ok(result
        .map(|env| latest::types::Envelope {
            event_id: env.event_id,
            event_type: env.event_type,
            ordering_key: env.ordering_key,
            sequence: env.sequence,
        })
        .map_err(|e| match e {
            types::ParseError::Invalid(m) => latest::types::ParseError::Invalid(m),
            types::ParseError::Ignore(m) => latest::types::ParseError::Ignore(m),
            types::ParseError::Respond(r) => {
                latest::types::ParseError::Respond(latest::types::Response {
                    status: r.status,
                    headers: r
                        .headers
                        .into_iter()
                        .map(|h| latest::types::Header {
                            name: h.name,
                            value: h.value,
                        })
                        .collect(),
                    body: r.body,
                })
            }
        }))
}

/// Instantiates a 0.2.0 handler in `store` and calls `handle` with `input` in 0.2.0's shape
/// (without `stale`).
pub async fn handle(
    pre: &handler_world::HandlerPluginPre<HostState>,
    store: &mut Store<HostState>,
    input: &latest::types::Event,
) -> wasmtime::Result<Result<Option<String>, latest::types::HandleError>> {
    let event = types::Event {
        source: input.source.clone(),
        event_id: input.event_id.clone(),
        event_type: input.event_type.clone(),
        ordering_key: input.ordering_key.clone(),
        sequence: input.sequence,
        attempt: input.attempt,
        received_at_ms: input.received_at_ms,
        headers: headers_down(&input.headers),
        body: input.body.clone(),
    };
    let instance = pre.instantiate_async(&mut *store).await?;
    store.data_mut().started = true;
    let result = instance
        .hookd_plugin_handler()
        .call_handle(store, &event)
        .await?;
    Ok(result.map_err(|e| match e {
        types::HandleError::Retry(retry) => {
            latest::types::HandleError::Retry(latest::types::RetryLater {
                reason: retry.reason,
                after_ms: retry.after_ms,
            })
        }
        types::HandleError::Permanent(reason) => latest::types::HandleError::Permanent(reason),
    }))
}

fn headers_down(headers: &[latest::types::Header]) -> Vec<types::Header> {
    headers
        .iter()
        .map(|h| types::Header {
            name: h.name.clone(),
            value: h.value.clone(),
        })
        .collect()
}

super::delegate_imports_to_latest!();
