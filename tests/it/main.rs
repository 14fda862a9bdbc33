//! hookd's integration tests: one binary, black-box against a running host (real HTTP on
//! loopback, a real SQLite file, real Wasm components built by `tests/build.rs`).

mod support;

mod admin;
mod crash;
mod dispatch;
mod foundation;
mod harden_files;
mod ingest;
mod outbound;
mod plugins;
