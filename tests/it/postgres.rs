//! PostgreSQL for the black-box tests: a fresh database per test on the server named by
//! `HOOKD_TEST_POSTGRES_URL` (`.ci/postgres.sh` starts one and prints its URL), reached directly
//! or through PgBouncer in transaction mode (`HOOKD_TEST_PGBOUNCER_URL`, `.ci/pgbouncer.sh`), and
//! a private server a test may stop and start.
//!
//! Without those variables a PostgreSQL test says it is skipped and passes, so
//! `cargo test --workspace` works where no server runs; with `HOOKD_TEST_POSTGRES_REQUIRED=1`
//! (CI) it fails instead. The tests talk to the server with `psql`, as an operator would.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use tempfile::TempDir;

/// The server's URL (its `postgres` database), or `None` after printing why the test is
/// skipped; panics when CI requires the server.
pub fn server_url(test: &str) -> Option<String> {
    given("HOOKD_TEST_POSTGRES_URL", test)
}

/// The URL of PgBouncer (transaction mode) in front of that server, or `None` as for
/// [`server_url`].
pub fn pgbouncer_url(test: &str) -> Option<String> {
    given("HOOKD_TEST_PGBOUNCER_URL", test)
}

/// The CA file whose certificate the server presents (valid for `localhost` only;
/// `.ci/postgres.sh --ca`), or `None` as for [`server_url`].
pub fn server_ca(test: &str) -> Option<String> {
    given("HOOKD_TEST_POSTGRES_CA", test)
}

/// The value of `var`, or `None` after printing why the test is skipped; panics when CI
/// requires it.
fn given(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("HOOKD_TEST_POSTGRES_REQUIRED").as_deref() == Ok("1") => {
            panic!("{test}: {var} is not set but HOOKD_TEST_POSTGRES_REQUIRED=1")
        }
        _ => {
            eprintln!("{test}: skipped: {var} is not set");
            None
        }
    }
}

/// Runs `psql` on `url` with `sql`; panics with its output unless it succeeds. Returns stdout
/// (unaligned, tuples only, `|`-separated).
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            url,
            "-c",
            sql,
        ])
        .output()
        .expect("running psql");
    check(&out, sql);
    String::from_utf8(out.stdout).unwrap()
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_end = head["postgres://".len()..]
        .find('/')
        .map_or(head.len(), |i| i + "postgres://".len());
    format!("{}/{name}{query}", &head[..authority_end])
}

/// A database of its own for one test, dropped (connections and all) when it goes.
pub struct TestDatabase {
    server: String,
    name: String,
    /// The URL hookd connects to.
    pub url: String,
}

impl TestDatabase {
    /// A new empty database on the server of [`server_url`], or `None` (skipped).
    pub fn create(test: &str) -> Option<Self> {
        let server = server_url(test)?;
        Some(Self::create_on(&server))
    }

    /// A new empty database on `server` (a URL to any of its databases).
    pub fn create_on(server: &str) -> Self {
        let name = format!(
            "hookd_it_{}_{:08x}",
            std::process::id(),
            rand_u32(&std::time::SystemTime::now())
        );
        psql(server, &format!("CREATE DATABASE {name}"));
        Self {
            url: with_database(server, &name),
            server: server.to_owned(),
            name,
        }
    }
}

impl TestDatabase {
    /// This database, reached through the pooler at `pooler` (a URL to any database of it).
    pub fn through(&self, pooler: &str) -> String {
        with_database(pooler, &self.name)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args(["-X", "-q", &self.server, "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
    }
}

/// A little entropy for names (two tests in one process must not collide).
fn rand_u32(now: &std::time::SystemTime) -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(now) as u32
}

/// A PostgreSQL server of the test's own (initdb in a temporary directory, on a free loopback
/// port), so the test may stop and start it without touching anyone else's. Run as the
/// `postgres` user when the tests run as root (the server refuses root).
pub struct PrivatePostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication, loopback only).
    pub url: String,
}

impl PrivatePostgres {
    /// Creates and starts the server, or `None` (skipped) where the tests have no PostgreSQL.
    pub fn start(test: &str) -> Option<Self> {
        server_url(test)?;
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's binaries under /usr/lib/postgresql")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let port = crate::support::free_port().port();
        let this = Self {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            dir,
            bin,
            port,
        };
        let data = this.data();
        this.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        this.up();
        Some(this)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the server and waits until it accepts connections.
    pub fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("postgres.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-o",
                &options,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|s| !s.success())
        {
            assert!(
                Instant::now() < deadline,
                "the private PostgreSQL did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the server at once (`immediate`: no checkpoint, connections cut, as a crash).
    pub fn down(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// `program` of the server's binaries, as the `postgres` user when the tests run as root.
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut command = if is_root() {
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(program);
            runuser
        } else {
            Command::new(program)
        };
        command.current_dir(self.dir.path());
        command
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        check(&out, &format!("{program} {args:?}"));
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
    }
}

fn is_root() -> bool {
    effective_uid() == 0
}

/// The effective uid, read from `/proc/self/status` (no libc binding needed here).
fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

/// The `postgres` user's uid and gid, from `/etc/passwd`.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string(Path::new("/etc/passwd")).unwrap();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&"postgres"))
                .then(|| (fields[2].parse().unwrap(), fields[3].parse().unwrap()))
        })
        .expect("a postgres user (Debian's postgresql package creates it)")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_gets_another_database_name() {
        assert_eq!(
            super::with_database("postgres://hookd:hookd@127.0.0.1:5432/postgres", "x"),
            "postgres://hookd:hookd@127.0.0.1:5432/x"
        );
        assert_eq!(
            super::with_database("postgres://h@db/postgres?sslmode=disable", "x"),
            "postgres://h@db/x?sslmode=disable"
        );
        assert_eq!(
            super::with_database("postgres://h@db", "x"),
            "postgres://h@db/x"
        );
    }
}
