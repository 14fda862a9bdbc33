//! Untrusted text (what plugins log, the reasons they give) made safe to store and to log.
//!
//! Invariants: [`cap`] never returns more than its limit plus the marker, cut on a character
//! boundary, and says how much it dropped; [`escape`] leaves no character that could end a log
//! line, start a terminal escape sequence or reorder the text on screen (C0/C1 controls, DEL,
//! line/paragraph separators, bidi overrides and isolates): each becomes a visible `\n`, `\r`,
//! `\t` or `\u{…}`. [`storable`] leaves no NUL (U+0000), which PostgreSQL's `text` cannot
//! hold, so what one backend stores the other stores too.

use std::{borrow::Cow, fmt::Write as _};

/// The most bytes of a handler's retry/permanent reason (or any attempt error) that are kept.
pub const MAX_REASON_BYTES: usize = 4096;

/// `text` cut to at most `max` bytes (on a character boundary), followed by a marker that says
/// how many bytes were dropped; unchanged when it fits.
pub fn cap(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.shrink_to_fit();
    let _ = write!(
        text,
        "… [truncated: {} of {total} bytes dropped]",
        total - cut
    );
    text
}

/// Whether `text` holds a NUL (U+0000), which no backend stores in a name (an event id, type
/// or ordering key, a state key): one holding it is refused where it comes in, since changed
/// it would name something else.
pub fn has_nul(text: &str) -> bool {
    text.contains('\0')
}

/// `text` as every backend can store it: each NUL (U+0000) becomes a visible `\u{0}`, as
/// [`escape`] writes it. For what is only read (a reason, an error, an output).
pub fn storable(text: String) -> String {
    if has_nul(&text) {
        text.replace('\0', "\\u{0}")
    } else {
        text
    }
}

/// Whether `c` must not reach a log line or a terminal as itself.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `text` with every unsafe character escaped (borrowed when there is none).
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The escaped form of the longest prefix of `text` whose escaped form fits in `budget` bytes,
/// and whether all of `text` fit. Never builds more than `budget` bytes, however long `text` is.
pub fn escape_within(text: &str, budget: usize) -> (String, bool) {
    let mut out = String::with_capacity(text.len().min(budget));
    let mut scratch = String::new();
    for c in text.chars() {
        scratch.clear();
        if is_unsafe(c) {
            push_escaped(&mut scratch, c);
        } else {
            scratch.push(c);
        }
        if out.len() + scratch.len() > budget {
            return (out, false);
        }
        out.push_str(&scratch);
    }
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storable_text_shows_a_nul_as_escape_writes_it() {
        assert_eq!(storable("a\0b\0".into()), "a\\u{0}b\\u{0}");
        assert_eq!(storable("a\0b".into()), escape("a\0b"));
        assert_eq!(storable("plain".into()), "plain");
        assert!(has_nul("x\0") && !has_nul("x"));
    }

    #[test]
    fn cap_keeps_what_fits_and_marks_what_it_dropped() {
        assert_eq!(cap("short".into(), 10), "short");
        assert_eq!(cap("exactly10!".into(), 10), "exactly10!");
        let capped = cap("x".repeat(50_000_000), MAX_REASON_BYTES);
        assert!(capped.starts_with(&"x".repeat(MAX_REASON_BYTES)));
        assert!(
            capped.ends_with("… [truncated: 49995904 of 50000000 bytes dropped]"),
            "{}",
            &capped[MAX_REASON_BYTES..]
        );
        assert!(capped.len() < MAX_REASON_BYTES + 64);
        // Never splits a character: "é" is two bytes, so a 3-byte cap keeps one of them.
        assert_eq!(cap("ééé".into(), 3), "é… [truncated: 4 of 6 bytes dropped]");
    }

    #[test]
    fn escape_leaves_nothing_that_forges_lines_or_drives_terminals() {
        assert!(matches!(escape("plain text, ünïcode ok"), Cow::Borrowed(_)));
        let hostile = "ok\nFAKE level=ERROR host pwned\r\x1b[2J\x1b]0;title\x07\u{9b}31m\
                       \u{202e}txt.exe\u{2028}\u{2066}\x7f\tend";
        let escaped = escape(hostile);
        assert_eq!(
            escaped,
            "ok\\nFAKE level=ERROR host pwned\\r\\u{1b}[2J\\u{1b}]0;title\\u{7}\\u{9b}31m\
             \\u{202e}txt.exe\\u{2028}\\u{2066}\\u{7f}\\tend"
        );
        assert!(!escaped.chars().any(is_unsafe), "{escaped}");
    }

    #[test]
    fn escape_within_never_exceeds_its_budget() {
        assert_eq!(escape_within("a\nb", 100), ("a\\nb".into(), true));
        // The escape of "\n" (2 bytes) does not fit after "a" in 2 bytes: stop before it.
        assert_eq!(escape_within("a\nb", 2), ("a".into(), false));
        let (out, all) = escape_within(&"\x1b".repeat(1_000_000), 64);
        assert!(
            !all && out.len() <= 64 && out.len() >= 64 - 6,
            "{}",
            out.len()
        );
        assert_eq!(escape_within("", 0), (String::new(), true));
    }
}
