//! Test plugin: a handler that counts the events it has handled, in plugin state.
//!
//! State key `count` holds the count as decimal text (absent = 0). Each attempt reads it,
//! writes count + 1 and returns `{"count": N}`. The host commits the write only with the
//! delivery's success, so the integration tests use it to check that state is atomic with
//! `done` and that concurrent deliveries never lose an update.
//!
//! With config `per_key = "true"`, an event with an ordering key counts under `count/<key>`
//! instead and returns `{"count": N, "key": "<key>"}`: handled in order, the `N` of each
//! event is its position among its key's handled events.
//!
//! An event delivered although it is stale (`on_stale = "deliver"`, or a forced replay) is
//! counted like any other, and its output says so: `"stale": true`.

use plugin_sdk::{Event, HandleError, Handler, config, output, state};

/// The counting handler.
pub struct Counter;

impl Handler for Counter {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let key = event
            .ordering_key
            .filter(|_| config::get("per_key").as_deref() == Some("true"));
        let name = match &key {
            Some(key) => format!("count/{key}"),
            None => "count".to_owned(),
        };
        let count = match state::get(&name) {
            None => 0,
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    HandleError::permanent(format!("state `{name}` is not a decimal number"))
                })?,
        } + 1;
        state::set(&name, count.to_string().as_bytes());
        let mut out = serde_json::json!({ "count": count });
        if let Some(key) = key {
            out["key"] = key.into();
        }
        if event.stale {
            out["stale"] = true.into();
        }
        output::json(&out)
    }
}

plugin_sdk::register!(handler = Counter);

#[cfg(test)]
mod tests {
    use plugin_sdk::testing::Harness;

    use super::*;

    fn event(id: &str) -> Event {
        Event::new("s", id, "t", "{}")
    }

    #[test]
    fn each_success_counts_once_in_committed_state() {
        let mut hookd = Harness::new();
        for n in 1..=3 {
            let output = hookd.handle::<Counter>(event(&format!("e{n}"))).unwrap();
            assert_eq!(output, Some(format!(r#"{{"count":{n}}}"#)));
        }
        assert_eq!(hookd.state("count"), Some(&b"3"[..]));
    }

    #[test]
    fn per_key_counts_under_the_ordering_key_only_when_configured() {
        let keyed = |id: &str, key: &str| event(id).with_ordering_key(key).with_sequence(1);
        let mut hookd = Harness::new();
        hookd.handle::<Counter>(keyed("e1", "a")).unwrap();
        assert_eq!(hookd.state_keys().collect::<Vec<_>>(), ["count"]);

        let mut hookd = Harness::new()
            .with_config("per_key", "true")
            .with_state("count/a", "41");
        let output = hookd.handle::<Counter>(keyed("e2", "a")).unwrap();
        assert_eq!(output.as_deref(), Some(r#"{"count":42,"key":"a"}"#));
        hookd.handle::<Counter>(keyed("e3", "b")).unwrap();
        // An event without a key still counts under `count`.
        hookd.handle::<Counter>(event("e4")).unwrap();
        assert_eq!(hookd.state("count/a"), Some(&b"42"[..]));
        assert_eq!(hookd.state("count/b"), Some(&b"1"[..]));
        assert_eq!(hookd.state("count"), Some(&b"1"[..]));
    }

    #[test]
    fn a_stale_event_counts_and_says_so() {
        let mut hookd = Harness::new().with_state("count", "7");
        let late = event("e1")
            .with_ordering_key("a")
            .with_sequence(1)
            .with_stale(true);
        let output = hookd.handle::<Counter>(late).unwrap();
        assert_eq!(output.as_deref(), Some(r#"{"count":8,"stale":true}"#));
    }

    #[test]
    fn a_count_that_is_not_a_number_is_permanent_and_changes_nothing() {
        let mut hookd = Harness::new().with_state("count", "many");
        assert_eq!(
            hookd.handle::<Counter>(event("e1")),
            Err(HandleError::permanent(
                "state `count` is not a decimal number"
            ))
        );
        assert_eq!(hookd.state("count"), Some(&b"many"[..]));
    }
}
