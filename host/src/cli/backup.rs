//! `hookd backup` and `hookd restore`: a consistent copy of a served SQLite inbox, and a
//! database started again from one (the work is [`crate::inbox::backup`]'s).
//!
//! Invariant: neither command loads more of `hookd.toml` than `[server]`'s database, and
//! neither has anything of its own for PostgreSQL: that database's backups are the server's
//! (`pg_dump`, replicas), and the refusal says so.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;

use crate::{
    admin,
    config::{self, Database},
    inbox::backup::{self, BackupError},
};

/// `hookd backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The configuration of the hookd whose database to copy (it may be serving).
    #[arg(long, short, default_value = "hookd.toml")]
    pub config: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Where to write the copy (a new file, unless --force).
    pub out: PathBuf,
}

/// `hookd restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The configuration of the hookd whose database to replace (it must be stopped).
    #[arg(long, short, default_value = "hookd.toml")]
    pub config: PathBuf,
    /// The copy to start from (made by `hookd backup`).
    pub backup: PathBuf,
}

pub fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let database = sqlite_database(&args.config, "backup")?;
    // The other file hookd keeps beside an SQLite database (the SQLite room knows its own).
    let token_file = admin::token::token_file(&database);
    let kept = [(token_file.as_path(), "the admin token file")];
    let copied = backup::backup(&database, &args.out, args.force, &kept).map_err(|e| match e {
        BackupError::Exists(_) => anyhow::anyhow!("{e} (pass --force to replace it)"),
        e => e.into(),
    })?;
    say!(
        "hookd: copied {} ({} events, schema version {}, {} bytes) to {}",
        database.display(),
        copied.events,
        copied.schema_version,
        copied.bytes,
        args.out.display()
    );
    Ok(())
}

pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let database = sqlite_database(&args.config, "restore")?;
    let restored = backup::restore(&database, &args.backup)?;
    say!(
        "hookd: {} is now the copy {} ({} events, schema version {})",
        database.display(),
        args.backup.display(),
        restored.copied.events,
        restored.copied.schema_version
    );
    if let Some(aside) = restored.replaced {
        say!(
            "hookd: the database it replaced is kept at {}",
            aside.display()
        );
    }
    Ok(())
}

/// The SQLite file the config at `path` names; a PostgreSQL database is refused, pointing to
/// that server's own tools.
fn sqlite_database(path: &Path, command: &str) -> anyhow::Result<PathBuf> {
    match config::database_of(path)? {
        Database::Sqlite(file) => Ok(file),
        Database::Postgres(url) => bail!(
            "hookd {command} works on an SQLite database; {} is PostgreSQL: use pg_dump and \
             pg_restore or a replica of that server instead (README: Backups)",
            url.redacted()
        ),
    }
}
