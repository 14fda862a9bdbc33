//! Bindings of `hookd:plugin@0.3.0` (`wit/v0.3.0`), the latest version: the shapes the rest
//! of the runtime uses, and how each role's export is called.
//!
//! Invariant: `wasi:*` types come from wasmtime-wasi(-http), so the `wasi:http` import the
//! handler world declares is the one the engine links, never a second binding of it.

use wasmtime::Store;

use super::super::host::HostState;

super::bind_worlds!("../wit/v0.3.0");

pub use handler_world::hookd::plugin::{network, state};
pub use parser_world::hookd::plugin::{config, log, types};

/// Instantiates a parser in `store` and calls `parse`.
pub async fn parse(
    pre: &parser_world::ParserPluginPre<HostState>,
    store: &mut Store<HostState>,
    input: &types::Request,
) -> wasmtime::Result<Result<types::Envelope, types::ParseError>> {
    let instance = pre.instantiate_async(&mut *store).await?;
    store.data_mut().started = true;
    instance
        .hookd_plugin_parser()
        .call_parse(store, input)
        .await
}

/// Instantiates a handler in `store` and calls `handle`.
pub async fn handle(
    pre: &handler_world::HandlerPluginPre<HostState>,
    store: &mut Store<HostState>,
    input: &types::Event,
) -> wasmtime::Result<Result<Option<String>, types::HandleError>> {
    let instance = pre.instantiate_async(&mut *store).await?;
    store.data_mut().started = true;
    instance
        .hookd_plugin_handler()
        .call_handle(store, input)
        .await
}
