//! Handler that relays each event to an internal service: the receive → verify → dedupe →
//! forward job a webhook gateway is usually deployed for.
//!
//! By the time this handler runs, hookd has checked the provider's signature, dropped
//! duplicates and stored the event, so the service behind `url` receives each event once per
//! successful delivery, already authenticated, and never needs the provider's secret. It gets
//! the provider's body byte for byte; retries carry the same `Idempotency-Key`
//! (`{source}:{event_id}:{handler}`, set by hookd), so a service that honours it applies an
//! event once even when an answer is lost.
//!
//! ```toml
//! [plugins.forward]
//! allow_hosts = ["orders.internal:443"]
//! config = { url = "https://orders.internal/webhooks", pass_headers = "x-github-event", headers = '{"x-team": "payments"}' }
//! [plugins.forward.credentials]
//! "orders.internal:443" = { header = "Authorization", env = "ORDERS_TOKEN", prefix = "Bearer " }
//! ```
//!
//! | config | meaning |
//! |---|---|
//! | `url` | required: where to send each event, `https://…` or `http://…`; its `host:port` must be in `allow_hosts` |
//! | `method` | `POST` (default), `PUT` or `PATCH` |
//! | `headers` | a JSON object of extra headers to send, e.g. `{"x-team": "payments"}` |
//! | `pass_headers` | comma-separated names of the provider's request headers to pass on (every occurrence, as received) |
//!
//! Every request also carries the provider's `Content-Type` and `X-Hookd-Source`,
//! `X-Hookd-Event-Id` and `X-Hookd-Event-Type`; an id or type holding a character a header
//! cannot carry (a control character, or one beyond ASCII) is sent percent-encoded (its UTF-8
//! bytes, `%` too), as hookd sends the `Idempotency-Key`. Secrets for the internal service go in
//! `[plugins.<name>.credentials]`: hookd adds them after the request leaves the plugin.
//!
//! The answer's status decides the delivery, whatever the size of its body (only its first
//! 4 KiB are read): 2xx is `done` (output `{"status": 200}`); a transport failure, a timeout,
//! 5xx, 408 or 429 is a retry, not before the service's `Retry-After` (seconds); another
//! status, or a config error, is permanent.

use plugin_sdk::{Event, HandleError, Handler, config, http, output};
use serde_json::json;

/// The forward handler.
pub struct Forward;

impl Handler for Forward {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let target = Target::from_config(config::get)?;
        let mut request = http::request(target.method, &target.url)
            .header("x-hookd-source", &event.source)
            .header("x-hookd-event-id", header_safe(&event.event_id))
            .header("x-hookd-event-type", header_safe(&event.event_type));
        if event.stale {
            // Delivered under `on_stale = "deliver"` (or forced) although a newer event of its
            // key was handled: the service decides what an older one means.
            request = request.header("x-hookd-stale", "true");
        }
        for h in &event.headers {
            let passed = target.pass.iter().any(|p| p.eq_ignore_ascii_case(&h.name));
            if passed || h.name.eq_ignore_ascii_case("content-type") {
                request = request.header(&h.name, &h.value);
            }
        }
        for (name, value) in &target.headers {
            request = request.header(name, value);
        }
        // `?` turns the SDK's errors into the right verdict: a 503 with `Retry-After: 30`
        // becomes a retry no sooner than 30 s (capped by the plugin's `backoff_max_ms`).
        // The status decides; of the body only the start matters, for an error's message. A
        // service may answer a success with a document of any size, which must not turn an
        // event it applied into a failure.
        let response = request
            .body(event.body)
            .response_body_limit(RESPONSE_PREFIX_BYTES)
            .send()?
            .error_for_status()?;
        output::json(&json!({ "status": response.status }))
    }
}

plugin_sdk::register!(handler = Forward);

/// How much of the service's answer is read: enough for the start of an error's body.
const RESPONSE_PREFIX_BYTES: usize = 4096;

/// `value` as a header may carry it: as it is when it is printable ASCII without `%`, else
/// percent-encoded (every byte outside printable ASCII, and `%`), so percent-decoding the
/// header always gives `value` back (`%C3%A9` sent as such would read as `é`). An event id may
/// hold any character but NUL (a parser's choice), and a control character in a header failed
/// the delivery for good.
pub fn header_safe(value: &str) -> String {
    if value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'%')
    {
        return value.to_owned();
    }
    value
        .bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Where and how to forward, from the plugin's config.
#[derive(Debug, PartialEq)]
pub struct Target {
    /// The `url` config value.
    pub url: String,
    /// The `method` config value.
    pub method: http::Method,
    /// Extra headers, from the `headers` JSON object (sorted by name).
    pub headers: Vec<(String, String)>,
    /// Provider header names to pass on, from `pass_headers`.
    pub pass: Vec<String>,
}

impl Target {
    /// Reads the config through `get` (`config::get` in hookd); a bad value is a permanent
    /// error naming its key, since no retry can fix a config.
    pub fn from_config(get: impl Fn(&str) -> Option<String>) -> Result<Target, HandleError> {
        let url = get("url")
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| HandleError::permanent("config `url` is not set"))?;
        let method = match get("method").as_deref().map(str::trim) {
            None => http::Method::Post,
            Some(m) if m.eq_ignore_ascii_case("POST") => http::Method::Post,
            Some(m) if m.eq_ignore_ascii_case("PUT") => http::Method::Put,
            Some(m) if m.eq_ignore_ascii_case("PATCH") => http::Method::Patch,
            Some(m) => {
                return Err(HandleError::permanent(format!(
                    "config `method` must be POST, PUT or PATCH (got {m:?})"
                )));
            }
        };
        let headers = match get("headers") {
            None => Vec::new(),
            Some(text) => {
                let invalid = || {
                    HandleError::permanent(
                        "config `headers` must be a JSON object of strings, e.g. {\"x-team\": \"a\"}",
                    )
                };
                let map: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&text).map_err(|_| invalid())?;
                map.into_iter()
                    .map(|(name, value)| match value {
                        serde_json::Value::String(v) => Ok((name, v)),
                        _ => Err(invalid()),
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        let pass = get("pass_headers")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        Ok(Target {
            url,
            method,
            headers,
            pass,
        })
    }
}

#[cfg(test)]
mod tests {
    use plugin_sdk::testing::Harness;

    use super::*;

    const URL: &str = "https://orders.internal/webhooks";

    #[test]
    fn an_id_a_header_cannot_carry_is_sent_percent_encoded() {
        assert_eq!(header_safe("evt_1:a/b.c"), "evt_1:a/b.c");
        // Decoding gives each back, however it looked.
        assert_eq!(header_safe("evt_1:a/b%c"), "evt_1:a/b%25c");
        assert_eq!(header_safe("%C3%A9"), "%25C3%25A9");
        assert_eq!(header_safe("g-2\nX-Injected: 1"), "g-2%0AX-Injected: 1");
        assert_eq!(header_safe("order\u{1}paid"), "order%01paid");
        assert_eq!(header_safe("café 50%"), "caf%C3%A9 50%25");
    }

    fn forward(hookd: &mut Harness) -> Result<Option<String>, HandleError> {
        let event = Event::new(
            "github",
            "d-1",
            "pull_request.opened",
            r#"{"action":"opened"}"#,
        )
        .with_header("Content-Type", "application/json")
        .with_header("X-GitHub-Event", "pull_request")
        .with_header("X-Hub-Signature-256", "sha256=…");
        hookd.handle::<Forward>(event)
    }

    #[test]
    fn a_2xx_is_done_and_the_service_gets_the_body_and_the_chosen_headers() {
        let mut hookd = Harness::new()
            .with_config("url", URL)
            .with_config("pass_headers", "x-github-event")
            .with_config("headers", r#"{"x-team": "payments"}"#)
            .respond_to("POST", URL, 202);
        assert_eq!(forward(&mut hookd), Ok(Some(r#"{"status":202}"#.into())));
        let [sent] = hookd.requests() else {
            panic!("{:?}", hookd.requests())
        };
        assert_eq!(sent.body, br#"{"action":"opened"}"#);
        for (name, value) in [
            ("content-type", Some("application/json")),
            ("x-github-event", Some("pull_request")),
            ("x-team", Some("payments")),
            ("x-hookd-source", Some("github")),
            ("x-hookd-event-id", Some("d-1")),
            ("x-hookd-event-type", Some("pull_request.opened")),
            ("x-hub-signature-256", None),
            ("x-hookd-stale", None),
        ] {
            assert_eq!(sent.header(name), value, "{name}");
        }
    }

    #[test]
    fn a_stale_event_says_so() {
        let mut hookd = Harness::new()
            .with_config("url", URL)
            .respond_to("POST", URL, 200);
        let event = Event::new("stripe", "evt_1", "charge.dispute.created", "{}").with_stale(true);
        assert!(hookd.handle::<Forward>(event).is_ok());
        assert_eq!(hookd.requests()[0].header("x-hookd-stale"), Some("true"));
    }

    #[test]
    fn an_unavailable_service_is_a_retry_honouring_retry_after() {
        let mut hookd = Harness::new()
            .with_config("url", URL)
            .respond_to("POST", URL, 503);
        assert!(
            matches!(
                forward(&mut hookd),
                Err(HandleError::Retry { after: None, .. })
            ),
            "503"
        );
        let mut hookd = hookd.respond_with(
            "POST",
            URL,
            http::Response::new(503, "").with_header("retry-after", "30"),
        );
        match forward(&mut hookd) {
            Err(HandleError::Retry {
                after: Some(after), ..
            }) => assert_eq!(after.as_secs(), 30),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_4xx_or_a_url_outside_allow_hosts_is_permanent() {
        let mut hookd = Harness::new()
            .with_config("url", URL)
            .respond_to("POST", URL, 404);
        assert!(matches!(
            forward(&mut hookd),
            Err(HandleError::Permanent(_))
        ));
        // No stub stands for a host hookd would refuse.
        let mut hookd = Harness::new().with_config("url", "https://elsewhere.internal/");
        match forward(&mut hookd) {
            Err(HandleError::Permanent(reason)) => assert!(reason.contains("denied"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    fn target(pairs: &[(&str, &str)]) -> Result<Target, HandleError> {
        Target::from_config(|key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn only_url_is_required_and_method_defaults_to_post() {
        let got = target(&[("url", " http://127.0.0.1:9000/in ")]).unwrap();
        assert_eq!(
            got,
            Target {
                url: "http://127.0.0.1:9000/in".into(),
                method: http::Method::Post,
                headers: Vec::new(),
                pass: Vec::new(),
            }
        );
    }

    #[test]
    fn headers_and_pass_headers_are_read() {
        let got = target(&[
            ("url", "https://svc/"),
            ("method", "put"),
            ("headers", r#"{"x-b": "2", "x-a": "1"}"#),
            ("pass_headers", " x-github-event, ,webhook-id"),
        ])
        .unwrap();
        assert_eq!(got.method, http::Method::Put);
        assert_eq!(
            got.headers,
            [("x-a".into(), "1".into()), ("x-b".into(), "2".into())]
        );
        assert_eq!(got.pass, ["x-github-event", "webhook-id"]);
    }

    #[test]
    fn config_errors_are_permanent_and_name_the_key() {
        for (pairs, key) in [
            (&[][..], "`url`"),
            (&[("url", "http://x/"), ("method", "GET")][..], "`method`"),
            (
                &[("url", "http://x/"), ("headers", "x-a: 1")][..],
                "`headers`",
            ),
            (
                &[("url", "http://x/"), ("headers", r#"{"x-a": 1}"#)][..],
                "`headers`",
            ),
        ] {
            match target(pairs) {
                Err(HandleError::Permanent(reason)) => assert!(reason.contains(key), "{reason}"),
                other => panic!("{pairs:?}: {other:?}"),
            }
        }
    }
}
