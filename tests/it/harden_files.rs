//! Files on disk against a running host: the compiled-artifact cache trusts nothing it did not
//! write for exactly this file (a directory others can write is refused, a foreign or swapped
//! entry is recompiled, never loaded; refused files are never cached; the cache keeps to its
//! byte cap), the database files are owner-only, plugin compiles are queued and bounded (several
//! large files replaced at once compile one at a time; a compile past its deadline is killed),
//! and a symlink in `plugins_dir` is refused with an error that quotes no file bytes.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{self, AdminApi, ProcessHost, TestHost, install_plugins, plugins, sw_source};

const WAIT: Duration = Duration::from_secs(90);

/// A standard-webhooks source `s` with `handlers`, plus `extra` (more tables).
fn config(server: &str, handlers: &[&str], extra: &str) -> String {
    format!("[server]\n{server}\n{}", sw_source("s", handlers, extra))
}

fn loaded(p: &Value) -> bool {
    p["sha256"].is_string() && p["error"].is_null()
}

/// The uid this test runs as (the owner of a file it creates).
fn my_uid() -> u32 {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::metadata(file.path()).unwrap().uid()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The cache's entries (`*.cwasm`), and every other file in it.
fn cache_files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .partition(|p| p.extension().is_some_and(|e| e == "cwasm"))
}

/// The cache entry of the file whose sha256 is `sha`.
fn entry_of(dir: &Path, sha: &str) -> PathBuf {
    let (entries, _) = cache_files(dir);
    entries
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(sha))
        .unwrap_or_else(|| panic!("no cache entry for {sha} in {}", dir.display()))
}

/// A cache directory someone else could write is refused at start-up, with an error naming
/// it (and the key): nothing is ever loaded from it. One owned by another user likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_dir_others_can_write_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("h", plugins::FLAKY)]);
    let shared = dir.path().join("shared-cache");
    std::fs::create_dir(&shared).unwrap();
    let text = support::config_text(&config("cache_dir = \"shared-cache\"", &["h"], ""));
    let start = async || {
        let config = host::config::Config::parse(&text, dir.path(), &|_| None).unwrap();
        let listeners = host::Listeners {
            ingest: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            admin: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        };
        // Started, it would serve until this future resolves: it never does.
        tokio::time::timeout(
            Duration::from_secs(30),
            host::run(config, listeners, std::future::pending()),
        )
        .await
        .expect("hookd started with a cache directory others can write")
    };
    for bad in [0o777, 0o770, 0o1777, 0o720] {
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(bad)).unwrap();
        let err = format!("{:#}", start().await.unwrap_err());
        assert!(
            err.contains("server.cache_dir")
                && err.contains(&shared.display().to_string())
                && err.contains("writable by group or others"),
            "mode {bad:o}: {err}"
        );
        let (entries, _) = cache_files(&shared);
        assert!(entries.is_empty(), "mode {bad:o}: {entries:?}");
    }
    if my_uid() == 0 {
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&shared, Some(65534), Some(65534)).unwrap();
        let err = format!("{:#}", start().await.unwrap_err());
        assert!(
            err.contains(&shared.display().to_string()) && err.contains("owned by uid 65534"),
            "{err}"
        );
    }
}

/// One plugin's artifact renamed to another's entry is recompiled, never loaded: the plugin
/// behaves as its own file (its output, its sha in `/admin/plugins` and in the attempt). An
/// entry writable by others, or owned by another user, is replaced by a fresh compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_or_foreign_cache_entry_is_recompiled_never_loaded() {
    // `b` counts (output {"count": N}); `a` is flaky (output {"attempt": N}).
    let config = config("", &["b"], "[plugins.a]\n");
    let host = TestHost::start(&config, &[("a", plugins::FLAKY), ("b", plugins::COUNTER)]).await;
    let sha_a = host.wait_plugin("a", "loading", WAIT, loaded).await["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let sha_b = host.wait_plugin("b", "loading", WAIT, loaded).await["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let cache = host.path().join(".hookd-cache");
    let (entry_a, entry_b) = (entry_of(&cache, &sha_a), entry_of(&cache, &sha_b));
    let mut dir = host.stop().await;

    // Three ways an entry must not be trusted, each followed by a restart.
    let mut round = 0;
    let tamper: [(&str, &dyn Fn()); 3] = [
        ("a's artifact under b's name", &|| {
            std::fs::copy(&entry_a, &entry_b).unwrap();
        }),
        ("an entry writable by others", &|| {
            std::fs::set_permissions(&entry_b, std::fs::Permissions::from_mode(0o666)).unwrap();
        }),
        ("an entry owned by another user", &|| {
            if my_uid() == 0 {
                std::os::unix::fs::chown(&entry_b, Some(65534), None).unwrap();
            }
        }),
    ];
    for (what, tamper) in tamper {
        round += 1;
        tamper();
        let before = std::fs::metadata(&entry_b).unwrap();
        let host = TestHost::start_in(dir, &config).await;
        let status = host.wait_plugin("b", "loading", WAIT, loaded).await;
        assert_eq!(status["sha256"], sha_b.as_str(), "{what}: {status:#}");
        let id = format!("evt_{round}");
        host.accept_event("s", &id, &json!({})).await;
        let d = host
            .wait_state("s", &id, "b", "done", Duration::from_secs(60))
            .await;
        assert_eq!(
            d["output"],
            json!({"count": round}).to_string(),
            "{what}: b ran other code than its file: {d:#}"
        );
        assert_eq!(d["history"][0]["plugin_sha256"], sha_b.as_str(), "{what}");
        // Refused and rewritten by a fresh compile: a new file, owner-only, ours. (A new file
        // may reuse the inode number the refused one freed: its write time tells them apart.)
        let after = std::fs::metadata(&entry_b).unwrap();
        if what != "an entry owned by another user" || my_uid() == 0 {
            let written = |m: &std::fs::Metadata| (m.ino(), m.modified().unwrap());
            assert_ne!(
                written(&after),
                written(&before),
                "{what}: the entry was loaded"
            );
        }
        assert_eq!(mode(&entry_b), 0o600, "{what}");
        assert_eq!(after.uid(), my_uid(), "{what}");
        assert_ne!(
            std::fs::read(&entry_b).unwrap(),
            std::fs::read(&entry_a).unwrap(),
            "{what}"
        );
        dir = host.stop().await;
    }
}

/// Files that compile but are refused (no hookd export; an export that does not match the WIT)
/// leave nothing in the cache; the good file beside them is cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_file_leaves_nothing_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(
        dir.path(),
        &[("good", plugins::FLAKY), ("mismatch", plugins::MISMATCH)],
    );
    // The smallest valid component: it compiles, and exports nothing.
    std::fs::write(
        dir.path().join("plugins/empty.wasm"),
        b"\0asm\x0d\x00\x01\x00",
    )
    .unwrap();
    let config = config("", &["good"], "[plugins.mismatch]\n[plugins.empty]\n");
    let host = TestHost::start_in(dir, &config).await;
    for (name, needle) in [
        ("mismatch", "does not match the WIT"),
        ("empty", "exports neither"),
        // Most often a Rust crate without its `register!` line: said so.
        ("empty", "plugin_sdk::register!(handler = T)"),
    ] {
        let status = host
            .wait_plugin(name, "refusal", WAIT, |p| p["error"].is_string())
            .await;
        let error = status["error"].as_str().unwrap();
        assert!(error.contains(needle), "{name}: {error}");
    }
    let good = host.wait_plugin("good", "loading", WAIT, loaded).await;
    let (entries, others) = cache_files(&host.path().join(".hookd-cache"));
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0]
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(good["sha256"].as_str().unwrap()),
        "{entries:?}"
    );
    assert!(others.is_empty(), "{others:?}");
}

/// `server.cache_max_bytes`: with room for the largest entry but not for all of them, the
/// cache directory never holds more than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_under_its_byte_cap() {
    let files = [
        ("a", plugins::FLAKY),
        ("b", plugins::COUNTER),
        ("c", plugins::CRASHER),
    ];
    let extra = "[plugins.b]\n[plugins.c]\n";
    // First, how large the entries are.
    let host = TestHost::start(&config("", &["a"], extra), &files).await;
    for name in ["a", "b", "c"] {
        host.wait_plugin(name, "loading", WAIT, loaded).await;
    }
    let (entries, _) = cache_files(&host.path().join(".hookd-cache"));
    let sizes: Vec<u64> = entries
        .iter()
        .map(|e| std::fs::metadata(e).unwrap().len())
        .collect();
    assert_eq!(sizes.len(), 3, "{entries:?}");
    drop(host);
    let (largest, smallest) = (*sizes.iter().max().unwrap(), *sizes.iter().min().unwrap());
    let cap = largest + smallest / 2;

    let capped = config(&format!("cache_max_bytes = {cap}"), &["a"], extra);
    let host = TestHost::start(&capped, &files).await;
    for name in ["a", "b", "c"] {
        host.wait_plugin(name, "loading", WAIT, loaded).await;
    }
    let (entries, others) = cache_files(&host.path().join(".hookd-cache"));
    let total: u64 = entries
        .iter()
        .map(|e| std::fs::metadata(e).unwrap().len())
        .sum();
    assert!(
        total <= cap,
        "{total} bytes of entries over the {cap}-byte cap"
    );
    assert!(
        !entries.is_empty() && others.is_empty(),
        "{entries:?} {others:?}"
    );
}

/// The database, its `-wal` and `-shm` files and the lock file are 0600; directories hookd
/// creates for the database are 0700.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_files_are_owner_only() {
    let config = config("database = \"state/inbox/hookd.db\"", &["h"], "");
    let host = TestHost::start(&config, &[("h", plugins::FLAKY)]).await;
    host.accept_event("s", "evt_mode", &json!({})).await;
    host.wait_state("s", "evt_mode", "h", "done", Duration::from_secs(60))
        .await;
    let db = host.path().join("state/inbox/hookd.db");
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let file = PathBuf::from(format!("{}{suffix}", db.display()));
        assert!(file.exists(), "{} is missing", file.display());
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    for dir in ["state", "state/inbox"] {
        assert_eq!(mode(&host.path().join(dir)), 0o700, "{dir}");
    }
}

/// A component whose core module carries `data_len` bytes of (pseudo-random) data: cheap to
/// compile in time, but its compile holds a few copies of the data.
fn data_component(data_len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let data: Vec<u8> = (0..data_len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let pages = (data_len >> 16) as u32 + 2;
    let mut memory = leb(1);
    memory.push(0x00);
    memory.extend(leb(pages));
    let mut segment = vec![0x00, 0x41, 0x00, 0x0b];
    segment.extend(leb(data_len as u32));
    segment.extend(data);
    let mut datas = leb(1);
    datas.extend(segment);
    let mut core = b"\0asm\x01\x00\x00\x00".to_vec();
    core.extend(section(5, &memory));
    core.extend(section(11, &datas));
    component_of(&core)
}

/// A component whose core module has `funcs` functions of `groups` additions each: slow to
/// compile (seconds per hundred kilobytes in a debug build).
fn code_component(funcs: u32, groups: u32) -> Vec<u8> {
    let mut types = leb(1);
    types.extend([0x60, 0x00, 0x01, 0x7f]);
    let mut functions = leb(funcs);
    functions.extend(std::iter::repeat_n(0u8, funcs as usize));
    let mut code = leb(funcs);
    for f in 0..funcs {
        let mut body = vec![0x01, 0x01, 0x7f];
        for g in 0..groups {
            body.extend([0x20, 0x00, 0x41]);
            body.extend(sleb(((g * 7919 + f) % 100_000) as i64));
            body.extend([0x6a, 0x21, 0x00]);
        }
        body.extend([0x20, 0x00, 0x0b]);
        code.extend(leb(body.len() as u32));
        code.extend(body);
    }
    let mut core = b"\0asm\x01\x00\x00\x00".to_vec();
    core.extend(section(1, &types));
    core.extend(section(3, &functions));
    core.extend(section(10, &code));
    component_of(&core)
}

fn component_of(core: &[u8]) -> Vec<u8> {
    let mut component = b"\0asm\x0d\x00\x01\x00".to_vec();
    component.extend(section(1, core));
    component
}

fn section(id: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![id];
    out.extend(leb(body.len() as u32));
    out.extend(body);
    out
}

fn leb(mut n: u32) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn sleb(mut n: i64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0) {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// `pid` and all its descendants.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for task in tasks.flatten() {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                all.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
        i += 1;
    }
    all
}

/// Resident bytes of one process (0 once it is gone).
fn rss_bytes(pid: u32) -> u64 {
    support::try_status_kib(pid, "VmRSS").map_or(0, |kib| kib * 1024)
}

/// CPU time (user + system, its own and its reaped children's) of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // utime, stime, cutime, cstime are fields 14-17 of the line; 12-15 after the name.
    fields[11..15]
        .iter()
        .map(|f| f.parse::<u64>().unwrap())
        .sum()
}

const MIB: u64 = 1024 * 1024;

/// Four ~19 MB plugin files replaced at once: they compile one at a time (a 20 MiB queue, so
/// never two compiler processes), and the memory of hookd and its compiler processes together
/// stays under a ceiling that four compiles at once (~115 MB each here) would break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_several_large_files_at_once_compiles_them_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["p1", "p2", "p3", "p4"];
    let files: Vec<(&str, &str)> = names.iter().map(|n| (*n, plugins::FLAKY)).collect();
    install_plugins(dir.path(), &files);
    let config = config("", &["p1"], "[plugins.p2]\n[plugins.p3]\n[plugins.p4]\n");
    let host = ProcessHost::start(dir.path(), &config).await;
    for name in names {
        host.wait_plugin(name, "loading", WAIT, loaded).await;
    }
    let baseline: u64 = process_tree(host.pid()).iter().map(|p| rss_bytes(*p)).sum();

    let large: Vec<Vec<u8>> = (0..4).map(|i| data_component(19_000_000, i + 7)).collect();
    for (name, bytes) in names.iter().zip(&large) {
        let tmp = dir.path().join(format!("plugins/.{name}.part"));
        std::fs::write(&tmp, bytes).unwrap();
    }
    drop(large);
    for name in names {
        std::fs::rename(
            dir.path().join(format!("plugins/.{name}.part")),
            dir.path().join(format!("plugins/{name}.wasm")),
        )
        .unwrap();
    }
    let (mut peak, mut most_compilers) = (0u64, 0usize);
    let deadline = Instant::now() + WAIT;
    loop {
        for _ in 0..20 {
            let tree = process_tree(host.pid());
            most_compilers = most_compilers.max(tree.len() - 1);
            peak = peak.max(tree.iter().map(|p| rss_bytes(*p)).sum());
            std::thread::sleep(Duration::from_millis(5));
        }
        let list = host.plugin_list().await;
        let refused = list
            .iter()
            .filter(|p| {
                p["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("exports neither"))
            })
            .count();
        if refused == names.len() {
            break;
        }
        assert!(Instant::now() < deadline, "not all refused: {list:#?}");
    }
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "baseline {} MiB, peak {} MiB (+{} MiB), compiler processes at once: {most_compilers}",
        baseline / MIB,
        peak / MIB,
        growth / MIB
    );
    assert!(most_compilers <= 1, "{most_compilers} compiles ran at once");
    assert!(
        growth < 300 * MIB,
        "hookd and its compilers grew by {} MiB replacing four files",
        growth / MIB
    );
}

/// A compile past `server.compile_timeout_ms` is stopped: the plugin's error says so, no
/// compiler process is left, and hookd uses no CPU on it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_past_its_timeout_is_really_stopped() {
    let dir = tempfile::tempdir().unwrap();
    // ~10 MB of code: many seconds of compiling (the test profile optimises Cranelift), far
    // past the deadline.
    let plugins_dir = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins_dir).unwrap();
    std::fs::write(plugins_dir.join("slow.wasm"), code_component(600, 2000)).unwrap();
    let config = config("compile_timeout_ms = 1000", &["slow"], "");
    let started = Instant::now();
    let host = ProcessHost::start(dir.path(), &config).await;
    let status = host
        .wait_plugin("slow", "the timeout", WAIT, |p| p["error"].is_string())
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("slow.wasm")
            && error.contains("compile_timeout_ms")
            && error.contains("stopped"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the timeout took {:?}",
        started.elapsed()
    );
    // Stopped means gone: no compiler process, and no CPU spent over the next seconds, while
    // hookd is seen running (four rounds of its dispatcher, about two seconds).
    let before = cpu_ticks(host.pid());
    let admin = async |path: &str| host.admin_get(path).await;
    let (_, metrics) = admin("/metrics").await;
    support::wait_rounds(admin, support::rounds(&metrics), 4).await;
    let used = cpu_ticks(host.pid()) - before;
    let tree = process_tree(host.pid());
    assert_eq!(tree.len(), 1, "processes left under hookd: {tree:?}");
    // An idle hookd (epoch ticker, watcher) uses a few ticks; a compile would use ~300.
    assert!(
        used < 100,
        "hookd used {used} ticks of CPU after the timeout"
    );
}

/// A symlink in `plugins_dir` is refused (to a secret file and to a valid plugin alike), and
/// no load error quotes a file's bytes, whatever the file holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_in_plugins_dir_is_refused_without_echoing_file_bytes() {
    const SECRET: &str = "TOPSECRET-db-password-0123456789";
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("good", plugins::FLAKY)]);
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, format!("{SECRET}\nroot:x:0:0\n")).unwrap();
    let outside = dir.path().join("outside.wasm");
    std::fs::copy(plugins::FLAKY, &outside).unwrap();
    let plugins_dir = dir.path().join("plugins");
    std::os::unix::fs::symlink(&secret, plugins_dir.join("evil.wasm")).unwrap();
    std::os::unix::fs::symlink(&outside, plugins_dir.join("linked.wasm")).unwrap();
    // Not a link, but not wasm either: refused without quoting it.
    std::fs::write(plugins_dir.join("text.wasm"), SECRET).unwrap();
    let config = config(
        "",
        &["good"],
        "[plugins.evil]\n[plugins.linked]\n[plugins.text]\n",
    );
    let host = TestHost::start_in(dir, &config).await;
    let leaks = |error: &str| {
        error.contains("TOPSECRET")
            || error.contains("root:x")
            || error.contains("0x54")
            || error.contains("[84")
            || error.contains("54 4f")
            || error.contains("544f")
    };
    for (name, needle) in [
        ("evil", "symbolic link"),
        ("linked", "symbolic link"),
        ("text", "not a valid WebAssembly component"),
    ] {
        let status = host
            .wait_plugin(name, "refusal", WAIT, |p| p["error"].is_string())
            .await;
        let error = status["error"].as_str().unwrap();
        assert!(
            error.contains(needle) && error.contains(&format!("{name}.wasm")),
            "{name}: {error}"
        );
        assert!(!leaks(error), "{name}: the error quotes the file: {error}");
        assert!(status["sha256"].is_null(), "{name}: {status:#}");
    }
    host.wait_plugin("good", "loading", WAIT, loaded).await;
}

/// hookd killed outright (SIGKILL: no code of its own runs) mid-compile: the compiler process
/// dies with it instead of compiling on as an orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_dies_with_a_killed_hookd() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("good", plugins::TRAPPER)]);
    let host = ProcessHost::start(dir.path(), &config("", &["good"], "[plugins.slow]\n")).await;
    // Deployed once hookd runs: the reloader compiles it.
    let part = dir.path().join("plugins/.slow.part");
    std::fs::write(&part, code_component(200, 1000)).unwrap();
    std::fs::rename(&part, dir.path().join("plugins/slow.wasm")).unwrap();
    let deadline = Instant::now() + WAIT;
    let compiler = loop {
        let tree = process_tree(host.pid());
        if let Some(child) = tree.get(1) {
            break *child;
        }
        assert!(Instant::now() < deadline, "no compiler process appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    host.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{compiler}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{compiler}/stat")).unwrap_or_default();
        if state.contains(") Z") {
            break; // dead, waiting for init to reap it
        }
        assert!(
            Instant::now() < deadline,
            "the compiler process {compiler} outlived hookd"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `server.compile_memory_mib` caps the compiler process: a file whose compile needs more is
/// refused with an error naming the key, and hookd itself is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_over_its_memory_cap_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    std::fs::write(
        dir.path().join("plugins/big.wasm"),
        data_component(19_000_000, 3),
    )
    .unwrap();
    let config = config("compile_memory_mib = 64", &["big"], "");
    let host = TestHost::start_in(dir, &config).await;
    let status = host
        .wait_plugin("big", "the refusal", WAIT, |p| p["error"].is_string())
        .await;
    let error = status["error"].as_str().unwrap();
    assert!(
        error.contains("big.wasm") && error.contains("server.compile_memory_mib"),
        "{error}"
    );
    let (status, _) = host.admin_get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

/// A plugin file over its cap is refused naming the key to raise (`max_file_mib`, default
/// 20 MiB); the same bytes under a plugin whose `max_file_mib` allows them are read and compiled
/// (they export nothing, so they are refused for that instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_its_plugins_max_file_mib_is_refused_and_a_larger_cap_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("good", plugins::FLAKY)]);
    let bytes = data_component(21 << 20, 7);
    for stem in ["capped", "roomy"] {
        std::fs::write(dir.path().join(format!("plugins/{stem}.wasm")), &bytes).unwrap();
    }
    let config = config(
        "",
        &["good"],
        "[plugins.capped]\n[plugins.roomy]\nmax_file_mib = 32\n",
    );
    let host = TestHost::start_in(dir, &config).await;
    let capped = host
        .wait_plugin("capped", "refusal", WAIT, |p| p["error"].is_string())
        .await;
    let error = capped["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "is {} bytes, over the 20971520-byte cap (raise the plugin's max_file_mib)",
            bytes.len()
        )),
        "{error}"
    );
    let roomy = host
        .wait_plugin("roomy", "refusal", WAIT, |p| p["error"].is_string())
        .await;
    let error = roomy["error"].as_str().unwrap();
    assert!(error.contains("exports neither"), "{error}");
}

/// A refused file's error quotes what the file names (here an import whose name carries a
/// carriage return and a bidirectional override, which a compile error quotes): the status and
/// the log have it escaped, never raw (a forged log line, text shown reordered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_files_error_has_the_files_own_text_escaped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
    let wasm =
        wat::parse_str("(component (import \"evil\\0dname\\e2\\80\\aeline\" (func)))").unwrap();
    std::fs::write(dir.path().join("plugins/h.wasm"), wasm).unwrap();
    let host = TestHost::start_in(dir, &config("", &["h"], "")).await;
    let (_, list) = host.admin_get("/admin/plugins").await;
    let h = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "h")
        .unwrap()
        .clone();
    let error = h["error"].as_str().unwrap_or_else(|| panic!("{h:#}"));
    assert!(error.contains("evil\\rname\\u{202e}line"), "{error:?}");
    assert!(!error.contains(['\r', '\u{202e}']), "{error:?}");
}
