//! The runtime's memory walls against hostile components, each against a real `hookd serve`
//! process whose peak RSS (`VmHWM`) is read from `/proc`:
//! - a component with several linear memories gets one `memory_mib` budget for all of them
//!   (and one with more memories than allowed is refused at load);
//! - `wasi:http` header fields a handler or a parser makes the host hold are charged to the
//!   per-call host budget, which stops them with an error naming it;
//! - thousands of refused outbound requests leave one log line with the count;
//! - an unspecified address in `allow_hosts` is a config error.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    AdminApi, ProcessHost, install_plugins, plugins, post_sw, status_kib, sw_source,
};

const WAIT: Duration = Duration::from_secs(120);

/// A handler component (hand-written, as Rust cannot emit it) whose handler grows each of its
/// `memories` linear memories — one per core instance — by `pages` 64 KiB pages, touching
/// every page, then returns `ok(none)`.
fn multimem_wat(memories: usize, pages: u32) -> String {
    let instances: String = (0..memories)
        .map(|i| format!("(core instance $g{i} (instantiate $grower))\n"))
        .collect();
    let imports: String = (0..memories)
        .map(|i| format!("(import \"g{i}\" \"grow\" (func $grow{i} (param i32) (result i32)))\n"))
        .collect();
    let calls: String = (0..memories)
        .map(|i| format!("(drop (call $grow{i} (i32.const {pages})))\n"))
        .collect();
    let withs: String = (0..memories)
        .map(|i| format!("(with \"g{i}\" (instance $g{i}))"))
        .collect();
    format!(
        r#"(component
  (core module $grower
    (memory (export "memory") 1)
    (func (export "grow") (param $pages i32) (result i32)
      (local $old i32) (local $i i32)
      (local.set $old (memory.grow (local.get $pages)))
      (if (i32.eq (local.get $old) (i32.const -1)) (then (return (i32.const -1))))
      (local.set $i (local.get $old))
      (block $done
        (loop $touch
          (br_if $done (i32.ge_u (local.get $i) (i32.add (local.get $old) (local.get $pages))))
          (i32.store8 (i32.mul (local.get $i) (i32.const 65536)) (i32.const 1))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $touch)))
      (local.get $old)))
  {instances}
  (core module $main
    {imports}
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $ptr i32)
      (local.set $ptr
        (i32.and
          (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
          (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $ptr) (local.get 3)))
      (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
        (then (drop (memory.grow
          (i32.add
            (i32.shr_u (i32.sub (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
                       (i32.const 16))
            (i32.const 1))))))
      (local.get $ptr))
    (func (export "handle") (param i32) (result i32)
      {calls}
      (i64.store (i32.const 0) (i64.const 0))
      (i64.store (i32.const 8) (i64.const 0))
      (i32.const 0)))
  (core instance $m (instantiate $main {withs}))
  (type $header (record (field "name" string) (field "value" string)))
  (type $event (record
    (field "source" string)
    (field "event-id" string)
    (field "event-type" string)
    (field "ordering-key" (option string))
    (field "sequence" (option u64))
    (field "attempt" u32)
    (field "received-at-ms" u64)
    (field "headers" (list $header))
    (field "body" (list u8))))
  (type $retry-later (record (field "reason" string) (field "after-ms" (option u64))))
  (type $handle-error (variant (case "retry" $retry-later) (case "permanent" string)))
  (func $handle (param "ev" $event) (result (result (option string) (error $handle-error)))
    (canon lift (core func $m "handle") (memory $m "memory") (realloc (func $m "realloc"))))
  (instance $handler
    (export "header" (type $header))
    (export "event" (type $event))
    (export "retry-later" (type $retry-later))
    (export "handle-error" (type $handle-error))
    (export "handle" (func $handle)))
  (export "hookd:plugin/handler@0.1.0" (instance $handler))
)"#
    )
}

/// [`multimem_wat`]'s handler (one memory, grown by nothing) with `tables` more core
/// instances, each defining one empty table (nothing against its memory limit), whose `handle`
/// spins until the attempt's timeout stops it.
fn tables_wat(tables: usize) -> String {
    let instances: String = (0..tables)
        .map(|i| format!("(core instance $t{i} (instantiate $table))\n"))
        .collect();
    multimem_wat(1, 0)
        .replacen(
            "(core module $main",
            &format!("(core module $table (table 0 funcref))\n{instances}(core module $main"),
            1,
        )
        .replacen(
            "(func (export \"handle\") (param i32) (result i32)",
            "(func (export \"handle\") (param i32) (result i32)\n(loop $spin (br $spin))",
            1,
        )
}

fn write_multimem(dir: &Path, stem: &str, memories: usize, pages: u32) {
    let wasm = wat::parse_str(multimem_wat(memories, pages))
        .unwrap_or_else(|e| panic!("multimem WAT ({memories} memories): {e}"));
    let plugins_dir = dir.join("plugins");
    std::fs::create_dir_all(&plugins_dir).unwrap();
    std::fs::write(plugins_dir.join(format!("{stem}.wasm")), wasm).unwrap();
}

/// Where `fieldhog` sits in the test source `s`.
enum Role {
    Parser,
    Handler,
}

/// `hookd serve` with `fieldhog` as the parser or the one handler of the standard-webhooks
/// source `s`, `plugin` added to its `[plugins.fieldhog]` table. Keep the directory alive.
async fn start_fieldhog(role: Role, plugin: &str) -> (tempfile::TempDir, ProcessHost) {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("fieldhog", plugins::FIELDHOG)]);
    let (handlers, parser): (&[&str], &str) = match role {
        Role::Parser => (&[], "parser = \"fieldhog\"\n"),
        Role::Handler => (&["fieldhog"], ""),
    };
    let text = sw_source(
        "s",
        handlers,
        &format!("{parser}[plugins.fieldhog]\n{plugin}"),
    );
    let host = ProcessHost::start(dir.path(), &config(&text)).await;
    (dir, host)
}

fn config(body: &str) -> String {
    format!(
        r#"[server]
{body}"#
    )
}

async fn post_event(host: &ProcessHost, source: &str, id: &str, body: &Value) -> Value {
    let (status, reply) = post_sw(host.ingest, source, id, body.to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{id}: {reply}");
    reply
}

fn last_attempt(delivery: &Value) -> &Value {
    delivery["history"]
        .as_array()
        .and_then(|h| h.last())
        .unwrap_or_else(|| panic!("no attempt in {delivery:#}"))
}

/// The hand-written multi-memory component is a well-typed handler (so the refusals below are
/// about memory, not about its shape).
#[tokio::test]
async fn the_multimem_component_is_a_valid_handler() {
    let runtime = host::runtime::Runtime::new().unwrap();
    let wasm = wat::parse_str(multimem_wat(2, 1)).unwrap();
    let plugin = runtime.compile(&wasm).unwrap();
    runtime
        .typecheck(&plugin, &Default::default())
        .await
        .unwrap();
}

/// A component whose memory starts at 128 MiB could never run as a handler held to 64 MiB
/// (`memory_mib`'s default): the load check starts each role within the most memory an
/// instance using it so may hold, so such a version is refused when it loads, naming the
/// setting and that instance, and the version before it keeps serving. Before, the check allowed any role 256 MiB: the file
/// went live and every attempt trapped.
#[tokio::test]
async fn a_role_that_cannot_start_within_its_instances_memory_is_refused_at_load() {
    let runtime = host::runtime::Runtime::new().unwrap();
    let wat = multimem_wat(1, 1).replacen(
        "(memory (export \"memory\") 1)\n    (global",
        "(memory (export \"memory\") 2048)\n    (global",
        1,
    );
    assert_ne!(
        wat,
        multimem_wat(1, 1),
        "the main memory's size was not found"
    );
    let plugin = runtime.compile(&wat::parse_str(wat).unwrap()).unwrap();
    let held = host::runtime::StartLimits {
        handler_memory: 64 << 20,
        handler_instance: Some("roomiest".into()),
        ..Default::default()
    };
    let refused = runtime.typecheck(&plugin, &held).await.unwrap_err();
    let message = refused.to_string();
    assert!(
        message.starts_with("starting its handler role failed: memory limit exceeded")
            && message.contains("(memory_mib)")
            && message.contains("(memory_mib of plugins.roomiest, the most of the instances"),
        "{message}"
    );
    let roomy = host::runtime::StartLimits {
        handler_memory: 160 << 20,
        ..Default::default()
    };
    runtime.typecheck(&plugin, &roomy).await.unwrap();

    // A role no instance uses starts within a fixed 256 MiB, and the error says so rather than
    // name a setting no instance has.
    let huge = multimem_wat(1, 1).replacen(
        "(memory (export \"memory\") 1)\n    (global",
        "(memory (export \"memory\") 5000)\n    (global",
        1,
    );
    let plugin = runtime.compile(&wat::parse_str(huge).unwrap()).unwrap();
    let refused = runtime
        .typecheck(&plugin, &Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("(the 256 MiB a role no instance uses may start in)")
            && !refused.contains("memory_mib"),
        "{refused}"
    );
}

/// A good file checked while the calls in flight hold the host's plugin memory waits for it
/// instead of being refused: before, it was refused as "not a valid WebAssembly component",
/// and a deploy under load silently kept the old version until the file was written again.
#[tokio::test]
async fn a_load_check_waits_for_the_hosts_plugin_memory() {
    let runtime = host::runtime::Runtime::new().unwrap();
    let plugin = runtime
        .compile(&wat::parse_str(multimem_wat(1, 1)).unwrap())
        .unwrap();
    runtime.limit_plugin_memory(0);
    let checking = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.typecheck(&plugin, &Default::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!checking.is_finished(), "{:?}", checking.await);
    runtime.limit_plugin_memory(u64::MAX);
    checking.await.unwrap().unwrap();
}

/// Three linear memories grown by 62.5 MiB each (touched), beside the main one, are 187 MiB:
/// far over one 64 MiB budget, though each alone is under it. The attempt traps naming
/// `memory_mib` and the host's peak RSS stays far below what the memories would take; a
/// component with more memories than a call may have (16) is refused when it loads, and the
/// host keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_linear_memories_share_one_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    write_multimem(dir.path(), "multimem", 3, 1000);
    write_multimem(dir.path(), "sixteen", 16, 1);
    install_plugins(dir.path(), &[("counter", plugins::COUNTER)]);
    let host = ProcessHost::start(
        dir.path(),
        &config(
            &(sw_source("s", &["multimem", "counter"], "")
                + &sw_source("t", &["sixteen"], "[plugins.multimem]\nmax_attempts = 1")),
        ),
    )
    .await;
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, listed) = host.admin_get("/admin/plugins").await;
        let sixteen = listed.as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["name"] == "sixteen" || p["wasm"] == "sixteen")
                .cloned()
        });
        let error = sixteen
            .as_ref()
            .and_then(|p| p["error"].as_str())
            .unwrap_or_default()
            .to_owned();
        if !error.is_empty() {
            assert!(
                error.contains("memor"),
                "a 16-memory component must be refused at load, naming memories: {sixteen:#?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the 16-memory component was never refused: {listed:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let baseline = status_kib(host.pid(), "VmRSS");
    post_event(&host, "s", "mm-1", &json!({})).await;
    let delivery = host.wait_state("s", "mm-1", "multimem", "dead", WAIT).await;
    let attempt = last_attempt(&delivery);
    let error = attempt["error"].as_str().unwrap_or_default();
    assert_eq!(attempt["outcome"], "trap", "{delivery:#}");
    assert!(
        error.contains("memory limit exceeded")
            && error.contains("memory_mib")
            && error.contains("67108864"),
        "{error}"
    );
    host.wait_state("s", "mm-1", "counter", "done", WAIT).await;
    let peak = status_kib(host.pid(), "VmHWM");
    eprintln!("multimem: hookd RSS {baseline} KiB before, peak {peak} KiB");
    assert!(
        peak < baseline + 128 * 1024,
        "peak RSS {peak} KiB, baseline {baseline} KiB: the memories were not bounded together"
    );
}

/// `fieldhog` as a handler keeps up to 10 000 `wasi:http` fields of ~120 KiB (and, in its
/// second event, clones of one): without a host budget that is ~1.2 GB of host heap per call.
/// Each attempt must trap naming the host memory limit, with the host's RSS bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_a_handler_hoards_hit_the_per_call_host_budget() {
    let (_dir, host) = start_fieldhog(Role::Handler, "max_attempts = 1\n").await;
    let baseline = status_kib(host.pid(), "VmRSS");
    for (id, mode) in [("fh-fields", "fields"), ("fh-clone", "clone")] {
        post_event(&host, "s", id, &json!({ "mode": mode })).await;
        let delivery = host.wait_state("s", id, "fieldhog", "dead", WAIT).await;
        let attempt = last_attempt(&delivery);
        let error = attempt["error"].as_str().unwrap_or_default();
        assert_eq!(attempt["outcome"], "trap", "{mode}: {delivery:#}");
        assert!(
            error.contains("host memory limit exceeded") && error.contains("16777216"),
            "{mode}: {error}"
        );
    }
    let peak = status_kib(host.pid(), "VmHWM");
    eprintln!("fieldhog handler: hookd RSS {baseline} KiB before, peak {peak} KiB");
    assert!(
        peak < baseline + 256 * 1024,
        "peak RSS {peak} KiB, baseline {baseline} KiB: host-side fields were not bounded"
    );
}

/// One host call's many small values are charged before the host copies them: a `fields.set`
/// of two million one-byte values (16 MB of arguments in the guest, ~100 MB of its memory in
/// all) traps on the host budget with nothing copied. Before, wasmtime lifted the whole list
/// into host `Vec`s first (~160 MB more; five million values made 460 MB) and the budget
/// refused it only after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_call_cannot_make_the_host_allocate_before_its_charge() {
    let (_dir, host) = start_fieldhog(Role::Handler, "max_attempts = 1\nmemory_mib = 256\n").await;
    let baseline = status_kib(host.pid(), "VmRSS");
    let many = json!({ "mode": "one-call", "count": 2_000_000 });
    post_event(&host, "s", "fh-one", &many).await;
    let delivery = host
        .wait_state("s", "fh-one", "fieldhog", "dead", WAIT)
        .await;
    let attempt = last_attempt(&delivery);
    let error = attempt["error"].as_str().unwrap_or_default();
    assert_eq!(attempt["outcome"], "trap", "{delivery:#}");
    assert!(error.contains("host memory limit exceeded"), "{error}");
    let peak = status_kib(host.pid(), "VmHWM");
    eprintln!("one call's values: hookd RSS {baseline} KiB before, peak {peak} KiB");
    assert!(
        peak < baseline + 140 * 1024,
        "peak RSS {peak} KiB, baseline {baseline} KiB: the values were copied before the charge"
    );
}

/// One plugin's calls cannot take the instance pool's tables (nor its core instances or
/// memories) another plugin's calls need: the pool holds every slot's worth at the
/// per-component maxima. Here 80 calls of a handler with 55 empty tables each, spinning, held
/// all 4 400 tables the pool had, and `counter`'s call then failed to instantiate
/// ("maximum concurrent limit of 4400 for tables reached"), a `trap` counted against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plugins_calls_cannot_take_the_pools_tables_from_another() {
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("counter", plugins::COUNTER)]);
    let wasm = wat::parse_str(tables_wat(55)).unwrap();
    std::fs::write(dir.path().join("plugins/tables.wasm"), wasm).unwrap();
    let text = format!(
        "workers = 128\n{}{}",
        sw_source(
            "t",
            &["tables"],
            "[plugins.tables]\ntimeout_ms = 5000\nmax_attempts = 1\n"
        ),
        sw_source("c", &["counter"], "[plugins.counter]\nmax_attempts = 1\n"),
    );
    let host = ProcessHost::start(dir.path(), &config(&text)).await;
    for i in 0..100 {
        post_event(&host, "t", &format!("t-{i}"), &json!({})).await;
    }
    // Once 80 spinners run, their instances hold 80 × 55 tables.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, running) = host
            .admin_get("/admin/events?source=t&state=running&limit=1000")
            .await;
        if running.as_array().map_or(0, Vec::len) >= 80 {
            break;
        }
        assert!(Instant::now() < deadline, "the spinners did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    post_event(&host, "c", "c-1", &json!({})).await;
    let delivery = host.wait_state("c", "c-1", "counter", "done", WAIT).await;
    assert_eq!(delivery["attempts"], 1, "{delivery:#}");
}

/// The same hoarding in a parser (which has no network, but can still create fields): the
/// parse fails on the host budget, the request is quarantined (never lost), the log names the
/// limit and RSS stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_a_parser_hoards_hit_the_per_call_host_budget() {
    let (_dir, host) = start_fieldhog(Role::Parser, "parser_timeout_ms = 20000\n").await;
    let baseline = status_kib(host.pid(), "VmRSS");
    let reply = post_event(&host, "s", "fp-1", &json!({})).await;
    assert_eq!(reply, json!({"accepted": true, "quarantined": true}));
    let log = host.wait_log("request quarantined", WAIT).await;
    assert!(
        log.contains("host memory limit exceeded"),
        "the quarantine must say why:\n{log}"
    );
    let peak = status_kib(host.pid(), "VmHWM");
    eprintln!("fieldhog parser: hookd RSS {baseline} KiB before, peak {peak} KiB");
    assert!(
        peak < baseline + 256 * 1024,
        "peak RSS {peak} KiB, baseline {baseline} KiB: a parser's fields were not bounded"
    );
}

/// 1 500 refused requests in one attempt leave one warning with the count, not 1 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_refused_requests_log_one_line_with_the_count() {
    let (_dir, host) = start_fieldhog(
        Role::Handler,
        "max_attempts = 1\nallow_hosts = [\"api.example.com:80\"]\n",
    )
    .await;
    let body =
        json!({"mode": "refusals", "url": "http://127.0.0.1:9/secret?token=t0p", "count": 1500});
    post_event(&host, "s", "rf-1", &body).await;
    let delivery = host.wait_state("s", "rf-1", "fieldhog", "done", WAIT).await;
    let output: Value = serde_json::from_str(delivery["output"].as_str().unwrap()).unwrap();
    assert_eq!(output, json!({"denied": 1500, "other": 0}), "{delivery:#}");
    let log = host.wait_log("outbound requests denied", WAIT).await;
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("outbound request"))
        .collect();
    assert_eq!(lines.len(), 1, "one aggregated line, got {}", lines.len());
    assert!(
        lines[0].contains("1500") && lines[0].contains("127.0.0.1:9 is not in allow_hosts"),
        "{}",
        lines[0]
    );
    assert!(
        !lines[0].contains("secret") && !lines[0].contains("t0p"),
        "{}",
        lines[0]
    );
}

/// `0.0.0.0:PORT` and `[::]:PORT` reach this machine: as allow-list entries they are a config
/// error naming the key and the entry, and hookd does not start.
#[test]
fn unspecified_addresses_in_allow_hosts_are_a_config_error() {
    for entry in ["0.0.0.0:8081", "[::]:8081", "[::ffff:0.0.0.0]:8081"] {
        let dir = tempfile::tempdir().unwrap();
        let text = crate::support::config_text(&format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [plugins.p]\nallow_hosts = [\"{entry}\"]\n"
        ));
        std::fs::write(dir.path().join("hookd.toml"), text).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
            .args(["serve", "--config"])
            .arg(dir.path().join("hookd.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .unwrap();
        // A config error ends hookd at once; one that is accepted leaves it serving.
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{entry}: hookd accepted the config and started serving");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
        assert!(!status.success(), "{entry}: hookd exited successfully");
        assert!(
            stderr.contains("plugins.p.allow_hosts")
                && stderr.contains(entry)
                && stderr.contains("unspecified address"),
            "{entry}: {stderr}"
        );
    }
}

/// A host whose plugins share a 64 MiB pool of memory (`server.plugin_memory_mib`), with
/// `other` (a source and its plugin `file`, installed beside `flaky`) and, once this returns,
/// 60 MiB of the pool held for 4 s by handler `h` (`flaky`, `memory_mib = 128` and `h_extra`)
/// of source `s` (event `holder`).
async fn pool_held(
    dir: &std::path::Path,
    file: (&str, &str),
    h_extra: &str,
    other: String,
) -> ProcessHost {
    install_plugins(dir, &[("h", plugins::FLAKY), file]);
    let config = format!(
        "[server]\nplugin_memory_mib = 64\n{}{other}",
        sw_source(
            "s",
            &["h"],
            &format!("[plugins.h]\nmemory_mib = 128\n{h_extra}")
        ),
    );
    let host = ProcessHost::start(dir, &config).await;
    // Most of what handlers may hold together: three quarters of the pool, 48 MiB.
    let hold = json!({"hold_mib": 44, "sleep_ms": 4000}).to_string();
    let (status, reply) = post_sw(host.ingest, "s", "holder", hold.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    host.wait_state("s", "holder", "h", "running", WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    host
}

/// A handler that cannot even be started while the calls in flight hold the host's plugin
/// memory (`bulky` starts with 16 MiB) never ran: its attempt is recorded `abandoned`
/// (`plugin_memory`), not counted, and it runs once memory is free, even with
/// `max_attempts = 1` and at-most-once. Before, that attempt was a `trap` counted like any,
/// and one plugin hoarding the pool dead-lettered another's events without them ever running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_the_host_memory_could_not_start_is_not_counted_and_runs_later() {
    let dir = tempfile::tempdir().unwrap();
    let host = pool_held(
        dir.path(),
        ("bulky", plugins::BULKY),
        "",
        sw_source(
            "b",
            &["bulky"],
            "[plugins.bulky]\nmax_attempts = 1\ndelivery = \"at-most-once\"\n\
             backoff_base_ms = 300\nbackoff_max_ms = 300\n",
        ),
    )
    .await;

    let (status, reply) = post_sw(host.ingest, "b", "crowded", b"{}").await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let done = host
        .wait_delivery("b", "crowded", "bulky", WAIT, |d| {
            d["state"] != "pending" && d["state"] != "running" && d["state"] != "retrying"
        })
        .await;
    assert_eq!(done["state"], "done", "{done:#}");
    let history = done["history"].as_array().unwrap();
    let first = &history[0];
    assert_eq!(
        (&first["outcome"], &first["error_kind"]),
        (&json!("abandoned"), &json!("plugin_memory")),
        "{done:#}"
    );
    assert!(
        first["error"]
            .as_str()
            .is_some_and(|e| e.contains("server.plugin_memory_mib")),
        "{done:#}"
    );
    assert_eq!(
        crate::support::outcomes(&done).last(),
        Some(&"ok"),
        "{done:#}"
    );
    host.wait_state("s", "holder", "h", "done", WAIT).await;
}

/// Every call in flight draws its linear memory from one host-wide pool
/// (`server.plugin_memory_mib`), so the host's memory is not the sum of every call's own limit.
/// While one attempt holds most of what handlers may hold (three quarters of the pool): another
/// attempt's growth fails with an error naming the key and is retried (done once the first has
/// finished); a parser still gets the quarter kept for parsers (before, handlers could hold it
/// all, and every source with a parser answered 503); and a request whose parser cannot get
/// memory is answered 503 + `Retry-After` (nothing stored or quarantined), then accepted when
/// sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_share_one_host_wide_memory_pool() {
    let dir = tempfile::tempdir().unwrap();
    let host = pool_held(
        dir.path(),
        ("g", plugins::GENERIC),
        "backoff_base_ms = 500\nbackoff_max_ms = 2000\n",
        sw_source(
            "p",
            &[],
            "parser = \"g\"\n[plugins.g]\nconfig = { id_pointer = \"/id\" }\n",
        ),
    )
    .await;

    let small = json!({"hold_mib": 8}).to_string();
    let (status, reply) = post_sw(host.ingest, "s", "squeezed", small.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    // Another attempt asks for the rest of the pool: beyond the handlers' share, refused.
    let hog = json!({"hold_mib": 17, "sleep_ms": 3000}).to_string();
    let (status, reply) = post_sw(host.ingest, "s", "hog", hog.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fits = json!({"id": "fits-1", "pad": "x".repeat(1 << 20)}).to_string();
    let (status, reply) = post_sw(host.ingest, "p", "fits-1", fits.as_bytes())
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "the parsers' quarter: {reply}"
    );
    let big = json!({"id": "big-1", "pad": "x".repeat(12 << 20)}).to_string();
    let (status, headers, body) =
        crate::support::send_sw(host.ingest, "p", "big-1", big.as_bytes())
            .await
            .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:?}");
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(host.event("p", "big-1").await.is_none());

    let squeezed = host.wait_state("s", "squeezed", "h", "done", WAIT).await;
    let first = &squeezed["history"][0];
    assert_eq!(first["outcome"], "trap", "{squeezed:#}");
    assert!(
        first["error"]
            .as_str()
            .is_some_and(|e| e.contains("server.plugin_memory_mib")),
        "{squeezed:#}"
    );
    for done in ["holder", "hog"] {
        host.wait_state("s", done, "h", "done", WAIT).await;
    }
    let (status, reply) = crate::support::post_sw(host.ingest, "p", "big-1", big.as_bytes())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(reply["duplicate"], false, "{reply}");
}
