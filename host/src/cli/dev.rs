//! `hookd dev`: build the example plugin crates to wasm, place them in `plugins_dir`, serve, and
//! rebuild when their sources change (the running host then hot-swaps the new build).
//!
//! Invariants: it runs the same `cargo build --release --target wasm32-wasip2` a user would and
//! copies only the built `.wasm` files, each by copy + rename so the host never sees half a
//! file; serving is exactly `hookd serve`; a failed rebuild is reported and changes nothing
//! (the running versions stay).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context, bail};
use clap::Args;

use crate::config::Config;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// The configuration file (relative paths in it are relative to its directory).
    #[arg(long, short, default_value = "hookd.toml")]
    pub config: PathBuf,
    /// Plugin crates (workspace packages) to build [default: every crate in the workspace's
    /// `plugins/` directory].
    #[arg(long = "plugin", short = 'p')]
    pub plugins: Vec<String>,
    /// Serve without building first (and without watching the sources).
    #[arg(long)]
    pub no_build: bool,
    /// Build once, but do not rebuild when the sources change.
    #[arg(long)]
    pub no_watch: bool,
}

/// How long the sources must be quiet before a rebuild starts (an editor saves several files).
const QUIET: Duration = Duration::from_millis(300);

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    if !args.no_build {
        let root = workspace_root(&args.config)?;
        let dest = config.server.plugins_dir.clone();
        let packages = if args.plugins.is_empty() {
            let examples = root.join("plugins");
            super::plugin_dirs::crates_in(&examples)
                .with_context(|| format!("listing the plugin crates in {}", examples.display()))?
        } else {
            args.plugins
        };
        build_plugins(&root, &packages, &dest)?;
        if !args.no_watch {
            let sources = source_dirs(&root, &packages)?;
            let watcher = watch_sources(&sources)?;
            std::thread::Builder::new()
                .name("dev-rebuild".into())
                .spawn(move || rebuild_loop(watcher, &sources, &root, &packages, &dest))
                .context("starting the rebuild watcher")?;
        }
    }
    super::serve(args.config)
}

/// The directories whose changes call for a rebuild: each plugin crate's, plus the SDK and the
/// WIT contract when the workspace has them.
fn source_dirs(root: &Path, packages: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed in {}: {}",
            root.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("reading cargo metadata")?;
    let mut dirs = BTreeSet::new();
    for package in packages {
        let manifest = metadata["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == package.as_str())
            .and_then(|p| p["manifest_path"].as_str())
            .with_context(|| {
                format!(
                    "{package} is not a package of the workspace {}",
                    root.display()
                )
            })?;
        let dir = Path::new(manifest).parent().unwrap_or(root);
        dirs.insert(dir.to_owned());
    }
    for shared in ["plugin-sdk", "wit"] {
        let dir = root.join(shared);
        if dir.is_dir() {
            dirs.insert(dir);
        }
    }
    Ok(dirs.into_iter().collect())
}

type SourceEvents = mpsc::Receiver<notify::Result<notify::Event>>;

/// Watches `dirs` recursively.
fn watch_sources(dirs: &[PathBuf]) -> anyhow::Result<(notify::RecommendedWatcher, SourceEvents)> {
    use notify::Watcher as _;
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(tx).context("creating a file watcher")?;
    for dir in dirs {
        watcher
            .watch(dir, notify::RecursiveMode::Recursive)
            .with_context(|| format!("watching {}", dir.display()))?;
    }
    tracing::info!(
        ?dirs,
        "watching plugin sources; a change rebuilds and hot-swaps"
    );
    Ok((watcher, rx))
}

/// Whether a change to `path` (in one of the watched `dirs`) can change a plugin build: Rust
/// sources, WIT files, manifests and lock files, outside build output and hidden directories.
fn is_source(path: &Path, dirs: &[PathBuf]) -> bool {
    let Some(inside) = dirs.iter().find_map(|dir| path.strip_prefix(dir).ok()) else {
        return false;
    };
    if inside
        .components()
        .any(|c| c.as_os_str() == "target" || c.as_os_str().to_string_lossy().starts_with('.'))
    {
        return false;
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".rs") || name.ends_with(".wit") || name == "Cargo.toml" || name == "Cargo.lock"
}

/// Rebuilds after each burst of source changes, until the watcher goes away.
fn rebuild_loop(
    (_watcher, events): (notify::RecommendedWatcher, SourceEvents),
    dirs: &[PathBuf],
    root: &Path,
    packages: &[String],
    dest: &Path,
) {
    let relevant = |event: &notify::Result<notify::Event>| match event {
        Ok(event) => {
            !matches!(event.kind, notify::EventKind::Access(_))
                && event.paths.iter().any(|p| is_source(p, dirs))
        }
        Err(_) => true,
    };
    while let Ok(event) = events.recv() {
        if !relevant(&event) {
            continue;
        }
        // Wait for the burst to end.
        loop {
            match events.recv_timeout(QUIET) {
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        tracing::info!("plugin sources changed; rebuilding");
        if let Err(e) = build_plugins(root, packages, dest) {
            tracing::error!("rebuild failed; the running plugins stay: {e:#}");
        }
    }
}

/// The cargo workspace the config file lives in (where the plugin crates are).
fn workspace_root(config: &Path) -> anyhow::Result<PathBuf> {
    let start = config
        .canonicalize()
        .with_context(|| format!("resolving {}", config.display()))?;
    for dir in start.ancestors().skip(1) {
        let manifest = dir.join("Cargo.toml");
        if std::fs::read_to_string(&manifest).is_ok_and(|text| text.contains("[workspace]")) {
            return Ok(dir.to_owned());
        }
    }
    bail!(
        "no cargo workspace found above {}: `hookd dev` builds plugin crates from one",
        start.display()
    )
}

/// Builds `packages` for wasm32-wasip2 (release) and copies each `<name>.wasm` into `dest`.
pub fn build_plugins(root: &Path, packages: &[String], dest: &Path) -> anyhow::Result<()> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    super::wasm_target::ensure(Path::new(&rustc), root).map_err(anyhow::Error::msg)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(root)
        .args(["build", "--release", "--target", super::wasm_target::TARGET]);
    for package in packages {
        command.args(["-p", package]);
    }
    tracing::info!(?packages, "building plugins");
    let status = command.status().context("running cargo")?;
    if !status.success() {
        bail!("building the plugin crates failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let built = target.join(super::wasm_target::TARGET).join("release");
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    for package in packages {
        let file = format!("{}.wasm", package.replace('-', "_"));
        let from = built.join(&file);
        // Copy then rename, so the watcher never sees a half-written plugin; an unchanged build
        // is left alone (nothing to reload).
        let to = dest.join(format!("{package}.wasm"));
        if std::fs::read(&to).ok()
            == Some(std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?)
        {
            continue;
        }
        let tmp = dest.join(format!(".{package}.wasm.tmp"));
        std::fs::copy(&from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
        std::fs::rename(&tmp, &to).with_context(|| format!("placing {}", to.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sources_outside_build_output_trigger_a_rebuild() {
        let dirs = [
            PathBuf::from("/tmp/.tmpX/ws"),
            PathBuf::from("/src/hookd/wit"),
        ];
        let cases = [
            ("/tmp/.tmpX/ws/src/lib.rs", true),
            ("/tmp/.tmpX/ws/Cargo.toml", true),
            ("/tmp/.tmpX/ws/Cargo.lock", true),
            ("/src/hookd/wit/plugin.wit", true),
            ("/tmp/.tmpX/ws/target/release/build/x.rs", false),
            ("/tmp/.tmpX/ws/.git/index", false),
            ("/tmp/.tmpX/ws/.hookd-cache/abc.cwasm", false),
            ("/tmp/.tmpX/ws/plugins/p.wasm", false),
            ("/tmp/.tmpX/ws/hookd.db-wal", false),
            ("/tmp/.tmpX/ws/src/.lib.rs.swp", false),
            ("/elsewhere/lib.rs", false),
        ];
        for (path, expected) in cases {
            assert_eq!(is_source(Path::new(path), &dirs), expected, "{path}");
        }
    }
}
