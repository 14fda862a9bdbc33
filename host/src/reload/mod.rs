//! Hot reload: watches `plugins_dir` and hands changed plugin files to the registry.
//!
//! Invariants: only files a configured plugin instance uses are loaded; a file is loaded only
//! once it has stopped changing (debounce), so a `cp` in progress is never compiled; a
//! deleted file unloads its plugin (deliveries wait, they are not dead-lettered).

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::Shared;

/// How long a file must stay unchanged before it is loaded.
const SETTLE: Duration = Duration::from_millis(200);
/// How often `plugins_dir` is scanned.
const SCAN_EVERY: Duration = Duration::from_millis(100);

/// What the watcher knows of one file: its size and modification time.
type Fingerprint = Option<(u64, SystemTime)>;

fn fingerprint(path: &Path) -> Fingerprint {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// Runs until `shutdown` resolves.
pub async fn run(shared: Arc<Shared>, shutdown: impl Future<Output = ()>) {
    let stems: HashSet<String> = shared.config.wasm_stems().into_iter().collect();
    let mut seen: HashMap<String, Fingerprint> = stems
        .iter()
        .map(|stem| (stem.clone(), fingerprint(&shared.registry.path_of(stem))))
        .collect();
    // A change waits here until it has settled: stem → (fingerprint, first seen).
    let mut settling: HashMap<String, (Fingerprint, tokio::time::Instant)> = HashMap::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(SCAN_EVERY) => {}
        }
        for stem in &stems {
            let now = fingerprint(&shared.registry.path_of(stem));
            if seen.get(stem) == Some(&now) {
                settling.remove(stem);
                continue;
            }
            match settling.get(stem) {
                Some((pending, since)) if *pending == now && since.elapsed() >= SETTLE => {
                    settling.remove(stem);
                    seen.insert(stem.clone(), now);
                    if now.is_some() {
                        let _ = shared.registry.load(stem).await;
                    } else {
                        shared.registry.unload(stem);
                    }
                }
                Some((pending, _)) if *pending == now => {}
                _ => {
                    settling.insert(stem.clone(), (now, tokio::time::Instant::now()));
                }
            }
        }
    }
}
