//! The compiled-artifact cache: native code for each plugin file version, so a restart loads
//! plugins in milliseconds instead of compiling them again.
//!
//! Invariants:
//! - Precompiled code is only ever loaded from the host-private directory given at start-up
//!   (`server.cache_dir`), never from `plugins_dir`: whoever can write there could run native
//!   code in the host. The directory is created owner-only and entries are written owner-only.
//! - An entry is keyed by the plugin file's sha256 and the engine's compatibility hash, so a
//!   changed file, a changed engine configuration or another wasmtime version never matches.
//! - Entries are written whole or not at all (temporary file, fsync, rename), and a file is never
//!   modified in place: a mapped artifact is immutable for as long as it is used.
//! - An entry that fails to load is deleted and the plugin compiled again; the cache can only
//!   make loading faster, never make a load fail.

use std::{
    hash::{Hash, Hasher},
    io::Write as _,
    path::{Path, PathBuf},
    time::SystemTime,
};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, component::Component};

/// Entries kept; beyond this the least recently used are removed.
const MAX_ENTRIES: usize = 256;

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Loaded from the artifact cache.
    Cache,
    /// Compiled from the wasm bytes (and, with a cache, stored in it).
    Compiled,
}

/// A host-private directory of compiled components.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    /// Hex digest of the engine's compatibility hash: part of every entry's name.
    engine_key: String,
}

impl ArtifactCache {
    /// Opens (creating, owner-only) the cache directory for `engine`'s artifacts.
    pub(super) fn open(engine: &Engine, dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut hasher = DigestHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..12]);
        Ok(Self {
            dir: dir.to_owned(),
            engine_key,
        })
    }

    /// The directory entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for a plugin file whose contents hash to `sha256` (hex).
    pub fn entry(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// The compiled component for `bytes` (whose sha256 is `sha256`): from the cache if a valid
    /// entry exists, else compiled and stored. CPU-heavy when it compiles: call it off the
    /// async executor.
    pub(super) fn component(
        &self,
        engine: &Engine,
        sha256: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, Origin)> {
        let entry = self.entry(sha256);
        if entry.is_file() {
            // SAFETY: `entry` is in the host-private cache directory, and this module only ever
            // writes complete artifacts produced by `Component::serialize` for this engine there
            // (temporary file + rename, never modified in place). A foreign or damaged file is
            // refused by wasmtime's header and compatibility checks and then deleted below.
            match unsafe { Component::deserialize_file(engine, &entry) } {
                Ok(component) => {
                    touch(&entry);
                    return Ok((component, Origin::Cache));
                }
                Err(e) => {
                    tracing::warn!(
                        entry = %entry.display(), error = %format!("{e:#}"),
                        "cached artifact unusable; compiling again"
                    );
                    let _ = std::fs::remove_file(&entry);
                }
            }
        }
        let component = Component::new(engine, bytes)?;
        match component.serialize() {
            Ok(artifact) => {
                if let Err(e) = self.store(&entry, &artifact) {
                    tracing::warn!(
                        entry = %entry.display(), error = %e,
                        "could not write the compiled artifact to the cache"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not serialize a component"),
        }
        Ok((component, Origin::Compiled))
    }

    /// Writes `artifact` as `entry`, atomically and owner-only, then trims the cache.
    fn store(&self, entry: &Path, artifact: &[u8]) -> std::io::Result<()> {
        let name = entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry");
        let tmp = self
            .dir
            .join(format!(".{name}.{}.tmp", rand::random::<u64>()));
        let write = || -> std::io::Result<()> {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                options.mode(0o600);
            }
            let mut file = options.open(&tmp)?;
            file.write_all(artifact)?;
            // On disk before it has its name: a crash never leaves a partial entry.
            file.sync_all()?;
            std::fs::rename(&tmp, entry)
        };
        let result = write();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        self.trim();
        Ok(())
    }

    /// Removes the least recently used entries beyond [`MAX_ENTRIES`].
    fn trim(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(".cwasm"))
            })
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if entries.len() <= MAX_ENTRIES {
            return;
        }
        entries.sort();
        for (_, path) in &entries[..entries.len() - MAX_ENTRIES] {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Marks an entry as recently used (its modification time orders eviction). Best effort.
fn touch(entry: &Path) {
    if let Ok(file) = std::fs::OpenOptions::new().append(true).open(entry) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// Feeds a `Hash` into SHA-256, for a digest that is stable across processes.
struct DigestHasher(Sha256);

impl Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest valid component: the preamble of an empty component binary.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn a_compiled_component_is_stored_then_loaded_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = ArtifactCache::open(&engine, &dir.path().join("cache")).unwrap();
        let sha = sha(EMPTY_COMPONENT);
        let (_, origin) = cache.component(&engine, &sha, EMPTY_COMPONENT).unwrap();
        assert_eq!(origin, Origin::Compiled);
        let entry = cache.entry(&sha);
        assert!(entry.is_file(), "no entry at {}", entry.display());
        let name = entry.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(&sha),
            "{name} is not keyed by the file's sha256"
        );

        let (_, origin) = cache.component(&engine, &sha, EMPTY_COMPONENT).unwrap();
        assert_eq!(origin, Origin::Cache);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(cache.dir()), 0o700);
            assert_eq!(mode(&entry), 0o600);
        }
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_corrupt_or_truncated_entry_is_replaced_by_compiling_again() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = ArtifactCache::open(&engine, dir.path()).unwrap();
        let sha = sha(EMPTY_COMPONENT);
        cache.component(&engine, &sha, EMPTY_COMPONENT).unwrap();
        let entry = cache.entry(&sha);
        let good = std::fs::read(&entry).unwrap();

        let damaged: [Vec<u8>; 3] = [
            good[..good.len() / 2].to_vec(),
            b"definitely not an ELF artifact".to_vec(),
            Vec::new(),
        ];
        for bad in damaged {
            std::fs::write(&entry, &bad).unwrap();
            let (_, origin) = cache.component(&engine, &sha, EMPTY_COMPONENT).unwrap();
            assert_eq!(origin, Origin::Compiled, "a damaged entry was used");
            assert_eq!(
                std::fs::read(&entry).unwrap(),
                good,
                "the entry was not rewritten"
            );
            let (_, origin) = cache.component(&engine, &sha, EMPTY_COMPONENT).unwrap();
            assert_eq!(origin, Origin::Cache);
        }
    }

    #[test]
    fn another_engine_configuration_never_shares_entries() {
        let dir = tempfile::tempdir().unwrap();
        let plain = engine();
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        let epoch = Engine::new(&config).unwrap();
        let a = ArtifactCache::open(&plain, dir.path()).unwrap();
        let b = ArtifactCache::open(&epoch, dir.path()).unwrap();
        let sha = sha(EMPTY_COMPONENT);
        assert_ne!(a.entry(&sha), b.entry(&sha));
        a.component(&plain, &sha, EMPTY_COMPONENT).unwrap();
        let (_, origin) = b.component(&epoch, &sha, EMPTY_COMPONENT).unwrap();
        assert_eq!(origin, Origin::Compiled);

        // Even under the other engine's name, an artifact of this one is refused, not run.
        std::fs::remove_file(b.entry(&sha)).unwrap();
        std::fs::copy(a.entry(&sha), b.entry(&sha)).unwrap();
        let (_, origin) = b.component(&epoch, &sha, EMPTY_COMPONENT).unwrap();
        assert_eq!(origin, Origin::Compiled);
        let (_, origin) = b.component(&epoch, &sha, EMPTY_COMPONENT).unwrap();
        assert_eq!(origin, Origin::Cache);
    }
}
