//! Parser for Stripe webhooks.
//!
//! A Stripe event body is a JSON `Event` object:
//!
//! - event id: `id` (`evt_...`), the same across Stripe's retries;
//! - event type: `type` (`invoice.paid`, `customer.subscription.updated`);
//! - ordering key: `data.object.id`, the object the event is about, so a subscription's
//!   events are handled in order;
//! - sequence: `created`, the event's creation time in seconds. Stripe does not guarantee
//!   delivery order; with this sequence an event older than one already handled for the same
//!   object is marked stale instead of overwriting newer data.

use plugin_sdk::{Envelope, ParseError, Parser, Request};
use serde_json::Value;

/// The Stripe parser.
pub struct Stripe;

impl Parser for Stripe {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        let body: Value = req.json()?;
        let field = |name: &str| {
            body.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ParseError::invalid(format!("missing string field `{name}`")))
        };
        let mut envelope = Envelope::new(field("id")?, field("type")?);
        if let Some(object_id) = body.pointer("/data/object/id").and_then(Value::as_str) {
            envelope = envelope.ordering_key(object_id);
        }
        if let Some(created) = body.get("created").and_then(Value::as_u64) {
            envelope = envelope.sequence(created);
        }
        Ok(envelope)
    }
}

plugin_sdk::register!(parser = Stripe);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_fields_map_to_the_envelope() {
        let body = r#"{"id":"evt_1","object":"event","type":"invoice.paid","created":1700000000,
                       "data":{"object":{"id":"in_42","object":"invoice"}}}"#;
        let env = Stripe::parse(Request::new("stripe", body)).unwrap();
        assert_eq!(
            env,
            Envelope::new("evt_1", "invoice.paid")
                .ordering_key("in_42")
                .sequence(1_700_000_000)
        );
    }

    #[test]
    fn ordering_is_optional() {
        let env = Stripe::parse(Request::new("stripe", r#"{"id":"evt_1","type":"t"}"#)).unwrap();
        assert_eq!(env, Envelope::new("evt_1", "t"));
    }

    #[test]
    fn missing_fields_are_named() {
        let cases = [
            (r#"{"type":"t"}"#, "missing string field `id`"),
            (r#"{"id":"evt_1"}"#, "missing string field `type`"),
            (r#"{"id":7,"type":"t"}"#, "missing string field `id`"),
        ];
        for (body, want) in cases {
            assert_eq!(
                Stripe::parse(Request::new("stripe", body)).unwrap_err(),
                ParseError::invalid(want)
            );
        }
        let err = Stripe::parse(Request::new("stripe", "not json")).unwrap_err();
        assert!(
            matches!(err, ParseError::Invalid(ref m) if m.starts_with("body is not valid JSON"))
        );
    }
}
