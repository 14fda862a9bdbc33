//! Test plugin: a `hookd:plugin@0.2.0` parser for a provider with a custom set-up challenge.
//!
//! - A body `{"type": "challenge", "challenge": C}` is answered by the parser itself with
//!   `respond`: 200, `content-type: application/json`, `x-challenge: answered` and the body
//!   `{"challenge": C, "method": M, "query": Q}`, so a test sees that the answer is passed on
//!   as-is and that the parser was given the request's method and query.
//! - A body `{"type": "big", "size": N}` is answered with an N-byte body, to test the host's
//!   cap on an answer.
//! - A body `{"type": "status", "status": S}` is answered with status S, the body `no body,
//!   please` and `x-content-type-options: sniff-me`, to test what the host makes of them.
//! - Anything else is an event whose id is the `x-event-id` header.

use plugin_sdk::{Envelope, ParseError, Parser, Request, Response};
use serde_json::{Value, json};

/// The challenge-answering parser.
pub struct Responder;

impl Parser for Responder {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        let body: Value = req.json()?;
        match body["type"].as_str() {
            Some("challenge") => {
                let answer = json!({
                    "challenge": body["challenge"],
                    "method": req.method,
                    "query": req.query,
                });
                Err(ParseError::respond(
                    Response::new(200, answer.to_string())
                        .with_header("content-type", "application/json")
                        .with_header("x-challenge", "answered"),
                ))
            }
            Some("status") => {
                let status = body["status"].as_u64().unwrap_or(200) as u16;
                Err(ParseError::respond(
                    Response::new(status, "no body, please")
                        .with_header("x-content-type-options", "sniff-me"),
                ))
            }
            Some("big") => {
                let size = body["size"].as_u64().unwrap_or(0) as usize;
                Err(ParseError::respond(Response::new(200, vec![b'x'; size])))
            }
            _ => {
                let id = req
                    .header("x-event-id")
                    .ok_or(ParseError::invalid("missing x-event-id"))?;
                Ok(Envelope::new(id, "responder.event"))
            }
        }
    }
}

plugin_sdk::register!(parser = Responder);
