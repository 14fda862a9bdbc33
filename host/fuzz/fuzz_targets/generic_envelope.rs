//! The `generic` parser plugin's settings and envelope extraction (header and JSON-pointer
//! lookups over an arbitrary body), compiled natively from the plugin's own source file.
//!
//! Input: `key=value` plugin-config lines, an empty line, `Name: value` header lines, an empty
//! line, and the raw body.
//!
//! Properties: never panics; an accepted request has a non-empty event id and type, and an id
//! or type configured as a header is that header's value.
#![no_main]

#[allow(dead_code)]
#[path = "../../../plugins/generic/src/envelope.rs"]
mod envelope;

use hookd_fuzz::{header_lines, lines, split_blank_line};
use libfuzzer_sys::fuzz_target;
use plugin_sdk::Request;

fuzz_target!(|input: &[u8]| {
    let (config, rest) = split_blank_line(input);
    let (headers, body) = split_blank_line(rest);
    let config: Vec<(String, String)> = lines(config)
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let get = |key: &str| {
        config
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let Ok(settings) = envelope::Settings::from_config(get) else {
        return;
    };
    let mut request = Request::new("fuzz", body);
    for (name, value) in header_lines(lines(headers)) {
        request = request.with_header(name, value);
    }
    if let Ok(envelope) = settings.envelope(&request) {
        assert!(!envelope.event_id.is_empty(), "empty event id");
        assert!(!envelope.event_type.is_empty(), "empty event type");
        for (key, field) in [
            ("id_header", &envelope.event_id),
            ("type_header", &envelope.event_type),
        ] {
            if let Some(name) = get(key) {
                assert_eq!(request.header(&name), Some(field.as_str()), "{key}");
            }
        }
    }
});
