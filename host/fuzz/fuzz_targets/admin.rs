//! The admin API's input parsing, exactly as served: `GET /admin/events` query strings
//! (`host::admin::events_filter`) and `POST /admin/replay` bodies (`host::admin::replay_filter`).
//!
//! Input: first line `events` or `replay`. For `events`, the rest is the query string. For
//! `replay`, the next line is the `Content-Type` (empty: none), the rest the body.
//!
//! Properties: never panics; a refusal is a 4xx (never a 5xx); an accepted filter is bounded
//! (`limit` ≤ 10 000, replay at most `MAX_REPLAY`); the body parse needs no I/O.
#![no_main]

use std::{
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
};

use axum::{body::Body, http::Request, response::IntoResponse};
use host::admin::{MAX_REPLAY, events_filter, replay_filter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some(newline) = input.iter().position(|b| *b == b'\n') else {
        return;
    };
    let (mode, rest) = (&input[..newline], &input[newline + 1..]);
    match mode {
        b"events" => events(rest),
        b"replay" => replay(rest),
        _ => {}
    }
});

fn events(query: &[u8]) {
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    // What hyper would refuse as a request target never reaches the handler.
    let Ok(uri) = format!("/admin/events?{query}").parse::<http::Uri>() else {
        return;
    };
    match events_filter(&uri) {
        Ok(filter) => assert!(filter.limit <= 10_000, "limit {}", filter.limit),
        Err(e) => {
            let status = e.into_response().status();
            assert!(status.is_client_error(), "{query:?} answered {status}");
        }
    }
}

fn replay(rest: &[u8]) {
    let (content_type, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let mut request = Request::post("/admin/replay");
    if !content_type.is_empty() {
        let Ok(value) = http::HeaderValue::from_bytes(content_type) else {
            return;
        };
        request = request.header(http::header::CONTENT_TYPE, value);
    }
    let request = request
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    let mut parse = pin!(replay_filter(request));
    let Poll::Ready(result) = parse.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
        panic!("parsing an in-memory body waited for I/O");
    };
    match result {
        Ok(filter) => assert_eq!(filter.limit, MAX_REPLAY),
        Err(e) => {
            let status = e.into_response().status();
            assert!(status.is_client_error(), "answered {status}");
        }
    }
}
