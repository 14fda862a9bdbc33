//! Hot reload: watches `plugins_dir` and hands changed plugin files to the registry.
//!
//! Change detection is the `notify` watcher (inotify on Linux) plus a slow periodic rescan that
//! catches whatever the watcher missed (an overflowed event queue, a recreated directory); if no
//! watcher can be created, a fast polling scan replaces it.
//!
//! Invariants: only files a configured plugin instance uses are loaded; a file is loaded only
//! once its [`Fingerprint`] has stopped changing for [`SETTLE`] (debounce), so a
//! `cp` in progress is never compiled — or for [`SETTLE_FINISHED`] once the watcher saw the
//! writer finish (it closed the file, or the file was renamed into place); a deleted file
//! unloads its plugin (deliveries wait, they are not dead-lettered); loads run off this loop,
//! at most one per file at a time, and never evict a working version (the registry builds, then
//! swaps), so a file loaded too early costs an error message, never the working version. Many
//! files changed at once compile a few at a time: their compiles queue for the runtime
//! compiler's byte budget (`server.compile_queue_bytes`). A load that failed for a reason of
//! the moment (the compile process, the host's plugin memory) is tried again, unchanged, after
//! a wait that doubles from 2 s to 5 minutes ([`Registry::retries_due`]). A symlink in a file's place counts as
//! a change (it is not followed), which the registry refuses.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use notify::Watcher as _;
use tokio::{sync::mpsc, task::JoinSet, time::Instant};

use crate::registry::Registry;

/// How long a file must stay unchanged before it is loaded.
pub const SETTLE: Duration = Duration::from_millis(200);
/// How long it must stay unchanged after its writer closed it or it was renamed into place.
pub const SETTLE_FINISHED: Duration = Duration::from_millis(25);
/// How often every file is looked at while the watcher works (to catch missed events).
const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// How often every file is looked at when there is no watcher.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// What the watcher knows of one file (None: no file): its inode and device, size, and
/// modification and change times. The inode tells a file renamed into place from the one it
/// replaced and the change time an in-place rewrite, even when a build gave both the same size
/// and a fixed modification time (reproducible builds do).
type Fingerprint = Option<(u64, u64, u64, SystemTime, (i64, i64))>;

fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt as _;
    // Not following symlinks: a link, a directory or anything else in the file's place is a
    // change the registry then refuses with an error, rather than a silently followed file.
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some((
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.modified().ok()?,
        (meta.ctime(), meta.ctime_nsec()),
    ))
}

/// A change waiting to settle.
struct Settling {
    fingerprint: Fingerprint,
    since: Instant,
    /// [`SETTLE`], or [`SETTLE_FINISHED`] once the writer was seen to finish.
    quiet: Duration,
}

impl Settling {
    fn due(&self) -> Instant {
        self.since + self.quiet
    }
}

/// Loads `stem` off the loop, counted in `loading` until its task ends.
fn spawn_load(
    registry: &Arc<Registry>,
    stem: String,
    loads: &mut JoinSet<()>,
    loading: &mut HashMap<tokio::task::Id, String>,
) {
    let (registry, file) = (registry.clone(), stem.clone());
    let task = loads.spawn(async move {
        let _ = registry.load(&file).await;
    });
    loading.insert(task.id(), stem);
}

/// Filesystem events from `notify`, while the watcher lives.
struct Events {
    _watcher: notify::RecommendedWatcher,
    rx: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
}

/// Watches the plugin files of the configuration and keeps the registry in step with them.
pub struct Reloader {
    registry: Arc<Registry>,
    stems: BTreeSet<String>,
    /// Each file's fingerprint when it was last loaded (or found missing).
    seen: HashMap<String, Fingerprint>,
    /// Changes waiting to settle.
    settling: HashMap<String, Settling>,
    events: Option<Events>,
}

impl Reloader {
    /// Starts watching `registry`'s directory for the files `stems`. Call this before the first
    /// load, so that a change made while the host starts is not missed.
    pub fn new(registry: Arc<Registry>, stems: impl IntoIterator<Item = String>) -> Self {
        let events = match watch(registry.dir()) {
            Ok(events) => Some(events),
            Err(e) => {
                tracing::warn!(
                    dir = %registry.dir().display(), error = %e,
                    "cannot watch plugins_dir; polling it every {POLL_EVERY:?} instead"
                );
                None
            }
        };
        Self {
            registry,
            stems: stems.into_iter().collect(),
            seen: HashMap::new(),
            settling: HashMap::new(),
            events,
        }
    }

    /// Loads every file once (start-up), a few at a time: with the artifact cache warm this is
    /// a handful of milliseconds per plugin. A missing or broken file is reported, and the host
    /// still starts (its deliveries wait).
    pub async fn load_all(&mut self) {
        for stem in &self.stems {
            // Fingerprint before reading: a change during the load is seen as a change.
            self.seen
                .insert(stem.clone(), fingerprint(&self.registry.path_of(stem)));
        }
        for load in self.registry.spawn_loads(self.stems.iter().cloned()) {
            let _ = load.await;
        }
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let scan_every = if self.events.is_some() {
            RESCAN_EVERY
        } else {
            POLL_EVERY
        };
        let mut next_scan = Instant::now() + scan_every;
        // Loads in flight: stem by task, so even a load that panicked frees its file.
        let mut loading: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut loads: JoinSet<()> = JoinSet::new();
        loop {
            let wake = self
                .settling
                .iter()
                .filter(|(stem, _)| !loading.values().any(|l| l == *stem))
                .map(|(_, settling)| settling.due())
                .fold(next_scan, Instant::min);
            let mut check: Vec<String> = Vec::new();
            let mut finished: HashSet<String> = HashSet::new();
            tokio::select! {
                _ = &mut shutdown => return,
                event = recv(&mut self.events) => match event {
                    Some(Ok(event)) if event.need_rescan() => check.extend(self.stems.iter().cloned()),
                    Some(Ok(event)) => {
                        let stems = self.stems_in(&event);
                        if writer_finished(&event) {
                            finished.extend(stems.iter().cloned());
                        }
                        check.extend(stems);
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "plugins_dir watcher error; rescanning");
                        check.extend(self.stems.iter().cloned());
                    }
                    None => {
                        tracing::warn!("plugins_dir watcher stopped; polling instead");
                        self.events = None;
                    }
                },
                Some(done) = loads.join_next_with_id(), if !loads.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    check.extend(loading.remove(&id));
                }
                _ = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= next_scan {
                        let every = if self.events.is_some() { RESCAN_EVERY } else { POLL_EVERY };
                        next_scan = Instant::now() + every;
                        check.extend(self.stems.iter().cloned());
                        // A file whose load failed for a reason of the moment, unchanged: its
                        // turn to be loaded again (a changed one is loaded as a change).
                        for stem in self.registry.retries_due() {
                            if self.stems.contains(&stem)
                                && !loading.values().any(|l| *l == stem)
                            {
                                spawn_load(&self.registry, stem, &mut loads, &mut loading);
                            }
                        }
                    } else {
                        check.extend(self.settling.keys().cloned());
                    }
                }
            }
            check.sort();
            check.dedup();
            for stem in check {
                if loading.values().any(|l| *l == stem) {
                    continue; // looked at again when its load finishes
                }
                if let Some(now) = self.settled(&stem, finished.contains(&stem)) {
                    self.seen.insert(stem.clone(), now);
                    if now.is_some() {
                        spawn_load(&self.registry, stem, &mut loads, &mut loading);
                    } else {
                        self.registry.unload(&stem);
                    }
                }
            }
        }
    }

    /// The file's fingerprint if it changed and has now stayed the same long enough: [`SETTLE`],
    /// or [`SETTLE_FINISHED`] after its writer was seen to finish (`finished`).
    fn settled(&mut self, stem: &str, finished: bool) -> Option<Fingerprint> {
        let now = fingerprint(&self.registry.path_of(stem));
        if self.seen.get(stem) == Some(&now) {
            self.settling.remove(stem);
            return None;
        }
        let fresh = || Settling {
            fingerprint: now,
            since: Instant::now(),
            quiet: SETTLE,
        };
        let pending = self.settling.entry(stem.to_owned()).or_insert_with(fresh);
        if pending.fingerprint != now {
            *pending = fresh(); // still changing: start over
        }
        if finished {
            pending.quiet = SETTLE_FINISHED;
        }
        if Instant::now() >= pending.due() {
            self.settling.remove(stem);
            Some(now)
        } else {
            None
        }
    }

    /// The configured stems an event touches (`<stem>.wasm` files in the directory).
    fn stems_in(&self, event: &notify::Event) -> Vec<String> {
        use notify::event::{AccessKind, AccessMode, EventKind};
        // Reads (ours included) change nothing; a writer closing the file does.
        if let EventKind::Access(kind) = event.kind
            && kind != AccessKind::Close(AccessMode::Write)
        {
            return Vec::new();
        }
        event
            .paths
            .iter()
            .filter_map(|p| p.file_name()?.to_str()?.strip_suffix(".wasm"))
            .filter(|stem| self.stems.contains(*stem))
            .map(str::to_owned)
            .collect()
    }
}

/// Whether the event says a writer is done with the file: it closed it after writing, or the
/// file was renamed into place (the atomic way to publish a file).
fn writer_finished(event: &notify::Event) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind, RenameMode};
    matches!(
        event.kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both))
    )
}

/// Starts a non-recursive watcher on `dir` whose events arrive on a channel.
fn watch(dir: &Path) -> notify::Result<Events> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })?;
    watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
    Ok(Events {
        _watcher: watcher,
        rx,
    })
}

/// The next watcher event; never resolves without a watcher.
async fn recv(events: &mut Option<Events>) -> Option<notify::Result<notify::Event>> {
    match events {
        Some(events) => events.rx.recv().await,
        None => std::future::pending().await,
    }
}
