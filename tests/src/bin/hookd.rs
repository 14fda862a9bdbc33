//! The `hookd` binary, built inside the test package so integration tests can run it as a
//! real process (`CARGO_BIN_EXE_hookd`) for crash-and-restart scenarios.

use clap::Parser;

fn main() -> std::process::ExitCode {
    host::cli::main(host::cli::Cli::parse())
}
