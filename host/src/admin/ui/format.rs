//! How the dashboard writes and reads times and shortens long values: unix milliseconds as
//! UTC calendar times (and back, from a form's `datetime-local` field), durations, sha256s,
//! and JSON indented without changing a token of it.
//!
//! Invariant: pure functions of their arguments; every time on a page is UTC and says so.
//! (Writing a calendar date is Howard Hinnant's `civil_from_days`, total over every `i64`;
//! reading one is humantime's, which checks it.)

/// `2026-12-02 02:30:05` (UTC) for unix ms `ms`.
pub(super) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix ms of a `datetime-local` value read as UTC (`YYYY-MM-DDTHH:MM`, optionally `:SS`), a
/// real calendar time from 1970 to 9999 (humantime's checks: the month's days, leap years).
pub(super) fn parse_datetime_local(text: &str) -> Option<i64> {
    let text = text.trim();
    // The field sends seconds only when they were set.
    let full = if text.len() == "2026-01-31T23:59".len() {
        format!("{text}:00")
    } else {
        text.to_owned()
    };
    let time = humantime::parse_rfc3339_weak(&full).ok()?;
    let ms = time.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    i64::try_from(ms).ok()
}

/// `json` (valid JSON) indented two spaces a level, with every token as it was received: a
/// number keeps its digits, a string its escapes, a repeated key its every occurrence (a
/// round trip through a parsed value would change all three). A string value under a key that
/// `redacts` is shown as `"[redacted]"`. It stops once it has written more than `limit` bytes:
/// indenting can make a body a hundred times longer (a comma at depth 127 becomes 255 bytes),
/// and only its head is shown.
pub(super) fn indent_json(json: &str, redacts: impl Fn(&str) -> bool, limit: usize) -> String {
    let bytes = json.as_bytes();
    let mut out = String::with_capacity(json.len() + json.len() / 2);
    let mut depth = 0usize;
    let mut redact_next = false;
    let next_is = |from: usize, c: char| json[from..].trim_start().starts_with(c);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    };
    let mut i = 0;
    while i < bytes.len() && out.len() <= limit {
        match bytes[i] {
            b'"' => {
                // '"' and '\\' never occur inside a multi-byte UTF-8 sequence.
                let mut end = i + 1;
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                let token = &json[i..=end.min(bytes.len() - 1)];
                if next_is(end + 1, ':') {
                    redact_next = serde_json::from_str::<String>(token).is_ok_and(|k| redacts(&k));
                    out.push_str(token);
                } else if std::mem::take(&mut redact_next) {
                    out.push_str("\"[redacted]\"");
                } else {
                    out.push_str(token);
                }
                i = end + 1;
                continue;
            }
            c @ (b'{' | b'[') => {
                redact_next = false;
                out.push(c as char);
                let close = if c == b'{' { '}' } else { ']' };
                if next_is(i + 1, close) {
                    out.push(close);
                    i = i + 1 + json[i + 1..].find(close).unwrap_or(0);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            c @ (b'}' | b']') => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c as char);
            }
            b',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            b':' => out.push_str(": "),
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                redact_next = false;
                let end = json[i..]
                    .find([',', '}', ']', ' ', '\t', '\n', '\r'])
                    .map_or(json.len(), |n| i + n);
                out.push_str(&json[i..end]);
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// `850 ms`, `12.3 s`, `4 min 2 s`, `3 h 5 min`, `30 d` (`2 d 6 h`).
pub(super) fn duration(ms: i64) -> String {
    const DAY: i64 = 86_400_000;
    if ms >= DAY {
        let (days, hours) = (ms / DAY, ms % DAY / 3_600_000);
        return match hours {
            0 => format!("{days} d"),
            _ => format!("{days} d {hours} h"),
        };
    }
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000)
    } else {
        format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

/// The first 12 hex digits of a sha256 (the page shows the whole in a tooltip).
pub(super) fn short_sha(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_and_read_back() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_764_642_605_123), "2025-12-02 02:30:05");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(
            parse_datetime_local("2025-12-02T02:30"),
            Some(1_764_642_600_000)
        );
        assert_eq!(
            parse_datetime_local("2000-02-29T00:00:00"),
            Some(951_782_400_000)
        );
        for bad in [
            "",
            "2025-13-01T00:00",
            "2025-12-02",
            "2025-12-02T24:00",
            "x-y-zTa:b",
            "2025-02-31T00:00",
            "2023-02-29T00:00",
            "99999999999-01-01T00:00",
            "1969-12-31T23:59",
            "2025-12-02T02:30:5",
        ] {
            assert_eq!(parse_datetime_local(bad), None, "{bad}");
        }
    }

    #[test]
    fn json_is_indented_with_every_token_as_received() {
        let body = r#"{"amount": 12345678901234567890123, "dup":1,"dup":2, "e":"\u00e9\"}", "n":[ ],
            "o":{"clientState":"s3cret","CLIENTSTATE":{"x":1}}, "l":[1.50,true,null]}"#;
        let shown = indent_json(
            body,
            |key| key.eq_ignore_ascii_case("clientstate"),
            usize::MAX,
        );
        assert_eq!(
            shown,
            r#"{
  "amount": 12345678901234567890123,
  "dup": 1,
  "dup": 2,
  "e": "\u00e9\"}",
  "n": [],
  "o": {
    "clientState": "[redacted]",
    "CLIENTSTATE": {
      "x": 1
    }
  },
  "l": [
    1.50,
    true,
    null
  ]
}"#
        );
        // A pretty value reads the same as what was received.
        let round: serde_json::Value =
            serde_json::from_str(&indent_json(body, |_| false, usize::MAX)).unwrap();
        assert_eq!(
            round,
            serde_json::from_str::<serde_json::Value>(body).unwrap()
        );
        assert_eq!(indent_json("\"x\"", |_| true, usize::MAX), "\"x\"");
        assert_eq!(indent_json(" 42 ", |_| true, usize::MAX), "42");
    }

    /// A body of commas 127 levels deep grows about 128 times when indented: only what is
    /// shown is written (before, a 12 MiB body took 1.6 GB to show its first 64 KiB).
    #[test]
    fn indenting_stops_past_its_limit() {
        let depth = 127;
        let body = format!(
            "{}{}{}",
            "[".repeat(depth),
            vec!["1"; 200_000].join(","),
            "]".repeat(depth)
        );
        let shown = indent_json(&body, |_| false, 64 * 1024);
        assert!(
            shown.len() > 64 * 1024 && shown.len() <= 64 * 1024 + 2 * depth + 16,
            "{} bytes written",
            shown.len()
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(850), "850 ms");
        assert_eq!(duration(12_345), "12.3 s");
        assert_eq!(duration(242_000), "4 min 2 s");
        assert_eq!(duration(11_100_000), "3 h 5 min");
        assert_eq!(duration(30 * 86_400_000), "30 d");
        assert_eq!(duration(54 * 3_600_000), "2 d 6 h");
    }
}
