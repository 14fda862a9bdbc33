//! Bindings of `hookd:plugin@0.1.0` (`wit/v0.1.0`, frozen), adapted to the latest version:
//! its imports delegate to the latest imports' one implementation, and its exports are called
//! with latest shapes converted down and their results converted up.
//!
//! Invariant: a 0.1.0 component sees exactly what it saw before 0.2.0 existed. A parser is
//! given no method or query, and can only return what 0.1.0 allows (so never `respond`).

use wasmtime::Store;

use super::{super::host::HostState, latest};

/// Bindings for components exporting the 0.1.0 parser role.
pub mod parser_world {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "parser-plugin",
        imports: { default: trappable },
        exports: { default: async },
    });
}

/// Bindings for components exporting the 0.1.0 handler role; `types`, `log` and `config` are
/// the parser world's.
pub mod handler_world {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "handler-plugin",
        imports: { default: trappable },
        exports: { default: async },
        with: {
            "hookd:plugin/types": super::parser_world::hookd::plugin::types,
            "hookd:plugin/log": super::parser_world::hookd::plugin::log,
            "hookd:plugin/config": super::parser_world::hookd::plugin::config,
        },
    });
}

use handler_world::hookd::plugin::state;
use parser_world::hookd::plugin::{config, log, types};

/// Instantiates a 0.1.0 parser in `store` and calls `parse` with `input` in 0.1.0's shape.
pub async fn parse(
    pre: &parser_world::ParserPluginPre<HostState>,
    store: &mut Store<HostState>,
    input: &latest::types::Request,
) -> wasmtime::Result<Result<latest::types::Envelope, latest::types::ParseError>> {
    // 0.1.0's request has no method or query; the rest is copied across (the latest request is
    // borrowed, and the generated call takes its own version's type).
    let request = types::Request {
        source: input.source.clone(),
        headers: headers(&input.headers),
        body: input.body.clone(),
        received_at_ms: input.received_at_ms,
    };
    let instance = pre.instantiate_async(&mut *store).await?;
    store.data_mut().started = true;
    let result = instance
        .hookd_plugin_parser()
        .call_parse(store, &request)
        .await?;
    Ok(result.map(envelope).map_err(|e| match e {
        types::ParseError::Invalid(m) => latest::types::ParseError::Invalid(m),
        types::ParseError::Ignore(m) => latest::types::ParseError::Ignore(m),
    }))
}

/// Instantiates a 0.1.0 handler in `store` and calls `handle` with `input` in 0.1.0's shape.
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
        headers: headers(&input.headers),
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

fn headers(headers: &[latest::types::Header]) -> Vec<types::Header> {
    headers
        .iter()
        .map(|h| types::Header {
            name: h.name.clone(),
            value: h.value.clone(),
        })
        .collect()
}

fn envelope(env: types::Envelope) -> latest::types::Envelope {
    latest::types::Envelope {
        event_id: env.event_id,
        event_type: env.event_type,
        ordering_key: env.ordering_key,
        sequence: env.sequence,
    }
}

super::delegate_imports_to_latest!();
