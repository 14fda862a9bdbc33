//! `hookd backup` and `hookd restore` as an operator runs them: separate processes next to a
//! `hookd serve` on SQLite that a sender keeps posting to.
//!
//! Invariants checked: the copy holds every event acknowledged before the backup began and
//! passes `integrity_check`; ingest keeps answering during the backup; a host started on the
//! restored copy serves it with its dedupe; the refusals (an existing OUT, a file the served
//! database keeps beside it as OUT even with `--force`, a PostgreSQL config, a restore while a
//! host serves the database) leave everything as it was, and say each cause once.

use std::{
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use http::StatusCode;

use crate::support::{ProcessHost, free_ports, hookd_cli, post_sw, sw_source};

/// Senders posting at once.
const SENDERS: usize = 4;
/// Events acknowledged before the backup starts.
const BEFORE: usize = 400;
/// Each event's body: large enough that the copy has some megabytes to read.
const BODY_BYTES: usize = 8 * 1024;

/// One acknowledgement: the event id and when its `202` arrived.
type Acks = Arc<Mutex<Vec<(String, Instant)>>>;

fn body(id: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","pad":"{}"}}"#, "x".repeat(BODY_BYTES)).into_bytes()
}

/// Posts new events to source `s` until `stop`, recording each `202`; any other answer (or
/// none) is recorded in `failures`.
async fn send_until(
    host: std::net::SocketAddr,
    sender: usize,
    acks: Acks,
    failures: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) {
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let id = format!("e{sender}-{n}");
        match post_sw(host, "s", &id, &body(&id)).await {
            Ok((StatusCode::ACCEPTED, reply)) if reply["duplicate"] == false => {
                acks.lock().unwrap().push((id, Instant::now()))
            }
            other => failures.lock().unwrap().push(format!("{id}: {other:?}")),
        }
    }
}

/// `hookd` with `args` in `dir`; its output, asserting it succeeded.
async fn hookd_ok(dir: &Path, args: &[&str]) -> String {
    let out = hookd_cli(dir, args).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "hookd {args:?}: {stdout}{stderr}");
    stdout.into_owned()
}

/// `hookd` with `args` in `dir`, asserting it failed; its stderr.
async fn hookd_refused(dir: &Path, args: &[&str]) -> String {
    let out = hookd_cli(dir, args).await;
    assert!(!out.status.success(), "hookd {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Resends each of `ids` to `host`; how many were duplicates.
async fn duplicates(host: &ProcessHost, ids: &[String]) -> usize {
    let mut duplicates = 0;
    for id in ids {
        let (status, reply) = post_sw(host.ingest, "s", id, &body(id)).await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{id}: {reply}");
        duplicates += usize::from(reply["duplicate"] == true);
    }
    duplicates
}

/// The database's own verdict on the copy, read without hookd.
fn integrity_and_journal(path: &Path) -> (String, String) {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let integrity = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    let journal = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    (integrity, journal)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_load_holds_every_acknowledged_event_and_serves_once_restored() {
    let dir = tempfile::tempdir().unwrap();
    let config = sw_source("s", &[], "");
    let host = ProcessHost::start(dir.path(), &config).await;
    let (acks, failures) = (Acks::default(), Arc::new(Mutex::new(Vec::new())));
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..SENDERS)
        .map(|sender| {
            let args = (acks.clone(), failures.clone(), stop.clone());
            tokio::spawn(send_until(host.ingest, sender, args.0, args.1, args.2))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while acks.lock().unwrap().len() < BEFORE {
        assert!(Instant::now() < deadline, "the senders are too slow");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let began = Instant::now();
    let acked_before: Vec<String> = acks
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    let said = hookd_ok(dir.path(), &["backup", "--config", "hookd.toml", "copy.db"]).await;
    let ended = Instant::now();
    assert!(said.contains("copy.db"), "{said}");
    // Ingest goes on a moment past the backup, then the senders stop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(*failures.lock().unwrap(), Vec::<String>::new());
    let acks = acks.lock().unwrap().clone();
    let during = acks
        .iter()
        .filter(|(_, at)| (began..ended).contains(at))
        .count();
    assert!(during > 0, "no event was acknowledged while the backup ran");
    let after: Vec<String> = acks
        .iter()
        .filter(|(_, at)| *at > ended)
        .map(|(id, _)| id.clone())
        .collect();
    assert!(!after.is_empty());

    let copy = dir.path().join("copy.db");
    assert_eq!(
        integrity_and_journal(&copy),
        ("ok".to_owned(), "wal".to_owned())
    );

    // A restore is refused while the host serves its database, and changes nothing.
    let refused = hookd_refused(
        dir.path(),
        &["restore", "--config", "hookd.toml", "copy.db"],
    )
    .await;
    assert!(refused.contains("in use by another hookd"), "{refused}");
    assert_eq!(
        duplicates(&host, &after[..1]).await,
        1,
        "the database changed"
    );

    host.kill();
    let said = hookd_ok(
        dir.path(),
        &["restore", "--config", "hookd.toml", "copy.db"],
    )
    .await;
    assert!(said.contains("kept at"), "{said}");
    let restored = ProcessHost::start(dir.path(), &config).await;
    assert_eq!(
        duplicates(&restored, &acked_before).await,
        acked_before.len(),
        "an event acknowledged before the backup began is missing from the copy"
    );
    // The host serves the copy, not the database it replaced: what came after is new to it.
    assert_eq!(duplicates(&restored, &after).await, 0);
}

#[tokio::test]
async fn a_backup_never_overwrites_unasked() {
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(dir.path(), &sw_source("s", &[], "")).await;
    let (status, _) = post_sw(host.ingest, "s", "a", &body("a")).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED);
    std::fs::write(dir.path().join("copy.db"), b"yesterday's copy").unwrap();

    let refused = hookd_refused(dir.path(), &["backup", "--config", "hookd.toml", "copy.db"]).await;
    assert!(
        refused.contains("copy.db already exists") && refused.contains("--force"),
        "{refused}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("copy.db")).unwrap(),
        b"yesterday's copy"
    );
    let args = ["backup", "--config", "hookd.toml", "--force", "copy.db"];
    hookd_ok(dir.path(), &args).await;
    assert_eq!(integrity_and_journal(&dir.path().join("copy.db")).0, "ok");
}

#[tokio::test]
async fn a_postgres_database_is_pointed_to_pg_dump() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hookd.toml"),
        "[server]\nadmin_token = \"t\"\ndatabase = \"postgres://hookd:s3cret-pw@127.0.0.1:1/hookd\"\n",
    )
    .unwrap();
    for command in ["backup", "restore"] {
        let refused = hookd_refused(dir.path(), &[command, "--config", "hookd.toml", "x.db"]).await;
        assert!(refused.contains("pg_dump"), "{refused}");
        assert!(!refused.contains("s3cret-pw"), "{refused}");
    }
    assert!(!dir.path().join("x.db").exists());
}

/// The inode at `path`.
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).unwrap().ino()
}

/// A second `hookd serve` in `dir` on the same database (its own listen ports), which must be
/// refused: its stderr. One that starts anyway is killed and fails the test.
async fn second_serve_refused(dir: &Path) -> String {
    let config = std::fs::read_to_string(dir.join("hookd.toml")).unwrap();
    let [listen, admin_listen] = free_ports();
    let config: String = config
        .lines()
        .map(|line| match line.split_once(" = ") {
            Some(("listen", _)) => format!("listen = \"{listen}\"\n"),
            Some(("admin_listen", _)) => format!("admin_listen = \"{admin_listen}\"\n"),
            _ => format!("{line}\n"),
        })
        .collect();
    std::fs::write(dir.join("second.toml"), config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
        .args(["serve", "--config", "second.toml"])
        .current_dir(dir)
        .env_remove("HOOKD_ADMIN_TOKEN")
        .env_remove("HOOKD_DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("a second hookd serve started on the served database");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_forced_backup_never_replaces_a_file_of_the_served_database() {
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(dir.path(), &sw_source("s", &[], "")).await;
    let (status, _) = post_sw(host.ingest, "s", "a", &body("a")).await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED);
    std::os::unix::fs::symlink(".", dir.path().join("link")).unwrap();
    let (wal, lock) = (
        dir.path().join("hookd.db-wal"),
        dir.path().join("hookd.db.lock"),
    );
    let before = (inode(&wal), inode(&lock));

    for (out, what) in [
        ("hookd.db.lock", "is the lock file"),
        ("./hookd.db-wal", "is the write-ahead log"),
        ("hookd.db-shm", "is the WAL index"),
        ("hookd.db-journal", "is the rollback journal"),
        ("link/hookd.db.lock", "is the lock file"),
        ("hookd.db.admin-token", "is the admin token file"),
        ("link/hookd.db", "is the database itself"),
    ] {
        let args = ["backup", "--config", "hookd.toml", "--force", out];
        let refused = hookd_refused(dir.path(), &args).await;
        assert!(
            refused.starts_with(&format!("hookd: {out} {what}")),
            "{out}: {refused}"
        );
    }

    assert_eq!(
        (inode(&wal), inode(&lock)),
        before,
        "a live file was replaced"
    );
    for file in std::fs::read_dir(dir.path()).unwrap() {
        let name = file.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.ends_with(".partial")
                && !name.ends_with("-journal")
                && !name.ends_with("admin-token"),
            "{name} was left"
        );
    }
    let refused = second_serve_refused(dir.path()).await;
    assert!(refused.contains("in use by another hookd"), "{refused}");
    // The host still serves its database, which still holds its event.
    let (status, reply) = post_sw(host.ingest, "s", "a", &body("a")).await.unwrap();
    assert_eq!(
        (status, reply["duplicate"].clone()),
        (StatusCode::ACCEPTED, true.into())
    );
}

#[tokio::test]
async fn a_refusal_says_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let host = ProcessHost::start(dir.path(), &sw_source("s", &[], "")).await;
    hookd_ok(dir.path(), &["backup", "--config", "hookd.toml", "copy.db"]).await;

    let refused = hookd_refused(
        dir.path(),
        &["restore", "--config", "hookd.toml", "copy.db"],
    )
    .await;
    assert_eq!(
        refused,
        "hookd: locking ./hookd.db: the database ./hookd.db is in use by another hookd process \
         (lock ./hookd.db.lock); one hookd per database\n"
    );
    let args = ["backup", "--config", "hookd.toml", "nodir/x.db"];
    assert_eq!(
        hookd_refused(dir.path(), &args).await,
        "hookd: no directory nodir to write the copy in; create it first\n"
    );
    host.kill();

    std::fs::write(dir.path().join("junk.db"), vec![7u8; 8192]).unwrap();
    let args = ["restore", "--config", "hookd.toml", "junk.db"];
    assert_eq!(
        hookd_refused(dir.path(), &args).await,
        "hookd: reading junk.db: storage error: file is not a database\n"
    );
}
