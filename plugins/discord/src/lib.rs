//! Parser for Discord interactions (slash commands, buttons, modals).
//!
//! An interaction is a JSON object:
//!
//! - event id: `id`, the interaction's snowflake, unique per interaction;
//! - event type: the interaction `type` by name (`application_command`, `message_component`,
//!   `autocomplete`, `modal_submit`), a command's name appended for commands
//!   (`application_command.deploy`);
//! - no ordering key: interactions are independent, each answered through its own `token`
//!   (valid for 15 minutes), so one whose handler keeps failing must not hold back the others
//!   of its channel until their tokens expire.
//!
//! The `PING` (`type` 1) handshake never reaches a parser: hookd answers it for a source with
//! `scheme = "discord"`. Should one arrive anyway, it is ignored, not stored. A stored
//! interaction is answered by hookd too, with a deferred response (Discord wants one within
//! 3 s); the handler completes it through the follow-up webhook with the interaction's `token`.

use plugin_sdk::{Envelope, ParseError, Parser, Request};
use serde_json::Value;

/// The Discord parser.
pub struct Discord;

/// Discord's interaction types by number.
fn type_name(number: u64) -> Option<&'static str> {
    Some(match number {
        1 => "ping",
        2 => "application_command",
        3 => "message_component",
        4 => "autocomplete",
        5 => "modal_submit",
        _ => return None,
    })
}

impl Parser for Discord {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        let body: Value = req.json()?;
        let number = body
            .get("type")
            .and_then(Value::as_u64)
            .ok_or_else(|| ParseError::invalid("missing numeric field `type`"))?;
        let kind = type_name(number)
            .ok_or_else(|| ParseError::invalid(format!("unknown interaction type {number}")))?;
        if number == 1 {
            return Err(ParseError::ignore("PING is a handshake, not an event"));
        }
        let id = body
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ParseError::invalid("missing string field `id`"))?;
        let event_type = match body.pointer("/data/name").and_then(Value::as_str) {
            Some(command) if number == 2 => format!("{kind}.{command}"),
            _ => kind.to_owned(),
        };
        Ok(Envelope::new(id, event_type))
    }
}

plugin_sdk::register!(parser = Discord);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_command_maps_its_id_and_command_and_orders_by_nothing() {
        let body = r#"{"id":"1234567890","application_id":"42","type":2,
                       "data":{"id":"7","name":"deploy"},"channel_id":"C9","token":"tok"}"#;
        let env = Discord::parse(Request::new("discord", body)).unwrap();
        // No key: another interaction of channel C9 never waits behind this one's retries.
        assert_eq!(
            env,
            Envelope::new("1234567890", "application_command.deploy")
        );
    }

    #[test]
    fn a_button_press_is_a_message_component() {
        let body = r#"{"id":"55","type":3,"data":{"custom_id":"ok"}}"#;
        let env = Discord::parse(Request::new("discord", body)).unwrap();
        assert_eq!(env, Envelope::new("55", "message_component"));
    }

    #[test]
    fn a_ping_is_ignored() {
        assert!(matches!(
            Discord::parse(Request::new("discord", r#"{"type":1,"id":"1"}"#)),
            Err(ParseError::Ignore(_))
        ));
    }

    #[test]
    fn an_unknown_type_is_invalid() {
        assert_eq!(
            Discord::parse(Request::new("discord", r#"{"type":99,"id":"1"}"#)).unwrap_err(),
            ParseError::invalid("unknown interaction type 99")
        );
    }
}
