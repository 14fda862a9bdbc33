//! The operator's dashboard in a real browser: Debian's Chromium, headless, driven by
//! Playwright (`tests/browser/dashboard.mjs`) against a real host seeded through real HTTP.
//!
//! The script signs in (a wrong token first, refused), finds an event by id and opens it,
//! replays a dead letter (dry-run count first) and sees it become `done`, edits the plugin's
//! state key (and sees a save at a stale version refused), rolls a plugin back, checks that a POST without (or with a wrong) CSRF token is refused and that the
//! token never appears in a URL, signs out, and saves a screenshot of every page (desktop and
//! phone) to `target/dashboard-screenshots/`. This test then checks the same outcomes through
//! the admin API.
//!
//! Needs `/usr/bin/chromium` and `tests/browser/node_modules` (`npm ci --prefix
//! tests/browser`); without them it says it is skipped, unless `HOOKD_TEST_BROWSER_REQUIRED=1`
//! (set by `.ci/run`, which installs both), when it fails instead.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::json;

use crate::support::{
    ADMIN_TOKEN, AdminApi, TestHost, plugins, post_sw, replace_atomically, sha, sw_source,
};

const WAIT: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("browser")
}

/// Whether Chromium and Playwright are here; panics if they must be and are not.
fn browser_available() -> bool {
    let playwright = browser_dir().join("node_modules/playwright-core");
    let missing: Vec<String> = [Path::new(CHROMIUM), playwright.as_path()]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let required = std::env::var("HOOKD_TEST_BROWSER_REQUIRED").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "HOOKD_TEST_BROWSER_REQUIRED=1 but {} missing (apt-get install -y chromium; npm ci --prefix tests/browser)",
        missing.join(" and ")
    );
    eprintln!(
        "skipped: the dashboard browser test needs {} (apt-get install -y chromium; npm ci --prefix tests/browser)",
        missing.join(" and ")
    );
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser() {
    if !browser_available() {
        return;
    }
    // `h` is the flaky plugin (a `{"permanent": true}` body dies at once); source `q`'s parser
    // always traps, so what it receives is held in quarantine.
    let config = sw_source("t", &["h"], "")
        + &sw_source("q", &[], "parser = \"trapper\"")
        + "\n[plugins.h]\nmax_attempts = 1\n";
    let host = TestHost::start(
        &config,
        &[("h", plugins::FLAKY), ("trapper", plugins::TRAPPER)],
    )
    .await;
    for i in 1..=3 {
        host.accept_event(
            "t",
            &format!("evt-ok-{i}"),
            &json!({"n": i, "note": "<b>hi</b>"}),
        )
        .await;
    }
    host.accept_event(
        "t",
        "evt-dead",
        &json!({"permanent": true, "why": "<script>alert(1)</script>"}),
    )
    .await;
    host.wait_state("t", "evt-dead", "h", "dead", WAIT).await;
    let (status, reply) = post_sw(host.ingest, "q", "held-1", b"{\"x\":1}")
        .await
        .unwrap();
    assert_eq!(reply["quarantined"], true, "{status} {reply}");

    // A deploy replaces `h` with a handler that succeeds: the dead letter can be replayed, and
    // the flaky version is the one to roll back to.
    let flaky_sha = sha(&host.plugin("h").await).expect("h is loaded");
    replace_atomically(
        &host.path().join("plugins/h.wasm"),
        &std::fs::read(plugins::COUNTER).unwrap(),
    );
    let deployed = host
        .wait_plugin("h", "the counter version loads", WAIT, |p| {
            sha(p).is_some_and(|s| s != flaky_sha)
        })
        .await;
    let deployed_sha = sha(&deployed).unwrap();

    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new("node")
        .arg(browser_dir().join("dashboard.mjs"))
        .env("HOOKD_URL", format!("http://{}", host.admin))
        .env("HOOKD_TOKEN", ADMIN_TOKEN)
        .env("HOOKD_SOURCE", "t")
        .env("HOOKD_DEAD_EVENT", "evt-dead")
        .env("HOOKD_PLUGIN", "h")
        .env("HOOKD_PREVIOUS_SHA", &flaky_sha)
        .env("HOOKD_CHROMIUM", CHROMIUM)
        .env("HOOKD_PROFILE_DIR", profile.path())
        .env("HOOKD_SCREENSHOTS", &screenshots)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(240), output)
        .await
        .expect("the browser script finishes within 4 minutes")
        .expect("node runs");
    assert!(
        output.status.success(),
        "the browser script failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // What the browser did, seen from the server.
    host.wait_state("t", "evt-dead", "h", "done", WAIT).await;
    let (_, count) = host.admin_get("/admin/plugins/h/state/count").await;
    assert_eq!(
        count["value"], 5,
        "the edit saved, the stale one did not: {count}"
    );
    let after = host.plugin("h").await;
    assert_eq!(sha(&after), Some(flaky_sha), "rolled back: {after}");
    // The version rolled back from is not a rollback target (the next one goes further back).
    assert!(
        !after["previous"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| *s == deployed_sha),
        "{after}"
    );
}
