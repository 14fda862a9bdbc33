//! `hookd.toml`: the file format (a contract: README "Configuration") and its validation into [`Config`].
//!
//! Invariant: a `Config` is complete and consistent — every source has a working verifier, every
//! plugin a source names has settings, paths are absolute — so nothing after start-up re-checks it.
//! Unknown keys are refused with the key's name; secrets are read here and never printed.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use serde::Deserialize;

mod database;
mod retention;
pub use database::{DATABASE_URL_ENV, Database, DatabaseError, DatabaseUrl, Pooler};
pub use retention::{MAX_BATCH_SIZE, MIN_DONE_AFTER, Retention};

use crate::{
    ids::{PluginName, SourceName},
    model::StateLimits,
    outbound::{
        AllowList,
        credentials::{Credential, CredentialError, Credentials},
        tls,
    },
    registry::FileNeeds,
    verify::{
        Credential as SchemeCredential, HmacParts, HmacSetting, HmacSettingsError, Scheme,
        SchemeKind, Secret, Verifier, VerifierConfigError,
    },
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
    #[serde(default)]
    retention: retention::RetentionFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerFile {
    listen: SocketAddr,
    admin_listen: SocketAddr,
    admin_token: Option<String>,
    /// Names (besides IP literals of the bound address and `localhost`) that a request's `Host`
    /// may carry to reach `/admin/*`: the DNS-rebinding guard.
    admin_hosts: Vec<String>,
    /// A file path (SQLite) or a `postgres://` URL; env `HOOKD_DATABASE_URL` replaces it.
    database: String,
    /// What stands between hookd and a PostgreSQL database: `none`, `session`, `transaction`.
    database_pooler: Pooler,
    plugins_dir: PathBuf,
    /// Compiled plugin code, so a restart does not compile every plugin again. Host-private:
    /// never inside `plugins_dir`. Default: `.hookd-cache` beside the SQLite database (beside
    /// the config file with PostgreSQL).
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
    /// Handler invocations running at once across all plugins; default: 32 per core.
    workers: Option<usize>,
    /// Threads running handlers; default: one per core.
    wasm_threads: Option<usize>,
    /// Linear memory all plugin calls in flight may hold together; default: half the memory
    /// this process may use.
    plugin_memory_mib: Option<u64>,
    /// Slow-loris guard: a client must finish its request head within this time.
    header_timeout_ms: u64,
    /// A client must finish sending its body within this time.
    body_timeout_ms: u64,
    /// Open ingest connections at once; more wait in the kernel's accept queue.
    max_connections: usize,
    /// Bytes of request bodies held in memory at once across all connections (reserved from
    /// `Content-Length` before reading, else grown chunk by chunk); beyond it 503.
    max_inflight_body_bytes: u64,
    /// Of those, the bytes one client address (IPv6: one /64) may hold; default a quarter of
    /// them, and at least the largest source's `max_body_bytes`.
    max_inflight_body_bytes_per_ip: Option<u64>,
    /// Connections at once from one client address (IPv6: one /64); more are refused with 503.
    max_connections_per_ip: usize,
    /// Longest wait for the first body byte and between body bytes.
    body_idle_timeout_ms: u64,
    /// Slowest average body rate tolerated once `body_idle_timeout_ms` has passed; 0 = off.
    min_body_bytes_per_sec: u64,
}

impl Default for ServerFile {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().expect("literal"),
            admin_listen: "127.0.0.1:8081".parse().expect("literal"),
            admin_token: None,
            admin_hosts: Vec::new(),
            database: "hookd.db".into(),
            database_pooler: Pooler::None,
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
            workers: None,
            wasm_threads: None,
            plugin_memory_mib: None,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_connections: 4096,
            max_inflight_body_bytes: 128 * 1024 * 1024,
            max_inflight_body_bytes_per_ip: None,
            max_connections_per_ip: 256,
            body_idle_timeout_ms: 5_000,
            min_body_bytes_per_sec: 16 * 1024,
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
    /// Largest body this source accepts; default `server.max_body_bytes`.
    #[serde(default)]
    max_body_bytes: Option<u64>,
    /// An event whose body (byte for byte) is stored for the source already is a duplicate,
    /// whatever its event id.
    #[serde(default)]
    dedupe_body: bool,
    /// `hmac-sha256` only: the header that carries the signature.
    #[serde(default)]
    signature_header: Option<String>,
    /// `hmac-sha256` only: a prefix before the signature, e.g. `sha256=`.
    #[serde(default)]
    signature_prefix: Option<String>,
    /// `hmac-sha256` only: `hex` (default) or `base64`.
    #[serde(default)]
    signature_encoding: Option<String>,
    /// `discord` only: the application's hex Ed25519 public key.
    #[serde(default)]
    public_key: Option<String>,
    /// `meta` only: the token its `GET` subscription handshake presents.
    #[serde(default)]
    verify_token: Option<String>,
    /// `meta` only: the environment variable holding `verify_token`.
    #[serde(default)]
    verify_token_env: Option<String>,
    /// `msgraph` only: the `clientState` every notification carries.
    #[serde(default)]
    client_state: Option<String>,
    /// `msgraph` only: the environment variable holding `client_state`.
    #[serde(default)]
    client_state_env: Option<String>,
}

fn default_tolerance_secs() -> u64 {
    300
}

/// Bytes in a MiB, the unit of the `*_mib` keys.
const MIB: u64 = 1024 * 1024;

/// A standard-webhooks key shorter than this (decoded) is warned about: providers issue 24 to
/// 64 bytes, so a shorter one is most often a secret cut short when it was copied (and every
/// request then fails its signature), else one easy to guess.
const SHORT_WHSEC_KEY: usize = 16;

/// The standard-webhooks secrets of `source` whose decoded key is short, by their index in the
/// list the verifier was given (`secrets`, then `secrets_env`); never a value.
fn short_key_warnings(source: &SourceConfig) -> Vec<String> {
    if source.verifier.scheme().kind() != SchemeKind::StandardWebhooks {
        return Vec::new();
    }
    source
        .verifier
        .key_lengths()
        .enumerate()
        .filter(|&(_, len)| len < SHORT_WHSEC_KEY)
        .map(|(i, len)| {
            format!(
                "sources.{}: secret {i} (counting secrets, then secrets_env) decodes to {len} \
                 bytes after whsec_, where providers issue 24 to 64: was it cut short when \
                 copied?",
                source.name
            )
        })
        .collect()
}

/// Above this a timestamp window is warned about: a captured request verifies that long.
const LONG_TOLERANCE: Duration = Duration::from_secs(3600);

/// What is odd about `source`'s `tolerance_secs`, if anything: set on a scheme that signs no
/// timestamp (it does nothing there), 0 (every request signed in an earlier second is
/// refused), or over [`LONG_TOLERANCE`].
fn tolerance_warning(source: &SourceConfig) -> Option<String> {
    let scheme = source.verifier.scheme().kind();
    let tolerance = source.verifier.tolerance();
    let key = format!("sources.{}.tolerance_secs", source.name);
    if !scheme.signs_timestamp() {
        return (tolerance != Duration::from_secs(default_tolerance_secs())).then(|| {
            format!(
                "{key} does nothing: scheme \"{scheme}\" signs no timestamp, so a captured \
                 request verifies whenever it is sent again (a duplicate if its id is the same)"
            )
        });
    }
    if tolerance.is_zero() {
        return Some(format!(
            "{key} is 0: a request signed in an earlier second than it arrives is refused (401), \
             and so is every retry of it"
        ));
    }
    (tolerance > LONG_TOLERANCE).then(|| {
        format!(
            "{key} is {}: a captured request verifies that long after it was signed",
            humantime::format_duration(tolerance)
        )
    })
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
    max_file_mib: Option<u64>,
    parser_timeout_ms: Option<u64>,
    parser_memory_mib: Option<u64>,
    output_kib: Option<u64>,
    log_kib: Option<u64>,
    attempt_state_keys: Option<u64>,
    attempt_state_kib: Option<u64>,
    state_max_keys: Option<u64>,
    state_max_mib: Option<u64>,
    max_concurrency: Option<usize>,
    delivery: Option<DeliveryMode>,
    on_stale: Option<OnStale>,
    #[serde(default)]
    allow_hosts: Vec<String>,
    /// `hookd dev` only: the command (argv) that builds this plugin's file.
    build: Option<Vec<String>>,
    /// PEM file of extra CAs its `https` requests trust (relative to the config's directory).
    ca_file: Option<PathBuf>,
    /// `"host:port" = { header, env, prefix }`: headers the host adds to requests to that
    /// listed target, valued from its own environment.
    #[serde(default)]
    credentials: BTreeMap<String, CredentialFile>,
    #[serde(default)]
    config: BTreeMap<String, toml::Value>,
}

/// One `[plugins.<name>.credentials]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialFile {
    header: String,
    env: String,
    #[serde(default)]
    prefix: String,
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

/// What happens when an attempt ended without the handler's own verdict and nobody knows
/// whether it acted: its worker died (crash, kill), or the host stopped it (timeout, trap,
/// memory, an output over its cap, a state write over the plugin's total).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryMode {
    /// Re-run it: effects may happen twice unless the handler is idempotent (the default).
    AtLeastOnce,
    /// Never re-run it: dead-letter it (a dead worker's attempt as `abandoned`) for a human to
    /// replay. A handler's own `retry` is still retried, and a state conflict still runs it
    /// again (its writes were not kept).
    AtMostOnce,
}

/// What a handler gets of an event older (by `sequence`) than one of its ordering key it has
/// already handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStale {
    /// Nothing: the delivery is marked `stale` and never run (the default). Right when the
    /// newest state wins, e.g. syncing an object's latest version.
    Skip,
    /// The event, with `stale` set (WIT 0.3.0 and later; older plugins get it without the
    /// flag). Right for additive events, e.g. payments to be counted however late.
    Deliver,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub sources: BTreeMap<SourceName, Arc<SourceConfig>>,
    pub plugins: BTreeMap<PluginName, Arc<PluginConfig>>,
    /// `[retention]`: when finished work is pruned.
    pub retention: Retention,
}

/// `[server]`, with paths made absolute against the config file's directory.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// `None` only until `run` starts: it then loads or generates the token file beside the
    /// SQLite database (`admin::token`), so the admin API always requires a token. Always set
    /// with PostgreSQL (every node must accept the same token).
    pub admin_token: Option<Secret>,
    /// Extra `Host` names `/admin/*` answers to (lowercase, no port).
    pub admin_hosts: Vec<String>,
    pub database: Database,
    /// What stands between hookd and a PostgreSQL `database` (always `None` with SQLite).
    pub database_pooler: Pooler,
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
    /// Handler attempts running at once (`server.workers`; default [`WORKERS_PER_CORE`] per
    /// core).
    pub workers: usize,
    /// Threads of the Wasm pool (`server.wasm_threads`; default one per core).
    pub wasm_threads: usize,
    /// Linear memory of all plugin calls in flight together (`server.plugin_memory_mib`;
    /// default half of [`memory_available`]).
    pub plugin_memory_bytes: u64,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
    /// Body bytes held at once across all requests (the in-flight body budget).
    pub max_inflight_body_bytes: u64,
    /// Of the budget, the bytes one client address (IPv6: one /64) may hold at once.
    pub max_inflight_body_bytes_per_ip: u64,
    pub max_connections_per_ip: usize,
    pub body_idle_timeout: Duration,
    /// 0 = no minimum rate.
    pub min_body_bytes_per_sec: u64,
}

/// One `[sources.<name>]`.
#[derive(Debug)]
pub struct SourceConfig {
    pub name: SourceName,
    pub verifier: Verifier,
    pub parser: Option<PluginName>,
    pub handlers: Vec<PluginName>,
    /// Largest body accepted (413 beyond); at most `server.max_inflight_body_bytes`.
    pub max_body_bytes: u64,
    /// An event with a body stored for this source already is a duplicate, whatever its id
    /// (`dedupe_body`; for schemes whose id is not signed).
    pub dedupe_body: bool,
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
    /// Largest plugin file it loads (`max_file_mib`; a file several instances share gets the
    /// largest of theirs).
    pub max_file_bytes: u64,
    /// Parser budget per request: it runs before the provider gets its answer.
    pub parser_timeout: Duration,
    pub parser_memory_bytes: u64,
    /// Neither `parser_timeout_ms` nor `parser_memory_mib` set: the parser budget grows with
    /// the body it is given ([`PluginConfig::parser_limits_for`]).
    pub parser_limits_scale: bool,
    /// Largest output (a handler's result, a parser's envelope) per call; more is an error.
    pub output_bytes: usize,
    /// Log bytes per call; beyond this lines are dropped after one truncation marker.
    pub log_bytes: usize,
    /// A hard cap on attempts of this plugin running at once; `None` (the default): no fixed
    /// cap, the dispatcher's fair share of `server.workers` (see `dispatch::fair`).
    pub max_concurrency: Option<usize>,
    /// Plugin state a handler attempt may write, and the plugin may hold in total.
    pub state_limits: StateLimits,
    pub delivery: DeliveryMode,
    /// What its handler gets of a stale event (`on_stale`).
    pub on_stale: OnStale,
    /// `hookd dev` only (`serve` ignores it): the command, as argv, run in the config file's
    /// directory to build this plugin's file; `{out}` in an argument is replaced by the path
    /// to write the component to (also in env `HOOKD_BUILD_OUT`). For plugins cargo does not
    /// build: JavaScript, Python.
    pub build: Option<Vec<String>>,
    /// Where its handler may send HTTP requests (`host:port` entries); empty = no network.
    pub allow_hosts: AllowList,
    /// The TLS client its `https` requests use: default roots plus its `ca_file`.
    pub tls: Arc<rustls::ClientConfig>,
    /// Headers the host injects into its requests to particular listed targets.
    pub credentials: Credentials,
    /// The plugin's own `config` table, values as strings, for the `config` import.
    pub config: BTreeMap<String, String>,
}

impl PluginConfig {
    /// The settings of a plugin a source names but the file does not declare.
    pub fn with_defaults(name: PluginName) -> Self {
        Self::from_file(name, PluginFile::default(), Path::new("."), &|_| None)
            .expect("defaults are valid")
    }

    fn from_file(
        name: PluginName,
        file: PluginFile,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let wasm = file.wasm.unwrap_or_else(|| name.to_string());
        if !is_file_stem(&wasm) {
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
        let max_file_mib = file
            .max_file_mib
            .unwrap_or(crate::registry::MAX_PLUGIN_BYTES / MIB);
        if !(1..=crate::registry::LARGEST_PLUGIN_BYTES / MIB).contains(&max_file_mib) {
            bail!(
                "plugins.{name}.max_file_mib must be between 1 and {} (got {max_file_mib})",
                crate::registry::LARGEST_PLUGIN_BYTES / MIB
            );
        }
        let timeout_ms = file.timeout_ms.unwrap_or(30_000);
        let parser_timeout_ms = file.parser_timeout_ms.unwrap_or(50);
        for (key, ms) in [
            ("timeout_ms", timeout_ms),
            ("parser_timeout_ms", parser_timeout_ms),
        ] {
            if !(1..=MAX_TIMEOUT_MS).contains(&ms) {
                bail!("plugins.{name}.{key} must be between 1 and {MAX_TIMEOUT_MS} (got {ms})");
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
        let defaults = StateLimits::DEFAULT;
        let attempt_state_keys = file
            .attempt_state_keys
            .unwrap_or(defaults.attempt_keys as u64);
        let attempt_state_kib = file
            .attempt_state_kib
            .unwrap_or(defaults.attempt_bytes / KIB);
        let state_max_keys = file.state_max_keys.unwrap_or(defaults.max_keys);
        let state_max_mib = file.state_max_mib.unwrap_or(defaults.max_bytes / MIB);
        for (key, value, max) in [
            ("attempt_state_keys", attempt_state_keys, 1_000_000),
            // One commit holds at most this much state: keep it small enough not to stall ingest.
            ("attempt_state_kib", attempt_state_kib, 16 * 1024),
            ("state_max_keys", state_max_keys, 1_000_000_000),
            ("state_max_mib", state_max_mib, 1024 * 1024),
        ] {
            if !(1..=max).contains(&value) {
                bail!("plugins.{name}.{key} must be between 1 and {max} (got {value})");
            }
        }
        let state_limits = StateLimits {
            attempt_keys: attempt_state_keys as usize,
            attempt_bytes: attempt_state_kib * KIB,
            max_keys: state_max_keys,
            max_bytes: state_max_mib * MIB,
        };
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
        let allow_hosts = AllowList::parse(&file.allow_hosts)
            .map_err(|e| anyhow::anyhow!("plugins.{name}.allow_hosts: {e}"))?;
        let ca_file = file.ca_file.map(|path| base_dir.join(path));
        let tls = tls::client_config(ca_file.as_deref())
            .map_err(|e| anyhow::anyhow!("plugins.{name}.ca_file: {e}"))?;
        let credentials = file
            .credentials
            .iter()
            .map(|(entry, c)| {
                Credential::new(&allow_hosts, entry, &c.header, &c.env, &c.prefix, env).map_err(
                    |e| match e {
                        // Said as every `_env` key's are: a name that may be the secret itself
                        // is never echoed.
                        CredentialError::Missing { .. }
                        | CredentialError::Empty { .. }
                        | CredentialError::Whitespace { .. } => {
                            let key = format!("plugins.{name}.credentials.\"{entry}\".env");
                            env_secret(env, &key, &c.env).err().unwrap_or_else(|| {
                                anyhow::anyhow!("{key}: its variable changed while it was read")
                            })
                        }
                        e => anyhow::anyhow!("plugins.{name}.credentials: {e}"),
                    },
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            wasm,
            max_attempts,
            backoff_base: Duration::from_millis(file.backoff_base_ms.unwrap_or(1_000)),
            backoff_max: Duration::from_millis(file.backoff_max_ms.unwrap_or(3_600_000)),
            timeout: Duration::from_millis(timeout_ms),
            memory_bytes: memory_mib * MIB,
            max_file_bytes: max_file_mib * MIB,
            parser_timeout: Duration::from_millis(parser_timeout_ms),
            parser_memory_bytes: parser_memory_mib * MIB,
            parser_limits_scale: file.parser_timeout_ms.is_none()
                && file.parser_memory_mib.is_none(),
            output_bytes: (output_kib * KIB) as usize,
            log_bytes: (log_kib * KIB) as usize,
            max_concurrency: match file.max_concurrency {
                Some(0) => bail!("plugins.{name}.max_concurrency must be at least 1"),
                cap => cap,
            },
            state_limits,
            delivery: file.delivery.unwrap_or(DeliveryMode::AtLeastOnce),
            on_stale: file.on_stale.unwrap_or(OnStale::Skip),
            build: match file.build {
                Some(argv) if argv.first().is_none_or(|program| program.is_empty()) => {
                    bail!("plugins.{name}.build must name a program to run (an argv list)")
                }
                build => build,
            },
            allow_hosts,
            tls,
            credentials: Credentials::new(credentials)
                .map_err(|e| anyhow::anyhow!("plugins.{name}.credentials: {e}"))?,
            config,
            name,
        })
    }
}

impl PluginConfig {
    /// The parser budget (wall clock, linear memory) for a body of `body_len` bytes. Set keys
    /// are taken as they are; without them the defaults (50 ms, 16 MiB) grow by
    /// [`PARSER_MS_PER_MIB`] and [`PARSER_MEMORY_PER_BODY_BYTE`], so that any body a source
    /// accepts (up to 25 MiB by default) can be parsed into a JSON tree instead of being
    /// quarantined; capped at 1024 MiB.
    pub fn parser_limits_for(&self, body_len: usize) -> (Duration, u64) {
        if !self.parser_limits_scale {
            return (self.parser_timeout, self.parser_memory_bytes);
        }
        let body = body_len as u64;
        let timeout = self.parser_timeout
            + Duration::from_millis(body.saturating_mul(PARSER_MS_PER_MIB) / (1024 * 1024));
        let memory = self
            .parser_memory_bytes
            .saturating_add(body.saturating_mul(PARSER_MEMORY_PER_BODY_BYTE))
            .min(1024 * 1024 * 1024);
        (timeout, memory)
    }

    /// The budget of one parser call on a body of `body_len` bytes (see
    /// [`PluginConfig::parser_limits_for`]).
    pub fn parser_limits(&self, body_len: usize) -> crate::runtime::Limits {
        let (timeout, memory_bytes) = self.parser_limits_for(body_len);
        self.call_limits(
            (timeout, "parser_timeout_ms"),
            (memory_bytes, "parser_memory_mib"),
            crate::runtime::PoolShare::All,
        )
    }

    /// The budget of one handler attempt.
    pub fn handler_limits(&self) -> crate::runtime::Limits {
        self.call_limits(
            (self.timeout, "timeout_ms"),
            (self.memory_bytes, "memory_mib"),
            crate::runtime::PoolShare::Handlers,
        )
    }

    /// A call's budget: its role's time and memory, each with the setting it comes from, and
    /// the output and log caps both roles share.
    fn call_limits(
        &self,
        (timeout, timeout_key): (Duration, &'static str),
        (memory_bytes, memory_key): (u64, &'static str),
        pool_share: crate::runtime::PoolShare,
    ) -> crate::runtime::Limits {
        crate::runtime::Limits {
            timeout,
            timeout_key,
            memory_bytes,
            memory_key,
            pool_share,
            output_bytes: self.output_bytes,
            log_bytes: self.log_bytes,
        }
    }
}

/// Extra parser wall clock per MiB of body when `parser_timeout_ms` is not set: generous, since
/// only a verified body reaches the parser (a 24 MiB GitHub event took 2.5 s in a debug build
/// on a loaded 2-core machine, copying the body into the guest included).
pub const PARSER_MS_PER_MIB: u64 = 250;
/// Extra parser linear memory per body byte when `parser_memory_mib` is not set: the body's
/// copy in the guest plus a decoded JSON tree of it.
pub const PARSER_MEMORY_PER_BODY_BYTE: u64 = 6;

/// `server.workers` per core when it is not set: an attempt spends most of its time waiting
/// (on its outbound HTTP calls, on its commit), so many run per core that executes Wasm.
pub const WORKERS_PER_CORE: usize = 32;
/// Upper bound of `server.wasm_threads`.
const MAX_WASM_THREADS: usize = 1024;
/// Upper bound of `server.max_connections` and `max_connections_per_ip` (a semaphore's permits
/// are bounded too; far beyond it one panicked at the first connection).
const MAX_CONNECTIONS: usize = 1 << 20;
/// Upper bound of a plugin's `timeout_ms` and `parser_timeout_ms` (365 days): an attempt's
/// lease is its timeout, kept in milliseconds beside the clock, where a value near 2^63 wrapped
/// into the past. (It was a day for a while, which refused configurations that had started
/// with more.)
const MAX_TIMEOUT_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// Upper bound of `server.plugin_memory_mib` (16 TiB).
const MAX_PLUGIN_MEMORY_MIB: u64 = 1 << 24;
/// `server.plugin_memory_mib` when it is not set and the memory available cannot be told.
const DEFAULT_PLUGIN_MEMORY_BYTES: u64 = 4 << 30;

/// The memory this process may use: the machine's (`MemTotal` in `/proc/meminfo`), or its
/// cgroup's limit (`memory.max`, cgroup v2) when that is lower; `None` when neither can be read.
pub fn memory_available() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)?;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|max| max.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |limit| limit.min(total)))
}

/// The cores this process may run on (its CPU affinity and cgroup quota, as the standard
/// library reads them); 1 when that cannot be told.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Config {
    /// What in this configuration is allowed but cannot work as it stands, one line each, for
    /// the start-up log: a source without a `parser` whose scheme carries no event-id header
    /// answers every event 400 (its handshakes still work, so it may be on its way).
    ///
    /// Settings that work as written but are more likely a slip than a wish are said too: a
    /// zero backoff (every attempt spent in moments), a zero backlog bound (every new event
    /// refused: a drain), a zero body cap (every request with a body refused), event ids
    /// forgotten within providers' retry windows (a retry delivered again).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self
            .sources
            .values()
            .filter(|s| s.parser.is_none() && s.verifier.scheme().id_header().is_none())
            .map(|s| {
                format!(
                    "sources.{}: scheme \"{}\" carries no event-id header and the source has no \
                     `parser`, so every event sent to it is refused (400) until one is set",
                    s.name,
                    s.verifier.scheme().name()
                )
            })
            .collect();
        for plugin in self.plugins.values() {
            for (key, delay) in [
                ("backoff_base_ms", plugin.backoff_base),
                ("backoff_max_ms", plugin.backoff_max),
            ] {
                if delay.is_zero() {
                    warnings.push(format!(
                        "plugins.{}.{key} is 0: a failed attempt is retried at once, so all \
                         {} attempts of a delivery can be spent in moments",
                        plugin.name, plugin.max_attempts
                    ));
                }
            }
        }
        if self.server.max_backlog == 0 {
            warnings.push(
                "server.max_backlog is 0: every new event is refused (503); only a provider's \
                 retries of stored events are answered (202 duplicate)"
                    .to_owned(),
            );
        }
        if self.server.max_inflight_body_bytes == 0 {
            warnings.push(
                "server.max_inflight_body_bytes is 0: every request with a body is refused, \
                 413 at ingest (every body cap is 0 with it) and 503 at the admin listener"
                    .to_owned(),
            );
        }
        if let Some(remembered) = self.retention.remembers_ids_for()
            && remembered < retention::PROVIDER_RETRY_WINDOW
        {
            warnings.push(format!(
                "retention.done_after + retention.dedupe_for is {}: an event id is forgotten \
                 that soon after its work finished, so a provider's retry after it is a new \
                 event, delivered again (Stripe retries for up to 3 days)",
                humantime::format_duration(remembered)
            ));
        }
        for source in self.sources.values().filter(|s| s.max_body_bytes == 0) {
            warnings.push(format!(
                "sources.{}: its body cap (max_body_bytes) is 0, so every request with a body is \
                 refused (413)",
                source.name
            ));
        }
        for source in self.sources.values() {
            warnings.extend(tolerance_warning(source));
            warnings.extend(short_key_warnings(source));
        }
        if self.retention.done_after.is_some() && self.retention.interval < Duration::from_secs(1) {
            warnings.push(format!(
                "retention.interval is {}: once caught up, the pruner walks the events it cannot \
                 prune yet (dead letters among them) again that often, taking turns with ingest \
                 at the database; a minute (the default) is plenty",
                humantime::format_duration(self.retention.interval)
            ));
        }
        if matches!(self.server.database, Database::Postgres(_)) {
            let sqlite_only = [
                ("durability", self.server.durability != Durability::Full),
                ("group_commit", !self.server.group_commit),
            ];
            for (key, set) in sqlite_only {
                if set {
                    warnings.push(format!(
                        "server.{key} applies to SQLite only and does nothing here: on \
                         PostgreSQL a 202 follows a COMMIT as durable as the server's \
                         synchronous_commit makes it, and accepts are always batched"
                    ));
                }
            }
        }
        let pool = self.server.plugin_memory_bytes;
        let sources = || self.sources.values();
        for plugin in self.plugins.values() {
            let name = &plugin.name;
            let handler = sources().any(|s| s.handlers.contains(name));
            let parser = sources().any(|s| s.parser.as_ref() == Some(name));
            // A handler attempt draws on the handlers' share of the pool only.
            let handlers_share =
                crate::runtime::handlers_share(usize::try_from(pool).unwrap_or(usize::MAX)) as u64;
            for (key, bytes, used, room, of) in [
                (
                    "memory_mib",
                    plugin.memory_bytes,
                    handler,
                    handlers_share,
                    "the three quarters of server.plugin_memory_mib that handler attempts share",
                ),
                (
                    "parser_memory_mib",
                    plugin.parser_memory_bytes,
                    parser,
                    pool,
                    "server.plugin_memory_mib, which all plugin calls share",
                ),
            ] {
                if used && bytes > room {
                    warnings.push(format!(
                        "plugins.{}.{key} ({} MiB) is more than {of} ({} MiB of {} MiB): a \
                         call that grows past that traps however often it is retried",
                        plugin.name,
                        bytes / MIB,
                        room / MIB,
                        pool / MIB
                    ));
                }
            }
        }
        warnings
    }

    /// The plugin instances configured with file stem `wasm`, by name: what a new version or a
    /// rollback of that file changes.
    pub fn instances_of<'a>(&'a self, wasm: &'a str) -> impl Iterator<Item = &'a PluginName> + 'a {
        self.plugins
            .values()
            .filter(move |plugin| plugin.wasm == wasm)
            .map(|plugin| &plugin.name)
    }

    /// What the configuration asks of each plugin file, by stem: its size cap (the largest
    /// `max_file_mib` of the instances that load it), the roles sources use it in, and the
    /// most memory an instance of each role may hold.
    pub fn file_needs(&self) -> HashMap<String, FileNeeds> {
        let mut needs: HashMap<String, FileNeeds> = HashMap::new();
        for plugin in self.plugins.values() {
            let need = needs.entry(plugin.wasm.clone()).or_insert(FileNeeds {
                max_bytes: 0,
                ..FileNeeds::default()
            });
            need.max_bytes = plugin.max_file_bytes.max(need.max_bytes);
            need.instances.push(plugin.name.to_string());
        }
        for source in self.sources.values() {
            let parser = source.parser.iter().map(|p| (p, true));
            for (instance, as_parser) in parser.chain(source.handlers.iter().map(|h| (h, false))) {
                let plugin = self.plugin(instance);
                let need = needs.entry(plugin.wasm.clone()).or_default();
                let start = &mut need.start;
                let (used, key, most, most_of, memory) = if as_parser {
                    let memory = plugin.parser_limits_for(0).1;
                    let most = (&mut start.parser_memory, &mut start.parser_instance);
                    (&mut need.parser, "parser", most.0, most.1, memory)
                } else {
                    let memory = plugin.memory_bytes;
                    let most = (&mut start.handler_memory, &mut start.handler_instance);
                    (&mut need.handler, "handlers", most.0, most.1, memory)
                };
                if most_of.is_none() || memory > *most {
                    *most = memory;
                    *most_of = Some(instance.to_string());
                }
                used.get_or_insert_with(|| format!("sources.{}.{key} ({instance})", source.name));
            }
        }
        needs
    }

    /// Reads and validates `path`; relative paths inside are taken relative to its directory.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = read_config_file(path)?;
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
        let file: ConfigFile = toml::from_str(text).map_err(|e| redacted_toml_error(text, &e))?;
        let s = file.server;
        // The environment's replaces the file's, as `HOOKD_DATABASE_URL` does (and as the admin
        // CLI sends it): a token set there to rotate the file's leaves the file's one invalid.
        let env_token = env("HOOKD_ADMIN_TOKEN");
        let admin_token = env_token.clone().or_else(|| s.admin_token.clone());
        // Port 0 is a new port for each listener; any other the same on both cannot work
        // (the second bind would wait for the first, then fail as "in use by another program").
        // A wildcard takes the port on every address of its family, and `[::]` on IPv4's too
        // (Linux binds it dual-stack); an IPv4 wildcard leaves IPv6 addresses free.
        let (ingest, admin) = (
            s.listen.ip().to_canonical(),
            s.admin_listen.ip().to_canonical(),
        );
        let dual_stack = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.is_unspecified());
        let overlap = ingest == admin
            || (ingest.is_ipv4() == admin.is_ipv4()
                && (ingest.is_unspecified() || admin.is_unspecified()))
            || dual_stack(ingest)
            || dual_stack(admin);
        if s.listen.port() == s.admin_listen.port() && s.listen.port() != 0 && overlap {
            bail!(
                "server.listen ({}) and server.admin_listen ({}) take the same port on one \
                 address: the ingest and admin listeners need an address each",
                s.listen,
                s.admin_listen
            );
        }
        if admin_token.is_none() && !s.admin_listen.ip().is_loopback() {
            bail!(
                "server.admin_token (or env HOOKD_ADMIN_TOKEN) is required when server.admin_listen \
                 ({}) is not a loopback address",
                s.admin_listen
            );
        }
        if admin_token.as_deref() == Some("") {
            if env_token.is_some() {
                bail!(
                    "env HOOKD_ADMIN_TOKEN is set but empty (set a token there, or unset it to \
                     use server.admin_token or a generated one)"
                );
            }
            bail!("server.admin_token must not be empty");
        }
        if let Some(token) = &admin_token
            && let Err(why) = check_token_chars(token)
        {
            bail!("server.admin_token (or env HOOKD_ADMIN_TOKEN): {why}");
        }
        if let Some(token) = &admin_token
            && !s.admin_listen.ip().is_loopback()
            && let Err(why) = check_strong_token(token)
        {
            bail!(
                "server.admin_token (or env HOOKD_ADMIN_TOKEN): {why}, and server.admin_listen \
                 ({}) is not a loopback address (weak tokens are only accepted on loopback)",
                s.admin_listen
            );
        }
        let admin_hosts = s
            .admin_hosts
            .iter()
            .map(|name| check_admin_host(name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cores = cores();
        let workers = s.workers.unwrap_or(WORKERS_PER_CORE * cores);
        let wasm_threads = s.wasm_threads.unwrap_or(cores);
        if workers == 0 {
            bail!("server.workers must be at least 1");
        }
        if s.max_connections == 0 {
            bail!("server.max_connections must be at least 1");
        }
        if !(1..=MAX_WASM_THREADS).contains(&wasm_threads) {
            bail!(
                "server.wasm_threads must be between 1 and {MAX_WASM_THREADS} (got {wasm_threads})"
            );
        }
        if s.max_connections_per_ip == 0 {
            bail!("server.max_connections_per_ip must be at least 1");
        }
        for (key, value) in [
            ("max_connections", s.max_connections),
            ("max_connections_per_ip", s.max_connections_per_ip),
        ] {
            if value > MAX_CONNECTIONS {
                bail!(
                    "server.{key} must be at most {MAX_CONNECTIONS} (got {value}): each \
                     connection is a file descriptor, and the kernel runs out long before"
                );
            }
        }
        for (key, ms) in [
            ("header_timeout_ms", s.header_timeout_ms),
            ("body_timeout_ms", s.body_timeout_ms),
            ("body_idle_timeout_ms", s.body_idle_timeout_ms),
        ] {
            if ms == 0 {
                bail!(
                    "server.{key} must be at least 1: 0 would cut off every request that does \
                     not arrive in one packet (these bounds cannot be turned off; raise them \
                     instead)"
                );
            }
        }
        if s.max_body_bytes > s.max_inflight_body_bytes {
            bail!(
                "server.max_body_bytes ({}) must not exceed server.max_inflight_body_bytes ({}): \
                 a body that large could never be admitted",
                s.max_body_bytes,
                s.max_inflight_body_bytes
            );
        }
        let database = match env(DATABASE_URL_ENV) {
            Some(value) if value.trim().is_empty() => bail!(
                "env {DATABASE_URL_ENV} is set but empty: unset it to use server.database, or \
                 give it the database's URL (a node started on a file of its own instead would \
                 share nothing with the others)"
            ),
            Some(value) => value,
            None => s.database,
        };
        let database = Database::parse(&database, base_dir)
            .map_err(|e| anyhow::anyhow!("server.database (or env {DATABASE_URL_ENV}): {e}"))?;
        if matches!(database, Database::Postgres(_)) && admin_token.is_none() {
            bail!(
                "server.admin_token (or env HOOKD_ADMIN_TOKEN) is required with a PostgreSQL \
                 server.database: every node must accept the same token, and there is no \
                 database file to keep a generated one beside"
            );
        }
        if matches!(database, Database::Sqlite(_)) && s.database_pooler != Pooler::None {
            bail!(
                "server.database_pooler applies to a PostgreSQL server.database only (this one \
                 is the SQLite file {database})"
            );
        }
        let plugins_dir = base_dir.join(s.plugins_dir);
        let cache_dir_set = s.cache_dir.is_some();
        let cache_dir = match (s.cache_dir, database.sqlite_path()) {
            (Some(dir), _) => base_dir.join(dir),
            (None, Some(file)) => file.parent().unwrap_or(base_dir).join(".hookd-cache"),
            (None, None) => base_dir.join(".hookd-cache"),
        };
        if cache_dir.starts_with(&plugins_dir) || plugins_dir.starts_with(&cache_dir) {
            if !cache_dir_set {
                bail!(
                    "server.database ({database}) is inside server.plugins_dir ({}), and so \
                     would be the compiled-code cache kept beside it ({}): move the database \
                     out of plugins_dir, or set server.cache_dir",
                    plugins_dir.display(),
                    cache_dir.display()
                );
            }
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
        let plugin_memory_bytes = match s.plugin_memory_mib {
            Some(mib) if (1..=MAX_PLUGIN_MEMORY_MIB).contains(&mib) => mib << 20,
            Some(mib) => bail!(
                "server.plugin_memory_mib must be between 1 and {MAX_PLUGIN_MEMORY_MIB} (got {mib})"
            ),
            None => memory_available().map_or(DEFAULT_PLUGIN_MEMORY_BYTES, |bytes| bytes / 2),
        };
        let s_per_ip = s.max_inflight_body_bytes_per_ip;
        let mut server = ServerConfig {
            listen: s.listen,
            admin_listen: s.admin_listen,
            admin_token: admin_token.map(Secret::new),
            admin_hosts,
            database,
            database_pooler: s.database_pooler,
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
            workers,
            wasm_threads,
            plugin_memory_bytes,
            header_timeout: Duration::from_millis(s.header_timeout_ms),
            body_timeout: Duration::from_millis(s.body_timeout_ms),
            max_connections: s.max_connections,
            max_inflight_body_bytes: s.max_inflight_body_bytes,
            // Set once the sources are read (its default depends on their body caps).
            max_inflight_body_bytes_per_ip: s.max_inflight_body_bytes,
            max_connections_per_ip: s.max_connections_per_ip,
            body_idle_timeout: Duration::from_millis(s.body_idle_timeout_ms),
            min_body_bytes_per_sec: s.min_body_bytes_per_sec,
        };

        let mut plugins = BTreeMap::new();
        for (name, plugin) in file.plugins {
            check_name("plugins", &name)?;
            let name = PluginName::new(name);
            let config = PluginConfig::from_file(name.clone(), plugin, base_dir, env)?;
            plugins.insert(name, Arc::new(config));
        }

        let mut sources = BTreeMap::new();
        for (name, source) in file.sources {
            check_name("sources", &name)?;
            let config = source_config(&name, source, &server, env)?;
            for plugin in config.parser.iter().chain(&config.handlers) {
                plugins
                    .entry(plugin.clone())
                    .or_insert_with(|| Arc::new(PluginConfig::with_defaults(plugin.clone())));
            }
            sources.insert(config.name.clone(), Arc::new(config));
        }
        server.max_inflight_body_bytes_per_ip = body_share(
            &server,
            s_per_ip,
            sources.values().map(|s| s.max_body_bytes),
        )?;
        let retention = file.retention.validate()?;
        Ok(Self {
            server,
            sources,
            plugins,
            retention,
        })
    }

    /// Every distinct wasm file stem the configuration uses.
    pub fn wasm_stems(&self) -> Vec<String> {
        let mut stems: Vec<String> = self.plugins.values().map(|p| p.wasm.clone()).collect();
        stems.sort();
        stems.dedup();
        stems
    }

    /// A plugin instance's settings. A name the file no longer declares (only a delivery stored
    /// under an earlier configuration still names it) gets the defaults.
    pub fn plugin(&self, name: &PluginName) -> Arc<PluginConfig> {
        self.plugins
            .get(name)
            .cloned()
            .unwrap_or_else(|| Arc::new(PluginConfig::with_defaults(name.clone())))
    }
}

/// Shortest admin token accepted on a non-loopback `admin_listen`.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// Placeholders found in examples and templates (compared lowercase, letters and digits only).
const PLACEHOLDER_TOKENS: [&str; 8] = [
    "changeme",
    "replaceme",
    "placeholder",
    "example",
    "yourtoken",
    "admintoken",
    "password",
    "secret",
];

/// `Err(why)` (never quoting the token) if `token` could never be presented: clients send it in
/// an `Authorization` header, whose value the admin listener trims, so surrounding whitespace (a
/// file's trailing newline) or a character a header cannot carry would lock every client out.
fn check_token_chars(token: &str) -> Result<(), String> {
    if token.trim() != token {
        return Err(
            "the token starts or ends with whitespace (a newline from the file or \
                    variable it was read from?), which no Authorization header carries"
                .into(),
        );
    }
    match token.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
        Some(c) => Err(format!(
            "the token contains a {} character, which an Authorization header cannot carry \
             (use printable ASCII)",
            if c.is_control() {
                "control"
            } else {
                "non-ASCII"
            }
        )),
        None => Ok(()),
    }
}

/// `Err(why)` (never quoting the token) if `token` is too weak to guard an admin API that other
/// machines can reach: short, a well-known placeholder, or nearly one repeated character.
fn check_strong_token(token: &str) -> Result<(), String> {
    let chars = token.chars().count();
    if chars < MIN_ADMIN_TOKEN_CHARS {
        return Err(format!(
            "the token has {chars} characters, fewer than the {MIN_ADMIN_TOKEN_CHARS} required"
        ));
    }
    let folded: String = token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if let Some(word) = PLACEHOLDER_TOKENS.iter().find(|w| folded.contains(*w)) {
        return Err(format!("the token contains the placeholder word {word:?}"));
    }
    let mut distinct: Vec<char> = token.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 6 {
        return Err("the token uses fewer than 6 distinct characters".into());
    }
    Ok(())
}

/// One `server.admin_hosts` entry: a host name or IP literal without port, lowercased.
fn check_admin_host(name: &str) -> anyhow::Result<String> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let ip = lower
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(&lower);
    let ok = ip.parse::<std::net::IpAddr>().is_ok()
        || (!lower.is_empty()
            && lower.len() <= 253
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')));
    if !ok {
        bail!(
            "server.admin_hosts: {name:?} is not a host name or IP address (no scheme, port or path)"
        );
    }
    Ok(ip.to_string())
}

/// A TOML error that still names the line, column and key but never quotes the file: the
/// toml crate's own message shows the offending line, which may hold a secret (`secrets = [...`,
/// `admin_token = ...`), and serde's messages quote the wrong-typed value.
fn redacted_toml_error(text: &str, e: &toml::de::Error) -> anyhow::Error {
    let Some(span) = e.span() else {
        return anyhow::anyhow!("TOML parse error: {}", redacted_message(e));
    };
    let start = span.start.min(text.len());
    let before = &text.as_bytes()[..start];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    // A duplicate key is dropped by the parser that `key_at` reads with; its span is the key.
    let duplicate = || {
        let key = text.get(span.clone())?.trim();
        (e.message() == "duplicate key" && !key.is_empty() && key.len() <= 128)
            .then(|| key.to_owned())
    };
    let key = key_at(text, start).or_else(duplicate);
    // A number or a boolean in a key that holds no secret is shown: it says what was wrong.
    let message = match &key {
        Some(key) if !may_hold_secret(key) => redact_quoted(&redact_scalars(e.message(), WORDS)),
        _ => redacted_message(e),
    };
    match key {
        Some(key) => anyhow::anyhow!(
            "TOML parse error at line {line}, column {column} (key `{key}`): {message}"
        ),
        None => anyhow::anyhow!("TOML parse error at line {line}, column {column}: {message}"),
    }
}

/// The message of `e` without any value the file holds (a secret in the wrong key or of the
/// wrong type would be echoed otherwise): [`redact_scalars`], then [`redact_quoted`].
fn redacted_message(e: &toml::de::Error) -> String {
    redact_quoted(&redact_scalars(e.message(), SCALARS))
}

/// The kinds of value serde puts in backticks (`` invalid type: integer `123456789012`,
/// expected a string ``): a secret of digits, or one written where a word is expected, must
/// not be echoed.
const SCALARS: &[&str] = &[
    "integer `",
    "floating point `",
    "boolean `",
    "character `",
    "unknown variant `",
];
/// Of [`SCALARS`], those that may be a word, redacted whatever the key (a secret pasted into
/// `scheme` is an unknown variant).
const WORDS: &[&str] = &["character `", "unknown variant `"];

/// Whether a key's name says it may hold a secret (or a part of one), so that even a number
/// given there is not echoed.
fn may_hold_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "secret",
        "token",
        "password",
        "credential",
        "key",
        "auth",
        "header",
        "env",
        "state",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// `` `…` `` for the value serde puts in backticks after each of `kinds`. Other backticked
/// text (key names, expected tokens) stays.
fn redact_scalars(message: &str, kinds: &[&str]) -> String {
    let mut out = message.to_owned();
    for kind in kinds {
        let mut from = 0;
        while let Some(at) = out[from..].find(kind) {
            let open = from + at + kind.len();
            // The value ends at the backtick before serde's `, expected`, not at its first
            // own backtick (a value may hold one); failing that, at the next backtick.
            let Some(len) = out[open..]
                .find("`, expected")
                .or_else(|| out[open..].find('`'))
            else {
                break;
            };
            out.replace_range(open..open + len, "…");
            from = open + "…`".len();
        }
    }
    out
}

/// `"…"` for every double-quoted stretch of `message` (serde quotes the offending value so,
/// with `\"` escapes inside); backticked text (key names, expected tokens like `` `"` ``) stays.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let (mut in_ticks, mut in_quotes, mut escaped) = (false, false, false);
    for c in message.chars() {
        if in_quotes {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_quotes = false;
                    out.push_str("…\"");
                }
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '`' => in_ticks = !in_ticks,
            '"' if !in_ticks => in_quotes = true,
            _ => {}
        }
        out.push(c);
    }
    if in_quotes {
        out.push_str("…\"");
    }
    out
}

/// The dotted key (a part that is not a bare key quoted) of the innermost entry, `key = value`
/// or a table's header, whose text covers byte `offset`, as toml's own parser reads the file
/// (recovering past a syntax error: an unclosed `secrets = [...` is still `secrets`).
fn key_at(text: &str, offset: usize) -> Option<String> {
    use toml::de::{DeTable, DeValue};

    fn part(key: &str) -> String {
        let bare = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if bare {
            key.to_owned()
        } else {
            format!("{key:?}")
        }
    }
    /// The narrowest covering entry so far: its length and its dotted key.
    type Best = Option<(usize, String)>;
    fn consider(range: std::ops::Range<usize>, offset: usize, path: &str, best: &mut Best) {
        if range.start <= offset
            && offset <= range.end
            && best.as_ref().is_none_or(|(len, _)| range.len() <= *len)
        {
            *best = Some((range.len(), path.to_owned()));
        }
    }
    fn inside(value: &DeValue<'_>, path: &str, offset: usize, best: &mut Best) {
        match value {
            DeValue::Table(table) => walk(table, path, offset, best),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    consider(item.span(), offset, &path, best);
                    inside(item.get_ref(), &path, offset, best);
                }
            }
            _ => {}
        }
    }
    fn walk(table: &DeTable<'_>, at: &str, offset: usize, best: &mut Best) {
        for (key, entry) in table.iter() {
            let path = match at {
                "" => part(key.get_ref()),
                _ => format!("{at}.{}", part(key.get_ref())),
            };
            let (k, v) = (key.span(), entry.span());
            consider(k.start.min(v.start)..k.end.max(v.end), offset, &path, best);
            inside(entry.get_ref(), &path, offset, best);
        }
    }
    let (document, _) = DeTable::parse_recoverable(text);
    let mut best = None;
    walk(document.get_ref(), "", offset, &mut best);
    best.map(|(_, key)| key)
}

/// What the admin commands (`hookd events | replay | plugins`) take from a `hookd.toml`: its
/// `server.admin_token`, else the token file hookd keeps beside its database. Reads `[server]`
/// only, so a source's `secrets_env` missing from the client's environment does not matter.
#[derive(Debug)]
pub struct ClientAdmin {
    /// `http://{server.admin_listen}` (an unspecified address as loopback; the default listen
    /// address when the file sets none).
    pub url: String,
    /// `server.admin_token` as written in the file (never printed).
    pub token: Option<String>,
    /// `<database>.admin-token`, where hookd keeps the token it generated (an SQLite database
    /// only: with PostgreSQL the token is always configured).
    pub token_file: Option<PathBuf>,
}

impl ClientAdmin {
    /// The admin API's URL when no config file says where it is: `server.admin_listen`'s default.
    pub fn default_url() -> String {
        http_base(ServerFile::default().admin_listen)
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let server = ServerTable::load(path)?;
        let token_file = match server.database() {
            Ok(Database::Sqlite(file)) => Some(crate::admin::token::token_file(&file)),
            Ok(Database::Postgres(_)) | Err(_) => None,
        };
        let admin_listen = match server.get("admin_listen") {
            None => ServerFile::default().admin_listen,
            Some(text) => text.parse::<SocketAddr>().map_err(|_| {
                anyhow::anyhow!(
                    "server.admin_listen in {}: not an address like 127.0.0.1:8081",
                    path.display()
                )
            })?,
        };
        Ok(Self {
            url: http_base(admin_listen),
            token: server.get("admin_token").map(str::to_owned),
            token_file,
        })
    }
}

/// What `hookd send --config hookd.toml --source NAME` takes from a `hookd.toml`: where the
/// source is served, its scheme (with the `hmac-sha256` header, prefix and encoding), and the
/// secret to sign with. Reads `[server]` and that one source only, checked as `hookd serve`
/// checks them.
pub struct ClientSource {
    /// `http://{server.listen}/hooks/{NAME}`, an unspecified listen address as loopback.
    pub url: String,
    pub scheme: Scheme,
    /// The source's first secret (`secrets`, then `secrets_env` read from this process's
    /// environment); `None` for a scheme that signs nothing here, or whose config holds no
    /// signing secret (discord keeps only the public key).
    pub secret: Option<String>,
}

impl std::fmt::Debug for ClientSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSource")
            .field("url", &self.url)
            .field("scheme", &self.scheme.name())
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ClientSource {
    pub fn load(path: &Path, name: &str) -> anyhow::Result<Self> {
        Self::load_with(path, name, &|var| std::env::var(var).ok())
    }

    /// [`Self::load`], `env` looking up `secrets_env` (injected for tests).
    fn load_with(
        path: &Path,
        name: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Self> {
        let invalid = || format!("invalid config file {}", path.display());
        let text = read_config_file(path)?;
        let mut table: toml::Table = toml::from_str(&text)
            .map_err(|e| redacted_toml_error(&text, &e))
            .with_context(invalid)?;
        let listen = match table.get("server").and_then(|s| s.get("listen")) {
            None => ServerFile::default().listen,
            Some(value) => value
                .as_str()
                .and_then(|text| text.parse::<SocketAddr>().ok())
                .ok_or_else(|| anyhow::anyhow!("server.listen: not an address like 127.0.0.1:8080"))
                .with_context(invalid)?,
        };
        let mut sources = match table.remove("sources") {
            Some(toml::Value::Table(sources)) => sources,
            _ => toml::Table::new(),
        };
        let known: Vec<&str> = sources.keys().map(String::as_str).collect();
        let known = known.join(", ");
        let file: SourceFile = sources
            .remove(name)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{} has no [sources.{name}] (its sources: {known})",
                    path.display()
                )
            })
            // The path of the field at fault is kept (`sources.a.secrets: invalid type…`).
            .and_then(|table| {
                serde_path_to_error::deserialize(table).map_err(|e| {
                    let path = e.path().to_string();
                    let message = redacted_message(e.inner());
                    match path.as_str() {
                        "." => anyhow::anyhow!("sources.{name}: {message}"),
                        _ => anyhow::anyhow!("sources.{name}.{path}: {message}"),
                    }
                })
            })
            .with_context(invalid)?;
        let scheme = source_scheme(name, &file).with_context(invalid)?;
        let secret = match (file.secrets.first(), file.secrets_env.first()) {
            _ if !scheme.kind().signs() => None,
            (Some(secret), _) => Some(secret.clone()),
            // Set, not empty, no whitespace around it: as `hookd serve` reads it.
            (None, Some(var)) => Some(env_secret(
                env,
                &format!("sources.{name}.secrets_env"),
                var,
            )?),
            (None, None) => None,
        };
        Ok(Self {
            url: format!("{}/hooks/{name}", http_base(listen)),
            scheme,
            secret,
        })
    }
}

/// `http://host:port` for a client on this machine to reach a listener bound to `addr`: an
/// unspecified address (`0.0.0.0`, `[::]`) as loopback.
fn http_base(addr: SocketAddr) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_owned(),
        ip if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}", addr.port())
}

/// The database a `hookd.toml` names (`server.database`, or env `HOOKD_DATABASE_URL`, as
/// `hookd serve` reads them), for the commands that work on the database itself
/// (`hookd backup | restore`). Reads `[server]` only, like [`ClientAdmin`].
pub fn database_of(path: &Path) -> anyhow::Result<Database> {
    ServerTable::load(path)?
        .database()
        .map_err(|e| anyhow::anyhow!("server.database (or env {DATABASE_URL_ENV}): {e}"))
        .with_context(|| format!("invalid config file {}", path.display()))
}

/// The `[server]` table of a config file, unchecked, and the directory its relative paths are
/// resolved against.
struct ServerTable {
    server: Option<toml::Table>,
    base: PathBuf,
}

impl ServerTable {
    fn load(path: &Path) -> anyhow::Result<Self> {
        let text = read_config_file(path)?;
        let mut table: toml::Table = toml::from_str(&text)
            .map_err(|e| redacted_toml_error(&text, &e))
            .with_context(|| format!("invalid config file {}", path.display()))?;
        let server = match table.remove("server") {
            Some(toml::Value::Table(server)) => Some(server),
            _ => None,
        };
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(Self { server, base })
    }

    /// A string key of `[server]`.
    fn get(&self, key: &str) -> Option<&str> {
        self.server.as_ref()?.get(key)?.as_str()
    }

    /// `server.database`, replaced by env `HOOKD_DATABASE_URL` when set (as `Config` does; set
    /// but empty, it is refused as an empty `server.database` is).
    fn database(&self) -> Result<Database, DatabaseError> {
        let database = std::env::var(DATABASE_URL_ENV)
            .ok()
            .unwrap_or_else(|| self.get("database").unwrap_or("hookd.db").to_owned());
        Database::parse(&database, &self.base)
    }
}

/// Whether `stem` names a file directly in `plugins_dir` (`<stem>.wasm`): not empty, no path
/// separator or NUL, not hidden (`.`, `..`, a temporary file's name).
pub fn is_file_stem(stem: &str) -> bool {
    !stem.is_empty() && !stem.contains(['/', '\\', '\0']) && !stem.starts_with('.')
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

/// The source's `scheme` and its `signature_*` keys, checked by `verify`; errors name the key.
fn source_scheme(name: &str, file: &SourceFile) -> anyhow::Result<Scheme> {
    let kind: SchemeKind = file
        .scheme
        .parse()
        // Not the value: a secret written on the wrong line would be echoed.
        .map_err(|_: verify::UnknownScheme| {
            let choices = verify::UnknownScheme::choices();
            anyhow::anyhow!("sources.{name}.scheme: the value given is not one of {choices}")
        })?;
    let parts = HmacParts {
        header: file.signature_header.as_deref(),
        prefix: file.signature_prefix.as_deref(),
        encoding: file.signature_encoding.as_deref(),
    };
    let hmac = SchemeKind::HmacSha256;
    Scheme::from_parts(kind, parts).map_err(|e| match e {
        HmacSettingsError::NotApplicable { setting } => {
            let key = match setting {
                HmacSetting::Header => "signature_header",
                HmacSetting::Prefix => "signature_prefix",
                HmacSetting::Encoding => "signature_encoding",
            };
            anyhow::anyhow!("sources.{name}.{key} only applies to scheme \"{hmac}\"")
        }
        HmacSettingsError::MissingHeader => {
            anyhow::anyhow!("sources.{name}.signature_header is required for scheme \"{hmac}\"")
        }
        HmacSettingsError::InvalidHeader { .. } => anyhow::anyhow!(
            "sources.{name}.signature_header: the value given is not a valid header name"
        ),
        HmacSettingsError::InvalidEncoding(_) => anyhow::anyhow!(
            "sources.{name}.signature_encoding: the value given is not one of {}",
            verify::UnknownEncoding::choices()
        ),
    })
}

/// The source's `public_key`, `verify_token[_env]` or `client_state[_env]`: only the one its
/// scheme takes ([`SchemeKind::credential`]), given once, inline or from the environment.
fn source_credential(
    name: &str,
    file: &SourceFile,
    kind: SchemeKind,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<Secret>> {
    let given = [
        (SchemeCredential::PublicKey, &file.public_key, None),
        (
            SchemeCredential::VerifyToken,
            &file.verify_token,
            Some(&file.verify_token_env),
        ),
        (
            SchemeCredential::ClientState,
            &file.client_state,
            Some(&file.client_state_env),
        ),
    ];
    // `<key>_env` names the environment variable holding the value.
    let env_key = |credential: SchemeCredential| format!("{}_env", credential.key());
    // Keys of other schemes first, so a misplaced key is named even if the right one is missing.
    for (credential, inline, from_env) in &given {
        if kind.credential() == Some(*credential) {
            continue;
        }
        if inline.is_some() {
            bail!("sources.{name}.{credential} does not apply to scheme \"{kind}\"");
        }
        if from_env.is_some_and(Option::is_some) {
            let env_key = env_key(*credential);
            bail!("sources.{name}.{env_key} does not apply to scheme \"{kind}\"");
        }
    }
    let Some((credential, inline, from_env)) = given
        .into_iter()
        .find(|(credential, ..)| kind.credential() == Some(*credential))
    else {
        return Ok(None);
    };
    let (key, env_key) = (credential.key(), env_key(credential));
    let var = from_env.unwrap_or(&None);
    let found = match (inline, var) {
        (Some(_), Some(_)) => bail!("sources.{name}: set {key} or {env_key}, not both"),
        // Held to what the environment's value is held to: compared as given, a value with a
        // newline around it would refuse every request.
        (Some(value), None) if credential != SchemeCredential::PublicKey && value.is_empty() => {
            bail!("sources.{name}.{key} is empty")
        }
        (Some(value), None)
            if credential != SchemeCredential::PublicKey && value.trim() != value =>
        {
            bail!(
                "sources.{name}.{key} starts or ends with whitespace, which no provider's token \
                 does (a newline from where it was copied?)"
            )
        }
        (Some(value), None) => Secret::new(value.clone()),
        (None, Some(var)) => {
            Secret::new(env_secret(env, &format!("sources.{name}.{env_key}"), var)?)
        }
        (None, None) => {
            let also = if from_env.is_some() {
                format!(" (or {env_key})")
            } else {
                String::new()
            };
            bail!("sources.{name}.{key}{also} is required for scheme \"{kind}\"")
        }
    };
    Ok(Some(found))
}

/// The value of environment variable `var`, which `key` names (`sources.a.secrets_env`, say):
/// set, not empty, and without whitespace around it, which no secret or token has (a newline
/// from the file it was read from; an empty one, a substitution that found nothing).
fn env_secret(
    env: &dyn Fn(&str) -> Option<String>,
    key: &str,
    var: &str,
) -> anyhow::Result<String> {
    // A name no variable can have is most often the secret itself, given in the `_env` key by
    // mistake: not echoed.
    let name_byte = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if var.is_empty() || !var.bytes().all(name_byte) {
        bail!(
            "{key}: its value is not an environment variable name (letters, digits, `_`, `-`, `.`; \
             the value is not shown, in case it is a secret given here by mistake): name the \
             variable that holds the secret"
        );
    }
    let Some(value) = env(var) else {
        if std::env::var_os(var).is_some() {
            bail!("{key}: environment variable {var} is set but not valid UTF-8");
        }
        // A name no variable is given is echoed only if it looks like one: a secret given here
        // by mistake is often a valid name too (hex, `ghp_…`, `sk_live_…`), never upper case.
        let conventional = var.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
            && var
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if conventional {
            bail!("{key}: environment variable {var} is not set");
        }
        bail!(
            "{key}: the environment variable it names is not set (the name is not shown: it is \
             not upper case, and may be a secret given here by mistake)"
        );
    };
    if value.is_empty() {
        bail!("{key}: environment variable {var} is set but empty");
    }
    if value.trim() != value {
        bail!(
            "{key}: environment variable {var} starts or ends with whitespace, which no \
             secret or token does (a newline from the file it was read from?)"
        );
    }
    Ok(value)
}

/// `server.max_inflight_body_bytes_per_ip` as given (`per_ip`), or its default: a quarter of
/// the budget, and at least the largest body any source takes (`caps`), so one address can
/// always send one; never more than the budget.
fn body_share(
    server: &ServerConfig,
    per_ip: Option<u64>,
    caps: impl Iterator<Item = u64>,
) -> anyhow::Result<u64> {
    let total = server.max_inflight_body_bytes;
    let largest = caps.max().unwrap_or(0).max(1);
    match per_ip {
        None => Ok((total / 4).max(largest)),
        Some(share) if share > total => bail!(
            "server.max_inflight_body_bytes_per_ip ({share}) must not exceed \
             server.max_inflight_body_bytes ({total})"
        ),
        Some(share) if share < largest => bail!(
            "server.max_inflight_body_bytes_per_ip ({share}) must be at least the largest body a \
             source takes ({largest}, max_body_bytes): a body that large could never be \
             admitted from one address"
        ),
        Some(share) => Ok(share),
    }
}

fn source_config(
    name: &str,
    file: SourceFile,
    server: &ServerConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<SourceConfig> {
    let max_body_bytes = file.max_body_bytes.unwrap_or(server.max_body_bytes);
    if max_body_bytes > server.max_inflight_body_bytes {
        bail!(
            "sources.{name}.max_body_bytes ({max_body_bytes}) must not exceed \
             server.max_inflight_body_bytes ({}): a body that large could never be admitted",
            server.max_inflight_body_bytes
        );
    }
    let scheme = source_scheme(name, &file)?;
    let credential = source_credential(name, &file, scheme.kind(), env)?;
    // Provider secrets never start or end with whitespace; one that does came from a file with
    // its newline, and would refuse every request as unsigned.
    let spaced = |value: &str| value.trim() != value;
    if let Some(i) = file.secrets.iter().position(|s| spaced(s)) {
        bail!(
            "sources.{name}.secrets[{i}] starts or ends with whitespace, which no provider's \
             secret does (a newline from where it was copied?)"
        );
    }
    let inline = file.secrets.len();
    let mut secrets: Vec<Secret> = file.secrets.into_iter().map(Secret::new).collect();
    for (i, var) in file.secrets_env.iter().enumerate() {
        let key = format!("sources.{name}.secrets_env[{i}]");
        secrets.push(Secret::new(env_secret(env, &key, var)?));
    }
    // The verifier numbers the secrets as one list, `secrets` then `secrets_env`: a message
    // about one read from the environment names its own key and variable.
    let named = |e: VerifierConfigError| -> anyhow::Error {
        let text = e.to_string();
        let text = match e.secret_index() {
            Some(i) if i >= inline => text.replacen(
                &format!("secrets[{i}]"),
                &format!(
                    "secrets_env[{}] (the value of {})",
                    i - inline,
                    file.secrets_env[i - inline]
                ),
                1,
            ),
            _ => text,
        };
        anyhow::anyhow!("sources.{name}: {text}")
    };

    if scheme == Scheme::None && !secrets.is_empty() {
        bail!(
            "sources.{name}: scheme \"{}\" verifies nothing, so it takes no secrets",
            SchemeKind::None
        );
    }
    let verifier = Verifier::with_credential(
        scheme,
        secrets,
        credential,
        Duration::from_secs(file.tolerance_secs),
    )
    .map_err(named)?;
    let plugin = |field: &str, p: String| -> anyhow::Result<PluginName> {
        check_name(&format!("sources.{name}.{field}"), &p)?;
        Ok(PluginName::new(p))
    };
    Ok(SourceConfig {
        name: SourceName::new(name),
        verifier,
        parser: file.parser.map(|p| plugin("parser", p)).transpose()?,
        handlers: {
            let mut seen = HashSet::new();
            if let Some(twice) = file.handlers.iter().find(|h| !seen.insert(*h)) {
                // Each handler gets one delivery per event: a second entry would ask for two.
                bail!("sources.{name}.handlers lists {twice:?} twice");
            }
            file.handlers
                .into_iter()
                .map(|p| plugin("handlers", p))
                .collect::<anyhow::Result<_>>()?
        },
        max_body_bytes,
        dedupe_body: file.dedupe_body,
    })
}

/// The text of the configuration file `path`; a missing one says how to name another.
fn read_config_file(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (name an existing file with --config, or run where it is)"
        } else {
            ""
        };
        anyhow::anyhow!("reading config file {}: {e}{hint}", path.display())
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
    fn a_missing_config_file_is_named_with_how_to_name_another() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("hookd.toml");
        let error = format!("{:#}", Config::load(&missing).unwrap_err());
        assert!(
            error.starts_with(&format!("reading config file {}: ", missing.display()))
                && error.ends_with("(name an existing file with --config, or run where it is)"),
            "{error}"
        );
        // A file that is there but unreadable as text is named without that hint.
        std::fs::write(&missing, [0xff, 0xfe]).unwrap();
        let error = format!("{:#}", Config::load(&missing).unwrap_err());
        assert!(!error.contains("--config"), "{error}");
    }

    /// `HOOKD_ADMIN_TOKEN` replaces the file's `server.admin_token`, as `HOOKD_DATABASE_URL`
    /// replaces its database and as the admin CLI sends it: before, the file's won, so a token
    /// set in the environment to rotate it left the file's one (`change-me`) the valid one.
    #[test]
    fn the_environments_admin_token_replaces_the_files() {
        let text = "[server]\nadmin_token = \"from-the-file-0123\"\n";
        let env = |name: &str| (name == "HOOKD_ADMIN_TOKEN").then(|| "from-the-env-0123".into());
        let token = |config: Config| config.server.admin_token.expect("a token");
        let config = Config::parse(text, Path::new("/srv"), &env).unwrap();
        assert!(token(config).matches(b"from-the-env-0123"));
        let config = Config::parse(text, Path::new("/srv"), &|_| None).unwrap();
        assert!(token(config).matches(b"from-the-file-0123"));
    }

    /// Each role of a file starts, at load, within the most memory of its instances (an
    /// instance held to less traps when it runs, as any call over its limit; with the least,
    /// one small instance kept every other from a file it runs in).
    #[test]
    fn a_files_roles_start_within_the_most_memory_of_their_instances() {
        let text = r#"
[sources.a]
scheme = "none"
parser = "small_parser"
handlers = ["big", "small"]

[plugins.small_parser]
wasm = "p"
parser_memory_mib = 8

[plugins.big]
wasm = "h"
memory_mib = 128

[plugins.small]
wasm = "h"
memory_mib = 32
"#;
        let config = Config::parse(text, Path::new("/tmp"), &|_| None).unwrap();
        let needs = config.file_needs();
        assert_eq!(needs["p"].start.parser_memory, 8 << 20);
        assert_eq!(needs["h"].start.handler_memory, 128 << 20);
        assert_eq!(needs["h"].start.handler_instance.as_deref(), Some("big"));
        // A role no instance uses keeps the load check's own allowance.
        let unused = crate::runtime::StartLimits::default();
        assert_eq!(needs["p"].start.handler_memory, unused.handler_memory);
        assert_eq!(needs["h"].start.parser_memory, unused.parser_memory);
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
        assert_eq!(
            config.server.database.sqlite_path(),
            Some(Path::new("/srv/hookd/hookd.db"))
        );
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
        assert_eq!(
            classifier.max_concurrency, None,
            "a fair share, no fixed cap"
        );
        assert_eq!(classifier.config["threshold"], "2");
        // The parser is named by the source only, so it gets the defaults.
        let github = &config.plugins[&PluginName::from("github")];
        assert_eq!(github.wasm, "github");
        assert_eq!(github.parser_timeout, Duration::from_millis(50));
        assert_eq!((github.output_bytes, github.log_bytes), (65536, 65536));
        assert_eq!(github.state_limits, StateLimits::DEFAULT);
        assert_eq!(
            StateLimits::DEFAULT,
            StateLimits {
                attempt_keys: 1000,
                attempt_bytes: 4 << 20,
                max_keys: 100_000,
                max_bytes: 256 << 20
            }
        );
    }

    #[test]
    fn scheme_errors_name_the_key_and_what_is_wrong() {
        let source = "[sources.a]\nsecrets = [\"x\"]\n";
        let cases = [
            (
                "scheme = \"gitlab\"",
                "sources.a.scheme: the value given is not one of standard-webhooks, stripe, github, \
                 shopify, slack, discord, zoom, meta, twitter, dropbox, msgraph, hmac-sha256, none",
            ),
            (
                "scheme = \"hmac-sha256\"",
                "sources.a.signature_header is required for scheme \"hmac-sha256\"",
            ),
            (
                "scheme = \"hmac-sha256\"\nsignature_header = \"x y\"",
                "sources.a.signature_header: the value given is not a valid header name",
            ),
            (
                "scheme = \"hmac-sha256\"\nsignature_header = \"x\"\nsignature_encoding = \"b64\"",
                "sources.a.signature_encoding: the value given is not one of \"hex\", \"base64\"",
            ),
            (
                "scheme = \"slack\"\nsignature_encoding = \"hex\"",
                "sources.a.signature_encoding only applies to scheme \"hmac-sha256\"",
            ),
        ];
        for (keys, message) in cases {
            let err = parse(&format!("{source}{keys}")).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn credential_errors_name_the_key_and_the_scheme() {
        let cases = [
            (
                "scheme = \"discord\"",
                "sources.a.public_key is required for scheme \"discord\"",
            ),
            (
                "scheme = \"meta\"\nsecrets = [\"x\"]",
                "sources.a.verify_token (or verify_token_env) is required for scheme \"meta\"",
            ),
            (
                "scheme = \"github\"\nsecrets = [\"x\"]\nverify_token = \"t\"",
                "sources.a.verify_token does not apply to scheme \"github\"",
            ),
            (
                "scheme = \"meta\"\nsecrets = [\"x\"]\nclient_state_env = \"V\"",
                "sources.a.client_state_env does not apply to scheme \"meta\"",
            ),
            (
                "scheme = \"msgraph\"\nclient_state = \"s\"\nclient_state_env = \"V\"",
                "sources.a: set client_state or client_state_env, not both",
            ),
            (
                "scheme = \"msgraph\"\nclient_state_env = \"NOPE\"",
                "sources.a.client_state_env: environment variable NOPE is not set",
            ),
            (
                "scheme = \"msgraph\"\nclient_state = \"s\"\nsecrets = [\"x\"]",
                "sources.a: scheme msgraph takes no secrets (it is configured with client_state)",
            ),
            (
                "scheme = \"discord\"\npublic_key = \"abc\"",
                "sources.a: public_key is not a hex Ed25519 public key (64 hex digits)",
            ),
        ];
        for (keys, message) in cases {
            let err = parse(&format!("[sources.a]\n{keys}")).unwrap_err();
            assert_eq!(err.to_string(), message, "{keys}");
        }
    }

    /// A secret read from the environment with a file's trailing newline would refuse every
    /// request as unsigned: it stops start-up, naming the variable, never the value.
    #[test]
    fn a_secret_from_the_environment_with_surrounding_whitespace_is_refused() {
        let err = Config::parse(
            "[sources.a]\nscheme = \"github\"\nsecrets_env = [\"GH\"]",
            Path::new("/srv"),
            &|name| (name == "GH").then(|| "s3cr3t-value\n".to_string()),
        )
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains(
                "sources.a.secrets_env[0]: environment variable GH starts or ends with whitespace"
            ),
            "{err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
    }

    /// An environment variable that is set but empty (a substitution that found nothing) is
    /// named as the variable it is, not as a key of the file; and a token from one is held to
    /// what a secret from one is.
    #[test]
    fn an_empty_or_spaced_variable_is_named_as_the_variable() {
        let cases = [
            (
                "[sources.a]\nscheme = \"github\"\nsecrets = [\"s1\"]\nsecrets_env = [\"V\"]",
                "",
                "sources.a.secrets_env[0]: environment variable V is set but empty",
            ),
            (
                "[sources.a]\nscheme = \"meta\"\nsecrets = [\"x\"]\nverify_token_env = \"V\"",
                "",
                "sources.a.verify_token_env: environment variable V is set but empty",
            ),
            (
                "[sources.a]\nscheme = \"meta\"\nsecrets = [\"x\"]\nverify_token_env = \"V\"",
                "tok\n",
                "sources.a.verify_token_env: environment variable V starts or ends with whitespace",
            ),
            (
                "[server]\nadmin_listen = \"127.0.0.1:8081\"",
                "",
                "env HOOKD_ADMIN_TOKEN is set but empty",
            ),
        ];
        for (text, value, says) in cases {
            let var = if text.starts_with("[server]") {
                "HOOKD_ADMIN_TOKEN"
            } else {
                "V"
            };
            let err = Config::parse(text, Path::new("/srv"), &|name| {
                (name == var).then(|| value.to_string())
            })
            .unwrap_err();
            let err = format!("{err:#}");
            assert!(err.starts_with(says), "{text}: {err}");
        }
    }

    /// A source that could only refuse events (no parser, no event-id header) is named in the
    /// start-up warnings; one with a parser, or with an id header, is not.
    #[test]
    fn a_source_that_can_name_no_event_is_warned_about() {
        let config = parse(
            "[sources.a]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
             [sources.b]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\nparser = \"stripe\"\n\
             [sources.c]\nscheme = \"github\"\nsecrets = [\"x\"]",
        )
        .unwrap();
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("sources.a: scheme \"stripe\" carries no event-id header"),
            "{warnings:?}"
        );
    }

    /// Zero backoffs, a zero backlog bound and a zero body cap start (they have a meaning, and
    /// configurations that started keep starting) but are named in the start-up warnings.
    #[test]
    fn zero_backoffs_backlog_and_body_caps_and_a_short_dedupe_start_with_a_warning() {
        let config = parse(
            "[server]\nmax_backlog = 0\n\
             [sources.a]\nscheme = \"none\"\nparser = \"p\"\nmax_body_bytes = 0\n\
             [plugins.p]\nbackoff_base_ms = 0\nbackoff_max_ms = 0\nmax_attempts = 3",
        )
        .unwrap();
        let warnings = config.warnings().join("\n");
        for said in [
            "plugins.p.backoff_base_ms is 0: a failed attempt is retried at once, so all 3",
            "plugins.p.backoff_max_ms is 0",
            "server.max_backlog is 0: every new event is refused (503)",
            "sources.a: its body cap (max_body_bytes) is 0",
        ] {
            assert!(warnings.contains(said), "{said}: {warnings}");
        }
        assert!(
            parse("[plugins.p]\nbackoff_max_ms = 500")
                .unwrap()
                .warnings()
                .is_empty()
        );
        let forgetful = parse("[retention]\ndone_after = \"1s\"\ndedupe_for = \"0s\"").unwrap();
        assert!(
            forgetful.warnings().join("\n").contains(
                "retention.done_after + retention.dedupe_for is 1s: an event id is forgotten"
            ),
            "{:?}",
            forgetful.warnings()
        );
        for remembering in [
            "done_after = \"1d\"\ndedupe_for = \"2d\"",
            "dedupe_for = \"0s\"\ndone_after = \"forever\"",
        ] {
            let config = parse(&format!("[retention]\n{remembering}")).unwrap();
            assert!(
                config.warnings().is_empty(),
                "{remembering}: {:?}",
                config.warnings()
            );
        }
        let none_read = parse("[server]\nmax_inflight_body_bytes = 0\nmax_body_bytes = 0").unwrap();
        assert!(
            none_read
                .warnings()
                .join("\n")
                .contains("server.max_inflight_body_bytes is 0"),
            "{:?}",
            none_read.warnings()
        );
    }

    /// A secret read from the environment is named by its own key and variable in every
    /// refusal, and a variable's name that may be the secret itself is never echoed, for a
    /// source's secrets and a plugin's credentials alike.
    #[test]
    fn environment_secrets_are_named_by_their_key_and_never_echoed() {
        let env = |var: &str| match var {
            "SVIX_SECRET" => Some("not-a-whsec".to_owned()),
            "GOOD" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
            _ => None,
        };
        let refused = |text: &str| {
            format!(
                "{:#}",
                Config::parse(text, Path::new("/srv/hookd"), &env).unwrap_err()
            )
        };
        let e = refused(
            "[sources.a]\nscheme = \"standard-webhooks\"\n\
             secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]\n\
             secrets_env = [\"GOOD\", \"SVIX_SECRET\"]",
        );
        assert!(
            e.contains(
                "sources.a: secrets_env[1] (the value of SVIX_SECRET) must start with \"whsec_\""
            ),
            "{e}"
        );
        for (given, key) in [
            (
                "[sources.a]\nscheme = \"github\"\nsecrets_env = [\"8f14e45fceea167a5a36dedd4bea2543\"]",
                "sources.a.secrets_env[0]: the environment variable it names is not set",
            ),
            (
                "[plugins.p]\nallow_hosts = [\"api.example.com:443\"]\n[plugins.p.credentials]\n\
                 \"api.example.com:443\" = { header = \"Authorization\", env = \"sk_live_8f14e45fceea\" }",
                "plugins.p.credentials.\"api.example.com:443\".env: the environment variable it names",
            ),
            (
                "[plugins.p]\nallow_hosts = [\"api.example.com:443\"]\n[plugins.p.credentials]\n\
                 \"api.example.com:443\" = { header = \"Authorization\", env = \"Bearer sk-live/AbC+123\" }",
                "plugins.p.credentials.\"api.example.com:443\".env: its value is not an environment variable name",
            ),
        ] {
            let e = refused(given);
            assert!(e.contains(key), "{e}");
            for secret in ["8f14e45f", "sk_live", "sk-live"] {
                assert!(!e.contains(secret), "{e}");
            }
        }
    }

    #[test]
    fn settings_that_do_nothing_or_cannot_be_met_are_warned_about() {
        let env =
            |var: &str| (var == "HOOKD_ADMIN_TOKEN").then(|| "a-long-enough-token-0123".to_owned());
        let config = Config::parse(
            "[server]\ndatabase = \"postgres://h@db.example/hookd\"\ndurability = \"normal\"\n\
             group_commit = false\nplugin_memory_mib = 32\n\
             [sources.a]\nscheme = \"none\"\nparser = \"q\"\nhandlers = [\"p\"]\n\
             [plugins.p]\nparser_memory_mib = 64\n[plugins.q]\nparser_memory_mib = 16",
            Path::new("/srv/hookd"),
            &env,
        )
        .unwrap();
        let warnings = config.warnings().join("\n");
        let restless = parse("[retention]\ndone_after = \"1d\"\ninterval = \"1ms\"").unwrap();
        assert!(
            restless
                .warnings()
                .join("\n")
                .contains("retention.interval is 1ms"),
            "{:?}",
            restless.warnings()
        );
        for said in [
            "server.durability applies to SQLite only",
            "server.group_commit applies to SQLite only",
            "plugins.p.memory_mib (64 MiB) is more than the three quarters of \
             server.plugin_memory_mib that handler attempts share (24 MiB of 32 MiB)",
        ] {
            assert!(warnings.contains(said), "{said}: {warnings}");
        }
        // p is only a handler, q only a parser (its 64 MiB `memory_mib` is never used).
        assert!(!warnings.contains("parser_memory_mib"), "{warnings}");
        assert!(!warnings.contains("plugins.q"), "{warnings}");
    }

    /// An IPv4 wildcard and an IPv6 address of the same port do not overlap: both listen.
    #[test]
    fn listeners_of_one_port_on_different_families_start() {
        let config = parse(
            "[server]\nlisten = \"0.0.0.0:9000\"\nadmin_listen = \"[::1]:9000\"\n\
             admin_token = \"a-long-enough-token-0123\"",
        )
        .unwrap();
        assert_eq!(config.server.admin_listen.port(), 9000);
    }

    /// `HOOKD_DATABASE_URL` set but empty (a secret that did not arrive) is refused: the node
    /// would have started on a database file of its own, sharing nothing with the others.
    #[test]
    fn an_empty_database_url_in_the_environment_is_refused() {
        let env = |var: &str| (var == DATABASE_URL_ENV).then(String::new);
        let e = format!(
            "{:#}",
            Config::parse(
                "[server]\nadmin_token = \"t\"",
                Path::new("/srv/hookd"),
                &env
            )
            .unwrap_err()
        );
        assert!(e.contains("env HOOKD_DATABASE_URL is set but empty"), "{e}");
    }

    #[test]
    fn a_tolerance_that_does_nothing_or_refuses_or_lets_replays_through_is_warned_about() {
        let warned = |source: &str| {
            let config = parse(&format!("[sources.a]\n{source}")).unwrap();
            config.warnings().join("\n")
        };
        let github = "scheme = \"github\"\nsecrets = [\"x\"]";
        let stripe = "scheme = \"stripe\"\nsecrets = [\"whsec_x\"]\nparser = \"stripe\"";
        for (source, said) in [
            (
                format!("{github}\ntolerance_secs = 60"),
                "sources.a.tolerance_secs does nothing: scheme \"github\" signs no timestamp",
            ),
            (
                format!("{stripe}\ntolerance_secs = 0"),
                "sources.a.tolerance_secs is 0: a request signed in an earlier second",
            ),
            (
                format!("{stripe}\ntolerance_secs = 18446744073709551615"),
                "sources.a.tolerance_secs is ",
            ),
        ] {
            let warnings = warned(&source);
            assert!(warnings.contains(said), "{source}: {warnings}");
        }
        for quiet in [
            github.to_owned(),
            stripe.to_owned(),
            format!("{stripe}\ntolerance_secs = 3600"),
            "scheme = \"standard-webhooks\"\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"]"
                .to_owned(),
        ] {
            assert_eq!(warned(&quiet), "", "{quiet}");
        }
        // A standard-webhooks secret cut short: named by its index, never shown.
        let warnings = warned(
            "scheme = \"standard-webhooks\"\n\
             secrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_MfKQ9r8G\"]",
        );
        assert!(
            warnings.contains(
                "sources.a: secret 1 (counting secrets, then secrets_env) decodes to 6 bytes"
            ),
            "{warnings}"
        );
        assert!(!warnings.contains("MfKQ"), "{warnings}");
    }

    #[test]
    fn a_meta_verify_token_is_read_from_the_environment() {
        let config = parse(
            "[sources.a]\nscheme = \"meta\"\nsecrets = [\"x\"]\nverify_token_env = \"GH_SECRET\"",
        )
        .unwrap();
        let q = [
            ("hub.mode".to_owned(), "subscribe".to_owned()),
            ("hub.verify_token".to_owned(), "from-env".to_owned()),
            ("hub.challenge".to_owned(), "c".to_owned()),
        ];
        let verifier = &config.sources["a"].verifier;
        assert!(verifier.answer_get(&q).unwrap().is_some());
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
                "[plugins.p]\ntimeout_ms = 9223372036854775807",
                "plugins.p.timeout_ms must be between 1 and 31536000000",
            ),
            (
                "[plugins.p]\nparser_timeout_ms = 0",
                "plugins.p.parser_timeout_ms must be between 1",
            ),
            (
                "[server]\nplugin_memory_mib = 0",
                "server.plugin_memory_mib must be between 1 and 16777216",
            ),
            (
                "[sources.a]\nscheme = \"github\"\nsecrets = [\"x\", \"y\\n\"]",
                "sources.a.secrets[1] starts or ends with whitespace",
            ),
            (
                "[sources.a]\nscheme = \"msgraph\"\nclient_state = \"abc \"",
                "sources.a.client_state starts or ends with whitespace",
            ),
            (
                "[sources.a]\nscheme = \"meta\"\nsecrets = [\"x\"]\nverify_token = \"vtok\\n\"",
                "sources.a.verify_token starts or ends with whitespace",
            ),
            (
                "[sources.a]\nscheme = \"msgraph\"\nclient_state = \"\"",
                "sources.a.client_state is empty",
            ),
            (
                "[sources.a]\nscheme = \"github\"\nsecrets = [\"x\"]\nhandlers = [\"h\", \"g\", \"h\"]",
                "sources.a.handlers lists \"h\" twice",
            ),
            (
                "[plugins.p]\nmax_concurrency = 0",
                "plugins.p.max_concurrency must be at least 1",
            ),
            (
                "[server]\nlisten = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
                "server.listen (127.0.0.1:9000) and server.admin_listen (127.0.0.1:9000) take",
            ),
            (
                "[server]\nlisten = \"0.0.0.0:9000\"\nadmin_listen = \"127.0.0.1:9000\"\nadmin_token = \"a-long-enough-token-0123\"",
                "server.listen (0.0.0.0:9000) and server.admin_listen (127.0.0.1:9000) take",
            ),
            (
                "[server]\nlisten = \"[::]:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
                "server.listen ([::]:9000) and server.admin_listen (127.0.0.1:9000) take",
            ),
            (
                "[server]\nlisten = \"0.0.0.0:9000\"\nadmin_listen = \"[::ffff:127.0.0.1]:9000\"",
                "server.listen (0.0.0.0:9000) and server.admin_listen ([::ffff:127.0.0.1]:9000) take",
            ),
            (
                "[plugins.p]\nattempt_state_keys = 0",
                "plugins.p.attempt_state_keys",
            ),
            (
                "[plugins.p]\nattempt_state_kib = 16385",
                "plugins.p.attempt_state_kib",
            ),
            (
                "[plugins.p]\nstate_max_keys = 0",
                "plugins.p.state_max_keys",
            ),
            ("[plugins.p]\nstate_max_mib = 0", "plugins.p.state_max_mib"),
            (
                "[server]\nplugins_dir = \"p\"\ncache_dir = \"p/cache\"",
                "server.cache_dir",
            ),
            (
                "[server]\ndatabase = \"plugins/x.db\"",
                "server.database (/srv/hookd/plugins/x.db) is inside server.plugins_dir",
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
            (
                "[plugins.p]\nca_file = \"no-such-ca.pem\"",
                "plugins.p.ca_file: ",
            ),
            (
                "[plugins.p]\nallow_hosts = [\"api.example.com:443\"]\n[plugins.p.credentials]\n\
                 \"api.example.com:443\" = { header = \"Authorization\", env = \"NO_SUCH_KEY\" }",
                "plugins.p.credentials.\"api.example.com:443\".env: environment variable NO_SUCH_KEY is \
                 not set",
            ),
            (
                "[plugins.p]\n[plugins.p.credentials]\n\
                 \"api.example.com:443\" = { header = \"Authorization\", env = \"K\" }",
                "plugins.p.credentials: api.example.com:443: is not in allow_hosts",
            ),
            ("[server]\nadmin_listen = \"0.0.0.0:8081\"", "admin_token"),
            (
                "[server]\nmax_connections_per_ip = 0",
                "server.max_connections_per_ip",
            ),
            (
                "[server]\nmax_connections_per_ip = 2305843009213693952",
                "server.max_connections_per_ip must be at most 1048576 (got 2305843009213693952)",
            ),
            (
                "[server]\nmax_connections = 1048577",
                "server.max_connections must be at most 1048576",
            ),
            ("[server]\nworkers = 0", "server.workers must be at least 1"),
            (
                "[server]\nmax_connections = 0",
                "server.max_connections must be at least 1",
            ),
            (
                "[server]\nbody_idle_timeout_ms = 0",
                "server.body_idle_timeout_ms must be at least 1",
            ),
            (
                "[server]\nheader_timeout_ms = 0",
                "server.header_timeout_ms must be at least 1",
            ),
            (
                "[server]\nbody_timeout_ms = 0",
                "server.body_timeout_ms must be at least 1",
            ),
            (
                "[server]\nmax_inflight_body_bytes = 1000",
                "server.max_body_bytes (26214400) must not exceed server.max_inflight_body_bytes",
            ),
            (
                "[sources.a]\nscheme = \"none\"\nmax_body_bytes = 999999999999",
                "sources.a.max_body_bytes",
            ),
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
    fn a_weak_admin_token_is_refused_off_loopback_naming_the_key_but_not_the_token() {
        for weak in [
            "change-me",
            "x",
            "short-tok-12",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "abababababababababab",
            "Change-Me-Change-Me-2024",
            "my-admin-token-0000000000",
            "replace_me_with_a_real_one",
        ] {
            for listen in ["0.0.0.0:8081", "10.0.0.5:8081", "[::]:8081"] {
                let text =
                    format!("[server]\nadmin_listen = \"{listen}\"\nadmin_token = \"{weak}\"");
                let err = format!("{:#}", parse(&text).unwrap_err());
                assert!(
                    err.contains("server.admin_token"),
                    "{weak} on {listen}: {err}"
                );
                assert!(
                    !err.contains(weak),
                    "{weak} on {listen}: the error quotes it: {err}"
                );
            }
            // On loopback (`hookd dev`, the example hookd.toml) any non-empty token is accepted.
            let text = format!("[server]\nadmin_token = \"{weak}\"");
            assert!(parse(&text).is_ok(), "{weak} on loopback");
        }
        // The environment's token is held to the same rule.
        let err = Config::parse(
            "[server]\nadmin_listen = \"0.0.0.0:8081\"",
            Path::new("/srv"),
            &|name| (name == "HOOKD_ADMIN_TOKEN").then(|| "change-me".to_string()),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("HOOKD_ADMIN_TOKEN"), "{err:#}");
        let strong = parse(
            "[server]\nadmin_listen = \"0.0.0.0:8081\"\nadmin_token = \"q7Jx2vN9pL4mR8sT1wZ6\"",
        )
        .unwrap();
        assert!(strong.server.admin_token.is_some());
    }

    /// A token no client could present (the admin listener trims what it is sent, and a header
    /// cannot carry control characters) is refused at start-up instead of locking everyone out,
    /// without quoting it.
    #[test]
    fn an_admin_token_no_header_can_carry_is_refused_without_quoting_it() {
        for (token, why) in [
            ("q7Jx2vN9pL4mR8sT1wZ6\n", "whitespace"),
            (" q7Jx2vN9pL4mR8sT1wZ6", "whitespace"),
            ("q7Jx2vN9\u{7}pL4mR8sT1wZ6", "control character"),
            ("q7Jx2vN9pL4mR8sT1wZé", "non-ASCII character"),
        ] {
            let err = Config::parse("[server]\n", Path::new("/srv"), &|name| {
                (name == "HOOKD_ADMIN_TOKEN").then(|| token.to_string())
            })
            .unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains("HOOKD_ADMIN_TOKEN") && err.contains(why),
                "{token:?}: {err}"
            );
            assert!(
                !err.contains("q7Jx2vN9"),
                "the error quotes the token: {err}"
            );
        }
        // Spaces inside are carried (and compared) as they are.
        assert!(parse("[server]\nadmin_token = \"two words here\"").is_ok());
    }

    #[test]
    fn admin_hosts_are_plain_names_or_addresses() {
        let config =
            parse("[server]\nadmin_hosts = [\"Hookd.Internal.\", \"[fd00::1]\", \"10.0.0.9\"]")
                .unwrap();
        assert_eq!(
            config.server.admin_hosts,
            ["hookd.internal", "fd00::1", "10.0.0.9"]
        );
        for bad in ["http://hookd", "hookd:8081", "hookd/admin", ""] {
            let err = format!(
                "{:#}",
                parse(&format!("[server]\nadmin_hosts = [\"{bad}\"]")).unwrap_err()
            );
            assert!(err.contains("server.admin_hosts"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_parse_error_names_line_and_key_but_never_echoes_a_value() {
        // (text, secret that must not appear, key and line the error must name)
        let cases = [
            (
                "[server]\nlisten = \"127.0.0.1:8080\"\n\n[sources.gh]\nscheme = \"github\"\nsecrets = [\"hush-hush-9f3a\"",
                "hush-hush-9f3a",
                "sources.gh.secrets",
                "line 6",
            ),
            (
                "[server]\nadmin_token = \"tok-5ecret-77\n",
                "tok-5ecret-77",
                "server.admin_token",
                "line 2",
            ),
            (
                "[server]\nadmin_token = tok-5ecret-77\n",
                "tok-5ecret-77",
                "server.admin_token",
                "line 2",
            ),
            (
                "[sources.gh]\nscheme = \"github\"\nsecrets = [\n  \"first-9f3a\",\n  \"sec=ond-9f3a\" \"x\"\n]",
                "9f3a",
                "sources.gh.secrets",
                "line 5",
            ),
            // The parser notices on the next line; the open array's key is still named.
            (
                "[sources.gh]\nscheme = \"github\"\nsecrets = [\"hush-hush-9f3a\"\nhandlers = []",
                "hush-hush-9f3a",
                "sources.gh.secrets",
                "line 4",
            ),
            (
                "[server]\nadmin_token = \"\"\"tok-5ecret-77\nmax_backlog = 1\n",
                "tok-5ecret-77",
                "server.admin_token",
                "line ",
            ),
            // Wrong types: serde quotes the offending value.
            (
                "[sources.gh]\nscheme = \"github\"\nsecrets = \"hush-hush-9f3a\"",
                "hush-hush-9f3a",
                "secrets",
                "line 3",
            ),
            (
                "[server]\nadmin_token = [\"tok-5ecret-77\"]",
                "tok-5ecret-77",
                "admin_token",
                "line 2",
            ),
            (
                "[server]\nmax_backlog = \"tok-5ecret-77\"",
                "tok-5ecret-77",
                "max_backlog",
                "line 2",
            ),
            // Values that are not strings: serde puts them in backticks.
            (
                "[server]\nadmin_token = 123456789012345678",
                "123456789012345678",
                "server.admin_token",
                "line 2",
            ),
            (
                "[sources.gh]\nscheme = \"github\"\nsecrets = [987654321012]",
                "987654321012",
                "sources.gh.secrets",
                "line 3",
            ),
            (
                "[server]\nadmin_token = 4.25e7",
                "4.25e7",
                "server.admin_token",
                "line 2",
            ),
            // A duplicate key is named from where it stands (the parser drops it).
            (
                "[server]\nadmin_token = \"tok-5ecret-77\"\nadmin_token = \"tok-5ecret-78\"",
                "tok-5ecret",
                "admin_token",
                "line 3",
            ),
        ];
        for (text, secret, key, line) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(
                !err.contains(secret),
                "{text:?}: the error echoes a value: {err}"
            );
            assert!(err.contains(key) && err.contains(line), "{text:?}: {err}");
            assert!(err.contains("column"), "{text:?}: {err}");
        }
        // Unknown keys are still named.
        let err = format!("{:#}", parse("[server]\nlisten_port = 1").unwrap_err());
        assert!(err.contains("listen_port"), "{err}");
        // A number or boolean in a key that holds no secret is shown: it says what is wrong.
        for (text, shown) in [
            ("[plugins.p]\nmax_attempts = -1", "integer `-1`"),
            ("[retention]\ndone_after = 30", "integer `30`"),
            ("[server]\ngroup_commit = 1.5", "floating point `1.5`"),
        ] {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(shown), "{text:?}: {err}");
        }
        // Not in a key that holds a secret, whatever its name says of it: msgraph's
        // `client_state` is one.
        let err = format!(
            "{:#}",
            parse("[sources.g]\nscheme = \"msgraph\"\nclient_state = 8675309123").unwrap_err()
        );
        assert!(
            err.contains("client_state") && !err.contains("8675309123"),
            "{err}"
        );
    }

    /// The key an error names is the one TOML reads there, quoted parts and all (a line-based
    /// guess named `server.tolerance_secs` for a quoted table's key).
    #[test]
    fn a_toml_error_names_the_key_as_toml_reads_it() {
        let cases = [
            (
                "[server]\n[sources.\"my-src\"]\nscheme = \"github\"\ntolerance_secs = \"300\"",
                "key `sources.my-src.tolerance_secs`",
            ),
            (
                "[retention]\n[plugins.\"x\"]\nmax_attempts = \"3\"",
                "key `plugins.x.max_attempts`",
            ),
            (
                "[sources.a]\nscheme = \"github\"\n\"tolerance_secs\" = \"300\"",
                "key `sources.a.tolerance_secs`",
            ),
            (
                "[plugins.forward.credentials.\"api.example.com:443\"]\nheder = \"X\"",
                "key `plugins.forward.credentials.\"api.example.com:443\".heder`",
            ),
            ("[[sources.a.handlers]]\n", "key `sources.a.handlers"),
        ];
        for (text, says) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    /// `hookd send --config` reads a source as `hookd serve` does, and its errors hide values
    /// as those do: a secret of the wrong type, or written where a word is expected, is never
    /// echoed.
    #[test]
    fn a_client_source_error_never_shows_a_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.toml");
        for (source, key) in [
            (
                "scheme = \"github\"\nsecrets = \"MARK-string\"",
                "sources.gh",
            ),
            (
                "scheme = \"github\"\nsecrets = [98765432101234]",
                "sources.gh",
            ),
        ] {
            std::fs::write(&path, format!("[sources.gh]\n{source}\n")).unwrap();
            let err = format!("{:#}", ClientSource::load(&path, "gh").unwrap_err());
            assert!(err.contains(key), "{err}");
            assert!(!err.contains("MARK") && !err.contains("98765"), "{err}");
        }
        for value in ["MARK-durability", "x`MARK-durability"] {
            let err = format!(
                "{:#}",
                parse(&format!("[server]\ndurability = \"{value}\"")).unwrap_err()
            );
            assert!(err.contains("durability") && !err.contains("MARK"), "{err}");
        }
    }

    /// `hookd send --config` reads a source's `secrets_env` as `hookd serve` does, naming the
    /// variable (an empty one was "secrets[0] is empty", a key the file does not have).
    #[test]
    fn a_client_source_names_the_secrets_variable_it_could_not_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.toml");
        std::fs::write(
            &path,
            "[sources.a]\nscheme = \"github\"\nsecrets_env = [\"GH_SECRET\"]",
        )
        .unwrap();
        for (value, says) in [
            (None, "environment variable GH_SECRET is not set"),
            (Some(""), "environment variable GH_SECRET is set but empty"),
            (
                Some("s3cret\n"),
                "environment variable GH_SECRET starts or ends with whitespace",
            ),
        ] {
            let env = |var: &str| {
                (var == "GH_SECRET")
                    .then(|| value.map(str::to_owned))
                    .flatten()
            };
            let e = format!(
                "{:#}",
                ClientSource::load_with(&path, "a", &env).unwrap_err()
            );
            assert!(e.contains(&format!("sources.a.secrets_env: {says}")), "{e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        let env = |var: &str| (var == "GH_SECRET").then(|| "s3cret".to_owned());
        let source = ClientSource::load_with(&path, "a", &env).unwrap();
        assert_eq!(source.secret.as_deref(), Some("s3cret"));
        // The secret itself given as the variable's name (`secrets_env` for `secrets`): the
        // error names the key, not the value.
        std::fs::write(
            &path,
            "[sources.a]\nscheme = \"github\"\nsecrets_env = [\"whsec_SECRETLOOK/+=\"]",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            ClientSource::load_with(&path, "a", &env).unwrap_err()
        );
        assert!(
            e.contains("sources.a.secrets_env: its value is not an environment variable name"),
            "{e}"
        );
        assert!(!e.contains("SECRETLOOK"), "{e}");
    }

    /// A value of the wrong type is named by its key, never quoted (before: `sources.a:
    /// invalid type…`, which left the user to find the field).
    #[test]
    fn a_client_source_names_the_field_of_the_wrong_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.toml");
        std::fs::write(
            &path,
            "[sources.a]\nscheme = \"github\"\nsecrets = \"whsec_MARK\"",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            ClientSource::load_with(&path, "a", &|_| None).unwrap_err()
        );
        assert!(e.contains("sources.a.secrets: invalid type"), "{e}");
        assert!(!e.contains("MARK"), "{e}");
    }

    #[test]
    fn the_client_reads_only_the_admin_address_the_token_and_the_token_file_from_a_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookd.toml");
        std::fs::write(
            &path,
            "[server]\nadmin_token = \"from-file\"\ndatabase = \"data/h.db\"\n[sources.a]\nscheme = \"github\"\nsecrets_env = [\"UNSET_IN_THE_CLIENT\"]",
        )
        .unwrap();
        let client = ClientAdmin::load(&path).unwrap();
        assert_eq!(client.token.as_deref(), Some("from-file"));
        assert_eq!(
            client.token_file,
            Some(dir.path().join("data/h.db.admin-token"))
        );
        assert_eq!(client.url, ClientAdmin::default_url());
        assert_eq!(client.url, "http://127.0.0.1:8081");
        // The admin address the server listens on is where the client goes.
        for (listen, url) in [
            ("127.0.0.1:9181", "http://127.0.0.1:9181"),
            ("0.0.0.0:9181", "http://127.0.0.1:9181"),
            ("[::]:9181", "http://[::1]:9181"),
        ] {
            std::fs::write(&path, format!("[server]\nadmin_listen = \"{listen}\"")).unwrap();
            assert_eq!(ClientAdmin::load(&path).unwrap().url, url);
        }
        std::fs::write(&path, "").unwrap();
        let client = ClientAdmin::load(&path).unwrap();
        assert_eq!(client.token, None);
        assert_eq!(
            client.token_file,
            Some(dir.path().join("hookd.db.admin-token"))
        );
    }

    #[test]
    fn a_postgres_database_needs_a_configured_admin_token() {
        let url = "postgres://hookd:pw-in-url@db.internal/hookd";
        let err = parse(&format!("[server]\ndatabase = \"{url}\"")).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("server.admin_token"), "{err}");
        assert!(!err.contains("pw-in-url") && !err.contains("  "), "{err}");
        let config = parse(&format!(
            "[server]\ndatabase = \"{url}\"\nadmin_token = \"t\""
        ))
        .unwrap();
        assert!(matches!(config.server.database, Database::Postgres(_)));
        // No database file: the compiled-code cache sits beside the config file.
        assert_eq!(
            config.server.cache_dir,
            Path::new("/srv/hookd/.hookd-cache")
        );
    }

    #[test]
    fn the_database_pooler_is_read_and_applies_to_postgresql_only() {
        let url = "postgres://hookd@pgbouncer.internal:6432/hookd";
        let server =
            |pooler: &str| format!("[server]\ndatabase = \"{url}\"\nadmin_token = \"t\"\n{pooler}");
        for (line, pooler) in [
            ("", Pooler::None),
            ("database_pooler = \"none\"", Pooler::None),
            ("database_pooler = \"session\"", Pooler::Session),
            ("database_pooler = \"transaction\"", Pooler::Transaction),
        ] {
            let config = parse(&server(line)).unwrap();
            assert_eq!(config.server.database_pooler, pooler, "{line}");
        }
        let err = format!(
            "{:#}",
            parse(&server("database_pooler = \"statement\"")).unwrap_err()
        );
        assert!(
            err.contains("database_pooler") && err.contains("transaction"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            parse("[server]\ndatabase = \"h.db\"\ndatabase_pooler = \"transaction\"").unwrap_err()
        );
        assert!(
            err.contains("server.database_pooler") && err.contains("/srv/hookd/h.db"),
            "{err}"
        );
    }

    #[test]
    fn hookd_database_url_replaces_the_database_key() {
        let env = |name: &str| {
            (name == DATABASE_URL_ENV).then(|| "postgres://hookd:pw@10.0.0.5/hookd".to_string())
        };
        let text = "[server]\ndatabase = \"local.db\"\nadmin_token = \"t\"";
        let config = Config::parse(text, Path::new("/srv/hookd"), &env).unwrap();
        assert_eq!(
            config.server.database.to_string(),
            "postgres://hookd:***@10.0.0.5/hookd"
        );
        let err = Config::parse(
            "[server]\ndatabase = \"mysql://u@h/db\"",
            Path::new("/"),
            &|_| None,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("server.database"), "{err:#}");
    }

    #[test]
    fn state_limits_are_read_in_their_units() {
        let config = parse(
            "[plugins.p]\nattempt_state_keys = 5\nattempt_state_kib = 8\nstate_max_keys = 7\n\
             state_max_mib = 2",
        )
        .unwrap();
        assert_eq!(
            config.plugins[&PluginName::from("p")].state_limits,
            StateLimits {
                attempt_keys: 5,
                attempt_bytes: 8 * 1024,
                max_keys: 7,
                max_bytes: 2 << 20
            }
        );
    }

    /// One address's share of the body budget: a quarter of it, at least the largest body a
    /// source takes; a share set outside those bounds is refused, naming the key.
    #[test]
    fn an_addresss_share_of_the_body_budget_defaults_to_a_quarter_and_fits_a_whole_body() {
        let share = |text: &str| parse(text).map(|c| c.server.max_inflight_body_bytes_per_ip);
        assert_eq!(share("").unwrap(), 32 << 20);
        let large = "[server]\nmax_inflight_body_bytes = 100000000\n\
                     [sources.s]\nscheme = \"none\"\nmax_body_bytes = 40000000";
        assert_eq!(share(large).unwrap(), 40_000_000);
        let set = "[server]\nmax_inflight_body_bytes_per_ip = 30000000\nmax_body_bytes = 1000";
        assert_eq!(share(set).unwrap(), 30_000_000);
        for (text, expected) in [
            (
                "[server]\nmax_inflight_body_bytes_per_ip = 1000",
                "server.max_inflight_body_bytes_per_ip (1000) must be at least the largest body",
            ),
            (
                "[server]\nmax_inflight_body_bytes_per_ip = 999999999999",
                "must not exceed server.max_inflight_body_bytes",
            ),
        ] {
            let text = format!("{text}\n[sources.s]\nscheme = \"none\"");
            let e = format!("{:#}", share(&text).unwrap_err());
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn body_limits_default_from_the_server_and_parser_budgets_follow_the_body() {
        let config = parse(
            "[server]\nmax_body_bytes = 5000\n[sources.a]\nscheme = \"none\"\nparser = \"p\"\n\
             [sources.b]\nscheme = \"none\"\nmax_body_bytes = 100\n[plugins.q]\nparser_memory_mib = 2",
        )
        .unwrap();
        let server = &config.server;
        assert_eq!(server.max_inflight_body_bytes, 128 << 20);
        assert_eq!(server.max_connections_per_ip, 256);
        assert_eq!(server.body_idle_timeout, Duration::from_secs(5));
        assert_eq!(server.min_body_bytes_per_sec, 16384);
        assert_eq!(config.sources[&SourceName::from("a")].max_body_bytes, 5000);
        assert_eq!(config.sources[&SourceName::from("b")].max_body_bytes, 100);
        let p = &config.plugins[&PluginName::from("p")];
        assert_eq!(
            p.parser_limits_for(0),
            (Duration::from_millis(50), 16 << 20)
        );
        assert_eq!(
            p.parser_limits_for(25 << 20),
            (
                Duration::from_millis(50 + 25 * PARSER_MS_PER_MIB),
                (16 << 20) + (25 << 20) * PARSER_MEMORY_PER_BODY_BYTE
            )
        );
        // A set key is a hard limit, whatever the body.
        let q = &config.plugins[&PluginName::from("q")];
        assert_eq!(
            q.parser_limits_for(25 << 20),
            (Duration::from_millis(50), 2 << 20)
        );
    }

    #[test]
    fn a_plugin_the_file_does_not_declare_gets_the_defaults() {
        let config = parse("[plugins.p]\ntimeout_ms = 5").unwrap();
        let retired = PluginName::from("retired");
        let defaults = PluginConfig::with_defaults(retired.clone());
        assert_eq!(
            config.plugin(&retired).timeout,
            defaults.timeout,
            "{:?}",
            config.plugin(&retired)
        );
    }

    #[test]
    fn a_handlers_call_budget_is_its_configured_one() {
        let config = parse("[plugins.p]\ntimeout_ms = 5\nmemory_mib = 3\nlog_kib = 2").unwrap();
        let limits = config.plugin(&PluginName::from("p")).handler_limits();
        assert_eq!(
            (limits.timeout, limits.memory_bytes, limits.log_bytes),
            (Duration::from_millis(5), 3 << 20, 2048)
        );
    }

    #[test]
    fn workers_and_wasm_threads_default_from_the_cores() {
        let cores = cores();
        let server = parse("").unwrap().server;
        assert_eq!(
            (server.workers, server.wasm_threads),
            (WORKERS_PER_CORE * cores, cores)
        );
        let set = parse("[server]\nworkers = 7\nwasm_threads = 3")
            .unwrap()
            .server;
        assert_eq!((set.workers, set.wasm_threads), (7, 3));
        for (text, key) in [
            ("[server]\nwasm_threads = 0", "server.wasm_threads"),
            ("[server]\nwasm_threads = 5000", "server.wasm_threads"),
            ("[server]\nworkers = 0", "server.workers"),
        ] {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(key), "{text}: {err}");
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
    fn a_credential_is_read_from_the_environment_and_never_shown() {
        let text = "[plugins.p]\nallow_hosts = [\"api.example.com:443\"]\n\
                    [plugins.p.credentials]\n\
                    \"api.example.com:443\" = { header = \"Authorization\", env = \"API_KEY\", \
                    prefix = \"Bearer \" }";
        let env = |name: &str| (name == "API_KEY").then(|| "sk-hush-42".to_owned());
        let config = Config::parse(text, Path::new("/srv/hookd"), &env).unwrap();
        let debug = format!("{config:?}");
        assert!(
            debug.contains("authorization") && !debug.contains("sk-hush-42"),
            "{debug}"
        );
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
