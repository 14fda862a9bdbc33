//! `hookd send`: sign a payload exactly as a provider would and POST it, optionally many times
//! with the same event id (a retry-happy provider, which resends a delivery it got no answer for).
//!
//! Invariants:
//! - The payload is sent byte for byte as read.
//! - No scheme name, setting rule or signature format is known here: `--scheme` parses into
//!   [`verify::SchemeKind`], its settings are checked by [`verify::Scheme::from_parts`], and
//!   signatures come only from [`verify::sign`], per request with the current time so
//!   timestamps are fresh.
//! - Every copy carries the same event id; the secret is never printed.
//! - HTTP goes through the shared helper in `client.rs` (plain http only).
//!
//! Layout: `args.rs` (the flags, checked into a scheme), `ids.rs` (provider-style event ids),
//! `run.rs` (the `Plan` every request is built from, the concurrent runner, the output).
//!
//! [`verify::SchemeKind`]: crate::verify::SchemeKind
//! [`verify::Scheme::from_parts`]: crate::verify::Scheme::from_parts
//! [`verify::sign`]: crate::verify::sign

mod args;
mod ids;
mod run;

pub use args::SendArgs;
pub use run::run;

/// Parses `argv` (starting with the command name) as `hookd send`'s flags.
#[cfg(test)]
fn parse_argv(argv: Vec<&str>) -> Result<SendArgs, clap::Error> {
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Send {
        #[command(flatten)]
        args: SendArgs,
    }
    Send::try_parse_from(argv).map(|cli| cli.args)
}
