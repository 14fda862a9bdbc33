//! Telemetry: every metric hookd exports (`GET /metrics`, Prometheus text), and the last hour
//! of the same figures kept in memory for the dashboard.
//!
//! Invariants:
//! - This module is the one home of every metric name, label and bucket: call sites use the
//!   typed methods of [`Telemetry`], never a `metrics` macro or a name of their own.
//! - Each host records into a recorder of its own, not the process-global one, so several hosts
//!   in one process (the tests) keep separate figures.
//! - Label values are names the configuration bounds (source, plugin, plugin file) and fixed
//!   outcome names; never an event id or anything else a request chose (a request for an
//!   unknown source is counted under `source=""`).
//! - A scrape renders what is in memory. Figures only the database knows (deliveries by state,
//!   quarantine, the oldest due delivery) are sampled by [`Telemetry::sample_loop`], never
//!   queried per scrape.

mod recent;
mod repeated;

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub use recent::{AttemptMinute, Minute, Recent, SourceMinute};
pub use repeated::Repeated;

use crate::{
    clock::Clock,
    inbox::{Inbox, InboxError},
    model::{AttemptOutcome, DeliveryState},
};

/// How an ingest request was answered: the contract's names (`accepted`, `duplicate`,
/// `quarantined`, `ignored`), `responded` for an answer a handshake or the parser gave instead of
/// storing anything, and for a refusal the `error` of its body (`invalid_signature`,
/// `unknown_source`, `payload_too_large`, `unparsable`, `overloaded`, `body_timeout`,
/// `forbidden` (a handshake's verify token refused), ...).
pub const INGEST_OUTCOMES: [&str; 17] = [
    "accepted",
    "duplicate",
    "quarantined",
    "ignored",
    "responded",
    "invalid_signature",
    "unknown_source",
    "payload_too_large",
    "unparsable",
    "overloaded",
    "body_timeout",
    "bad_request",
    "not_found",
    "conflict",
    "method_not_allowed",
    "forbidden",
    "internal",
];

/// What became of one outbound request of a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboundResult {
    /// A response came back (whatever its status).
    Ok,
    /// Refused by the host's policy: not listed, a refused address range, the per-call cap.
    Denied,
    /// The TLS handshake failed (certificate, alert, protocol).
    TlsError,
    /// A connect, first-byte or between-bytes deadline passed.
    Timeout,
    /// Any other failure to connect or to read the response.
    Error,
}

impl OutboundResult {
    const ALL: [Self; 5] = [
        Self::Ok,
        Self::Denied,
        Self::TlsError,
        Self::Timeout,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Denied => "denied",
            Self::TlsError => "tls_error",
            Self::Timeout => "timeout",
            Self::Error => "error",
        }
    }
}

/// The outcome of a plugin file's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadResult {
    /// Compiled (or read from the artifact cache), type-checked and swapped in.
    Loaded,
    /// Refused: the live version, if any, stays.
    Failed,
}

impl LoadResult {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Failed => "failed",
        }
    }
}

/// Every series, with its kind, unit and help text: the one list `describe` and the README
/// follow.
pub const SERIES: &[(&str, Kind, &str)] = &[
    (
        INGEST_REQUESTS,
        Kind::Counter,
        "Ingest requests answered, by source and outcome.",
    ),
    (
        INGEST_DURATION,
        Kind::Histogram,
        "Ingest request time from its start to its answer, by source.",
    ),
    (
        INBOX_COMMITS,
        Kind::Counter,
        "Write transactions committed by the inbox.",
    ),
    (
        DISPATCH_ROUNDS,
        Kind::Counter,
        "Rounds of the dispatcher's loop, each looking for due deliveries (about two a second \
         on an idle host, which commits nothing: the sign its dispatcher is alive).",
    ),
    (
        INBOX_COMMIT_DURATION,
        Kind::Histogram,
        "Inbox write transaction time from its start to its commit.",
    ),
    (
        INBOX_COMMIT_BATCH,
        Kind::Histogram,
        "Operations (accepts, finishes, ...) sharing one inbox commit.",
    ),
    (DELIVERIES, Kind::Gauge, "Deliveries by state."),
    (BACKLOG, Kind::Gauge, "Deliveries not yet finished."),
    (
        QUARANTINED,
        Kind::Gauge,
        "Requests held in quarantine (parser failed), not yet replayed.",
    ),
    (
        OLDEST_DUE,
        Kind::Gauge,
        "How long the waiting delivery due longest ago has been due (0 when none is).",
    ),
    (
        CLOCK_OFFSET,
        Kind::Gauge,
        "The database server's clock minus this host's, as far as the host follows it (0 in \
         step, and on SQLite).",
    ),
    (
        ATTEMPTS,
        Kind::Counter,
        "Handler attempts recorded, by plugin and outcome.",
    ),
    (
        ATTEMPT_DURATION,
        Kind::Histogram,
        "Handler attempt time from its start to its record, by plugin.",
    ),
    (
        RETRIES,
        Kind::Counter,
        "Attempts that scheduled a retry, by plugin.",
    ),
    (
        DEAD_LETTERS,
        Kind::Counter,
        "Deliveries that became dead (needing a human), by plugin.",
    ),
    (
        PLUGIN_LOADS,
        Kind::Counter,
        "Plugin file loads, by file and result.",
    ),
    (
        PLUGIN_INFO,
        Kind::Gauge,
        "The live version of each plugin file (always 1; the sha256 is a label).",
    ),
    (
        OUTBOUND,
        Kind::Counter,
        "Outbound HTTP requests of handlers, by plugin and result.",
    ),
];

const INGEST_REQUESTS: &str = "hookd_ingest_requests_total";
const INGEST_DURATION: &str = "hookd_ingest_duration_seconds";
const INBOX_COMMITS: &str = "hookd_inbox_commits_total";
const DISPATCH_ROUNDS: &str = "hookd_dispatch_rounds_total";
const INBOX_COMMIT_DURATION: &str = "hookd_inbox_commit_duration_seconds";
const INBOX_COMMIT_BATCH: &str = "hookd_inbox_commit_batch_size";
const DELIVERIES: &str = "hookd_deliveries";
const BACKLOG: &str = "hookd_backlog";
const QUARANTINED: &str = "hookd_quarantined";
const OLDEST_DUE: &str = "hookd_oldest_due_seconds";
const CLOCK_OFFSET: &str = "hookd_clock_offset_seconds";
const ATTEMPTS: &str = "hookd_attempts_total";
const ATTEMPT_DURATION: &str = "hookd_attempt_duration_seconds";
const RETRIES: &str = "hookd_retries_scheduled_total";
const DEAD_LETTERS: &str = "hookd_dead_letters_total";
const PLUGIN_LOADS: &str = "hookd_plugin_loads_total";
const PLUGIN_INFO: &str = "hookd_plugin_info";
const OUTBOUND: &str = "hookd_outbound_requests_total";

/// A series' Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Seconds: an ingest answer (sub-millisecond to a slow parser or a long fsync).
const INGEST_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Seconds: a handler attempt (microseconds to its 30 s default timeout and beyond).
const ATTEMPT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Seconds: an inbox commit (one fsync, or a network round trip or few).
const COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Operations per commit (group commit at work).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// How often the small database-derived gauges (the open and dead states, quarantine, the
/// oldest due delivery: each an index range the size of the backlog) may be read again: only
/// when the inbox committed meanwhile, or [`ANYWAY_EVERY`] passed.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often those are read even without a local commit: other nodes' commits on a shared
/// database, and retries that came due while nothing committed.
const ANYWAY_EVERY: Duration = Duration::from_secs(15);
/// How often the finished states (done, stale, discarded: most of the table) are counted again.
const FINISHED_EVERY: Duration = Duration::from_secs(10);
/// A sample that takes longer is given up (and logged), so a stuck database cannot hold up
/// the histograms' upkeep.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The counters of one source.
struct SourceMeters {
    requests: [Counter; INGEST_OUTCOMES.len()],
    duration: Histogram,
}

/// The counters of one plugin (as a handler).
struct PluginMeters {
    attempts: [Counter; AttemptOutcome::ALL.len()],
    duration: Histogram,
    retries: Counter,
    dead: Counter,
    outbound: [Counter; OutboundResult::ALL.len()],
    /// The plugin's failed TLS handshakes' log line, at most one per period (a call may make
    /// as many requests to a host whose certificate is refused as its time allows).
    tls_failures: Repeated,
}

/// The outbound counters of one plugin, handed to its calls' `wasi:http` hooks.
#[derive(Clone)]
pub struct OutboundMeter(Arc<PluginMeters>);

impl std::fmt::Debug for OutboundMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutboundMeter")
    }
}

impl OutboundMeter {
    /// Counts one outbound request that ended as `result`.
    pub fn record(&self, result: OutboundResult) {
        let i = OutboundResult::ALL
            .iter()
            .position(|r| *r == result)
            .expect("every result is listed");
        self.0.outbound[i].increment(1);
    }

    /// Whether this failed TLS handshake of the plugin's is logged: `Some(failures left out
    /// since the line before)`, or `None` (counted; see [`Repeated`]).
    pub fn tls_failure_line(&self) -> Option<u64> {
        self.0.tls_failures.write()
    }

    /// A meter that counts into nothing (a call outside any host, in unit tests).
    pub fn detached() -> Self {
        Self(Arc::new(PluginMeters::register(&noop(), "")))
    }
}

/// The database-derived figures, as last sampled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxGauges {
    /// Every delivery state with its count (0 included), in [`DeliveryState::ALL`]'s order.
    pub states: Vec<(String, i64)>,
    /// When the waiting delivery due longest ago became due (ms since the epoch), if one is.
    pub oldest_due_ms: Option<i64>,
    pub quarantined: i64,
    /// When these were read (ms since the epoch); 0 before the first sample.
    pub sampled_at_ms: i64,
}

/// One host's metrics.
pub struct Telemetry {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    clock: Clock,
    process: metrics_process::Collector,
    sources: RwLock<HashMap<String, Arc<SourceMeters>>>,
    plugins: RwLock<HashMap<String, Arc<PluginMeters>>>,
    commits: Counter,
    rounds: Counter,
    backlog: Gauge,
    deliveries: [Gauge; DeliveryState::ALL.len()],
    quarantined: Gauge,
    oldest_due: Gauge,
    clock_offset: Gauge,
    gauges: ArcSwap<InboxGauges>,
    recent: recent::History,
}

impl Telemetry {
    /// A recorder of its own, every series described, with the histograms' buckets.
    pub fn new(clock: Clock) -> Arc<Self> {
        let builder = [
            (INGEST_DURATION, INGEST_BUCKETS),
            (ATTEMPT_DURATION, ATTEMPT_BUCKETS),
            (INBOX_COMMIT_DURATION, COMMIT_BUCKETS),
            (INBOX_COMMIT_BATCH, BATCH_BUCKETS),
        ]
        .into_iter()
        .fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder
                .set_buckets_for_metric(Matcher::Full(name.into()), buckets)
                .expect("the bucket lists are not empty")
        });
        let recorder = builder.build_recorder();
        for (name, kind, help) in SERIES {
            let unit = name.ends_with("_seconds").then_some(Unit::Seconds);
            match kind {
                Kind::Counter => recorder.describe_counter((*name).into(), unit, (*help).into()),
                Kind::Gauge => recorder.describe_gauge((*name).into(), unit, (*help).into()),
                Kind::Histogram => {
                    recorder.describe_histogram((*name).into(), unit, (*help).into())
                }
            }
        }
        let process = metrics_process::Collector::default();
        metrics::with_local_recorder(&recorder, || process.describe());
        let deliveries = DeliveryState::ALL
            .map(|state| gauge(&recorder, DELIVERIES, &[("state", state.as_str())]));
        Arc::new(Self {
            handle: recorder.handle(),
            commits: counter(&recorder, INBOX_COMMITS, &[]),
            rounds: counter(&recorder, DISPATCH_ROUNDS, &[]),
            backlog: gauge(&recorder, BACKLOG, &[]),
            deliveries,
            quarantined: gauge(&recorder, QUARANTINED, &[]),
            oldest_due: gauge(&recorder, OLDEST_DUE, &[]),
            clock_offset: gauge(&recorder, CLOCK_OFFSET, &[]),
            recorder,
            clock,
            process,
            sources: Default::default(),
            plugins: Default::default(),
            gauges: Default::default(),
            recent: Default::default(),
        })
    }

    /// Counts an ingest request for `source` (`""` when no such source is configured),
    /// answered as `outcome` (one of [`INGEST_OUTCOMES`]) after `took`.
    pub fn ingest_answered(&self, source: &str, outcome: &'static str, took: Duration) {
        let i = INGEST_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(INGEST_OUTCOMES.len() - 1);
        let meters = self.source(source);
        meters.requests[i].increment(1);
        meters.duration.record(took.as_secs_f64());
        self.recent
            .ingest(self.clock.now_ms(), source, INGEST_OUTCOMES[i], took);
    }

    /// Counts a recorded attempt of `plugin` that ended as `outcome` after `took`; `next` is
    /// where its delivery went (a retry and a dead letter are counted too).
    pub fn attempt_recorded(
        &self,
        plugin: &str,
        outcome: AttemptOutcome,
        next: AttemptNext,
        took: Duration,
    ) {
        let meters = self.plugin(plugin);
        let i = AttemptOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is listed");
        meters.attempts[i].increment(1);
        meters.duration.record(took.as_secs_f64());
        match next {
            AttemptNext::Retry => meters.retries.increment(1),
            AttemptNext::Dead => meters.dead.increment(1),
            AttemptNext::Other => {}
        }
        self.recent
            .attempt(self.clock.now_ms(), plugin, outcome.as_str());
    }

    /// Counts a round of the dispatcher's loop.
    pub fn dispatch_round(&self) {
        self.rounds.increment(1);
    }

    /// Counts a load of plugin file `file` (its stem).
    pub fn plugin_loaded(&self, file: &str, result: LoadResult) {
        counter(
            &self.recorder,
            PLUGIN_LOADS,
            &[("file", file), ("result", result.as_str())],
        )
        .increment(1);
    }

    /// The outbound counters of `plugin`, for its calls.
    pub fn outbound_meter(&self, plugin: &str) -> OutboundMeter {
        OutboundMeter(self.plugin(plugin))
    }

    /// Reports every commit of `inbox` (its size and duration) into the commit histograms.
    pub fn observe(&self, inbox: &Inbox) {
        let duration = histogram(&self.recorder, INBOX_COMMIT_DURATION, &[]);
        let batch = histogram(&self.recorder, INBOX_COMMIT_BATCH, &[]);
        inbox.observe_commits(Box::new(move |operations, took| {
            batch.record(operations as f64);
            duration.record(took.as_secs_f64());
        }));
    }

    /// The last hour, minute by minute (for the dashboard).
    pub fn recent(&self, now_ms: i64) -> Recent {
        self.recent.view(now_ms)
    }

    /// The database-derived figures as last sampled.
    pub fn inbox_gauges(&self) -> Arc<InboxGauges> {
        self.gauges.load_full()
    }

    /// Reads the database-derived figures now: every state when `finished_too`, else the open
    /// and dead ones (the finished states keep their last counts).
    pub async fn sample(&self, inbox: &Inbox, finished_too: bool) -> Result<(), InboxError> {
        let states: Vec<DeliveryState> = DeliveryState::ALL
            .into_iter()
            .filter(|state| finished_too || !DeliveryState::FINISHED.contains(state))
            .collect();
        let counts: HashMap<String, i64> = inbox.state_counts(&states).await?.into_iter().collect();
        let quarantined = inbox.quarantine_held_count().await?;
        let oldest_due_ms = inbox.oldest_due().await?;
        let now_ms = self.clock.now_ms();
        let before = self.gauges.load();
        let states: Vec<(String, i64)> = DeliveryState::ALL
            .iter()
            .map(|state| {
                let kept = || {
                    let old = before.states.iter().find(|(s, _)| s == state.as_str());
                    old.map_or(0, |(_, n)| *n)
                };
                let n = match counts.get(state.as_str()) {
                    Some(n) => *n,
                    None if states.contains(state) => 0,
                    None => kept(),
                };
                (state.as_str().to_owned(), n)
            })
            .collect();
        for (gauge, (_, n)) in self.deliveries.iter().zip(&states) {
            gauge.set(*n as f64);
        }
        self.quarantined.set(quarantined as f64);
        self.gauges.store(Arc::new(InboxGauges {
            states,
            oldest_due_ms,
            quarantined,
            sampled_at_ms: now_ms,
        }));
        Ok(())
    }

    /// Samples the database-derived figures after the inbox committed (at most once per
    /// [`SAMPLE_EVERY`]) and every [`ANYWAY_EVERY`] regardless, and keeps the histograms
    /// drained, until `stop` resolves. An idle host reads a few counts every 15 s and writes
    /// nothing.
    pub async fn sample_loop(
        self: Arc<Self>,
        inbox: Inbox,
        stop: impl Future<Output = ()> + Send + 'static,
    ) {
        let mut seen = inbox.commits();
        let mut since = tokio::time::Instant::now();
        let mut finished_since = since;
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        let mut failing = false;
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => {}
            }
            self.handle.run_upkeep();
            let commits = inbox.commits();
            let due = commits != seen || since.elapsed() >= ANYWAY_EVERY;
            if !due {
                continue;
            }
            let finished_too = finished_since.elapsed() >= FINISHED_EVERY;
            let sampled = tokio::time::timeout(SAMPLE_TIMEOUT, self.sample(&inbox, finished_too))
                .await
                .map_err(|_| format!("no answer in {SAMPLE_TIMEOUT:?}"))
                .and_then(|sampled| sampled.map_err(|e| e.to_string()));
            match sampled {
                Ok(()) => {
                    seen = commits;
                    since = tokio::time::Instant::now();
                    if finished_too {
                        finished_since = since;
                    }
                    failing = false;
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "could not sample the inbox for /metrics");
                }
                Err(_) => {}
            }
        }
    }

    /// The Prometheus text of every series; `live` are the plugin files' live versions
    /// (`(file, sha256)`), rendered as the info series.
    pub fn render(&self, inbox: &Inbox, live: &[(String, String)]) -> String {
        self.backlog.set(inbox.backlog() as f64);
        // The lag grows while nothing changes: counted from the sampled due time to now.
        let lag_ms = self
            .gauges
            .load()
            .oldest_due_ms
            .map_or(0, |due| (self.clock.now_ms() - due).max(0));
        self.oldest_due.set(lag_ms as f64 / 1000.0);
        self.clock_offset
            .set(self.clock.offset_ms() as f64 / 1000.0);
        self.commits.absolute(inbox.commits().max(0) as u64);
        metrics::with_local_recorder(&self.recorder, || {
            self.process.collect();
            // No address-space limit is -1 (Prometheus' convention), not the collector's 0,
            // which reads as a limit of nothing.
            let limit = rustix::process::getrlimit(rustix::process::Resource::As);
            if limit.current.is_none() {
                metrics::gauge!("process_virtual_memory_max_bytes").set(-1.0);
            }
        });
        let mut out = self.handle.render();
        // The info series is rendered from the registry as it is now, so a replaced version
        // leaves no stale series behind.
        if !live.is_empty() {
            let help = SERIES
                .iter()
                .find(|(name, ..)| *name == PLUGIN_INFO)
                .map_or("", |(_, _, help)| help);
            out.push_str(&format!(
                "# HELP {PLUGIN_INFO} {help}\n# TYPE {PLUGIN_INFO} gauge\n"
            ));
            for (file, sha256) in live {
                out.push_str(&format!(
                    "{PLUGIN_INFO}{{file=\"{}\",sha256=\"{}\"}} 1\n",
                    escape_label(file),
                    escape_label(sha256)
                ));
            }
        }
        out
    }

    /// Registers the series of every configured source and handler at 0: a series that first
    /// appears at 1 is an increase `rate()` and `increase()` never see (the first dead letter
    /// after a start would be missed by an alert on it).
    pub fn expect<'a>(
        &self,
        sources: impl Iterator<Item = &'a str>,
        handlers: impl Iterator<Item = &'a str>,
    ) {
        for source in sources {
            self.source(source);
        }
        for handler in handlers {
            self.plugin(handler);
        }
    }

    fn source(&self, source: &str) -> Arc<SourceMeters> {
        if let Some(m) = read(&self.sources).get(source) {
            return m.clone();
        }
        let meters = Arc::new(SourceMeters {
            requests: INGEST_OUTCOMES.map(|outcome| {
                counter(
                    &self.recorder,
                    INGEST_REQUESTS,
                    &[("source", source), ("outcome", outcome)],
                )
            }),
            duration: histogram(&self.recorder, INGEST_DURATION, &[("source", source)]),
        });
        write(&self.sources)
            .entry(source.to_owned())
            .or_insert(meters)
            .clone()
    }

    fn plugin(&self, plugin: &str) -> Arc<PluginMeters> {
        if let Some(m) = read(&self.plugins).get(plugin) {
            return m.clone();
        }
        let meters = Arc::new(PluginMeters::register(&self.recorder, plugin));
        write(&self.plugins)
            .entry(plugin.to_owned())
            .or_insert(meters)
            .clone()
    }
}

/// Where an attempt's delivery went, as far as the retry and dead-letter counters care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptNext {
    Retry,
    Dead,
    Other,
}

impl PluginMeters {
    fn register(recorder: &impl Recorder, plugin: &str) -> Self {
        let labels = [("plugin", plugin)];
        Self {
            attempts: AttemptOutcome::ALL.map(|outcome| {
                counter(
                    recorder,
                    ATTEMPTS,
                    &[("plugin", plugin), ("outcome", outcome.as_str())],
                )
            }),
            duration: histogram(recorder, ATTEMPT_DURATION, &labels),
            retries: counter(recorder, RETRIES, &labels),
            dead: counter(recorder, DEAD_LETTERS, &labels),
            outbound: OutboundResult::ALL.map(|result| {
                counter(
                    recorder,
                    OUTBOUND,
                    &[("plugin", plugin), ("result", result.as_str())],
                )
            }),
            tls_failures: Repeated::new(
                tracing::Level::WARN,
                format!("outbound request failed in the TLS handshake, plugin {plugin}"),
            ),
        }
    }
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label::new(*k, v.to_string()))
        .collect();
    Key::from_parts(name, labels)
}

fn counter(
    recorder: &impl Recorder,
    name: &'static str,
    labels: &[(&'static str, &str)],
) -> Counter {
    recorder.register_counter(&key(name, labels), &METADATA)
}

fn gauge(recorder: &impl Recorder, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
    recorder.register_gauge(&key(name, labels), &METADATA)
}

fn histogram(
    recorder: &impl Recorder,
    name: &'static str,
    labels: &[(&'static str, &str)],
) -> Histogram {
    recorder.register_histogram(&key(name, labels), &METADATA)
}

/// A recorder that keeps nothing.
fn noop() -> metrics::NoopRecorder {
    metrics::NoopRecorder
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
