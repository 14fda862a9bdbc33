//! Test plugin: a parser that always panics.
//!
//! In a wasm component a panic is a trap. On the ingest path the host must not lose the
//! verified request: it quarantines it (202 `quarantined`) and `POST /admin/replay` parses it
//! again once a working parser has replaced this file.

use plugin_sdk::{Envelope, ParseError, Parser, Request};

/// The trapping parser.
pub struct Trapper;

impl Parser for Trapper {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        panic!(
            "trapper always panics (a {}-byte request from {})",
            req.body().len(),
            req.source
        )
    }
}

plugin_sdk::register!(parser = Trapper);
