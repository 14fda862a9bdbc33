//! The plugin registry: which version of each plugin file is live, plus its load history.
//!
//! Invariants:
//! - Build, then swap: a file is read, size-capped, hashed, compiled and type-checked off the
//!   hot path; only a plugin that passed every step replaces the live one. A broken file never
//!   evicts a working version — its error is recorded beside it.
//! - Lookups on the hot path are a lock-free `ArcSwap` load; an in-flight call keeps its
//!   `Arc<LoadedPlugin>` and finishes on the version it started with.
//! - Native code comes from compiling the file or from the host-private artifact cache keyed by
//!   the file's sha256; nothing precompiled is ever read from the plugins directory.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    model::unix_ms,
    runtime::{ArtifactCache, Origin, Plugin, Runtime},
};

/// Largest plugin file accepted: far above any real component (the examples are 3-4 MB).
pub const MAX_PLUGIN_BYTES: u64 = 20 * 1024 * 1024;
/// Longest a compile may take before the file is refused.
const COMPILE_TIMEOUT: Duration = Duration::from_secs(120);
/// Versions kept for rollback besides the live one.
const KEEP_PREVIOUS: usize = 5;

/// One live version of a plugin file.
#[derive(Debug)]
pub struct LoadedPlugin {
    pub stem: String,
    pub plugin: Plugin,
    pub loaded_at_ms: i64,
}

#[derive(Default)]
struct FileStatus {
    current: Option<Arc<LoadedPlugin>>,
    previous: Vec<Arc<LoadedPlugin>>,
    error: Option<String>,
}

/// What `GET /admin/plugins` shows for one file.
#[derive(Debug, Clone, Serialize)]
pub struct PluginStatus {
    pub wasm: String,
    pub sha256: Option<String>,
    pub loaded_at: Option<i64>,
    pub exports: Vec<&'static str>,
    pub error: Option<String>,
    pub previous: Vec<String>,
}

/// Live plugins by wasm file stem.
pub struct Registry {
    runtime: Arc<Runtime>,
    dir: PathBuf,
    cache: Option<ArtifactCache>,
    live: ArcSwap<HashMap<String, Arc<LoadedPlugin>>>,
    status: Mutex<BTreeMap<String, FileStatus>>,
}

impl Registry {
    /// A registry of the files in `dir`; `cache` (if any) keeps their compiled code.
    pub fn new(runtime: Arc<Runtime>, dir: PathBuf, cache: Option<ArtifactCache>) -> Self {
        Self {
            runtime,
            dir,
            cache,
            live: ArcSwap::from_pointee(HashMap::new()),
            status: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path_of(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.wasm"))
    }

    /// The live version of `stem`, if any.
    pub fn get(&self, stem: &str) -> Option<Arc<LoadedPlugin>> {
        self.live.load().get(stem).cloned()
    }

    /// Loads (or reloads) `<dir>/<stem>.wasm`. On failure the live version, if any, stays.
    pub async fn load(&self, stem: &str) -> Result<Arc<LoadedPlugin>, String> {
        let path = self.path_of(stem);
        let result = self.build(stem, &path).await;
        let mut status = self.status.lock().expect("poisoned");
        let entry = status.entry(stem.to_owned()).or_default();
        match result {
            Ok(loaded) => {
                if entry
                    .current
                    .as_ref()
                    .is_some_and(|c| c.plugin.sha256() == loaded.plugin.sha256())
                {
                    entry.error = None;
                    return Ok(entry.current.clone().expect("checked"));
                }
                if let Some(old) = entry.current.replace(loaded.clone()) {
                    entry.previous.insert(0, old);
                }
                // A version that comes back is live, not also a rollback target.
                entry
                    .previous
                    .retain(|p| p.plugin.sha256() != loaded.plugin.sha256());
                entry.previous.truncate(KEEP_PREVIOUS);
                entry.error = None;
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
                tracing::error!(plugin = stem, file = %path.display(), "{error}");
                entry.error = Some(error.clone());
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
            entry.error = Some(format!("{} was removed", self.path_of(stem).display()));
        }
        self.publish(stem, None);
        tracing::warn!(plugin = stem, "plugin unloaded: its file was removed");
    }

    /// Makes the most recent previous version live again.
    pub fn rollback(&self, stem: &str) -> Result<Arc<LoadedPlugin>, String> {
        let mut status = self.status.lock().expect("poisoned");
        let entry = status
            .get_mut(stem)
            .ok_or_else(|| format!("no plugin file {stem:?} is known"))?;
        if entry.previous.is_empty() {
            return Err(format!(
                "plugin {stem:?} has no previous version to roll back to"
            ));
        }
        let back = entry.previous.remove(0);
        if let Some(current) = entry.current.replace(back.clone()) {
            entry.previous.insert(0, current);
        }
        self.publish(stem, Some(back.clone()));
        tracing::warn!(
            plugin = stem,
            sha256 = back.plugin.sha256(),
            "plugin rolled back"
        );
        Ok(back)
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
                    loaded_at: s.current.as_ref().map(|c| c.loaded_at_ms),
                    exports: s
                        .current
                        .as_ref()
                        .map(|c| c.plugin.roles().names())
                        .unwrap_or_default(),
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

    async fn build(&self, stem: &str, path: &Path) -> Result<Arc<LoadedPlugin>, String> {
        let file = path.display().to_string();
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| format!("plugin {stem}: cannot read {file}: {e}"))?;
        if meta.len() > MAX_PLUGIN_BYTES {
            return Err(format!(
                "plugin {stem}: {file} is {} bytes, over the {MAX_PLUGIN_BYTES}-byte cap",
                meta.len()
            ));
        }
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| format!("plugin {stem}: cannot read {file}: {e}"))?;
        if bytes.len() as u64 > MAX_PLUGIN_BYTES {
            return Err(format!(
                "plugin {stem}: {file} grew over the {MAX_PLUGIN_BYTES}-byte cap"
            ));
        }
        // Rewritten with the same contents (a touch, an unchanged rebuild): nothing to compile.
        if let Some(live) = self.get(stem)
            && hex::encode(Sha256::digest(&bytes)) == live.plugin.sha256()
        {
            return Ok(live);
        }
        let runtime = self.runtime.clone();
        let cache = self.cache.clone();
        let compile = tokio::task::spawn_blocking(move || runtime.compile(&bytes, cache.as_ref()));
        let plugin = tokio::time::timeout(COMPILE_TIMEOUT, compile)
            .await
            .map_err(|_| format!("plugin {stem}: compiling {file} took over {COMPILE_TIMEOUT:?}"))?
            .map_err(|e| format!("plugin {stem}: compiling {file} failed: {e}"))?
            .map_err(|e| format!("plugin {stem}: {file} refused: {e}"))?;
        self.runtime
            .typecheck(&plugin)
            .await
            .map_err(|e| format!("plugin {stem}: {file} refused: {e}"))?;
        Ok(Arc::new(LoadedPlugin {
            stem: stem.to_owned(),
            plugin,
            loaded_at_ms: unix_ms(std::time::SystemTime::now()),
        }))
    }
}
