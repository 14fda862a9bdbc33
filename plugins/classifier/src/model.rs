//! Classification by a language model behind an OpenAI-compatible chat-completions endpoint
//! (`POST {model_url}` with `{"model", "messages"}`; llama.cpp, vLLM, Ollama and others speak it).
//!
//! The model is told the allowed labels and asked for one; its reply's first non-blank line is
//! [normalised](normalise) to a configured label, and anything else becomes `other`. The model
//! is never trusted to produce a label by itself. A failed call (transport error, timeout,
//! 5xx, 408 or 429, a reply without content) is a retry: hookd calls again later, with the same
//! `Idempotency-Key`, and a model that got through once is never asked again for the event.
//! Another status (a key refused, a request the model will not take) is permanent: asking
//! again would get the same answer, so the delivery is dead at once, to be replayed once the
//! cause is fixed.

use plugin_sdk::{HandleError, http};
use serde_json::{Value, json};

use crate::keywords::OTHER;

/// The event text sent to the model is cut to this many characters.
pub const MAX_TEXT_CHARS: usize = 8000;

/// The chat-completions request for `text`.
pub fn request_body(model: &str, text: &str, labels: &[String]) -> Value {
    let mut text: String = text.chars().take(MAX_TEXT_CHARS).collect();
    if text.trim().is_empty() {
        text = "(the event has no text)".to_owned();
    }
    json!({
        "model": model,
        "temperature": 0,
        "max_tokens": 20,
        "messages": [
            {
                "role": "system",
                "content": format!(
                    "You label incoming support events. Reply with exactly one label from this \
                     list, and nothing else: {}.",
                    labels.join(", ")
                ),
            },
            {"role": "user", "content": text},
        ],
    })
}

/// The assistant's text in a chat-completions reply (`choices[0].message.content`, or the
/// completions-style `choices[0].text`).
pub fn reply_text(reply: &Value) -> Option<&str> {
    let choice = reply.get("choices")?.get(0)?;
    choice
        .pointer("/message/content")
        .or_else(|| choice.get("text"))?
        .as_str()
}

/// The configured label the reply names, else `other`.
///
/// Only the first non-blank line counts. It matches a label when, ignoring case, surrounding
/// quotes, markdown emphasis and punctuation and a leading `label:`, it *is* the label, or its
/// first word is. So `"**Bug**."` and `"bug - the app crashes"` give `bug`, while
/// `"I think it is a bug"` gives `other`: a reply that does not start with a label is not
/// guessed at.
pub fn normalise(reply: &str, labels: &[String]) -> String {
    let line = reply
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let trim = |s: &str| -> String {
        s.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    let mut line = trim(line);
    for prefix in ["label:", "label -"] {
        if let Some(rest) = line.strip_prefix(prefix) {
            line = trim(rest);
            break;
        }
    }
    let find = |candidate: &str| {
        labels
            .iter()
            .find(|l| trim(l) == candidate && !candidate.is_empty())
            .cloned()
    };
    if let Some(label) = find(&line) {
        return label;
    }
    let first_word = line
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
        .next()
        .unwrap_or("");
    find(first_word).unwrap_or_else(|| {
        labels
            .iter()
            .find(|l| l.eq_ignore_ascii_case(OTHER))
            .cloned()
            .unwrap_or_else(|| OTHER.to_owned())
    })
}

/// Asks the model at `url` for a label for `text`.
///
/// Errors: a refused host, a failed TLS handshake (an untrusted certificate) or an unusable
/// URL is permanent (fix `allow_hosts`, `ca_file` or `model_url`, then replay), and so is an
/// answer of a status no retry changes (4xx but 408 and 429: a key refused, a text over the
/// model's context); every other failure is a retry, honouring the server's `Retry-After`.
pub fn classify(
    url: &str,
    model: &str,
    text: &str,
    labels: &[String],
) -> Result<String, HandleError> {
    let response = http::post(url)
        .json(&request_body(model, text, labels))
        .send()
        .map_err(|e| match e {
            http::HttpError::Denied(_)
            | http::HttpError::Tls(_)
            | http::HttpError::Unsupported(_)
            | http::HttpError::InvalidRequest(_) => {
                HandleError::permanent(format!("model_url {url}: {e}"))
            }
            other => HandleError::retry(format!("model at {url}: {other}")),
        })?;
    // The SDK's verdict for a status (5xx, 408 and 429 retry, honouring Retry-After; any other
    // is permanent), saying which model answered it.
    let response = response
        .error_for_status()
        .map_err(|e| match HandleError::from(e) {
            HandleError::Retry { reason, after } => HandleError::Retry {
                reason: format!("model at {url}: {reason}"),
                after,
            },
            HandleError::Permanent(reason) => {
                HandleError::permanent(format!("model at {url}: {reason}"))
            }
        })?;
    let reply: Value = response
        .json()
        .map_err(|e| HandleError::retry(format!("model at {url}: {e}")))?;
    let text = reply_text(&reply).ok_or_else(|| {
        HandleError::retry(format!(
            "model at {url}: the reply has no choices[0].message.content"
        ))
    })?;
    Ok(normalise(text, labels))
}

#[cfg(test)]
mod tests {
    use plugin_sdk::{Event, testing::Harness};

    use super::*;

    #[test]
    fn a_status_no_retry_changes_is_permanent_and_an_outage_a_retry() {
        let url = "https://model.example/v1/chat/completions";
        let event = || {
            Event::new(
                "github",
                "d-1",
                "issues.opened",
                r#"{"issue":{"title":"x"}}"#,
            )
        };
        for (status, permanent) in [
            (400, true),
            (401, true),
            (404, true),
            (408, false),
            (429, false),
            (503, false),
        ] {
            let mut hookd = Harness::new()
                .with_config("model_url", url)
                .respond_to("POST", url, status);
            let verdict = hookd.handle::<crate::Classifier>(event());
            let is_permanent = matches!(verdict, Err(HandleError::Permanent(_)));
            let is_retry = matches!(verdict, Err(HandleError::Retry { .. }));
            assert!(
                (is_permanent, is_retry) == (permanent, !permanent),
                "{status}: {verdict:?}"
            );
        }
    }

    #[test]
    fn replies_normalise_to_a_configured_label_or_other() {
        let labels = crate::labels(Some("bug,Feature,question,billing,other"));
        let cases = [
            ("bug", "bug"),
            ("Bug", "bug"),
            ("  BUG.  ", "bug"),
            ("**bug**", "bug"),
            ("\"bug\"", "bug"),
            ("`question`", "question"),
            ("feature", "Feature"),
            ("Label: billing", "billing"),
            ("label - billing", "billing"),
            ("bug - the app crashes on start", "bug"),
            ("bug\nBecause the app crashes.", "bug"),
            ("\n\n  question\nmore", "question"),
            ("I think it is a bug", "other"),
            ("bugs", "other"),
            ("security", "other"),
            ("", "other"),
            ("   \n  ", "other"),
            ("other", "other"),
        ];
        for (reply, want) in cases {
            assert_eq!(normalise(reply, &labels), want, "{reply:?}");
        }
    }

    #[test]
    fn other_is_the_configured_spelling_or_the_literal() {
        let labels = crate::labels(Some("bug,Other"));
        assert_eq!(normalise("nonsense", &labels), "Other");
        let labels = crate::labels(Some("bug,feature"));
        assert_eq!(normalise("nonsense", &labels), "other");
        assert_eq!(normalise("feature", &labels), "feature");
    }

    #[test]
    fn labels_with_dashes_match_whole() {
        let labels = crate::labels(Some("slow-start,other"));
        assert_eq!(normalise("Slow-Start", &labels), "slow-start");
        assert_eq!(normalise("slow-start: the app", &labels), "slow-start");
        assert_eq!(normalise("slow", &labels), "other");
    }

    #[test]
    fn the_request_names_the_model_the_labels_and_the_text() {
        let labels = crate::labels(None);
        let body = request_body("m-1", "The app crashes", &labels);
        assert_eq!(body["model"], "m-1");
        let system = body["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.contains("bug, feature, question, billing, other"),
            "{system}"
        );
        assert_eq!(body["messages"][1]["content"], "The app crashes");
        let long = "é".repeat(MAX_TEXT_CHARS + 10);
        let body = request_body("m", &long, &labels);
        let sent = body["messages"][1]["content"].as_str().unwrap();
        assert_eq!(sent.chars().count(), MAX_TEXT_CHARS);
        let empty = request_body("m", "  ", &labels);
        assert_eq!(empty["messages"][1]["content"], "(the event has no text)");
    }

    #[test]
    fn reply_text_reads_chat_and_completion_shapes() {
        let chat = json!({"choices": [{"message": {"role": "assistant", "content": "bug"}}]});
        assert_eq!(reply_text(&chat), Some("bug"));
        let completion = json!({"choices": [{"text": "feature"}]});
        assert_eq!(reply_text(&completion), Some("feature"));
        for bad in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{"message": {}}]}),
        ] {
            assert_eq!(reply_text(&bad), None, "{bad}");
        }
    }
}
