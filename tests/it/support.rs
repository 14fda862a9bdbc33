//! Test support: start hookd on port 0 against a temp dir, talk HTTP to it, sign like a provider.
//!
//! Invariant: every helper waits on an observable condition with a deadline; none sleeps a
//! fixed time and hopes.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;
use tempfile::TempDir;

/// Paths of the wasm plugins built by `tests/build.rs`.
pub mod plugins {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

pub use host::verify::{Scheme, Secret};

/// A hookd running in this process.
pub struct TestHost {
    pub ingest: SocketAddr,
    pub admin: SocketAddr,
    pub dir: TempDir,
    pub admin_token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// Copies `plugins` (stem, wasm path) into `dir/plugins`.
pub fn install_plugins(dir: &Path, plugins: &[(&str, &str)]) {
    let plugins_dir = dir.join("plugins");
    std::fs::create_dir_all(&plugins_dir).unwrap();
    for (stem, path) in plugins {
        std::fs::copy(path, plugins_dir.join(format!("{stem}.wasm")))
            .unwrap_or_else(|e| panic!("copying {path}: {e}"));
    }
}

/// The config text with the test's admin token and database/plugins inside `dir`. Plugins are
/// compiled by the `hookd` binary (`server.compiler`): in a [`TestHost`] the running executable
/// is this test binary, which cannot.
pub fn config_text(body: &str) -> String {
    let server = format!(
        "[server]\nadmin_token = \"{ADMIN_TOKEN}\"\ncompiler = {:?}",
        env!("CARGO_BIN_EXE_hookd")
    );
    if body.contains("[server]") {
        body.replace("[server]", &server)
    } else {
        format!("{server}\n{body}")
    }
}

/// The Standard Webhooks secret the tests' `standard-webhooks` sources use.
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

impl TestHost {
    /// Posts `body` as event `id` to a `standard-webhooks` source keyed with [`SW_SECRET`],
    /// signed now; fails the test if the request was quarantined (a parser plugin missing).
    pub async fn post_event(&self, source: &str, id: &str, body: &Value) -> (StatusCode, Value) {
        let body = body.to_string();
        let (status, reply) = self
            .post_signed(
                source,
                &Scheme::StandardWebhooks,
                SW_SECRET,
                id,
                body.as_bytes(),
            )
            .await;
        assert!(reply.get("quarantined").is_none(), "{id}: {reply}");
        (status, reply)
    }

    /// [`TestHost::post_event`], asserting a 202; returns the reply.
    pub async fn accept_event(&self, source: &str, id: &str, body: &Value) -> Value {
        let (status, reply) = self.post_event(source, id, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{id}: {reply}");
        reply
    }

    /// Starts hookd with `config` (TOML without listen addresses) and the given plugins.
    pub async fn start(config: &str, plugins: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        install_plugins(dir.path(), plugins);
        Self::start_in(dir, config).await
    }

    /// Starts hookd in an existing directory (to restart on the same database).
    pub async fn start_in(dir: TempDir, config: &str) -> Self {
        Self::start_in_env(dir, config, &|_| None).await
    }

    /// [`TestHost::start_in`] with `env` as the host's environment (for `*_env` keys and
    /// credentials), so tests need not change the process's own.
    pub async fn start_in_env(
        dir: TempDir,
        config: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Self {
        let text = config_text(config);
        std::fs::write(dir.path().join("hookd.toml"), &text).unwrap();
        let config = host::config::Config::parse(&text, dir.path(), env)
            .unwrap_or_else(|e| panic!("test config invalid: {e:#}"));
        let ingest = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (ingest_addr, admin_addr) = (ingest.local_addr().unwrap(), admin.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(host::run(
            config,
            host::Listeners { ingest, admin },
            async move {
                let _ = stopped.await;
            },
        ));
        let host = Self {
            ingest: ingest_addr,
            admin: admin_addr,
            dir,
            admin_token: ADMIN_TOKEN.into(),
            stop: Some(stop),
            task: Some(task),
        };
        host.wait_healthy().await;
        host
    }

    pub async fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((status, _)) = self.try_admin(Method::GET, "/healthz", None).await
                && status == StatusCode::OK
            {
                return;
            }
            assert!(Instant::now() < deadline, "hookd did not become healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops hookd gracefully and returns its directory (for a restart).
    pub async fn stop(mut self) -> TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// POSTs a raw body to `/hooks/{source}` with the given headers.
    pub async fn post(
        &self,
        source: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: &[u8],
    ) -> (StatusCode, Value) {
        let url = format!("http://{}/hooks/{source}", self.ingest);
        let (status, _, body) = send(Method::POST, &url, headers, Bytes::copy_from_slice(body))
            .await
            .unwrap();
        (status, json_or_text(&body))
    }

    /// Signs `body` for `scheme` with `secret` (now) and POSTs it.
    pub async fn post_signed(
        &self,
        source: &str,
        scheme: &Scheme,
        secret: &str,
        event_id: &str,
        body: &[u8],
    ) -> (StatusCode, Value) {
        let headers = sign(scheme, secret, event_id, body, SystemTime::now());
        self.post(source, &headers, body).await
    }

    async fn try_admin(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let url = format!("http://{}{path}", self.admin);
        let headers = [
            (
                http::header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {}", self.admin_token)).unwrap(),
            ),
            (
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ];
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let (status, _, body) = send(method, &url, &headers, body).await?;
        Ok((status, json_or_text(&body)))
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        self.try_admin(Method::GET, path, None).await.unwrap()
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.try_admin(Method::POST, path, Some(body))
            .await
            .unwrap()
    }

    /// `GET /admin/events/{source}/{event_id}`, or None while it does not exist.
    pub async fn event(&self, source: &str, event_id: &str) -> Option<Value> {
        let (status, body) = self
            .admin_get(&format!("/admin/events/{source}/{event_id}"))
            .await;
        (status == StatusCode::OK).then_some(body)
    }

    /// Waits until `handler`'s delivery of the event satisfies `done`, returning the delivery.
    pub async fn wait_delivery(
        &self,
        source: &str,
        event_id: &str,
        handler: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let mut last = Value::Null;
            if let Some(event) = self.event(source, event_id).await
                && let Some(d) = event["deliveries"]
                    .as_array()
                    .and_then(|ds| ds.iter().find(|d| d["handler"] == handler))
            {
                if done(d) {
                    return d.clone();
                }
                last = d.clone();
            }
            assert!(
                Instant::now() < deadline,
                "delivery {source}/{event_id} → {handler} did not get there in {timeout:?}; last seen: {last:#}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the delivery to reach `state`.
    pub async fn wait_state(
        &self,
        source: &str,
        event_id: &str,
        handler: &str,
        state: &str,
        timeout: Duration,
    ) -> Value {
        self.wait_delivery(source, event_id, handler, timeout, |d| d["state"] == state)
            .await
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The outcomes of a delivery's attempts, oldest first (`GET /admin/events/{s}/{id}` shape).
pub fn outcomes(delivery: &Value) -> Vec<&str> {
    delivery["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect()
}

/// Signature headers as the provider would send them.
pub fn sign(
    scheme: &Scheme,
    secret: &str,
    event_id: &str,
    body: &[u8],
    now: SystemTime,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = host::verify::sign(scheme, &Secret::new(secret.into()), event_id, body, now)
        .unwrap_or_else(|e| panic!("signing: {e}"));
    headers.push((
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    ));
    headers
}

/// One HTTP/1 request on a fresh connection.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: Bytes,
) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = tokio::time::timeout(
        Duration::from_secs(60),
        client.request(request.body(Full::new(body))?),
    )
    .await??;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, headers, body))
}

pub fn json_or_text(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

/// A GitHub `issues` webhook body.
pub fn github_issue(number: u64, title: &str, body: &str) -> Vec<u8> {
    serde_json::json!({
        "action": "opened",
        "issue": {"number": number, "title": title, "body": body},
        "repository": {"full_name": "acme/widgets"},
    })
    .to_string()
    .into_bytes()
}

/// hookd as a separate process (`hookd serve`), for crash tests: it can be killed with SIGKILL
/// and restarted on the same directory and database.
pub struct ProcessHost {
    pub ingest: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
    child: std::process::Child,
}

/// A loopback address with a port nothing listens on now (for a `hookd serve` to bind).
pub fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl ProcessHost {
    /// Writes `config` (plus listen addresses on free ports) into `dir/hookd.toml` and starts
    /// `hookd serve` there; returns once it is healthy. Its log goes to `dir/hookd.log`.
    pub async fn start(dir: &Path, config: &str) -> Self {
        let (ingest, admin) = (free_port(), free_port());
        let text = config_text(config).replacen(
            "[server]",
            &format!("[server]\nlisten = \"{ingest}\"\nadmin_listen = \"{admin}\""),
            1,
        );
        std::fs::write(dir.join("hookd.toml"), text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("hookd.log"))
            .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
            .args(["serve", "--config"])
            .arg(dir.join("hookd.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting hookd");
        let host = Self {
            ingest,
            admin,
            dir: dir.to_owned(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let url = format!("http://{admin}/healthz");
            if let Ok((StatusCode::OK, _, _)) = send(Method::GET, &url, &[], Bytes::new()).await {
                return host;
            }
            let log = std::fs::read_to_string(dir.join("hookd.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline,
                "hookd did not become healthy; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The process id (e.g. to read its memory use from `/proc/<pid>/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub async fn post(
        &self,
        source: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: &[u8],
    ) -> anyhow::Result<(StatusCode, Value)> {
        let url = format!("http://{}/hooks/{source}", self.ingest);
        let (status, _, body) =
            send(Method::POST, &url, headers, Bytes::copy_from_slice(body)).await?;
        Ok((status, json_or_text(&body)))
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        let url = format!("http://{}{path}", self.admin);
        let auth = HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).unwrap();
        let (status, _, body) = send(
            Method::GET,
            &url,
            &[(http::header::AUTHORIZATION, auth)],
            Bytes::new(),
        )
        .await
        .unwrap();
        (status, json_or_text(&body))
    }
}

impl Drop for ProcessHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A memory field of `/proc/<pid>/status` (`VmRSS`, `VmHWM` = peak resident), in KiB; `None`
/// once the process is gone.
pub fn try_status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// [`try_status_kib`] of a process that must be running.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    try_status_kib(pid, field).unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `hookd_inbox_commits_total` in a `/metrics` answer.
pub fn commits(metrics: &Value) -> u64 {
    let text = metrics.as_str().expect("/metrics is text");
    let line = text
        .lines()
        .find(|l| l.starts_with("hookd_inbox_commits_total "))
        .expect("/metrics counts commits");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Waits until the inbox has committed `n` times more than `since` (a [`commits`] count) and
/// returns the new count. With nothing else writing, each commit is the dispatcher going round
/// its loop: its reclaim pass commits once a second, and so does each claim while a loaded
/// plugin has room. A negative check ("nothing claimed it", "no CPU was used") waits for this,
/// so its window is proof that the host was running, not a fixed time hoped to be enough.
pub async fn wait_commits(
    admin_get: impl AsyncFn(&str) -> (StatusCode, Value),
    since: u64,
    n: u64,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, metrics) = admin_get("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{metrics}");
        let now = commits(&metrics);
        if now >= since + n {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the inbox committed {} times, not {n}, since {since}",
            now - since
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
