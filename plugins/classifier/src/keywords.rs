//! The offline classifier: weighted keyword matching, with a score that says how much the
//! keywords actually support the label.
//!
//! Each label has keywords with a weight: 2 for words that rarely appear unless the label
//! applies (`crash`, `refund`), 1 for common hints (`error`, `how`). Labels without an entry
//! in [`TABLE`] use their own name as a weight-2 keyword, so `labels = "security,other"` works;
//! the fallback label `other` has no keywords. A label's weight is the sum of its distinct
//! keywords found in the text.
//!
//! `score = share × strength`: `share` is the winning label's part of all matched weight (1
//! when no other label matched anything), `strength` grows with the winning weight until
//! [`STRONG_EVIDENCE`]. One weak hint thus never scores 1. Nothing matched, or a tie between
//! the best labels, gives the fallback label (`other` if configured, else the last label) with
//! score 0: the keywords did not decide.

use std::borrow::Cow;

use crate::Classification;

/// Keywords per well-known label, with weights. Single words also match with the inflections
/// in [`SUFFIXES`] (`crash` matches `crashes`); entries with a space are phrases; `?` matches a
/// question mark anywhere.
pub const TABLE: &[(&str, &[(&str, u32)])] = &[
    (
        "bug",
        &[
            ("bug", 2),
            ("crash", 2),
            ("exception", 2),
            ("panic", 2),
            ("regression", 2),
            ("broken", 2),
            ("segfault", 2),
            ("traceback", 2),
            ("stack trace", 2),
            ("doesn't work", 2),
            ("does not work", 2),
            ("not working", 2),
            ("error", 1),
            ("fail", 1),
            ("wrong", 1),
            ("unexpected", 1),
            ("freeze", 1),
            ("hang", 1),
        ],
    ),
    (
        "feature",
        &[
            ("feature", 2),
            ("enhancement", 2),
            ("would be nice", 2),
            ("would be great", 2),
            ("would love", 2),
            ("suggest", 2),
            ("suggestion", 2),
            ("proposal", 2),
            ("wishlist", 2),
            ("ability to", 2),
            ("add", 1),
            ("support", 1),
            ("request", 1),
            ("allow", 1),
            ("option", 1),
            ("improve", 1),
            ("integration", 1),
        ],
    ),
    (
        "question",
        &[
            ("question", 2),
            ("is it possible", 2),
            ("is there a way", 2),
            ("wondering", 2),
            ("confused", 2),
            ("?", 1),
            ("how", 1),
            ("why", 1),
            ("what", 1),
            ("help", 1),
            ("clarify", 1),
            ("explain", 1),
            ("docs", 1),
            ("documentation", 1),
        ],
    ),
    (
        "billing",
        &[
            ("invoice", 2),
            ("refund", 2),
            ("charge", 2),
            ("overcharge", 2),
            ("payment", 2),
            ("subscription", 2),
            ("bill", 2),
            ("receipt", 2),
            ("credit card", 2),
            ("pricing", 1),
            ("price", 1),
            ("paid", 1),
            ("pay", 1),
            ("plan", 1),
            ("cancel", 1),
            ("money", 1),
        ],
    ),
];

/// Endings a single-word keyword may carry in the text.
pub const SUFFIXES: [&str; 8] = ["s", "es", "ed", "d", "ing", "ure", "ures", "'s"];

/// Matched weight at which the winning label's evidence counts as strong (strength 1).
pub const STRONG_EVIDENCE: f64 = 4.0;

/// The label that means "none of the others".
pub const OTHER: &str = "other";

/// Classifies `text` into one of `labels` (non-empty) by keywords.
pub fn classify(text: &str, labels: &[String]) -> Classification {
    let text = Text::new(text);
    let scored: Vec<Score<'_>> = labels
        .iter()
        .filter(|label| !label.eq_ignore_ascii_case(OTHER))
        .map(|label| {
            let (matched, weights): (Vec<String>, Vec<u32>) = keywords(label)
                .into_iter()
                .filter(|(keyword, _)| text.contains(keyword))
                .map(|(keyword, weight)| (keyword.into_owned(), weight))
                .unzip();
            Score {
                label,
                weight: weights.iter().sum(),
                matched,
            }
        })
        .collect();

    let total: u32 = scored.iter().map(|s| s.weight).sum();
    let best = scored.iter().map(|s| s.weight).max().unwrap_or(0);
    let winners: Vec<&Score<'_>> = scored.iter().filter(|s| s.weight == best).collect();

    match winners.as_slice() {
        [winner] if best > 0 => {
            let share = f64::from(best) / f64::from(total);
            let strength = (f64::from(best) / STRONG_EVIDENCE).min(1.0);
            Classification {
                label: winner.label.clone(),
                score: (share * strength * 100.0).round() / 100.0,
                via: "keywords",
                matched: winner.matched.clone(),
            }
        }
        _ => {
            let mut matched: Vec<String> = winners
                .iter()
                .flat_map(|s| s.matched.iter().cloned())
                .collect();
            matched.sort();
            matched.dedup();
            Classification {
                label: fallback(labels).to_owned(),
                score: 0.0,
                via: "keywords",
                matched,
            }
        }
    }
}

/// How much one label's keywords matched.
struct Score<'a> {
    label: &'a String,
    weight: u32,
    matched: Vec<String>,
}

/// The keywords of `label`: its [`TABLE`] entry, or its own name.
fn keywords(label: &str) -> Vec<(Cow<'static, str>, u32)> {
    match TABLE.iter().find(|(l, _)| l.eq_ignore_ascii_case(label)) {
        Some((_, keywords)) => keywords
            .iter()
            .map(|(k, w)| (Cow::Borrowed(*k), *w))
            .collect(),
        None => vec![(Cow::Owned(normalize(label)), 2)],
    }
}

/// The label used when the keywords do not decide.
fn fallback(labels: &[String]) -> &str {
    labels
        .iter()
        .find(|l| l.eq_ignore_ascii_case(OTHER))
        .or(labels.last())
        .map_or(OTHER, String::as_str)
}

/// Lower-case words separated by single spaces; apostrophes kept inside words.
fn normalize(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| match c {
            '\u{2019}' => '\'',
            c if c.is_alphanumeric() || c == '\'' => c,
            _ => ' ',
        })
        .collect::<String>()
        .to_lowercase();
    cleaned
        .split_whitespace()
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A text prepared for keyword lookups.
struct Text {
    /// The normalised words, with a space on each side, for phrase lookups.
    padded: String,
    has_question_mark: bool,
}

impl Text {
    fn new(text: &str) -> Self {
        Text {
            padded: format!(" {} ", normalize(text)),
            has_question_mark: text.contains('?'),
        }
    }

    fn words(&self) -> impl Iterator<Item = &str> {
        self.padded.split_whitespace()
    }

    fn contains(&self, keyword: &str) -> bool {
        if keyword == "?" {
            self.has_question_mark
        } else if keyword.contains(' ') {
            self.padded.contains(&format!(" {keyword} "))
        } else {
            self.words().any(|word| {
                word.strip_prefix(keyword)
                    .is_some_and(|rest| rest.is_empty() || SUFFIXES.contains(&rest))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, labels: &str, want_label: &str, want_score: f64, want_matched: &[&str]) {
        let labels = crate::labels(Some(labels));
        let got = classify(text, &labels);
        let matched: Vec<&str> = got.matched.iter().map(String::as_str).collect();
        assert_eq!(
            (got.label.as_str(), got.score, matched.as_slice()),
            (want_label, want_score, want_matched),
            "{text:?} with labels {labels:?}"
        );
    }

    const DEFAULT: &str = crate::DEFAULT_LABELS;

    #[test]
    fn well_known_labels() {
        check(
            "The app crashes with an error",
            DEFAULT,
            "bug",
            0.75,
            &["crash", "error"],
        );
        check(
            "Crash on start: NullPointerException, stack trace attached. It doesn\u{2019}t work!",
            DEFAULT,
            "bug",
            1.0,
            &["crash", "stack trace", "doesn't work"],
        );
        check(
            "It would be nice to add support for webhooks",
            DEFAULT,
            "feature",
            1.0,
            &["would be nice", "add", "support"],
        );
        check(
            "How do I configure retries?",
            DEFAULT,
            "question",
            0.5,
            &["?", "how"],
        );
        check(
            "I was charged twice, please refund the invoice",
            DEFAULT,
            "billing",
            1.0,
            &["invoice", "refund", "charge"],
        );
    }

    #[test]
    fn competing_evidence_lowers_the_score() {
        // billing 4 (refund, invoice) against question 2 (why, ?): share 4/6, full strength.
        check(
            "Why no refund on my invoice?",
            DEFAULT,
            "billing",
            0.67,
            &["invoice", "refund"],
        );
    }

    #[test]
    fn nothing_or_a_tie_falls_back_with_score_zero() {
        check("", DEFAULT, "other", 0.0, &[]);
        check("lorem ipsum dolor", DEFAULT, "other", 0.0, &[]);
        check(
            "the refund crashed",
            DEFAULT,
            "other",
            0.0,
            &["crash", "refund"],
        );
        check("lorem ipsum", "bug,feature", "feature", 0.0, &[]);
    }

    #[test]
    fn keywords_match_whole_words_with_inflections_only() {
        check("failures everywhere", "bug,other", "bug", 0.25, &["fail"]);
        check(
            "send it to this address",
            "feature,other",
            "other",
            0.0,
            &[],
        );
        check("however", "question,other", "other", 0.0, &[]);
    }

    #[test]
    fn unknown_labels_use_their_own_name() {
        check(
            "A security hole in login",
            "security,performance,other",
            "security",
            0.5,
            &["security"],
        );
        check(
            "slow-start is bad",
            "slow-start,other",
            "slow-start",
            0.5,
            &["slow start"],
        );
        check("Other things", "other", "other", 0.0, &[]);
    }
}
