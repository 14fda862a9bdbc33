//! Parser for the Slack Events API.
//!
//! A Slack event is an `event_callback` JSON envelope around the inner `event`:
//!
//! - event id: `event_id` (`Ev...`), the same on every retry. Slack retries a delivery it got
//!   no timely 2xx for, adding `X-Slack-Retry-Num`/`X-Slack-Retry-Reason`; because the id does
//!   not change, a retry is a duplicate and is handled once.
//! - event type: the inner `event.type` (`message`, `app_mention`, `reaction_added`), else the
//!   outer `type`.
//! - ordering key: the inner `event.channel` when present, so one channel's events are handled
//!   in order; sequence: none (Slack's `event_time` has one-second resolution, so events of the
//!   same second would look stale).
//!
//! The `url_verification` handshake never reaches a parser: hookd answers it for a source with
//! `scheme = "slack"`. Should one arrive anyway (another scheme), it is ignored, not stored.

use plugin_sdk::{Envelope, ParseError, Parser, Request};
use serde_json::Value;

/// The Slack parser.
pub struct Slack;

impl Parser for Slack {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        let body: Value = req.json()?;
        let text = |pointer: &str| {
            body.pointer(pointer)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        if text("/type") == Some("url_verification") {
            return Err(ParseError::ignore(
                "url_verification is a handshake, not an event",
            ));
        }
        if text("/type") == Some("app_rate_limited") {
            // Slack's notice that it dropped events for a minute: no `event_id`, nothing to
            // deliver; answered 200 so Slack does not count it as a failure.
            return Err(ParseError::ignore(
                "app_rate_limited: Slack says it is dropping this app's events for a minute",
            ));
        }
        let id = text("/event_id")
            .ok_or_else(|| ParseError::invalid("missing string field `event_id`"))?;
        let event_type = text("/event/type")
            .or_else(|| text("/type"))
            .ok_or_else(|| ParseError::invalid("missing string field `event.type` or `type`"))?;
        let mut envelope = Envelope::new(id, event_type);
        if let Some(channel) = text("/event/channel") {
            envelope = envelope.ordering_key(channel);
        }
        Ok(envelope)
    }
}

plugin_sdk::register!(parser = Slack);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_callback_maps_its_id_inner_type_and_channel() {
        let body = r#"{"token":"t","team_id":"T1","type":"event_callback","event_id":"Ev08MFMKH6",
                       "event_time":1700000000,
                       "event":{"type":"app_mention","channel":"C123","text":"hi"}}"#;
        let env = Slack::parse(Request::new("slack", body)).unwrap();
        assert_eq!(
            env,
            Envelope::new("Ev08MFMKH6", "app_mention").ordering_key("C123")
        );
    }

    #[test]
    fn a_retry_has_the_same_event_id_as_the_first_delivery() {
        let body = r#"{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}"#;
        let first = Slack::parse(Request::new("slack", body)).unwrap();
        let retry = Slack::parse(
            Request::new("slack", body)
                .with_header("x-slack-retry-num", "1")
                .with_header("x-slack-retry-reason", "http_timeout"),
        )
        .unwrap();
        assert_eq!(first, retry);
    }

    #[test]
    fn url_verification_is_ignored() {
        let body = r#"{"type":"url_verification","challenge":"c"}"#;
        assert!(matches!(
            Slack::parse(Request::new("slack", body)),
            Err(ParseError::Ignore(_))
        ));
    }

    #[test]
    fn slacks_rate_limit_notice_is_ignored() {
        let body = r#"{"token":"t","type":"app_rate_limited","team_id":"T1",
                       "minute_rate_limited":1518467820,"api_app_id":"A1"}"#;
        assert!(matches!(
            Slack::parse(Request::new("slack", body)),
            Err(ParseError::Ignore(_))
        ));
    }

    #[test]
    fn a_body_without_event_id_is_invalid() {
        let body = r#"{"type":"event_callback","event":{"type":"message"}}"#;
        assert_eq!(
            Slack::parse(Request::new("slack", body)).unwrap_err(),
            ParseError::invalid("missing string field `event_id`")
        );
    }
}
