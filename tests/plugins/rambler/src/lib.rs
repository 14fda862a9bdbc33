//! Test plugin: a parser whose `invalid` message is as long as its config says
//! (`detail_bytes`, default 1 MiB), with newlines and terminal escapes in it.
//!
//! The host answers `invalid` with 400 `{"error":"unparsable","detail":...}`; the detail must
//! reach the client capped, not whole.

use plugin_sdk::{Envelope, ParseError, Parser, Request, config};

/// The rambling parser.
pub struct Rambler;

impl Parser for Rambler {
    fn parse(_req: Request) -> Result<Envelope, ParseError> {
        let len = config::get("detail_bytes")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1 << 20);
        let unit = "not an event\n\u{1b}[2J";
        let message: String = unit.chars().cycle().take(len).collect();
        Err(ParseError::invalid(message))
    }
}

plugin_sdk::register!(parser = Rambler);
