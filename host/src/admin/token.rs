//! The admin token when the configuration names none: generated once, kept in a file beside the
//! database (`<database>.admin-token`), and found there again by later starts and by the admin
//! commands (`hookd events | replay | plugins`).
//!
//! Invariants: the file is created owner-only (`0600`) and complete (written aside, synced, then
//! renamed into place); a file that other users can read, or that holds no usable token, stops
//! the start with an error naming the file; the token itself is never logged or printed.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use rand::RngCore as _;

use crate::verify::Secret;

/// Shortest token the file may hold (a generated one is 64 hex characters).
const MIN_FILE_TOKEN_CHARS: usize = 16;

/// Where the generated token of the database at `database` lives.
pub fn token_file(database: &Path) -> PathBuf {
    PathBuf::from(format!("{}.admin-token", database.display()))
}

/// Whether [`load_or_create`] found the file or wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Existing,
    Generated,
}

/// The token of the database at `database`: read from its token file, or generated (32 random
/// bytes, hex) and written there if the file does not exist yet.
pub fn load_or_create(database: &Path) -> anyhow::Result<(Secret, PathBuf, Found)> {
    let path = token_file(database);
    match read(&path)? {
        Some(token) => Ok((Secret::new(token), path, Found::Existing)),
        None => {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let token = hex::encode(bytes);
            write_private(&path, &token)?;
            Ok((Secret::new(token), path, Found::Generated))
        }
    }
}

/// The token in `path`, or `None` if there is no such file. Refuses a file other users can
/// read or one without a usable token.
pub fn read(path: &Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            bail!(
                "the admin token file {} is accessible to other users (mode {:o}); \
                 `chmod 600` it, or delete it to have a new token generated",
                path.display(),
                mode & 0o777
            );
        }
    }
    let token = text.trim();
    if token.chars().count() < MIN_FILE_TOKEN_CHARS || token.chars().any(char::is_control) {
        bail!(
            "the admin token file {} does not hold a usable token (at least {MIN_FILE_TOKEN_CHARS} \
             printable characters); delete it to have a new one generated",
            path.display()
        );
    }
    Ok(Some(token.to_owned()))
}

fn write_private(path: &Path, token: &str) -> anyhow::Result<()> {
    let aside = PathBuf::from(format!("{}.tmp", path.display()));
    let _ = std::fs::remove_file(&aside);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let written = options.open(&aside).and_then(|mut file| {
        file.write_all(format!("{token}\n").as_bytes())?;
        file.sync_all()
    });
    written
        .and_then(|()| std::fs::rename(&aside, path))
        .with_context(|| format!("writing the admin token file {}", path.display()))?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_generated_once_owner_only_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        let (first, path, origin) = load_or_create(&db).unwrap();
        assert_eq!((path.clone(), origin), (token_file(&db), Found::Generated));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64, "{text:?}");
        assert!(first.matches(text.trim().as_bytes()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let (again, _, origin) = load_or_create(&db).unwrap();
        assert_eq!(origin, Found::Existing);
        assert!(again.matches(text.trim().as_bytes()));
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_can_read_or_a_short_token_is_refused_naming_the_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hookd.db");
        let path = token_file(&db);
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = format!("{:#}", load_or_create(&db).unwrap_err());
        assert!(
            err.contains("hookd.db.admin-token") && err.contains("644"),
            "{err}"
        );
        assert!(!err.contains("0123456789abcdef"), "{err}");

        std::fs::write(&path, "short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = format!("{:#}", load_or_create(&db).unwrap_err());
        assert!(
            err.contains("usable token") && !err.contains("short"),
            "{err}"
        );
    }
}
