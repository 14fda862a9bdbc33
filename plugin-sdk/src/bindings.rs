//! The raw wit-bindgen bindings and the adapters that connect them to the SDK's traits.
//!
//! Invariant: this is the only place in hookd's guest code that names a generated type.
//! Plugin authors reach it only through [`register!`](crate::register), which is why the
//! module is public but hidden.
//!
//! Two worlds are generated, `handler-plugin` and `parser-plugin`, each with a public export
//! macro. `handler-plugin` owns the one set of import bindings (`types`, `log`, `config`,
//! `state`); `parser-plugin` reuses them through `with:`. With `pub_export_macro`, the
//! library itself only describes *imports* to `wit-component`; a world's exports are
//! described by a custom section that its export macro emits in the plugin crate. So a
//! plugin that registers only a parser becomes a component that exports only
//! `hookd:plugin/parser@0.3.0`, and the host tells roles apart by exports.
//!
//! The WIT is the crate's own copy (`plugin-sdk/wit/`, identical to the repository's
//! `wit/v0.3.0/`, which CI checks), so the crate builds on its own wherever it is copied.
//! `handler-plugin` declares the `wasi:http/outgoing-handler` import; `generate_all` binds it
//! here too, unused: [`crate::http`] calls it through the `wasip2` crate, and both name the
//! same import (`wasi:http@0.2.12`).
//!
//! The third world, `plugin`, is `include parser-plugin; include handler-plugin;`. It is not
//! generated separately: every `generate!` of a world exporting `parser` (or `handler`)
//! defines the same `#[macro_export]` per-interface macro, and two of those in one crate do
//! not compile. A plugin with both roles invokes both export macros instead; `wit-component`
//! unions the two worlds, giving exactly the imports and exports of `plugin`.

use std::marker::PhantomData;

/// Bindings of the `handler-plugin` world, including every import bindings of the package.
pub mod handler_world {
    wit_bindgen::generate!({
        path: "wit",
        world: "handler-plugin",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "export_handler_world",
        default_bindings_module: "plugin_sdk::__private::handler_world",
    });
}

/// Bindings of the `parser-plugin` world; its imports are those of [`handler_world`].
pub mod parser_world {
    wit_bindgen::generate!({
        path: "wit",
        world: "parser-plugin",
        with: {
            "hookd:plugin/types@0.3.0": crate::__private::handler_world::hookd::plugin::types,
            "hookd:plugin/log@0.3.0": crate::__private::handler_world::hookd::plugin::log,
            "hookd:plugin/config@0.3.0": crate::__private::handler_world::hookd::plugin::config,
        },
        pub_export_macro: true,
        export_macro_name: "export_parser_world",
        default_bindings_module: "plugin_sdk::__private::parser_world",
    });
}

pub(crate) use handler_world::hookd::plugin::types as wit;
// Outside wasm the SDK does not call these imports: a `testing::Harness` stands in for the host
// (see `crate::testing`).
#[cfg(target_arch = "wasm32")]
pub(crate) use handler_world::hookd::plugin::{config, log, network, state};

/// Implements the generated `parser` export for a [`Parser`](crate::Parser).
pub struct ParserExport<P>(PhantomData<P>);

impl<P: crate::Parser> parser_world::exports::hookd::plugin::parser::Guest for ParserExport<P> {
    fn parse(req: wit::Request) -> Result<wit::Envelope, wit::ParseError> {
        P::parse(req.into()).map(Into::into).map_err(Into::into)
    }
}

/// Implements the generated `handler` export for a [`Handler`](crate::Handler).
pub struct HandlerExport<H>(PhantomData<H>);

impl<H: crate::Handler> handler_world::exports::hookd::plugin::handler::Guest for HandlerExport<H> {
    fn handle(ev: wit::Event) -> Result<Option<String>, wit::HandleError> {
        H::handle(ev.into()).map_err(Into::into)
    }
}

fn headers(headers: Vec<wit::Header>) -> Vec<crate::Header> {
    headers
        .into_iter()
        .map(|h| crate::Header {
            name: h.name,
            value: h.value,
        })
        .collect()
}

impl From<wit::Request> for crate::Request {
    fn from(req: wit::Request) -> Self {
        crate::Request {
            source: req.source,
            method: req.method,
            query: req.query,
            headers: headers(req.headers),
            body: req.body,
            received_at_ms: req.received_at_ms,
        }
    }
}

impl From<wit::Event> for crate::Event {
    fn from(ev: wit::Event) -> Self {
        crate::Event {
            source: ev.source,
            event_id: ev.event_id,
            event_type: ev.event_type,
            ordering_key: ev.ordering_key,
            sequence: ev.sequence,
            attempt: ev.attempt,
            received_at_ms: ev.received_at_ms,
            headers: headers(ev.headers),
            body: ev.body,
            stale: ev.stale,
        }
    }
}

impl From<crate::Envelope> for wit::Envelope {
    fn from(env: crate::Envelope) -> Self {
        wit::Envelope {
            event_id: env.event_id,
            event_type: env.event_type,
            ordering_key: env.ordering_key,
            sequence: env.sequence,
        }
    }
}

impl From<crate::ParseError> for wit::ParseError {
    fn from(err: crate::ParseError) -> Self {
        match err {
            crate::ParseError::Invalid(msg) => wit::ParseError::Invalid(msg),
            crate::ParseError::Ignore(msg) => wit::ParseError::Ignore(msg),
            crate::ParseError::Respond(response) => wit::ParseError::Respond(wit::Response {
                status: response.status,
                headers: response
                    .headers
                    .into_iter()
                    .map(|h| wit::Header {
                        name: h.name,
                        value: h.value,
                    })
                    .collect(),
                body: response.body,
            }),
        }
    }
}

impl From<crate::HandleError> for wit::HandleError {
    fn from(err: crate::HandleError) -> Self {
        match err {
            crate::HandleError::Retry { reason, after } => {
                wit::HandleError::Retry(wit::RetryLater {
                    reason,
                    after_ms: after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                })
            }
            crate::HandleError::Permanent(reason) => wit::HandleError::Permanent(reason),
        }
    }
}
