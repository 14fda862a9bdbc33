//! Microsoft Graph's change notifications (`{"value": [notification, ...]}`), checked without
//! building the body: each `clientState` is compared as the reader passes it, and everything
//! else is skipped. The body is untrusted and not yet verified (the `clientState` is the
//! check), so reading it must cost about its bytes: a `serde_json::Value` of a 25 MiB list of
//! numbers took about 17 times that.
//!
//! Invariant: every notification's `clientState` is compared with [`Secret::matches`] (constant
//! time), and the result is one [`Choice`] of them all, decided after the whole list is read.

use std::{cell::Cell, fmt};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use subtle::Choice;

use crate::{Secret, VerifyError};

const NOT_A_LIST: &str = "no \"value\" list of notifications";
const NO_CLIENT_STATE: &str = "a notification has no clientState";

/// What the reader found so far.
struct Reading<'t> {
    token: &'t Secret,
    /// Every `clientState` so far matched.
    all: Cell<Choice>,
    notifications: Cell<usize>,
    /// The reason to give if the reader stops on a value of the wrong shape.
    why: Cell<&'static str>,
}

/// Checks `body`: every notification's `clientState` is `token`.
pub(crate) fn client_states(token: &Secret, body: &[u8]) -> Result<(), VerifyError> {
    let reading = Reading {
        token,
        all: Cell::new(Choice::from(1)),
        notifications: Cell::new(0),
        why: Cell::new(NOT_A_LIST),
    };
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let read = Body(&reading)
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end());
    let malformed = |reason| VerifyError::MalformedBody { reason };
    match read {
        Err(e) if e.is_data() => return Err(malformed(reading.why.get())),
        Err(_) => return Err(malformed("not JSON")),
        Ok(()) => {}
    }
    if reading.notifications.get() == 0 {
        return Err(malformed(NOT_A_LIST));
    }
    if bool::from(reading.all.get()) {
        Ok(())
    } else {
        Err(VerifyError::ClientStateMismatch)
    }
}

/// The body: an object whose `value` is the list (every `value` key, if repeated).
struct Body<'r, 't>(&'r Reading<'t>);

impl<'de> DeserializeSeed<'de> for Body<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Body<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key>()? {
            if key.0 == Some(Field::Value) {
                self.0.why.set(NOT_A_LIST);
                map.next_value_seed(List(self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The list of notifications.
struct List<'r, 't>(&'r Reading<'t>);

impl<'de> DeserializeSeed<'de> for List<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for List<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of notifications")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            self.0.why.set(NO_CLIENT_STATE);
            if seq.next_element_seed(Notification(self.0))?.is_none() {
                return Ok(());
            }
            self.0.notifications.set(self.0.notifications.get() + 1);
        }
    }
}

/// One notification: an object with a string `clientState` (each one, if repeated).
struct Notification<'r, 't>(&'r Reading<'t>);

impl<'de> DeserializeSeed<'de> for Notification<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Notification<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a notification")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = false;
        while let Some(key) = map.next_key::<Key>()? {
            if key.0 == Some(Field::ClientState) {
                map.next_value_seed(ClientState(self.0))?;
                seen = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if seen {
            Ok(())
        } else {
            Err(de::Error::custom(NO_CLIENT_STATE))
        }
    }
}

/// A `clientState`, compared where it lies in the body (or in the reader's scratch buffer, when
/// it holds escapes).
struct ClientState<'r, 't>(&'r Reading<'t>);

impl<'de> DeserializeSeed<'de> for ClientState<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for ClientState<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, state: &str) -> Result<(), E> {
        let matched = Choice::from(u8::from(self.0.token.matches(state.as_bytes())));
        self.0.all.set(self.0.all.get() & matched);
        Ok(())
    }
}

/// The keys this reader looks for; any other is `None` (and its value skipped).
#[derive(PartialEq, Eq)]
enum Field {
    Value,
    ClientState,
}

struct Key(Option<Field>);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(Key(match key {
            "value" => Some(Field::Value),
            "clientState" => Some(Field::ClientState),
            _ => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str) -> Result<(), VerifyError> {
        client_states(&Secret::new("s3cret".into()), body.as_bytes())
    }

    fn reason(body: &str) -> &'static str {
        match check(body) {
            Err(VerifyError::MalformedBody { reason }) => reason,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn every_notification_must_carry_the_client_state() {
        check(r#"{"value":[{"clientState":"s3cret","resource":{"a":[1,2]}}]}"#).unwrap();
        // Escapes are read as the string they spell.
        check(r#"{"x":1,"value":[{"clientState":"s3\u0063ret"},{"clientState":"s3cret"}]}"#)
            .unwrap();
        let one_wrong = format!(
            r#"{{"value":[{}{{"clientState":"wrong"}}]}}"#,
            r#"{"clientState":"s3cret"},"#.repeat(1000)
        );
        assert!(matches!(
            check(&one_wrong),
            Err(VerifyError::ClientStateMismatch)
        ));
        // A key given twice is checked twice.
        assert!(matches!(
            check(r#"{"value":[{"clientState":"s3cret","clientState":"wrong"}]}"#),
            Err(VerifyError::ClientStateMismatch)
        ));
    }

    #[test]
    fn a_body_of_another_shape_is_malformed_with_its_reason() {
        assert_eq!(reason("{\"value\":[{\"clientState\":"), "not JSON");
        assert_eq!(reason("not json"), "not JSON");
        assert_eq!(
            reason(r#"{"value":[{"clientState":"s3cret"}]} x"#),
            "not JSON"
        );
        for body in [
            "[]",
            "{}",
            r#"{"value":[]}"#,
            r#"{"value":"s3cret"}"#,
            r#"{"other":[{"clientState":"s3cret"}]}"#,
        ] {
            assert_eq!(reason(body), NOT_A_LIST, "{body}");
        }
        for body in [
            r#"{"value":[{}]}"#,
            r#"{"value":[1]}"#,
            r#"{"value":[{"clientState":7}]}"#,
            r#"{"value":[{"clientState":"s3cret"},{"resource":"x"}]}"#,
        ] {
            assert_eq!(reason(body), NO_CLIENT_STATE, "{body}");
        }
    }
}
