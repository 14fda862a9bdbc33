//! Test plugin: probes what a handler can reach and reports it, so tests can assert the sandbox.
//!
//! Event body: `{"urls": ["http://...", ...]}`. For each URL it sends a `GET` (with its own
//! `Idempotency-Key: plugin-chosen`, which the host must override) and records
//! `"ok"` (any response, including a 3xx, which must not be followed), `"denied"` (the host
//! refused it) or `"error: ..."`. It also tries to read files and environment variables.
//!
//! Output:
//! `{"urls": {url: "ok" | "denied" | "error: ..."},
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
}

/// The netprobe handler.
pub struct Netprobe;

impl Handler for Netprobe {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let probe: Probe = event.json()?;
        let mut urls = BTreeMap::new();
        for url in &probe.urls {
            let verdict = match http::get(url)
                .header("idempotency-key", "plugin-chosen")
                .send()
            {
                Ok(_) => "ok".to_owned(),
                Err(http::HttpError::Denied(_)) => "denied".to_owned(),
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
        output::json(&json!({ "urls": urls, "files": files, "env": env }) as &Value)
    }
}

plugin_sdk::register!(handler = Netprobe);
