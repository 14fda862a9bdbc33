//! `server.database`: where the inbox lives. A file path is an SQLite database (the default,
//! `hookd.db`, one hookd process at a time); a `postgres://` (or `postgresql://`) URL is a
//! PostgreSQL database that several hookd nodes share.
//!
//! Invariant: a PostgreSQL URL is a secret (it may carry the password, in its user info or a
//! `password=` parameter): only [`DatabaseUrl::redacted`] is ever shown, by `Display` and
//! `Debug` alike.

use std::{
    fmt,
    path::{Path, PathBuf},
};

/// The environment variable that, when set, replaces `server.database` (so a password need not
/// sit in the file).
pub const DATABASE_URL_ENV: &str = "HOOKD_DATABASE_URL";

/// Where the inbox lives.
#[derive(Debug, Clone)]
pub enum Database {
    /// An SQLite file, absolute.
    Sqlite(PathBuf),
    /// A PostgreSQL database shared by every node.
    Postgres(DatabaseUrl),
}

/// What stands between hookd and a PostgreSQL database (`server.database_pooler`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    /// PostgreSQL itself (the default).
    #[default]
    None,
    /// A pooler that keeps one server connection per client connection (PgBouncer's
    /// `pool_mode = session`): to hookd, the same as none.
    Session,
    /// A pooler that may run each transaction on another server connection (PgBouncer's
    /// `pool_mode = transaction`): statements are sent unnamed, and nodes find each other's work
    /// by polling (`LISTEN` does not pass).
    Transaction,
}

/// Why a `server.database` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseError {
    #[error("must not be empty")]
    Empty,
    #[error(
        "`{scheme}://` is not a database hookd speaks: use a file path (SQLite) or a \
         postgres:// URL (PostgreSQL)"
    )]
    UnsupportedScheme { scheme: String },
    #[error("{url} names no host")]
    NoHost { url: String },
    /// A libpq `key=value` connection string (the value is never shown: it may hold a password).
    #[error(
        "looks like a PostgreSQL key=value connection string (host=… dbname=…); hookd takes a \
         postgres://user:password@host:port/dbname URL"
    )]
    KeyValue,
    /// A second `@` after the user info's (the value is never shown).
    #[error(
        "has an unencoded `@` in its user or password (write it as %40): the URL's host would \
         begin with the rest of the password"
    )]
    UnencodedAt,
    /// An `@` after the host, in the path or a parameter (the value is never shown).
    #[error(
        "has an unencoded `@` after its host, in its path or a parameter such as password= \
         (write it as %40; a `?` in a password as %3F): the client would read everything before \
         it as a user name and password"
    )]
    AtAfterHost,
    /// A port that is not a number: most often a password given without `@host` after it (the
    /// value is never shown).
    #[error(
        "has a port that is not a number (a password goes in postgres://user:password@host/…, \
         before the host)"
    )]
    PortNotNumber,
    /// `postgres:` or `postgresql:` without `//` (the value is never shown: taken for a file
    /// name it would be logged, and created, password and all).
    #[error(
        "begins like a PostgreSQL URL but not with `postgres://`: write \
         postgres://user:password@host:port/dbname"
    )]
    NoSlashes,
    /// `user:password@host…` without a scheme (the value is never shown).
    #[error(
        "looks like a PostgreSQL URL without its `postgres://` (user:password@host…): write \
         postgres://user:password@host:port/dbname"
    )]
    NoScheme,
}

/// Whether `value` is a libpq `key=value` connection string: one of its connection keywords
/// followed by `=`, spaces allowed around it (as libpq allows).
fn key_value(value: &str) -> bool {
    const KEYS: [&str; 6] = [
        "host",
        "hostaddr",
        "dbname",
        "user",
        "password",
        "sslpassword",
    ];
    let lower = value.to_ascii_lowercase();
    // A password given anywhere (`…?user=x&password=y`) is never a file name.
    if lower
        .match_indices("password")
        .any(|(at, word)| lower[at + word.len()..].trim_start().starts_with('='))
    {
        return true;
    }
    let words: Vec<&str> = lower
        .split(|c: char| c.is_ascii_whitespace() || c == '=')
        .collect();
    let mut at = 0;
    words.iter().any(|word| {
        let start = lower[at..].find(word).map_or(at, |i| at + i);
        at = start + word.len();
        KEYS.contains(word) && lower[at..].trim_start().starts_with('=')
    })
}

impl Database {
    /// `value` as written, a relative path made absolute against `base_dir`.
    pub fn parse(value: &str, base_dir: &Path) -> Result<Self, DatabaseError> {
        let value = value.trim();
        if value.is_empty() {
            return Err(DatabaseError::Empty);
        }
        let Some((scheme, rest)) = value.split_once("://") else {
            let lower = value.to_ascii_lowercase();
            let url_like = ["postgres:", "postgresql:", "postgres//", "postgresql//"];
            if url_like.iter().any(|start| lower.starts_with(start)) {
                return Err(DatabaseError::NoSlashes);
            }
            // Not a path anyone means: a file named "host=… password=…" would be created.
            if key_value(value) {
                return Err(DatabaseError::KeyValue);
            }
            // Nor `user:password@host…`, a URL without its `postgres://`.
            if let Some((user_info, _)) = value.split_once('@')
                && let Some((user, _password)) = user_info.split_once(':')
                && !user.contains('/')
            {
                return Err(DatabaseError::NoScheme);
            }
            return Ok(Self::Sqlite(base_dir.join(value)));
        };
        if !matches!(scheme, "postgres" | "postgresql") {
            return Err(DatabaseError::UnsupportedScheme {
                scheme: scheme.to_owned(),
            });
        }
        let url = DatabaseUrl(value.to_owned());
        let (user_info, after) = split_user_info(rest);
        if user_info.is_some_and(beyond_host) {
            return Err(DatabaseError::AtAfterHost);
        }
        if authority(after).contains('@') {
            return Err(DatabaseError::UnencodedAt);
        }
        let authority = authority(after);
        if authority
            .split(',')
            .any(|host| port_of(host).is_some_and(not_a_port))
        {
            return Err(DatabaseError::PortNotNumber);
        }
        // A host may also come as `?host=/run/postgresql` (a socket directory).
        if authority.is_empty() && !rest.contains("host=") {
            return Err(DatabaseError::NoHost {
                url: url.redacted(),
            });
        }
        Ok(Self::Postgres(url))
    }

    /// The SQLite file, if the inbox is one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Self::Sqlite(path) => Some(path),
            Self::Postgres(_) => None,
        }
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "{}", path.display()),
            Self::Postgres(url) => f.write_str(&url.redacted()),
        }
    }
}

/// A PostgreSQL connection URL; its password never leaves by `Display` or `Debug` (the field
/// is private and the type has no `Display`).
#[derive(Clone)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL with its password, for connecting only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with every place a password can hide replaced by `***`: the user info's
    /// password, any parameter whose name (percent-decoded) ends in `password` (`password=`,
    /// `sslpassword=`), a "port" that is not a number (a password written without `@host`), and
    /// a "user name" that holds the host and path (an `@` in the query made it one).
    pub fn redacted(&self) -> String {
        let url = self.expose();
        let Some((scheme, rest)) = url.split_once("://") else {
            return "***".into();
        };
        let (user_info, after) = split_user_info(rest);
        let host = authority(after);
        let tail = &after[host.len()..];
        let user_info = match user_info {
            Some(info) if beyond_host(info) => "***@".to_owned(),
            Some(info) => match info.split_once(':') {
                Some((user, _password)) => format!("{user}:***@"),
                None => format!("{info}@"),
            },
            None => String::new(),
        };
        let host: Vec<String> = host
            .split(',')
            .map(|one| match port_of(one) {
                Some(port) if not_a_port(port) => {
                    format!("{}:***", &one[..one.len() - port.len() - 1])
                }
                _ => one.to_owned(),
            })
            .collect();
        let tail = match tail.split_once('?') {
            Some((path, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((name, _)) if names_a_password(name) => format!("{name}=***"),
                        _ => pair.to_owned(),
                    })
                    .collect();
                format!("{path}?{}", query.join("&"))
            }
            None => tail.to_owned(),
        };
        format!("{scheme}://{user_info}{}{tail}", host.join(","))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The authority of a URL after its `scheme://`: up to the first `/` or `?`.
fn authority(rest: &str) -> &str {
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[..end]
}

/// Whether a URL's user info (up to its first `@`) holds what only comes after the host: a
/// path or a parameter in the user name, or a query (`?…=`) in the password. The `@` was in
/// the path or the query, and the client would read host, path and query as user and
/// password.
fn beyond_host(user_info: &str) -> bool {
    let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
    user.contains(['/', '?', '&', '='])
        || password
            .split_once('?')
            .is_some_and(|(_, query)| query.contains('='))
}

/// The port of one `host[:port]` of an authority, as the client reads it: after the first `:`,
/// or after `]` for a bracketed `[v6]:port`.
fn port_of(host: &str) -> Option<&str> {
    let after = match host.strip_prefix('[') {
        Some(rest) => &rest[rest.find(']').map_or(rest.len(), |i| i + 1)..],
        None => host,
    };
    after.find(':').map(|i| &after[i + 1..])
}

/// Whether a port is anything but a number.
fn not_a_port(port: &str) -> bool {
    !port.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a query parameter's name, as the client decodes it, names a password
/// (`password`, libpq's `sslpassword`).
fn names_a_password(name: &str) -> bool {
    percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase()
        .ends_with("password")
}

/// `user[:password]`, and the rest of a URL after its `scheme://`: the user info is everything
/// before the first `@`, as the PostgreSQL client reads it, so a password with a `/` or `?` in
/// it is still the password (and redacted as one).
fn split_user_info(rest: &str) -> (Option<&str>, &str) {
    match rest.split_once('@') {
        Some((info, after)) => (Some(info), after),
        None => (None, rest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<Database, DatabaseError> {
        Database::parse(value, Path::new("/srv/hookd"))
    }

    #[test]
    fn a_path_is_an_sqlite_file_relative_to_the_config() {
        let db = parse("data/hookd.db").unwrap();
        assert_eq!(
            db.sqlite_path(),
            Some(Path::new("/srv/hookd/data/hookd.db"))
        );
        assert_eq!(
            parse("/var/lib/h.db").unwrap().sqlite_path(),
            Some(Path::new("/var/lib/h.db"))
        );
    }

    #[test]
    fn a_postgres_url_is_shared_and_never_shows_its_password() {
        for url in [
            "postgres://hookd:s3cr%40t@db.internal:5432/hookd",
            "postgresql://hookd:s3cr/t@db.internal/hookd?sslmode=disable",
            "postgres://hookd:s3cr?t@db.internal:5432/hookd",
            "postgres://hookd@db.internal/hookd?password=s3cr%40t&application_name=x",
        ] {
            let db = parse(url).unwrap();
            assert!(db.sqlite_path().is_none());
            for shown in [db.to_string(), format!("{db:?}")] {
                assert!(!shown.contains("s3cr"), "{shown}");
                assert!(shown.contains("db.internal"), "{shown}");
            }
        }
        let Database::Postgres(url) = parse("postgres://hookd:pw@db:5432/h?password=pw2").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            url.redacted(),
            "postgres://hookd:***@db:5432/h?password=***"
        );
        assert_eq!(url.expose(), "postgres://hookd:pw@db:5432/h?password=pw2");
        // Every other place a password hides, as the client reads it, even where `parse`
        // refuses the URL (its error may still show it, redacted).
        for (url, shown) in [
            (
                "postgres://hookd:x@db/h?sslpassword=PW&pass%77ord=PW&sslmode=require",
                "postgres://hookd:***@db/h?sslpassword=***&pass%77ord=***&sslmode=require",
            ),
            (
                "postgres://localhost/hookd?user=hookd&password=PW@x",
                "postgres://***@x",
            ),
            ("postgres://hookd:PW", "postgres://hookd:***"),
            ("postgres://hookd:PW]x/db", "postgres://hookd:***/db"),
            (
                "postgres://localhost/h?user=u&password=Pa:ss@word",
                "postgres://***@word",
            ),
            (
                "postgres://db1:5432,hookd:PW/h",
                "postgres://db1:5432,hookd:***/h",
            ),
        ] {
            assert_eq!(DatabaseUrl(url.to_owned()).redacted(), shown);
        }
    }

    #[test]
    fn other_urls_and_empty_values_are_refused_with_a_reason() {
        assert_eq!(
            parse("mysql://u@h/db").unwrap_err(),
            DatabaseError::UnsupportedScheme {
                scheme: "mysql".into()
            }
        );
        assert_eq!(parse("  ").unwrap_err(), DatabaseError::Empty);
        let err = parse("postgres://u:hunter2@/db").unwrap_err();
        assert!(matches!(err, DatabaseError::NoHost { .. }), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(parse("postgres:///db?host=/run/postgresql").is_ok());
        // The client reads the password up to the first `@`: a second one would make the rest
        // of the password the host (and show it in errors). Refused, without the value.
        let err = parse("postgresql://hookd:p@ss@db.internal/hookd").unwrap_err();
        assert_eq!(err, DatabaseError::UnencodedAt);
        // Nor an `@` after the host: the client would take host, path and query for the user.
        let err = parse("postgres://localhost/hookd?user=hookd&password=PW-1@x").unwrap_err();
        assert_eq!(err, DatabaseError::AtAfterHost);
        // However the user info around it looks.
        for value in [
            "postgres://localhost/postgres?user=hookd&password=Pa:PW-1@word",
            "postgres://127.0.0.1:5433/postgres?user=hookd&password=PW-1@nohost",
        ] {
            assert_eq!(
                parse(value).unwrap_err(),
                DatabaseError::AtAfterHost,
                "{value}"
            );
        }
        // A password given without `@host` reads as a port.
        for value in ["postgres://hookd:PW-2", "postgres://hookd:PW]2/db"] {
            assert_eq!(
                parse(value).unwrap_err(),
                DatabaseError::PortNotNumber,
                "{value}"
            );
        }
        assert!(parse("postgres://db1:5432,db2:5433/h").is_ok());
        assert!(parse("postgres://[::1]:5432/h").is_ok());
        // One slash is no URL, and no file name either (it would be created, password and all).
        for value in [
            "postgres:/hookd:PW-3@db/hookd",
            "PostgreSQL:hookd:PW-3@db",
            "postgres//hookd:PW-3@db/hookd",
        ] {
            assert_eq!(
                parse(value).unwrap_err(),
                DatabaseError::NoSlashes,
                "{value}"
            );
        }
        for err in [
            DatabaseError::AtAfterHost,
            DatabaseError::PortNotNumber,
            DatabaseError::NoSlashes,
        ] {
            assert!(!err.to_string().contains("PW-"), "{err}");
        }
        // A libpq key=value string is not taken for an SQLite file name (it would log the
        // password as the database's path, and create that file).
        // Spaces around `=` too, as libpq allows.
        for value in [
            "host=db port=5432 user=hookd password=hunter2 dbname=h",
            "host = 127.0.0.1 port = 5433 password = hunter2",
            "dbname =h\tPassword= hunter2",
        ] {
            let err = parse(value).unwrap_err();
            assert_eq!(err, DatabaseError::KeyValue, "{value}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        // A URL without its scheme is no file name either, a `/` in its password too.
        for value in [
            "hookd:hunter2@127.0.0.1:5433/postgres",
            "hookd:hun/ter2==@db:5432/h",
        ] {
            let err = parse(value).unwrap_err();
            assert_eq!(err, DatabaseError::NoScheme, "{value}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        // Nor a password anywhere, in whatever form.
        for value in [
            "db:5432/h?user=hookd&password=hunter2",
            "host=db sslpassword=hunter2",
        ] {
            let err = parse(value).unwrap_err();
            assert_eq!(err, DatabaseError::KeyValue, "{value}");
        }
        // File names that merely hold such words or signs are still file names.
        for value in [
            "data/hosts.db",
            "/srv/user-data/hookd.db",
            "backups/hookd@2026.db",
            "/srv/a:b/hookd.db",
            "./x/y@z:w.db",
        ] {
            assert!(matches!(parse(value), Ok(Database::Sqlite(_))), "{value}");
        }
    }
}
