//! Which text of an event to classify.
//!
//! - An explicit `text_pointer` always wins over any shape found in the body.
//! - Without one, the body's own shape decides (see [`extract`]); a body with no text is an
//!   empty string, never an error.

use std::fmt;

use serde_json::{Map, Value};

use crate::shapes;

/// Fields that usually hold human-written text, in the order they are concatenated.
pub const WELL_KNOWN_FIELDS: &[&str] = &["title", "body", "text", "description", "message"];

/// Objects one level down that describe the context of an event (who sent it, where) rather
/// than its subject; their `description` is not what the event says.
const CONTEXT_OBJECTS: [&str; 6] = [
    "enterprise",
    "installation",
    "organization",
    "owner",
    "repository",
    "sender",
];

/// The configured `text_pointer` is not a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPointer(pub String);

impl fmt::Display for BadPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "classifier config `text_pointer` = {:?} is not a JSON pointer: it must start with `/`, \
             e.g. `/issue/body`",
            self.0
        )
    }
}

impl std::error::Error for BadPointer {}

/// The text to classify in `body`; empty when there is none.
///
/// - With `pointer`: the value there (strings inside an array or object are joined).
/// - Otherwise, from a JSON object, the first of these that has text:
///   1. a Stripe event: its type in words (`invoice payment failed`) and the `data.object`
///      text fields (`description`, `failure_message`, `reason`, ..., see [`shapes::stripe`]);
///   2. the [`WELL_KNOWN_FIELDS`] at the top level;
///   3. the subject of a common provider's event ([`shapes::subject`]): a GitHub comment or
///      review body, an issue's, pull request's or discussion's title and body, a release's
///      name and body, a push's commit messages; a Slack event's `text`; a Shopify `note`;
///   4. the [`WELL_KNOWN_FIELDS`] one level down (children in key order, skipping context
///      objects such as `repository` and `sender`).
///
///   Parts are joined by newlines.
/// - A body that is not JSON but is UTF-8 is classified as it is.
pub fn extract(body: &[u8], pointer: Option<&str>) -> Result<String, BadPointer> {
    if let Some(p) = pointer
        && !p.is_empty()
        && !p.starts_with('/')
    {
        return Err(BadPointer(p.to_owned()));
    }
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return Ok(std::str::from_utf8(body).unwrap_or("").trim().to_owned());
    };
    if let Some(p) = pointer {
        let mut parts = Vec::new();
        if let Some(value) = json.pointer(p) {
            strings(value, &mut parts);
        }
        return Ok(parts.join("\n"));
    }
    let Value::Object(top) = &json else {
        return Ok(String::new());
    };
    if let Some(text) = shapes::stripe(top)
        .or_else(|| well_known(top))
        .or_else(|| shapes::subject(top))
    {
        return Ok(text);
    }
    let mut children: Vec<(&String, &Map<String, Value>)> = top
        .iter()
        .filter(|(key, _)| !CONTEXT_OBJECTS.contains(&key.as_str()))
        .filter_map(|(key, value)| value.as_object().map(|o| (key, o)))
        .collect();
    children.sort_by_key(|(key, _)| *key);
    Ok(children
        .into_iter()
        .find_map(|(_, child)| well_known(child))
        .unwrap_or_default())
}

/// The non-blank well-known fields of `object`, joined; `None` if there are none.
fn well_known(object: &Map<String, Value>) -> Option<String> {
    shapes::joined(object, WELL_KNOWN_FIELDS.iter().map(std::slice::from_ref))
}

/// Every non-blank string in `value`, depth first.
fn strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) if !s.trim().is_empty() => out.push(s.trim()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, pointer: Option<&str>, want: &str) {
        assert_eq!(extract(body.as_bytes(), pointer).unwrap(), want, "{body}");
    }

    #[test]
    fn well_known_fields_at_the_top_level() {
        check(
            r#"{"title":"Crash","body":"on start","id":1}"#,
            None,
            "Crash\non start",
        );
        check(r#"{"message":"m","title":" t "}"#, None, "t\nm");
    }

    #[test]
    fn well_known_fields_one_level_down() {
        let github = r#"{"action":"opened","issue":{"title":"Crash","body":"on start"},
                         "repository":{"description":"a repo"},"sender":{"login":"x"}}"#;
        check(github, None, "Crash\non start");
        check(
            r#"{"b":{"text":"second"},"a":{"text":"first"}}"#,
            None,
            "first",
        );
        check(r#"{"repository":{"description":"a repo"}}"#, None, "");
    }

    #[test]
    fn pointer_selects_the_text() {
        let stripe = r#"{"data":{"object":{"description":"refund please","amount":5}}}"#;
        check(stripe, Some("/data/object/description"), "refund please");
        check(stripe, Some("/data/object"), "refund please");
        check(stripe, Some("/missing"), "");
        assert_eq!(
            extract(b"{}", Some("data")),
            Err(BadPointer("data".to_owned()))
        );
    }

    #[test]
    fn no_text_is_empty_not_an_error() {
        check("", None, "");
        check("[1,2]", None, "");
        check(r#"{"title":"  "}"#, None, "");
        assert_eq!(extract(&[0xff, 0xfe], None).unwrap(), "");
    }

    #[test]
    fn plain_text_bodies_are_used_as_is() {
        check(
            "  why is my invoice wrong?\n",
            None,
            "why is my invoice wrong?",
        );
    }
}
