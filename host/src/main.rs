//! The `hookd` binary: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    host::cli::main(host::cli::Cli::parse())
}
