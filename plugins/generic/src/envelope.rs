//! The generic parser's logic, free of the wasm bindings so it also builds for the host (unit
//! tests, fuzzing): validated settings, and the envelope they extract from a request.
//!
//! Invariant: total over any config text and any request — every problem is a
//! `ParseError::invalid` naming the config key, header or pointer, never a panic.

use plugin_sdk::{Envelope, ParseError, Request};
use serde_json::Value;

/// Where a value is found in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Header(String),
    Pointer(String),
}

/// The parser's configuration, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    id: Location,
    event_type: Option<Location>,
    key_pointer: Option<String>,
    sequence_pointer: Option<String>,
}

impl Settings {
    /// Reads and validates the settings through `get` (the plugin config, or a map in tests).
    pub(crate) fn from_config(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, ParseError> {
        let id = location(&get, "id_header", "id_pointer")?.ok_or_else(|| {
            ParseError::invalid(
                "generic parser is not configured: set `id_header` (a header name) or \
                 `id_pointer` (a JSON pointer such as `/id`) in the plugin's config",
            )
        })?;
        Ok(Settings {
            id,
            event_type: location(&get, "type_header", "type_pointer")?,
            key_pointer: pointer(&get, "key_pointer")?,
            sequence_pointer: pointer(&get, "sequence_pointer")?,
        })
    }

    /// Extracts the envelope from `req` as configured.
    pub(crate) fn envelope(&self, req: &Request) -> Result<Envelope, ParseError> {
        let body = Body::new(req);
        let event_id = body.required(&self.id)?;
        let event_type = match &self.event_type {
            Some(location) => body.required(location)?,
            None => "event".to_owned(),
        };
        let mut envelope = Envelope::new(event_id, event_type);
        if let Some(p) = &self.key_pointer
            && let Some(value) = body.pointer(p)?
        {
            envelope = envelope.ordering_key(key(p, value)?);
        }
        if let Some(p) = &self.sequence_pointer
            && let Some(value) = body.pointer(p)?
        {
            let sequence = sequence(value).ok_or_else(|| {
                ParseError::invalid(format!("`{p}` is not a non-negative integer"))
            })?;
            envelope = envelope.sequence(sequence);
        }
        Ok(envelope)
    }
}

/// The one configured location among `header_key` and `pointer_key`, if any.
fn location(
    get: &impl Fn(&str) -> Option<String>,
    header_key: &str,
    pointer_key: &str,
) -> Result<Option<Location>, ParseError> {
    match (get(header_key), pointer(get, pointer_key)?) {
        (Some(_), Some(_)) => Err(ParseError::invalid(format!(
            "generic parser config sets both `{header_key}` and `{pointer_key}`; keep one"
        ))),
        (Some(header), None) => Ok(Some(Location::Header(header))),
        (None, Some(pointer)) => Ok(Some(Location::Pointer(pointer))),
        (None, None) => Ok(None),
    }
}

/// The JSON pointer configured under `key`, checked for syntax.
fn pointer(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<Option<String>, ParseError> {
    match get(key) {
        Some(p) if !p.is_empty() && !p.starts_with('/') => Err(ParseError::invalid(format!(
            "generic parser config `{key}` = {p:?} is not a JSON pointer: it must start with `/`, \
             e.g. `/data/id`"
        ))),
        other => Ok(other),
    }
}

/// The request, with its body decoded as JSON only when a pointer needs it.
struct Body<'a> {
    req: &'a Request,
    json: std::cell::OnceCell<Result<Value, String>>,
}

impl<'a> Body<'a> {
    fn new(req: &'a Request) -> Self {
        Body {
            req,
            json: std::cell::OnceCell::new(),
        }
    }

    /// The value at `pointer`; `None` if absent or null.
    fn pointer(&self, pointer: &str) -> Result<Option<&Value>, ParseError> {
        let json = self
            .json
            .get_or_init(|| self.req.json::<Value>().map_err(|e| e.to_string()));
        let json = json.as_ref().map_err(|e| ParseError::invalid(e.clone()))?;
        Ok(json.pointer(pointer).filter(|v| !v.is_null()))
    }

    /// The string at `location`, or an `invalid` error naming it.
    fn required(&self, location: &Location) -> Result<String, ParseError> {
        match location {
            Location::Header(name) => self
                .req
                .header(name)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| ParseError::invalid(format!("missing header {name}"))),
            Location::Pointer(p) => {
                let value = self
                    .pointer(p)?
                    .ok_or_else(|| ParseError::invalid(format!("missing `{p}` in the body")))?;
                Some(exact_scalar(p, value)?)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| ParseError::invalid(format!("`{p}` is empty")))
            }
        }
    }
}

/// The string, or the whole number within 64 bits, at pointer `p`, as text; else an `invalid`
/// naming `p`. Another number is refused: read through a float, two different numbers could
/// become one id (one event a duplicate of another) or one ordering key (one object's event
/// stale behind another's).
fn exact_scalar(p: &str, value: &Value) -> Result<String, ParseError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_f64() => Err(ParseError::invalid(format!(
            "`{p}` is a number no id or key can keep exactly (not a whole number, or past 64 \
             bits): send it as a string"
        ))),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(ParseError::invalid(format!(
            "`{p}` is not a string or number"
        ))),
    }
}

/// The ordering key at pointer `p`, as text: as [`exact_scalar`], but a number with a fraction
/// or an exponent below 2^53 keeps its float text (`42.0`, `1.5`), as keys always have: such a
/// number is one float exactly, and an existing key must stay the key it was. Past 2^53 floats
/// stop telling whole numbers apart, so two objects' keys could become one: refused.
fn key(p: &str, value: &Value) -> Result<String, ParseError> {
    const EXACT_BELOW: f64 = 9_007_199_254_740_992.0; // 2^53
    match value {
        Value::Number(n)
            if n.as_f64()
                .is_some_and(|f| n.is_f64() && f.abs() < EXACT_BELOW) =>
        {
            Ok(n.to_string())
        }
        other => exact_scalar(p, other),
    }
}

/// A non-negative integer, given as a number or a numeric string.
fn sequence(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ParseError> {
        Settings::from_config(|key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        })
    }

    fn parse(pairs: &[(&str, &str)], req: Request) -> Result<Envelope, ParseError> {
        settings(pairs)?.envelope(&req)
    }

    #[test]
    fn full_configuration_extracts_every_field() {
        let body =
            r#"{"event":"order.paid","order":{"id":42,"version":"7"},"meta":{"id":"evt_9"}}"#;
        let env = parse(
            &[
                ("id_pointer", "/meta/id"),
                ("type_pointer", "/event"),
                ("key_pointer", "/order/id"),
                ("sequence_pointer", "/order/version"),
            ],
            Request::new("acme", body),
        )
        .unwrap();
        assert_eq!(
            env,
            Envelope::new("evt_9", "order.paid")
                .ordering_key("42")
                .sequence(7)
        );
    }

    #[test]
    fn headers_need_no_json_body() {
        let req = Request::new("acme", "not json at all")
            .with_header("X-Acme-Delivery", "d-1")
            .with_header("X-Acme-Event", "ping");
        let env = parse(
            &[
                ("id_header", "x-acme-delivery"),
                ("type_header", "X-ACME-EVENT"),
            ],
            req,
        )
        .unwrap();
        assert_eq!(env, Envelope::new("d-1", "ping"));
    }

    #[test]
    fn type_defaults_to_event_and_optional_fields_may_be_absent() {
        let env = parse(
            &[
                ("id_pointer", "/id"),
                ("key_pointer", "/missing"),
                ("sequence_pointer", "/seq"),
            ],
            Request::new("acme", r#"{"id":"e1","seq":null}"#),
        )
        .unwrap();
        assert_eq!(env, Envelope::new("e1", "event"));
    }

    #[test]
    fn errors_name_what_is_missing_or_wrong() {
        let body = r#"{"id":"e1","obj":{},"seq":-1,"word":"abc"}"#;
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[],
                "generic parser is not configured: set `id_header` (a header name) or \
                 `id_pointer` (a JSON pointer such as `/id`) in the plugin's config",
            ),
            (
                &[("id_header", "x-id"), ("id_pointer", "/id")],
                "generic parser config sets both `id_header` and `id_pointer`; keep one",
            ),
            (
                &[("id_pointer", "id")],
                "generic parser config `id_pointer` = \"id\" is not a JSON pointer: it must \
                 start with `/`, e.g. `/data/id`",
            ),
            (&[("id_header", "x-id")], "missing header x-id"),
            (&[("id_pointer", "/nope")], "missing `/nope` in the body"),
            (
                &[("id_pointer", "/obj")],
                "`/obj` is not a string or number",
            ),
            (
                &[("id_pointer", "/id"), ("type_pointer", "/type")],
                "missing `/type` in the body",
            ),
            (
                &[("id_pointer", "/id"), ("key_pointer", "/obj")],
                "`/obj` is not a string or number",
            ),
            (
                &[("id_pointer", "/id"), ("sequence_pointer", "/seq")],
                "`/seq` is not a non-negative integer",
            ),
            (
                &[("id_pointer", "/id"), ("sequence_pointer", "/word")],
                "`/word` is not a non-negative integer",
            ),
        ];
        for (config, want) in cases {
            let got = parse(config, Request::new("acme", body)).unwrap_err();
            assert_eq!(got, ParseError::invalid(*want), "config {config:?}");
        }
    }

    #[test]
    fn pointers_into_a_non_json_body_are_invalid() {
        let err = parse(&[("id_pointer", "/id")], Request::new("acme", "x=1")).unwrap_err();
        assert!(
            matches!(&err, ParseError::Invalid(m) if m.starts_with("body is not valid JSON")),
            "{err}"
        );
    }

    #[test]
    fn numeric_ids_and_sequences_are_accepted() {
        let env = parse(
            &[("id_pointer", "/id"), ("sequence_pointer", "/seq")],
            Request::new("acme", r#"{"id":123,"seq":" 5 "}"#),
        )
        .unwrap();
        assert_eq!(env, Envelope::new("123", "event").sequence(5));
        let negative = parse(
            &[("id_pointer", "/id")],
            Request::new("acme", r#"{"id":-7}"#),
        );
        assert_eq!(negative.unwrap(), Envelope::new("-7", "event"));
    }

    /// Numbers past 64 bits (or not whole) pass through a float: 2^64 and 2^64 + 1 would be one
    /// id, and the second event a duplicate never stored. They are refused instead.
    #[test]
    fn a_number_no_id_can_keep_exactly_is_invalid() {
        for body in [
            r#"{"id":18446744073709551616}"#,
            r#"{"id":123456789012345678901234567890}"#,
            r#"{"id":1.5}"#,
        ] {
            let err = parse(&[("id_pointer", "/id")], Request::new("acme", body)).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid(m) if m.contains("send it as a string")),
                "{body}: {err}"
            );
        }
    }

    /// So are they as an ordering key: two objects' keys past 64 bits would be one key, and
    /// one object's event stale behind the other's sequence (before, they were).
    #[test]
    fn a_number_no_key_can_keep_exactly_is_invalid() {
        let config = [("id_pointer", "/id"), ("key_pointer", "/subject")];
        for subject in ["12345678901234567890123", "1e300"] {
            let body = format!(r#"{{"id":"e1","subject":{subject}}}"#);
            let err = parse(&config, Request::new("acme", body.as_str())).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid(m) if m.contains("`/subject`") && m.contains("send it as a string")),
                "{body}: {err}"
            );
        }
        let whole = parse(&config, Request::new("acme", r#"{"id":"e1","subject":42}"#));
        assert_eq!(
            whole.unwrap(),
            Envelope::new("e1", "event").ordering_key("42")
        );
        // A float a key was before keeps being that key.
        for (subject, key) in [("42.0", "42.0"), ("1.5", "1.5"), ("-7", "-7")] {
            let body = format!(r#"{{"id":"e1","subject":{subject}}}"#);
            let env = parse(&config, Request::new("acme", body.as_str())).unwrap();
            assert_eq!(
                env,
                Envelope::new("e1", "event").ordering_key(key),
                "{subject}"
            );
        }
    }

    #[test]
    fn an_empty_id_is_invalid() {
        let err = parse(
            &[("id_pointer", "/id")],
            Request::new("acme", r#"{"id":""}"#),
        );
        assert_eq!(err.unwrap_err(), ParseError::invalid("`/id` is empty"));
    }
}
