//! Write hookd webhook parsers and handlers in plain Rust.
//!
//! A hookd plugin is a WebAssembly component compiled for `wasm32-wasip2`. It plays one or
//! both roles:
//!
//! - a [`Parser`] turns a verified raw webhook [`Request`] into an [`Envelope`] (the event's
//!   id, type, ordering key and sequence) so the host can deduplicate and order it;
//! - a [`Handler`] reacts to one deduplicated, durably stored [`Event`]. It is called once per
//!   attempt, and again only if the previous attempt failed or its [`state`] commit conflicted
//!   with another attempt's (a key it read changed meanwhile): then its [`http`] requests are
//!   sent again too, with the same `Idempotency-Key`.
//!
//! Implement the trait(s) and register them once with [`register!`]. A fresh instance is
//! made for every call, so a plugin keeps nothing in memory between calls: durable data goes
//! through [`state`], settings come from [`config`], diagnostics go to [`log`], and a handler
//! granted `allow_hosts` can call other services with [`http`].
//!
//! # Example
//!
//! ```
//! use plugin_sdk::{Event, HandleError, Handler, log, output, serde, serde_json, state};
//!
//! #[derive(serde::Deserialize)]
//! #[serde(crate = "plugin_sdk::serde")]
//! struct Payment { amount: u64 }
//!
//! struct Totals;
//!
//! impl Handler for Totals {
//!     fn handle(event: Event) -> Result<Option<String>, HandleError> {
//!         let payment: Payment = event.json()?; // not JSON: a permanent error
//!         let total = state::get_json::<u64>("total")?.unwrap_or(0) + payment.amount;
//!         state::set_json("total", &total)?; // committed only if this attempt succeeds
//!         log::info(format!("{} brought the total to {total}", event.event_id));
//!         output::json(&serde_json::json!({ "total": total }))
//!     }
//! }
//!
//! plugin_sdk::register!(handler = Totals);
//! ```
//!
//! The plugin crate is a `cdylib` depending on `plugin-sdk` alone: the SDK re-exports
//! [`serde`] (with its derive macros; point them at it with `#[serde(crate =
//! "plugin_sdk::serde")]`) and [`serde_json`]. `cargo build --release --target wasm32-wasip2`
//! produces the component, to be dropped into hookd's `plugins/` directory (`hookd new
//! handler NAME` makes such a crate, and `hookd dev` builds and serves it).
//!
//! # Roles
//!
//! `register!(parser = P)` builds a component exporting only `hookd:plugin/parser`,
//! `register!(handler = H)` one exporting only `hookd:plugin/handler`, and
//! `register!(parser = P, handler = H)` one exporting both (the WIT world `plugin`). The host
//! decides what a component may be used for by what it exports.
//!
//! # Testing
//!
//! `cargo test` on the host target runs a plugin's own [`Handler::handle`] and
//! [`Parser::parse`] through a `testing::Harness` (compiled for every non-wasm target), which
//! stands in for hookd: configuration, state committed only by a successful attempt, captured
//! log lines and stubbed HTTP. [`Event::new`] and [`Request::new`] and their `with_*` methods
//! build the inputs. Outside a harness call, [`log`] writes to stderr while [`config`],
//! [`state`] and [`http`] panic, as there is no host to ask.
//!
//! # Layout
//!
//! - `input`: [`Request`], [`Event`], [`Header`]: what the host hands in.
//! - `envelope`: [`Envelope`], [`Response`]: what a parser hands back.
//! - `error`: [`ParseError`], [`HandleError`], [`BodyError`].
//! - [`log`], [`config`], [`state`], [`output`]: the host's services and output helpers.
//! - [`http`]: outbound HTTP over `wasi:http` (through the `wasip2` crate's bindings).
//! - `testing` (not on wasm): the `Harness` that stands in for the host in unit tests.
//! - `bindings.rs` (the hidden module `__private`): the only code that touches wit-bindgen.
//!
//! # WIT version
//!
//! This SDK builds components against `hookd:plugin@0.3.0` (its own copy, in `wit/`), which
//! every hookd that knows 0.3.0 loads (an older one refuses it, naming the version).
//! Components built with an older SDK (`hookd:plugin@0.1.0`, `@0.2.0`) keep loading and
//! behaving as before. A parser needs 0.2.0 for [`Request::method`], [`Request::query`] and
//! [`ParseError::respond`]; a handler needs 0.3.0 for [`Event::stale`] and for the host's
//! reason in an [`http::HttpError::Denied`].
//!
//! Invariant: no generated type appears in this crate's public API; the WIT contract can
//! evolve behind these types.

#![deny(missing_docs)]

pub mod config;
mod envelope;
mod error;
pub mod http;
mod input;
pub mod log;
pub mod output;
pub mod state;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

/// The `serde` this SDK is built with, derive macros included: a plugin needs no dependency
/// of its own (`#[derive(plugin_sdk::serde::Deserialize)]` with
/// `#[serde(crate = "plugin_sdk::serde")]`).
pub use serde;
/// The `serde_json` this SDK is built with ([`Event::json`] decodes with it).
pub use serde_json;

pub use envelope::{Envelope, Response};
pub use error::{BodyError, HandleError, ParseError};
pub use input::{Event, Header, Request};

/// The wit-bindgen bindings and adapters used by [`register!`]; not part of the API.
#[doc(hidden)]
#[path = "bindings.rs"]
pub mod __private;

/// The parser role: extracts an [`Envelope`] from a verified [`Request`].
///
/// It runs on the ingest path before the request is acknowledged, so it must be fast (the
/// default budget is 50 ms) and free of side effects: it may run more than once for one
/// request.
pub trait Parser {
    /// Extracts the envelope, or says why the request is [invalid](ParseError::invalid) (400),
    /// should be [ignored](ParseError::ignore) (200, nothing stored) or is answered by the
    /// parser [itself](ParseError::respond) (e.g. a provider's challenge; nothing stored).
    fn parse(req: Request) -> Result<Envelope, ParseError>;
}

/// The handler role: reacts to one [`Event`], once per attempt.
pub trait Handler {
    /// Handles the event. On success the optional output (e.g. JSON from
    /// [`output::json`]) is stored on the delivery; on error the host retries or
    /// dead-letters as the [`HandleError`] says.
    fn handle(event: Event) -> Result<Option<String>, HandleError>;
}

/// Registers a plugin's roles; invoke it exactly once per plugin crate, with one of:
///
/// - `register!(parser = MyParser)`: a parser-only component (WIT world `parser-plugin`);
/// - `register!(handler = MyHandler)`: a handler-only component (world `handler-plugin`);
/// - `register!(parser = MyParser, handler = MyHandler)`: both roles (world `plugin`).
///
/// The component exports exactly the roles named here, which is how the host tells a parser
/// from a handler. One type may implement both traits.
///
/// ```
/// use plugin_sdk::{Envelope, Event, HandleError, Handler, ParseError, Parser, Request};
///
/// struct Echo;
///
/// impl Parser for Echo {
///     fn parse(req: Request) -> Result<Envelope, ParseError> {
///         let id = req.header("x-request-id").ok_or(ParseError::invalid("missing x-request-id"))?;
///         Ok(Envelope::new(id, "echo"))
///     }
/// }
///
/// impl Handler for Echo {
///     fn handle(event: Event) -> Result<Option<String>, HandleError> {
///         Ok(Some(event.text()?.to_owned()))
///     }
/// }
///
/// plugin_sdk::register!(parser = Echo, handler = Echo);
/// ```
#[macro_export]
macro_rules! register {
    (parser = $parser:ty $(,)?) => {
        #[doc(hidden)]
        type __HookdParserExport = $crate::__private::ParserExport<$parser>;
        $crate::__private::parser_world::export_parser_world!(
            __HookdParserExport with_types_in $crate::__private::parser_world
        );
    };
    (handler = $handler:ty $(,)?) => {
        #[doc(hidden)]
        type __HookdHandlerExport = $crate::__private::HandlerExport<$handler>;
        $crate::__private::handler_world::export_handler_world!(
            __HookdHandlerExport with_types_in $crate::__private::handler_world
        );
    };
    (parser = $parser:ty, handler = $handler:ty $(,)?) => {
        // The `plugin` world is `parser-plugin` + `handler-plugin`; wit-component unions the
        // two worlds described by these two invocations.
        $crate::register!(parser = $parser);
        $crate::register!(handler = $handler);
    };
    (handler = $handler:ty, parser = $parser:ty $(,)?) => {
        $crate::register!(parser = $parser, handler = $handler);
    };
}

#[cfg(not(target_arch = "wasm32"))]
#[track_caller]
fn outside_hookd(what: &str, key: &str) -> ! {
    panic!(
        "plugin_sdk::{what}({key:?}) needs the hookd host: in a wasm32-wasip2 component run \
         by hookd, or in a unit test during a plugin_sdk::testing::Harness call \
         (Harness::handle or Harness::parse), which stands in for it"
    )
}
