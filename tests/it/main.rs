//! hookd's integration tests: one binary, black-box against a running host (real HTTP on
//! loopback, a real SQLite file or PostgreSQL database, real Wasm components built by
//! `tests/build.rs`).

mod support;

mod admin;
mod admin_api;
mod backup;
mod cluster;
mod crash;
mod dashboard;
mod dispatch;
mod end_to_end;
mod forward;
mod handshakes;
mod harden_admin;
mod harden_fair;
mod harden_files;
mod harden_ingest;
mod harden_runtime;
mod harden_state;
mod ingest;
mod languages;
mod logs;
mod metrics;
mod openapi;
mod ordering;
mod outbound;
mod panics;
mod plugins;
mod postgres;
mod retention;
mod sdk_limits;
mod state;
mod tls;
mod wit_versions;
