//! Test plugin: probes what a handler can reach and reports it, so tests can assert the sandbox.
//!
//! Event body: `{"urls": [...], "headers": {name: value}, "post_to": [...], "fail": bool}`.
//! For each of `urls` it sends a `GET` with `headers` (and its own
//! `Idempotency-Key: plugin-chosen`, which the host must override) and records `"ok"` (any
//! response, including a 3xx, which must not be followed), `"denied: <the host's reason>"`,
//! `"tls: ..."` (the TLS handshake failed, and why) or `"error: ..."`. Each of `post_to` is then sent a
//! `POST` whose body is everything the plugin could learn (what the `urls` answered and its
//! environment), the way a hostile plugin would exfiltrate a secret. It also tries to read
//! files and environment variables. With `fail`, the first error is returned with `?`, so the
//! SDK's retry-or-permanent judgement decides the attempt's outcome.
//!
//! With `"hold": {"authority": "host:port", "count": N}` it first sends N plain-http `GET`s there
//! all at once (raw `wasi:http`, none awaited until all are sent), so it holds up to N
//! connections together, as a hostile plugin would to use up the host's sockets; then it waits
//! for each and reports `"held": {"answered": a, "refused": r, "failed": f}` (`refused`: the
//! host's `connection-limit-reached`).
//!
//! Output:
//! `{"urls": {url: "ok" | "denied: ..." | "tls: ..." | "error: ..."},
//!   "answers": {url: "<response body>"},
//!   "files": {"/etc/passwd": "error: ..." | "read N bytes", ".": "error: ..." | "listed N entries"},
//!   "env": {"vars": N, "HOME": null | "...", "PATH": null | "..."}}`

use std::collections::BTreeMap;

use plugin_sdk::{Event, HandleError, Handler, http, output};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Default, Deserialize)]
struct Probe {
    #[serde(default)]
    urls: Vec<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    post_to: Vec<String>,
    #[serde(default)]
    fail: bool,
    hold: Option<Hold>,
}

#[derive(Debug, Deserialize)]
struct Hold {
    authority: String,
    count: usize,
}

/// Sends `hold.count` GETs at once, then waits for each: how many were answered, refused with
/// `connection-limit-reached`, or failed otherwise.
fn hold(hold: &Hold) -> Value {
    use wasip2::http::{
        outgoing_handler,
        types::{ErrorCode, Fields, OutgoingRequest, Scheme},
    };
    let (mut answered, mut refused, mut failed) = (0, 0, 0);
    let mut pending = Vec::new();
    for _ in 0..hold.count {
        let request = OutgoingRequest::new(Fields::new());
        let _ = request.set_scheme(Some(&Scheme::Http));
        let _ = request.set_authority(Some(&hold.authority));
        let _ = request.set_path_with_query(Some("/hold"));
        match outgoing_handler::handle(request, None) {
            Ok(response) => pending.push(response),
            Err(ErrorCode::ConnectionLimitReached) => refused += 1,
            Err(_) => failed += 1,
        }
    }
    for response in pending {
        response.subscribe().block();
        match response.get() {
            Some(Ok(Ok(_))) => answered += 1,
            Some(Ok(Err(ErrorCode::ConnectionLimitReached))) => refused += 1,
            _ => failed += 1,
        }
    }
    json!({"answered": answered, "refused": refused, "failed": failed})
}

/// The netprobe handler.
pub struct Netprobe;

impl Handler for Netprobe {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let probe: Probe = event.json()?;
        let held = probe.hold.as_ref().map(hold);
        let mut urls = BTreeMap::new();
        let mut answers = BTreeMap::new();
        for url in &probe.urls {
            let mut request = http::get(url).header("idempotency-key", "plugin-chosen");
            for (name, value) in &probe.headers {
                request = request.header(name, value);
            }
            let verdict = match request.send() {
                Ok(response) => {
                    answers.insert(url.clone(), response.text().unwrap_or_default().to_owned());
                    "ok".to_owned()
                }
                Err(e) if probe.fail => return Err(e.into()),
                Err(http::HttpError::Denied(why)) => format!("denied: {why}"),
                Err(e @ http::HttpError::Tls(_)) => format!("tls: {e}"),
                Err(e) => format!("error: {e}"),
            };
            urls.insert(url.clone(), verdict);
        }
        let files = json!({
            "/etc/passwd": match std::fs::read("/etc/passwd") {
                Ok(bytes) => format!("read {} bytes", bytes.len()),
                Err(e) => format!("error: {e}"),
            },
            ".": match std::fs::read_dir(".") {
                Ok(entries) => format!("listed {} entries", entries.count()),
                Err(e) => format!("error: {e}"),
            },
        });
        let env = json!({
            "vars": std::env::vars_os().count(),
            "HOME": std::env::var("HOME").ok(),
            "PATH": std::env::var("PATH").ok(),
        });
        let learned = json!({ "urls": urls, "answers": answers, "env": env }).to_string();
        for url in &probe.post_to {
            let verdict = match http::post(url).body(learned.as_bytes()).send() {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            };
            urls.insert(format!("POST {url}"), verdict);
        }
        output::json(&json!({
            "urls": urls, "answers": answers, "files": files, "env": env, "held": held,
        }) as &Value)
    }
}

plugin_sdk::register!(handler = Netprobe);
