//! The compiled-artifact cache: native code for each plugin file version, so a restart loads
//! plugins in milliseconds instead of compiling them again.
//!
//! Invariants:
//! - Precompiled code is only ever loaded from the host-private directory given at start-up
//!   (`server.cache_dir`), never from `plugins_dir`: whoever can write there could run native
//!   code in the host. The directory must be owned by the user hookd runs as and not be
//!   writable by group or others (else opening the cache fails, naming it); it is created
//!   owner-only. An entry is used only if it is a regular file (not a symlink) owned by that
//!   user and not writable by group or others; anything else is deleted, never loaded.
//! - An entry is named by the plugin file's sha256 and the engine's compatibility hash, and its
//!   trailer binds the artifact to both: the wasm's sha256, the engine key and a digest of the
//!   artifact bytes. An entry whose trailer does not match the file it is looked up for (one
//!   plugin's artifact renamed to another's name, a truncated or damaged file, another engine)
//!   is deleted and the plugin compiled again: the cache can only make loading faster, never
//!   make a load fail or run other code than the file's.
//! - Only artifacts of files that passed every load check are stored (the registry stores
//!   after type-checking); the cache is capped in bytes ([`ArtifactCache::max_bytes`]) and
//!   entries, least recently used first out.
//! - Entries are written whole or not at all (temporary file, fsync, rename), and a file is never
//!   modified in place. A temporary file a crash left behind is removed once it is stale.

use std::{
    hash::{Hash, Hasher},
    io::{Read as _, Write as _},
    os::unix::fs::{
        DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
    },
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, component::Component};

/// Entries kept at most, whatever their size; beyond this the least recently used are removed.
const MAX_ENTRIES: usize = 256;

/// How old a partial write (`.<entry>.<random>.tmp`) is before it is taken for one a crash
/// cut short: far longer than writing any artifact takes.
const STALE_PARTIAL: Duration = Duration::from_secs(600);
/// Marks the trailer of an entry written by this module (format version 1).
const TRAILER_MAGIC: &[u8; 16] = b"hookd-cwasm-v1\0\0";
/// Trailer: magic, the wasm file's sha256, the engine key, sha256 of everything before it.
const TRAILER_LEN: usize = 16 + 32 + 32 + 32;

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Loaded from the artifact cache.
    Cache,
    /// Compiled from the wasm bytes (and, with a cache, stored in it).
    Compiled,
}

/// Why the cache directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Someone other than hookd's user could place native code there: refused.
    #[error("{0}")]
    Unsafe(String),
    /// It could not be created or inspected.
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// A host-private directory of compiled components.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    /// Hex digest of the engine's compatibility hash: part of every entry's name.
    engine_key: String,
    /// The same digest, raw: part of every entry's trailer.
    engine_digest: [u8; 32],
    max_bytes: u64,
}

impl ArtifactCache {
    /// Opens (creating, owner-only) the cache directory for `engine`'s artifacts, holding at
    /// most `max_bytes` of entries. Refuses a directory that is not owned by the current user
    /// or is writable by group or others.
    pub(super) fn open(engine: &Engine, dir: &Path, max_bytes: u64) -> Result<Self, CacheError> {
        let io = |source| CacheError::Io {
            path: dir.display().to_string(),
            source,
        };
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io)?,
            Err(e) => return Err(io(e)),
            Ok(meta) => {
                check_private(dir, &meta, "server.cache_dir", "directory")?;
                if meta.mode() & 0o077 != 0 {
                    // Readable by others, not writable: ours to tighten.
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                        .map_err(io)?;
                }
            }
        }
        let meta = std::fs::metadata(dir).map_err(io)?;
        check_private(dir, &meta, "server.cache_dir", "directory")?;
        let mut hasher = DigestHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_digest: [u8; 32] = hasher.0.finalize().into();
        Ok(Self {
            dir: dir.to_owned(),
            engine_key: hex::encode(&engine_digest[..12]),
            engine_digest,
            max_bytes,
        })
    }

    /// The directory entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The most bytes of entries kept (`server.cache_max_bytes`).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The entry for a plugin file whose contents hash to `sha256` (hex).
    pub fn entry(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// The cached component for the file whose contents hash to `sha256`, if a valid entry
    /// exists. An entry that is not ours, not for this file or this engine, or damaged is
    /// deleted and `None` returned. Reads and maps the artifact: call it off the executor.
    pub(super) fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let entry = self.entry(sha256);
        let artifact = match self.read_entry(&entry, sha256) {
            Ok(Some(artifact)) => artifact,
            Ok(None) => return None,
            Err(reason) => {
                tracing::warn!(entry = %entry.display(), reason, "cached artifact refused; compiling again");
                let _ = std::fs::remove_file(&entry);
                return None;
            }
        };
        // SAFETY: the bytes come from an entry in the host-private cache directory (checked
        // owned by this user and writable by nobody else), whose trailer binds them to this
        // file's sha256 and this engine and whose digest matches: this module wrote them from a
        // compile of exactly this file. wasmtime checks the header and compatibility again.
        match unsafe { Component::deserialize(engine, &artifact) } {
            Ok(component) => {
                touch(&entry);
                Some(component)
            }
            Err(e) => {
                tracing::warn!(
                    entry = %entry.display(), error = %format!("{e:#}"),
                    "cached artifact unusable; compiling again"
                );
                let _ = std::fs::remove_file(&entry);
                None
            }
        }
    }

    /// The artifact bytes of `entry` without their trailer: `Ok(None)` if there is no entry,
    /// `Err(reason)` if there is one that must not be loaded.
    fn read_entry(&self, entry: &Path, sha256: &str) -> Result<Option<Vec<u8>>, String> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).custom_flags(
            (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
        );
        let mut file = match options.open(entry) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot open it (a symlink?): {e}")),
        };
        let meta = file.metadata().map_err(|e| e.to_string())?;
        check_private(entry, &meta, "cache entry", "file").map_err(|e| e.to_string())?;
        if meta.len() > self.max_bytes || meta.len() < TRAILER_LEN as u64 {
            return Err(format!("its size ({} bytes) is impossible", meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        let Some(body_len) = bytes.len().checked_sub(TRAILER_LEN) else {
            return Err("it is truncated".into());
        };
        let trailer = &bytes[body_len..];
        let expected = self.trailer(sha256, &bytes[..body_len])?;
        if trailer[..16] != TRAILER_MAGIC[..] {
            return Err("it has no hookd trailer (damaged or not written by hookd)".into());
        }
        if trailer[16..48] != expected[16..48] {
            return Err("it was compiled from another plugin file".into());
        }
        if trailer[48..80] != expected[48..80] {
            return Err("it was compiled by another engine configuration".into());
        }
        if trailer[80..] != expected[80..] {
            return Err("its digest does not match (damaged)".into());
        }
        bytes.truncate(body_len);
        Ok(Some(bytes))
    }

    /// The trailer binding `artifact` to the file `sha256` and this engine.
    fn trailer(&self, sha256: &str, artifact: &[u8]) -> Result<[u8; TRAILER_LEN], String> {
        let mut wasm = [0u8; 32];
        hex::decode_to_slice(sha256, &mut wasm).map_err(|e| format!("bad sha256: {e}"))?;
        let mut trailer = [0u8; TRAILER_LEN];
        trailer[..16].copy_from_slice(TRAILER_MAGIC);
        trailer[16..48].copy_from_slice(&wasm);
        trailer[48..80].copy_from_slice(&self.engine_digest);
        let digest = Sha256::new()
            .chain_update(artifact)
            .chain_update(&trailer[..80])
            .finalize();
        trailer[80..].copy_from_slice(&digest);
        Ok(trailer)
    }

    /// Stores `artifact` (compiled from the file whose sha256 is `sha256`, which passed every
    /// load check) as its entry, atomically and owner-only, then trims the cache to its caps.
    /// An artifact larger than the whole cap is not stored. Best effort: failures are logged.
    pub fn store(&self, sha256: &str, artifact: &[u8]) {
        let entry = self.entry(sha256);
        if let Err(e) = self.try_store(&entry, sha256, artifact) {
            tracing::warn!(
                entry = %entry.display(), error = %e,
                "could not write the compiled artifact to the cache"
            );
        }
    }

    fn try_store(&self, entry: &Path, sha256: &str, artifact: &[u8]) -> std::io::Result<()> {
        let size = (artifact.len() + TRAILER_LEN) as u64;
        if size > self.max_bytes {
            tracing::info!(
                entry = %entry.display(), size, cap = self.max_bytes,
                "compiled artifact larger than server.cache_max_bytes; not cached"
            );
            return Ok(());
        }
        let trailer = self
            .trailer(sha256, artifact)
            .map_err(std::io::Error::other)?;
        let name = entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry");
        let tmp = self
            .dir
            .join(format!(".{name}.{}.tmp", rand::random::<u64>()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(artifact)?;
            file.write_all(&trailer)?;
            // On disk before it has its name: a crash never leaves a partial entry.
            file.sync_all()?;
            std::fs::rename(&tmp, entry)
        };
        let result = write();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        self.trim(entry);
        Ok(())
    }

    /// Removes the least recently used entries until at most [`MAX_ENTRIES`] entries of at
    /// most `max_bytes` together are left; `keep` (the entry just written) goes last. Partial
    /// writes older than [`STALE_PARTIAL`] go too.
    fn trim(&self, keep: &Path) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let stale_before = SystemTime::now() - STALE_PARTIAL;
        let mut entries: Vec<(bool, SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let Some(name) = name.to_str() else {
                    return false;
                };
                if name.starts_with('.') && name.ends_with(".tmp") {
                    // A write cut short by a crash, never renamed: counted nowhere, so removed
                    // once surely no writer has it open (another hookd may share the directory).
                    let written = e.metadata().and_then(|m| m.modified());
                    if written.is_ok_and(|at| at < stale_before) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
                name.ends_with(".cwasm")
            })
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                let path = e.path();
                Some((path == keep, meta.modified().ok()?, meta.len(), path))
            })
            .collect();
        // Oldest first; the entry just written sorts after every other.
        entries.sort();
        let mut total: u64 = entries.iter().map(|(_, _, len, _)| len).sum();
        let mut count = entries.len();
        for (_, _, len, path) in &entries {
            if total <= self.max_bytes && count <= MAX_ENTRIES {
                break;
            }
            if std::fs::remove_file(path).is_ok() {
                total -= len;
                count -= 1;
            }
        }
    }
}

/// Refuses `path` (its `meta`, not following a final symlink for files) unless it is owned by
/// the user hookd runs as and not writable by group or others; `what`/`kind` name it.
fn check_private(
    path: &Path,
    meta: &std::fs::Metadata,
    what: &str,
    kind: &str,
) -> Result<(), CacheError> {
    let me = rustix::process::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    let wrong_kind = match kind {
        "directory" => !meta.is_dir(),
        _ => !meta.is_file(),
    };
    let problem = if wrong_kind {
        format!("is not a {kind}")
    } else if meta.uid() != me {
        format!(
            "is owned by uid {}, not by the user hookd runs as (uid {me})",
            meta.uid()
        )
    } else if mode & 0o022 != 0 {
        format!("is writable by group or others (mode {mode:04o})")
    } else {
        return Ok(());
    };
    Err(CacheError::Unsafe(format!(
        "{what} {} {problem}: compiled native code is only loaded from a directory only hookd's \
         user can write (fix its owner and mode, e.g. chmod 700, or point server.cache_dir \
         elsewhere)",
        path.display()
    )))
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
    /// Another valid component: one empty core module inside.
    const ONE_MODULE: &[u8] = b"\0asm\x0d\x00\x01\x00\x01\x08\0asm\x01\x00\x00\x00";

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    fn sha(bytes: &[u8]) -> String {
        crate::runtime::file_sha256(bytes)
    }

    /// Compiles `bytes` and stores the artifact, as the registry does after its checks.
    fn compile_and_store(cache: &ArtifactCache, engine: &Engine, bytes: &[u8]) -> String {
        let sha = sha(bytes);
        let artifact = engine.precompile_component(bytes).unwrap();
        cache.store(&sha, &artifact);
        sha
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn cache_in(engine: &Engine, dir: &Path) -> ArtifactCache {
        ArtifactCache::open(engine, dir, 1 << 30).unwrap()
    }

    #[test]
    fn a_stored_component_is_loaded_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = cache_in(&engine, &dir.path().join("cache"));
        assert!(cache.load(&engine, &sha(EMPTY_COMPONENT)).is_none());
        let sha = compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        let entry = cache.entry(&sha);
        assert!(entry.is_file(), "no entry at {}", entry.display());
        let name = entry.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(&sha),
            "{name} is not keyed by the file's sha256"
        );
        assert!(cache.load(&engine, &sha).is_some());
        assert_eq!(mode(cache.dir()), 0o700);
        assert_eq!(mode(&entry), 0o600);
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_corrupt_or_truncated_entry_is_deleted_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = cache_in(&engine, dir.path());
        let sha = compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        let entry = cache.entry(&sha);
        let good = std::fs::read(&entry).unwrap();
        let mut flipped = good.clone();
        flipped[good.len() / 3] ^= 1;
        let damaged: [Vec<u8>; 4] = [
            good[..good.len() / 2].to_vec(),
            flipped,
            b"definitely not an ELF artifact".to_vec(),
            Vec::new(),
        ];
        for bad in damaged {
            std::fs::write(&entry, &bad).unwrap();
            std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(
                cache.load(&engine, &sha).is_none(),
                "a damaged entry was used"
            );
            assert!(!entry.exists(), "the damaged entry was kept");
        }
    }

    #[test]
    fn another_files_artifact_under_this_files_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = cache_in(&engine, dir.path());
        let a = compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        let b = sha(ONE_MODULE);
        std::fs::copy(cache.entry(&a), cache.entry(&b)).unwrap();
        assert!(
            cache.load(&engine, &b).is_none(),
            "a swapped artifact was loaded"
        );
        assert!(!cache.entry(&b).exists());
        assert!(cache.load(&engine, &a).is_some());
    }

    #[test]
    fn an_entry_writable_by_others_or_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = cache_in(&engine, &dir.path().join("cache"));
        let sha = compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        let entry = cache.entry(&sha);
        let good = std::fs::read(&entry).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(cache.load(&engine, &sha).is_none());
        assert!(!entry.exists());

        let outside = dir.path().join("outside.cwasm");
        std::fs::write(&outside, &good).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, &entry).unwrap();
        assert!(cache.load(&engine, &sha).is_none());
        assert!(
            std::fs::symlink_metadata(&entry).is_err(),
            "the symlink was kept"
        );
    }

    #[test]
    fn a_directory_writable_by_others_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        for bad in [0o777, 0o770, 0o1777] {
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(bad)).unwrap();
            let err = ArtifactCache::open(&engine, &shared, 1 << 30).unwrap_err();
            assert!(matches!(err, CacheError::Unsafe(_)), "{err}");
            let text = err.to_string();
            assert!(text.contains(&shared.display().to_string()), "{text}");
            assert!(text.contains("writable"), "{text}");
        }
        // Readable by others only: tightened, not refused.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        ArtifactCache::open(&engine, &shared, 1 << 30).unwrap();
        assert_eq!(mode(&shared), 0o700);
    }

    #[test]
    fn the_cache_stays_under_its_byte_cap() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let probe = cache_in(&engine, &dir.path().join("probe"));
        let size = |bytes| {
            let sha = compile_and_store(&probe, &engine, bytes);
            std::fs::metadata(probe.entry(&sha)).unwrap().len()
        };
        let (a, b) = (size(EMPTY_COMPONENT), size(ONE_MODULE));
        // Room for either entry, not both.
        let cap = a.max(b) + a.min(b) / 2;
        let cache = ArtifactCache::open(&engine, &dir.path().join("capped"), cap).unwrap();
        let a = compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        let b = compile_and_store(&cache, &engine, ONE_MODULE);
        let total: u64 = std::fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(total <= cap, "{total} bytes over the {cap}-byte cap");
        assert!(cache.entry(&b).exists(), "the newest entry was evicted");
        assert!(!cache.entry(&a).exists());
        // Larger than the whole cap: not stored at all.
        let tiny = ArtifactCache::open(&engine, &dir.path().join("tiny"), 16).unwrap();
        compile_and_store(&tiny, &engine, EMPTY_COMPONENT);
        assert_eq!(std::fs::read_dir(tiny.dir()).unwrap().count(), 0);
    }

    /// A partial write a crash left behind is removed once it is stale (it counted against no
    /// cap, so crashes piled them up); a recent one, perhaps another hookd's write in progress,
    /// is left.
    #[test]
    fn partial_writes_left_by_a_crash_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let cache = cache_in(&engine, dir.path());
        let partial = |name: &str, age: Duration| {
            let path = dir.path().join(name);
            let file = std::fs::File::create(&path).unwrap();
            file.set_modified(SystemTime::now() - age).unwrap();
            path
        };
        let stale = partial(".abc.cwasm.1.tmp", STALE_PARTIAL + Duration::from_secs(60));
        let recent = partial(".abc.cwasm.2.tmp", Duration::from_secs(1));
        let other = partial("notes.tmp", STALE_PARTIAL * 2);
        compile_and_store(&cache, &engine, EMPTY_COMPONENT);
        assert!(!stale.exists(), "a stale partial write was left");
        assert!(recent.exists(), "a recent partial write was removed");
        assert!(other.exists(), "a file not the cache's was removed");
    }

    #[test]
    fn another_engine_configuration_never_shares_entries() {
        let dir = tempfile::tempdir().unwrap();
        let plain = engine();
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        let epoch = Engine::new(&config).unwrap();
        let a = cache_in(&plain, dir.path());
        let b = cache_in(&epoch, dir.path());
        let sha = sha(EMPTY_COMPONENT);
        assert_ne!(a.entry(&sha), b.entry(&sha));
        compile_and_store(&a, &plain, EMPTY_COMPONENT);
        assert!(b.load(&epoch, &sha).is_none());

        // Even under the other engine's name, an artifact of this one is refused, not run.
        std::fs::copy(a.entry(&sha), b.entry(&sha)).unwrap();
        assert!(b.load(&epoch, &sha).is_none());
        assert!(!b.entry(&sha).exists());
    }
}
