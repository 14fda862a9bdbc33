//! The command line: `hookd serve | dev | new | send | events | replay | discard | plugins | state |
//! backup | restore` (names are a contract).
//!
//! Invariant: commands only parse arguments and call the library or the admin API; no command
//! holds product logic of its own. Commands print with [`say!`], never `println!`: a reader
//! that goes away (`hookd events | head -1`) ends the command quietly instead of a panic.

/// `println!` for commands: standard output closed by its reader (a broken pipe) ends the
/// process quietly with success, as it ends `cat`, instead of panicking with a backtrace.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::say_line(format_args!($($arg)*))
    };
}

mod backup;
mod build_command;
pub(crate) mod client;
mod dev;
mod new;
mod plugin_dirs;
mod send;
mod wasm_target;

use std::{io::IsTerminal as _, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Config;

/// hookd: a webhook host that runs sandboxed WebAssembly handlers.
#[derive(Debug, Parser)]
#[command(name = "hookd", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr: `text` for people (coloured only when stderr is a
    /// terminal), `json` for log shippers (one JSON object per line).
    #[arg(long, global = true, env = "HOOKD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The log line format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; ANSI colour only on a terminal.
    Text,
    /// One JSON object per line: timestamp, level, target, fields and the spans it ran in.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve webhooks with the given configuration.
    Serve {
        /// The configuration file.
        #[arg(long, short, default_value = "hookd.toml")]
        config: PathBuf,
    },
    /// Build the plugin crates to wasm, place them in plugins_dir, and serve (for development).
    Dev(dev::DevArgs),
    /// Create a plugin crate (a handler or a parser) ready for `cargo test` and `hookd dev`.
    New(new::NewArgs),
    /// Sign and send a payload exactly as a provider would.
    Send(send::SendArgs),
    /// List events, or show one with its deliveries and history (admin API).
    Events(client::EventsArgs),
    /// Replay dead deliveries and quarantined requests (admin API).
    Replay(client::ReplayArgs),
    /// Close dead deliveries and held quarantined requests for good (admin API); retention
    /// then prunes them like finished work.
    Discard(client::DiscardArgs),
    /// Show the plugins, or roll one back (admin API).
    Plugins(client::PluginsArgs),
    /// List, show, set or delete a plugin instance's durable state (admin API).
    State(client::StateArgs),
    /// Copy a (running) hookd's SQLite database, consistently, to a new file.
    Backup(backup::BackupArgs),
    /// Replace a stopped hookd's SQLite database with a copy made by `hookd backup`.
    Restore(backup::RestoreArgs),
    /// Internal: compile one plugin (wasm on stdin, artifact on stdout) for a running hookd.
    #[command(name = crate::runtime::COMPILE_SUBCOMMAND, hide = true)]
    CompilePlugin {
        /// Address-space limit of this process.
        #[arg(long)]
        memory_bytes: u64,
        /// The hookd process that asked; this one exits if it is gone.
        #[arg(long)]
        parent: u32,
    },
}

/// Where the admin API is and how to authenticate. Global, so that a command with subcommands
/// (`hookd state`) takes them before its subcommand or after it.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Admin API base URL [default: `http://` + the config file's `server.admin_listen`, else
    /// http://127.0.0.1:8081].
    #[arg(long, env = "HOOKD_ADMIN_URL", hide_env_values = true, global = true)]
    pub admin_url: Option<String>,
    /// Bearer token for the admin API. Without it: the `server.admin_token` of the config file
    /// (--config), else the token file hookd generated beside that config's database.
    #[arg(long, env = "HOOKD_ADMIN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// The hookd.toml of the hookd to talk to, read for its admin address when no --admin-url
    /// is given and for its admin token when no --token is [default: hookd.toml, if it exists].
    #[arg(long, env = "HOOKD_CONFIG", global = true)]
    pub config: Option<PathBuf>,
}

/// Runs a command; the process exit code says whether it worked.
pub fn main(cli: Cli) -> ExitCode {
    if let Command::CompilePlugin {
        memory_bytes,
        parent,
    } = cli.command
    {
        return crate::runtime::compile_child_main(memory_bytes, parent);
    }
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Serve { config } => serve(config),
        Command::Dev(args) => dev::run(args),
        Command::New(args) => new::run(args),
        Command::Send(args) => runtime().and_then(|rt| rt.block_on(send::run(args))),
        Command::Events(args) => runtime().and_then(|rt| rt.block_on(client::events(args))),
        Command::Replay(args) => runtime().and_then(|rt| rt.block_on(client::replay(args))),
        Command::Discard(args) => runtime().and_then(|rt| rt.block_on(client::discard(args))),
        Command::Plugins(args) => runtime().and_then(|rt| rt.block_on(client::plugins(args))),
        Command::State(args) => runtime().and_then(|rt| rt.block_on(client::state(args))),
        Command::Backup(args) => backup::backup(args),
        Command::Restore(args) => backup::restore(args),
        Command::CompilePlugin { .. } => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hookd: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// What [`say!`] does: one line to standard output; a broken pipe exits with success, any
/// other failure to write is the panic `println!` would give.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        panic!("failed printing to stdout: {e}");
    }
}

/// `e` and its causes on one line (as `{:#}` writes them), each said once: hookd's errors put
/// their cause in their own message, so a log line carries it whole, and also return it as their
/// source, which `{:#}` would print a second (or third) time.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The log filter without `HOOKD_LOG`: hookd's and its plugins' lines from `info`; the file
/// watcher's crate only from `warn` (it reports a watch on a directory a build just removed,
/// routine under `hookd dev`, at `info`).
const DEFAULT_LOG_FILTER: &str = "info,notify=warn";

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOOKD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        // Colour codes are for terminals; in a file or a pipe they are noise.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// `hookd serve`: load the config, bind, run until Ctrl-C or SIGTERM.
pub fn serve(config_path: PathBuf) -> anyhow::Result<()> {
    let config = Config::load(&config_path)?;
    runtime()?.block_on(async move {
        // First: a SIGHUP during the start (the database's open, the plugins' compiles) is
        // taken too.
        let shutdown = shutdown_signal();
        let listeners = crate::Listeners::bind(&config).await?;
        crate::run(config, listeners, shutdown).await
    })
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. SIGHUP, which operators and service managers send
/// to have a daemon reload its configuration (and a closing terminal sends too), is taken and
/// logged instead of ending the process at once, which cut its running attempts short: hookd
/// reads its configuration only when it starts. The handlers are installed when this is
/// called (inside the runtime), not when the future is first awaited.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (mut term, mut hangup) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).expect("installing the SIGTERM handler"),
            signal(SignalKind::hangup()).expect("installing the SIGHUP handler"),
        )
    };
    async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            tokio::pin!(ctrl_c);
            loop {
                tokio::select! {
                    _ = &mut ctrl_c => break,
                    _ = term.recv() => break,
                    _ = hangup.recv() => tracing::warn!(
                        "SIGHUP received and ignored: hookd does not reload its configuration; \
                         restart it (SIGTERM, then start) to apply a change"
                    ),
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use anyhow::Context as _;

    use super::error_line;
    use crate::inbox::InboxError;

    /// `--help` never prints what an environment variable holds, but for the two that hold no
    /// secret: an admin URL may carry a password (refused, never echoed, by the client), a
    /// token or a signing secret is one. (`HOOKD_ADMIN_URL`'s was printed.)
    #[test]
    fn help_shows_no_environment_values_but_harmless_ones() {
        fn walk(command: &clap::Command, found: &mut Vec<String>) {
            for arg in command.get_arguments() {
                if let Some(env) = arg.get_env().and_then(|e| e.to_str())
                    && !arg.is_hide_env_values_set()
                {
                    found.push(env.to_owned());
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, found);
            }
        }
        let mut shown = Vec::new();
        walk(&<super::Cli as clap::CommandFactory>::command(), &mut shown);
        shown.sort();
        shown.dedup();
        assert_eq!(shown, ["HOOKD_CONFIG", "HOOKD_LOG_FORMAT"]);
    }

    /// A cause already in the message that wraps it is not repeated; one that is not is kept.
    #[test]
    fn an_error_line_says_each_cause_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let storage: Result<(), InboxError> = Err(InboxError::Storage(Arc::new(io())));
        let e = storage.context("opening the database x.db").unwrap_err();
        assert_eq!(
            error_line(&e),
            "opening the database x.db: storage error: entity not found"
        );
        let e = anyhow::Error::new(io()).context("reading y.toml");
        assert_eq!(error_line(&e), "reading y.toml: entity not found");
    }
}
