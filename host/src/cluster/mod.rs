//! This process as a node of a cluster: its identity, its heartbeat, and keeping its plugin
//! files the cluster's (a file dropped on any node goes live on every node).
//!
//! Every second the node records a heartbeat (its addresses, attempts in flight, the sha256 of
//! each live plugin) and compares its live plugins with the cluster's releases:
//! - its live version of a file changed by itself (a file dropped into its `plugins_dir` that
//!   passed every check, or a rollback through its admin API): it publishes that version (the
//!   bytes go with a new file; a rollback's version is already stored);
//! - the release names another version: it writes the release's bytes into its `plugins_dir`,
//!   where the reloader builds and swaps it exactly like a dropped file.
//!
//! Invariants:
//! - Only a version that loaded here (compiled, type-checked, live) is ever published: a broken
//!   file changes nothing anywhere. It goes with the bytes it loaded from
//!   (`Registry::live_bytes`), whatever the file holds by then.
//! - A publish or adoption that failed is planned again next tick (`Memory::failed`): what the
//!   planner remembers is what happened, never what was only planned.
//! - At start-up the cluster's choice wins over the files a node finds: a node that was down
//!   through a change (or a rollback) catches up instead of undoing it, and does so before it
//!   serves a request or claims a delivery ([`catch_up`]). A file with no release yet is
//!   published.
//! - A release is written into the plugins directory once per release version, so a version that
//!   cannot load on this node is not retried in a loop; a newer release is. Such a version's
//!   file is given back the live version's bytes, so the directory holds what runs and a
//!   restart serves it (never the refused file: a broken file never evicts a working one).
//! - A rollback goes only to a version the cluster stores (the admin API checks before it acts):
//!   a release always has bytes every node can fetch.
//! - Each tick first reads the database's clock, and the node's [`Clock`] follows it
//!   ([`follow_database_clock`]; a reading that fails or comes too slowly changes nothing, and
//!   the tick goes on): a lease stamped by one node is compared by another on the same
//!   clock, so a node whose own clock runs ahead does not take back leases still held, and one
//!   that runs behind does not hold on to expired ones. A start follows it before the node
//!   claims anything ([`follow_database_clock_at_start`]), or fails.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::Path,
    sync::{Arc, LazyLock},
    time::Duration,
};

use anyhow::Context;
use rand::RngCore;
use tracing::Level;

use crate::{
    clock::Clock,
    inbox::cluster::{ClusterStore, NodeBeat, Release},
    registry::Registry,
    telemetry::Repeated,
};

/// How often a node beats and looks at the releases.
pub const TICK: Duration = Duration::from_secs(1);
/// A node silent this long is shown as not alive.
pub const ALIVE_WITHIN_MS: i64 = 5_000;
/// A node silent this long is forgotten.
const FORGET_AFTER_MS: i64 = 24 * 3600 * 1000;
/// How many round trips a reading of the database's clock that is acted on takes the best of.
const CLOCK_TRIES: usize = 3;
/// A difference from the database's clock from which a node's own clock is called out of step
/// in the log.
const CLOCK_WARN_MS: i64 = 1_000;
/// How long a start tries to read the database's clock before it gives up.
const CLOCK_START_WAIT: Duration = Duration::from_secs(10);

/// This process's identity in the cluster.
#[derive(Debug, Clone)]
pub struct Node {
    /// Random per start: a restarted node is a new node (its old row goes silent).
    pub id: String,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub started_at_ms: i64,
}

impl Node {
    pub fn new(listen: SocketAddr, admin_listen: SocketAddr, clock: &Clock) -> Self {
        let mut bytes = [0u8; 8];
        rand::rng().fill_bytes(&mut bytes);
        Self {
            id: hex::encode(bytes),
            listen,
            admin_listen,
            started_at_ms: clock.now_ms(),
        }
    }
}

/// What the node does about one plugin file this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make the node's live version the cluster's.
    Publish { stem: String, sha256: String },
    /// Write the release's version into the plugins directory.
    Adopt(Release),
}

/// What the sync remembers between ticks.
#[derive(Debug, Default)]
pub struct Memory {
    /// Each file's live sha256 at the last tick; `None` before the first tick.
    seen: Option<BTreeMap<String, String>>,
    /// Each file's release version last adopted (written into the directory).
    adopted: HashMap<String, i64>,
    /// Per file, the versions this node wrote by adopting them that have not gone live here
    /// yet (oldest first, at most [`WRITTEN_KEPT`]): when one does, the node is catching up,
    /// not publishing, even if the cluster has moved on meanwhile.
    written: HashMap<String, Vec<String>>,
}

/// Adopted versions remembered per file until they go live (a few: adoptions are per release).
const WRITTEN_KEPT: usize = 8;

impl Memory {
    /// Whether this node wrote version `sha` of `stem` by adopting it; if so, forgets it and
    /// every adoption of that file before it.
    fn forget_written(&mut self, stem: &str, sha: &str) -> bool {
        let Some(written) = self.written.get_mut(stem) else {
            return false;
        };
        let Some(i) = written.iter().position(|w| w == sha) else {
            return false;
        };
        written.drain(..=i);
        true
    }

    /// Remembers again that this node wrote version `sha` of `stem` by adopting it (its file's
    /// restore, which [`refused_adoptions`] planned, failed: the next tick plans it again).
    fn restore_failed(&mut self, stem: &str, sha: &str) {
        self.written
            .entry(stem.to_owned())
            .or_default()
            .push(sha.to_owned());
    }

    /// Forgets what [`plan`] remembered of `action`, which did not happen (the database away, a
    /// directory not writable), so that the next tick plans it again: a published version is
    /// not yet the one seen (`before`: what was seen before that plan), an adoption not made.
    fn failed(&mut self, action: &Action, before: Option<&BTreeMap<String, String>>) {
        match action {
            Action::Publish { stem, .. } => {
                if let Some(seen) = self.seen.as_mut() {
                    match before.and_then(|before| before.get(stem)) {
                        Some(sha) => seen.insert(stem.clone(), sha.clone()),
                        None => seen.remove(stem),
                    };
                }
            }
            Action::Adopt(release) => {
                self.adopted.remove(&release.stem);
                if let Some(written) = self.written.get_mut(&release.stem)
                    && written.last() == Some(&release.sha256)
                {
                    written.pop();
                }
            }
        }
    }
}

/// The actions for one tick, from the cluster's releases and this node's live versions.
pub fn plan(
    releases: &BTreeMap<String, Release>,
    live: &BTreeMap<String, String>,
    memory: &mut Memory,
) -> Vec<Action> {
    let startup = memory.seen.is_none();
    let seen = memory.seen.take().unwrap_or_default();
    let mut actions = Vec::new();
    let stems: std::collections::BTreeSet<&String> = releases.keys().chain(live.keys()).collect();
    for stem in stems {
        let here = live.get(stem);
        let release = releases.get(stem);
        if let Some(sha) = here
            && Some(sha) == release.map(|r| &r.sha256)
        {
            // Caught up: this version's adoption (and any before it) is done. Remembered, a
            // later drop of the same bytes here would be taken for catching up, and never
            // published.
            memory.forget_written(stem, sha);
            continue;
        }
        // A version this node adopted going live is catching up, even if the release moved on
        // while it loaded (publishing it back would undo the newer release, and two nodes doing
        // so would flip the cluster between versions).
        let changed_here = here.is_some()
            && here != seen.get(stem)
            && !here.is_some_and(|sha| memory.forget_written(stem, sha));
        // Live at the last tick and gone now (its file deleted): the cluster's version is
        // written back and loaded, on whichever node it happens (the nodes that had adopted
        // this release kept it unloaded, the others wrote it back: a cluster split by one
        // `rm`). A plugin leaves a cluster by leaving its configuration.
        if here.is_none() && seen.contains_key(stem) {
            memory.adopted.remove(stem);
        }
        match (here, release) {
            // A version of its own: published, unless the cluster's choice wins (start-up).
            (Some(sha), None) => actions.push(Action::Publish {
                stem: stem.clone(),
                sha256: sha.clone(),
            }),
            (Some(sha), Some(_)) if changed_here && !startup => actions.push(Action::Publish {
                stem: stem.clone(),
                sha256: sha.clone(),
            }),
            (_, Some(release)) => {
                if memory.adopted.get(stem) != Some(&release.version) {
                    memory.adopted.insert(stem.clone(), release.version);
                    let written = memory.written.entry(stem.clone()).or_default();
                    written.push(release.sha256.clone());
                    if written.len() > WRITTEN_KEPT {
                        written.remove(0);
                    }
                    actions.push(Action::Adopt(release.clone()));
                }
            }
            (None, None) => {}
        }
    }
    memory.seen = Some(live.clone());
    actions
}

/// The files whose adopted version this node refused (it does not load here: another per-node
/// limit, a role this node's configuration needs) while another version is live: each with the
/// live version its file must hold again, so that a restart serves what runs now rather than
/// the refused file. Forgets those adoptions (a newer release is still adopted; a restore that
/// fails is remembered again, [`Memory::restore_failed`]).
pub fn refused_adoptions(
    live: &BTreeMap<String, String>,
    memory: &mut Memory,
    refused: impl Fn(&str) -> Option<String>,
) -> Vec<Restore> {
    let stems: Vec<String> = memory.written.keys().cloned().collect();
    let mut restore = Vec::new();
    for stem in stems {
        let (Some(refused), Some(live)) = (refused(&stem), live.get(&stem)) else {
            continue;
        };
        if *live != refused && memory.forget_written(&stem, &refused) {
            restore.push(Restore {
                stem,
                live: live.clone(),
                refused,
            });
        }
    }
    restore
}

/// A file to give back its live version ([`refused_adoptions`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Restore {
    pub stem: String,
    /// The version live here, which the file gets back.
    pub live: String,
    /// The adopted version this node refused, which the file holds now.
    pub refused: String,
}

/// How long start-up waits for the versions [`catch_up`] adopted to compile before it serves
/// anyway (each goes live when built).
const CATCH_UP_WAIT: Duration = Duration::from_secs(30);

/// The node's first sync, run at start-up before it serves a request or claims a delivery: a
/// node that was down through a release (or a rollback) writes the cluster's version into its
/// file and loads it here (the files its configuration uses, several at once, waiting at most
/// [`CATCH_UP_WAIT`]), so it does not run the version it found in its file once the cluster
/// has moved on. A version that does not load here leaves the file's version live, and the
/// next tick gives the file back to it. A sync that fails is retried by [`run`] every tick.
/// Returns what [`run`] goes on from.
pub async fn catch_up(
    node: &Node,
    store: &dyn ClusterStore,
    registry: &Arc<Registry>,
    clock: &Clock,
) -> Memory {
    let mut memory = Memory::default();
    let mut adopted = Vec::new();
    if let Err(e) = tick(node, store, registry, 0, clock, &mut memory, &mut adopted).await {
        tracing::warn!(error = %e, "cluster sync failed at start-up; retrying every second");
    }
    // A release of a file this node's configuration does not use is written, never loaded.
    adopted.retain(|stem| registry.configured(stem));
    // One still compiling when start-up stops waiting goes on, and goes live; a failure is
    // logged by the load and answered by the next tick.
    let loads = registry.spawn_loads(adopted);
    let all = async {
        for load in loads {
            let _ = load.await;
        }
    };
    if tokio::time::timeout(CATCH_UP_WAIT, all).await.is_err() {
        tracing::warn!(
            waited_secs = CATCH_UP_WAIT.as_secs(),
            "plugin versions adopted from the cluster are still compiling; serving meanwhile \
             with the versions found, each replaced once built"
        );
    }
    memory
}

/// Runs the node's heartbeat and plugin sync until `shutdown`. Storage errors (the database
/// away) are logged once per outage and retried each tick.
pub async fn run(
    node: Arc<Node>,
    store: Arc<dyn ClusterStore>,
    registry: Arc<Registry>,
    in_flight: impl Fn() -> u64 + Send + 'static,
    clock: Clock,
    mut memory: Memory,
    shutdown: impl Future<Output = ()>,
) {
    let mut failing = false;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let mut adopted = Vec::new();
        let result = tick(
            &node,
            &*store,
            &registry,
            in_flight(),
            &clock,
            &mut memory,
            &mut adopted,
        )
        .await;
        match (result, failing) {
            (Ok(()), true) => {
                tracing::info!("cluster sync works again");
                failing = false;
            }
            (Err(e), false) => {
                tracing::warn!(error = %e, "cluster sync failed; retrying every second");
                failing = true;
            }
            _ => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    // Stopping: the node leaves the list (attempts it is still draining are recorded as ever).
    // Bounded: a database away does not hold the stop; the row is then forgotten after a day
    // of silence.
    match tokio::time::timeout(Duration::from_secs(2), store.leave(&node.id)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "leaving the cluster's node list failed"),
        Err(_) => tracing::warn!("leaving the cluster's node list took over 2 s; given up"),
    }
}

async fn tick(
    node: &Node,
    store: &dyn ClusterStore,
    registry: &Registry,
    in_flight: u64,
    clock: &Clock,
    memory: &mut Memory,
    adopted: &mut Vec<String>,
) -> anyhow::Result<()> {
    let live: BTreeMap<String, String> = registry
        .statuses()
        .into_iter()
        .filter_map(|(stem, status)| Some((stem, status.sha256?)))
        .collect();
    // A reading that failed or came too slowly leaves the clock as it was (the next tick reads
    // again); the heartbeat and the plugin sync go on, and say so if the database is away.
    if let Err(e) = follow_database_clock(store, clock).await {
        tracing::debug!(error = %format!("{e:#}"), "the database server's clock was not read this tick");
    }
    let now = clock.now_ms();
    store
        .heartbeat(
            NodeBeat {
                id: node.id.clone(),
                listen: node.listen.to_string(),
                admin_listen: node.admin_listen.to_string(),
                started_at_ms: node.started_at_ms,
                at_ms: now,
                in_flight,
                live: live.clone(),
            },
            now - FORGET_AFTER_MS,
        )
        .await?;
    let releases = store
        .releases()
        .await?
        .into_iter()
        // Never written: a name that is not a file in plugins_dir (`../x`, an absolute path)
        // is no release a node published, whoever wrote it in the database.
        .filter(|r| {
            let file = crate::config::is_file_stem(&r.stem);
            if !file {
                static ODD: LazyLock<Repeated> = LazyLock::new(|| {
                    Repeated::new(Level::WARN, "a cluster release names no plugin file")
                });
                if let Some(left_out) = ODD.write() {
                    tracing::warn!(
                        plugin = crate::text::escape(&r.stem).as_ref(),
                        left_out,
                        "a cluster release names no plugin file; ignored"
                    );
                }
            }
            file
        })
        .map(|r| (r.stem.clone(), r))
        .collect();
    let before = memory.seen.clone();
    let mut failed = None;
    for action in plan(&releases, &live, memory) {
        match act(&action, node, store, registry).await {
            Ok(()) => {
                if let Action::Adopt(release) = &action {
                    adopted.push(release.stem.clone());
                }
            }
            Err(e) => {
                // Planned again next tick; the other files' actions go ahead.
                memory.failed(&action, before.as_ref());
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    for restore in refused_adoptions(&live, memory, |stem| registry.refused(stem)) {
        let Restore { stem, live, .. } = &restore;
        let restored = match store.plugin_bytes(live).await {
            // Never published: the refused file stays, as a dropped one would.
            Ok(None) => continue,
            Ok(Some(bytes)) => write_release(registry, stem, live, &bytes).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = restored {
            // Planned again next tick: else the file kept the refused version for good, which
            // a restart then failed to load, running no version of the plugin at all.
            memory.restore_failed(stem, &restore.refused);
            return Err(e);
        }
        tracing::warn!(
            plugin = stem,
            sha256 = live,
            "the cluster's version of this plugin does not load on this node (see its error); \
             its file holds the live version again, so a restart serves it too"
        );
    }
    Ok(())
}

/// Reads the database's clock and makes `clock` follow it (see [`Clock::follow`]): one round
/// trip while the two agree, the best of [`CLOCK_TRIES`] before anything changes; a reading
/// too slow to act on (the first, or the best of the tries) is an error that says so. A change is logged, as a warning when the two
/// clocks are [`CLOCK_WARN_MS`] or more apart.
pub(crate) async fn follow_database_clock(
    store: &dyn ClusterStore,
    clock: &Clock,
) -> anyhow::Result<()> {
    const READING: &str = "reading the database server's clock";
    let reading = store.database_clock(1).await.context(READING)?;
    // A reading too slow to judge by: the next tick reads again (the heartbeat waits for
    // no more round trips).
    if clock.judge(&reading).context(READING)? {
        clock.anchor(reading);
        return Ok(());
    }
    let reading = store.database_clock(CLOCK_TRIES).await.context(READING)?;
    let Some(offset_ms) = clock.follow(reading).context(READING)? else {
        return Ok(());
    };
    let (direction, by_ms) = match offset_ms {
        ..0 => ("ahead of", -offset_ms),
        _ => ("behind", offset_ms),
    };
    if by_ms >= CLOCK_WARN_MS {
        tracing::warn!(
            offset_ms,
            "this machine's clock is {by_ms} ms {direction} the database server's: this node \
             stamps and compares leases, due times and receipt times on the database server's \
             clock meanwhile; fix the time sync (NTP) of whichever of the two is wrong"
        );
    } else {
        tracing::info!(
            offset_ms,
            "this machine's clock is {by_ms} ms {direction} the database server's: following \
             the database server's"
        );
    }
    Ok(())
}

/// Follows the database server's clock before the node claims anything: tries for up to
/// [`CLOCK_START_WAIT`], then fails the start (a node that claimed on a clock it could not check
/// could take back leases still held elsewhere).
pub async fn follow_database_clock_at_start(
    store: &dyn ClusterStore,
    clock: &Clock,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + CLOCK_START_WAIT;
    loop {
        match follow_database_clock(store, clock).await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(e.context(format!(
                    "no usable reading of the database server's clock within {} s; a node \
                     claims nothing before it follows that clock",
                    CLOCK_START_WAIT.as_secs()
                )));
            }
            Err(e) => {
                tracing::warn!(
                    error = %format!("{e:#}"),
                    "could not read the database server's clock at start-up; retrying"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// Carries out one planned action; errors name the plugin.
async fn act(
    action: &Action,
    node: &Node,
    store: &dyn ClusterStore,
    registry: &Registry,
) -> anyhow::Result<()> {
    match action {
        Action::Publish { stem, sha256 } => {
            // A version loaded from a file goes with the bytes it loaded from (the file may hold
            // another version by now); a rollback's version was stored when it was published.
            let bytes = registry
                .live_bytes(stem, sha256)
                .map(|bytes| bytes::Bytes::copy_from_slice(&bytes));
            let release = store
                .publish(stem, sha256, bytes, &node.id)
                .await
                .with_context(|| format!("publishing plugin {stem} version {sha256}"))?;
            tracing::info!(
                plugin = stem,
                sha256,
                version = release.version,
                "plugin published to the cluster"
            );
        }
        Action::Adopt(release) => {
            let Some(bytes) = store.plugin_bytes(&release.sha256).await.with_context(|| {
                format!("reading plugin {} version {}", release.stem, release.sha256)
            })?
            else {
                tracing::error!(
                    plugin = release.stem,
                    sha256 = release.sha256,
                    "the cluster's release has no stored bytes"
                );
                return Ok(());
            };
            if let Err(e) = stored_as_named(&release.stem, &release.sha256, &bytes) {
                // As for bytes missing: tried again for a newer release only (an error would
                // fetch them again every tick, and hold up the other files' restores).
                tracing::error!("{e}");
                return Ok(());
            }
            write_checked(registry, &release.stem, &release.sha256, &bytes).await?;
            tracing::info!(
                plugin = release.stem,
                sha256 = release.sha256,
                node = release.node,
                "plugin adopted from the cluster"
            );
        }
    }
    Ok(())
}

/// Writes version `sha256` of plugin `stem` into its file; the error names both.
pub(crate) async fn write_release(
    registry: &Registry,
    stem: &str,
    sha256: &str,
    bytes: &[u8],
) -> anyhow::Result<()> {
    stored_as_named(stem, sha256, bytes)?;
    write_checked(registry, stem, sha256, bytes).await
}

/// [`write_release`] of bytes already checked against `sha256` ([`stored_as_named`]).
async fn write_checked(
    registry: &Registry,
    stem: &str,
    sha256: &str,
    bytes: &[u8],
) -> anyhow::Result<()> {
    let path = registry.path_of(stem);
    write_atomically(&path, bytes).await.with_context(|| {
        format!(
            "writing plugin {stem} version {sha256} to {}",
            path.display()
        )
    })
}

/// Refuses bytes read from the database for version `sha256` of plugin `stem` that hash to
/// another version: every writer of a release into `plugins_dir` checks them.
fn stored_as_named(stem: &str, sha256: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let found = crate::runtime::file_sha256(bytes);
    anyhow::ensure!(
        found == sha256,
        "the cluster's stored bytes of plugin {stem} version {sha256} hash to {found}: not written"
    );
    Ok(())
}

/// Replaces `path` with `bytes` in one rename, so the reloader never reads half a file.
async fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    // A new file, never one found under that name (a symbolic link there would be followed).
    let _ = tokio::fs::remove_file(&tmp).await;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .await?;
    tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await?;
    drop(file);
    tokio::fs::rename(&tmp, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(stem: &str, sha: &str, version: i64) -> (String, Release) {
        (
            stem.to_owned(),
            Release {
                stem: stem.to_owned(),
                sha256: sha.to_owned(),
                version,
                node: "other".to_owned(),
                previous: Vec::new(),
            },
        )
    }

    fn live(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(stem, sha)| ((*stem).to_owned(), (*sha).to_owned()))
            .collect()
    }

    fn publish(stem: &str, sha: &str) -> Action {
        Action::Publish {
            stem: stem.into(),
            sha256: sha.into(),
        }
    }

    #[test]
    fn at_start_up_the_cluster_wins_and_files_without_a_release_are_published() {
        let releases = BTreeMap::from([release("h", "new", 3)]);
        let mut memory = Memory::default();
        let actions = plan(
            &releases,
            &live(&[("h", "old"), ("p", "mine")]),
            &mut memory,
        );
        assert_eq!(
            actions,
            [Action::Adopt(releases["h"].clone()), publish("p", "mine")]
        );
    }

    #[test]
    fn a_version_that_went_live_here_is_published() {
        let releases = BTreeMap::from([release("h", "a", 1)]);
        let mut memory = Memory::default();
        assert!(plan(&releases, &live(&[("h", "a")]), &mut memory).is_empty());
        // A dropped file (or a rollback) made "b" live here.
        let actions = plan(&releases, &live(&[("h", "b")]), &mut memory);
        assert_eq!(actions, [publish("h", "b")]);
    }

    #[test]
    fn a_new_release_is_adopted_once_even_if_it_does_not_load_here() {
        let mut memory = Memory::default();
        let before = BTreeMap::from([release("h", "a", 1)]);
        assert!(plan(&before, &live(&[("h", "a")]), &mut memory).is_empty());
        let after = BTreeMap::from([release("h", "b", 2)]);
        assert_eq!(
            plan(&after, &live(&[("h", "a")]), &mut memory),
            [Action::Adopt(after["h"].clone())]
        );
        // "b" failed to load here: "a" stays live, and is neither published nor re-adopted.
        assert!(plan(&after, &live(&[("h", "a")]), &mut memory).is_empty());
        let newer = BTreeMap::from([release("h", "c", 3)]);
        assert_eq!(
            plan(&newer, &live(&[("h", "a")]), &mut memory),
            [Action::Adopt(newer["h"].clone())]
        );
    }

    /// Node 3 adopts "a", then "b", each going live as the release; then "a" is dropped into
    /// its directory again: a deploy of its own, published. Before, the adoption of "a" was
    /// still remembered, so "a" going live again was taken for catching up: node 3 ran "a"
    /// while the others stayed on "b".
    #[test]
    fn a_version_once_adopted_and_dropped_again_later_is_published() {
        let mut memory = Memory::default();
        let x = BTreeMap::from([release("h", "x", 1)]);
        assert!(plan(&x, &live(&[("h", "x")]), &mut memory).is_empty());
        for (sha, version) in [("a", 2), ("b", 3)] {
            let published = BTreeMap::from([release("h", sha, version)]);
            let before = memory.seen.as_ref().unwrap()["h"].clone();
            assert_eq!(
                plan(&published, &live(&[("h", &before)]), &mut memory),
                [Action::Adopt(published["h"].clone())]
            );
            assert!(plan(&published, &live(&[("h", sha)]), &mut memory).is_empty());
        }
        // Now "a" is dropped here.
        let b = BTreeMap::from([release("h", "b", 3)]);
        assert_eq!(
            plan(&b, &live(&[("h", "a")]), &mut memory),
            [publish("h", "a")]
        );
    }

    #[test]
    fn an_adopted_version_going_live_is_not_published_back() {
        let mut memory = Memory::default();
        let releases = BTreeMap::from([release("h", "b", 2)]);
        plan(&releases, &live(&[("h", "a")]), &mut memory);
        assert!(plan(&releases, &live(&[("h", "b")]), &mut memory).is_empty());
    }

    /// Node A adopts release 1 ("x"); before "x" loads here, node B publishes release 2 ("y"),
    /// which A adopts too. "x" going live on A is A catching up, not a change to publish: before,
    /// A published "x" back as release 3, B then did the same with "y", and the cluster flipped
    /// between the two versions, losing files dropped meanwhile.
    #[test]
    fn an_adopted_version_that_goes_live_after_the_release_moved_on_is_not_published() {
        let mut memory = Memory::default();
        let first = BTreeMap::from([release("h", "old", 0)]);
        assert!(plan(&first, &live(&[("h", "old")]), &mut memory).is_empty());
        let x = BTreeMap::from([release("h", "x", 1)]);
        assert_eq!(
            plan(&x, &live(&[("h", "old")]), &mut memory),
            [Action::Adopt(x["h"].clone())]
        );
        let y = BTreeMap::from([release("h", "y", 2)]);
        assert_eq!(
            plan(&y, &live(&[("h", "old")]), &mut memory),
            [Action::Adopt(y["h"].clone())]
        );
        // "x" loads first, then "y": neither is published, and nothing is adopted again.
        assert!(plan(&y, &live(&[("h", "x")]), &mut memory).is_empty());
        assert!(plan(&y, &live(&[("h", "y")]), &mut memory).is_empty());
        // A file dropped here afterwards is published, even one holding "x" again.
        assert_eq!(
            plan(&y, &live(&[("h", "x")]), &mut memory),
            [publish("h", "x")]
        );
    }

    /// The cluster's "b" is refused here (a node's own compile limit, say): the file gets the
    /// live "a" back, once; a newer release is adopted as usual.
    #[test]
    fn an_adopted_version_refused_here_gives_the_file_back_to_the_live_one() {
        let mut memory = Memory::default();
        let first = BTreeMap::from([release("h", "a", 1)]);
        plan(&first, &live(&[("h", "a")]), &mut memory);
        let second = BTreeMap::from([release("h", "b", 2)]);
        plan(&second, &live(&[("h", "a")]), &mut memory);
        let here = live(&[("h", "a")]);
        // Still compiling: nothing refused yet.
        assert!(refused_adoptions(&here, &mut memory, |_| None).is_empty());
        let refused = |_: &str| Some("b".to_owned());
        let restore = refused_adoptions(&here, &mut memory, refused);
        let a_for_b = Restore {
            stem: "h".to_owned(),
            live: "a".to_owned(),
            refused: "b".to_owned(),
        };
        assert_eq!(restore, [a_for_b]);
        // A restore that failed (the database away, the directory not writable) is planned
        // again at the next tick; one done is not.
        memory.restore_failed("h", "b");
        let again = refused_adoptions(&here, &mut memory, refused);
        assert_eq!(again.len(), 1, "{again:?}");
        assert!(refused_adoptions(&here, &mut memory, refused).is_empty());
        assert!(plan(&second, &here, &mut memory).is_empty());
        let third = BTreeMap::from([release("h", "c", 3)]);
        assert_eq!(
            plan(&third, &here, &mut memory),
            [Action::Adopt(third["h"].clone())]
        );
    }

    /// A file deleted on a node is written back with the cluster's version, whether this node
    /// adopted that release or published it (before, only a node that had not adopted it wrote
    /// it back).
    #[test]
    fn a_deleted_file_gets_the_clusters_version_back_on_every_node() {
        let releases = BTreeMap::from([release("h", "b", 2)]);
        // Adopted here (the file was written from the release), then live.
        let mut adopter = Memory::default();
        plan(&BTreeMap::new(), &live(&[("h", "a")]), &mut adopter);
        assert_eq!(
            plan(&releases, &live(&[("h", "a")]), &mut adopter),
            [Action::Adopt(releases["h"].clone())]
        );
        assert!(plan(&releases, &live(&[("h", "b")]), &mut adopter).is_empty());
        // Published here: it never adopted the release.
        let mut publisher = Memory::default();
        assert!(plan(&releases, &live(&[("h", "b")]), &mut publisher).is_empty());
        for memory in [&mut adopter, &mut publisher] {
            assert_eq!(
                plan(&releases, &live(&[]), memory),
                [Action::Adopt(releases["h"].clone())]
            );
            // Once, while the write and the load are under way.
            assert!(plan(&releases, &live(&[]), memory).is_empty());
        }
    }

    /// A publish or an adoption that failed (the database away, a directory not writable) is
    /// planned again, not taken as done: before, the next round saw the failed publish's
    /// version as old news and adopted the cluster's older release over it, and a failed
    /// adoption was never written.
    #[test]
    fn a_failed_action_is_planned_again() {
        let mut memory = Memory::default();
        let releases = BTreeMap::from([release("h", "a", 1)]);
        assert!(plan(&releases, &live(&[("h", "a")]), &mut memory).is_empty());
        let before = memory.seen.clone();
        let actions = plan(&releases, &live(&[("h", "b")]), &mut memory);
        assert_eq!(actions, [publish("h", "b")]);
        memory.failed(&actions[0], before.as_ref());
        assert_eq!(
            plan(&releases, &live(&[("h", "b")]), &mut memory),
            [publish("h", "b")]
        );

        let newer = BTreeMap::from([release("h", "c", 2)]);
        let before = memory.seen.clone();
        let actions = plan(&newer, &live(&[("h", "b")]), &mut memory);
        assert_eq!(actions, [Action::Adopt(newer["h"].clone())]);
        memory.failed(&actions[0], before.as_ref());
        assert_eq!(
            plan(&newer, &live(&[("h", "b")]), &mut memory),
            [Action::Adopt(newer["h"].clone())]
        );
        // Written this time, it goes live as a catch-up, not as a change to publish.
        assert!(plan(&newer, &live(&[("h", "c")]), &mut memory).is_empty());
    }

    #[test]
    fn a_file_missing_here_is_adopted() {
        let releases = BTreeMap::from([release("h", "a", 1)]);
        let actions = plan(&releases, &live(&[]), &mut Memory::default());
        assert_eq!(actions, [Action::Adopt(releases["h"].clone())]);
    }
}
