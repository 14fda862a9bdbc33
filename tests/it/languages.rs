//! The same guarantees whatever language a handler is written in. The `scenario` plugin does
//! what each event's body asks (see `tests/plugins/scenario/src/lib.rs`); its Rust, JavaScript
//! (`tests/plugins-js/scenario`) and Python (`tests/plugins-py/scenario`) twins run against a
//! real `hookd serve`, one test per language, through the same checks: the handler never sees
//! a duplicate, retry and permanent failures, state atomic with `done` and no lost update, the
//! `Idempotency-Key` on outbound calls, the event's body stored, read back, stored again and
//! posted byte for byte (the bytes a component's JavaScript gets are of another realm of the
//! engine, which the JavaScript SDK once took for an object), a host not listed refused, an infinite loop timed out,
//! unbounded memory growth trapped, output and log caps. And what an author does: `hookd new
//! handler --lang ts|python`, the scaffold's unit test, `hookd dev` building and serving it,
//! an edit rebuilt and hot-swapped.
//!
//! The JavaScript and Python components are built here, once per source change (cached in
//! `target/lang-plugins/` by a hash of their sources and SDK), with the toolchains `.ci/run`
//! installs (`npm ci --prefix plugin-sdk/js`; componentize-py in `target/py-venv`). Without
//! them those two tests say so and pass, unless `HOOKD_TEST_LANGUAGES_REQUIRED=1` (set by
//! `.ci/run`) makes them fail.

use std::{
    collections::BTreeSet,
    hash::{Hash as _, Hasher as _},
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
    time::Duration,
};

use http::StatusCode;
use serde_json::{Value, json};

use crate::{
    outbound::{Mock, Reply, header},
    support::{
        ADMIN_TOKEN, AdminApi, ProcessHost, install_plugins, plugins, post_sw, send, sw_source,
    },
};

const WAIT: Duration = Duration::from_secs(300);

/// One language's build of the scenario plugin.
struct Language {
    name: &'static str,
    /// Its `[plugins.h]` keys beyond the shared ones (an interpreter needs a larger file cap
    /// and more memory).
    limits: &'static str,
}

const JAVASCRIPT: Language = Language {
    name: "javascript",
    limits: "max_file_mib = 64\nmemory_mib = 256\n",
};
const PYTHON: Language = Language {
    name: "python",
    limits: "max_file_mib = 128\nmemory_mib = 256\n",
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_handler_keeps_every_guarantee() {
    keeps_every_guarantee(
        Path::new(plugins::SCENARIO),
        &Language {
            name: "rust",
            limits: "",
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_handler_keeps_every_guarantee() {
    if let Some(wasm) = built(&JAVASCRIPT) {
        keeps_every_guarantee(&wasm, &JAVASCRIPT).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_handler_keeps_every_guarantee() {
    if let Some(wasm) = built(&PYTHON) {
        keeps_every_guarantee(&wasm, &PYTHON).await;
    }
}

/// `hookd new handler --lang ts`, its unit test, `hookd dev` serving it, an edit hot-swapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_typescript_handler_is_tested_served_and_hot_swapped_by_hookd_dev() {
    if toolchain_ready(&JAVASCRIPT) {
        scaffolded(&JAVASCRIPT).await;
    }
}

/// `hookd new handler --lang python`, its unit test, `hookd dev` serving it, an edit
/// hot-swapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_python_handler_is_tested_served_and_hot_swapped_by_hookd_dev() {
    if toolchain_ready(&PYTHON) {
        scaffolded(&PYTHON).await;
    }
}

/// `build.mjs` says what is wrong with an entry it cannot build, before ComponentizeJS runs: an
/// import of a Node built-in (esbuild advised bundling "for node"), unless a package in
/// `node_modules` provides that bare name (a polyfill, bundled as usual); and an entry that does
/// not export `handler` (ComponentizeJS named its own `source.js` and suggested
/// `export const handler = {}`).
#[test]
fn the_js_build_names_a_node_builtin_and_a_missing_handler_export() {
    if !toolchain_ready(&JAVASCRIPT) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("node_modules/events");
    std::fs::create_dir_all(&events).unwrap();
    std::fs::write(
        events.join("package.json"),
        r#"{"name":"events","main":"index.js"}"#,
    )
    .unwrap();
    std::fs::write(events.join("index.js"), "export class EventEmitter {}\n").unwrap();
    let sdk = "import { defineHandler } from \"@hookd/plugin-sdk\";\n";
    let build = |name: &str, source: String| {
        std::fs::write(dir.path().join(name), source).unwrap();
        let out = Command::new("node")
            .arg(workspace().join("plugin-sdk/js/build.mjs"))
            .args([name, "out.wasm"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for import in ["node:fs", "crypto"] {
        let source = format!(
            "import * as m from \"{import}\";\n{sdk}export const handler = defineHandler(() => String(m));\n"
        );
        let (built, stderr) = build("builtin.ts", source);
        assert!(!built, "{import}: {stderr}");
        assert!(
            stderr.contains(&format!("\"{import}\" is a Node.js built-in module"))
                && !stderr.contains("platform"),
            "{import}: {stderr}"
        );
    }
    let (built, stderr) = build(
        "misnamed.ts",
        format!("{sdk}export const handle = defineHandler(() => \"x\");\n"),
    );
    assert!(!built, "{stderr}");
    assert!(
        stderr.contains("does not export `handler` (it exports: handle)"),
        "{stderr}"
    );
    let (built, stderr) = build(
        "polyfill.ts",
        format!(
            "import {{ EventEmitter }} from \"events\";\n{sdk}\
             export const handler = defineHandler(() => String(new EventEmitter()));\n"
        ),
    );
    assert!(built, "a polyfill in node_modules is bundled: {stderr}");
}

/// What an author does with a new handler in `language`, from the scaffold to a hot swap.
async fn scaffolded(language: &Language) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("scaffolded");
    let (lang, source, unit_test, edit): (_, _, Vec<&str>, _) = match language.name {
        "javascript" => (
            "ts",
            "src/handler.ts",
            vec!["npm", "test"],
            ("number ${count}", "event number ${count}"),
        ),
        _ => (
            "python",
            "handler.py",
            vec!["python3", "-m", "unittest"],
            ("number {count}", "event number {count}"),
        ),
    };
    let new = [
        "new",
        "handler",
        "scaffolded",
        "--lang",
        lang,
        "--path",
        dir.to_str().unwrap(),
    ];
    let created = crate::support::hookd_cli(tmp.path(), &new).await;
    assert!(created.status.success(), "{created:?}");

    // Its unit test; for TypeScript also the scaffold's type check (`npm run check`) and the
    // README's `npm run build` in the fresh scaffold (no `plugins/` there yet).
    let mut commands = vec![unit_test];
    if lang == "ts" {
        commands.extend([vec!["npm", "run", "check"], vec!["npm", "run", "build"]]);
    }
    for command in &commands {
        let out = Command::new(command[0])
            .args(&command[1..])
            .current_dir(&dir)
            .env("PYTHONPATH", workspace().join("plugin-sdk/python"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if lang == "ts" {
        assert!(dir.join("plugins/scaffolded.wasm").is_file());
    }

    // Its hookd.toml as generated, on free ports, with the tests' admin token and a compile
    // timeout a loaded machine's debug build cannot miss.
    let generated = std::fs::read_to_string(dir.join("hookd.toml")).unwrap();
    let (secret, config) = crate::support::scaffold_config(&generated);
    let config = config.replace("[server]\n", "[server]\ncompile_timeout_ms = 600000\n");
    let host = ProcessHost::start_dev(&dir, &config, &[]).await;

    let post = async |id: &str| {
        let body = br#"{"type":"order.paid"}"#;
        let headers = crate::support::sign(
            &crate::support::Scheme::StandardWebhooks,
            &secret,
            id,
            body,
            std::time::SystemTime::now(),
        );
        let (status, reply) = host.post("scaffolded", &headers, body).await.unwrap();
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        host.wait_state("scaffolded", id, "scaffolded", "done", WAIT)
            .await
    };
    let first = post("evt_1").await;
    assert_eq!(first["output"], r#"{"count":1,"event_type":"order.paid"}"#);
    host.wait_log("hello: evt_1 is order.paid number 1", WAIT)
        .await;
    let first_sha = first["history"][0]["plugin_sha256"].clone();
    // Nothing but an edit rebuilds (hookd's own files in the directory do not): the file that
    // served the first event is still live.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = host.log();
    assert!(!log.contains("plugin sources changed"), "{log}");
    assert_eq!(host.plugin("scaffolded").await["sha256"], first_sha);

    // Save an edit: `hookd dev` runs the build command again and the host hot-swaps the file.
    let path = dir.join(source);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace(edit.0, edit.1);
    assert_ne!(edited, text, "the scaffold changed; update this test");
    std::fs::write(&path, edited).unwrap();
    host.wait_plugin("scaffolded", "the rebuilt file going live", WAIT, |p| {
        !p["sha256"].is_null() && p["sha256"] != first_sha && p["error"].is_null()
    })
    .await;
    let second = post("evt_2").await;
    assert_ne!(second["history"][0]["plugin_sha256"], first_sha);
    host.wait_log("hello: evt_2 is order.paid event number 2", WAIT)
        .await;
}

/// Runs every check against one host whose handler `h` is `wasm`.
async fn keeps_every_guarantee(wasm: &Path, language: &Language) {
    let mock = Mock::start(|_, seen| match seen.path.as_str() {
        // Over the SDKs' 8 MiB response cap: read within a body limit, it is no error.
        "/large" => Reply::new(StatusCode::OK, vec![b'x'; 9 << 20]),
        _ => Reply::new(StatusCode::OK, "ok"),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    install_plugins(dir.path(), &[("h", wasm.to_str().unwrap())]);
    let extra = format!(
        "[plugins.h]\nmax_attempts = 3\nbackoff_base_ms = 10\nbackoff_max_ms = 50\n\
         timeout_ms = 3000\noutput_kib = 64\nlog_kib = 64\n\
         allow_hosts = [\"127.0.0.1:{port}\"]\n{limits}",
        port = mock.port(),
        limits = language.limits,
    );
    // An interpreter's component takes a debug build tens of seconds to compile on a loaded
    // machine: a generous compile timeout, and a cache shared by runs (keyed by the file's
    // sha256, so a changed build is compiled again).
    let server = format!(
        "[server]\ncompile_timeout_ms = 600000\ncache_dir = {:?}\n",
        workspace().join("target/lang-plugins/cache")
    );
    let config = server + &sw_source("s", &["h"], &extra);
    let host = ProcessHost::start_within(dir.path(), &config, WAIT).await;
    host.wait_plugin("h", "loading", WAIT, |p| {
        p["sha256"].is_string() && p["error"].is_null()
    })
    .await;
    let lang = language.name;
    let post = async |id: &str, body: Value| {
        let (status, reply) = post_sw(host.ingest, "s", id, body.to_string().as_bytes())
            .await
            .unwrap();
        assert!(status.is_success(), "{lang} {id}: {status} {reply}");
        reply
    };

    // A duplicate is acknowledged and never handled: the count is 1.
    post("dup", json!({"do": "count", "key": "dup"})).await;
    let again = post("dup", json!({"do": "count", "key": "dup"})).await;
    assert_eq!(again["duplicate"], true, "{lang}: {again}");
    // Concurrent attempts on one key: every count from 1 to N once, no lost update.
    const N: usize = 12;
    let posts: Vec<_> = (0..N)
        .map(|i| {
            let body = json!({"do": "count", "key": "c"});
            tokio::spawn(post_owned(host.ingest, format!("c{i}"), body))
        })
        .collect();
    for post in posts {
        post.await.unwrap();
    }
    post("fail", json!({"do": "fail", "until": 3})).await;
    post("permanent", json!({"do": "permanent"})).await;
    post("write", json!({"do": "write-then-fail", "key": "w"})).await;
    let url = format!("http://127.0.0.1:{}/hook", mock.port());
    post("fetch", json!({"do": "fetch", "url": url})).await;
    // The body as bytes: stored, read back and stored again, posted with `http.post(url, body)`.
    // Spaces, a non-ASCII character and a JSON escape: re-encoding it would change its bytes.
    let copy_url = format!("http://127.0.0.1:{}/copy", mock.port());
    let copied = format!(
        r#"{{"do": "copy", "key": "b", "copy": "b2", "url": "{copy_url}", "text": "é \u00e9 😀"}}"#
    );
    let (status, reply) = post_sw(host.ingest, "s", "copy", copied.as_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{lang} copy: {status} {reply}");
    let large = format!("http://127.0.0.1:{}/large", mock.port());
    post("peek", json!({"do": "peek", "url": large, "bytes": 4096})).await;
    post(
        "denied",
        json!({"do": "fetch", "url": "http://127.0.0.1:9/x"}),
    )
    .await;
    post("spin", json!({"do": "spin"})).await;
    post("grow", json!({"do": "grow"})).await;
    post("output", json!({"do": "output", "bytes": 70_000})).await;
    post("log", json!({"do": "log", "bytes": 200_000})).await;
    post("stale", json!({"do": "stale"})).await;
    post("unknown", json!({"do": "dance"})).await;

    let done = async |id: &str| host.wait_state("s", id, "h", "done", WAIT).await;
    let dead = async |id: &str| host.wait_state("s", id, "h", "dead", WAIT).await;

    let d = done("dup").await;
    assert_eq!(output(&d), json!({"count": 1}), "{lang}");
    crate::support::assert_ok_after_conflicts_only(&d, lang);

    let mut counts = BTreeSet::new();
    for i in 0..N {
        counts.insert(
            output(&done(&format!("c{i}")).await)["count"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(counts, (1..=N as u64).collect(), "{lang}: every count once");
    assert_eq!(state(&host, "c").await, Some(json!(N)), "{lang}");
    assert_eq!(state(&host, "dup").await, Some(json!(1)), "{lang}");

    let d = done("fail").await;
    assert_eq!(outcomes(&d), ["retry", "retry", "ok"], "{lang}: {d:#}");
    assert_eq!(output(&d), json!({"attempt": 3}), "{lang}");
    assert_eq!(errors(&d)[0], "attempt 1 fails", "{lang}");

    let d = dead("permanent").await;
    assert_eq!(outcomes(&d), ["permanent"], "{lang}: {d:#}");
    assert_eq!(errors(&d)[0], "asked to fail for good", "{lang}");

    // Every attempt wrote, every attempt failed: nothing of it was kept.
    let d = dead("write").await;
    assert_eq!(outcomes(&d), ["retry", "retry", "retry"], "{lang}: {d:#}");
    assert_eq!(state(&host, "w").await, None, "{lang}");

    let d = done("fetch").await;
    assert_eq!(output(&d), json!({"status": 200}), "{lang}");
    // The first 4 KiB of a 9 MiB answer, its status kept.
    let d = done("peek").await;
    assert_eq!(
        output(&d),
        json!({"status": 200, "bytes": 4096}),
        "{lang}: {d:#}"
    );
    let calls: Vec<_> = mock
        .seen()
        .into_iter()
        .filter(|c| c.path == "/hook")
        .collect();
    assert_eq!(calls.len(), 1, "{lang}: {calls:?}");
    assert_eq!(
        header(&calls[0], "idempotency-key"),
        ["s:fetch:h"],
        "{lang}"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&calls[0].body).unwrap(),
        json!({"do": "fetch", "url": url}),
        "{lang}: the event's body, byte for byte"
    );

    // Done, not dead: the JavaScript SDK once refused these bytes (`state.set takes a
    // Uint8Array or a string, not object`) and posted them as JSON (`{"0":123,...}`).
    let d = host
        .wait_delivery("s", "copy", "h", WAIT, |d| {
            d["state"] == "done" || d["state"] == "dead"
        })
        .await;
    assert_eq!(d["state"], "done", "{lang}: {:?} {d:#}", errors(&d));
    assert_eq!(
        output(&d),
        json!({"status": 200, "bytes": copied.len()}),
        "{lang}: {d:#}"
    );
    for key in ["b", "b2"] {
        let stored = state_bytes(&host, key).await;
        assert_eq!(
            stored.as_deref().map(String::from_utf8_lossy),
            Some(copied.as_str().into()),
            "{lang}: state {key} holds the event's body byte for byte"
        );
    }
    let calls: Vec<_> = mock
        .seen()
        .into_iter()
        .filter(|c| c.path == "/copy")
        .collect();
    assert_eq!(calls.len(), 1, "{lang}: {calls:?}");
    assert_eq!(
        String::from_utf8_lossy(&calls[0].body),
        copied,
        "{lang}: the event's body, posted byte for byte"
    );
    assert_eq!(calls[0].body, copied.as_bytes(), "{lang}");
    assert_eq!(
        header(&calls[0], "content-type"),
        Vec::<&str>::new(),
        "{lang}: posted as it is, not as JSON"
    );

    let d = dead("denied").await;
    assert_eq!(outcomes(&d), ["permanent"], "{lang}: {d:#}");
    assert!(
        errors(&d)[0].contains("127.0.0.1:9 is not in allow_hosts"),
        "{lang}: {d:#}"
    );

    let d = dead("spin").await;
    assert_eq!(
        outcomes(&d),
        ["timeout", "timeout", "timeout"],
        "{lang}: {d:#}"
    );

    let d = dead("grow").await;
    assert_eq!(outcomes(&d)[0], "trap", "{lang}: {d:#}");
    assert!(
        errors(&d)[0].contains("memory limit exceeded"),
        "{lang}: {d:#}"
    );

    let d = dead("output").await;
    assert!(
        errors(&d)[0].contains("70000 bytes exceeds the 65536-byte cap"),
        "{lang}: {d:#}"
    );

    let d = done("log").await;
    assert_eq!(d["output"], "logged", "{lang}: {d:#}");
    host.wait_log("[log output truncated: per-call log cap reached]", WAIT)
        .await;

    let d = done("stale").await;
    assert_eq!(output(&d), json!({"stale": false}), "{lang}");

    let d = dead("unknown").await;
    assert_eq!(errors(&d)[0], "unknown op dance", "{lang}");
}

async fn post_owned(ingest: std::net::SocketAddr, id: String, body: Value) {
    let (status, reply) = post_sw(ingest, "s", &id, body.to_string().as_bytes())
        .await
        .unwrap();
    assert!(status.is_success(), "{id}: {status} {reply}");
}

/// A delivery's output, parsed as JSON.
fn output(delivery: &Value) -> Value {
    let text = delivery["output"]
        .as_str()
        .unwrap_or_else(|| panic!("no output: {delivery:#}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("output {text:?}: {e}"))
}

fn outcomes(delivery: &Value) -> Vec<&str> {
    crate::support::outcomes(delivery)
}

/// Each attempt's error, oldest first (empty for a success).
fn errors(delivery: &Value) -> Vec<&str> {
    delivery["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["error"].as_str().unwrap_or(""))
        .collect()
}

/// The JSON value of state key `key` of instance `h`, or None if it is not set.
async fn state(host: &ProcessHost, key: &str) -> Option<Value> {
    let (status, body) = host
        .admin_get(&format!("/admin/plugins/h/state/{key}"))
        .await;
    match status {
        StatusCode::NOT_FOUND => None,
        StatusCode::OK => Some(body["value"].clone()),
        other => panic!("state {key}: {other} {body}"),
    }
}

/// The bytes of state key `key` of instance `h`, exactly as stored, or None if it is not set
/// (the admin API carries UTF-8 JSON as its own text, other bytes as base64: read raw, not
/// through a parsed `Value`, which would re-encode the JSON).
async fn state_bytes(host: &ProcessHost, key: &str) -> Option<Vec<u8>> {
    let url = format!("http://{}/admin/plugins/h/state/{key}", host.admin);
    let auth = [(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).unwrap(),
    )];
    let (status, _, body) = send(http::Method::GET, &url, &auth, Default::default())
        .await
        .unwrap();
    match status {
        StatusCode::NOT_FOUND => None,
        StatusCode::OK => {
            let value: ::host::admin::api::StateValue = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("state {key}: {e}: {body:?}"));
            let bytes = value.encoding.decode(&value.value).unwrap();
            assert_eq!(value.size, bytes.len() as u64, "state {key}: {value:?}");
            Some(bytes)
        }
        other => panic!("state {key}: {other} {body:?}"),
    }
}

/// The repository's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Whether `language`'s toolchain is installed; if not, says what is missing and returns false,
/// or fails the test under `HOOKD_TEST_LANGUAGES_REQUIRED`.
fn toolchain_ready(language: &Language) -> bool {
    let root = workspace();
    let missing = match language.name {
        "javascript" => (!root.join("plugin-sdk/js/node_modules").is_dir())
            .then_some("plugin-sdk/js/node_modules (run `npm ci --prefix plugin-sdk/js`)"),
        _ => (!root.join("target/py-venv/bin/componentize-py").is_file()).then_some(
            "target/py-venv/bin/componentize-py (run `python3 -m venv target/py-venv && \
             target/py-venv/bin/pip install --require-hashes -r \
             plugin-sdk/python/requirements.txt`)",
        ),
    };
    let Some(missing) = missing else {
        return true;
    };
    assert!(
        std::env::var_os("HOOKD_TEST_LANGUAGES_REQUIRED").is_none(),
        "the {} toolchain is required here but {missing} is missing",
        language.name
    );
    eprintln!(
        "skipped: the {} handler test needs {missing}",
        language.name
    );
    false
}

/// The scenario component of `language`, built from its sources unless a build of exactly
/// these sources is cached; None when its toolchain is not installed (see [`toolchain_ready`]).
fn built(language: &Language) -> Option<PathBuf> {
    // One build at a time: both toolchains are heavy, and the cache is shared.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if !toolchain_ready(language) {
        return None;
    }
    let root = workspace();
    let (sources, command): (Vec<PathBuf>, Vec<String>) = match language.name {
        "javascript" => {
            let sdk = root.join("plugin-sdk/js");
            (
                vec![
                    root.join("tests/plugins-js/scenario"),
                    sdk.join("src"),
                    sdk.join("build.mjs"),
                    sdk.join("package-lock.json"),
                    root.join("wit/v0.3.0"),
                ],
                vec![
                    "node".into(),
                    sdk.join("build.mjs").display().to_string(),
                    root.join("tests/plugins-js/scenario/scenario.ts")
                        .display()
                        .to_string(),
                ],
            )
        }
        _ => {
            let sdk = root.join("plugin-sdk/python");
            (
                vec![
                    root.join("tests/plugins-py/scenario"),
                    sdk.join("hookd"),
                    sdk.join("build.sh"),
                    sdk.join("requirements.txt"),
                    root.join("plugin-sdk/wit"),
                ],
                vec![
                    "bash".into(),
                    sdk.join("build.sh").display().to_string(),
                    root.join("tests/plugins-py/scenario").display().to_string(),
                    "scenario".into(),
                ],
            )
        }
    };
    let mut hasher = std::hash::DefaultHasher::new();
    for path in &sources {
        hash_tree(path, &mut hasher);
    }
    let cache = root.join("target/lang-plugins").join(language.name);
    let out = cache.join(format!("scenario-{:016x}.wasm", hasher.finish()));
    if out.is_file() {
        return Some(out);
    }
    std::fs::create_dir_all(&cache).unwrap();
    let tmp = cache.join(".scenario.wasm.tmp");
    let status = Command::new(&command[0])
        .args(&command[1..])
        .arg(&tmp)
        .current_dir(&root)
        .status()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(status.success(), "{command:?} {tmp:?} failed: {status}");
    std::fs::rename(&tmp, &out).unwrap();
    Some(out)
}

/// Feeds every file under `path` (names and contents, in order) into `hasher`, skipping
/// build output and installed packages.
fn hash_tree(path: &Path, hasher: &mut impl std::hash::Hasher) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if ["node_modules", "target", "__pycache__", "dist"].contains(&name) || name.starts_with('.') {
        return;
    }
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            hash_tree(&entry, hasher);
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        path.hash(hasher);
        bytes.hash(hasher);
    }
}

/// A Python build takes nothing installed on the building machine: componentize-py adds the
/// site-packages of the `python3` on the PATH (without a virtualenv), so a package only that
/// machine had went into the component, and a handler built there failed elsewhere. Here a
/// `python3` put first on the PATH names a site-packages holding `leaky_pkg`, which the app
/// imports: the build must fail, the package not found.
#[test]
fn a_python_build_takes_nothing_installed_on_the_machine() {
    if !toolchain_ready(&PYTHON) {
        return;
    }
    let root = workspace();
    let tmp = tempfile::tempdir().unwrap();
    let site = tmp.path().join("site-packages");
    std::fs::create_dir_all(site.join("leaky_pkg")).unwrap();
    std::fs::write(site.join("leaky_pkg/__init__.py"), "VERSION = 1\n").unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // What componentize-py runs to find site-packages: `python3 -c "import site; …"`.
    let python3 = bin.join("python3");
    std::fs::write(&python3, format!("#!/bin/sh\necho '{}'\n", site.display())).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&python3, std::fs::Permissions::from_mode(0o755)).unwrap();
    let app = tmp.path().join("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(
        app.join("leaky.py"),
        "import leaky_pkg\n\ndef handle(ev):\n    return {\"v\": leaky_pkg.VERSION}\n",
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .arg(root.join("plugin-sdk/python/build.sh"))
        .arg(&app)
        .arg("leaky")
        .arg(tmp.path().join("leaky.wasm"))
        .current_dir(&root)
        .env("PATH", path)
        .env(
            "COMPONENTIZE_PY",
            root.join("target/py-venv/bin/componentize-py"),
        )
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("No module named 'leaky_pkg'"),
        "a package installed on the machine was built in: {}\n{stderr}",
        output.status
    );
}
