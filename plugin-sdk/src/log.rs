//! Log lines, attributed by the host to the plugin and to the event being handled.
//!
//! The host caps the bytes logged per call (64 KiB by default) and drops lines beyond that,
//! so log what a person needs to understand a failure, not every step.
//!
//! Outside hookd (on the host target): during a [`Harness`](crate::testing::Harness) call the
//! lines are captured for the test ([`Harness::logs`](crate::testing::Harness::logs)); else
//! they go to stderr.

/// How severe a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Detail for whoever debugs the plugin.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the plugin worked around.
    Warn,
    /// A failure.
    Error,
}

/// Logs at debug level.
pub fn debug(message: impl AsRef<str>) {
    write(Level::Debug, message.as_ref());
}

/// Logs at info level.
pub fn info(message: impl AsRef<str>) {
    write(Level::Info, message.as_ref());
}

/// Logs at warn level.
pub fn warn(message: impl AsRef<str>) {
    write(Level::Warn, message.as_ref());
}

/// Logs at error level.
pub fn error(message: impl AsRef<str>) {
    write(Level::Error, message.as_ref());
}

#[cfg(target_arch = "wasm32")]
fn write(level: Level, message: &str) {
    use crate::__private::log::{Level as Wit, log};
    let level = match level {
        Level::Debug => Wit::Debug,
        Level::Info => Wit::Info,
        Level::Warn => Wit::Warn,
        Level::Error => Wit::Error,
    };
    log(level, message);
}

#[cfg(not(target_arch = "wasm32"))]
fn write(level: Level, message: &str) {
    if !crate::testing::log(level, message) {
        eprintln!("[{level:?}] {message}");
    }
}
