//! Parser for GitHub webhooks.
//!
//! - event id: the `X-GitHub-Delivery` header (a GUID GitHub keeps across redeliveries);
//! - event type: the `X-GitHub-Event` header, plus `.` and the body's `action` when there is
//!   one (`issues.opened`, `pull_request.closed`, `push`);
//! - ordering key: `{repository.full_name}#{number}` for events about an issue or a pull
//!   request, so one thread's events are handled in order; `{repository.full_name}` for other
//!   repository events; none for events without a repository;
//! - `ping` (sent when a webhook is created) is acknowledged and ignored.
//!
//! GitHub has no per-event sequence number, so none is set. Configure the webhook's content
//! type as `application/json`: form-encoded payloads are refused as invalid.

use plugin_sdk::{Envelope, ParseError, Parser, Request};
use serde::Deserialize;

/// The fields of a payload the envelope needs; serde skips the rest without building them.
#[derive(Deserialize)]
struct Payload {
    action: Option<String>,
    repository: Option<Repository>,
    issue: Option<Numbered>,
    pull_request: Option<Numbered>,
}

#[derive(Deserialize)]
struct Repository {
    full_name: Option<String>,
}

#[derive(Deserialize)]
struct Numbered {
    number: Option<u64>,
}

/// The GitHub parser.
pub struct GitHub;

impl Parser for GitHub {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        let event_id = required_header(&req, "X-GitHub-Delivery")?;
        let event = required_header(&req, "X-GitHub-Event")?;
        if event == "ping" {
            return Err(ParseError::ignore("ping"));
        }
        let body: Payload = req.json().map_err(|e| {
            ParseError::invalid(format!(
                "{e} (set the webhook's content type to application/json)"
            ))
        })?;

        let event_type = match &body.action {
            Some(action) => format!("{event}.{action}"),
            None => event.to_owned(),
        };
        let envelope = Envelope::new(event_id, event_type);
        Ok(match ordering_key(&body) {
            Some(key) => envelope.ordering_key(key),
            None => envelope,
        })
    }
}

plugin_sdk::register!(parser = GitHub);

fn required_header<'a>(req: &'a Request, name: &str) -> Result<&'a str, ParseError> {
    req.header(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ParseError::invalid(format!("missing header {name}")))
}

/// `owner/repo#number` for an issue or pull request, `owner/repo` for other repository events.
fn ordering_key(body: &Payload) -> Option<String> {
    let repo = body.repository.as_ref()?.full_name.as_deref()?;
    let number = [&body.issue, &body.pull_request]
        .into_iter()
        .find_map(|thread| thread.as_ref()?.number);
    Some(match number {
        Some(n) => format!("{repo}#{n}"),
        None => repo.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(event: &str, body: &str) -> Request {
        Request::new("github", body)
            .with_header("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
            .with_header("X-GitHub-Event", event)
    }

    #[test]
    fn issue_events_are_typed_by_action_and_ordered_per_issue() {
        let body = r#"{"action":"opened","issue":{"number":7},"repository":{"full_name":"o/r"}}"#;
        let env = GitHub::parse(request("issues", body)).unwrap();
        assert_eq!(env.event_id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        assert_eq!(env.event_type, "issues.opened");
        assert_eq!(env.ordering_key.as_deref(), Some("o/r#7"));
        assert_eq!(env.sequence, None);
    }

    #[test]
    fn ordering_key_table() {
        let cases = [
            (
                r#"{"pull_request":{"number":3},"repository":{"full_name":"o/r"}}"#,
                Some("o/r#3"),
            ),
            (
                r#"{"ref":"refs/heads/main","repository":{"full_name":"o/r"}}"#,
                Some("o/r"),
            ),
            (r#"{"organization":{"login":"o"}}"#, None),
        ];
        for (body, want) in cases {
            let env = GitHub::parse(request("x", body)).unwrap();
            assert_eq!(env.ordering_key.as_deref(), want, "{body}");
        }
    }

    #[test]
    fn events_without_action_keep_the_header_type() {
        let env = GitHub::parse(request("push", r#"{"repository":{"full_name":"o/r"}}"#)).unwrap();
        assert_eq!(env.event_type, "push");
    }

    #[test]
    fn null_fields_count_as_absent_and_other_fields_are_skipped() {
        let body = r#"{"action":null,"issue":null,"pull_request":{"number":9,"head":{"sha":"x"}},
            "repository":{"full_name":"o/r","owner":{"login":"o"},"topics":["a",1,null]},
            "sender":{"login":"u","site_admin":false}}"#;
        let env = GitHub::parse(request("pull_request", body)).unwrap();
        assert_eq!(env.event_type, "pull_request");
        assert_eq!(env.ordering_key.as_deref(), Some("o/r#9"));
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let err = GitHub::parse(request("issues", r#"{"action":7}"#)).unwrap_err();
        let ParseError::Invalid(msg) = err else {
            panic!("{err}")
        };
        assert!(msg.contains("invalid type: integer `7`"), "{msg}");
    }

    #[test]
    fn ping_is_ignored() {
        let err = GitHub::parse(request("ping", r#"{"zen":"hi"}"#)).unwrap_err();
        assert!(matches!(err, ParseError::Ignore(_)), "{err}");
    }

    #[test]
    fn missing_headers_are_named() {
        let no_id = Request::new("github", "{}").with_header("X-GitHub-Event", "push");
        assert_eq!(
            GitHub::parse(no_id).unwrap_err(),
            ParseError::invalid("missing header X-GitHub-Delivery")
        );
        let no_event = Request::new("github", "{}").with_header("X-GitHub-Delivery", "d");
        assert_eq!(
            GitHub::parse(no_event).unwrap_err(),
            ParseError::invalid("missing header X-GitHub-Event")
        );
    }

    #[test]
    fn form_encoded_bodies_are_invalid() {
        let err = GitHub::parse(request("push", "payload=%7B%7D")).unwrap_err();
        let ParseError::Invalid(msg) = err else {
            panic!("{err}")
        };
        assert!(msg.contains("application/json"), "{msg}");
    }
}
