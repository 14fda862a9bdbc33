//! Handler that labels an event's text: is this issue a bug, a feature request, a question, a
//! billing problem?
//!
//! Output, stored on the delivery:
//! `{"label": "bug", "score": 0.75, "via": "keywords", "matched": ["crash", "error"]}` offline,
//! `{"label": "bug", "via": "model"}` when a model decided.
//!
//! | config | meaning |
//! |---|---|
//! | `labels` | comma-separated labels to choose from; default `bug,feature,question,billing,other` |
//! | `text_pointer` | JSON pointer to the text to classify, e.g. `/data/object/description`; it wins over anything found in the body. Default: the text of the body's shape (Stripe `data.object` fields and event type, GitHub issue/PR/comment/review/commit text, Slack `event.text`, ...; see [`text::extract`]) |
//! | `model_url` | an OpenAI-compatible chat-completions URL (`https://host/v1/chat/completions` or `http://host:port/...`); its `host:port` (443 for `https` without a port) must be in the plugin's `allow_hosts`. A hosted model's API key goes in `[plugins.<name>.credentials]`, injected by hookd, never in this config. Unset: offline keywords |
//! | `model` | the `model` field of the request; default `default` |
//!
//! Without `model_url` classification is offline keyword scoring ([`keywords`]): text that
//! says nothing (or no text at all) is labelled `other` with score 0, an answer, not an error.
//! With it, the model decides ([`model`]); a model that fails or times out makes the attempt a
//! retry (never a silent fallback to keywords, which would store a different kind of answer).

pub mod keywords;
pub mod model;
pub mod shapes;
pub mod text;

#[cfg(test)]
mod payloads;

use plugin_sdk::{Event, HandleError, Handler, config, log, output};

/// Labels used when the config has none.
pub const DEFAULT_LABELS: &str = "bug,feature,question,billing,other";

/// The classifier handler.
pub struct Classifier;

impl Handler for Classifier {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let labels = labels(config::get("labels").as_deref());
        let pointer = config::get("text_pointer");
        let text = text::extract(event.body(), pointer.as_deref())
            .map_err(|e| HandleError::permanent(e.to_string()))?;
        if let Some(url) = config::get("model_url").filter(|u| !u.trim().is_empty()) {
            let model_name = config::get("model").unwrap_or_else(|| DEFAULT_MODEL.to_owned());
            let label = model::classify(url.trim(), &model_name, &text, &labels)?;
            log::debug(format!(
                "{} classified as {label} by model {model_name} from {} chars",
                event.event_id,
                text.len()
            ));
            return output::json(&serde_json::json!({ "label": label, "via": "model" }));
        }
        let result = classify(&text, &labels);
        log::debug(format!(
            "{} classified as {} ({:.2}) from {} chars",
            event.event_id,
            result.label,
            result.score,
            text.len()
        ));
        output::json(&result.to_json())
    }
}

/// The `model` sent when the config names none.
pub const DEFAULT_MODEL: &str = "default";

plugin_sdk::register!(handler = Classifier);

/// A label chosen for a text, with the evidence for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    /// One of the configured labels.
    pub label: String,
    /// Confidence in 0..=1; 0 when nothing pointed to any label.
    pub score: f64,
    /// Which classifier decided (`keywords` here; the model path outputs `model`).
    pub via: &'static str,
    /// The evidence: keywords found in the text.
    pub matched: Vec<String>,
}

impl Classification {
    /// The handler's JSON output.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "label": self.label,
            "score": self.score,
            "via": self.via,
            "matched": self.matched,
        })
    }
}

/// Classifies `text` into one of `labels` (non-empty; see [`labels`]) offline, by keywords.
/// The model-backed path is [`model::classify`], chosen by the handler when `model_url` is set.
pub fn classify(text: &str, labels: &[String]) -> Classification {
    keywords::classify(text, labels)
}

/// The labels from the `labels` config value: comma-separated, trimmed, without empties or
/// duplicates (case-insensitive); [`DEFAULT_LABELS`] when none remain.
pub fn labels(config: Option<&str>) -> Vec<String> {
    let parse = |s: &str| {
        let mut labels: Vec<String> = Vec::new();
        for label in s.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            if !labels.iter().any(|l| l.eq_ignore_ascii_case(label)) {
                labels.push(label.to_owned());
            }
        }
        labels
    };
    match config.map(parse) {
        Some(labels) if !labels.is_empty() => labels,
        _ => parse(DEFAULT_LABELS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_trimmed_deduplicated_and_defaulted() {
        assert_eq!(labels(Some(" a, b ,,A,c")), ["a", "b", "c"]);
        assert_eq!(
            labels(None),
            ["bug", "feature", "question", "billing", "other"]
        );
        assert_eq!(labels(Some(" , ")), labels(None));
    }

    #[test]
    fn output_has_the_documented_shape() {
        let got = classify("The app crashes with an error", &labels(None)).to_json();
        assert_eq!(
            got,
            serde_json::json!({"label": "bug", "score": 0.75, "via": "keywords", "matched": ["crash", "error"]})
        );
    }
}
