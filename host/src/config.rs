//! `hookd.toml`: the file format (a contract: DESIGN.md) and its validation into [`Config`].
//!
//! Invariant: a `Config` is complete and consistent — every source has a working verifier, every
//! plugin a source names has settings, paths are absolute — so nothing after start-up re-checks it.
//! Unknown keys are refused with the key's name; secrets are read here and never printed.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::{
    ids::{PluginName, SourceName},
    runtime::AllowList,
    verify::{Encoding, HmacScheme, Scheme, Secret, Verifier},
};

/// The raw file, exactly as written. Field docs say why a default is what it is.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    server: ServerFile,
    #[serde(default)]
    sources: BTreeMap<String, SourceFile>,
    #[serde(default)]
    plugins: BTreeMap<String, PluginFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerFile {
    listen: SocketAddr,
    admin_listen: SocketAddr,
    admin_token: Option<String>,
    database: PathBuf,
    plugins_dir: PathBuf,
    /// Compiled plugin code, so a restart does not compile every plugin again. Host-private:
    /// never inside `plugins_dir`. Default: `.hookd-cache` beside the database.
    cache_dir: Option<PathBuf>,
    /// The artifact cache's size cap; least recently used entries go first (0: cache nothing).
    cache_max_bytes: u64,
    /// The `hookd` executable that compiles plugin files in a child process. Default: the
    /// running executable; set it when hookd is embedded in another program (tests).
    compiler: Option<PathBuf>,
    /// A compile running longer is killed and the file refused.
    compile_timeout_ms: u64,
    /// Address-space limit of one compiler process.
    compile_memory_mib: u64,
    /// Wasm bytes being compiled at once: 20 MiB = one largest file at a time.
    compile_queue_bytes: u64,
    /// GitHub sends up to 25 MB.
    max_body_bytes: u64,
    durability: Durability,
    /// Batch concurrent writes into one transaction (one fsync for many 202s). `false` commits
    /// every write on its own: only for measuring what group commit buys.
    group_commit: bool,
    /// Deliveries not yet finished; beyond this ingest answers 503 instead of growing without end.
    max_backlog: u64,
    /// Handler invocations running at once across all plugins.
    workers: usize,
    /// Slow-loris guard: a client must finish its request head within this time.
    header_timeout_ms: u64,
    /// A client must finish sending its body within this time.
    body_timeout_ms: u64,
    /// Open ingest connections at once; more wait in the kernel's accept queue.
    max_connections: usize,
}

impl Default for ServerFile {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("literal"),
            admin_listen: "127.0.0.1:8081".parse().expect("literal"),
            admin_token: None,
            database: "hookd.db".into(),
            plugins_dir: "plugins".into(),
            cache_dir: None,
            cache_max_bytes: 1 << 30,
            compiler: None,
            compile_timeout_ms: 120_000,
            compile_memory_mib: 2048,
            compile_queue_bytes: 20 * 1024 * 1024,
            max_body_bytes: 26_214_400,
            durability: Durability::Full,
            group_commit: true,
            max_backlog: 1_000_000,
            workers: 64,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_connections: 4096,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceFile {
    scheme: String,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    secrets_env: Vec<String>,
    #[serde(default = "default_tolerance_secs")]
    tolerance_secs: u64,
    #[serde(default)]
    parser: Option<String>,
    #[serde(default)]
    handlers: Vec<String>,
    /// `hmac-sha256` only: the header that carries the signature.
    #[serde(default)]
    signature_header: Option<String>,
    /// `hmac-sha256` only: a prefix before the signature, e.g. `sha256=`.
    #[serde(default)]
    signature_prefix: Option<String>,
    /// `hmac-sha256` only: `hex` (default) or `base64`.
    #[serde(default)]
    signature_encoding: Option<String>,
}

fn default_tolerance_secs() -> u64 {
    300
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PluginFile {
    wasm: Option<String>,
    max_attempts: Option<u32>,
    backoff_base_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    timeout_ms: Option<u64>,
    memory_mib: Option<u64>,
    parser_timeout_ms: Option<u64>,
    parser_memory_mib: Option<u64>,
    output_kib: Option<u64>,
    log_kib: Option<u64>,
    max_concurrency: Option<usize>,
    delivery: Option<DeliveryMode>,
    #[serde(default)]
    allow_hosts: Vec<String>,
    #[serde(default)]
    config: BTreeMap<String, toml::Value>,
}

/// How hard a commit is pushed to disk before the 202 goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `synchronous=FULL`: an acknowledged event survives power loss.
    Full,
    /// `synchronous=NORMAL`: survives a crash of hookd, not of the machine.
    Normal,
}

/// What happens when a handler's process died mid-attempt and nobody knows whether it acted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Re-run it: effects may happen twice unless the handler is idempotent (the default).
    AtLeastOnce,
    /// Never re-run it: dead-letter it as `abandoned` for a human to replay.
    AtMostOnce,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub sources: BTreeMap<SourceName, Arc<SourceConfig>>,
    pub plugins: BTreeMap<PluginName, Arc<PluginConfig>>,
}

/// `[server]`, with paths made absolute against the config file's directory.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub admin_token: Option<Secret>,
    pub database: PathBuf,
    pub plugins_dir: PathBuf,
    /// The compiled-artifact cache (host-private; checked not to be inside `plugins_dir`).
    pub cache_dir: PathBuf,
    /// Bytes of compiled artifacts the cache keeps at most.
    pub cache_max_bytes: u64,
    /// The executable run to compile plugin files; None: the running executable.
    pub compiler: Option<PathBuf>,
    /// A compile running longer is stopped (its process killed) and the file refused.
    pub compile_timeout: Duration,
    /// Address-space limit of a compiler process.
    pub compile_memory_bytes: u64,
    /// Wasm bytes compiled at once, across all files.
    pub compile_queue_bytes: u64,
    pub max_body_bytes: u64,
    pub durability: Durability,
    pub group_commit: bool,
    pub max_backlog: u64,
    pub workers: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
}

/// One `[sources.<name>]`.
#[derive(Debug)]
pub struct SourceConfig {
    pub name: SourceName,
    pub verifier: Verifier,
    pub parser: Option<PluginName>,
    pub handlers: Vec<PluginName>,
}

/// One plugin instance: which file, its limits and its grants.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub name: PluginName,
    /// File stem in `plugins_dir`: the instance loads `<plugins_dir>/<wasm>.wasm`.
    pub wasm: String,
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Handler budget per attempt (wall clock).
    pub timeout: Duration,
    pub memory_bytes: u64,
    /// Parser budget per request: it runs before the provider gets its answer.
    pub parser_timeout: Duration,
    pub parser_memory_bytes: u64,
    /// Largest output (a handler's result, a parser's envelope) per call; more is an error.
    pub output_bytes: usize,
    /// Log bytes per call; beyond this lines are dropped after one truncation marker.
    pub log_bytes: usize,
    /// Attempts of this plugin running at once.
    pub max_concurrency: usize,
    pub delivery: DeliveryMode,
    /// Where its handler may send HTTP requests (`host:port` entries); empty = no network.
    pub allow_hosts: AllowList,
    /// The plugin's own `config` table, values as strings, for the `config` import.
    pub config: BTreeMap<String, String>,
}

impl PluginConfig {
    /// The settings of a plugin a source names but the file does not declare.
    pub fn with_defaults(name: PluginName) -> Self {
        Self::from_file(name, PluginFile::default()).expect("defaults are valid")
    }

    fn from_file(name: PluginName, file: PluginFile) -> anyhow::Result<Self> {
        const MIB: u64 = 1024 * 1024;
        let wasm = file.wasm.unwrap_or_else(|| name.to_string());
        if wasm.is_empty() || wasm.contains(['/', '\\']) || wasm.starts_with('.') {
            bail!("plugins.{name}.wasm: {wasm:?} must be a file stem in plugins_dir, not a path");
        }
        let max_attempts = file.max_attempts.unwrap_or(8);
        if max_attempts == 0 {
            bail!("plugins.{name}.max_attempts must be at least 1");
        }
        let memory_mib = file.memory_mib.unwrap_or(64);
        let parser_memory_mib = file.parser_memory_mib.unwrap_or(16);
        for (key, mib) in [
            ("memory_mib", memory_mib),
            ("parser_memory_mib", parser_memory_mib),
        ] {
            // 1 GiB: the largest memory the runtime's pooling allocator reserves per instance.
            if !(1..=1024).contains(&mib) {
                bail!("plugins.{name}.{key} must be between 1 and 1024 (got {mib})");
            }
        }
        const KIB: u64 = 1024;
        let output_kib = file.output_kib.unwrap_or(64);
        let log_kib = file.log_kib.unwrap_or(64);
        for (key, kib) in [("output_kib", output_kib), ("log_kib", log_kib)] {
            if !(1..=16 * 1024).contains(&kib) {
                bail!("plugins.{name}.{key} must be between 1 and 16384 (got {kib})");
            }
        }
        let config = file
            .config
            .into_iter()
            .map(|(key, value)| {
                let text = match value {
                    toml::Value::String(s) => s,
                    other => other.to_string(),
                };
                (key, text)
            })
            .collect();
        Ok(Self {
            wasm,
            max_attempts,
            backoff_base: Duration::from_millis(file.backoff_base_ms.unwrap_or(1_000)),
            backoff_max: Duration::from_millis(file.backoff_max_ms.unwrap_or(3_600_000)),
            timeout: Duration::from_millis(file.timeout_ms.unwrap_or(30_000).max(1)),
            memory_bytes: memory_mib * MIB,
            parser_timeout: Duration::from_millis(file.parser_timeout_ms.unwrap_or(50).max(1)),
            parser_memory_bytes: parser_memory_mib * MIB,
            output_bytes: (output_kib * KIB) as usize,
            log_bytes: (log_kib * KIB) as usize,
            max_concurrency: file.max_concurrency.unwrap_or(usize::MAX).max(1),
            delivery: file.delivery.unwrap_or(DeliveryMode::AtLeastOnce),
            allow_hosts: AllowList::parse(&file.allow_hosts)
                .map_err(|e| anyhow::anyhow!("plugins.{name}.allow_hosts: {e}"))?,
            config,
            name,
        })
    }
}

impl Config {
    /// Reads and validates `path`; relative paths inside are taken relative to its directory.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        let base = base
            .canonicalize()
            .with_context(|| format!("resolving the directory of {}", path.display()))?;
        Self::parse(&text, &base, &|name| std::env::var(name).ok())
            .with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Parses config text; `env` looks up `secrets_env` and `HOOKD_ADMIN_TOKEN` (injected for tests).
    pub fn parse(
        text: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let s = file.server;
        let admin_token = s.admin_token.or_else(|| env("HOOKD_ADMIN_TOKEN"));
        if admin_token.is_none() && !s.admin_listen.ip().is_loopback() {
            bail!(
                "server.admin_token (or env HOOKD_ADMIN_TOKEN) is required when server.admin_listen \
                 ({}) is not a loopback address",
                s.admin_listen
            );
        }
        if admin_token.as_deref() == Some("") {
            bail!("server.admin_token must not be empty");
        }
        if s.workers == 0 || s.max_connections == 0 {
            bail!("server.workers and server.max_connections must be at least 1");
        }
        let database = base_dir.join(s.database);
        let plugins_dir = base_dir.join(s.plugins_dir);
        let cache_dir = match s.cache_dir {
            Some(dir) => base_dir.join(dir),
            None => database.parent().unwrap_or(base_dir).join(".hookd-cache"),
        };
        if cache_dir.starts_with(&plugins_dir) || plugins_dir.starts_with(&cache_dir) {
            bail!(
                "server.cache_dir ({}) must not overlap server.plugins_dir ({}): compiled code is \
                 only ever loaded from a host-private directory",
                cache_dir.display(),
                plugins_dir.display()
            );
        }
        if !(64..=65536).contains(&s.compile_memory_mib) {
            bail!(
                "server.compile_memory_mib must be between 64 and 65536 (got {})",
                s.compile_memory_mib
            );
        }
        if !(1..=1 << 32).contains(&s.compile_queue_bytes) {
            bail!(
                "server.compile_queue_bytes must be between 1 and 4294967296 (got {})",
                s.compile_queue_bytes
            );
        }
        if s.compile_timeout_ms == 0 {
            bail!("server.compile_timeout_ms must be at least 1");
        }
        let server = ServerConfig {
            listen: s.listen,
            admin_listen: s.admin_listen,
            admin_token: admin_token.map(Secret::new),
            database,
            plugins_dir,
            cache_dir,
            cache_max_bytes: s.cache_max_bytes,
            compiler: s.compiler.map(|p| base_dir.join(p)),
            compile_timeout: Duration::from_millis(s.compile_timeout_ms),
            compile_memory_bytes: s.compile_memory_mib * 1024 * 1024,
            compile_queue_bytes: s.compile_queue_bytes,
            max_body_bytes: s.max_body_bytes,
            durability: s.durability,
            group_commit: s.group_commit,
            max_backlog: s.max_backlog,
            workers: s.workers,
            header_timeout: Duration::from_millis(s.header_timeout_ms.max(1)),
            body_timeout: Duration::from_millis(s.body_timeout_ms.max(1)),
            max_connections: s.max_connections,
        };

        let mut plugins = BTreeMap::new();
        for (name, plugin) in file.plugins {
            check_name("plugins", &name)?;
            let name = PluginName::new(name);
            let config = PluginConfig::from_file(name.clone(), plugin)?;
            plugins.insert(name, Arc::new(config));
        }

        let mut sources = BTreeMap::new();
        for (name, source) in file.sources {
            check_name("sources", &name)?;
            let config = source_config(&name, source, env)?;
            for plugin in config.parser.iter().chain(&config.handlers) {
                plugins
                    .entry(plugin.clone())
                    .or_insert_with(|| Arc::new(PluginConfig::with_defaults(plugin.clone())));
            }
            sources.insert(config.name.clone(), Arc::new(config));
        }
        Ok(Self {
            server,
            sources,
            plugins,
        })
    }

    /// Every distinct wasm file stem the configuration uses.
    pub fn wasm_stems(&self) -> Vec<String> {
        let mut stems: Vec<String> = self.plugins.values().map(|p| p.wasm.clone()).collect();
        stems.sort();
        stems.dedup();
        stems
    }
}

fn check_name(table: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        bail!("{table}.{name:?}: names are 1-64 characters of [A-Za-z0-9_-]");
    }
    Ok(())
}

fn source_config(
    name: &str,
    file: SourceFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<SourceConfig> {
    let hmac_keys = [
        ("signature_header", file.signature_header.is_some()),
        ("signature_prefix", file.signature_prefix.is_some()),
        ("signature_encoding", file.signature_encoding.is_some()),
    ];
    let scheme = match file.scheme.as_str() {
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::Github,
        "shopify" => Scheme::Shopify,
        "slack" => Scheme::Slack,
        "none" => Scheme::None,
        "hmac-sha256" => {
            let header = file.signature_header.as_deref().with_context(|| {
                format!("sources.{name}.signature_header is required for scheme \"hmac-sha256\"")
            })?;
            let header = http::HeaderName::try_from(header).with_context(|| {
                format!("sources.{name}.signature_header: {header:?} is not a valid header name")
            })?;
            let encoding = match file.signature_encoding.as_deref().unwrap_or("hex") {
                "hex" => Encoding::Hex,
                "base64" => Encoding::Base64,
                other => bail!(
                    "sources.{name}.signature_encoding: {other:?} is not one of \"hex\", \"base64\""
                ),
            };
            Scheme::HmacSha256(HmacScheme {
                header,
                prefix: file.signature_prefix.clone().unwrap_or_default(),
                encoding,
            })
        }
        other => bail!(
            "sources.{name}.scheme: {other:?} is not one of standard-webhooks, stripe, github, \
             shopify, slack, hmac-sha256, none"
        ),
    };
    if !matches!(scheme, Scheme::HmacSha256(_))
        && let Some((key, _)) = hmac_keys.iter().find(|(_, set)| *set)
    {
        bail!("sources.{name}.{key} only applies to scheme \"hmac-sha256\"");
    }
    let mut secrets: Vec<Secret> = file.secrets.into_iter().map(Secret::new).collect();
    for var in &file.secrets_env {
        let value = env(var).with_context(|| {
            format!("sources.{name}.secrets_env: environment variable {var} is not set")
        })?;
        secrets.push(Secret::new(value));
    }
    if scheme == Scheme::None && !secrets.is_empty() {
        bail!("sources.{name}: scheme \"none\" verifies nothing, so it takes no secrets");
    }
    let verifier = Verifier::new(scheme, secrets, Duration::from_secs(file.tolerance_secs))
        .map_err(|e| anyhow::anyhow!("sources.{name}: {e}"))?;
    let plugin = |field: &str, p: String| -> anyhow::Result<PluginName> {
        check_name(&format!("sources.{name}.{field}"), &p)?;
        Ok(PluginName::new(p))
    };
    Ok(SourceConfig {
        name: SourceName::new(name),
        verifier,
        parser: file.parser.map(|p| plugin("parser", p)).transpose()?,
        handlers: file
            .handlers
            .into_iter()
            .map(|p| plugin("handlers", p))
            .collect::<anyhow::Result<_>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Config> {
        Config::parse(text, Path::new("/srv/hookd"), &|name| {
            (name == "GH_SECRET").then(|| "from-env".to_string())
        })
    }

    #[test]
    fn the_design_example_parses_with_defaults_filled_in() {
        let config = parse(
            r#"
            [server]
            listen = "127.0.0.1:8080"
            admin_listen = "127.0.0.1:8081"
            admin_token = "change-me"
            database = "hookd.db"
            plugins_dir = "plugins"
            max_body_bytes = 26214400

            [sources.github]
            scheme = "github"
            secrets_env = ["GH_SECRET"]
            parser = "github"
            handlers = ["classifier"]

            [plugins.classifier]
            max_attempts = 3
            delivery = "at-most-once"
            config = { labels = "bug,feature", threshold = 2 }
            "#,
        )
        .unwrap();
        assert_eq!(config.server.database, Path::new("/srv/hookd/hookd.db"));
        assert_eq!(
            config.server.cache_dir,
            Path::new("/srv/hookd/.hookd-cache")
        );
        let server = &config.server;
        assert_eq!(server.compiler, None, "the running executable compiles");
        assert_eq!(server.compile_timeout, Duration::from_secs(120));
        assert_eq!(server.compile_memory_bytes, 2048 << 20);
        assert_eq!(server.compile_queue_bytes, 20 << 20);
        assert_eq!(server.cache_max_bytes, 1 << 30);
        let classifier = &config.plugins[&PluginName::from("classifier")];
        assert_eq!(classifier.max_attempts, 3);
        assert_eq!(classifier.delivery, DeliveryMode::AtMostOnce);
        assert_eq!(classifier.config["threshold"], "2");
        // The parser is named by the source only, so it gets the defaults.
        let github = &config.plugins[&PluginName::from("github")];
        assert_eq!(github.wasm, "github");
        assert_eq!(github.parser_timeout, Duration::from_millis(50));
        assert_eq!((github.output_bytes, github.log_bytes), (65536, 65536));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("[server]\nlisten_port = 1", "listen_port"),
            (
                "[sources.a]\nscheme = \"github\"\nsecret = [\"x\"]",
                "secret",
            ),
            (
                "[sources.a]\nscheme = \"gitlab\"\nsecrets = [\"x\"]",
                "sources.a.scheme",
            ),
            ("[sources.a]\nscheme = \"github\"", "sources.a"),
            (
                "[sources.a]\nscheme = \"github\"\nsecrets_env = [\"NOPE\"]",
                "NOPE",
            ),
            (
                "[sources.a]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]",
                "signature_header",
            ),
            (
                "[sources.a]\nscheme = \"github\"\nsecrets = [\"x\"]\nsignature_header = \"x\"",
                "only applies",
            ),
            ("[plugins.p]\nmax_attempts = 0", "plugins.p.max_attempts"),
            ("[plugins.p]\noutput_kib = 0", "plugins.p.output_kib"),
            ("[plugins.p]\nlog_kib = 99999", "plugins.p.log_kib"),
            (
                "[server]\nplugins_dir = \"p\"\ncache_dir = \"p/cache\"",
                "server.cache_dir",
            ),
            ("[plugins.p]\nwasm = \"../evil\"", "plugins.p.wasm"),
            (
                "[plugins.p]\nallow_hosts = [\"api.example.com\"]",
                "plugins.p.allow_hosts: \"api.example.com\": an entry is `host:port`",
            ),
            (
                "[plugins.p]\nallow_hosts = [\"2130706433:80\"]",
                "plugins.p.allow_hosts: \"2130706433:80\"",
            ),
            ("[server]\nadmin_listen = \"0.0.0.0:8081\"", "admin_token"),
            ("[server]\ncache_max_bytes = -1", "cache_max_bytes"),
            (
                "[server]\ncompile_memory_mib = 1",
                "server.compile_memory_mib",
            ),
            (
                "[server]\ncompile_queue_bytes = 0",
                "server.compile_queue_bytes",
            ),
            (
                "[server]\ncompile_timeout_ms = 0",
                "server.compile_timeout_ms",
            ),
            ("[server]\ncompiler = 3", "compiler"),
        ];
        for (text, needle) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(
                err.contains(needle),
                "{text:?}: {err:?} should mention {needle:?}"
            );
        }
    }

    #[test]
    fn group_commit_is_on_unless_turned_off() {
        assert!(parse("").unwrap().server.group_commit);
        let off = parse("[server]\ngroup_commit = false").unwrap();
        assert!(!off.server.group_commit);
        let err = format!(
            "{:#}",
            parse("[server]\ngroup_commit = \"no\"").unwrap_err()
        );
        assert!(err.contains("group_commit"), "{err}");
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let config = parse(
            "[server]\nadmin_token = \"tok-123456\"\n[sources.a]\nscheme = \"github\"\nsecrets = [\"hush-hush-9\"]",
        )
        .unwrap();
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hush-hush-9") && !debug.contains("tok-123456"),
            "{debug}"
        );
    }
}
