//! Shared helpers of the fuzz targets: the small text formats their inputs are written in, so
//! seeds are readable requests and configs rather than opaque bytes.
//!
//! Invariant: every function is total over arbitrary bytes (malformed parts are skipped, never
//! a panic), so a crash always points at the code under test.

/// Splits `input` at its first empty line: `(head, body)`. Without one, all of it is the head.
pub fn split_blank_line(input: &[u8]) -> (&[u8], &[u8]) {
    match input.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&input[..at], &input[at + 2..]),
        None => (input, &[]),
    }
}

/// The lines of a head, each as text (lines that are not UTF-8 are dropped).
pub fn lines(head: &[u8]) -> impl Iterator<Item = &str> {
    head.split(|b| *b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
}

/// `Name: value` header lines → pairs; lines without a colon are skipped. The value keeps its
/// bytes after the colon and one optional space, so odd spacing is fuzzed too.
pub fn header_lines(lines: impl Iterator<Item = impl AsRef<str>>) -> Vec<(String, String)> {
    lines
        .filter_map(|line| {
            let (name, value) = line.as_ref().split_once(':')?;
            Some((
                name.to_owned(),
                value.strip_prefix(' ').unwrap_or(value).to_owned(),
            ))
        })
        .collect()
}
