//! Makes sure the `wasm32-wasip2` target is installed before plugin crates are built.
//!
//! `rust-toolchain.toml` names the target, but rustup only installs a toolchain file's targets
//! when it installs the toolchain itself: on a machine whose Rust 1.95 came without it (and
//! with `RUSTUP_AUTO_INSTALL=0`), `cargo build --target wasm32-wasip2` fails with "can't find
//! crate for `core`". Both builders of plugins, `hookd dev` and the tests' `build.rs` (which
//! includes this file by path, so it uses nothing but `std`), call [`ensure`] first.
//!
//! Invariant: it changes nothing when the target is there; otherwise it runs exactly the
//! command a user would (`rustup target add wasm32-wasip2`, in the workspace, so the toolchain
//! file picks the toolchain), and says what to run by hand if that fails.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The target every plugin is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Installs [`TARGET`] for the toolchain `rustc` (the compiler the build will use) belongs to,
/// unless its standard library is already there. `workspace` is where rustup resolves the
/// toolchain file.
pub fn ensure(rustc: &Path, workspace: &Path) -> Result<(), String> {
    if installed(rustc, workspace) {
        return Ok(());
    }
    eprintln!("the {TARGET} target is missing; installing it: rustup target add {TARGET}");
    let status = Command::new("rustup")
        .current_dir(workspace)
        .args(["target", "add", TARGET])
        .status();
    match status {
        Ok(status) if status.success() && installed(rustc, workspace) => Ok(()),
        Ok(status) => Err(format!(
            "the {TARGET} target is not installed and `rustup target add {TARGET}` failed \
             ({status}); run it by hand in {}",
            workspace.display()
        )),
        Err(e) => Err(format!(
            "the {TARGET} target is not installed and rustup could not be run ({e}): install \
             the target for {} (`rustup target add {TARGET}`)",
            rustc.display()
        )),
    }
}

/// Whether `rustc` has the standard library for [`TARGET`].
fn installed(rustc: &Path, workspace: &Path) -> bool {
    Command::new(rustc)
        .current_dir(workspace)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .is_some_and(|dir| {
            std::fs::read_dir(&dir).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("libcore-") && name.ends_with(".rlib")
                })
            })
        })
}
