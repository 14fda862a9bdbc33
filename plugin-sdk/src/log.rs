//! Log lines, attributed by the host to the plugin and to the event being handled.
//!
//! The host caps the bytes logged per call (64 KiB by default) and drops lines beyond that,
//! so log what a person needs to understand a failure, not every step.
//!
//! Outside hookd (e.g. in a plugin's unit tests on the host target) lines go to stderr.

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

use crate::__private::log::Level;

#[cfg(target_arch = "wasm32")]
fn write(level: Level, message: &str) {
    crate::__private::log::log(level, message);
}

#[cfg(not(target_arch = "wasm32"))]
fn write(level: Level, message: &str) {
    eprintln!("[{level:?}] {message}");
}
