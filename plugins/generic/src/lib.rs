//! A parser configured entirely by its plugin config, for providers without a dedicated one.
//!
//! ```toml
//! [plugins.acme]
//! wasm = "generic"
//! config = { id_header = "x-acme-delivery", type_pointer = "/event", key_pointer = "/order/id", sequence_pointer = "/order/version" }
//! ```
//!
//! | key | meaning |
//! |---|---|
//! | `id_header` or `id_pointer` | required, one of them: the header, or the JSON pointer into the body, holding the event id |
//! | `type_header` or `type_pointer` | optional, at most one: where the event type is; without either the type is `event` |
//! | `key_pointer` | optional: JSON pointer to the ordering key (a string or number; absent = no key) |
//! | `sequence_pointer` | optional: JSON pointer to the sequence (a number or numeric string; absent = none) |
//!
//! Pointers follow RFC 6901 (`/data/object/id`, `/items/0/id`). Ids and types may be strings or
//! numbers. A configured field missing from a request makes the request `invalid`, with a
//! message naming the header or pointer. A setting missing or malformed (no `id_*`, a pointer
//! without its leading `/`, both of a pair) traps with a message naming the config key to set:
//! hookd quarantines the request, to be replayed once the config is fixed.

mod envelope;

use plugin_sdk::{Envelope, ParseError, Parser, Request, config};

use crate::envelope::Settings;

/// The generic parser.
pub struct Generic;

impl Parser for Generic {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        // A setting missing or wrong is the operator's to fix, not the request's fault: it
        // traps, so hookd quarantines the request (202) to be replayed once the config is
        // fixed, where an `invalid` would refuse it (400) and most providers never send it
        // again.
        let settings = Settings::from_config(config::get).unwrap_or_else(|e| {
            let reason = match e {
                ParseError::Invalid(reason) | ParseError::Ignore(reason) => reason,
                other => format!("{other:?}"),
            };
            panic!("{reason}")
        });
        settings.envelope(&req)
    }
}

plugin_sdk::register!(parser = Generic);

#[cfg(test)]
mod tests {
    use plugin_sdk::testing::Harness;

    use super::*;

    #[test]
    fn parse_reads_its_settings_from_the_plugin_config() {
        let mut hookd = Harness::new()
            .with_config("id_header", "x-acme-delivery")
            .with_config("type_pointer", "/event")
            .with_config("key_pointer", "/order/id")
            .with_config("sequence_pointer", "/order/version");
        let req = Request::new("acme", "")
            .with_header("X-Acme-Delivery", "d-1")
            .with_json(&plugin_sdk::serde_json::json!({
                "event": "order.paid",
                "order": {"id": 42, "version": "7"}
            }));
        assert_eq!(
            hookd.parse::<Generic>(req),
            Ok(Envelope::new("d-1", "order.paid")
                .ordering_key("42")
                .sequence(7))
        );
    }

    #[test]
    #[should_panic(expected = "`id_header`")]
    fn an_unconfigured_parser_traps_naming_the_setting_to_add() {
        // A trap, so hookd quarantines the request instead of refusing it.
        Harness::new()
            .parse::<Generic>(Request::new("acme", "{}"))
            .ok();
    }
}
