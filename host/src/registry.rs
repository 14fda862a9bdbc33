//! The plugin registry: which version of each plugin file is live, plus its load history.
//!
//! Invariants:
//! - Build, then swap: a file is read, size-capped, hashed, compiled and type-checked off the
//!   hot path; only a plugin that passed every step replaces the live one. A broken file never
//!   evicts a working version — its error is recorded beside it.
//! - Lookups on the hot path are a lock-free `ArcSwap` load; an in-flight call keeps its
//!   `Arc<LoadedPlugin>` and finishes on the version it started with.
//! - Native code comes from compiling the file (in a bounded child process, queued by bytes:
//!   `runtime::Compiler`) or from the host-private artifact cache keyed by the file's sha256;
//!   nothing precompiled is ever read from the plugins directory, and only a file that passed
//!   every check is cached.
//! - Loads of one file take turns, read to swap: the last load started reads the newest bytes
//!   and is the last to swap (two loads overlapping, a slow compile begun before a cached
//!   version was asked for, left the older one live).
//! - A plugin file is opened without following symlinks and must be a regular file; load errors
//!   name the plugin, the file and the reason, never echo its contents.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use arc_swap::ArcSwap;

use crate::{
    model::unix_ms,
    runtime::{self, ArtifactCache, Compiler, Origin, Plugin, Runtime},
    telemetry::{LoadResult, Telemetry},
};

/// Largest plugin file accepted unless its plugins say otherwise (`max_file_mib`): far above
/// any Rust component (the examples are 3-4 MB); a JavaScript or Python one, which carries its
/// interpreter, needs a larger cap.
pub const MAX_PLUGIN_BYTES: u64 = 20 * 1024 * 1024;
/// The largest cap `max_file_mib` may set (256 MiB), and so the most a compile ever reads.
pub const LARGEST_PLUGIN_BYTES: u64 = 256 * 1024 * 1024;
/// Versions kept for rollback besides the live one.
const KEEP_PREVIOUS: usize = 5;

/// What the configuration asks of one plugin file (by stem): how large it may be, and the roles
/// its instances are used in, each with one use to name in an error.
#[derive(Debug, Clone)]
pub struct FileNeeds {
    /// Largest file accepted: the largest `max_file_mib` of the instances loading it.
    pub max_bytes: u64,
    /// A source that uses the file as its parser (`sources.NAME.parser`), if any does.
    pub parser: Option<String>,
    /// A source that uses the file as a handler (`sources.NAME.handlers`), if any does.
    pub handler: Option<String>,
    /// The memory each role may start in: the least its instances may hold.
    pub start: runtime::StartLimits,
    /// The plugin instances (`[plugins.NAME]`) that load the file, by name.
    pub instances: Vec<String>,
}

impl Default for FileNeeds {
    fn default() -> Self {
        Self {
            max_bytes: MAX_PLUGIN_BYTES,
            parser: None,
            handler: None,
            start: runtime::StartLimits::default(),
            instances: Vec::new(),
        }
    }
}

impl FileNeeds {
    /// The first role the configuration uses `roles`' file in that it does not export, and where.
    fn missing(&self, roles: runtime::Roles) -> Option<(&'static str, &str)> {
        [
            ("parser", roles.parser, self.parser.as_deref()),
            ("handler", roles.handler, self.handler.as_deref()),
        ]
        .into_iter()
        .find_map(|(role, exported, used)| used.filter(|_| !exported).map(|used| (role, used)))
    }
}

/// One live version of a plugin file.
#[derive(Debug)]
pub struct LoadedPlugin {
    pub stem: String,
    pub plugin: Plugin,
}

#[derive(Default)]
struct FileStatus {
    current: Option<Arc<LoadedPlugin>>,
    /// When `current` went live here: its load, or the rollback that made it live again.
    live_since_ms: i64,
    previous: Vec<Arc<LoadedPlugin>>,
    error: Option<String>,
    /// The sha256 of the file the last load refused, when it got as far as reading it (not
    /// for a failure of the moment: the file is not to blame).
    refused: Option<String>,
    /// After a load failed for a reason of the moment ([`LoadError::is_transient`]): how many
    /// did in a row, and when the file is to be loaded again.
    retry: Option<(u32, std::time::Instant)>,
    /// The live version's file as it was read, when it went live by a load (not a rollback):
    /// what a cluster publishes, even once the file has changed again.
    file_bytes: Option<(String, Arc<Vec<u8>>)>,
}

impl FileStatus {
    /// [`RollbackError::NeverLoaded`] unless some version of the file was ever live.
    fn check_loaded(&self, stem: &str) -> Result<(), RollbackError> {
        if self.current.is_none() && self.previous.is_empty() {
            let why = self
                .error
                .clone()
                .unwrap_or_else(|| "not loaded yet".into());
            return Err(RollbackError::NeverLoaded(stem.to_owned(), why));
        }
        Ok(())
    }
}

/// Why a plugin file was not loaded. Every message names the plugin (its file stem) and the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The blocking task reading the file died.
    #[error("plugin {stem}: reading {file} failed: {source}")]
    ReadTask {
        stem: String,
        file: String,
        source: tokio::task::JoinError,
    },
    /// The file itself is refused before any compiling: what it is, how big, its header.
    #[error("plugin {stem}: {file} {source}")]
    File {
        stem: String,
        file: String,
        source: FileError,
    },
    /// The compile did not finish: its process failed, or (`limit`) it went over this node's
    /// time or memory limit for compiles.
    #[error("plugin {stem}: compiling {file} failed: {reason}")]
    Compile {
        stem: String,
        file: String,
        reason: String,
        limit: bool,
    },
    /// It compiled, but is not a component hookd can run (wrong exports or types).
    #[error("plugin {stem}: {file} refused: {source}")]
    Refused {
        stem: String,
        file: String,
        source: runtime::LoadError,
    },
    /// A valid component, but without a role the configuration uses it in: loading it would
    /// turn every event (or request) of that use into a failure.
    #[error(
        "plugin {stem}: {file} refused: it does not export the {role} role that {used_by} uses \
         it as (it exports: {exports})"
    )]
    MissingRole {
        stem: String,
        file: String,
        role: &'static str,
        used_by: String,
        exports: String,
    },
}

impl LoadError {
    /// Whether the load failed for a reason of the moment rather than the file's contents (the
    /// reading task died, the compile process failed but not over a limit of this node's, the
    /// host's plugin memory stayed taken): the same file is loaded again later
    /// ([`Registry::retries_due`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::ReadTask { .. }
                | Self::Compile { limit: false, .. }
                | Self::Refused {
                    source: runtime::LoadError::Busy(_),
                    ..
                }
        )
    }
}

/// Loads of one file failed in a row for a reason of the moment after which its failure is
/// taken for the file's (a compile process that crashes on this file each time, say), as any
/// other refusal: about 20 minutes of tries ([`retry_after`]).
pub const TRANSIENT_TRIES: u32 = 8;

/// The wait before loading a file again after `failures` loads of it in a row failed for a
/// reason of the moment: 2 s, doubling, at most 5 minutes.
pub fn retry_after(failures: u32) -> std::time::Duration {
    let secs = 2u64.saturating_mul(1 << failures.saturating_sub(1).min(16));
    std::time::Duration::from_secs(secs.min(300))
}

/// What is wrong with a plugin file as a file. Messages follow the file's name.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A symlink, directory, pipe, socket or device (the `&str` says which).
    #[error("is {0}, not a regular file (plugin files are opened without following links)")]
    NotRegular(&'static str),
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
    /// There is no such file; what the directory holds instead (a plugin renamed in the
    /// configuration but not on disk, most often).
    #[error(
        "does not exist (plugins_dir holds {0}; a plugin's file is its `wasm` key's name, else \
         its own)"
    )]
    Missing(String),
    /// Its length and the cap.
    #[error("is {0} bytes, over the {1}-byte cap (raise the plugin's max_file_mib)")]
    TooLarge(u64, u64),
    /// Larger when read than its metadata said; the cap.
    #[error("grew over the {0}-byte cap")]
    Grew(u64),
    /// The `usize` is the file's length.
    #[error(
        "refused: not a valid WebAssembly component: its {0} bytes do not start with the \\0asm \
         header"
    )]
    NoWasmHeader(usize),
    #[error(
        "refused: not a valid WebAssembly component: it is a core module (build it for \
         wasm32-wasip2)"
    )]
    CoreModule,
    #[error("refused: not a valid WebAssembly component: unknown binary version")]
    UnknownVersion,
}

/// Why a rollback did not happen. Messages name the plugin (its file stem).
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    /// No load of this file was ever attempted.
    #[error("no plugin file {0:?} is known")]
    UnknownFile(String),
    /// Loads of this file were tried, and none ever succeeded: there is nothing to go back to.
    #[error("plugin file {0:?} was never loaded ({1})")]
    NeverLoaded(String, String),
    #[error("plugin {0:?} has no previous version to roll back to")]
    NoPrevious(String),
    /// The rollback named the version it expected to return to, and the previous version is
    /// another now (a rollback or a new file since the page that asked was shown).
    #[error(
        "plugin {stem:?} would now roll back to {now}, not to the {expected} this rollback was \
         asked for (it changed since); nothing was rolled back"
    )]
    Moved {
        stem: String,
        expected: String,
        now: String,
    },
}

/// `Err(Moved)` unless a rollback of `stem` that expected to return to `expected` (if it
/// named one) would return to `now`.
pub fn check_expected(stem: &str, expected: Option<&str>, now: &str) -> Result<(), RollbackError> {
    match expected {
        Some(expected) if !expected.eq_ignore_ascii_case(now) => Err(RollbackError::Moved {
            stem: stem.to_owned(),
            expected: expected.to_owned(),
            now: now.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// What the registry knows of one file (the admin API shows it per plugin).
#[derive(Debug, Clone)]
pub struct PluginStatus {
    pub wasm: String,
    pub sha256: Option<String>,
    /// When the live version went live: its load, or the rollback that made it live again.
    pub loaded_at: Option<i64>,
    pub exports: Vec<&'static str>,
    /// The `hookd:plugin` WIT version of the live version.
    pub wit_version: Option<crate::runtime::WitVersion>,
    pub error: Option<String>,
    pub previous: Vec<String>,
}

/// Live plugins by wasm file stem.
pub struct Registry {
    runtime: Arc<Runtime>,
    dir: PathBuf,
    /// What the configuration asks of each file, by stem ([`FileNeeds::default`] for a stem not
    /// in it).
    needs: HashMap<String, FileNeeds>,
    cache: Option<ArtifactCache>,
    compiler: Compiler,
    live: ArcSwap<HashMap<String, Arc<LoadedPlugin>>>,
    status: Mutex<BTreeMap<String, FileStatus>>,
    /// Each file's turn to load, by stem: one load of a file at a time, from its read to its
    /// swap.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    telemetry: Arc<Telemetry>,
}

impl Registry {
    /// A registry of the files in `dir`, compiled by `compiler`; `cache` (if any) keeps their
    /// compiled code; `needs` says what the configuration asks of each file, by stem.
    pub fn new(
        runtime: Arc<Runtime>,
        dir: PathBuf,
        needs: HashMap<String, FileNeeds>,
        cache: Option<ArtifactCache>,
        compiler: Compiler,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Self {
            runtime,
            dir,
            needs,
            cache,
            compiler,
            live: ArcSwap::from_pointee(HashMap::new()),
            status: Mutex::new(BTreeMap::new()),
            turns: Mutex::new(HashMap::new()),
            telemetry,
        }
    }

    /// `stem`'s turn to load (see [`Registry::load`]).
    fn turn(&self, stem: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().expect("poisoned");
        turns.entry(stem.to_owned()).or_default().clone()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads each of `stems` ([`Registry::load`]) on a task of its own, at most one per core at
    /// once; the tasks to wait on. A task goes on when its handle is dropped, so a caller may
    /// stop waiting and the version still goes live once built. Failures are logged by the load.
    pub fn spawn_loads(
        self: &Arc<Self>,
        stems: impl IntoIterator<Item = String>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let permits = Arc::new(tokio::sync::Semaphore::new(crate::config::cores()));
        stems
            .into_iter()
            .map(|stem| {
                let (registry, permits) = (self.clone(), permits.clone());
                tokio::spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    let _ = registry.load(&stem).await;
                })
            })
            .collect()
    }

    /// Whether the configuration uses file `stem` (some `[plugins.NAME]` loads it).
    pub fn configured(&self, stem: &str) -> bool {
        self.needs.contains_key(stem)
    }

    pub fn path_of(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.wasm"))
    }

    /// The live version of `stem`, if any.
    pub fn get(&self, stem: &str) -> Option<Arc<LoadedPlugin>> {
        self.live.load().get(stem).cloned()
    }

    /// Every live file's stem and sha256, by stem.
    pub fn live_versions(&self) -> Vec<(String, String)> {
        let mut live: Vec<(String, String)> = self
            .live
            .load()
            .iter()
            .map(|(stem, loaded)| (stem.clone(), loaded.plugin.sha256().to_owned()))
            .collect();
        live.sort();
        live
    }

    /// Loads (or reloads) `<dir>/<stem>.wasm`. On failure the live version, if any, stays.
    /// Loads of one file wait for each other's end (the reloader's, a cluster catch-up's, the
    /// admin API's), so the last one asked for reads the file last and decides what is live.
    pub async fn load(&self, stem: &str) -> Result<Arc<LoadedPlugin>, LoadError> {
        let turn = self.turn(stem);
        let _turn = turn.lock().await;
        let path = self.path_of(stem);
        let mut read = None;
        let mut bytes = None;
        let result = self.build(stem, &path, &mut read, &mut bytes).await;
        let counted = match &result {
            Ok(_) => LoadResult::Loaded,
            Err(_) => LoadResult::Failed,
        };
        self.telemetry.plugin_loaded(stem, counted);
        let mut status = self.status.lock().expect("poisoned");
        let entry = status.entry(stem.to_owned()).or_default();
        match result {
            Ok(loaded) => {
                entry.retry = None;
                if entry
                    .current
                    .as_ref()
                    .is_some_and(|c| c.plugin.sha256() == loaded.plugin.sha256())
                {
                    entry.refused = None;
                    if let Some(bytes) = bytes
                        && entry.file_bytes.is_none()
                    {
                        entry.file_bytes = Some((loaded.plugin.sha256().to_owned(), bytes));
                    }
                    if entry.error.take().is_some() {
                        // The last word on this plugin was an error: say it is over.
                        tracing::info!(
                            plugin = stem,
                            sha256 = loaded.plugin.sha256(),
                            "plugin file is the live version again; its error is cleared"
                        );
                    }
                    return Ok(entry.current.clone().expect("checked"));
                }
                // The newest earlier version coming back is a step back, as a rollback is (a
                // rollback on another node arrives here this way): the version it replaces is
                // dropped, not listed, so every node's `previous` stays the same.
                let stepping_back = entry
                    .previous
                    .first()
                    .is_some_and(|p| p.plugin.sha256() == loaded.plugin.sha256());
                if let Some(old) = entry.current.replace(loaded.clone())
                    && !stepping_back
                {
                    entry.previous.insert(0, old);
                }
                // Now, not the version's first load: a version loaded before a rollback came in
                // between goes live only here.
                entry.live_since_ms = unix_ms(std::time::SystemTime::now());
                // A version that comes back is live, not also a rollback target.
                entry
                    .previous
                    .retain(|p| p.plugin.sha256() != loaded.plugin.sha256());
                entry.previous.truncate(KEEP_PREVIOUS);
                entry.error = None;
                entry.refused = None;
                entry.file_bytes = bytes.map(|b| (loaded.plugin.sha256().to_owned(), b));
                self.publish(stem, Some(loaded.clone()));
                tracing::info!(
                    plugin = stem,
                    sha256 = loaded.plugin.sha256(),
                    exports = ?loaded.plugin.roles().names(),
                    from_cache = loaded.plugin.origin() == Origin::Cache,
                    "plugin loaded"
                );
                Ok(loaded)
            }
            Err(error) => {
                // The configuration names instances, which may load a file of another name.
                let instances = self
                    .needs
                    .get(stem)
                    .map(|n| n.instances.as_slice())
                    .filter(|names| *names != [stem])
                    .map(|names| names.join(", "));
                // The text may quote the file (an import's name in a compile error, a frame's
                // name in a start's trap): escaped, never written raw to a log or a status.
                let text = crate::text::escape(&error.to_string()).into_owned();
                tracing::error!(plugin = stem, instances, file = %path.display(), "{text}");
                entry.error = Some(text);
                let failures = entry.retry.map_or(1, |(n, _)| n.saturating_add(1));
                if error.is_transient() && failures <= TRANSIENT_TRIES {
                    // Not the file's fault, it seems: a cluster keeps its version in it, and
                    // it is loaded again later.
                    entry.refused = None;
                    entry.retry =
                        Some((failures, std::time::Instant::now() + retry_after(failures)));
                } else {
                    entry.refused = read;
                    entry.retry = None;
                }
                Err(error)
            }
        }
    }

    /// Unloads `stem` (its file was deleted): deliveries for it wait until it comes back.
    pub fn unload(&self, stem: &str) {
        let mut status = self.status.lock().expect("poisoned");
        if let Some(entry) = status.get_mut(stem) {
            if let Some(old) = entry.current.take() {
                entry.previous.insert(0, old);
                entry.previous.truncate(KEEP_PREVIOUS);
            }
            entry.file_bytes = None;
            entry.retry = None;
            entry.error = Some(format!("{} was removed", self.path_of(stem).display()));
        }
        self.publish(stem, None);
        tracing::warn!(plugin = stem, "plugin unloaded: its file was removed");
    }

    /// The bytes of `stem`'s live version `sha256` as its file held them when it loaded, if it
    /// went live by a load (a rolled-back version's are not kept).
    pub fn live_bytes(&self, stem: &str, sha256: &str) -> Option<Arc<Vec<u8>>> {
        let status = self.status.lock().expect("poisoned");
        let (sha, bytes) = status.get(stem)?.file_bytes.as_ref()?;
        (sha == sha256).then(|| bytes.clone())
    }

    /// The files whose last load failed for a reason of the moment and whose wait to be
    /// loaded again is over; each is counted as asked (its load's end sets the next wait).
    pub fn retries_due(&self) -> Vec<String> {
        let now = std::time::Instant::now();
        let mut status = self.status.lock().expect("poisoned");
        status
            .iter_mut()
            .filter_map(|(stem, entry)| {
                let (failures, at) = entry.retry.as_mut()?;
                (*at <= now).then(|| {
                    *at = now + retry_after(*failures);
                    stem.clone()
                })
            })
            .collect()
    }

    /// The sha256 of the file `stem`'s last load refused, unless a load succeeded since.
    pub fn refused(&self, stem: &str) -> Option<String> {
        let status = self.status.lock().expect("poisoned");
        status.get(stem)?.refused.clone()
    }

    /// The sha256 of the version [`Registry::rollback`] would make live now.
    pub fn rollback_target(&self, stem: &str) -> Result<String, RollbackError> {
        let status = self.status.lock().expect("poisoned");
        let entry = status
            .get(stem)
            .ok_or_else(|| RollbackError::UnknownFile(stem.to_owned()))?;
        entry.check_loaded(stem)?;
        entry
            .previous
            .first()
            .map(|p| p.plugin.sha256().to_owned())
            .ok_or_else(|| RollbackError::NoPrevious(stem.to_owned()))
    }

    /// Makes the most recent previous version live again. The version it replaces is dropped,
    /// not listed as a rollback target: `previous` holds only earlier versions, so each rollback
    /// goes one further back. (The file on disk is untouched; writing it again loads it.)
    /// With `expected`, only if that is the version it would return to (else
    /// [`RollbackError::Moved`], and nothing changes).
    pub fn rollback(
        &self,
        stem: &str,
        expected: Option<&str>,
    ) -> Result<Arc<LoadedPlugin>, RollbackError> {
        let mut status = self.status.lock().expect("poisoned");
        let entry = status
            .get_mut(stem)
            .ok_or_else(|| RollbackError::UnknownFile(stem.to_owned()))?;
        entry.check_loaded(stem)?;
        let Some(back) = entry.previous.first() else {
            return Err(RollbackError::NoPrevious(stem.to_owned()));
        };
        check_expected(stem, expected, back.plugin.sha256())?;
        Ok(self.step_back(stem, entry, 0))
    }

    /// Makes `entry.previous[at]` of `stem` live, dropping the version it replaces (a step back
    /// lists no later version as a rollback target).
    fn step_back(&self, stem: &str, entry: &mut FileStatus, at: usize) -> Arc<LoadedPlugin> {
        let back = entry.previous.remove(at);
        entry.current = Some(back.clone());
        entry.live_since_ms = unix_ms(std::time::SystemTime::now());
        entry.file_bytes = None;
        self.publish(stem, Some(back.clone()));
        tracing::warn!(
            plugin = stem,
            sha256 = back.plugin.sha256(),
            "plugin rolled back"
        );
        back
    }

    /// Makes the earlier version `sha256` of `stem` live, if this node still holds it among its
    /// previous versions (a cluster's rollback, whose target the cluster's history chose): as a
    /// step back, the version it replaces is not listed. `None` if it holds no such version
    /// (the cluster's sync then writes and loads it like any release).
    pub fn rollback_to(&self, stem: &str, sha256: &str) -> Option<Arc<LoadedPlugin>> {
        let mut status = self.status.lock().expect("poisoned");
        let entry = status.get_mut(stem)?;
        if entry
            .current
            .as_ref()
            .is_some_and(|c| c.plugin.sha256() == sha256)
        {
            return entry.current.clone();
        }
        let at = entry
            .previous
            .iter()
            .position(|p| p.plugin.sha256() == sha256)?;
        Some(self.step_back(stem, entry, at))
    }

    /// Every known file's status, for the admin API.
    pub fn statuses(&self) -> BTreeMap<String, PluginStatus> {
        let status = self.status.lock().expect("poisoned");
        status
            .iter()
            .map(|(stem, s)| {
                let status = PluginStatus {
                    wasm: self.path_of(stem).display().to_string(),
                    sha256: s.current.as_ref().map(|c| c.plugin.sha256().to_owned()),
                    loaded_at: s.current.as_ref().map(|_| s.live_since_ms),
                    exports: s
                        .current
                        .as_ref()
                        .map(|c| c.plugin.roles().names())
                        .unwrap_or_default(),
                    wit_version: s.current.as_ref().map(|c| c.plugin.wit_version()),
                    error: s.error.clone(),
                    previous: s
                        .previous
                        .iter()
                        .map(|p| p.plugin.sha256().to_owned())
                        .collect(),
                };
                (stem.clone(), status)
            })
            .collect()
    }

    fn publish(&self, stem: &str, plugin: Option<Arc<LoadedPlugin>>) {
        self.live.rcu(|live| {
            let mut next = HashMap::clone(live);
            match &plugin {
                Some(p) => next.insert(stem.to_owned(), p.clone()),
                None => next.remove(stem),
            };
            next
        });
    }

    /// Reads, compiles and checks `path`; `read` gets the sha256 of the bytes read and `kept`
    /// the bytes, if it got that far.
    async fn build(
        &self,
        stem: &str,
        path: &Path,
        read: &mut Option<String>,
        kept: &mut Option<Arc<Vec<u8>>>,
    ) -> Result<Arc<LoadedPlugin>, LoadError> {
        let file = path.display().to_string();
        let read_path = path.to_owned();
        let needs = self.needs.get(stem).cloned().unwrap_or_default();
        let cap = needs.max_bytes;
        let bytes = tokio::task::spawn_blocking(move || read_plugin_file(&read_path, cap))
            .await
            .map_err(|source| LoadError::ReadTask {
                stem: stem.to_owned(),
                file: file.clone(),
                source,
            })?
            .and_then(|bytes| check_component_header(&bytes).map(|()| bytes))
            .map_err(|source| LoadError::File {
                stem: stem.to_owned(),
                file: file.clone(),
                source,
            })?;
        let sha256 = crate::runtime::file_sha256(&bytes);
        *read = Some(sha256.clone());
        let bytes = Arc::new(bytes);
        *kept = Some(bytes.clone());
        // Rewritten with the same contents (a touch, an unchanged rebuild): nothing to compile.
        if let Some(live) = self.get(stem)
            && sha256 == live.plugin.sha256()
        {
            return Ok(live);
        }
        let built = self
            .runtime
            .build(bytes, sha256.clone(), self.cache.clone(), &self.compiler)
            .await
            .map_err(|e| match e {
                runtime::LoadError::Compile(reason) => LoadError::Compile {
                    stem: stem.to_owned(),
                    file: file.clone(),
                    reason,
                    limit: false,
                },
                runtime::LoadError::CompileLimit(reason) => LoadError::Compile {
                    stem: stem.to_owned(),
                    file: file.clone(),
                    reason,
                    limit: true,
                },
                source => LoadError::Refused {
                    stem: stem.to_owned(),
                    file: file.clone(),
                    source,
                },
            })?;
        self.runtime
            .typecheck(&built.plugin, &needs.start)
            .await
            .map_err(|source| LoadError::Refused {
                stem: stem.to_owned(),
                file: file.clone(),
                source,
            })?;
        if let Some((role, used_by)) = needs.missing(built.plugin.roles()) {
            return Err(LoadError::MissingRole {
                stem: stem.to_owned(),
                file,
                role,
                used_by: used_by.to_owned(),
                exports: built.plugin.roles().names().join(", "),
            });
        }
        // Cached only now that it passed every check: a refused file leaves nothing behind.
        if let (Some(cache), Some(artifact)) = (self.cache.clone(), built.artifact) {
            let _ = tokio::task::spawn_blocking(move || cache.store(&sha256, &artifact)).await;
        }
        Ok(Arc::new(LoadedPlugin {
            stem: stem.to_owned(),
            plugin: built.plugin,
        }))
    }
}

/// Reads a plugin file: not through a symlink, only a regular file, at most `cap` bytes.
/// Errors say what is wrong (to follow the file's name), never its bytes.
fn read_plugin_file(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    use std::{
        io::Read as _,
        os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    };
    let kind = |meta: &std::fs::Metadata| {
        let t = meta.file_type();
        if t.is_symlink() {
            "a symbolic link"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a named pipe"
        } else if t.is_socket() {
            "a socket"
        } else {
            "a device"
        }
    };
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            FileError::Missing(wasm_files_beside(path))
        } else {
            FileError::Unreadable(e)
        }
    })?;
    if !meta.is_file() {
        return Err(FileError::NotRegular(kind(&meta)));
    }
    // O_NOFOLLOW: swapped for a symlink since the check, the open fails instead of following
    // it; O_NONBLOCK: swapped for a pipe, the open does not hang.
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                FileError::NotRegular("a symbolic link")
            } else {
                FileError::Unreadable(e)
            }
        })?;
    let meta = file.metadata().map_err(FileError::Unreadable)?;
    if !meta.is_file() {
        return Err(FileError::NotRegular(kind(&meta)));
    }
    if meta.len() > cap {
        return Err(FileError::TooLarge(meta.len(), cap));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::Unreadable)?;
    if bytes.len() as u64 > cap {
        return Err(FileError::Grew(cap));
    }
    Ok(bytes)
}

/// The `.wasm` files in `path`'s directory, named for a message: at most 10, sorted.
fn wasm_files_beside(path: &Path) -> String {
    let mut names: Vec<String> = path
        .parent()
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".wasm"))
        .collect();
    names.sort();
    match names.len() {
        0 => "no .wasm file".to_owned(),
        n if n > 10 => format!("{}, … ({n} .wasm files)", names[..10].join(", ")),
        _ => names.join(", "),
    }
}

/// Refuses anything but a binary WebAssembly component before it reaches a parser, so no error
/// message can quote the start of some other file.
fn check_component_header(bytes: &[u8]) -> Result<(), FileError> {
    const MAGIC: &[u8] = b"\0asm";
    const COMPONENT: &[u8] = b"\x0d\x00\x01\x00";
    const CORE_MODULE: &[u8] = b"\x01\x00\x00\x00";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err(FileError::NoWasmHeader(bytes.len()));
    }
    match &bytes[4..8] {
        v if v == COMPONENT => Ok(()),
        v if v == CORE_MODULE => Err(FileError::CoreModule),
        _ => Err(FileError::UnknownVersion),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_error_names_the_plugin_then_the_file_then_the_reason() {
        let error = LoadError::File {
            stem: "h".into(),
            file: "/p/h.wasm".into(),
            source: FileError::Grew(MAX_PLUGIN_BYTES),
        };
        assert_eq!(
            error.to_string(),
            format!("plugin h: /p/h.wasm grew over the {MAX_PLUGIN_BYTES}-byte cap")
        );
    }

    #[test]
    fn a_file_over_its_cap_is_refused_naming_the_key_and_one_under_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.wasm");
        std::fs::write(&path, [0u8; 100]).unwrap();
        let error = read_plugin_file(&path, 99).unwrap_err();
        assert_eq!(
            error.to_string(),
            "is 100 bytes, over the 99-byte cap (raise the plugin's max_file_mib)"
        );
        assert_eq!(read_plugin_file(&path, 100).unwrap().len(), 100);
    }

    #[test]
    fn a_symlink_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.wasm");
        std::fs::write(&target, b"\0asm\x0d\x00\x01\x00").unwrap();
        let link = dir.path().join("h.wasm");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            read_plugin_file(&link, MAX_PLUGIN_BYTES),
            Err(FileError::NotRegular("a symbolic link"))
        ));
    }

    /// A load that failed for a reason of the moment (here: no compiler process could start)
    /// is not the file's refusal (a cluster would give the file back its live version for
    /// good), and the file is due to be loaded again after a wait that doubles, 2 s to 5 min.
    #[tokio::test]
    async fn a_load_failed_for_a_reason_of_the_moment_is_due_again_not_refused() {
        use std::time::Duration;

        use crate::clock::Clock;
        let waits = [1, 2, 3, 9, 40, u32::MAX].map(retry_after);
        assert_eq!(waits, [2, 4, 8, 300, 300, 300].map(Duration::from_secs));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.wasm"), b"\0asm\x0d\x00\x01\x00").unwrap();
        let registry = Registry::new(
            Runtime::new().unwrap(),
            dir.path().to_owned(),
            HashMap::new(),
            None,
            Compiler::missing(),
            Telemetry::new(Clock::system()),
        );
        let error = registry.load("h").await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert_eq!(registry.refused("h"), None, "{error}");
        assert!(registry.retries_due().is_empty(), "not before its wait");
        registry.status.lock().unwrap().get_mut("h").unwrap().retry =
            Some((1, std::time::Instant::now()));
        assert_eq!(registry.retries_due(), ["h"]);
        assert!(registry.retries_due().is_empty(), "asked once per wait");
        // Failing for as long, it is taken for the file's refusal, and not tried again.
        registry.status.lock().unwrap().get_mut("h").unwrap().retry =
            Some((TRANSIENT_TRIES, std::time::Instant::now()));
        registry.load("h").await.unwrap_err();
        assert!(registry.refused("h").is_some());
        assert!(registry.status.lock().unwrap()["h"].retry.is_none());
    }

    /// A load of a file waits for the one before it to end (read to swap), so two never
    /// overlap and the last asked for decides what is live; another file's load does not wait.
    #[tokio::test]
    async fn loads_of_one_file_take_turns() {
        use std::time::Duration;

        use crate::clock::Clock;
        let dir = tempfile::tempdir().unwrap();
        for stem in ["h", "other"] {
            // A component header, then nothing a compiler takes: each load fails fast.
            std::fs::write(
                dir.path().join(format!("{stem}.wasm")),
                b"\0asm\x0d\x00\x01\x00",
            )
            .unwrap();
        }
        let compiler = Compiler::missing();
        let registry = Arc::new(Registry::new(
            Runtime::new().unwrap(),
            dir.path().to_owned(),
            HashMap::new(),
            None,
            compiler,
            Telemetry::new(Clock::system()),
        ));
        let turn = registry.turn("h");
        let held = turn.lock().await;
        let load = tokio::spawn({
            let registry = registry.clone();
            async move { registry.load("h").await }
        });
        let other = registry.load("other").await;
        assert!(other.is_err(), "the other file loads meanwhile (and fails)");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !load.is_finished(),
            "a load ran while another of the same file held its turn"
        );
        drop(held);
        let loaded = tokio::time::timeout(Duration::from_secs(30), load)
            .await
            .expect("the load went on once the turn was free")
            .unwrap();
        assert!(loaded.is_err(), "{:?}", loaded.map(|_| ()));
    }

    #[test]
    fn a_core_module_is_refused_as_one() {
        assert!(matches!(
            check_component_header(b"\0asm\x01\x00\x00\x00"),
            Err(FileError::CoreModule)
        ));
    }
}
