//! Where the common providers put an event's human-written text, for bodies classified without
//! a `text_pointer`.
//!
//! - A shape is a list of paths into the JSON body; the first shape with any non-blank text at
//!   its paths decides, so a more specific subject (a comment) wins over its context (the issue
//!   it is on), and context objects (`repository`, `sender`, ...) are never read.
//! - Only strings are taken, trimmed, without blanks or repeats, in path order; nothing here
//!   fails: a body without any known shape yields `None` and the caller falls back.

use serde_json::{Map, Value};

/// A path into a JSON object, one step a key, or [`EVERY`] for each element of an array.
pub type Path = &'static [&'static str];

/// The path step that means "each element of the array here".
const EVERY: &str = "*";

/// Text fields of a Stripe event's `data.object`, whatever its type: free text first, then the
/// enum-like reasons (`fraudulent`, `requested_by_customer`), which say what happened.
const STRIPE_OBJECT_FIELDS: &[Path] = &[
    &["description"],
    &["failure_message"],
    &["last_payment_error", "message"],
    &["last_finalization_error", "message"],
    &["outcome", "seller_message"],
    &["cancellation_details", "comment"],
    &["reason"],
    &["failure_reason"],
    &["cancellation_reason"],
    &["cancellation_details", "feedback"],
    &["lines", "data", EVERY, "description"],
];

/// Subjects of the common providers' events, most specific first; the first one with text is
/// the event's text.
const SUBJECTS: &[&[Path]] = &[
    // GitHub `issue_comment`, `commit_comment`, `pull_request_review_comment`,
    // `discussion_comment`: what the commenter wrote, not the thread's title.
    &[&["comment", "body"]],
    // GitHub `pull_request_review` (a bare approval has no body: the pull request speaks).
    &[&["review", "body"]],
    // GitHub `issues`, `pull_request`, `discussion`, `release`.
    &[&["issue", "title"], &["issue", "body"]],
    &[&["pull_request", "title"], &["pull_request", "body"]],
    &[&["discussion", "title"], &["discussion", "body"]],
    &[&["release", "name"], &["release", "body"]],
    // GitHub `push`: every pushed commit; a tag push has only its `head_commit`.
    &[&["commits", EVERY, "message"]],
    &[&["head_commit", "message"]],
    // Slack Events API `event_callback` (an edit carries the new text in `message`).
    &[&["event", "text"], &["event", "message", "text"]],
    // Shopify orders and refunds: the customer's note, why it was cancelled.
    &[&["note"], &["cancel_reason"]],
];

/// The text of the first of [`SUBJECTS`] that `top` has.
pub fn subject(top: &Map<String, Value>) -> Option<String> {
    SUBJECTS
        .iter()
        .find_map(|paths| joined(top, paths.iter().copied()))
}

/// A Stripe event (`"object": "event"` with a `data.object`): its type said in words
/// (`invoice payment failed`, which is what the event means even when the object has no
/// description), then the object's [`STRIPE_OBJECT_FIELDS`].
pub fn stripe(top: &Map<String, Value>) -> Option<String> {
    if top.get("object")?.as_str()? != "event" {
        return None;
    }
    let object = top.get("data")?.get("object")?.as_object()?;
    let mut parts: Vec<String> = top
        .get("type")
        .and_then(Value::as_str)
        .map(humanize)
        .into_iter()
        .collect();
    parts.extend(strings_at(object, STRIPE_OBJECT_FIELDS.iter().copied()));
    finish(parts)
}

/// The non-blank strings at `paths` in `object`, joined by newlines without repeats; `None` if
/// there are none.
pub fn joined(object: &Map<String, Value>, paths: impl Iterator<Item = Path>) -> Option<String> {
    finish(strings_at(object, paths).collect())
}

/// The non-blank strings at `paths` in `object`, trimmed and humanised, in path order.
fn strings_at<'o>(
    object: &'o Map<String, Value>,
    paths: impl Iterator<Item = Path> + 'o,
) -> impl Iterator<Item = String> + 'o {
    paths.flat_map(move |path| {
        let mut found = Vec::new();
        walk(object.get(path[0]), &path[1..], &mut found);
        found.into_iter().map(humanize)
    })
}

/// Pushes the non-blank strings at `path` below `value` into `out`.
fn walk<'v>(value: Option<&'v Value>, path: &[&str], out: &mut Vec<&'v str>) {
    match (value, path.split_first()) {
        (Some(Value::String(s)), None) if !s.trim().is_empty() => out.push(s.trim()),
        (Some(Value::Array(items)), Some((&EVERY, rest))) => {
            items.iter().for_each(|item| walk(Some(item), rest, out));
        }
        (Some(Value::Object(map)), Some((key, rest))) => walk(map.get(*key), rest, out),
        _ => {}
    }
}

/// `parts` without repeats, joined by newlines; `None` when empty.
fn finish(parts: Vec<String>) -> Option<String> {
    let mut unique: Vec<String> = Vec::with_capacity(parts.len());
    for part in parts {
        if !unique.contains(&part) {
            unique.push(part);
        }
    }
    (!unique.is_empty()).then(|| unique.join("\n"))
}

/// An identifier such as `invoice.payment_failed` or `requested_by_customer` as words; any
/// other text unchanged.
fn humanize(s: &str) -> String {
    let identifier = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        && s.contains(['_', '.'])
        && !s.starts_with(['_', '.'])
        && !s.ends_with(['_', '.']);
    if identifier {
        s.replace(['_', '.'], " ")
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_become_words_and_prose_is_kept() {
        assert_eq!(humanize("invoice.payment_failed"), "invoice payment failed");
        assert_eq!(humanize("requested_by_customer"), "requested by customer");
        assert_eq!(
            humanize("Your card was declined."),
            "Your card was declined."
        );
        assert_eq!(humanize("fraudulent"), "fraudulent");
        assert_eq!(humanize("_private"), "_private");
    }

    #[test]
    fn every_element_of_an_array_is_walked_and_repeats_dropped() {
        let body = serde_json::json!({"commits": [{"message": "a"}, {"message": " "},
                                      {"message": "b"}, {"message": "a"}, {"id": 1}]});
        assert_eq!(subject(body.as_object().unwrap()).as_deref(), Some("a\nb"));
    }
}
