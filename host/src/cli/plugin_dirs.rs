//! Which plugin crates a directory holds: every subdirectory with a `Cargo.toml`, by name.
//!
//! Invariant: the one definition of "the plugins in `plugins/`" that `hookd dev` (its default
//! list, each directory mapped to its package by `cargo metadata`) and the tests' `build.rs`
//! (which includes this file by path, so it uses nothing but `std`) both use; adding a plugin
//! is adding its directory. In this repository a plugin's directory is its package's name,
//! which `build.rs` relies on.

use std::{io, path::Path};

/// The crate directories in `dir`, by name, sorted.
pub fn crates_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path.join("Cargo.toml").is_file() {
            continue;
        }
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("plugin directory name is not UTF-8: {}", path.display()),
            )
        })?;
        names.push(name.to_owned());
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_directory_with_a_manifest_is_a_crate_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        for (name, manifest) in [("zeta", true), ("alpha", true), ("notes", false)] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            if manifest {
                std::fs::write(dir.path().join(name).join("Cargo.toml"), "").unwrap();
            }
        }
        std::fs::write(dir.path().join("Cargo.toml"), "").unwrap();
        assert_eq!(crates_in(dir.path()).unwrap(), ["alpha", "zeta"]);
    }

    #[test]
    fn the_repositorys_example_plugins_are_found() {
        let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
        let found = crates_in(&plugins).unwrap();
        for example in ["classifier", "generic", "github", "stripe"] {
            assert!(found.iter().any(|f| f == example), "{example} in {found:?}");
        }
    }
}
