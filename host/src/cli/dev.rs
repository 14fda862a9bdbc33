//! `hookd dev`: build plugin crates to wasm, place them in `plugins_dir`, serve, and rebuild
//! when their sources change (the running host then hot-swaps the new build).
//!
//! The crates are those of the cargo workspace that `cargo locate-project --workspace` finds
//! from the config file's directory (or `--manifest-path`): in hookd's own checkout the example
//! plugins in `plugins/`; in a standalone plugin crate (`hookd new`, with its own `[workspace]`)
//! that crate.
//!
//! Plugins with a `build` command in the config (JavaScript, Python) are built by running it
//! (`super::build_command`); then cargo builds only the crates `-p` or `--manifest-path` name,
//! or the root crate of a standalone plugin crate.
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

use super::build_command;
use crate::config::Config;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// The configuration file (relative paths in it are relative to its directory).
    #[arg(long, short, default_value = "hookd.toml")]
    pub config: PathBuf,
    /// The Cargo.toml of the plugin crate or workspace to build [default: the workspace cargo
    /// finds from the config file's directory].
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// Plugin crates (workspace packages) to build [default: the workspace's root package when
    /// it is a `cdylib` (a standalone plugin crate), else every crate in its `plugins/`
    /// directory].
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
        let dest = config.server.plugins_dir.clone();
        let commands = build_command::declared(&config)?;
        let config_file = args
            .config
            .canonicalize()
            .with_context(|| format!("resolving {}", args.config.display()))?;
        let config_dir = config_file.parent().unwrap_or(Path::new("/")).to_owned();
        let cargo_named =
            commands.is_empty() || args.manifest_path.is_some() || !args.plugins.is_empty();
        let cargo = if cargo_named {
            Some(Workspace::locate(
                &args.config,
                args.manifest_path.as_deref(),
            )?)
        } else {
            // Only a standalone plugin crate's own root crate besides the command builds: its
            // root is the config's own directory (cargo also finds a crate in a parent
            // directory, another project, which was built and watched too).
            Workspace::locate(&args.config, None)
                .ok()
                .filter(|w| w.is_plugin_crate_in(&config_dir))
        };
        let cargo = match cargo {
            Some(workspace) => {
                let packages = if args.plugins.is_empty() {
                    workspace.default_plugins()?
                } else {
                    args.plugins
                };
                let sources = workspace.source_dirs(&packages)?;
                workspace.build_plugins(&packages, &dest, &|_| false)?;
                Some((workspace, packages, sources))
            }
            None => None,
        };
        build_command::build_all(&commands, &config_dir, &dest)?;
        if !args.no_watch {
            let skip = not_sources(&config_file, &config);
            let mut dirs: Vec<PathBuf> = cargo
                .as_ref()
                .map(|(_, _, sources)| sources.clone())
                .unwrap_or_default();
            if !commands.is_empty() {
                dirs.push(config_dir.clone());
            }
            let watcher = watch_sources(&dirs)?;
            let builds = Builds {
                cargo,
                commands,
                config_dir,
                skip,
                dest,
            };
            std::thread::Builder::new()
                .name("dev-rebuild".into())
                .spawn(move || rebuild_loop(watcher, &builds))
                .context("starting the rebuild watcher")?;
        }
    }
    super::serve(args.config)
}

/// What no change under the config's directory rebuilds for: what hookd itself writes there
/// (relative paths in the config are the config's: its plugins, its cache, an SQLite database
/// of any name with the files beside it and its generated admin token), and the configuration
/// file, which a rebuild would not apply (it takes a restart of `hookd dev`).
fn not_sources(config_file: &Path, config: &Config) -> Vec<PathBuf> {
    let dir = config_file.parent().unwrap_or(Path::new("/"));
    let mut skip = vec![
        dir.join(&config.server.plugins_dir),
        dir.join(&config.server.cache_dir),
        dir.join("target"),
        config_file.to_owned(),
    ];
    if let Some(database) = config.server.database.sqlite_path() {
        let database = dir.join(database);
        skip.push(crate::admin::token::token_file(&database));
        skip.extend(crate::inbox::sqlite_files(&database));
    }
    skip
}

/// What `hookd dev` rebuilds when its sources change.
struct Builds {
    /// The cargo workspace, its plugin packages and their source directories.
    cargo: Option<(Workspace, Vec<String>, Vec<PathBuf>)>,
    commands: Vec<build_command::CommandBuild>,
    /// Where the commands run, and whose changes rerun them.
    config_dir: PathBuf,
    /// What hookd writes under `config_dir` (never a reason to rebuild).
    skip: Vec<PathBuf>,
    dest: PathBuf,
}

impl Builds {
    /// Rebuilds what the changed `paths` call for (`None`: everything, as the watcher may
    /// have missed changes; then only the builds that changed are placed, since no plugin is
    /// known to have been edited).
    fn rebuild(&self, paths: Option<&[PathBuf]>) {
        let touched = |is: &dyn Fn(&Path) -> bool| paths.is_none_or(|p| p.iter().any(|p| is(p)));
        if let Some((workspace, packages, sources)) = &self.cargo
            && touched(&|p| is_source(p, sources))
        {
            tracing::info!("plugin sources changed; rebuilding the crates");
            // A package whose own directory changed is placed even if its build is the file
            // byte for byte (after a rollback, saving it must make the file's version live
            // again); the others only when their build changed, so a rollback of a plugin
            // nobody touched stays.
            let edited = |package: &str| {
                paths.is_some_and(|paths| paths.iter().any(|p| workspace.owner(p) == Some(package)))
            };
            if let Err(e) = workspace.build_plugins(packages, &self.dest, &edited) {
                tracing::error!("rebuild failed; the running plugins stay: {e:#}");
            }
        }
        let changed = |p: &Path| build_command::is_source(p, &self.config_dir, &self.skip);
        if !self.commands.is_empty() && touched(&changed) {
            let path = paths.and_then(|p| p.iter().find(|p| changed(p)));
            tracing::info!(
                changed = %path.map_or("(unknown: the watcher lost events)".into(), |p| p
                    .display()
                    .to_string()),
                "plugin sources changed; running the build commands"
            );
            if let Err(e) = build_command::build_all(&self.commands, &self.config_dir, &self.dest) {
                tracing::error!("rebuild failed; the running plugins stay: {e:#}");
            }
        }
    }
}

/// The cargo workspace the plugin crates are built in, as `cargo metadata` describes it.
#[derive(Debug)]
struct Workspace {
    /// The workspace's `Cargo.toml`.
    manifest: PathBuf,
    /// Its directory.
    root: PathBuf,
    /// Where cargo puts its builds (`CARGO_TARGET_DIR` and cargo's config included).
    target_dir: PathBuf,
    members: Vec<Member>,
}

/// One package of the workspace.
#[derive(Debug)]
struct Member {
    name: String,
    /// Cargo's package ID spec of it (`path+file:///…#name@version`): unlike the name, never
    /// ambiguous, even for a plugin named as one of its dependencies (`serde`).
    id: String,
    dir: PathBuf,
    /// Its `cdylib` target's name, which names the built file (`<lib>.wasm`): the package's
    /// name with `-` as `_`, unless its `[lib] name` says otherwise. `None`: not a plugin crate.
    cdylib: Option<String>,
    /// The directories of its path dependencies (such as `plugin-sdk`).
    path_deps: Vec<PathBuf>,
}

impl Workspace {
    /// Whether this is a standalone plugin crate (its root package a `cdylib`) whose root is
    /// `dir`.
    fn is_plugin_crate_in(&self, dir: &Path) -> bool {
        let root = self
            .root
            .canonicalize()
            .unwrap_or_else(|_| self.root.clone());
        root == dir
            && self
                .members
                .iter()
                .any(|m| m.dir == self.root && m.cdylib.is_some())
    }

    /// The workspace of `manifest_path` if given, else the one cargo finds from the directory of
    /// `config`.
    fn locate(config: &Path, manifest_path: Option<&Path>) -> anyhow::Result<Workspace> {
        let mut locate = cargo();
        locate.args(["locate-project", "--workspace", "--message-format", "plain"]);
        let from = match manifest_path {
            Some(manifest) => {
                locate.arg("--manifest-path").arg(manifest);
                format!("--manifest-path {}", manifest.display())
            }
            None => {
                let config = config
                    .canonicalize()
                    .with_context(|| format!("resolving {}", config.display()))?;
                let dir = config.parent().unwrap_or(Path::new("/")).to_owned();
                locate.current_dir(&dir);
                format!("{} (the directory of the config file)", dir.display())
            }
        };
        let located = run_cargo(&mut locate).with_context(|| {
            format!(
                "no cargo workspace found from {from}: `hookd dev` builds plugin crates; run it \
                 in a plugin crate (`hookd new handler NAME` makes one) or pass --manifest-path"
            )
        })?;
        let manifest = PathBuf::from(String::from_utf8_lossy(&located).trim());
        let metadata = run_cargo(
            cargo()
                .args([
                    "metadata",
                    "--no-deps",
                    "--format-version",
                    "1",
                    "--manifest-path",
                ])
                .arg(&manifest),
        )?;
        let metadata: serde_json::Value = serde_json::from_slice(&metadata)
            .with_context(|| format!("reading cargo metadata of {}", manifest.display()))?;
        let path = |key: &str| {
            metadata[key]
                .as_str()
                .map(PathBuf::from)
                .with_context(|| format!("cargo metadata of {} has no {key}", manifest.display()))
        };
        let (root, target_dir) = (path("workspace_root")?, path("target_directory")?);
        let members = metadata["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let dir = Path::new(p["manifest_path"].as_str()?).parent()?.to_owned();
                let cdylib = p["targets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| {
                        t["crate_types"]
                            .as_array()
                            .is_some_and(|types| types.iter().any(|c| c == "cdylib"))
                    })
                    .and_then(|t| t["name"].as_str().map(str::to_owned));
                let path_deps = p["dependencies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["path"].as_str().map(PathBuf::from))
                    .collect();
                Some(Member {
                    name: p["name"].as_str()?.to_owned(),
                    id: p["id"].as_str()?.to_owned(),
                    dir,
                    cdylib,
                    path_deps,
                })
            })
            .collect();
        Ok(Workspace {
            manifest,
            root,
            target_dir,
            members,
        })
    }

    /// The packages to build when none are named: the root package if it is a `cdylib` (a
    /// standalone plugin crate), else those of the `cdylib` crates in the workspace's
    /// `plugins/` directory (by package name, whatever their directories are called).
    fn default_plugins(&self) -> anyhow::Result<Vec<String>> {
        if let Some(root) = self
            .members
            .iter()
            .find(|m| m.dir == self.root && m.cdylib.is_some())
        {
            return Ok(vec![root.name.clone()]);
        }
        let examples = self.root.join("plugins");
        let dirs = super::plugin_dirs::crates_in(&examples).with_context(|| {
            format!(
                "{} is not a plugin crate (no cdylib package at its root), so `hookd dev` \
                 builds the crates in {}, which cannot be listed; pass --manifest-path or -p",
                self.manifest.display(),
                examples.display()
            )
        })?;
        let mut packages = Vec::new();
        for dir in dirs {
            let dir = examples.join(dir);
            let member = self
                .members
                .iter()
                .find(|m| m.dir == dir)
                .with_context(|| {
                    format!(
                        "{} has a Cargo.toml but is not a package of the workspace {} (add it to \
                     its `members`, or pass -p for the plugins to build)",
                        dir.display(),
                        self.manifest.display()
                    )
                })?;
            // A library the plugins share builds no plugin of its own (its changes rebuild
            // those that depend on it).
            if member.cdylib.is_some() {
                packages.push(member.name.clone());
            }
        }
        Ok(packages)
    }

    /// The directories whose changes call for a rebuild: each plugin crate's and those of its
    /// path dependencies (the SDK, when it is one).
    fn source_dirs(&self, packages: &[String]) -> anyhow::Result<Vec<PathBuf>> {
        let mut dirs = BTreeSet::new();
        for package in packages {
            let member = self
                .members
                .iter()
                .find(|m| &m.name == package)
                .with_context(|| {
                    format!(
                        "{package} is not a package of the workspace {}",
                        self.manifest.display()
                    )
                })?;
            dirs.insert(member.dir.clone());
            dirs.extend(member.path_deps.iter().cloned());
        }
        Ok(dirs.into_iter().collect())
    }

    /// The member whose own source `path` is: of the members whose directory holds it (a root
    /// crate's holds the others'), the innermost.
    fn owner(&self, path: &Path) -> Option<&str> {
        self.members
            .iter()
            .filter(|m| is_source(path, std::slice::from_ref(&m.dir)))
            .max_by_key(|m| m.dir.components().count())
            .map(|m| m.name.as_str())
    }

    /// What names `package` to `cargo build -p`: its package ID spec when it is a member (a
    /// plugin named like a crate it depends on is ambiguous by name), else the name as given.
    fn package_spec<'a>(&'a self, package: &'a str) -> &'a str {
        self.members
            .iter()
            .find(|m| m.name == package)
            .map_or(package, |m| m.id.as_str())
    }

    /// Builds `packages` for wasm32-wasip2 (release) and copies each `<name>.wasm` into `dest`
    /// whose build differs from the file there, or that `edited` names.
    fn build_plugins(
        &self,
        packages: &[String],
        dest: &Path,
        edited: &dyn Fn(&str) -> bool,
    ) -> anyhow::Result<()> {
        // Known before the build, so a crate that builds no plugin changes nothing.
        let libs = packages
            .iter()
            .map(|package| self.lib_name(package))
            .collect::<anyhow::Result<Vec<String>>>()?;
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        super::wasm_target::ensure(Path::new(&rustc), &self.root).map_err(anyhow::Error::msg)?;
        let mut command = cargo();
        command
            .current_dir(&self.root)
            .args(["build", "--release", "--target", super::wasm_target::TARGET])
            .arg("--manifest-path")
            .arg(&self.manifest);
        for package in packages {
            command.args(["-p", self.package_spec(package)]);
        }
        tracing::info!(?packages, workspace = %self.manifest.display(), "building plugins");
        let status = command.status().context("running cargo")?;
        if !status.success() {
            bail!(
                "building the plugin crates of {} failed ({status})",
                self.manifest.display()
            );
        }
        let built = self
            .target_dir
            .join(super::wasm_target::TARGET)
            .join("release");
        std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        for (package, lib) in packages.iter().zip(&libs) {
            place(&built, dest, lib, package, edited(package))?;
        }
        Ok(())
    }

    /// The name of `package`'s built file (`<lib>.wasm`): its `cdylib` target's, with `-` as
    /// `_` (as rustc names the file; cargo before 1.79 reported the name unchanged).
    fn lib_name(&self, package: &str) -> anyhow::Result<String> {
        let member = self.members.iter().find(|m| m.name == package);
        let lib = member.and_then(|m| m.cdylib.as_deref()).with_context(|| {
            format!(
                "{package} is no plugin crate: it has no cdylib target (add `[lib] crate-type \
                 = [\"cdylib\"]` to its Cargo.toml, or leave it out with -p)"
            )
        })?;
        Ok(lib.replace('-', "_"))
    }
}

/// Copies `package`'s build (`<lib>.wasm` in `built`) into `dest` as `<package>.wasm`: copy then
/// rename, so the watcher never sees a half-written plugin. A build that is the file byte for byte is left
/// alone unless `always` (its sources were edited: after a rollback the version live is not the
/// file's, and Rust builds are reproducible, so saving must place it again; a file that is the
/// live version already loads as a no-op).
fn place(built: &Path, dest: &Path, lib: &str, package: &str, always: bool) -> anyhow::Result<()> {
    let from = built.join(format!("{lib}.wasm"));
    let to = dest.join(format!("{package}.wasm"));
    let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
    if !always && std::fs::read(&to).is_ok_and(|placed| placed == bytes) {
        return Ok(());
    }
    let tmp = dest.join(format!(".{package}.wasm.tmp"));
    // A new file, never one found there: a symbolic link planted under this name was followed
    // and the file it led to overwritten.
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut file| std::io::Write::write_all(&mut file, &bytes))
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    std::fs::rename(&tmp, &to).with_context(|| format!("placing {}", to.display()))?;
    Ok(())
}

/// `cargo`: the one running this hookd (`CARGO`) or the one on the `PATH`.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a cargo command that prints to stdout; its stdout, or an error with its stderr.
fn run_cargo(command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let output = command.output().context("running cargo")?;
    if !output.status.success() {
        bail!(
            "{:?} failed ({}): {}",
            command,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
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
fn rebuild_loop((_watcher, events): (notify::RecommendedWatcher, SourceEvents), builds: &Builds) {
    // The paths an event names (none for an access, or for a watcher error or overflow: then
    // every build runs, as something may have been missed, and places what changed).
    let changed = |event: notify::Result<notify::Event>| match event {
        Ok(event) if matches!(event.kind, notify::EventKind::Access(_)) => Some(Vec::new()),
        // The watcher's queue overflowed: changes were lost.
        Ok(event) if event.need_rescan() => None,
        Ok(event) => Some(event.paths),
        Err(_) => None,
    };
    while let Ok(event) = events.recv() {
        let mut paths = match changed(event) {
            Some(paths) if paths.is_empty() => continue,
            other => other,
        };
        // Wait for the burst to end, gathering what it touched.
        loop {
            match events.recv_timeout(QUIET) {
                Ok(event) => match (&mut paths, changed(event)) {
                    (Some(paths), Some(more)) => paths.extend(more),
                    (paths, _) => *paths = None,
                },
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        builds.rebuild(paths.as_deref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build whose bytes are the file's is left alone, unless its sources were edited: then
    /// it is placed all the same (a new file renamed in, which the watcher sees), so saving
    /// after a rollback makes the file's version live again, while a rollback of a plugin
    /// nobody touched stays.
    #[test]
    fn an_unchanged_build_is_placed_again_only_when_its_sources_were_edited() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (built, dest) = (dir.path().join("built"), dir.path().join("plugins"));
        std::fs::create_dir_all(&built).unwrap();
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::write(built.join("my_plugin.wasm"), b"same bytes").unwrap();
        place(&built, &dest, "my_plugin", "my-plugin", false).unwrap();
        let placed = dest.join("my-plugin.wasm");
        let first = std::fs::metadata(&placed).unwrap().ino();
        place(&built, &dest, "my_plugin", "my-plugin", false).unwrap();
        assert_eq!(
            std::fs::metadata(&placed).unwrap().ino(),
            first,
            "untouched: left alone"
        );
        place(&built, &dest, "my_plugin", "my-plugin", true).unwrap();
        assert_ne!(std::fs::metadata(&placed).unwrap().ino(), first);
        assert_eq!(std::fs::read(&placed).unwrap(), b"same bytes");
        assert!(!dest.join(".my-plugin.wasm.tmp").exists());
    }

    /// A symbolic link planted under the temporary name in the plugins directory is replaced,
    /// not followed: the file it leads to is left as it was.
    #[test]
    fn a_link_planted_as_the_temporary_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (built, dest) = (dir.path().join("built"), dir.path().join("plugins"));
        std::fs::create_dir_all(&built).unwrap();
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::write(built.join("my_plugin.wasm"), b"plugin bytes").unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, dest.join(".my-plugin.wasm.tmp")).unwrap();
        place(&built, &dest, "my_plugin", "my-plugin", false).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(
            std::fs::read(dest.join("my-plugin.wasm")).unwrap(),
            b"plugin bytes"
        );
        assert!(
            !std::fs::symlink_metadata(dest.join("my-plugin.wasm"))
                .unwrap()
                .is_symlink()
        );
    }

    /// Beside build commands only the config directory's own plugin crate is built: cargo's
    /// search upward also finds a crate in a parent directory, another project's.
    #[test]
    fn only_the_config_directorys_own_crate_builds_beside_commands() {
        let dir = tempfile::tempdir().unwrap();
        let outer = dir.path().canonicalize().unwrap();
        let inner = outer.join("notify");
        std::fs::create_dir_all(&inner).unwrap();
        let crate_at = |root: &Path, cdylib: bool| Workspace {
            manifest: root.join("Cargo.toml"),
            root: root.to_owned(),
            target_dir: root.join("target"),
            members: vec![Member {
                name: "p".into(),
                id: "p".into(),
                dir: root.to_owned(),
                cdylib: cdylib.then(|| "p".to_owned()),
                path_deps: Vec::new(),
            }],
        };
        assert!(crate_at(&inner, true).is_plugin_crate_in(&inner));
        assert!(!crate_at(&outer, true).is_plugin_crate_in(&inner));
        assert!(!crate_at(&inner, false).is_plugin_crate_in(&inner));
    }

    /// A crate in `plugins/` is built by its package name whatever its directory is called, and
    /// its file is found by its library's name (`[lib] name`), then placed under the package's;
    /// a directory cargo does not count as a member is named in the error. Real cargo, a real
    /// wasm build (of a crate with no dependencies, so nothing is fetched).
    #[test]
    fn a_crate_is_found_by_its_package_and_its_file_by_its_library_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"plugins/in-a-folder\"]\nresolver = \"2\"\n",
        );
        write(
            "plugins/in-a-folder/Cargo.toml",
            "[package]\nname = \"acme-plugin\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [lib]\nname = \"acme_lib\"\ncrate-type = [\"cdylib\"]\n",
        );
        write("plugins/in-a-folder/src/lib.rs", "");
        let config = root.join("hookd.toml");
        std::fs::write(&config, "").unwrap();
        let workspace = Workspace::locate(&config, None).unwrap();
        let packages = workspace.default_plugins().unwrap();
        assert_eq!(packages, ["acme-plugin"]);
        assert_eq!(workspace.lib_name("acme-plugin").unwrap(), "acme_lib");
        let dest = root.join("out");
        workspace
            .build_plugins(&packages, &dest, &|_| false)
            .unwrap();
        assert!(dest.join("acme-plugin.wasm").is_file());

        // A library the plugins share is no plugin: left out by default, refused when named
        // (before anything is built or placed).
        write(
            "Cargo.toml",
            "[workspace]\nmembers = [\"plugins/in-a-folder\", \"plugins/shared\"]\n\
             resolver = \"2\"\n",
        );
        write(
            "plugins/shared/Cargo.toml",
            "[package]\nname = \"shared\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
        );
        write("plugins/shared/src/lib.rs", "");
        let workspace = Workspace::locate(&config, None).unwrap();
        assert_eq!(workspace.default_plugins().unwrap(), ["acme-plugin"]);
        let named = ["acme-plugin".to_owned(), "shared".to_owned()];
        let e = format!(
            "{:#}",
            workspace
                .build_plugins(&named, &root.join("other"), &|_| false)
                .unwrap_err()
        );
        assert!(e.contains("shared is no plugin crate"), "{e}");
        assert!(!root.join("other").exists(), "nothing built or placed");

        write("plugins/stray/Cargo.toml", "[package]\nname = \"stray\"\n");
        let workspace = Workspace::locate(&config, None).unwrap();
        let e = format!("{:#}", workspace.default_plugins().unwrap_err());
        assert!(
            e.contains(&root.join("plugins/stray").display().to_string())
                && e.contains("not a package of the workspace"),
            "{e}"
        );
    }

    /// A plugin crate named like a crate it depends on (`serde`) is built by its package ID
    /// spec: by name, `cargo build -p serde` is ambiguous and fails.
    #[test]
    fn a_member_is_built_by_its_package_id() {
        let id = "path+file:///tmp/serde#0.1.0";
        let workspace = Workspace {
            manifest: PathBuf::from("/tmp/serde/Cargo.toml"),
            root: PathBuf::from("/tmp/serde"),
            target_dir: PathBuf::from("/tmp/serde/target"),
            members: vec![Member {
                name: "serde".into(),
                id: id.into(),
                dir: PathBuf::from("/tmp/serde"),
                cdylib: Some("serde".into()),
                path_deps: Vec::new(),
            }],
        };
        assert_eq!(workspace.package_spec("serde"), id);
        assert_eq!(workspace.package_spec("elsewhere"), "elsewhere");
    }

    /// A source belongs to the innermost member holding it: a save in a crate nested in a root
    /// crate's directory is that crate's edit, not the root's (whose rollback it would undo).
    #[test]
    fn a_nested_members_source_is_its_own() {
        let member = |name: &str, dir: &str| Member {
            name: name.into(),
            id: format!("path+file://{dir}#0.1.0"),
            dir: PathBuf::from(dir),
            cdylib: Some(name.replace('-', "_")),
            path_deps: Vec::new(),
        };
        let workspace = Workspace {
            manifest: PathBuf::from("/w/Cargo.toml"),
            root: PathBuf::from("/w"),
            target_dir: PathBuf::from("/w/target"),
            members: vec![member("root", "/w"), member("other", "/w/other")],
        };
        let owner = |path: &str| workspace.owner(Path::new(path));
        assert_eq!(owner("/w/other/src/lib.rs"), Some("other"));
        assert_eq!(owner("/w/src/lib.rs"), Some("root"));
        assert_eq!(owner("/w/other/target/x.rs"), None);
        assert_eq!(owner("/elsewhere/src/lib.rs"), None);
    }

    /// Saving `hookd.toml` rebuilt and reloaded a TypeScript or Python plugin, which looked like
    /// the change had been applied; it takes a restart, so it is no source.
    #[test]
    fn the_configuration_and_what_hookd_writes_are_no_sources() {
        let file = Path::new("/p/hookd.toml");
        let config = Config::parse(
            "[server]\nplugins_dir = \"out\"\ndatabase = \"dev.sqlite\"\n",
            Path::new("/p"),
            &|_| None,
        )
        .unwrap();
        let skip = not_sources(file, &config);
        for (path, expected) in [
            ("/p/hookd.toml", false),
            ("/p/out/h.wasm", false),
            // A database not named `*.db`: every commit touched its log, and rebuilt.
            ("/p/dev.sqlite", false),
            ("/p/dev.sqlite-wal", false),
            ("/p/dev.sqlite-shm", false),
            ("/p/dev.sqlite.lock", false),
            ("/p/dev.sqlite.admin-token", false),
            ("/p/handler.py", true),
            ("/p/other.toml", true),
        ] {
            let dir = Path::new("/p");
            let is = crate::cli::build_command::is_source(Path::new(path), dir, &skip);
            assert_eq!(is, expected, "{path}");
        }
    }

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
