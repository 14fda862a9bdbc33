//! `hookd dev`: build the example plugin crates to wasm, place them in `plugins_dir`, serve.
//!
//! Invariant: it runs the same `cargo build --release --target wasm32-wasip2` a user would and
//! copies only the built `.wasm` files; serving is exactly `hookd serve`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use clap::Args;

use crate::config::Config;

/// The example plugin crates `hookd dev` builds by default.
pub const EXAMPLE_PLUGINS: [&str; 4] = ["github", "stripe", "generic", "classifier"];

#[derive(Debug, Args)]
pub struct DevArgs {
    /// The configuration file (relative paths in it are relative to its directory).
    #[arg(long, short, default_value = "hookd.toml")]
    pub config: PathBuf,
    /// Plugin crates (workspace packages) to build.
    #[arg(long = "plugin", short = 'p', default_values_t = EXAMPLE_PLUGINS.map(String::from))]
    pub plugins: Vec<String>,
    /// Serve without building first.
    #[arg(long)]
    pub no_build: bool,
}

pub fn run(args: DevArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    if !args.no_build {
        let root = workspace_root(&args.config)?;
        build_plugins(&root, &args.plugins, &config.server.plugins_dir)?;
    }
    super::serve(args.config)
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(root)
        .args(["build", "--release", "--target", "wasm32-wasip2"]);
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
    let built = target.join("wasm32-wasip2").join("release");
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    for package in packages {
        let file = format!("{}.wasm", package.replace('-', "_"));
        let from = built.join(&file);
        // Copy then rename, so the watcher never sees a half-written plugin.
        let to = dest.join(format!("{package}.wasm"));
        let tmp = dest.join(format!(".{package}.wasm.tmp"));
        std::fs::copy(&from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
        std::fs::rename(&tmp, &to).with_context(|| format!("placing {}", to.display()))?;
    }
    Ok(())
}
