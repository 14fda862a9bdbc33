//! Test support: write hookd's config, start it against a temp dir (in this process as a
//! [`TestHost`], or as a `hookd serve` [`ProcessHost`]), sign like a provider, and talk HTTP to
//! it; [`AdminApi`] reads and awaits either host's admin API.
//!
//! Invariants:
//! - every helper waits on an observable condition with a deadline; none sleeps a fixed time
//!   and hopes;
//! - each piece of setup (a source table, a signed post, an admin call, a wait) exists once
//!   here, and both hosts go through it.

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

/// A `[sources.{name}]` table of scheme `standard-webhooks` keyed with [`SW_SECRET`], feeding
/// `handlers` (no `handlers` key when empty), then the `extra` lines (more keys of the source,
/// or further tables).
pub fn sw_source(name: &str, handlers: &[&str], extra: &str) -> String {
    let mut table = format!(
        "\n[sources.{name}]\nscheme = \"standard-webhooks\"\nsecrets = [\"{SW_SECRET}\"]\n"
    );
    if !handlers.is_empty() {
        table += &format!("handlers = {handlers:?}\n");
    }
    table + extra + "\n"
}

/// [`sw_source`] `extra` for a source parsed by the `generic` plugin from its JSON body's `id`,
/// `key` and `seq` (event id, ordering key, sequence), with that plugin's table.
pub const KEYED_BY_BODY: &str = r#"parser = "generic"

[plugins.generic]
# A generous parse budget: these tests are about ordering, not the 50 ms default, and a loaded
# CI machine must not quarantine their events.
parser_timeout_ms = 5000
config = { id_pointer = "/id", key_pointer = "/key", sequence_pointer = "/seq" }"#;

impl TestHost {
    /// Posts `body` as event `id` to a `standard-webhooks` source keyed with [`SW_SECRET`],
    /// signed now; fails the test if the request was quarantined (a parser plugin missing).
    pub async fn post_event(&self, source: &str, id: &str, body: &Value) -> (StatusCode, Value) {
        let (status, reply) = post_sw(self.ingest, source, id, body.to_string().as_bytes())
            .await
            .unwrap();
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
        let mut config = host::config::Config::parse(&text, dir.path(), env)
            .unwrap_or_else(|e| panic!("test config invalid: {e:#}"));
        // A parse instantiates its component too: in a debug build on a loaded machine that can
        // take longer than the 50 ms default, and a parse out of time is quarantined (and
        // acknowledged), which these tests do not ask about. Budgets a test sets are kept, and
        // the default still grows with the body.
        for plugin in config.plugins.values_mut() {
            if plugin.parser_limits_scale {
                std::sync::Arc::make_mut(plugin).parser_timeout = Duration::from_secs(10);
            }
        }
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
        let mut host = Self {
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

    /// Waits for `/healthz` to answer 200; a host that stopped instead fails the test at once
    /// with its error.
    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((status, _)) = self.try_admin(Method::GET, "/healthz", None).await
                && status == StatusCode::OK
            {
                return;
            }
            if let Some(task) = self.task.take_if(|task| task.is_finished()) {
                match task.await {
                    Ok(Ok(())) => panic!("hookd stopped before it was healthy"),
                    Ok(Err(e)) => panic!("hookd stopped before it was healthy: {e:#}"),
                    Err(e) => panic!("hookd panicked before it was healthy: {e}"),
                }
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
        post_hook(self.ingest, source, headers, body).await.unwrap()
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
        admin_call(self.admin, method, path, Some(&self.admin_token), body).await
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        self.try_admin(Method::GET, path, None).await.unwrap()
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.try_admin(Method::POST, path, Some(body))
            .await
            .unwrap()
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The `sha256` of an [`AdminApi::plugin`] entry (`None` while nothing is loaded).
pub fn sha(status: &Value) -> Option<String> {
    status["sha256"].as_str().map(str::to_owned)
}

/// Replaces a plugin file with `bytes` the way a deploy tool should: written beside it, then
/// renamed over it (the reloader never sees a half-written file).
pub fn replace_atomically(file: &Path, bytes: &[u8]) {
    let tmp = file.with_extension("wasm.part");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// What a test reads and awaits through a host's admin API, written once for [`TestHost`] and
/// [`ProcessHost`]: each supplies its authenticated `GET`.
pub trait AdminApi {
    /// `GET path` with the host's admin token.
    async fn get(&self, path: &str) -> (StatusCode, Value);

    /// Added to a wait's failure message (e.g. the host's log).
    fn failure_context(&self) -> String {
        String::new()
    }

    /// `GET /admin/events/{source}/{event_id}`, or None while it does not exist.
    async fn event(&self, source: &str, event_id: &str) -> Option<Value> {
        let (status, body) = self
            .get(&format!("/admin/events/{source}/{event_id}"))
            .await;
        (status == StatusCode::OK).then_some(body)
    }

    /// `handler`'s delivery of `source/event_id`, once it exists.
    async fn delivery(&self, source: &str, event_id: &str, handler: &str) -> Option<Value> {
        delivery_of(&self.event(source, event_id).await?, handler)
    }

    /// Waits until `handler`'s delivery of the event satisfies `done`, returning the delivery.
    async fn wait_delivery(
        &self,
        source: &str,
        event_id: &str,
        handler: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.delivery(source, event_id, handler).await;
            if let Some(d) = &last
                && done(d)
            {
                return d.clone();
            }
            assert!(
                Instant::now() < deadline,
                "delivery {source}/{event_id} → {handler} did not get there in {timeout:?}; last seen: {last:#?}{}",
                self.failure_context()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the delivery to reach `state`.
    async fn wait_state(
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

    /// `GET /admin/plugins` as a list.
    async fn plugin_list(&self) -> Vec<Value> {
        let (status, list) = self.get("/admin/plugins").await;
        assert_eq!(status, StatusCode::OK, "{list}");
        list.as_array().unwrap().clone()
    }

    /// The [`AdminApi::plugin_list`] entry of instance `name`.
    async fn plugin(&self, name: &str) -> Value {
        let list = self.plugin_list().await;
        list.iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no plugin {name} in {list:#?}"))
    }

    /// Waits until instance `name`'s [`AdminApi::plugin_list`] entry satisfies `done` (e.g. a
    /// replaced file has loaded, or was refused); returns it. `what` names the change awaited;
    /// an instance not listed yet is waited for too.
    async fn wait_plugin(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let list = self.plugin_list().await;
            let status = list.iter().find(|p| p["name"] == name).cloned();
            if let Some(status) = &status
                && done(status)
            {
                return status.clone();
            }
            assert!(
                Instant::now() < deadline,
                "plugin {name}: {what} did not happen; last status {status:#?}{}",
                self.failure_context()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl AdminApi for TestHost {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.admin_get(path).await
    }
}

impl AdminApi for ProcessHost {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.admin_get(path).await
    }

    fn failure_context(&self) -> String {
        format!("\nlog:\n{}", self.log())
    }
}

/// `handler`'s delivery in a `GET /admin/events/{source}/{event_id}` answer.
pub fn delivery_of(event: &Value, handler: &str) -> Option<Value> {
    event["deliveries"]
        .as_array()?
        .iter()
        .find(|d| d["handler"] == handler)
        .cloned()
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

/// Asserts that `delivery` ran once to `ok`, after nothing but conflicts (re-runs of an
/// attempt whose state changed under it), each run with a number of its own: a conflict gives
/// back only the retry budget, never the attempt number (the lease token).
pub fn assert_ok_after_conflicts_only(delivery: &Value, what: &str) {
    let outcomes = outcomes(delivery);
    assert_eq!(outcomes.last(), Some(&"ok"), "{what}: {delivery:#}");
    assert!(
        outcomes[..outcomes.len() - 1]
            .iter()
            .all(|o| *o == "conflict"),
        "{what}: {delivery:#}"
    );
    assert_eq!(delivery["attempts"], outcomes.len(), "{what}: {delivery:#}");
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

/// GitHub's headers for `body` as delivery `delivery` of event `event` (`X-GitHub-Event`),
/// signed now with `secret`.
pub fn github_headers(
    secret: &str,
    delivery: &str,
    event: &'static str,
    body: &[u8],
) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = sign(&Scheme::Github, secret, delivery, body, SystemTime::now());
    headers.push((
        HeaderName::from_static("x-github-event"),
        HeaderValue::from_static(event),
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

/// POSTs a raw body to `/hooks/{source}` on `ingest` with the given headers.
pub async fn post_hook(
    ingest: SocketAddr,
    source: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: &[u8],
) -> anyhow::Result<(StatusCode, Value)> {
    let url = format!("http://{ingest}/hooks/{source}");
    let (status, _, body) = send(Method::POST, &url, headers, Bytes::copy_from_slice(body)).await?;
    Ok((status, json_or_text(&body)))
}

/// Signs `body` as Standard Webhooks message `id` with [`SW_SECRET`] (now) and POSTs it to
/// `/hooks/{source}` on `ingest`; the answer as it came (for its headers).
pub async fn send_sw(
    ingest: SocketAddr,
    source: &str,
    id: &str,
    body: &[u8],
) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
    let headers = sign(
        &Scheme::StandardWebhooks,
        SW_SECRET,
        id,
        body,
        SystemTime::now(),
    );
    let url = format!("http://{ingest}/hooks/{source}");
    send(Method::POST, &url, &headers, Bytes::copy_from_slice(body)).await
}

/// [`send_sw`], the answer's body as JSON (or text).
pub async fn post_sw(
    ingest: SocketAddr,
    source: &str,
    id: &str,
    body: &[u8],
) -> anyhow::Result<(StatusCode, Value)> {
    let (status, _, body) = send_sw(ingest, source, id, body).await?;
    Ok((status, json_or_text(&body)))
}

/// One call to the admin listener at `admin`: a JSON `body` if any, and `Bearer {token}` if a
/// token is given (without one, to see the refusal).
pub async fn admin_call(
    admin: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<(StatusCode, Value)> {
    let (status, _, body) = admin_call_with(admin, method, path, token, &[], body).await?;
    Ok((status, body))
}

/// [`admin_call`] with `extra` headers, answering the response's headers too.
pub async fn admin_call_with(
    admin: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    extra: &[(HeaderName, &str)],
    body: Option<Value>,
) -> anyhow::Result<(StatusCode, HeaderMap, Value)> {
    let url = format!("http://{admin}{path}");
    let mut headers = vec![(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    if let Some(token) = token {
        headers.push((
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        ));
    }
    for (name, value) in extra {
        headers.push((name.clone(), HeaderValue::from_str(value)?));
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let (status, headers, body) = send(method, &url, &headers, body).await?;
    Ok((status, headers, json_or_text(&body)))
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

/// Runs the `hookd` CLI in `cwd` with `args`, without admin settings from the environment
/// (`HOOKD_ADMIN_TOKEN`, `HOOKD_ADMIN_URL`, `HOOKD_CONFIG`).
pub async fn hookd_cli(cwd: &Path, args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let cwd = cwd.to_owned();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookd"))
            .args(&args)
            .current_dir(cwd)
            .env_remove("HOOKD_ADMIN_TOKEN")
            // The database is the config's, never one from the environment.
            .env_remove("HOOKD_DATABASE_URL")
            .env_remove("HOOKD_ADMIN_URL")
            .env_remove("HOOKD_CONFIG")
            .output()
            .expect("running hookd")
    })
    .await
    .unwrap()
}

/// A dashboard session on the admin listener at `admin`, signed in with [`ADMIN_TOKEN`]: the
/// `Cookie` header its requests carry.
pub async fn dashboard_session(admin: SocketAddr) -> [(HeaderName, HeaderValue); 1] {
    let form = [(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    )];
    let (status, headers, _) = send(
        Method::POST,
        &format!("http://{admin}/sign-in"),
        &form,
        Bytes::from(format!("token={ADMIN_TOKEN}")),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers[http::header::SET_COOKIE].to_str().unwrap();
    let session = cookie.split(';').next().unwrap().to_owned();
    [(
        http::header::COOKIE,
        HeaderValue::from_str(&session).unwrap(),
    )]
}

/// The `hookd.toml` a scaffold (`hookd new`) generated, ready for a test host: its source's
/// signing secret, and the text without the listen addresses (the test host picks free ports).
pub fn scaffold_config(generated: &str) -> (String, String) {
    let secret = generated
        .split_once("secrets = [\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(secret, _)| secret.to_owned())
        .unwrap_or_else(|| panic!("no secret in\n{generated}"));
    let config = generated
        .lines()
        .filter(|l| !l.starts_with("listen") && !l.starts_with("admin_listen"))
        .map(|l| format!("{l}\n"))
        .collect();
    (secret, config)
}

/// hookd as a separate process (`hookd serve`): it can be killed with SIGKILL and restarted on
/// the same directory and database, and its memory and log read from outside.
pub struct ProcessHost {
    pub ingest: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
    child: std::process::Child,
}

/// A loopback address with a port nothing listens on now, for another process to bind (a
/// `hookd serve`, a PostgreSQL server of a test's own); see [`free_ports`].
pub fn free_port() -> SocketAddr {
    let [addr] = free_ports();
    addr
}

/// `N` loopback addresses with ports nothing listens on now, all different (each is held until
/// all are chosen), for other processes to bind later. They are drawn at random from below the
/// kernel's ephemeral range, which `bind` to port 0 and outgoing connections never hand out: so
/// no listener or connection of the tests running meanwhile takes one between its choice here
/// and the bind of the process it is for, however long that process takes to start, or to
/// come back after a test stopped it.
pub fn free_ports<const N: usize>() -> [SocketAddr; N] {
    use std::hash::{BuildHasher as _, RandomState};
    let ephemeral_from: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    if ephemeral_from <= 11_000 {
        // No room below the range: ports the kernel hands out, held until all are chosen.
        let held: [std::net::TcpListener; N] =
            std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        return held.map(|listener| listener.local_addr().unwrap());
    }
    let random = RandomState::new();
    let mut held: Vec<std::net::TcpListener> = Vec::new();
    for draw in 0u64.. {
        if held.len() == N {
            break;
        }
        assert!(draw < 10_000, "no free port below {ephemeral_from}");
        let port = 10_000 + (random.hash_one(draw) % u64::from(ephemeral_from - 10_000)) as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    std::array::from_fn(|i| held[i].local_addr().unwrap())
}

impl ProcessHost {
    /// Writes `config` (as [`config_text`] completes it, plus listen addresses on free ports)
    /// into `dir/hookd.toml` and starts `hookd serve` there; returns once it is healthy. Its
    /// log is appended to `dir/hookd.log`.
    pub async fn start(dir: &Path, config: &str) -> Self {
        Self::start_exact(dir, &config_text(config)).await
    }

    /// [`ProcessHost::start`] on `config` exactly as given, with no admin token or compiler
    /// added: only the listen addresses (`config` may omit the `[server]` header, then its
    /// leading keys are the server's).
    pub async fn start_exact(dir: &Path, config: &str) -> Self {
        Self::start_exact_with_env(dir, config, &[]).await
    }

    /// [`ProcessHost::start`] with `env` set for the process (e.g. `HOOKD_LOG_FORMAT`).
    pub async fn start_with_env(dir: &Path, config: &str, env: &[(&str, &str)]) -> Self {
        Self::start_exact_with_env(dir, &config_text(config), env).await
    }

    /// [`ProcessHost::start`] as `hookd dev` in `dir` (a plugin crate): it builds the
    /// crate with cargo (with `env`, e.g. `CARGO_TARGET_DIR`), serves, and rebuilds on every save. Building can take
    /// minutes on a cold target directory, so it may take that long to become healthy.
    pub async fn start_dev(dir: &Path, config: &str, env: &[(&str, &str)]) -> Self {
        let args = ["dev"];
        let env: Vec<(&str, &str)> = [("CARGO", env!("CARGO"))]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        Self::spawn(
            dir,
            &config_text(config),
            &args,
            &env,
            Duration::from_secs(600),
            None,
        )
        .await
    }

    /// [`ProcessHost::start`], waiting up to `healthy_within` for `/healthz` (the first load of
    /// a large plugin, compiled before the host answers, can take a debug build minutes).
    pub async fn start_within(dir: &Path, config: &str, healthy_within: Duration) -> Self {
        Self::spawn(
            dir,
            &config_text(config),
            &["serve"],
            &[],
            healthy_within,
            None,
        )
        .await
    }

    /// [`ProcessHost::start`] with the process's open-files limit (soft and hard) at `limit`,
    /// as `prlimit` (util-linux) sets it before running hookd.
    pub async fn start_with_open_files(dir: &Path, config: &str, limit: u64) -> Self {
        let healthy_within = Duration::from_secs(60);
        let config = config_text(config);
        Self::spawn(dir, &config, &["serve"], &[], healthy_within, Some(limit)).await
    }

    async fn start_exact_with_env(dir: &Path, config: &str, env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, config, &["serve"], env, Duration::from_secs(60), None).await
    }

    /// Writes the config with listen addresses on free ports, runs `hookd <command> --config
    /// dir/hookd.toml` (under `prlimit --nofile` when `open_files` is given) and waits up to
    /// `healthy_within` for `/healthz`.
    async fn spawn(
        dir: &Path,
        config: &str,
        command: &[&str],
        env: &[(&str, &str)],
        healthy_within: Duration,
        open_files: Option<u64>,
    ) -> Self {
        let [ingest, admin] = free_ports();
        let listen = format!("[server]\nlisten = \"{ingest}\"\nadmin_listen = \"{admin}\"");
        let text = if config.contains("[server]") {
            config.replacen("[server]", &listen, 1)
        } else {
            format!("{listen}\n{config}")
        };
        std::fs::write(dir.join("hookd.toml"), text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("hookd.log"))
            .unwrap();
        let hookd = env!("CARGO_BIN_EXE_hookd");
        let mut child = match open_files {
            // prlimit execs hookd: the child's pid is hookd's.
            Some(limit) => {
                let mut prlimit = std::process::Command::new("prlimit");
                prlimit.arg(format!("--nofile={limit}:{limit}")).arg(hookd);
                prlimit
            }
            None => std::process::Command::new(hookd),
        };
        let child = child
            .args(command)
            .arg("--config")
            .arg(dir.join("hookd.toml"))
            // The token is the config's (or generated): never one from the environment.
            .env_remove("HOOKD_ADMIN_TOKEN")
            // The database is the config's, never one from the environment.
            .env_remove("HOOKD_DATABASE_URL")
            // `hookd dev` builds wasm as a user would, without the test build's flags.
            .env_remove("RUSTFLAGS")
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting hookd");
        let mut host = Self {
            ingest,
            admin,
            dir: dir.to_owned(),
            child,
        };
        let deadline = Instant::now() + healthy_within;
        loop {
            let url = format!("http://{admin}/healthz");
            if let Ok((StatusCode::OK, _, _)) = send(Method::GET, &url, &[], Bytes::new()).await {
                return host;
            }
            if let Ok(Some(status)) = host.child.try_wait() {
                panic!(
                    "hookd exited ({status}) before it was healthy; log:\n{}",
                    host.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "hookd did not become healthy; log:\n{}",
                host.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The process id (e.g. to read its memory use from `/proc/<pid>/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything in `hookd.log` so far (empty if it cannot be read).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("hookd.log")).unwrap_or_default()
    }

    /// Waits until the log mentions `needle`; returns the whole log.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "hookd.log never said {needle:?}:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `(VmRSS, VmHWM)` of the hookd process, in KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        (
            status_kib(self.pid(), "VmRSS"),
            status_kib(self.pid(), "VmHWM"),
        )
    }

    /// Resets the peak-RSS mark (`VmHWM`) to the current RSS.
    pub fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5")
            .expect("resetting VmHWM through /proc/<pid>/clear_refs");
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// [`post_hook`] to this host.
    pub async fn post(
        &self,
        source: &str,
        headers: &[(HeaderName, HeaderValue)],
        body: &[u8],
    ) -> anyhow::Result<(StatusCode, Value)> {
        post_hook(self.ingest, source, headers, body).await
    }

    /// [`admin_call`] to this host with `token` (or none).
    pub async fn admin(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        admin_call(self.admin, method, path, token, body)
            .await
            .unwrap()
    }

    /// `GET path` with the tests' [`ADMIN_TOKEN`].
    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        self.admin(Method::GET, path, Some(ADMIN_TOKEN), None).await
    }
}

impl Drop for ProcessHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A numeric field of a `/proc` status file (`/proc/<pid>/status` or a thread's
/// `/proc/<pid>/task/<tid>/status`), without its `kB` unit if it has one; `None` once the
/// process or thread is gone.
pub fn status_field(status: &Path, field: &str) -> Option<u64> {
    std::fs::read_to_string(status)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A memory field of `/proc/<pid>/status` (`VmRSS`, `VmHWM` = peak resident), in KiB; `None`
/// once the process is gone.
pub fn try_status_kib(pid: u32, field: &str) -> Option<u64> {
    status_field(Path::new(&format!("/proc/{pid}/status")), field)
}

/// [`try_status_kib`] of a process that must be running.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    try_status_kib(pid, field).unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `hookd_inbox_commits_total` in a `/metrics` answer.
pub fn commits(metrics: &Value) -> u64 {
    series(metrics, "hookd_inbox_commits_total")
}

/// `hookd_dispatch_rounds_total` in a `/metrics` answer.
pub fn rounds(metrics: &Value) -> u64 {
    series(metrics, "hookd_dispatch_rounds_total")
}

/// The value of the unlabelled series `name` in a `/metrics` answer.
fn series(metrics: &Value, name: &str) -> u64 {
    let text = metrics.as_str().expect("/metrics is text");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in /metrics"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `/metrics` once it has every line of `lines` (exactly, as a whole line): the figures only
/// the database knows are sampled after commits, so they follow the inbox within about a
/// second. Fails the test after 20 s, showing the last answer.
pub async fn metrics_with(
    admin_get: impl AsyncFn(&str) -> (StatusCode, Value),
    lines: &[&str],
) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, metrics) = admin_get("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{metrics}");
        let text = metrics.as_str().expect("/metrics is text").to_owned();
        let missing: Vec<&&str> = lines
            .iter()
            .filter(|line| !text.lines().any(|l| l == **line))
            .collect();
        if missing.is_empty() {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {missing:?} in /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the dispatcher has gone round its loop `n` times more than `since` (a
/// [`rounds`] count) and returns the new count. An idle dispatcher goes round about twice a
/// second (and claims, so a due delivery whose plugin is loaded would run). A negative check
/// ("nothing claimed it", "no CPU was used") waits for this, so its window is proof that the
/// host was running, not a fixed time hoped to be enough.
pub async fn wait_rounds(
    admin_get: impl AsyncFn(&str) -> (StatusCode, Value),
    since: u64,
    n: u64,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, metrics) = admin_get("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{metrics}");
        let now = rounds(&metrics);
        if now >= since + n {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the dispatcher went round {} times, not {n}, since {since}",
            now - since
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> host::config::Config {
        let dir = tempfile::tempdir().unwrap();
        host::config::Config::parse(&config_text(body), dir.path(), &|_| None)
            .unwrap_or_else(|e| panic!("{e:#}\n{body}"))
    }

    /// The source `sw_source` writes has its handlers in order and the `extra` keys as its own.
    #[test]
    fn sw_source_writes_one_source_with_its_handlers_and_extra_keys() {
        let config = parse(&sw_source("s", &["a", "b"], "parser = \"p\""));
        let s = &config.sources["s"];
        let handlers: Vec<&str> = s.handlers.iter().map(|h| h.as_str()).collect();
        assert_eq!(
            (handlers, s.parser.as_ref().map(|p| p.as_str())),
            (vec!["a", "b"], Some("p"))
        );
    }

    /// `KEYED_BY_BODY` makes a `generic`-parsed source and configures that plugin.
    #[test]
    fn keyed_by_body_configures_the_generic_parser() {
        let config = parse(&sw_source("k", &[], KEYED_BY_BODY));
        assert_eq!(
            (
                config.sources["k"].parser.as_ref().map(|p| p.as_str()),
                config.plugins.contains_key("generic")
            ),
            (Some("generic"), true)
        );
    }
}
