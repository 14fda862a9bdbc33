//! A call's stderr: kept in memory, bounded, read only to explain a trap.
//!
//! Rust's std panic hook (and the JS and Python runtimes' uncaught-error reporting) writes to
//! stderr before the guest traps, so the host gives each call an in-memory stderr and, when the
//! call traps after a panic, puts the panic's location and message first in the trap's error.
//!
//! Invariants:
//! - The guest can never make it hold more than [`STDERR_BYTES`] (twice that while it compacts)
//!   and a write never fails: what does not fit pushes the oldest bytes out (a panic is the last
//!   thing a guest writes), so a chatty plugin behaves exactly as with a discarding stderr.
//!   The start of the last panic report (up to [`REPORT_BYTES`] from its `panicked at `) is
//!   kept aside, so a report longer than the tail (a huge message) still names its location.
//! - No file, no fd: nothing leaves the call except through [`GuestStderr::panic`], whose text is
//!   capped and escaped ([`crate::text`]) before anyone stores or logs it.
//! - Output of a call that did not trap is dropped with the store.

use std::{
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};

use bytes::Bytes;
use wasmtime_wasi::{
    cli::{IsTerminal, StdoutStream},
    p2::{OutputStream, Pollable, StreamResult},
};

use crate::text;

/// Bytes of a call's stderr kept: the last ones written.
pub const STDERR_BYTES: usize = 16 * 1024;

/// Most bytes of a panic's location and message (escaped) put in a trap's error.
pub const PANIC_BYTES: usize = 2048;

/// Bytes one write may hand over at a time (what `check-write` grants).
const WRITE_PERMIT: usize = 4096;

/// Bytes kept of the last panic report from its mark: more than [`PANIC_BYTES`] escaped need.
const REPORT_BYTES: usize = 4 * PANIC_BYTES;

/// What starts a panic report (Rust's std hook, and the JS and Python SDKs' reports).
const MARK: &[u8] = b"panicked at ";

/// The tail of a call's stderr. Clones share it: the WASI context holds one, the call another.
#[derive(Clone, Default)]
pub struct GuestStderr(Arc<Mutex<Kept>>);

/// What a call's stderr keeps.
#[derive(Default)]
struct Kept {
    /// The last bytes written (up to twice [`STDERR_BYTES`] between compactions).
    tail: Vec<u8>,
    /// The start of the last panic report, from its mark, up to [`REPORT_BYTES`].
    report: Option<Vec<u8>>,
}

impl GuestStderr {
    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let last_mark = bytes
            .windows(MARK.len())
            .rposition(|w| w == MARK)
            .map(|at| bytes[at..].to_vec())
            .or_else(|| {
                // A mark may straddle two writes: the tail's last bytes, then this write's first.
                let carried = &kept.tail[kept.tail.len().saturating_sub(MARK.len() - 1)..];
                let mut seam = carried.to_vec();
                seam.extend_from_slice(&bytes[..bytes.len().min(MARK.len() - 1)]);
                let at = seam.windows(MARK.len()).position(|w| w == MARK)?;
                let mut report = carried[at..].to_vec();
                report.extend_from_slice(bytes);
                Some(report)
            });
        match (last_mark, &mut kept.report) {
            (Some(mut report), slot) => {
                report.truncate(REPORT_BYTES);
                *slot = Some(report);
            }
            (None, Some(report)) if report.len() < REPORT_BYTES => {
                let room = REPORT_BYTES - report.len();
                report.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            (None, _) => {}
        }
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_BYTES)..];
        kept.tail.extend_from_slice(bytes);
        if kept.tail.len() > 2 * STDERR_BYTES {
            let drop = kept.tail.len() - STDERR_BYTES;
            kept.tail.drain(..drop);
        }
    }

    /// The last [`STDERR_BYTES`] written.
    #[cfg(test)]
    fn tail(&self) -> Vec<u8> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.tail[kept.tail.len().saturating_sub(STDERR_BYTES)..].to_vec()
    }

    /// The last panic the guest reported, as `panicked at FILE:LINE:COL: MESSAGE`, escaped and
    /// capped at [`PANIC_BYTES`]; `None` if it reported none.
    pub fn panic(&self) -> Option<String> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        panic_report(&String::from_utf8_lossy(kept.report.as_deref()?))
    }
}

/// Parses Rust's std panic report, `thread '<name>' panicked at FILE:LINE:COL:\nMESSAGE\n` (an
/// optional `note: run with RUST_BACKTRACE=1 ...` line after it), the last one in `stderr`.
fn panic_report(stderr: &str) -> Option<String> {
    const MARK: &str = "panicked at ";
    let start = stderr.rfind(MARK)? + MARK.len();
    let rest = &stderr[start..];
    let (location, message) = match rest.split_once('\n') {
        Some((location, message)) => (location.trim_end().trim_end_matches(':'), message),
        None => (rest.trim_end(), ""),
    };
    let message = message
        .split_once("\nnote: run with `RUST_BACKTRACE")
        .map_or(message, |(message, _)| message)
        .trim_end();
    let message = message
        .strip_prefix("note: run with `RUST_BACKTRACE")
        .map_or(message, |_| "");
    let report = if message.is_empty() {
        format!("panicked at {location}")
    } else {
        format!("panicked at {location}: {message}")
    };
    let (mut escaped, whole) = text::escape_within(&report, PANIC_BYTES);
    if !whole {
        escaped.push('…');
    }
    Some(escaped)
}

impl IsTerminal for GuestStderr {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestStderr {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestStderr {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestStderr {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestStderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_std_panic_report_becomes_one_line_location_first() {
        let stderr = "some chatter\nthread '<unnamed>' panicked at src/lib.rs:81:28:\n\
                      index out of bounds: the len is 3 but the index is 7\n\
                      note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            panic_report(stderr).unwrap(),
            "panicked at src/lib.rs:81:28: index out of bounds: the len is 3 but the index is 7"
        );
    }

    #[test]
    fn a_multi_line_message_is_escaped_and_a_huge_one_capped() {
        let stderr = "thread 'main' panicked at src/a.rs:1:2:\nline one\n\u{1b}[31mline two\n";
        assert_eq!(
            panic_report(stderr).unwrap(),
            "panicked at src/a.rs:1:2: line one\\n\\u{1b}[31mline two"
        );
        let huge = format!(
            "thread 'main' panicked at src/a.rs:1:2:\n{}\n",
            "x".repeat(10_000)
        );
        let report = panic_report(&huge).unwrap();
        assert!(
            report.starts_with("panicked at src/a.rs:1:2: xxx"),
            "{report}"
        );
        assert!(
            report.len() <= PANIC_BYTES + '…'.len_utf8(),
            "{}",
            report.len()
        );
        assert_eq!(panic_report("no panic here\n"), None);
    }

    /// However much the guest writes, the buffer stays bounded, no write fails, and the last
    /// panic is still found.
    #[test]
    fn the_buffer_keeps_the_tail_and_never_refuses_a_write() {
        let mut stderr = GuestStderr::default();
        for _ in 0..1000 {
            stderr.write(Bytes::from(vec![b'a'; 1000])).unwrap();
            assert!(stderr.0.lock().unwrap().tail.len() <= 2 * STDERR_BYTES);
        }
        stderr
            .write(Bytes::from_static(
                b"thread '<unnamed>' panicked at src/lib.rs:3:4:\nboom\n",
            ))
            .unwrap();
        assert_eq!(stderr.check_write().unwrap(), WRITE_PERMIT);
        assert_eq!(stderr.panic().unwrap(), "panicked at src/lib.rs:3:4: boom");
        assert_eq!(stderr.tail().len(), STDERR_BYTES);
    }

    /// A report longer than the tail keeps (a JS error with a 20 000-character message, written
    /// in chunks) still names its location: before, the mark had been pushed out of the tail,
    /// and the trap said only `unreachable`.
    #[test]
    fn a_report_longer_than_the_tail_keeps_its_location() {
        let mut stderr = GuestStderr::default();
        stderr
            .write(Bytes::from_static(
                b"chatter
thread 'main' pani",
            ))
            .unwrap();
        stderr
            .write(Bytes::from_static(
                b"cked at handler.js:3:9:
Error: ",
            ))
            .unwrap();
        for _ in 0..10 {
            stderr.write(Bytes::from(vec![b'E'; 4096])).unwrap();
        }
        let report = stderr.panic().unwrap();
        assert!(
            report.starts_with("panicked at handler.js:3:9: Error: EEE"),
            "{report}"
        );
        assert!(report.len() <= PANIC_BYTES + '…'.len_utf8());
        assert!(stderr.0.lock().unwrap().report.as_ref().unwrap().len() <= REPORT_BYTES);
    }
}
