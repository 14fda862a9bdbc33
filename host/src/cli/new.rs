//! `hookd new handler|parser NAME [--lang rust|ts|python]`: a ready plugin project.
//!
//! In Rust (the default): a crate outside any workspace — `Cargo.toml` (a `cdylib` on
//! `plugin-sdk`, a size-tuned release profile, its own `[workspace]`), a `src/lib.rs` with a
//! working handler or parser and a unit test on `plugin_sdk::testing`, a `hookd.toml` that
//! serves it with `hookd dev`, and a `.gitignore`. In TypeScript: `src/handler.ts`, its unit test
//! on the JS SDK's `Harness`, `package.json` (`npm run build`, `npm test`), `tsconfig.json`; in
//! Python: `handler.py` and its unittest on the Python SDK's `Harness`. Their `hookd.toml` gives
//! the plugin a `build` command, which `hookd dev` runs (handlers only: a parser's budget is too
//! tight for an interpreter).
//!
//! Where `plugin-sdk` comes from, first match wins: `--sdk-path DIR`; `--sdk-git URL` (Rust
//! only); else the `plugin-sdk/` of the source checkout this hookd was built from, if it still
//! exists (the JS and Python SDKs are its `js/` and `python/`). With a path, the checkout's
//! `Cargo.lock` (beside that `plugin-sdk/`) is copied into a Rust crate too, so the SDK's
//! dependencies build at the versions hookd was tested with.
//!
//! Invariant: it writes only into a directory that is missing or empty, and writes nothing
//! before every check passed.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::{Args, ValueEnum};
use rand::RngCore as _;

mod interpreted;

#[derive(Debug, Args)]
pub struct NewArgs {
    /// What the plugin does: a `handler` reacts to stored events, a `parser` turns a verified
    /// request into an event's id, type and ordering.
    #[arg(value_enum)]
    role: Role,
    /// The crate's name, also the plugin's and the source's name in its hookd.toml (letters,
    /// digits, `-` and `_`, starting with a letter).
    name: String,
    /// Where to create the crate [default: ./NAME]; it must be missing or empty.
    #[arg(long, value_name = "DIR")]
    path: Option<PathBuf>,
    /// Depend on plugin-sdk from this git repository (hookd's) instead of a local checkout.
    #[arg(long, value_name = "URL", conflicts_with = "sdk_path")]
    sdk_git: Option<String>,
    /// Depend on the plugin-sdk crate in this directory (by path).
    #[arg(long, value_name = "DIR")]
    sdk_path: Option<PathBuf>,
    /// The language to write the plugin in.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Lang,
}

/// The plugin's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Lang {
    Rust,
    /// TypeScript (or JavaScript), built with the JS SDK (`plugin-sdk/js`).
    #[value(alias = "typescript", alias = "js")]
    Ts,
    /// Python, built with componentize-py and the Python SDK (`plugin-sdk/python`).
    #[value(alias = "py")]
    Python,
}

/// The plugin's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    Handler,
    Parser,
}

/// Where the new crate's `plugin-sdk` dependency points.
#[derive(Debug, PartialEq, Eq)]
enum Sdk {
    /// A local `plugin-sdk/` directory, absolute.
    Path(PathBuf),
    /// A git repository holding it.
    Git(String),
}

pub fn run(args: NewArgs) -> anyhow::Result<()> {
    if args.lang != Lang::Rust {
        return interpreted::run(&args);
    }
    check_name(&args.name, true)?;
    let dir = args
        .path
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    check_empty(&dir)?;
    let sdk = match (&args.sdk_path, &args.sdk_git) {
        (Some(path), _) => Sdk::Path(sdk_dir(path)?),
        // Over http(s), user info is a password or a token (an SSH URL's `git@` is not).
        (None, Some(url))
            if ["http://", "https://"]
                .iter()
                .any(|scheme| url.to_ascii_lowercase().starts_with(scheme))
                && super::client::has_user_info(url) =>
        {
            anyhow::bail!(
                "--sdk-git holds user info (`user:token@`), which would be written into the \
                 crate's Cargo.toml and printed: give the URL without it, and let git's \
                 stored credentials or an SSH URL authenticate"
            )
        }
        (None, Some(url)) => Sdk::Git(url.clone()),
        (None, None) => Sdk::Path(built_from()?),
    };

    let secret = secret();
    let files = [
        ("Cargo.toml", cargo_toml(&args.name, &sdk)),
        (".gitignore", GITIGNORE.to_owned()),
        ("hookd.toml", hookd_toml(args.role, &args.name, &secret)),
        ("src/lib.rs", lib_rs(args.role, &args.name)),
    ];
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("creating {}", dir.join("src").display()))?;
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Sdk::Path(sdk) = &sdk
        && let Some(lock) = sdk.parent().map(|checkout| checkout.join("Cargo.lock"))
        && lock.is_file()
    {
        std::fs::copy(&lock, dir.join("Cargo.lock"))
            .with_context(|| format!("copying {} into {}", lock.display(), dir.display()))?;
    }

    let role = match args.role {
        Role::Handler => "handler",
        Role::Parser => "parser",
    };
    let from = match &sdk {
        Sdk::Path(path) => format!("path {}", path.display()),
        Sdk::Git(url) => format!("git {url}"),
    };
    print_next_steps(
        &format!(
            "created the {role} crate `{}` in {} (plugin-sdk from {from})",
            args.name,
            dir.display()
        ),
        &dir,
        "cargo test",
        &args.name,
    );
    Ok(())
}

/// What to do next with a new plugin in `dir`: `headline`, then its unit test (`test`),
/// `hookd dev`, and a signed event for its source `name` (signed with the secret in the crate's
/// `hookd.toml`, which is not printed: a flag shows in `ps` and shell histories).
fn print_next_steps(headline: &str, dir: &Path, test: &str, name: &str) {
    say!(
        "{headline}\n\n\
         cd {dir}\n\
         {test}        # its unit test, on this machine\n\
         hookd dev         # build it to wasm, serve hookd.toml, rebuild on every change\n\
         # then, in another terminal, an event for it (from standard input: a new file in\n\
         # the plugin's directory would be a change to rebuild for):\n\
         echo '{{\"id\":\"evt_1\",\"type\":\"order.paid\",\"subject\":\"order_7\"}}' | \
         hookd send --config hookd.toml --source {name} -",
        dir = shell_word(&dir.display().to_string()),
    );
}

/// `word` as the shell reads it back: as it is when it holds nothing the shell gives a meaning
/// to, else in single quotes (a `'` in it written `'\''`), so a printed `cd` can be pasted.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Refuses a name no plugin may have (it names the file, the instance and the source), and for a
/// Rust crate (`crate_name`) one cargo would refuse for a package, or one that would shadow the
/// SDK.
fn check_name(name: &str, crate_name: bool) -> anyhow::Result<()> {
    const RESERVED: [&str; 5] = ["std", "core", "alloc", "proc_macro", "test"];
    const KEYWORDS: [&str; 52] = [
        "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
        "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
        "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub",
        "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "try",
        "type", "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
    ];
    let what = if crate_name { "crate name" } else { "name" };
    let refuse = |why: &str| bail!("{name:?} cannot be the plugin's {what}: {why}");
    if name.is_empty() || name.len() > 64 {
        return refuse("it must be 1 to 64 characters");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return refuse("it must start with an ASCII letter");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return refuse("only ASCII letters, digits, `-` and `_` are allowed");
    }
    if !crate_name {
        return Ok(());
    }
    let ident = name.replace('-', "_");
    if KEYWORDS.contains(&ident.as_str()) {
        return refuse("it is a Rust keyword");
    }
    if RESERVED.contains(&ident.as_str()) {
        return refuse("it is the name of a crate of Rust's standard library");
    }
    if ident == "plugin_sdk" {
        return refuse("it is the SDK's own name");
    }
    Ok(())
}

/// Refuses a path that exists and is not an empty directory.
fn check_empty(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "{} already exists and is not empty; `hookd new` writes only into a missing \
                     or empty directory (choose another with --path)",
                    dir.display()
                );
            }
            Ok(())
        }
        // A symlink to nothing: read_dir follows it and finds nothing, and creating the
        // directory would then fail with a bare "File exists".
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_symlink()) =>
        {
            bail!(
                "{} is a symbolic link to {}, which does not exist (create that directory, or \
                 choose another with --path)",
                dir.display(),
                std::fs::read_link(dir).map_or_else(|_| "?".into(), |t| t.display().to_string())
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => bail!(
            "{}: a part of this path is a file, not a directory (choose another with --path)",
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| {
            format!(
                "{} exists but cannot be listed as a directory (choose another with --path)",
                dir.display()
            )
        }),
    }
}

/// `dir` made absolute, if it holds the `plugin-sdk` package.
fn sdk_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("--sdk-path: reading {}", manifest.display()))?;
    let package: toml::Table = toml::from_str(&text)
        .with_context(|| format!("--sdk-path: {} is not valid TOML", manifest.display()))?;
    let name = package
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(toml::Value::as_str);
    if name != Some("plugin-sdk") {
        let found = name.map_or("no package.name".to_owned(), |n| format!("package {n:?}"));
        bail!(
            "--sdk-path: {} is not plugin-sdk's manifest (it holds {found})",
            manifest.display()
        );
    }
    dir.canonicalize()
        .with_context(|| format!("--sdk-path: resolving {}", dir.display()))
}

/// The `plugin-sdk/` of the source checkout this binary was built from, if it is still there.
fn built_from() -> anyhow::Result<PathBuf> {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk");
    sdk_dir(&checkout).map_err(|e| {
        anyhow::anyhow!(
            "no plugin-sdk to depend on: this hookd was not built from a source checkout that \
             still holds {} ({e:#}); pass --sdk-git URL (hookd's repository) or --sdk-path DIR \
             (its plugin-sdk directory)",
            checkout.display()
        )
    })
}

/// A fresh Standard Webhooks signing secret for the crate's dev source.
fn secret() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn cargo_toml(name: &str, sdk: &Sdk) -> String {
    let dependency = match sdk {
        Sdk::Path(path) => format!("{{ path = {} }}", toml_string(&path.display().to_string())),
        Sdk::Git(url) => format!("{{ git = {} }}", toml_string(url)),
    };
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
rust-version = "1.95"
publish = false

# A wasm32-wasip2 component for hookd: `hookd dev` builds it, or
# `cargo build --release --target wasm32-wasip2` (then target/wasm32-wasip2/release/{file}.wasm).
[lib]
crate-type = ["cdylib"]

[dependencies]
# Re-exports serde and serde_json: no other dependency is needed for JSON.
plugin-sdk = {dependency}

# Small components: hookd loads and compiles them faster, and they fit any plugin store.
# A panic still reaches hookd with its message and location (the standard panic hook writes it
# to the call's stderr before the trap); stripping only drops the function names of the trap's
# backtrace.
[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1

# A workspace of its own, so no enclosing workspace claims this crate.
[workspace]
"#,
        file = name.replace('-', "_"),
    )
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

const GITIGNORE: &str = "/target\n/plugins\n/hookd.db*\n/.hookd-cache\n";

fn hookd_toml(role: Role, name: &str, secret: &str) -> String {
    let mut text = server_and_source(name, secret, "builds the crate into plugins/");
    match role {
        Role::Handler => {
            writeln!(text, "handlers = [\"{name}\"]\n").unwrap();
            writeln!(text, "[plugins.{name}]").unwrap();
            writeln!(text, "config = {{ greeting = \"hello\" }}").unwrap();
        }
        Role::Parser => {
            writeln!(text, "parser = \"{name}\"").unwrap();
        }
    }
    text
}

/// The start of every scaffold's `hookd.toml`: the `[server]` table and the source `name`,
/// signed with `secret`; `built` says what `hookd dev` does to build the plugin.
fn server_and_source(name: &str, secret: &str, built: &str) -> String {
    format!(
        "# Serves this plugin on http://127.0.0.1:8080/hooks/{name} (admin on 127.0.0.1:8081, its\n\
         # token generated into hookd.db.admin-token). `hookd dev` {built}.\n\
         [server]\n\
         listen = \"127.0.0.1:8080\"\n\
         admin_listen = \"127.0.0.1:8081\"\n\
         database = \"hookd.db\"\n\
         plugins_dir = \"plugins\"\n\n\
         [sources.{name}]\n\
         scheme = \"standard-webhooks\"\n\
         # A development secret, generated for this plugin. In production put the provider's in\n\
         # the environment instead: secrets_env = [\"MY_PROVIDER_SECRET\"].\n\
         secrets = [\"{secret}\"]\n"
    )
}

/// `order-events` → `OrderEvents`.
fn camel_case(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

fn lib_rs(role: Role, name: &str) -> String {
    let (template, suffix) = match role {
        Role::Handler => (HANDLER_RS, "Handler"),
        Role::Parser => (PARSER_RS, "Parser"),
    };
    template
        .replace("NAME", name)
        .replace("TYPE", &(camel_case(name) + suffix))
}

const HANDLER_RS: &str = r##"//! NAME: a hookd handler. It counts the events of each type in plugin state, logs a line
//! with the configured `greeting`, and returns `{"count": N, "event_type": "..."}`, which hookd
//! stores on the delivery. With `notify_url` in its config (and that URL's `host:port` in its
//! `allow_hosts`), it first POSTs the event's id and count there: a 5xx answer retries the event
//! later, and the count is kept only once the POST succeeded.

use plugin_sdk::{Event, HandleError, Handler, config, http, log, output, serde_json::json, state};

/// The handler.
pub struct TYPE;

impl Handler for TYPE {
    fn handle(event: Event) -> Result<Option<String>, HandleError> {
        let key = format!("count/{}", event.event_type);
        // Reads see committed state; the write is committed only if this attempt succeeds.
        let count = state::get_json::<u64>(&key)?.unwrap_or(0) + 1;
        state::set_json(&key, &count)?;
        if let Some(url) = config::get("notify_url") {
            http::post(&url)
                .json(&json!({ "event_id": event.event_id, "count": count }))
                .send()?
                .error_for_status()?;
        }
        let greeting = config::get("greeting").unwrap_or_else(|| "hello".to_owned());
        log::info(format!(
            "{greeting}: {} is {} number {count}",
            event.event_id, event.event_type
        ));
        output::json(&json!({ "count": count, "event_type": event.event_type }))
    }
}

plugin_sdk::register!(handler = TYPE);

#[cfg(test)]
mod tests {
    use plugin_sdk::testing::Harness;

    use super::*;

    fn event(id: &str) -> Event {
        Event::new("NAME", id, "order.paid", r#"{"type":"order.paid"}"#)
    }

    #[test]
    fn each_event_type_is_counted_in_state() {
        let mut hookd = Harness::new().with_config("greeting", "hi");
        hookd.handle::<TYPE>(event("evt_1")).unwrap();
        let output = hookd.handle::<TYPE>(event("evt_2")).unwrap();
        assert_eq!(
            output.as_deref(),
            Some(r#"{"count":2,"event_type":"order.paid"}"#)
        );
        assert_eq!(hookd.state_json::<u64>("count/order.paid"), Some(2));
        assert_eq!(hookd.logs()[1].message, "hi: evt_2 is order.paid number 2");
    }

    #[test]
    fn a_failed_notification_is_retried_and_counts_nothing() {
        let url = "https://hooks.example.com/orders";
        let mut hookd = Harness::new()
            .with_config("notify_url", url)
            .respond_to("POST", url, 503);
        let result = hookd.handle::<TYPE>(event("evt_1"));
        assert!(matches!(result, Err(HandleError::Retry { .. })), "{result:?}");
        assert_eq!(hookd.state_json::<u64>("count/order.paid"), None);

        let mut hookd = hookd.respond_to("POST", url, 200);
        hookd.handle::<TYPE>(event("evt_1")).unwrap();
        assert_eq!(hookd.state_json::<u64>("count/order.paid"), Some(1));
        let sent: plugin_sdk::serde_json::Value = hookd.requests()[1].json();
        assert_eq!(sent, json!({ "event_id": "evt_1", "count": 1 }));
    }
}
"##;

const PARSER_RS: &str = r##"//! NAME: a hookd parser. It reads a JSON body
//! `{"id": "evt_1", "type": "order.paid", "subject": "order_7", "sequence": 3}`: the event's
//! id (deduplicated by hookd), type, ordering key (`subject`: its events are handled one at a
//! time, in `sequence` order) and sequence; a `ping` is acknowledged and not stored.

use plugin_sdk::{Envelope, ParseError, Parser, Request, serde::Deserialize};

/// The body's fields this parser reads.
#[derive(Deserialize)]
#[serde(crate = "plugin_sdk::serde")]
struct Body {
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    subject: Option<String>,
    sequence: Option<u64>,
}

/// The parser.
pub struct TYPE;

impl Parser for TYPE {
    fn parse(req: Request) -> Result<Envelope, ParseError> {
        // A body that is not this JSON is a 400 for the sender, naming what is wrong.
        let body: Body = req.json()?;
        if body.event_type == "ping" {
            return Err(ParseError::ignore("ping"));
        }
        let mut envelope = Envelope::new(body.id, body.event_type);
        if let Some(subject) = body.subject {
            envelope = envelope.ordering_key(subject);
        }
        if let Some(sequence) = body.sequence {
            envelope = envelope.sequence(sequence);
        }
        Ok(envelope)
    }
}

plugin_sdk::register!(parser = TYPE);

#[cfg(test)]
mod tests {
    use plugin_sdk::testing::Harness;

    use super::*;

    #[test]
    fn the_body_names_the_event() {
        let mut hookd = Harness::new();
        let req = Request::new("NAME", "").with_json(&plugin_sdk::serde_json::json!({
            "id": "evt_1", "type": "order.paid", "subject": "order_7", "sequence": 3
        }));
        let expected = Envelope::new("evt_1", "order.paid")
            .ordering_key("order_7")
            .sequence(3);
        assert_eq!(hookd.parse::<TYPE>(req), Ok(expected));
        let ping = Request::new("NAME", r#"{"id": "p", "type": "ping"}"#);
        assert_eq!(hookd.parse::<TYPE>(ping), Err(ParseError::ignore("ping")));
        assert!(matches!(
            hookd.parse::<TYPE>(Request::new("NAME", "{}")),
            Err(ParseError::Invalid(_))
        ));
    }
}
"##;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dangling_symlink_is_named_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("elink");
        std::os::unix::fs::symlink(dir.path().join("missing"), &link).unwrap();
        let refused = check_empty(&link).unwrap_err().to_string();
        assert!(refused.contains("is a symbolic link to"), "{refused}");
        assert!(check_empty(&dir.path().join("absent")).is_ok());
    }

    #[test]
    fn a_printed_directory_is_one_shell_word() {
        assert_eq!(
            shell_word("/srv/plugins/my-plugin"),
            "/srv/plugins/my-plugin"
        );
        assert_eq!(shell_word("my dir/it's"), r"'my dir/it'\''s'");
        assert_eq!(shell_word("a$b"), "'a$b'");
    }

    #[test]
    fn names_cargo_would_refuse_are_refused_with_the_reason() {
        for good in ["orders", "order-events", "a_1"] {
            check_name(good, true).unwrap();
        }
        for (bad, why) in [
            ("", "1 to 64"),
            ("1st", "start with"),
            ("-x", "start with"),
            ("my plugin", "only ASCII"),
            ("ünïcode", "start with"),
            ("a/b", "only ASCII"),
            ("async", "keyword"),
            ("test", "standard library"),
            ("plugin-sdk", "SDK's own"),
        ] {
            let err = check_name(bad, true).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        // A TypeScript or Python plugin is no crate: a Rust keyword is a fine name for it, a
        // name that cannot be a file stem or a TOML bare key still is not.
        for good in ["fn", "async", "test"] {
            check_name(good, false).unwrap();
        }
        assert!(check_name("my plugin", false).is_err());
    }

    #[test]
    fn only_a_missing_or_empty_directory_is_written_into() {
        let dir = tempfile::tempdir().unwrap();
        check_empty(&dir.path().join("missing")).unwrap();
        check_empty(dir.path()).unwrap();
        std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
        let err = check_empty(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not empty") && err.contains("--path"), "{err}");
        let err = check_empty(&dir.path().join("keep.txt")).unwrap_err();
        assert!(format!("{err:#}").contains("keep.txt"), "{err:#}");
        // Below a file: said as such, not as a directory that exists.
        let err = check_empty(&dir.path().join("keep.txt/sub")).unwrap_err();
        assert!(
            format!("{err:#}").contains("a part of this path is a file"),
            "{err:#}"
        );
    }

    /// An http(s) git URL with a token in it is refused unechoed (it would be written into the
    /// crate's Cargo.toml and printed); an SSH URL's user is no secret.
    #[test]
    fn an_sdk_git_url_with_a_token_is_refused_unechoed() {
        let dir = tempfile::tempdir().unwrap();
        #[derive(Debug, clap::Parser)]
        struct New {
            #[command(flatten)]
            args: NewArgs,
        }
        let run_with = |url: &str| {
            let path = dir.path().join("h");
            let argv = ["new", "handler", "h", "--path", path.to_str().unwrap()];
            let New { args } =
                clap::Parser::try_parse_from(argv.into_iter().chain(["--sdk-git", url])).unwrap();
            run(args)
        };
        let err = run_with("https://user:ghp_secret123@github.com/o/hookd")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sdk-git holds user info"), "{err}");
        assert!(!err.contains("ghp_secret123"), "{err}");
        assert!(!dir.path().join("h").exists(), "nothing was written");
        let err = run_with("HTTPS://ghp_secret123@github.com/o/hookd")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sdk-git holds user info"), "{err}");
        run_with("ssh://git@github.com/o/hookd").expect("an SSH URL is taken");
    }

    #[test]
    fn the_sdk_is_found_only_where_its_manifest_is() {
        let here = built_from().unwrap();
        assert!(here.ends_with("plugin-sdk"), "{}", here.display());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"other\"\n",
        )
        .unwrap();
        let err = format!("{:#}", sdk_dir(dir.path()).unwrap_err());
        assert!(
            err.contains("not plugin-sdk's manifest (it holds package \"other\")"),
            "{err}"
        );
    }

    #[test]
    fn generated_files_name_the_crate_and_its_sdk() {
        let manifest = cargo_toml("order-events", &Sdk::Git("https://git.test/hookd".into()));
        let parsed: toml::Table = toml::from_str(&manifest).unwrap();
        assert_eq!(parsed["package"]["name"].as_str(), Some("order-events"));
        assert_eq!(
            parsed["dependencies"]["plugin-sdk"]["git"].as_str(),
            Some("https://git.test/hookd")
        );
        assert_eq!(
            parsed["profile"]["release"]["opt-level"].as_str(),
            Some("s")
        );
        assert!(parsed.contains_key("workspace"));
        let path = cargo_toml("x", &Sdk::Path(PathBuf::from("/src/a \"b\"/plugin-sdk")));
        let parsed: toml::Table = toml::from_str(&path).unwrap();
        assert_eq!(
            parsed["dependencies"]["plugin-sdk"]["path"].as_str(),
            Some("/src/a \"b\"/plugin-sdk")
        );

        let source = lib_rs(Role::Parser, "order-events");
        assert!(source.contains("pub struct OrderEventsParser;"), "{source}");
        assert!(
            !source.contains("TYPE") && !source.contains("NAME"),
            "{source}"
        );
        for role in [Role::Handler, Role::Parser] {
            let config = hookd_toml(role, "order-events", &secret());
            host_config_is_valid(&config);
        }
    }

    fn host_config_is_valid(text: &str) {
        let dir = tempfile::tempdir().unwrap();
        crate::config::Config::parse(text, dir.path(), &|_| None)
            .unwrap_or_else(|e| panic!("{e:#}\n{text}"));
    }
}
