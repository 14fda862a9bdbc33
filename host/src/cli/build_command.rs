//! `hookd dev` for plugins cargo does not build (JavaScript, Python, anything with a compiler of
//! its own): each plugin with a `build` command in the config is built by running it, and
//! rebuilt when a file under the config's directory changes.
//!
//! Invariants: a command runs in the config file's directory with `{out}` in its arguments
//! (and env `HOOKD_BUILD_OUT`) naming a hidden file in `plugins_dir`, which is renamed into
//! place only when the command succeeded and wrote something different, so the host never sees
//! half a file or a failed build; a failed build is reported and changes nothing.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::config::Config;

/// One plugin file built by a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandBuild {
    /// The file stem it builds (`<plugins_dir>/<stem>.wasm`).
    pub stem: String,
    /// The plugin instances naming it (for messages).
    pub plugin: String,
    pub argv: Vec<String>,
}

/// The command builds `config` declares, one per file (the first instance's command wins when
/// several instances share a file; they must agree).
pub fn declared(config: &Config) -> anyhow::Result<Vec<CommandBuild>> {
    let mut builds: Vec<CommandBuild> = Vec::new();
    for (name, plugin) in &config.plugins {
        let Some(argv) = &plugin.build else { continue };
        match builds.iter().find(|b| b.stem == plugin.wasm) {
            Some(other) if &other.argv != argv => bail!(
                "plugins.{name}.build and plugins.{}.build differ, but both load {}.wasm",
                other.plugin,
                plugin.wasm
            ),
            Some(_) => {}
            None => builds.push(CommandBuild {
                stem: plugin.wasm.clone(),
                plugin: name.to_string(),
                argv: argv.clone(),
            }),
        }
    }
    Ok(builds)
}

/// Runs every build in `dir` (the config's directory), placing each result in `dest`; reports
/// every failure, and fails if any did.
pub fn build_all(builds: &[CommandBuild], dir: &Path, dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut failed = Vec::new();
    for build in builds {
        if let Err(e) = build_one(build, dir, dest) {
            tracing::error!(plugin = %build.plugin, "{e:#}");
            failed.push(build.plugin.clone());
        }
    }
    if !failed.is_empty() {
        bail!("building {} failed (see above)", failed.join(", "));
    }
    Ok(())
}

fn build_one(build: &CommandBuild, dir: &Path, dest: &Path) -> anyhow::Result<()> {
    let out = dest.join(format!(".{}.wasm.build", build.stem));
    let _ = std::fs::remove_file(&out);
    let out_arg = out.display().to_string();
    let argv: Vec<String> = build
        .argv
        .iter()
        .map(|arg| arg.replace("{out}", &out_arg))
        .collect();
    tracing::info!(plugin = %build.plugin, command = ?argv, "building plugin");
    let status = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .env("HOOKD_BUILD_OUT", &out)
        .status()
        .with_context(|| {
            format!(
                "plugins.{}.build: cannot run {:?} in {}",
                build.plugin,
                argv[0],
                dir.display()
            )
        })?;
    if !status.success() {
        bail!("plugins.{}.build: {argv:?} failed ({status})", build.plugin);
    }
    let bytes = std::fs::read(&out).with_context(|| {
        format!(
            "plugins.{}.build: {argv:?} succeeded but wrote no {} ({{out}} or \
             $HOOKD_BUILD_OUT)",
            build.plugin,
            out.display()
        )
    })?;
    let to = dest.join(format!("{}.wasm", build.stem));
    if std::fs::read(&to).ok() == Some(bytes) {
        let _ = std::fs::remove_file(&out);
        return Ok(()); // unchanged: nothing to reload
    }
    std::fs::rename(&out, &to).with_context(|| format!("placing {}", to.display()))
}

/// Whether a change to `path` calls for the command builds to run again: any file under `dir`
/// (the config's directory) outside installed packages, build output, hidden entries and what
/// hookd itself writes there (`skip`: its plugins directory and cache, absolute; the database's
/// files, `*.db`, `*.db-wal`, `*.db.admin-token` and the like; logs, `*.log`) and editors' swap
/// and backup files.
pub fn is_source(path: &Path, dir: &Path, skip: &[PathBuf]) -> bool {
    let Ok(inside) = path.strip_prefix(dir) else {
        return false;
    };
    if inside.as_os_str().is_empty() {
        return false; // the directory itself (its times change as files come and go)
    }
    if skip.iter().any(|s| path.starts_with(s)) {
        return false;
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !inside.components().any(|c| {
        let c = c.as_os_str().to_string_lossy();
        c.starts_with('.') || ["node_modules", "target", "dist", "__pycache__"].contains(&&*c)
    }) && !name.ends_with(".db")
        && !name.contains(".db-")
        && !name.contains(".db.")
        && !name.ends_with(".wasm")
        && !name.ends_with(".wasm.build")
        && !name.ends_with(".log")
        && !name.ends_with(".swp")
        && !name.ends_with('~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("/srv"), &|_| None).unwrap()
    }

    #[test]
    fn each_file_is_built_once_by_the_command_its_plugins_declare() {
        let config = config(
            r#"
            [sources.s]
            scheme = "standard-webhooks"
            secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
            handlers = ["a", "b", "rust"]
            [plugins.a]
            build = ["node", "build.mjs", "{out}"]
            [plugins.b]
            wasm = "a"
            build = ["node", "build.mjs", "{out}"]
            [plugins.rust]
            "#,
        );
        let builds = declared(&config).unwrap();
        assert_eq!(
            builds,
            [CommandBuild {
                stem: "a".into(),
                plugin: "a".into(),
                argv: vec!["node".into(), "build.mjs".into(), "{out}".into()],
            }]
        );
    }

    #[test]
    fn instances_sharing_a_file_with_different_commands_are_refused() {
        let config = config(
            r#"
            [plugins.a]
            build = ["x"]
            [plugins.b]
            wasm = "a"
            build = ["y"]
            "#,
        );
        let error = declared(&config).unwrap_err().to_string();
        assert!(error.contains("differ, but both load a.wasm"), "{error}");
    }

    #[test]
    fn an_empty_command_is_refused_naming_the_key() {
        let error =
            Config::parse("[plugins.a]\nbuild = []\n", Path::new("/srv"), &|_| None).unwrap_err();
        assert!(
            format!("{error:#}").contains("plugins.a.build must name a program"),
            "{error:#}"
        );
    }

    #[test]
    fn a_command_writes_its_file_through_out_and_a_failure_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("plugins");
        let build = |script: &str| CommandBuild {
            stem: "h".into(),
            plugin: "h".into(),
            argv: vec![
                "sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                "{out}".into(),
            ],
        };
        build_all(&[build("printf first > \"$1\"")], dir.path(), &dest).unwrap();
        assert_eq!(std::fs::read(dest.join("h.wasm")).unwrap(), b"first");
        let error = build_all(
            &[build("printf half > \"$HOOKD_BUILD_OUT\"; exit 3")],
            dir.path(),
            &dest,
        )
        .unwrap_err();
        assert!(error.to_string().contains("building h failed"), "{error}");
        assert_eq!(std::fs::read(dest.join("h.wasm")).unwrap(), b"first");
        let error = build_one(&build("true"), dir.path(), &dest).unwrap_err();
        assert!(format!("{error:#}").contains("wrote no"), "{error:#}");
    }

    #[test]
    fn sources_are_what_the_author_edits() {
        let dir = Path::new("/p");
        let skip = [
            PathBuf::from("/p/plugins"),
            PathBuf::from("/p/.hookd-cache"),
        ];
        for (path, expected) in [
            ("/p/src/handler.ts", true),
            ("/p/handler.py", true),
            ("/p/package.json", true),
            ("/p/node_modules/x/index.js", false),
            ("/p/__pycache__/handler.pyc", false),
            ("/p/plugins/h.wasm", false),
            ("/p/plugins/.h.wasm.build", false),
            ("/p/hookd.db", false),
            ("/p/hookd.db-wal", false),
            ("/p/hookd.db.admin-token", false),
            ("/p/elsewhere/.h.wasm.build", false),
            ("/p/.git/index", false),
            ("/elsewhere/handler.ts", false),
            ("/p", false),
            ("/p/hookd.log", false),
            ("/p/handler.py~", false),
        ] {
            assert_eq!(is_source(Path::new(path), dir, &skip), expected, "{path}");
        }
    }
}
